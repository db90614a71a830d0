//! The KPL example's handler, apart from `main` so that the test runs what the function runs.
//!
//! The Kinesis Producer Library packs many user records into one Kinesis record. The processor
//! unpacks such aggregates before dispatch (always, unless `deaggregate(false)`), so the handler
//! is written for one user record, here one JSON [`Order`], as if nothing were packed.

use kinesis_checkpoint::{Outcome, Record};
use serde::Deserialize;

/// The payload of each user record.
#[derive(Debug, Clone, Deserialize)]
pub struct Order {
    /// The order's identifier.
    pub order_id: String,
    /// What it costs, in cents.
    pub amount_cents: i64,
}

/// Handles one order. A user record of an aggregate shares the aggregate's sequence number
/// and has a sub-sequence number (its place in the aggregate, from 0) and its own partition key;
/// a plain record has no sub-sequence number.
#[allow(
    clippy::unused_async,
    reason = "a handler is an async fn; a real one awaits its downstream here"
)]
pub async fn apply(order: Order, record: Record) -> Outcome {
    tracing::info!(
        order.order_id,
        order.amount_cents,
        sequence = %record.sequence(),
        sub_sequence = record.sub_sequence(),
        partition_key = record.partition_key(),
        "applied"
    );
    Outcome::ack()
}
