//! The floor for the cold-start benchmark: a Lambda function that reads a Kinesis event as plain
//! JSON and answers "no failures", with nothing of the toolkit, no SDK and no I/O of its own.
//! Built with the same release profile as `ledger`, it shows what any Rust function pays for
//! the runtime client alone; `ledger`'s cold start is reported as a multiple of it (see
//! BENCHMARKS.md).

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(|_: LambdaEvent<Value>| async {
        Ok::<_, Error>(json!({ "batchItemFailures": [] }))
    }))
    .await
}
