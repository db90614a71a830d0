//! The partition-key mode example's handler and settings, apart from `main` so that the test
//! runs what the function runs.
//!
//! With `ParallelizationFactor` above 1, Lambda runs up to ten batches of one shard at once,
//! split by partition key. A lease per shard would turn all but one away, so
//! [`Processor::by_partition_key`] keeps a checkpoint per partition key instead, and no lease.

use std::sync::Arc;
use std::time::Duration;

use kinesis_checkpoint::store::CheckpointStore;
use kinesis_checkpoint::{Handler, Outcome, PartitionKeyMode, Processor, Record};

/// How long a partition key's row outlives its last write: the stream's retention (24 hours in
/// the template) and a day. A key silent for longer cannot be redelivered anyway.
pub const KEY_TTL: Duration = Duration::from_hours(48);

/// Records of different keys handled at once within one batch.
pub const MAX_IN_FLIGHT: usize = 16;

/// The processor the function runs: `handler` over `store`, a checkpoint per partition key.
#[must_use]
pub fn processor<H: Handler>(
    store: Arc<dyn CheckpointStore>,
    handler: H,
) -> Processor<H, PartitionKeyMode> {
    Processor::by_partition_key(store, handler)
        .key_ttl(KEY_TTL)
        .concurrency(MAX_IN_FLIGHT)
}

/// The function's handler: logs each record with its key.
#[allow(
    clippy::unused_async,
    reason = "a handler is an async fn; a real one awaits its downstream here"
)]
pub async fn handle(record: Record) -> Outcome {
    tracing::info!(key = record.partition_key(), sequence = %record.sequence(), "handled");
    Outcome::ack()
}
