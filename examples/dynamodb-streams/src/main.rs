//! The `DynamoDB` Streams example's Lambda function: [`example_dynamodb_streams::handle`] on
//! every change of the table, with the leases in `LEASE_TABLE`, refused changes in
//! `DEAD_LETTER_QUEUE_URL`, and each shard held until its parent is done.

use std::sync::Arc;

use kinesis_checkpoint::dynamodb_streams::DynamoDbStreamsTopology;
use kinesis_checkpoint::{
    DynamoLeaseStore, Gate, Processor, SqsDeadLetters, StartingPosition, json,
};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .init();
    let variable = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let config = aws_config::load_from_env().await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, variable("LEASE_TABLE")?));
    let letters = Arc::new(SqsDeadLetters::new(
        &config,
        variable("DEAD_LETTER_QUEUE_URL")?,
    ));
    let topology = Arc::new(DynamoDbStreamsTopology::new(&config));
    let processor = Processor::new(leases, json(example_dynamodb_streams::handle))
        .gate(Gate::new(topology, StartingPosition::TrimHorizon))
        .dead_letters(letters);
    lambda_runtime::run(processor.dynamodb_service()).await
}
