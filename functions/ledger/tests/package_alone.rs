//! The function that `make build` ships is the one tested: the `ledger` package built alone, in
//! its own folder, as `cargo lambda build` builds it, so that the library gets the features
//! the ledger's manifest names and nothing the tests of other packages turn on (the tests of
//! `lambda.rs` run a binary built with the whole workspace's features unified). A KPL aggregate
//! then goes through that binary, under `cargo lambda watch --only-lambda-apis` with moto
//! behind it: its sub-records must be applied one by one, not dead-lettered as a bad payload.
//!
//! The build shares the workspace's target directory, so only the library and the function are
//! compiled again (their features differ), not the AWS SDK. It host-builds with the `dev`
//! profile: the profile and the architecture do not change which features a package gets.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, create_queue, create_table, unique};
use common::watch::Watched;
use common::{event, lambda_record, root};
use serde_json::{Value, json};

const SHARD: &str = "shardId-000000000000";

/// The `ledger` executable built the way `make build` builds it, and the features the library
/// was compiled with for it.
fn build_alone() -> (PathBuf, Vec<String>) {
    let mut build = Command::new(env!("CARGO"))
        .args([
            "build",
            "--bin",
            "ledger",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root().join("functions/ledger"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("cargo runs");
    let (mut executable, mut features) = (None, None);
    for line in std::io::BufReader::new(build.stdout.take().unwrap()).lines() {
        let Ok(message) = serde_json::from_str::<Value>(&line.unwrap()) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        match message["target"]["name"].as_str() {
            Some("ledger") if message["executable"].is_string() => {
                executable = message["executable"].as_str().map(PathBuf::from);
            }
            Some("kinesis_checkpoint") => {
                features = serde_json::from_value(message["features"].clone()).ok();
            }
            _ => {}
        }
    }
    assert!(build.wait().unwrap().success(), "the ledger builds alone");
    (
        executable.expect("cargo names the ledger executable"),
        features.expect("cargo names the library's features"),
    )
}

fn s(item: &HashMap<String, AttributeValue>, name: &str) -> String {
    item[name].as_s().unwrap().clone()
}

fn n(item: &HashMap<String, AttributeValue>, name: &str) -> i64 {
    item[name].as_n().unwrap().parse().unwrap()
}

/// An aggregate of ten orders made by AWS's own aggregator (tests/fixtures/kpl), then a plain
/// order, on shard 0 of `stream`.
fn aggregate_batch(stream: &str) -> Value {
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/kpl/ten_sub_records.json")).unwrap(),
    )
    .unwrap();
    let mut aggregate = lambda_record(stream, SHARD, 1, "order-0", &json!({}));
    aggregate["kinesis"]["data"] = fixture["data_base64"].clone();
    let plain = lambda_record(
        stream,
        SHARD,
        2,
        "plain",
        &json!({"order_id": "plain-1", "amount_cents": 7}),
    );
    serde_json::to_value(event(&[aggregate, plain])).unwrap()
}

/// Every order of the ledger: its total and how many records were applied.
async fn ledger_totals(
    dynamodb: &aws_sdk_dynamodb::Client,
    ledger: &str,
) -> HashMap<String, (i64, i64)> {
    dynamodb
        .scan()
        .table_name(ledger)
        .send()
        .await
        .unwrap()
        .items()
        .iter()
        .filter(|item| !s(item, "order_id").starts_with("_attempts:"))
        .map(|item| {
            (
                s(item, "order_id"),
                (n(item, "total_cents"), n(item, "applied")),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_built_alone_applies_the_sub_records_of_a_kpl_aggregate() {
    let (binary, features) = tokio::task::spawn_blocking(build_alone).await.unwrap();
    // Not the tests' unified build: the demo's `local` feature is not in it.
    assert!(
        !features.iter().any(|feature| feature == "local"),
        "built with the ledger's own features, not the workspace's: {features:?}"
    );

    let moto = Moto::shared();
    let config = moto.sdk_config(3).await;
    let (leases, ledger, stream) = (unique("leases"), unique("ledger"), unique("orders"));
    create_lease_table(&config, &leases).await;
    create_table(&config, &ledger, "order_id").await;
    let queue = create_queue(&config).await;
    // The parent gate lists the stream's shards: one shard, no parents (moto's Kinesis).
    aws_sdk_kinesis::Client::new(&config)
        .create_stream()
        .stream_name(&stream)
        .shard_count(1)
        .send()
        .await
        .unwrap();

    let batch = aggregate_batch(&stream);

    let endpoint = moto.endpoint.clone();
    let local = tokio::task::spawn_blocking(move || {
        let env = [
            ("LEASE_TABLE", leases.as_str()),
            ("LEDGER_TABLE", ledger.as_str()),
            ("DEAD_LETTER_QUEUE_URL", queue.as_str()),
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            ("STARTING_POSITION", "TRIM_HORIZON"),
        ];
        let local = Watched::start(&binary, "_", root().join("target/ledger-alone.log"), &env);
        // Delivered twice, as after a time-out: the second time changes nothing.
        let answers = [local.invoke(&batch), local.invoke(&batch)];
        drop(local);
        (answers, leases, ledger, queue)
    });
    let (answers, leases, ledger, queue) = local.await.unwrap();
    for answer in &answers {
        assert_eq!(answer["batchItemFailures"], json!([]), "{answer}");
    }

    let dynamodb = aws_sdk_dynamodb::Client::new(&config);
    let orders = ledger_totals(&dynamodb, &ledger).await;
    let mut want: HashMap<String, (i64, i64)> = (0..10)
        .map(|order| (order.to_string(), (50 + 100 * order, 1)))
        .collect();
    want.insert("plain-1".to_owned(), (7, 1));
    assert_eq!(orders, want, "every sub-record applied once, as an order");

    let dead = aws_sdk_sqs::Client::new(&config)
        .receive_message()
        .queue_url(&queue)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap();
    assert!(
        dead.messages().is_empty(),
        "nothing dead-lettered: {dead:?}"
    );

    let row = dynamodb
        .get_item()
        .table_name(&leases)
        .key("lease_key", AttributeValue::S(format!("{stream}:{SHARD}")))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("the shard's row");
    assert_eq!(s(&row, "checkpoint"), common::sequence(2));
    assert!(!row.contains_key("checkpoint_sub"), "done whole: {row:?}");
    assert!(!row.contains_key("failing"), "{row:?}");
    assert!(!row.contains_key("lease_owner"), "released: {row:?}");
}
