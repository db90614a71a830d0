//! The KPL example's Lambda function: [`example_kpl_aggregates::apply`] on each user record,
//! aggregates unpacked, leases and checkpoints in the table `LEASE_TABLE`.

use std::sync::Arc;

use kinesis_checkpoint::{DynamoLeaseStore, Processor, json};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Lambda stamps each line with its own time.
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .init();
    let table = std::env::var("LEASE_TABLE").map_err(|_| "LEASE_TABLE is not set")?;
    let config = aws_config::load_from_env().await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, table));
    // Aggregates are unpacked by default; nothing to turn on.
    let processor = Processor::new(leases, json(example_kpl_aggregates::apply));
    lambda_runtime::run(processor.service()).await
}
