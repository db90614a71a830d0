//! The per-key concurrency example's handler and settings, apart from `main` so that the test
//! runs what the function runs.
//!
//! A handler that waits on I/O (an HTTP call, a database) spends a batch mostly waiting. With
//! [`Processor::concurrency`], records of different partition keys wait at once while each key's
//! records still run one after another, in order.

use std::sync::Arc;
use std::time::Duration;

use kinesis_checkpoint::store::CheckpointStore;
use kinesis_checkpoint::{Handler, Outcome, Processor, Record};

/// Records in flight at once when `MAX_IN_FLIGHT` is not set.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// How long the example's stand-in for a downstream call waits.
pub const CALL_TIME: Duration = Duration::from_millis(20);

/// The `MAX_IN_FLIGHT` setting: records of different keys handled at once (1 runs the shard in
/// order, one record at a time).
///
/// # Errors
///
/// `MAX_IN_FLIGHT` is set but is not a number.
pub fn max_in_flight(setting: Option<&str>) -> Result<usize, String> {
    setting.map_or(Ok(DEFAULT_MAX_IN_FLIGHT), |n| {
        n.parse()
            .map_err(|_| format!("MAX_IN_FLIGHT is a number of records, not '{n}'"))
    })
}

/// The processor the function runs: `handler` over `leases`, up to `max_in_flight` records of
/// different partition keys at once.
#[must_use]
pub fn processor<H: Handler>(
    leases: Arc<dyn CheckpointStore>,
    handler: H,
    max_in_flight: usize,
) -> Processor<H> {
    Processor::new(leases, handler).concurrency(max_in_flight)
}

/// The function's handler: a call downstream per record, here a wait of [`CALL_TIME`].
pub async fn notify(record: Record) -> Outcome {
    tokio::time::sleep(CALL_TIME).await;
    tracing::info!(key = record.partition_key(), sequence = %record.sequence(), "notified");
    Outcome::ack()
}
