//! Redrives the ledger's dead letters: runs every record of the dead-letter queue through the
//! ledger's handler again and deletes each message once its record is applied. Records the
//! handler still rejects stay in the queue.
//!
//! `DEAD_LETTER_QUEUE_URL=… LEDGER_TABLE=… cargo run -p ledger --bin ledger-redrive`

use std::sync::Arc;
use std::time::Duration;

use kinesis_checkpoint::dead_letter::redrive;
use ledger::{DynamoBook, required};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = aws_config::load_from_env().await;
    let queue = required("DEAD_LETTER_QUEUE_URL")?;
    let book = Arc::new(DynamoBook::new(&config, required("LEDGER_TABLE")?));
    let client = aws_sdk_sqs::Client::new(&config);
    let report = redrive(
        &client,
        &queue,
        &ledger::handler(book),
        Duration::from_mins(5),
    )
    .await?;
    println!(
        "{} redriven and deleted ({} leftover parts deleted); {} still failing, {} incomplete, {} corrupt, {} not ours: left in the queue",
        report.redriven,
        report.leftovers,
        report.failed,
        report.incomplete,
        report.corrupt,
        report.foreign
    );
    for reason in &report.left {
        println!("left: {reason}");
    }
    Ok(())
}
