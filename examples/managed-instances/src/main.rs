//! The Managed Instances example's Lambda function: [`example_managed_instances::handle`] with
//! leases and checkpoints in the table `LEASE_TABLE`, serving as many invocations at once as
//! `AWS_LAMBDA_MAX_CONCURRENCY` allows. Unset or 1, it runs one at a time: the same binary serves
//! classic Lambda.

use std::sync::Arc;

use example_managed_instances::{handle, max_concurrency, runtime};
use kinesis_checkpoint::{DynamoLeaseStore, Processor};

fn main() -> Result<(), lambda_runtime::Error> {
    let concurrency = max_concurrency(std::env::var("AWS_LAMBDA_MAX_CONCURRENCY").ok().as_deref());
    runtime(concurrency)?.block_on(serve())
}

async fn serve() -> Result<(), lambda_runtime::Error> {
    // Lambda stamps each line with its own time.
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .init();
    let table = std::env::var("LEASE_TABLE").map_err(|_| "LEASE_TABLE is not set")?;
    let config = aws_config::load_from_env().await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, table));
    let processor = Processor::new(leases, handle);
    // `run` where invocations come one at a time; `run_concurrent` reads
    // AWS_LAMBDA_MAX_CONCURRENCY and runs that many clones of the service at once.
    lambda_runtime::run_concurrent(processor.service()).await
}
