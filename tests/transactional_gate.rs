//! The parent gate with a transactional handler, on a memory stream that splits: a child's
//! batch delivered before its parent is done is held, runs no handler and commits nothing (no
//! write of its records, no transaction, no checkpoint); delivered again after the parent's
//! records committed, it runs and commits its writes once, and the parent is marked finished.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_dynamodb::types::{AttributeValue, Update};
use base64::Engine as _;
use common::{context, n_of, reported};
use kinesis_checkpoint::effects::{ItemId, Write, Writes};
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::processor::Effect;
use kinesis_checkpoint::report::{Disposition, Held, StopReason};
use kinesis_checkpoint::store::CheckpointStore;
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Processor, Record};
use kinesis_checkpoint_testing::local::MemoryStream;

const STREAM: &str = "orders";
const TABLE: &str = "orders";

/// The records of `shard` as one Lambda batch.
fn event_of(stream: &MemoryStream, shard: &str) -> KinesisEvent {
    let records: Vec<serde_json::Value> = stream
        .records(shard)
        .iter()
        .map(|record| {
            serde_json::json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": record.partition_key,
                    "sequenceNumber": record.sequence,
                    "data": base64::engine::general_purpose::STANDARD.encode(&record.data),
                    "approximateArrivalTimestamp": 1_764_512_345.0,
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("{shard}:{}", record.sequence),
                "eventName": "aws:kinesis:record",
                "awsRegion": "us-east-1",
                "eventSourceARN": format!("arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}"),
            })
        })
        .collect();
    common::event(&records)
}

fn item(n: u64) -> ItemId {
    let key = std::collections::HashMap::from([(
        "id".to_owned(),
        AttributeValue::S(format!("order-{n}")),
    )]);
    ItemId::new(TABLE, &key)
}

/// A stream of one shard with six records that splits, and 34 more records after: the parent,
/// the child with records, and the child's record numbers.
fn split_stream() -> (MemoryStream, String, String, Vec<u64>) {
    let stream = MemoryStream::new(STREAM, 1);
    let parent = stream.shard_ids()[0].clone();
    for n in 0..6 {
        stream.put(
            &format!("customer-{n}"),
            serde_json::json!({ "n": n }).to_string(),
        );
    }
    let (left, right) = stream.split(&parent);
    for n in 6..40 {
        stream.put(
            &format!("customer-{n}"),
            serde_json::json!({ "n": n }).to_string(),
        );
    }
    // The child with records (the other may have none).
    let child = [left, right]
        .into_iter()
        .max_by_key(|shard| stream.records(shard).len())
        .unwrap();
    let child_records: Vec<u64> = stream
        .records(&child)
        .iter()
        .map(|record| {
            serde_json::from_slice::<serde_json::Value>(&record.data).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(!child_records.is_empty());
    (stream, parent, child, child_records)
}

/// Record `n` adds one to order `n`'s `applied`; `handled` counts the handler's runs.
fn count_orders(
    handled: Arc<AtomicU64>,
) -> impl Fn(Record) -> std::future::Ready<Effect> + Send + Sync + 'static {
    move |record: Record| {
        handled.fetch_add(1, Ordering::SeqCst);
        let update = Update::builder()
            .table_name(TABLE)
            .key("id", AttributeValue::S(format!("order-{}", n_of(&record))))
            .update_expression("ADD applied :one")
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .build()
            .unwrap();
        std::future::ready(Effect::Commit(Writes::from(Write::update(update))))
    }
}

#[tokio::test]
async fn a_held_child_batch_commits_nothing_and_runs_once_its_parent_has_committed() {
    let (stream, parent, child, child_records) = split_stream();
    let memory = Arc::new(MemoryLeaseStore::new());
    let handled = Arc::new(AtomicU64::new(0));
    let processor = Processor::transactional(memory.clone(), count_orders(handled.clone())).gate(
        Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon),
    );
    let child_key = LeaseKey::new(STREAM, child.as_str());
    let parent_key = LeaseKey::new(STREAM, parent.as_str());

    // The child first: held, nothing run, nothing committed.
    let child_event = event_of(&stream, &child);
    let first_child = child_event.records[0].kinesis.sequence_number.clone();
    let report = processor
        .process_batch(child_event.clone(), &context("child-early", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    let (stopped, reason) = shard.stopped.clone().expect("held");
    assert_eq!(stopped.to_string(), first_child);
    assert_eq!(
        reason,
        StopReason::Held(Held::NeverRead {
            parent: parent.clone()
        })
    );
    assert_eq!(shard.count(Disposition::Reported), 1);
    assert_eq!(
        shard.count(Disposition::NotAttempted),
        child_records.len() - 1
    );
    assert_eq!(shard.checkpoint, None);
    assert_eq!(reported(&report.response()), vec![first_child.clone()]);
    assert_eq!(handled.load(Ordering::SeqCst), 0, "no handler ran");
    assert!(memory.items(TABLE).is_empty(), "no write landed");
    assert_eq!(memory.transactions(), 0);
    let row = CheckpointStore::read(memory.as_ref(), &child_key)
        .await
        .unwrap();
    assert_eq!(row.checkpoint, None);
    assert_eq!(row.lease_owner, None, "released");
    assert_eq!(row.parent_shards, vec![parent.clone()]);

    // The parent: its six records commit in one transaction.
    let response = processor
        .process(event_of(&stream, &parent), &context("parent", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(handled.load(Ordering::SeqCst), 6);
    assert_eq!(memory.transactions(), 1);
    let parent_last = stream.records(&parent).last().unwrap().sequence.clone();
    let row = CheckpointStore::read(memory.as_ref(), &parent_key)
        .await
        .unwrap();
    assert_eq!(row.checkpoint, Some(parent_last));

    // The child again: it runs after its parent, each of its records' writes once.
    let report = processor
        .process_batch(child_event, &context("child-again", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    assert_eq!(shard.stopped, None);
    assert_eq!(shard.count(Disposition::Processed), child_records.len());
    assert!(reported(&report.response()).is_empty());
    assert_eq!(
        handled.load(Ordering::SeqCst),
        6 + child_records.len() as u64
    );
    assert_eq!(memory.transactions(), 2);
    for n in (0..6).chain(child_records.iter().copied()) {
        assert_eq!(memory.writes_of(&item(n)), 1, "order {n} once");
    }
    let child_last = stream.records(&child).last().unwrap().sequence.clone();
    let row = CheckpointStore::read(memory.as_ref(), &child_key)
        .await
        .unwrap();
    assert_eq!(row.checkpoint, Some(child_last));
    assert_eq!(row.lease_owner, None);
    let row = CheckpointStore::read(memory.as_ref(), &parent_key)
        .await
        .unwrap();
    assert_eq!(
        row.checkpoint.as_deref(),
        Some("SHARD_END"),
        "the gate marked it finished"
    );
}
