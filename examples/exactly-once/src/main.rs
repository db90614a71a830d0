//! The exactly-once example's Lambda function: each payment's writes committed with the
//! checkpoint past it. Tables from `LEASE_TABLE`, `PAYMENTS_TABLE` and `BALANCES_TABLE` (one
//! account and region, as a transaction needs); rejected payments into `DEAD_LETTER_QUEUE_URL`.

use std::sync::Arc;

use example_exactly_once::{Tables, handler};
use kinesis_checkpoint::{DynamoLeaseStore, Processor, SqsDeadLetters};

fn variable(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    // Lambda stamps each line with its own time.
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .init();
    let tables = Tables {
        payments: variable("PAYMENTS_TABLE")?,
        balances: variable("BALANCES_TABLE")?,
    };
    let config = aws_config::load_from_env().await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, variable("LEASE_TABLE")?));
    let dead_letters = Arc::new(SqsDeadLetters::new(
        &config,
        variable("DEAD_LETTER_QUEUE_URL")?,
    ));
    let processor = Processor::transactional(leases, handler(tables)).dead_letters(dead_letters);
    lambda_runtime::run(processor.service()).await
}
