//! What a cold processor asks of Kinesis before its first batch: nothing, for a shard whose row
//! records that it has no parents. Counted by moto's request recorder, on a server of this
//! file's own (so no other test's requests reach the recording), with the lease table and the
//! stream on it.
//!
//! The gate learns a shard's parents from the stream once (`ListShards`) and the next commit
//! writes them to the row; for an original shard, which has none, the row records exactly that
//! (`parentless`). A processor in a new process then reads the lineage from the row its claim
//! returns anyway, and its first batch costs the two `DynamoDB` requests of any batch.

mod common;

use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use common::kinesis::Stream;
use common::moto::{Moto, create_lease_table, unique};
use common::{batch, context, reported};
use kinesis_checkpoint::gate::{Gate, KinesisTopology, StartingPosition};
use kinesis_checkpoint::{DynamoLeaseStore, Handler, LeaseKey, Outcome, Processor, Record};

const SHARD: &str = "shardId-000000000000";

/// A processor as a new process builds it: its own clients, its own gate, nothing cached.
async fn cold_processor(moto: &Moto, table: &str) -> Processor<impl Handler> {
    let config = moto.sdk_config(1).await;
    Processor::new(
        Arc::new(DynamoLeaseStore::new(&config, table)),
        |_: Record| async { Outcome::ack() },
    )
    .gate(Gate::new(
        Arc::new(KinesisTopology::new(&config)),
        StartingPosition::TrimHorizon,
    ))
}

/// Runs records `range` of the shard through a cold processor, recording its requests.
async fn recorded_cold_batch(moto: &Moto, table: &str, range: std::ops::Range<u64>) -> Vec<String> {
    let processor = cold_processor(moto, table).await;
    moto.start_recording();
    let response = processor
        .process(
            batch("orders", SHARD, range.clone()),
            &context(&format!("cold-{}", range.start), 60_000),
        )
        .await
        .unwrap();
    let requests = moto.stop_recording();
    assert!(reported(&response).is_empty(), "{response:?}");
    requests
}

fn kinesis_calls(requests: &[String]) -> Vec<&String> {
    requests
        .iter()
        .filter(|target| target.starts_with("Kinesis_"))
        .collect()
}

async fn setup() -> (Moto, String, DynamoLeaseStore) {
    let moto = Moto::start(true);
    let config = moto.sdk_config(1).await;
    let table = unique("cold");
    create_lease_table(&config, &table).await;
    Stream::create(&config, "orders").await;
    let store = DynamoLeaseStore::new(&config, &table);
    (moto, table, store)
}

#[tokio::test]
async fn a_shard_whose_row_records_no_parents_costs_a_cold_processor_no_kinesis_call() {
    let (moto, table, store) = setup().await;
    let key = LeaseKey::new("orders", SHARD);

    // The shard's first batch ever: the gate asks the stream, once, and the commit records
    // the answer.
    let first = recorded_cold_batch(&moto, &table, 0..1).await;
    assert_eq!(
        kinesis_calls(&first),
        ["Kinesis_20131202.ListShards"],
        "{first:?}"
    );
    let row = store.read(&key).await.unwrap();
    assert!(row.parentless, "the row records no parents: {row:?}");
    assert_eq!(row.known_parents(), Some(&[][..]));

    // Each later cold start: the claim's answer says it all.
    for start in [1, 3] {
        let requests = recorded_cold_batch(&moto, &table, start..start + 2).await;
        assert!(kinesis_calls(&requests).is_empty(), "{requests:?}");
        assert_eq!(
            requests,
            [
                "DynamoDB_20120810.UpdateItem",
                "DynamoDB_20120810.UpdateItem"
            ],
            "the claim and the commit, nothing else"
        );
    }
    let row = store.read(&key).await.unwrap();
    assert_eq!(
        row.checkpoint.as_deref(),
        Some(common::sequence(4).as_str())
    );
    assert!(row.parentless, "kept by later commits");
}

#[tokio::test]
async fn a_row_that_does_not_record_its_parents_asks_the_stream_once_and_then_records_them() {
    let (moto, table, store) = setup().await;
    let key = LeaseKey::new("orders", SHARD);
    recorded_cold_batch(&moto, &table, 0..1).await;

    // A row of an earlier version (or one the seed crate rewrote): no word on the parents.
    let dynamodb = aws_sdk_dynamodb::Client::new(&moto.sdk_config(1).await);
    dynamodb
        .update_item()
        .table_name(&table)
        .key("lease_key", AttributeValue::S(key.to_string()))
        .update_expression("REMOVE parentless")
        .send()
        .await
        .unwrap();
    assert_eq!(store.read(&key).await.unwrap().known_parents(), None);

    let asked = recorded_cold_batch(&moto, &table, 1..2).await;
    assert_eq!(kinesis_calls(&asked), ["Kinesis_20131202.ListShards"]);
    assert!(store.read(&key).await.unwrap().parentless);
    let after = recorded_cold_batch(&moto, &table, 2..3).await;
    assert!(kinesis_calls(&after).is_empty(), "{after:?}");
}
