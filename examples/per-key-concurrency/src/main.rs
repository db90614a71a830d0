//! The per-key concurrency example's Lambda function: [`example_per_key_concurrency::notify`]
//! on up to `MAX_IN_FLIGHT` records of different partition keys at once, leases and checkpoints
//! in the table `LEASE_TABLE`.

use std::sync::Arc;

use example_per_key_concurrency::{max_in_flight, notify, processor};
use kinesis_checkpoint::DynamoLeaseStore;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Lambda stamps each line with its own time.
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .init();
    let table = std::env::var("LEASE_TABLE").map_err(|_| "LEASE_TABLE is not set")?;
    let in_flight = max_in_flight(std::env::var("MAX_IN_FLIGHT").ok().as_deref())?;
    let config = aws_config::load_from_env().await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, table));
    lambda_runtime::run(processor(leases, notify, in_flight).service()).await
}
