//! The Managed Instances example's handler and runtime, apart from `main` so that the test runs
//! what the function runs.
//!
//! On Lambda Managed Instances one process serves several invocations at once, up to
//! `AWS_LAMBDA_MAX_CONCURRENCY`. The processor's service is `Clone` for that, and each invocation
//! claims its shard under its own owner (its request id). Two deliveries of one shard then exclude
//! each other through the lease, while other shards run side by side.

use kinesis_checkpoint::{Outcome, Record};

/// How many invocations Lambda runs at once in this process: `AWS_LAMBDA_MAX_CONCURRENCY`, set
/// on Managed Instances; 1 when unset, as on classic Lambda.
#[must_use]
pub fn max_concurrency(setting: Option<&str>) -> usize {
    setting
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

/// The tokio runtime for `max_concurrency` invocations at once: a worker per CPU when they run
/// in parallel, one thread when Lambda sends one at a time (its workers would only cost start-up
/// time).
///
/// # Errors
///
/// The runtime could not be built.
pub fn runtime(max_concurrency: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if max_concurrency > 1 {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build()
}

/// The function's handler: logs each record.
#[allow(
    clippy::unused_async,
    reason = "a handler is an async fn; a real one awaits its downstream here"
)]
pub async fn handle(record: Record) -> Outcome {
    tracing::info!(shard = record.shard(), sequence = %record.sequence(), "handled");
    Outcome::ack()
}
