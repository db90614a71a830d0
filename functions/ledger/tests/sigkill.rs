//! End to end under SIGKILL: the `ledger` binary in `LEDGER_MODE=transactional`, fed the orders
//! of a kinesis-local stream in batches the way a mapping delivers them, killed with SIGKILL at
//! random moments of its invocations and started again; Lambda's retry is the same batch again
//! (from the reported record, after an answer). At the end every order is applied exactly once.
//!
//! The Lambda runtime API is served here, by a few lines over `std::net`, rather than by
//! `cargo lambda watch`: a killed function's invocation must fail the way Lambda fails it (no
//! answer; the test retries the batch) and the next process must find the API where the last
//! one left it. Each invocation is given a deadline 3 s away, so a dead invocation's lease
//! (capped by the deadline) lapses in seconds.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, create_table, unique};
use common::root;
use serde_json::{Value, json};

/// How long each invocation is given: its lease lasts no longer.
const DEADLINE: Duration = Duration::from_secs(3);

/// The runtime API's state: the invocation waiting to be taken, and the answers.
#[derive(Default)]
struct Api {
    queued: VecDeque<(String, Vec<u8>)>,
    answers: HashMap<String, Value>,
}

type Shared = Arc<(Mutex<Api>, Condvar)>;

fn serve(listener: &TcpListener, api: &Shared) {
    for stream in listener.incoming().flatten() {
        let api = Arc::clone(api);
        std::thread::spawn(move || {
            let _ = connection(stream, &api);
        });
    }
}

/// Serves one connection's requests until it closes (the runtime client keeps it alive).
fn connection(stream: TcpStream, api: &Shared) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut stream = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_owned(),
            parts.next().unwrap_or("").to_owned(),
        );
        let mut length = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            if header.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        if method == "GET" && path.ends_with("/runtime/invocation/next") {
            let (lock, ready) = &**api;
            let mut state = lock.lock().unwrap();
            while state.queued.is_empty() {
                state = ready.wait(state).unwrap();
            }
            let (id, event) = state.queued.pop_front().unwrap();
            drop(state);
            let deadline = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + DEADLINE;
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nLambda-Runtime-Aws-Request-Id: {id}\r\nLambda-Runtime-Deadline-Ms: {}\r\nLambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:000000000000:function:ledger\r\nLambda-Runtime-Trace-Id: Root=1-0-0\r\nContent-Length: {}\r\n\r\n",
                deadline.as_millis(),
                event.len()
            )?;
            stream.write_all(&event)?;
        } else {
            if let Some(rest) = path.strip_prefix("/2018-06-01/runtime/invocation/")
                && let Some((id, kind)) = rest.split_once('/')
            {
                let answer = if kind == "response" {
                    serde_json::from_slice(&body).unwrap_or(Value::Null)
                } else {
                    json!({ "error": String::from_utf8_lossy(&body) })
                };
                let (lock, ready) = &**api;
                lock.lock().unwrap().answers.insert(id.to_owned(), answer);
                ready.notify_all();
            }
            stream.write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")?;
        }
    }
}

/// A small deterministic generator: the kill moments of a run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }
}

fn spawn(env: &[(String, String)], runtime: &str, log: &Path) -> Child {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_ledger"))
        .env("AWS_LAMBDA_RUNTIME_API", runtime)
        .env("AWS_LAMBDA_FUNCTION_NAME", "ledger")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("the ledger binary starts")
}

fn failures(answer: &Value) -> Option<Vec<String>> {
    answer["batchItemFailures"].as_array().map(|failures| {
        failures
            .iter()
            .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
            .collect()
    })
}

