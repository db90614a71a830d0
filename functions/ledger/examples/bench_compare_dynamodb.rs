//! The toolkit's side of `make bench-compare` for `DynamoDB` Streams (BENCHMARKS.md, "Side by
//! side with Powertools"): the ledger's handler of table changes on `DynamoLeaseStore` and
//! `DynamoBook`, through `Processor::process_dynamodb`, against a local `DynamoDB` (moto),
//! timing each window event it is given.
//!
//! HOOK (lead): this file belongs in `functions/ledger/examples/bench_compare_dynamodb.rs`;
//! `make bench-compare` builds it from there (the Makefile looks for it) and
//! `scripts/bench-compare` runs `target/release/examples/bench_compare_dynamodb` when it
//! exists, else it measures the Powertools side alone and says so.
//!
//! The protocol is `bench_compare`'s (the Kinesis driver): each line on standard input names
//! one of the event files given as arguments (all read before the first batch); each line on
//! standard output is the batch's figures as JSON:
//!
//! ```text
//! {"event":"…","records":100,"processed":100,"failures":[],"wall_ns":…,"cpu_ns":…}
//! ```
//!
//! The timed part is what the function does with an invocation's body: the window event read
//! from its JSON bytes (`WindowEvent`, as `dynamodb_service` reads it), the changes processed
//! (`process_dynamodb`), the answer serialized. `processed` counts the handler's acks (a
//! counting wrapper around it: one atomic add per record). CPU time is read as in
//! `bench_compare` (`/proc/self/task/*/schedstat`).
//!
//! Without the parent gate, metrics or dead letters, as `bench_compare`.
//!
//! ```text
//! cargo run --release -p ledger --example bench_compare_dynamodb -- \
//!     --endpoint http://127.0.0.1:PORT --lease-table LEASES --ledger-table LEDGER EVENT.json...
//! ```

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::config::{Credentials, Region};
use kinesis_checkpoint::dynamodb_streams::WindowEvent;
use kinesis_checkpoint::{DynamoLeaseStore, Handler, Processor, Record};
use ledger::DynamoBook;
use serde_json::json;

/// The command line.
struct Args {
    endpoint: String,
    lease_table: String,
    ledger_table: String,
    events: Vec<String>,
}

const USAGE: &str = "usage: bench_compare_dynamodb --endpoint URL --lease-table NAME --ledger-table NAME EVENT.json...";

fn parse_args() -> Result<Args, String> {
    let mut endpoint = None;
    let mut lease_table = None;
    let mut ledger_table = None;
    let mut events = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--endpoint" => &mut endpoint,
            "--lease-table" => &mut lease_table,
            "--ledger-table" => &mut ledger_table,
            flag if flag.starts_with("--") => {
                return Err(format!("unknown option {flag}; {USAGE}"));
            }
            _ => {
                events.push(arg);
                continue;
            }
        };
        *slot = Some(
            args.next()
                .ok_or_else(|| format!("{arg} needs a value; {USAGE}"))?,
        );
    }
    Ok(Args {
        endpoint: endpoint.ok_or(USAGE)?,
        lease_table: lease_table.ok_or(USAGE)?,
        ledger_table: ledger_table.ok_or(USAGE)?,
        events,
    })
}

/// Nanoseconds this process's threads have spent on a CPU (as in `bench_compare`).
fn cpu_ns() -> Result<u64, String> {
    let tasks = std::fs::read_dir("/proc/self/task")
        .map_err(|e| format!("/proc/self/task: {e} (CPU time needs Linux)"))?;
    let mut total = 0;
    for task in tasks {
        let path = task.map_err(|e| e.to_string())?.path().join("schedstat");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let on_cpu: u64 = text
            .split_whitespace()
            .next()
            .and_then(|field| field.parse().ok())
            .ok_or_else(|| format!("{}: unexpected {text:?}", path.display()))?;
        total += on_cpu;
    }
    Ok(total)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let config = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(&args.endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "bench"))
        .load()
        .await;
    let leases = Arc::new(DynamoLeaseStore::new(&config, &args.lease_table));
    let book = Arc::new(DynamoBook::new(&config, &args.ledger_table));
    // The ledger as `main.rs` builds it for `EVENT_SOURCE=dynamodb-streams`, less the gate,
    // the metrics and the dead letters: each change read as the order the Kinesis ledger reads.
    let ledger = Arc::new(ledger::changes::orders(ledger::handler(book)));
    // The handler's acks: the records it processed.
    let acks = Arc::new(AtomicUsize::new(0));
    let counted = {
        let acks = Arc::clone(&acks);
        move |record: Record| {
            let ledger = Arc::clone(&ledger);
            let acks = Arc::clone(&acks);
            async move {
                let outcome = ledger.handle_unboxed(record).await;
                if outcome.is_ack() {
                    acks.fetch_add(1, Ordering::Relaxed);
                }
                outcome
            }
        }
    };
    let processor = Processor::new(leases, counted);

    let mut bodies = HashMap::new();
    for path in &args.events {
        bodies.insert(
            path.clone(),
            std::fs::read(path).map_err(|e| format!("{path}: {e}"))?,
        );
    }
    let mut out = std::io::stdout().lock();
    let mut invocation = 0u64;
    for line in std::io::stdin().lock().lines() {
        let path = line?;
        let body = bodies
            .get(path.trim())
            .ok_or_else(|| format!("{path} is not one of the event files given as arguments"))?;
        invocation += 1;
        let mut context = lambda_runtime::Context::default();
        context.request_id = format!("bench-{invocation}");
        context.deadline = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis(),
        )? + 900_000;
        let acks_before = acks.load(Ordering::Relaxed);

        let cpu_before = cpu_ns()?;
        let started = Instant::now();
        let event: WindowEvent = serde_json::from_slice(body)?;
        let records = event.records.len();
        let response = processor.process_dynamodb(event, &context).await?;
        let answer = serde_json::to_vec(&response)?;
        let wall = started.elapsed();
        let cpu = cpu_ns()? - cpu_before;

        let response: serde_json::Value = serde_json::from_slice(&answer)?;
        let failures: Vec<&str> = response["batchItemFailures"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|failure| failure["itemIdentifier"].as_str())
            .collect();
        let line = json!({
            "event": path,
            "records": records,
            "processed": acks.load(Ordering::Relaxed) - acks_before,
            "failures": failures,
            "state": response["state"],
            "wall_ns": u64::try_from(wall.as_nanos())?,
            "cpu_ns": cpu,
        });
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}
