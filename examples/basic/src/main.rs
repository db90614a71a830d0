//! The basic example's Lambda function: [`example_basic::handle`] on every record, with the
//! shard's lease and checkpoint in the `DynamoDB` table named by `LEASE_TABLE`.

use std::sync::Arc;

use kinesis_checkpoint::{DynamoLeaseStore, Processor};

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
    lambda_runtime::run(Processor::new(leases, example_basic::handle).service()).await
}
