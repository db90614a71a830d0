//! The `kinesis-checkpoint` command: what an operator needs to see and steer the lease table of
//! a Lambda function built on the toolkit without writing `DynamoDB` expressions by hand.
//!
//! One module per command, each callable from tests and scripts: [`status`] (a line per shard,
//! with how far behind its checkpoint is), [`checkpoint`] (move a shard's checkpoint, behind a
//! confirmation), [`import`] (bring checkpoints over from the seed crate's bare-shard rows or
//! from a KCL application's lease table) and [`doctor`] (check a deployment's event source
//! mapping against what the toolkit needs). [`console`] holds the prompt and the progress line
//! they share.

pub mod checkpoint;
pub mod console;
pub mod deployed;
pub mod doctor;
pub mod import;
pub mod status;

/// The error a command ends with: its message is what the operator reads.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The AWS configuration of the environment (region, credentials, `AWS_ENDPOINT_URL` and the
/// per-service `AWS_ENDPOINT_URL_DYNAMODB` / `AWS_ENDPOINT_URL_KINESIS`), with `endpoint`
/// overriding every service's endpoint when given.
///
/// ```no_run
/// # async fn run() {
/// let config = kinesis_checkpoint_cli::aws_config(Some("http://127.0.0.1:5000")).await;
/// # }
/// ```
pub async fn aws_config(endpoint: Option<&str>) -> aws_config::SdkConfig {
    let loader = aws_config::from_env();
    match endpoint {
        Some(endpoint) => loader.endpoint_url(endpoint).load().await,
        None => loader.load().await,
    }
}
