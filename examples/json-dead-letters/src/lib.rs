//! The typed JSON example's handler and settings, apart from the binaries so that the tests run
//! what the function and the redrive command run.
//!
//! Each record is an [`Order`] in JSON. A record that is not one, or an order that can never be
//! applied, is rejected and goes to the dead-letter queue at once. An order the downstream
//! refuses for now is retried in order, and dead-lettered after [`MAX_ATTEMPTS`] failures.

use std::sync::Arc;

use kinesis_checkpoint::store::CheckpointStore;
use kinesis_checkpoint::{DeadLetterSink, Handler, Outcome, Processor, Record, json};
use serde::Deserialize;

/// How many failed attempts an order gets before it is dead-lettered, counted across
/// invocations in the shard's row.
pub const MAX_ATTEMPTS: u32 = 3;

/// The payload of each record.
#[derive(Debug, Clone, Deserialize)]
pub struct Order {
    /// The order's identifier.
    pub order_id: String,
    /// What it costs, in cents: positive.
    pub amount_cents: i64,
}

/// The handler of orders: rejects an order without a positive amount, and hands the others to
/// `downstream`, whose error means "not now" (the order is retried).
///
/// `downstream` stands for the function's real work: a payment service, a table, a queue.
#[must_use]
pub fn handler<D>(downstream: D) -> impl Handler
where
    D: Fn(&Order) -> Result<(), String> + Send + Sync + 'static,
{
    let downstream = Arc::new(downstream);
    json(move |order: Order, record: Record| {
        let downstream = Arc::clone(&downstream);
        async move {
            if order.amount_cents <= 0 {
                return Outcome::reject(format!("order {} has no positive amount", order.order_id));
            }
            match downstream(&order) {
                Ok(()) => {
                    tracing::info!(order.order_id, sequence = %record.sequence(), "applied");
                    Outcome::ack()
                }
                Err(error) => Outcome::retry(error),
            }
        }
    })
}

/// The processor the function runs: `handler` over `leases`, poison records into
/// `dead_letters` after at most [`MAX_ATTEMPTS`] attempts.
#[must_use]
pub fn processor<H: Handler>(
    leases: Arc<dyn CheckpointStore>,
    handler: H,
    dead_letters: Arc<dyn DeadLetterSink>,
) -> Processor<H> {
    Processor::new(leases, handler)
        .dead_letters(dead_letters)
        .max_attempts(MAX_ATTEMPTS)
}

/// The downstream of this example: it logs the order. A real function calls its service here.
///
/// # Errors
///
/// Never: logging cannot fail.
pub fn log_order(order: &Order) -> Result<(), String> {
    tracing::info!(order.order_id, order.amount_cents, "order");
    Ok(())
}
