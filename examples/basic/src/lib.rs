//! The basic example's handler, apart from `main` so that its test runs the same code the
//! function deploys.
//!
//! A handler is any `async fn(Record) -> Outcome`. It says what became of one record: done,
//! failed for now (retried in order), or never able to succeed (rejected).

use kinesis_checkpoint::{Outcome, Record};

/// Handles one record: logs where it came from and how big it is.
///
/// An empty record carries no event, so it is rejected. Without a dead-letter sink (this
/// example has none) a rejected record is reported and retried: its shard waits, nothing is lost.
#[allow(
    clippy::unused_async,
    reason = "a handler is an async fn; a real one awaits its downstream here"
)]
pub async fn handle(record: Record) -> Outcome {
    if record.data().is_empty() {
        return Outcome::reject("an empty record carries no event");
    }
    tracing::info!(
        shard = record.shard(),
        sequence = %record.sequence(),
        partition_key = record.partition_key(),
        bytes = record.data().len(),
        "handled"
    );
    Outcome::ack()
}
