//! The typed JSON example's Lambda function: orders from Kinesis, poison records into the SQS
//! queue at `DEAD_LETTER_QUEUE_URL`, leases and checkpoints in the table `LEASE_TABLE`.
//!
//! The gate holds a child shard's records until its parents are done, so that each order id
//! keeps its order across a resharding; `STARTING_POSITION` must be the mapping's.

use std::sync::Arc;

use example_json_dead_letters::{handler, log_order, processor};
use kinesis_checkpoint::{
    DynamoLeaseStore, Gate, KinesisTopology, SqsDeadLetters, StartingPosition,
};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Lambda stamps each line with its own time.
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .init();
    let table = std::env::var("LEASE_TABLE").map_err(|_| "LEASE_TABLE is not set")?;
    let queue =
        std::env::var("DEAD_LETTER_QUEUE_URL").map_err(|_| "DEAD_LETTER_QUEUE_URL is not set")?;
    let starting: StartingPosition = std::env::var("STARTING_POSITION")
        .map_or(Ok(StartingPosition::TrimHorizon), |position| {
            position.parse()
        })?;
    let config = aws_config::load_from_env().await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, table));
    let dead_letters = Arc::new(SqsDeadLetters::new(&config, queue));
    let gate = Gate::new(Arc::new(KinesisTopology::new(&config)), starting);
    let processor = processor(leases, handler(log_order), dead_letters).gate(gate);
    lambda_runtime::run(processor.service()).await
}
