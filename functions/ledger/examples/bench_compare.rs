//! The toolkit's side of `make bench-compare` (BENCHMARKS.md, "Side by side with Powertools"),
//! for a Kinesis stream or (`--source dynamodb-streams`) a table's stream:
//! the ledger's handler on `DynamoLeaseStore` and `DynamoBook`, as `main.rs` builds it, against
//! a local `DynamoDB` (moto), timing each batch it is given.
//!
//! `scripts/bench-compare` starts it, and `scripts/bench_compare/powertools_side.py` beside it,
//! on one moto, and feeds both the same events. Each line on standard input names one of the
//! event files given as arguments (all read before the first batch, so no file is read while
//! timing); each line on standard output is the batch's figures as JSON:
//!
//! ```text
//! {"event":"…","records":100,"processed":100,"duplicates":0,"failures":[],"wall_ns":…,"cpu_ns":…}
//! ```
//!
//! The timed part is what the function does with an invocation's body: the event read from its
//! JSON bytes (as `lambda_runtime` does, into `InvocationEvent`), the batch processed, the
//! answer serialized. CPU time is the sum over the process's threads of the time each spent on
//! a CPU (`/proc/self/task/*/schedstat`, nanoseconds), read around that part: the workspace
//! forbids `unsafe`, so `getrusage` and `clock_gettime` are out of reach, and `/proc/self/stat`
//! counts in 10 ms ticks, coarser than a batch. A thread that ended in between would go
//! uncounted; the runtime's workers live as long as the process.
//!
//! Without the parent gate, metrics or dead letters: the Powertools side has none of them, and
//! the gate costs one `ListShards` per process for a shard without parents, not one per batch.
//! Without logging either (no subscriber), as on the Powertools side.
//!
//! ```text
//! cargo run --release -p ledger --example bench_compare -- \
//!     --endpoint http://127.0.0.1:PORT --lease-table LEASES --ledger-table LEDGER EVENT.json...
//! ```

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Instant;

use aws_config::BehaviorVersion;
use aws_sdk_dynamodb::config::{Credentials, Region};
use kinesis_checkpoint::dynamodb_streams::WindowEvent;
use kinesis_checkpoint::event::InvocationEvent;
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::{DynamoLeaseStore, Processor};
use ledger::DynamoBook;
use serde_json::json;

/// The command line.
struct Args {
    endpoint: String,
    lease_table: String,
    ledger_table: String,
    /// `kinesis` (Kinesis events) or `dynamodb-streams` (window events of a table's stream).
    source: String,
    events: Vec<String>,
}

const USAGE: &str = "usage: bench_compare --endpoint URL --lease-table NAME --ledger-table NAME [--source kinesis|dynamodb-streams] EVENT.json...";

fn parse_args() -> Result<Args, String> {
    let mut endpoint = None;
    let mut lease_table = None;
    let mut ledger_table = None;
    let mut source = None;
    let mut events = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--endpoint" => &mut endpoint,
            "--lease-table" => &mut lease_table,
            "--ledger-table" => &mut ledger_table,
            "--source" => &mut source,
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
        source: source.unwrap_or_else(|| "kinesis".to_owned()),
        events,
    })
}

/// Nanoseconds this process's threads have spent on a CPU.
fn cpu_ns() -> Result<u64, String> {
    let tasks = std::fs::read_dir("/proc/self/task")
        .map_err(|e| format!("/proc/self/task: {e} (CPU time needs Linux)"))?;
    let mut total = 0;
    for task in tasks {
        let path = task.map_err(|e| e.to_string())?.path().join("schedstat");
        // A thread may end between the listing and the read: it is then not counted.
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
    // As `main.rs` builds it, less the gate, the metrics and the dead letters (module doc).
    let leases = Arc::new(DynamoLeaseStore::new(&config, &args.lease_table));
    let book = Arc::new(DynamoBook::new(&config, &args.ledger_table));
    // For a table's stream, as `main.rs` builds it for `EVENT_SOURCE=dynamodb-streams`: each
    // change read as the order the Kinesis ledger reads.
    let dynamodb = match args.source.as_str() {
        "kinesis" => false,
        "dynamodb-streams" => true,
        other => return Err(format!("unknown source {other}; {USAGE}").into()),
    };
    let processor = Processor::new(leases.clone(), ledger::handler(Arc::clone(&book)));
    let table_processor = Processor::new(leases, ledger::changes::orders(ledger::handler(book)));

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

        let cpu_before = cpu_ns()?;
        let started = Instant::now();
        // A window event runs as `process_dynamodb` runs it; its answer carries the state.
        let (report, answer) = if dynamodb {
            let event: WindowEvent = serde_json::from_slice(body)?;
            let report = table_processor
                .process_batch(event.into_kinesis()?, &context)
                .await?;
            let mut answer = serde_json::to_value(report.response())?;
            answer["state"] = json!({});
            (report, serde_json::to_vec(&answer)?)
        } else {
            let event: InvocationEvent = serde_json::from_slice(body)?;
            let report = processor.process_batch(event.0, &context).await?;
            let answer = serde_json::to_vec(&report.response())?;
            (report, answer)
        };
        let wall = started.elapsed();
        let cpu = cpu_ns()? - cpu_before;

        let count = |disposition| {
            report
                .shards
                .iter()
                .map(|shard| shard.count(disposition))
                .sum::<usize>()
        };
        let response: serde_json::Value = serde_json::from_slice(&answer)?;
        let failures: Vec<&str> = response["batchItemFailures"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|failure| failure["itemIdentifier"].as_str())
            .collect();
        let line = json!({
            "event": path,
            "records": report.shards.iter().map(|shard| shard.records.len()).sum::<usize>(),
            "processed": count(Disposition::Processed),
            "duplicates": count(Disposition::Duplicate),
            "failures": failures,
            "wall_ns": u64::try_from(wall.as_nanos())?,
            "cpu_ns": cpu,
        });
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}
