//! Exactly-once effects in the partition-key mode: a transactional handler's writes committed
//! with the advance of their keys' rows, on the memory store's tables and over moto's
//! `DynamoDB` through the real SDK.

mod common;
#[path = "common/kpl.rs"]
mod kpl_encoder;

use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, create_table, unique};
use common::writes::{count_up, id_key, orders, put_once};
use common::{context, event, lambda_record, n_of, reported, sequence};
use kinesis_checkpoint::effects::{ItemId, OnConditionFailed, Writes};
use kinesis_checkpoint::internal::{
    Call, KeyCommit, Layer, Layered, Next, Operation, RowsTransacted, RowsTransaction, row_key,
};
use kinesis_checkpoint::processor::Effect;
use kinesis_checkpoint::report::{Disposition, StopReason};
use kinesis_checkpoint::store::{CheckpointStore, LeaseError};
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, MemoryLeaseStore, Processor, Record};
use kinesis_checkpoint_testing::MemoryDeadLetters;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

fn shard() -> LeaseKey {
    LeaseKey::new(STREAM, SHARD)
}

/// Records `range`, record `n` under partition key `key-{n % keys}`, payload `{"n": n}`.
fn keyed(
    range: std::ops::Range<u64>,
    keys: u64,
) -> aws_lambda_events::event::kinesis::KinesisEvent {
    let records: Vec<serde_json::Value> = range
        .map(|n| {
            lambda_record(
                STREAM,
                SHARD,
                n,
                &format!("key-{}", n % keys),
                &serde_json::json!({ "n": n }),
            )
        })
        .collect();
    event(&records)
}

/// The checkpoint of partition key `key-{key}`'s row.
async fn key_checkpoint(store: &dyn CheckpointStore, key: u64) -> Option<String> {
    store
        .read(&row_key(&shard(), &format!("key-{key}")))
        .await
        .unwrap()
        .checkpoint
}

fn writes_of(store: &MemoryLeaseStore, table: &str, id: &str) -> u64 {
    store.writes_of(&ItemId::new(table, &id_key(id)))
}

