//! The floor again, on tokio's current-thread runtime: `bare` (`src/main.rs`) is the function
//! as `lambda_runtime`'s examples write it, `#[tokio::main]`, whose multi-threaded runtime
//! starts a worker thread per CPU; the ledger runs one invocation at a time on the
//! current-thread runtime (see its `main.rs`), so its cold start is also compared with this
//! one, which differs from `bare` in that attribute only (BENCHMARKS.md, "Cold start").

use lambda_runtime::{Error, LambdaEvent, service_fn};
use serde_json::{Value, json};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(|_: LambdaEvent<Value>| async {
        Ok::<_, Error>(json!({ "batchItemFailures": [] }))
    }))
    .await
}