#[tokio::test(flavor = "multi_thread")]
#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end run, its steps in order"
)]
async fn the_transactional_ledger_killed_at_random_moments_applies_every_order_exactly_once() {
    let moto = Moto::shared();
    let config = moto.sdk_config(3).await;
    let (leases, ledger) = (unique("leases"), unique("ledger"));
    create_lease_table(&config, &leases).await;
    create_table(&config, &ledger, "order_id").await;
    let kinesis = common::kinesis::KinesisLocal::start();
    let kinesis_config = common::moto::sdk_config(&kinesis.endpoint, 1).await;
    let stream = common::kinesis::Stream::with_shards(&kinesis_config, "orders", 1).await;
    // 120 orders over 12 order ids, each pausing a little: a batch takes long enough to die in.
    let producer = stream.client.clone();
    let mut want: HashMap<String, (i64, i64)> = HashMap::new();
    for n in 0..120_i64 {
        let order = format!("O-{}", n % 12);
        let payload = json!({ "order_id": order, "amount_cents": 100 + n, "pause_ms": 5 });
        producer
            .put_record()
            .stream_name("orders")
            .partition_key(&order)
            .data(aws_sdk_kinesis::primitives::Blob::new(payload.to_string()))
            .send()
            .await
            .unwrap();
        let entry = want.entry(order).or_default();
        entry.0 += 100 + n;
        entry.1 += 1;
    }
    let all = stream.batch("shardId-000000000000").await;
    assert_eq!(all.records.len(), 120);
    let last = all.records[119].kinesis.sequence_number.clone();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let runtime = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
    let api: Shared = Arc::default();
    let served = Arc::clone(&api);
    std::thread::spawn(move || serve(&listener, &served));
    let env: Vec<(String, String)> = [
        ("LEASE_TABLE", leases.as_str()),
        ("LEDGER_TABLE", ledger.as_str()),
        ("LEDGER_MODE", "transactional"),
        ("STARTING_POSITION", "TRIM_HORIZON"),
        ("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint.as_str()),
        ("AWS_ENDPOINT_URL", moto.endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let log = root().join("target").join("e2e-ledger-sigkill.log");
    let _ = std::fs::remove_file(&log);

    let outcome = tokio::task::spawn_blocking(move || {
        let mut rng = Lcg(18);
        let mut child = spawn(&env, &runtime, &log);
        let mut kills = 0;
        let mut invocations = 0;
        // Batches of 30, as the mapping would cut the shard; each retried until it is done.
        let mut from = 0;
        while from < all.records.len() {
            let mut event = KinesisEvent::default();
            event.records = all.records[from..(from + 30).min(all.records.len())].to_vec();
            invocations += 1;
            let id = format!("invocation-{invocations}");
            let (lock, ready) = &*api;
            lock.lock()
                .unwrap()
                .queued
                .push_back((id.clone(), serde_json::to_vec(&event).unwrap()));
            ready.notify_all();
            // Half the invocations are killed at a random moment of their first 400 ms.
            let kill_at = (rng.below(2) == 0).then(|| Duration::from_millis(rng.below(400)));
            let started = Instant::now();
            let answer = loop {
                let state = lock.lock().unwrap();
                let (mut state, _) = ready.wait_timeout(state, Duration::from_millis(5)).unwrap();
                if let Some(answer) = state.answers.remove(&id) {
                    break Some(answer);
                }
                drop(state);
                if kill_at.is_some_and(|at| started.elapsed() >= at) {
                    break None;
                }
                assert!(
                    started.elapsed() < Duration::from_mins(1),
                    "{id} never answered"
                );
            };
            match answer {
                None => {
                    // SIGKILL, as Lambda ends a sandbox; its invocation fails and is retried.
                    child.kill().unwrap();
                    child.wait().unwrap();
                    kills += 1;
                    lock.lock()
                        .unwrap()
                        .queued
                        .retain(|(queued, _)| *queued != id);
                    std::thread::sleep(DEADLINE);
                    child = spawn(&env, &runtime, &log);
                }
                Some(answer) => match failures(&answer) {
                    Some(failed) if failed.is_empty() => from += event.records.len(),
                    Some(failed) => {
                        // Delivered again from the reported record, after the dead one's lease.
                        let at = event
                            .records
                            .iter()
                            .position(|r| r.kinesis.sequence_number == failed[0])
                            .expect("a record of the batch");
                        from += at;
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    None => panic!("{id} failed: {answer}"),
                },
            }
            assert!(invocations < 200, "the stream never finished");
        }
        child.kill().unwrap();
        child.wait().unwrap();
        (kills, invocations)
    })
    .await
    .unwrap();
    let (kills, invocations) = outcome;
    println!("{invocations} invocations, {kills} killed with SIGKILL");
    assert!(kills > 0, "the run killed the function");

    let client = aws_sdk_dynamodb::Client::new(&config);
    let items = client
        .scan()
        .table_name(&ledger)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default();
    let got: HashMap<String, (i64, i64)> = items
        .iter()
        .map(|item| {
            let n = |name: &str| item[name].as_n().unwrap().parse::<i64>().unwrap();
            (
                item["order_id"].as_s().unwrap().clone(),
                (n("total_cents"), n("applied")),
            )
        })
        .collect();
    assert_eq!(got, want, "every order applied exactly once");
    let row = client
        .get_item()
        .table_name(&leases)
        .key(
            "lease_key",
            AttributeValue::S("orders:shardId-000000000000".to_owned()),
        )
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    assert_eq!(
        row["checkpoint"].as_s().unwrap(),
        &last,
        "checkpointed at the last record"
    );
    assert!(!row.contains_key("lease_owner"), "released");
}
