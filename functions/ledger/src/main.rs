//! The ledger Lambda function: order events from Kinesis into a `DynamoDB` table, each record
//! applied once. Configuration from the environment: `LEASE_TABLE`, `LEDGER_TABLE`, and the
//! SDK's own variables (`AWS_ENDPOINT_URL` points it at local servers).

use std::sync::Arc;

use kinesis_checkpoint::{DynamoLeaseStore, Processor};
use ledger::DynamoBook;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = aws_config::load_from_env().await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, required("LEASE_TABLE")?));
    let book = Arc::new(DynamoBook::new(&config, required("LEDGER_TABLE")?));
    lambda_runtime::run(Processor::new(leases, ledger::handler(book)).service()).await
}

fn required(name: &str) -> Result<String, lambda_runtime::Error> {
    std::env::var(name).map_err(|_| format!("set {name} to the name of its DynamoDB table").into())
}
