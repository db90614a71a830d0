//! Runs the dead letters of the queue at `DEAD_LETTER_QUEUE_URL` through the function's handler
//! again, once their cause is fixed: a command an operator runs, not a Lambda function.
//!
//! A message is deleted only once its order is done; the rest stay in the queue. Redriven
//! orders run after newer records of their key, so redrive when that order no longer matters.

use std::time::Duration;

use example_json_dead_letters::{handler, log_order};
use kinesis_checkpoint::dead_letter::redrive;

/// How long a received message stays hidden from other readers: long enough to run them all.
const VISIBILITY: Duration = Duration::from_mins(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    let queue =
        std::env::var("DEAD_LETTER_QUEUE_URL").map_err(|_| "DEAD_LETTER_QUEUE_URL is not set")?;
    let config = aws_config::load_from_env().await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let report = redrive(&sqs, &queue, &handler(log_order), VISIBILITY).await?;
    println!(
        "{} redriven, {} failed, {} incomplete, {} foreign",
        report.redriven, report.failed, report.incomplete, report.foreign
    );
    for line in &report.left {
        println!("left in the queue: {line}");
    }
    Ok(())
}
