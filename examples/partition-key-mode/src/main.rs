//! The partition-key mode example's Lambda function: [`example_partition_key_mode::handle`] with
//! a checkpoint per partition key in the table `LEASE_TABLE`.
//!
//! `CHECKPOINT_MODE` says the mode, as `kinesis-checkpoint doctor` reads it beside the mapping's
//! `ParallelizationFactor`: `partition-key` (the default here) for 2 to 10, `shard` for 1. One
//! binary then follows the template whichever way the factor is set.

use std::sync::Arc;

use example_partition_key_mode::{handle, processor};
use kinesis_checkpoint::processor::CheckpointMode;
use kinesis_checkpoint::{DynamoLeaseStore, Handler, Mode, Processor};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Lambda stamps each line with its own time.
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .init();
    let table = std::env::var("LEASE_TABLE").map_err(|_| "LEASE_TABLE is not set")?;
    let mode: Mode =
        std::env::var("CHECKPOINT_MODE").map_or(Ok(Mode::PartitionKey), |mode| mode.parse())?;
    let config = aws_config::load_from_env().await;
    let store = Arc::new(DynamoLeaseStore::new(&config, table));
    // The mode is the processor's type: the branch is taken once, here.
    match mode {
        Mode::PartitionKey => serve(processor(store, handle)).await,
        Mode::Shard => serve(Processor::new(store, handle)).await,
    }
}

async fn serve<H: Handler, M: CheckpointMode>(
    processor: Processor<H, M>,
) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(processor.service()).await
}
