//! Lambda Managed Instances: the `ledger` binary with `AWS_LAMBDA_MAX_CONCURRENCY=4` runs
//! several invocations at once in one process (`lambda_runtime::run_concurrent`), against the
//! runtime API of `cargo lambda watch --only-lambda-apis`, moto serving one request at a time
//! (so that conditional writes are atomic, as `DynamoDB`'s are) and kinesis-local.
//!
//! The interleaving is forced, not left to luck: the first invocation's first record pauses
//! (`"pause_ms"`) while it holds its shard's lease, and the test sends the others only once the
//! lease table shows that lease taken. A second delivery of the same shard must then be turned
//! away by the lease, and a batch of another shard must run and answer while the first is still
//! in flight. Each invocation's metric line must count only its own requests.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, create_table, unique};
use common::watch::{self, Watched};
use common::{lambda_record, sequence};
use serde_json::{Value, json};

const PARENT: &str = "shardId-000000000000";
const LEFT: &str = "shardId-000000000001";
const RIGHT: &str = "shardId-000000000002";

/// The metric lines the function printed, one per invocation.
fn metric_lines(function: &Watched) -> Vec<Value> {
    std::fs::read_to_string(function.log())
        .unwrap()
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Invokes the function at `url` with `event` and returns the records it reported; blocking,
/// so run it on a thread of its own.
fn invoke(url: &str, event: &KinesisEvent) -> Vec<String> {
    watch::invoke(url, event)["batchItemFailures"]
        .as_array()
        .expect("a partial batch response")
        .iter()
        .map(|f| f["itemIdentifier"].as_str().unwrap().to_owned())
        .collect()
}

fn orders(shard: &str, first: u64, orders: &[Value]) -> KinesisEvent {
    let records: Vec<Value> = (first..)
        .zip(orders)
        .map(|(n, order)| {
            lambda_record(
                "orders",
                shard,
                n,
                order["order_id"].as_str().unwrap(),
                order,
            )
        })
        .collect();
    common::event(&records)
}

async fn rows(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
) -> HashMap<String, HashMap<String, AttributeValue>> {
    client
        .scan()
        .table_name(table)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default()
        .into_iter()
        .map(|row| (row[key].as_s().unwrap().clone(), row))
        .collect()
}

fn s(row: &HashMap<String, AttributeValue>, name: &str) -> String {
    row[name].as_s().unwrap().clone()
}

fn n(row: &HashMap<String, AttributeValue>, name: &str) -> i64 {
    row[name].as_n().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_invocations_in_one_process_exclude_one_shard_and_let_others_run() {
    let moto = Moto::start(false);
    let config = moto.sdk_config(1).await;
    let (leases, ledger) = (unique("leases"), unique("ledger"));
    create_lease_table(&config, &leases).await;
    create_table(&config, &ledger, "order_id").await;
    let kinesis = common::kinesis::KinesisLocal::start();
    let stream = common::kinesis::Stream::create(
        &common::moto::sdk_config(&kinesis.endpoint, 1).await,
        "orders",
    )
    .await;
    // Shard 0 split, empty: its children wait for it until the gate finds it exhausted.
    stream.split(PARENT).await;
    let function = Watched::start(
        Path::new(env!("CARGO_BIN_EXE_ledger")),
        "ledger",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-managed-instances.log"),
        &[
            ("LEASE_TABLE", &leases),
            ("LEDGER_TABLE", &ledger),
            ("AWS_ENDPOINT_URL_DYNAMODB", &moto.endpoint),
            ("AWS_ENDPOINT_URL_KINESIS", &kinesis.endpoint),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("AWS_LAMBDA_MAX_CONCURRENCY", "4"),
        ],
    );
    let dynamodb = aws_sdk_dynamodb::Client::new(&config);

    // A: shard 1, whose first record takes 5 s; B: the same batch delivered again meanwhile;
    // C: a batch of shard 2.
    let slow = orders(
        LEFT,
        1,
        &[
            json!({"order_id": "M-1", "amount_cents": 100, "pause_ms": 5_000}),
            json!({"order_id": "M-2", "amount_cents": 200}),
        ],
    );
    let other = orders(
        RIGHT,
        11,
        &(11..=13)
            .map(|i| json!({"order_id": format!("M-{i}"), "amount_cents": i}))
            .collect::<Vec<_>>(),
    );
    let url = function.url().to_owned();
    let first = {
        let (url, slow) = (url.clone(), slow.clone());
        std::thread::spawn(move || invoke(&url, &slow))
    };
    // Until the lease table shows shard 1 taken and its parent marked finished (the first
    // invocation's gate is done, and its handler pausing), nothing else is sent.
    let key = format!("orders:{LEFT}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let owner = loop {
        let table = rows(&dynamodb, &leases, "lease_key").await;
        let parent_finished = table.get(&format!("orders:{PARENT}")).is_some_and(|row| {
            row.get("checkpoint")
                .and_then(|c| c.as_s().ok())
                .is_some_and(|c| c == "SHARD_END")
        });
        if let Some(row) = table.get(&key)
            && row.contains_key("lease_owner")
            && parent_finished
        {
            break s(row, "lease_owner");
        }
        assert!(
            Instant::now() < deadline,
            "the first invocation never took {key}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(owner.starts_with("ledger:"), "owner {owner}");

    let again = {
        let (url, slow) = (url.clone(), slow.clone());
        tokio::task::spawn_blocking(move || invoke(&url, &slow))
            .await
            .unwrap()
    };
    assert_eq!(
        again,
        [sequence(1)],
        "the second delivery of shard 1 is turned away by the first's lease"
    );
    assert!(
        !first.is_finished(),
        "the first invocation was still in flight"
    );
    let beside = tokio::task::spawn_blocking(move || invoke(&url, &other))
        .await
        .unwrap();
    assert_eq!(beside, Vec::<String>::new(), "shard 2 ran beside shard 1");
    assert!(
        !first.is_finished(),
        "shard 2 answered while shard 1's invocation was still in flight"
    );
    assert_eq!(first.join().unwrap(), Vec::<String>::new());

    check_tables(&dynamodb, &leases, &ledger).await;
    check_metric_lines(&function);
}

/// The lease rows: each shard checkpointed by its own invocation and released; the parent
/// marked finished once, by the first child that checked it. The ledger: every order once, the
/// turned-away delivery applied nothing.
async fn check_tables(dynamodb: &aws_sdk_dynamodb::Client, leases: &str, ledger: &str) {
    let key = format!("orders:{LEFT}");
    // The lease rows: each shard checkpointed by its own invocation and released; the parent
    // marked finished once, by the first child that checked it.
    let lease_rows = rows(dynamodb, leases, "lease_key").await;
    let left = &lease_rows[&key];
    assert_eq!(s(left, "checkpoint"), sequence(2));
    assert!(!left.contains_key("lease_owner") && !left.contains_key("failing"));
    assert_eq!(left["parent_shards"].as_ss().unwrap(), &[PARENT.to_owned()]);
    let right = &lease_rows[&format!("orders:{RIGHT}")];
    assert_eq!(s(right, "checkpoint"), sequence(13));
    assert!(!right.contains_key("lease_owner"));
    assert_eq!(
        right["parent_shards"].as_ss().unwrap(),
        &[PARENT.to_owned()]
    );
    let parent = &lease_rows[&format!("orders:{PARENT}")];
    assert_eq!(s(parent, "checkpoint"), "SHARD_END");
    assert!(parent.contains_key("expires_at") && !parent.contains_key("lease_owner"));
    for row in [left, right] {
        assert!(!row.contains_key("lease_expiry") && !row.contains_key("expires_at"));
        assert!(
            n(row, "lease_counter") >= 2,
            "claimed and checkpointed: {row:?}"
        );
    }
    assert_eq!(
        n(parent, "lease_counter"),
        1,
        "one write marked it finished"
    );
    assert_eq!(lease_rows.len(), 3);

    // The ledger: every order once, the turned-away delivery applied nothing.
    let book = rows(dynamodb, ledger, "order_id").await;
    let mut applied: Vec<(String, i64, i64)> = book
        .values()
        .map(|row| (s(row, "order_id"), n(row, "total_cents"), n(row, "applied")))
        .collect();
    applied.sort();
    assert_eq!(
        applied,
        [
            ("M-1".to_owned(), 100, 1),
            ("M-11".to_owned(), 11, 1),
            ("M-12".to_owned(), 12, 1),
            ("M-13".to_owned(), 13, 1),
            ("M-2".to_owned(), 200, 1),
        ]
    );
}

fn check_metric_lines(function: &Watched) {
    // One metric line per invocation, each with its own counts and its own requests, none of
    // the others': the turned-away delivery 1 (its claim); shard 2 3 (claim, the look for a
    // legacy row a shard without checkpoint gets, checkpoint: the gate knew the parent finished,
    // from its cache, or it would have read the parent's row); shard 1 6 (claim, legacy look,
    // the parent's row and its legacy look, marking it SHARD_END, checkpoint).
    let mut lines = metric_lines(function);
    lines.sort_by_key(|line| line["DynamoDBRequests"].as_u64());
    let summary: Vec<(u64, u64, u64, u64, u64, usize)> = lines
        .iter()
        .map(|line| {
            (
                line["RecordsIn"].as_u64().unwrap(),
                line["Processed"].as_u64().unwrap(),
                line["Reported"].as_u64().unwrap(),
                line["Duplicates"].as_u64().unwrap(),
                line["DynamoDBRequests"].as_u64().unwrap(),
                line["CheckpointLatency"].as_array().map_or(0, Vec::len),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [(2, 0, 1, 0, 1, 0), (3, 3, 0, 0, 3, 1), (2, 2, 0, 0, 6, 1)],
        "(records in, processed, reported, duplicates, requests, checkpoint latencies): {lines:#?}"
    );
    for line in &lines {
        assert_eq!(line["Stream"], "orders");
        assert_eq!(line["Function"], "ledger");
    }
}
