//! End to end, `LEDGER_MODE=transactional`: the `ledger` binary under `cargo lambda watch
//! --only-lambda-apis`, moto and kinesis-local behind it, invoked with the sample events as a
//! mapping delivers them. Each order's update is committed with the checkpoint in one
//! `TransactWriteItems`: every order applied once, the poison one never, the checkpoint where
//! the plain mode leaves it.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::Path;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, create_table, unique};
use common::watch::Watched;
use common::{redeliver_from, root};
use serde_json::Value;

fn sample(name: &str) -> KinesisEvent {
    let path = root().join("events").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn failures(answer: &Value) -> Vec<String> {
    answer["batchItemFailures"]
        .as_array()
        .expect("a partial batch response")
        .iter()
        .map(|f| {
            f["itemIdentifier"]
                .as_str()
                .expect("an identifier")
                .to_owned()
        })
        .collect()
}

fn s(item: &HashMap<String, AttributeValue>, name: &str) -> String {
    item[name].as_s().unwrap().clone()
}

fn n(item: &HashMap<String, AttributeValue>, name: &str) -> i64 {
    item[name].as_n().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_transactional_ledger_applies_every_order_once_with_its_checkpoint() {
    run("shard").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_transactional_ledger_applies_every_order_once_with_its_keys_rows() {
    run("partition-key").await;
}

/// One end-to-end run in `CHECKPOINT_MODE` `checkpoint_mode`.
#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end run, its steps in order"
)]
async fn run(checkpoint_mode: &str) {
    let moto = Moto::shared();
    let config = moto.sdk_config(3).await;
    let (leases, ledger) = (unique("leases"), unique("ledger"));
    create_lease_table(&config, &leases).await;
    create_table(&config, &ledger, "order_id").await;
    let queue = common::moto::create_queue(&config).await;
    let kinesis = common::kinesis::KinesisLocal::start();
    let kinesis_config = common::moto::sdk_config(&kinesis.endpoint, 1).await;
    common::kinesis::Stream::with_shards(&kinesis_config, "orders", 2).await;
    let env: Vec<(String, String)> = [
        ("LEASE_TABLE", leases.as_str()),
        ("LEDGER_TABLE", ledger.as_str()),
        ("DEAD_LETTER_QUEUE_URL", queue.as_str()),
        ("LEDGER_MODE", "transactional"),
        ("CHECKPOINT_MODE", checkpoint_mode),
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
    let log = format!("e2e-ledger-transactional-{checkpoint_mode}.log");
    let local = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Watched::start(
            Path::new(env!("CARGO_BIN_EXE_ledger")),
            "_",
            root().join("target").join(log),
            &env,
        )
    })
    .await
    .unwrap();
    let invoke = |event: KinesisEvent| local.invoke(&event);

    let batch = sample("batch.json");
    assert_eq!(failures(&invoke(batch.clone())), Vec::<String>::new());
    assert_eq!(
        failures(&invoke(sample("redelivered.json"))),
        Vec::<String>::new()
    );
    let transient = sample("transient.json");
    let failed = failures(&invoke(transient.clone()));
    assert_eq!(
        failed,
        vec![transient.records[2].kinesis.sequence_number.clone()]
    );
    assert_eq!(
        failures(&invoke(redeliver_from(&transient, &failed[0]))),
        Vec::<String>::new()
    );
    let poison = sample("poison.json");
    assert_eq!(failures(&invoke(poison.clone())), Vec::<String>::new());

    // What the ledger must hold: every order but the poison one, applied once.
    let mut want: HashMap<String, (i64, i64)> = HashMap::new();
    for record in [&batch, &transient, &poison]
        .into_iter()
        .flat_map(|e| &e.records)
    {
        let order: Value = serde_json::from_slice(&record.kinesis.data.0).unwrap();
        if order["fail"] == "poison" {
            continue;
        }
        let entry = want
            .entry(order["order_id"].as_str().unwrap().to_owned())
            .or_default();
        entry.0 += order["amount_cents"].as_i64().unwrap();
        entry.1 += 1;
    }
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
        .filter(|item| !s(item, "order_id").starts_with("_attempts:"))
        .map(|item| {
            (
                s(item, "order_id"),
                (n(item, "total_cents"), n(item, "applied")),
            )
        })
        .collect();
    assert_eq!(
        got, want,
        "every order applied exactly once, the poison one never"
    );
    // The last record's checkpoint: the shard's row, or in the partition-key mode its key's.
    let last = &poison.records[3].kinesis;
    let row_key = if checkpoint_mode == "shard" {
        "orders:shardId-000000000000".to_owned()
    } else {
        let key = last.partition_key.clone();
        format!("orders:shardId-000000000000:{key}")
    };
    let row = client
        .get_item()
        .table_name(&leases)
        .key("lease_key", AttributeValue::S(row_key))
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    assert_eq!(s(&row, "checkpoint"), last.sequence_number);
    assert!(!row.contains_key("lease_owner"), "released");
    let log = std::fs::read_to_string(local.log()).unwrap_or_default();
    drop(local);
    assert!(
        log.contains("staged"),
        "the transactional handler ran: {log}"
    );
}