#[tokio::test]
async fn in_the_key_mode_a_batch_s_writes_and_its_keys_rows_land_together_in_one_transaction() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::transactional_by_partition_key(
        store.clone(),
        orders("orders", |n| n, OnConditionFailed::Retry),
    );
    let response = processor
        .process(keyed(0..20, 7), &context("a", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(store.items("orders").len(), 20);
    assert_eq!(
        store.transactions(),
        1,
        "20 writes and 7 rows: one transaction"
    );
    for key in 0..7 {
        let last = (0..20).rev().find(|n| n % 7 == key).unwrap();
        assert_eq!(
            key_checkpoint(store.as_ref(), key).await,
            Some(sequence(last)),
            "key-{key} at its last record"
        );
    }

    // Delivered again: every record is a duplicate of its key, nothing is written twice.
    let again = processor
        .process_batch(keyed(0..20, 7), &context("b", 60_000))
        .await
        .unwrap();
    assert_eq!(again.shards[0].count(Disposition::Duplicate), 20);
    assert_eq!(store.transactions(), 1);
    for n in 0..20 {
        assert_eq!(writes_of(&store, "orders", &format!("order-{n}")), 1);
    }
}

#[tokio::test]
async fn in_the_key_mode_a_refused_condition_stops_its_key_only_and_names_table_key_and_condition()
{
    let store = Arc::new(MemoryLeaseStore::new());
    // Record 10 (key-3) puts order 3 again: refused by `attribute_not_exists(id)`.
    let processor = Processor::transactional_by_partition_key(
        store.clone(),
        orders(
            "orders",
            |n| if n == 10 { 3 } else { n },
            OnConditionFailed::Retry,
        ),
    );
    let report = processor
        .process_batch(keyed(0..20, 7), &context("a", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    let (stopped_at, reason) = shard.stopped.clone().expect("record 10 is reported");
    assert_eq!(stopped_at.to_string(), sequence(10));
    let StopReason::Retry(message) = reason else {
        panic!("a retry, as the record's writes say: {reason:?}");
    };
    assert!(message.contains("orders {id = \"order-3\"}"), "{message}");
    assert!(message.contains("attribute_not_exists(id)"), "{message}");
    // Key 3 stops at record 10: its row stays at record 3, record 17's write is not committed.
    assert_eq!(key_checkpoint(store.as_ref(), 3).await, Some(sequence(3)));
    assert_eq!(writes_of(&store, "orders", "order-17"), 0);
    assert_eq!(
        shard.records.disposition(17).unwrap(),
        Disposition::Uncheckpointed
    );
    let failing = store
        .read(&row_key(&LeaseKey::new(STREAM, SHARD), "key-3"))
        .await
        .unwrap()
        .failing
        .expect("key-3 remembers its failing record");
    assert_eq!(failing.attempts, 1);
    // The other keys go on: key 4's records 11 and 18 are committed.
    assert_eq!(writes_of(&store, "orders", "order-11"), 1);
    assert_eq!(writes_of(&store, "orders", "order-18"), 1);
    assert_eq!(key_checkpoint(store.as_ref(), 4).await, Some(sequence(18)));
}

#[tokio::test]
async fn in_the_key_mode_a_rejected_record_is_dead_lettered_and_its_key_goes_on() {
    let store = Arc::new(MemoryLeaseStore::new());
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::transactional_by_partition_key(
        store.clone(),
        orders(
            "orders",
            |n| if n == 10 { 3 } else { n },
            OnConditionFailed::Reject,
        ),
    )
    .dead_letters(letters.clone());
    let report = processor
        .process_batch(keyed(0..20, 7), &context("a", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    assert!(shard.stopped.is_none(), "{:?}", shard.stopped);
    assert_eq!(
        shard.records.disposition(10).unwrap(),
        Disposition::DeadLettered
    );
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].error.contains("order-3"), "{}", letters[0].error);
    assert_eq!(
        writes_of(&store, "orders", "order-3"),
        1,
        "record 10 wrote nothing"
    );
    assert_eq!(writes_of(&store, "orders", "order-17"), 1);
    assert_eq!(key_checkpoint(store.as_ref(), 3).await, Some(sequence(17)));
}

#[tokio::test]
async fn in_the_key_mode_a_hundred_records_over_ten_keys_take_two_transactions() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::transactional_by_partition_key(
        store.clone(),
        orders("orders", |n| n, OnConditionFailed::Retry),
    );
    let response = processor
        .process(keyed(0..100, 10), &context("a", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(
        store.transactions(),
        2,
        "90 writes beside 10 rows, then 10 beside 10"
    );
    assert_eq!(store.items("orders").len(), 100);
    for key in 0..10 {
        assert_eq!(
            key_checkpoint(store.as_ref(), key).await,
            Some(sequence(90 + key))
        );
    }
}

#[tokio::test]
async fn in_the_key_mode_records_counting_one_item_commit_one_transaction_each_in_order() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::transactional_by_partition_key(store.clone(), |record: Record| {
        let n = n_of(&record);
        let writes = Writes::new()
            .with(put_once("orders", &format!("order-{n}"), n))
            .with(count_up("totals", "all"));
        std::future::ready(Effect::Commit(writes))
    });
    let response = processor
        .process(keyed(0..6, 3), &context("a", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(
        store.transactions(),
        6,
        "no two actions on one item in a transaction"
    );
    let total = store.item("totals", &id_key("all")).unwrap();
    assert_eq!(total["count"], AttributeValue::N("6".to_owned()));
    for key in 0..3 {
        assert_eq!(
            key_checkpoint(store.as_ref(), key).await,
            Some(sequence(3 + key))
        );
    }
}

#[tokio::test]
async fn in_the_key_mode_a_row_written_meanwhile_fences_its_key_and_nothing_of_it_lands() {
    let store = Arc::new(MemoryLeaseStore::new());
    let concurrent = Arc::clone(&store);
    // While record 3 (key-3) runs, another delivery of key-3 writes its row.
    let processor =
        Processor::transactional_by_partition_key(store.clone(), move |record: Record| {
            let n = n_of(&record);
            let concurrent = Arc::clone(&concurrent);
            async move {
                if n == 3 {
                    let row = row_key(&LeaseKey::new(STREAM, SHARD), "key-3");
                    let written = concurrent
                        .commit_rows(&[KeyCommit::new(row, 0)])
                        .await
                        .unwrap();
                    assert_eq!(written, [true]);
                }
                Effect::Commit(Writes::from(put_once("orders", &format!("order-{n}"), n)))
            }
        });
    let report = processor
        .process_batch(keyed(0..14, 7), &context("a", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    let (stopped_at, reason) = shard.stopped.clone().expect("key-3 is reported");
    assert_eq!(stopped_at.to_string(), sequence(3));
    assert_eq!(reason, StopReason::CheckpointFenced);
    assert_eq!(writes_of(&store, "orders", "order-3"), 0);
    assert_eq!(writes_of(&store, "orders", "order-10"), 0);
    for n in (0..14).filter(|n| n % 7 != 3) {
        assert_eq!(
            writes_of(&store, "orders", &format!("order-{n}")),
            1,
            "record {n}"
        );
    }
    assert_eq!(key_checkpoint(store.as_ref(), 3).await, None);
}

#[tokio::test]
async fn a_rows_transaction_sent_again_with_its_token_applies_once_in_the_memory_store() {
    let store = MemoryLeaseStore::new();
    let mut row = KeyCommit::new(row_key(&shard(), "key-0"), 0);
    row.checkpoint = Some(kinesis_checkpoint::Position::record(
        sequence(0).parse().unwrap(),
    ));
    let transaction = RowsTransaction::new(
        vec![row],
        vec![count_up("totals", "all")],
        "kc-1".to_owned(),
    );
    for _ in 0..2 {
        assert_eq!(
            store.transact_rows(&transaction).await.unwrap(),
            RowsTransacted::Committed
        );
    }
    let total = store.item("totals", &id_key("all")).unwrap();
    assert_eq!(total["count"], AttributeValue::N("1".to_owned()));
    assert_eq!(store.transactions(), 1);
    // Another token with the counter read before: fenced, nothing lands.
    let mut stale = transaction.clone();
    "kc-2".clone_into(&mut stale.token);
    assert_eq!(
        store.transact_rows(&stale).await.unwrap(),
        RowsTransacted::Fenced(vec![0])
    );
    assert_eq!(store.transactions(), 1);
}

/// A `DynamoDB` lease store over moto with a lease table and an `orders` table; its name.
async fn moto_store(
    moto: &Moto,
) -> (
    Arc<DynamoLeaseStore>,
    &'static str,
    aws_sdk_dynamodb::Client,
) {
    let config = moto.sdk_config(1).await;
    let leases = unique("leases");
    create_lease_table(&config, &leases).await;
    let orders: &'static str = unique("orders").leak();
    create_table(&config, orders, "id").await;
    let store = Arc::new(DynamoLeaseStore::new(&config, &leases));
    (store, orders, aws_sdk_dynamodb::Client::new(&config))
}

async fn scan_ids(client: &aws_sdk_dynamodb::Client, table: &str) -> Vec<String> {
    let mut ids: Vec<String> = client
        .scan()
        .table_name(table)
        .send()
        .await
        .unwrap()
        .items()
        .iter()
        .map(|item| item["id"].as_s().unwrap().clone())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn over_moto_in_the_key_mode_writes_and_keys_rows_land_in_one_transact_write_items() {
    let moto = Moto::shared();
    let (store, table, client) = moto_store(moto).await;
    let processor = Processor::transactional_by_partition_key(
        store.clone(),
        orders(table, |n| n, OnConditionFailed::Retry),
    );
    let response = processor
        .process(keyed(0..6, 3), &context("a", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(scan_ids(&client, table).await.len(), 6);
    for key in 0..3 {
        assert_eq!(
            key_checkpoint(store.as_ref(), key).await,
            Some(sequence(3 + key))
        );
    }
    // Again: duplicates, nothing written twice (a second put would be refused and reported).
    let again = processor
        .process(keyed(0..6, 3), &context("b", 60_000))
        .await
        .unwrap();
    assert!(reported(&again).is_empty());
}

#[tokio::test]
async fn over_moto_in_the_key_mode_a_refused_condition_fails_its_key_naming_table_key_and_condition()
 {
    let moto = Moto::shared();
    let (store, table, client) = moto_store(moto).await;
    // Record 4 (key-1) puts order 1 again.
    let processor = Processor::transactional_by_partition_key(
        store.clone(),
        orders(
            table,
            |n| if n == 4 { 1 } else { n },
            OnConditionFailed::Retry,
        ),
    );
    let report = processor
        .process_batch(keyed(0..9, 3), &context("a", 60_000))
        .await
        .unwrap();
    let (stopped_at, reason) = report.shards[0].stopped.clone().expect("reported");
    assert_eq!(stopped_at.to_string(), sequence(4));
    let text = reason.to_string();
    assert!(text.contains(table) && text.contains("order-1"), "{text}");
    assert!(text.contains("attribute_not_exists(id)"), "{text}");
    assert_eq!(
        scan_ids(&client, table).await,
        [
            "order-0", "order-1", "order-2", "order-3", "order-5", "order-6", "order-8"
        ]
    );
    assert_eq!(key_checkpoint(store.as_ref(), 1).await, Some(sequence(1)));
    assert_eq!(key_checkpoint(store.as_ref(), 2).await, Some(sequence(8)));
}

#[tokio::test]
async fn over_moto_in_the_key_mode_every_transaction_carries_a_request_token_of_its_own() {
    let moto = Moto::start(true);
    let (store, table, _) = moto_store(&moto).await;
    let processor = Processor::transactional_by_partition_key(
        store.clone(),
        orders(table, |n| n, OnConditionFailed::Retry),
    );
    moto.start_recording();
    for (range, request) in [(0..100, "a"), (100..110, "b")] {
        processor
            .process(keyed(range, 10), &context(request, 60_000))
            .await
            .unwrap();
    }
    let tokens: Vec<String> = moto
        .stop_recording_bodies()
        .into_iter()
        .filter(|(target, _)| target == "DynamoDB_20120810.TransactWriteItems")
        .map(|(_, body)| {
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            body["ClientRequestToken"]
                .as_str()
                .expect("a token")
                .to_owned()
        })
        .collect();
    assert_eq!(tokens.len(), 3, "90 + 10, then 10");
    for token in &tokens {
        assert!((1..=36).contains(&token.len()), "{token}");
    }
    let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
    assert_eq!(distinct.len(), 3, "{tokens:?}");
}

/// A layer that applies the first partition-key transaction and loses its answer.
#[derive(Default)]
struct LoseFirstAnswer {
    seen: std::sync::atomic::AtomicUsize,
}

impl Layer for LoseFirstAnswer {
    fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> kinesis_checkpoint::BoxFuture<'a, Result<T, LeaseError>> {
        use std::sync::atomic::Ordering;
        let lose = call.operation() == Operation::TransactRows
            && self.seen.fetch_add(1, Ordering::SeqCst) == 0;
        Box::pin(async move {
            let answer = next.run(call).await;
            if lose {
                return Err("the answer was lost (injected)".into());
            }
            answer
        })
    }
}

#[tokio::test]
async fn in_the_key_mode_a_transaction_whose_answer_was_lost_is_sent_again_and_applies_once() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(Layered::new(
        Arc::clone(&memory) as Arc<dyn CheckpointStore>,
        LoseFirstAnswer::default(),
    ));
    let processor = Processor::transactional_by_partition_key(store.clone(), |record: Record| {
        std::future::ready(Effect::Commit(Writes::from(count_up(
            "totals",
            &format!("order-{}", n_of(&record)),
        ))))
    });
    let response = processor
        .process(keyed(0..10, 5), &context("a", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(
        store.layer().seen.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "sent again"
    );
    assert_eq!(memory.transactions(), 1, "the token applies it once");
    for n in 0..10 {
        assert_eq!(writes_of(&memory, "totals", &format!("order-{n}")), 1);
    }
    assert_eq!(key_checkpoint(memory.as_ref(), 4).await, Some(sequence(9)));
}

/// What one steady-state batch of 100 records over 10 keys, one write each, costs in requests:
/// the read of the keys' rows, then the transactions (90 writes beside the 10 rows, then 10).
#[tokio::test]
async fn in_the_key_mode_a_steady_state_batch_of_a_hundred_records_over_ten_keys_costs_three_requests()
 {
    let moto = Moto::start(true);
    let (store, table, _) = moto_store(&moto).await;
    let processor = Processor::transactional_by_partition_key(
        store.clone(),
        orders(table, |n| n, OnConditionFailed::Retry),
    );
    processor
        .process(keyed(0..10, 10), &context("warm", 60_000))
        .await
        .unwrap();
    moto.start_recording();
    let response = processor
        .process(keyed(10..110, 10), &context("steady", 60_000))
        .await
        .unwrap();
    let requests = moto.stop_recording();
    assert!(reported(&response).is_empty());
    let transactions = requests
        .iter()
        .filter(|target| *target == "DynamoDB_20120810.TransactWriteItems")
        .count();
    println!(
        "key mode, batch of 100 records over 10 keys, one write each: {} DynamoDB requests ({transactions} TransactWriteItems)",
        requests.len()
    );
    assert_eq!(
        requests[0], "DynamoDB_20120810.BatchGetItem",
        "the keys' rows"
    );
    assert_eq!(transactions, 2);
    assert_eq!(requests.len(), 3);
}

/// Record 0 plain, record 1 a KPL aggregate of 150 sub-records, record 2 plain, all under
/// `key-a` (the key Kinesis routed by, which the partition-key mode keys on); payloads
/// `{"n": n}`, the sub-records' from 1000.
fn with_an_aggregate() -> aws_lambda_events::event::kinesis::KinesisEvent {
    use base64::Engine as _;
    let datas: Vec<Vec<u8>> = (0..150)
        .map(|i| {
            serde_json::json!({ "n": 1000 + i })
                .to_string()
                .into_bytes()
        })
        .collect();
    let subs: Vec<(&str, &[u8])> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| {
            (
                if i % 2 == 0 { "sub-even" } else { "sub-odd" },
                d.as_slice(),
            )
        })
        .collect();
    let aggregate = kpl_encoder::aggregate(&subs);
    let mut records = Vec::new();
    for n in 0..3 {
        let mut record = lambda_record(STREAM, SHARD, n, "key-a", &serde_json::json!({ "n": n }));
        if n == 1 {
            record["kinesis"]["data"] = base64::engine::general_purpose::STANDARD
                .encode(&aggregate)
                .into();
        }
        records.push(record);
    }
    event(&records)
}

/// A layer that fails the partition-key transactions `fail` (counting from 0).
struct FailTransactions {
    fail: std::ops::Range<usize>,
    seen: std::sync::atomic::AtomicUsize,
}

impl Layer for FailTransactions {
    fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> kinesis_checkpoint::BoxFuture<'a, Result<T, LeaseError>> {
        use std::sync::atomic::Ordering;
        if call.operation() == Operation::TransactRows
            && self
                .fail
                .contains(&self.seen.fetch_add(1, Ordering::SeqCst))
        {
            return Box::pin(async { Err("throttled (injected)".into()) });
        }
        next.run(call)
    }
}

#[tokio::test]
async fn in_the_key_mode_kpl_sub_records_commit_in_chunks_that_end_inside_the_aggregate() {
    let memory = Arc::new(MemoryLeaseStore::new());
    // The second transaction fails, and its retry: the first one's row lies inside the aggregate.
    let store = Arc::new(Layered::new(
        Arc::clone(&memory) as Arc<dyn CheckpointStore>,
        FailTransactions {
            fail: 1..3,
            seen: std::sync::atomic::AtomicUsize::new(0),
        },
    ));
    let processor = Processor::transactional_by_partition_key(store, |record: Record| {
        let n = n_of(&record);
        std::future::ready(Effect::Commit(Writes::from(count_up(
            "items",
            &format!("item-{n}"),
        ))))
    });
    let first = processor
        .process_batch(with_an_aggregate(), &context("a", 60_000))
        .await
        .unwrap();
    let shard = &first.shards[0];
    let (stopped, reason) = shard
        .stopped
        .clone()
        .expect("the second transaction failed");
    assert_eq!(
        stopped.to_string(),
        sequence(1),
        "the aggregate is reported"
    );
    assert!(
        matches!(reason, StopReason::CheckpointFailed(_)),
        "{reason:?}"
    );
    assert_eq!(
        memory.items("items").len(),
        99,
        "record 0 and 98 sub-records beside the row"
    );
    let row = memory
        .read(&row_key(&LeaseKey::new(STREAM, SHARD), "key-a"))
        .await
        .unwrap();
    assert_eq!(
        (row.aggregate_sequence.clone(), row.aggregate_sub),
        (Some(sequence(1)), Some(97)),
        "the key's row inside the aggregate"
    );
    assert_eq!(
        shard.records.disposition(0).unwrap(),
        Disposition::Processed,
        "its row landed"
    );
    assert_eq!(
        shard.records.disposition(99).unwrap(),
        Disposition::Reported
    );

    // Delivered again from the aggregate: the sub-records done are skipped, the rest commit.
    let again = processor
        .process_batch(with_an_aggregate(), &context("b", 60_000))
        .await
        .unwrap();
    assert!(
        again.shards[0].stopped.is_none(),
        "{:?}",
        again.shards[0].stopped
    );
    assert_eq!(again.shards[0].count(Disposition::Duplicate), 99);
    let items = memory.items("items");
    assert_eq!(items.len(), 152);
    for item in &items {
        assert_eq!(item["count"], AttributeValue::N("1".to_owned()), "{item:?}");
    }
    assert_eq!(
        key_checkpoint(memory.as_ref(), 0).await,
        None,
        "no key-0 here"
    );
    let row = memory
        .read(&row_key(&LeaseKey::new(STREAM, SHARD), "key-a"))
        .await
        .unwrap();
    assert_eq!(row.checkpoint, Some(sequence(2)));
}

/// An event of the memory stream's records `range` of `shard`, as Lambda delivers them.
fn stream_delivery(
    stream: &kinesis_checkpoint_testing::local::MemoryStream,
    shard: &str,
    range: std::ops::Range<usize>,
) -> aws_lambda_events::event::kinesis::KinesisEvent {
    use base64::Engine;
    let records: Vec<serde_json::Value> = stream.records(shard)[range]
        .iter()
        .map(|r| {
            serde_json::json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": r.partition_key,
                    "sequenceNumber": r.sequence,
                    "data": base64::engine::general_purpose::STANDARD.encode(&r.data),
                    "approximateArrivalTimestamp": 1_764_512_345.0,
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("{shard}:{}", r.sequence),
                "eventName": "aws:kinesis:record",
                "awsRegion": "us-east-1",
                "eventSourceARN": format!("arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}"),
            })
        })
        .collect();
    event(&records)
}

/// A resharded stream under a transactional handler: a child delivered while its parent
/// retries a record waits; the mapping's redelivery of the parent commits each record's writes
/// with its key's row, so every record's writes land once (the parent's done records are not
/// run again, the failed one runs once more), the keys' rows end at their last records with
/// nothing failing, the parent is `SHARD_END`, and the child's own records run after.
#[tokio::test(start_paused = true)]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario, from the parent's batches to the child's, with every row checked"
)]
async fn in_the_key_mode_a_child_waits_for_its_parents_retry_and_each_records_writes_land_once() {
    use kinesis_checkpoint::Position;
    use kinesis_checkpoint::clock::Clock;
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    use kinesis_checkpoint_testing::TokioClock;
    use std::sync::Mutex;
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
    let stream =
        kinesis_checkpoint_testing::local::MemoryStream::new(STREAM, 1).clock(clock.clone());
    // Two keys; the parent holds 0 to 5, one child both keys' 6 to 9 (the keys share a child
    // when their hashes do; either way every child is delivered below).
    for n in 0..6_u64 {
        stream.put(
            &format!("key-{}", n % 2),
            serde_json::json!({ "n": n }).to_string(),
        );
    }
    stream.split(SHARD);
    for n in 6..10_u64 {
        stream.put(
            &format!("key-{}", n % 2),
            serde_json::json!({ "n": n }).to_string(),
        );
    }
    let store = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
    // Record 2 fails once: key-0's 2 and 4 wait, key-1's 3 and 5 are done.
    let failed = Arc::new(Mutex::new(false));
    let ran: Arc<Mutex<Vec<u64>>> = Arc::default();
    let handler = {
        let ran = ran.clone();
        move |record: Record| {
            let n = n_of(&record);
            let mut failed = failed.lock().unwrap();
            let effect = if n == 2 && !*failed {
                *failed = true;
                Effect::Retry("downstream unavailable".into())
            } else {
                ran.lock().unwrap().push(n);
                let counter = format!("count-{}", record.partition_key());
                Effect::Commit(
                    Writes::from(put_once("orders", &format!("order-{n}"), n))
                        .with(count_up("orders", &counter)),
                )
            };
            std::future::ready(effect)
        }
    };
    let gate =
        Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon).clock(clock.clone());
    let processor = Processor::transactional_by_partition_key(store.clone(), handler)
        .clock(clock.clone())
        .gate(gate);
    for (range, request) in [(0..2, "p1"), (2..6, "p2")] {
        processor
            .process_batch(
                stream_delivery(&stream, SHARD, range),
                &context(request, 60_000),
            )
            .await
            .unwrap();
    }
    assert_eq!(*ran.lock().unwrap(), [0, 1, 3, 5]);
    let parent = shard();
    let parent_rows = |key: &str| {
        let store = store.clone();
        let row = row_key(&parent, key);
        async move { store.read(&row).await.unwrap() }
    };
    assert!(parent_rows("key-0").await.failing.is_some(), "2 failed");

    // Each child comes while the parent retries record 2: it waits, and runs nothing.
    let mut children: Vec<String> = (0..2)
        .map(|key| stream.shard_of(&format!("key-{key}")))
        .collect();
    children.dedup();
    let deliver_children = |round: &'static str| {
        let (processor, stream, children) = (&processor, &stream, children.clone());
        async move {
            let mut held = 0;
            for (index, child) in children.iter().enumerate() {
                let count = stream.records(child).len();
                let report = processor
                    .process_batch(
                        stream_delivery(stream, child, 0..count),
                        &context(&format!("{round}{index}"), 60_000),
                    )
                    .await
                    .unwrap();
                held += usize::from(matches!(
                    report.shards[0].stopped,
                    Some((_, kinesis_checkpoint::report::StopReason::Held(_)))
                ));
            }
            held
        }
    };
    assert_eq!(deliver_children("early").await, children.len());
    assert_eq!(
        *ran.lock().unwrap(),
        [0, 1, 3, 5],
        "the held children ran nothing"
    );
    // The mapping delivers the parent again from record 2; then the children run.
    processor
        .process_batch(
            stream_delivery(&stream, SHARD, 2..6),
            &context("p3", 60_000),
        )
        .await
        .unwrap();
    assert_eq!(deliver_children("late").await, 0);
    let ran = ran.lock().unwrap().clone();
    assert_eq!(
        &ran[..6],
        [0, 1, 3, 5, 2, 4],
        "the parent's retry before any child record"
    );
    let mut sorted = ran.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>(), "every record once");
    for n in 0..10 {
        assert_eq!(
            writes_of(&store, "orders", &format!("order-{n}")),
            1,
            "order-{n}"
        );
    }
    assert_eq!(store.items("orders").len(), 12, "10 orders and 2 counters");
    for key in ["key-0", "key-1"] {
        let counter = store
            .items("orders")
            .into_iter()
            .find(|item| item.get("id") == Some(&AttributeValue::S(format!("count-{key}"))))
            .expect("a counter");
        assert_eq!(counter["count"], AttributeValue::N("5".to_owned()), "{key}");
    }
    let records = stream.records(SHARD);
    for (key, last) in [("key-0", 4), ("key-1", 5)] {
        let row = parent_rows(key).await;
        assert_eq!(
            row.checkpoint.as_deref(),
            Some(records[last].sequence.as_str()),
            "{key}"
        );
        assert_eq!(row.failing, None, "{key} is settled");
    }
    let row = store.read(&parent).await.unwrap();
    assert_eq!(row.position().unwrap(), Some(Position::ShardEnd));
    assert_eq!(row.lease_owner, None, "no lease is left on the parent");
    for child in &children {
        for record in stream.records(child) {
            let key = row_key(
                &LeaseKey::new(STREAM, child.as_str()),
                &record.partition_key,
            );
            let row = store.read(&key).await.unwrap();
            assert!(
                row.checkpoint.as_deref() >= Some(record.sequence.as_str()),
                "{child}: {key}"
            );
        }
    }
}
