//! Exactly-once effects: a transactional handler's writes committed with the checkpoint, on
//! the memory store's tables and over moto's `DynamoDB` through the real SDK.

mod common;
#[path = "common/kpl.rs"]
mod kpl_encoder;

use std::sync::Arc;

use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, create_table, unique};
use common::writes::{count_up, id_key, orders, put_once};
use common::{batch, context, n_of, reported, sequence};
use kinesis_checkpoint::effects::{ItemId, OnConditionFailed, Writes};
use kinesis_checkpoint::internal::{Commit, Transacted, Transaction};
use kinesis_checkpoint::processor::Effect;
use kinesis_checkpoint::report::{Disposition, StopReason};
use kinesis_checkpoint::store::CheckpointStore;
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, MemoryLeaseStore, Processor, Record};
use kinesis_checkpoint_testing::MemoryDeadLetters;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

fn key() -> LeaseKey {
    LeaseKey::new(STREAM, SHARD)
}

async fn checkpoint_of(store: &dyn CheckpointStore) -> Option<String> {
    store.read(&key()).await.unwrap().checkpoint
}

#[tokio::test]
async fn a_batch_s_writes_and_its_checkpoint_land_together_in_one_transaction() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::transactional(
        store.clone(),
        orders("orders", |n| n, OnConditionFailed::Retry),
    );
    let response = processor
        .process(batch(STREAM, SHARD, 0..5), &context("a", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(store.items("orders").len(), 5);
    assert_eq!(
        store.transactions(),
        1,
        "five small records: one transaction"
    );
    assert_eq!(checkpoint_of(store.as_ref()).await, Some(sequence(4)));
    assert_eq!(
        store.snapshot()[&key()].lease_owner,
        None,
        "released with it"
    );

    // Delivered again: nothing runs, nothing is written twice.
    let again = processor
        .process(batch(STREAM, SHARD, 0..5), &context("b", 60_000))
        .await
        .unwrap();
    assert!(reported(&again).is_empty());
    for n in 0..5 {
        let id = ItemId::new("orders", &id_key(&format!("order-{n}")));
        assert_eq!(store.writes_of(&id), 1);
    }
}

#[tokio::test]
async fn a_write_refused_by_its_condition_fails_its_record_and_the_checkpoint_stops_before_it() {
    let store = Arc::new(MemoryLeaseStore::new());
    // Record 3 puts order 1 again: refused by `attribute_not_exists(id)`.
    let processor = Processor::transactional(
        store.clone(),
        orders(
            "orders",
            |n| if n == 3 { 1 } else { n },
            OnConditionFailed::Retry,
        ),
    );
    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..5), &context("a", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    let (stopped_at, reason) = shard.stopped.clone().expect("record 3 is reported");
    assert_eq!(stopped_at.to_string(), sequence(3));
    let StopReason::Retry(message) = reason else {
        panic!("a retry, as the record's writes say: {reason:?}");
    };
    assert!(message.contains("orders {id = \"order-1\"}"), "{message}");
    assert!(message.contains("attribute_not_exists(id)"), "{message}");
    assert_eq!(
        shard
            .records
            .iter()
            .map(|r| r.disposition)
            .collect::<Vec<_>>(),
        [
            Disposition::Processed,
            Disposition::Processed,
            Disposition::Processed,
            Disposition::Reported,
            Disposition::Uncheckpointed,
        ]
    );
    assert_eq!(checkpoint_of(store.as_ref()).await, Some(sequence(2)));
    let mut ids: Vec<String> = store
        .items("orders")
        .iter()
        .map(|item| item["id"].as_s().unwrap().clone())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["order-0", "order-1", "order-2"],
        "record 4 is not committed"
    );
    let failing = store.snapshot()[&key()].failing.clone().expect("counted");
    assert_eq!(
        (failing.sequence.as_str(), failing.attempts),
        (sequence(3).as_str(), 1)
    );
}

#[tokio::test]
async fn a_rejected_record_is_dead_lettered_with_nothing_written_and_the_rest_commit() {
    let store = Arc::new(MemoryLeaseStore::new());
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::transactional(
        store.clone(),
        orders(
            "orders",
            |n| if n == 3 { 1 } else { n },
            OnConditionFailed::Reject,
        ),
    )
    .dead_letters(letters.clone());
    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..5), &context("a", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    assert!(shard.stopped.is_none());
    assert_eq!(
        shard.records.disposition(3).expect("a record at 3"),
        Disposition::DeadLettered
    );
    assert_eq!(
        shard.records.disposition(4).expect("a record at 4"),
        Disposition::Processed
    );
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].error.contains("order-1"), "{}", letters[0].error);
    assert_eq!(store.items("orders").len(), 4);
    let id = ItemId::new("orders", &id_key("order-1"));
    assert_eq!(
        store
            .items("orders")
            .iter()
            .filter(|i| i["id"] == AttributeValue::S("order-1".into()))
            .count(),
        1
    );
    assert_eq!(store.writes_of(&id), 1, "record 3 wrote nothing");
    assert_eq!(checkpoint_of(store.as_ref()).await, Some(sequence(4)));
}

#[tokio::test]
async fn two_hundred_fifty_records_of_one_write_each_take_three_transactions() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::transactional(
        store.clone(),
        orders("orders", |n| n, OnConditionFailed::Retry),
    );
    let response = processor
        .process(batch(STREAM, SHARD, 0..250), &context("a", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(
        store.transactions(),
        3,
        "99 + 99 + 52 beside the checkpoint's action"
    );
    assert_eq!(store.items("orders").len(), 250);
    assert_eq!(checkpoint_of(store.as_ref()).await, Some(sequence(249)));
}

#[tokio::test]
async fn records_updating_one_item_commit_in_as_many_transactions_in_order() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::transactional(store.clone(), |record: Record| {
        // Records 0..4 count up one counter; each also writes its own order.
        let n = n_of(&record);
        let writes = Writes::new()
            .with(put_once("orders", &format!("order-{n}"), n))
            .with(count_up("totals", "all"));
        std::future::ready(Effect::Commit(writes))
    });
    processor
        .process(batch(STREAM, SHARD, 0..4), &context("a", 60_000))
        .await
        .unwrap();
    assert_eq!(
        store.transactions(),
        4,
        "no two actions on one item in a transaction"
    );
    let total = store.item("totals", &id_key("all")).unwrap();
    assert_eq!(total["count"], AttributeValue::N("4".to_owned()));
    assert_eq!(checkpoint_of(store.as_ref()).await, Some(sequence(3)));
}

#[tokio::test]
async fn a_record_that_asks_for_more_than_a_transaction_holds_is_rejected_not_split() {
    let store = Arc::new(MemoryLeaseStore::new());
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::transactional(store.clone(), |record: Record| {
        let n = n_of(&record);
        let writes: Writes = if n == 1 {
            (0..100)
                .map(|i| put_once("orders", &format!("big-{i}"), n))
                .collect()
        } else {
            Writes::from(put_once("orders", &format!("order-{n}"), n))
        };
        std::future::ready(Effect::Commit(writes))
    })
    .dead_letters(letters.clone());
    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..3), &context("a", 60_000))
        .await
        .unwrap();
    assert_eq!(
        report.shards[0]
            .records
            .disposition(1)
            .expect("a record at 1"),
        Disposition::DeadLettered
    );
    assert!(letters.letters()[0].error.contains("100 actions"));
    assert_eq!(store.items("orders").len(), 2, "none of record 1's writes");
}

#[tokio::test]
async fn a_transaction_sent_again_with_its_token_applies_once_in_the_memory_store() {
    let store = MemoryLeaseStore::new();
    let owner = "me";
    let claim = store
        .acquire_and_read(&key(), owner, std::time::Duration::from_secs(30), None)
        .await
        .unwrap();
    assert!(matches!(
        claim,
        kinesis_checkpoint::internal::Claim::Acquired { .. }
    ));
    let commit = Commit {
        checkpoint: Some(kinesis_checkpoint::Position::record(
            sequence(1).parse().unwrap(),
        )),
        keep_lease: true,
        ..Commit::default()
    };
    let transaction = Transaction::new(commit, vec![count_up("totals", "all")], "kc-1".to_owned());
    for _ in 0..2 {
        assert_eq!(
            store.transact(&key(), owner, &transaction).await.unwrap(),
            Transacted::Committed
        );
    }
    let total = store.item("totals", &id_key("all")).unwrap();
    assert_eq!(total["count"], AttributeValue::N("1".to_owned()));
    assert_eq!(store.transactions(), 1);
}

/// A `DynamoDB` lease store over moto with a lease table and an `orders` and `totals` table of
/// their own; their names.
async fn moto_store(
    moto: &Moto,
) -> (
    Arc<DynamoLeaseStore>,
    &'static str,
    &'static str,
    aws_sdk_dynamodb::Client,
) {
    let config = moto.sdk_config(1).await;
    let leases = unique("leases");
    create_lease_table(&config, &leases).await;
    let orders: &'static str = unique("orders").leak();
    let totals: &'static str = unique("totals").leak();
    create_table(&config, orders, "id").await;
    create_table(&config, totals, "id").await;
    let store = Arc::new(DynamoLeaseStore::new(&config, &leases));
    (
        store,
        orders,
        totals,
        aws_sdk_dynamodb::Client::new(&config),
    )
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
async fn over_moto_a_batch_s_writes_and_checkpoint_land_in_one_transact_write_items() {
    let moto = Moto::shared();
    let (store, table, _, client) = moto_store(moto).await;
    let processor = Processor::transactional(
        store.clone(),
        orders(table, |n| n, OnConditionFailed::Retry),
    );
    let response = processor
        .process(batch(STREAM, SHARD, 0..3), &context("a", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(
        scan_ids(&client, table).await,
        ["order-0", "order-1", "order-2"]
    );
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(2)));
    assert_eq!(row.lease_owner, None);
}

#[tokio::test]
async fn over_moto_a_refused_condition_is_the_record_s_failure_naming_table_key_and_condition() {
    let moto = Moto::shared();
    let (store, table, _, client) = moto_store(moto).await;
    let processor = Processor::transactional(
        store.clone(),
        orders(
            table,
            |n| if n == 2 { 0 } else { n },
            OnConditionFailed::Retry,
        ),
    );
    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..4), &context("a", 60_000))
        .await
        .unwrap();
    let (stopped_at, reason) = report.shards[0].stopped.clone().expect("reported");
    assert_eq!(stopped_at.to_string(), sequence(2));
    let text = reason.to_string();
    assert!(text.contains(table) && text.contains("order-0"), "{text}");
    assert!(text.contains("attribute_not_exists(id)"), "{text}");
    assert_eq!(scan_ids(&client, table).await, ["order-0", "order-1"]);
    assert_eq!(
        store.read(&key()).await.unwrap().checkpoint,
        Some(sequence(1))
    );

    // The redelivery from record 2 fails it again (the order is there): its attempts count.
    let again = processor
        .process_batch(batch(STREAM, SHARD, 2..4), &context("b", 60_000))
        .await
        .unwrap();
    assert_eq!(
        again.shards[0].stopped.clone().unwrap().0.to_string(),
        sequence(2)
    );
    let failing = store.read(&key()).await.unwrap().failing.unwrap();
    assert_eq!(failing.attempts, 2);
}

#[tokio::test]
async fn over_moto_a_hundred_and_fifty_records_commit_in_two_transactions() {
    let moto = Moto::start(true);
    let (store, table, _, client) = moto_store(&moto).await;
    let processor = Processor::transactional(
        store.clone(),
        orders(table, |n| n, OnConditionFailed::Retry),
    );
    // Warm up: the row exists.
    processor
        .process(batch(STREAM, SHARD, 0..1), &context("warm", 60_000))
        .await
        .unwrap();
    moto.start_recording();
    let response = processor
        .process(batch(STREAM, SHARD, 1..151), &context("a", 60_000))
        .await
        .unwrap();
    let requests = moto.stop_recording();
    assert!(reported(&response).is_empty());
    assert_eq!(
        requests,
        [
            "DynamoDB_20120810.UpdateItem",
            "DynamoDB_20120810.TransactWriteItems",
            "DynamoDB_20120810.TransactWriteItems",
        ],
        "claim, then 99 + 51 records beside the checkpoint's action"
    );
    assert_eq!(scan_ids(&client, table).await.len(), 151);
    assert_eq!(
        store.read(&key()).await.unwrap().checkpoint,
        Some(sequence(150))
    );
}

#[tokio::test]
async fn over_moto_records_counting_one_item_commit_one_transaction_each() {
    let moto = Moto::shared();
    let (store, _, totals, client) = moto_store(moto).await;
    let processor = Processor::transactional(store.clone(), move |_: Record| {
        std::future::ready(Effect::Commit(Writes::from(count_up(totals, "all"))))
    });
    processor
        .process(batch(STREAM, SHARD, 0..3), &context("a", 60_000))
        .await
        .unwrap();
    let item = client
        .get_item()
        .table_name(totals)
        .set_key(Some(id_key("all")))
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    assert_eq!(item["count"], AttributeValue::N("3".to_owned()));
    assert_eq!(
        store.read(&key()).await.unwrap().checkpoint,
        Some(sequence(2))
    );
}

/// moto (5.2.5) ignores `ClientRequestToken`: a transaction sent twice with one token is
/// applied twice there (checked: the counter reads 2), where `DynamoDB` applies it once within
/// 10 minutes. So over moto this checks what the toolkit controls, that every transaction
/// carries a token and that two transactions never share one; applying once on a retry is
/// checked on the memory store, which honours tokens as `DynamoDB` documents.
#[tokio::test]
async fn over_moto_every_transaction_carries_a_request_token_of_its_own() {
    let moto = Moto::start(true);
    let (store, table, _, _) = moto_store(&moto).await;
    let processor = Processor::transactional(
        store.clone(),
        orders(table, |n| n, OnConditionFailed::Retry),
    );
    moto.start_recording();
    for (range, request) in [(0..150, "a"), (150..160, "b")] {
        processor
            .process(batch(STREAM, SHARD, range), &context(request, 60_000))
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
    assert_eq!(tokens.len(), 3, "99 + 51, then 10");
    for token in &tokens {
        assert!((1..=36).contains(&token.len()), "{token}");
    }
    let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
    assert_eq!(distinct.len(), 3, "{tokens:?}");
}

/// What one steady-state batch of `size` records, one write each, costs in requests: the
/// claim, then ⌈size / 99⌉ transactions (99 records' writes beside the checkpoint's action).
#[tokio::test]
async fn a_steady_state_batch_costs_the_claim_and_one_transaction_per_ninety_nine_records() {
    let moto = Moto::start(true);
    let (store, table, _, _) = moto_store(&moto).await;
    let processor = Processor::transactional(
        store.clone(),
        orders(table, |n| n, OnConditionFailed::Retry),
    );
    processor
        .process(batch(STREAM, SHARD, 0..1), &context("warm", 60_000))
        .await
        .unwrap();
    let mut next = 1;
    for size in [1, 99, 100, 1_000] {
        moto.start_recording();
        let response = processor
            .process(
                batch(STREAM, SHARD, next..next + size),
                &context("steady", 60_000),
            )
            .await
            .unwrap();
        let requests = moto.stop_recording();
        assert!(reported(&response).is_empty());
        next += size;
        let transactions = requests
            .iter()
            .filter(|target| *target == "DynamoDB_20120810.TransactWriteItems")
            .count();
        println!(
            "batch of {size:>4} records, one write each: {} DynamoDB requests ({transactions} TransactWriteItems)",
            requests.len()
        );
        assert_eq!(requests[0], "DynamoDB_20120810.UpdateItem", "the claim");
        assert_eq!(requests.len(), 1 + transactions);
        assert_eq!(u64::try_from(transactions).unwrap(), size.div_ceil(99));
    }
}

/// A layer that fails the `fail`-th transaction (counting from 0) with a store error.
struct FailTransaction {
    fail: usize,
    seen: std::sync::atomic::AtomicUsize,
}

impl kinesis_checkpoint::internal::Layer for FailTransaction {
    fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: kinesis_checkpoint::internal::Call<'a>,
        next: kinesis_checkpoint::internal::Next<'a, T>,
    ) -> kinesis_checkpoint::BoxFuture<'a, Result<T, kinesis_checkpoint::store::LeaseError>> {
        use std::sync::atomic::Ordering;
        if call.operation() == kinesis_checkpoint::internal::Operation::Transact
            && self.seen.fetch_add(1, Ordering::SeqCst) == self.fail
        {
            return Box::pin(async { Err("throttled (injected)".into()) });
        }
        next.run(call)
    }
}

/// Record 0 plain, record 1 a KPL aggregate of 150 sub-records, record 2 plain; payloads
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
    let subs: Vec<(&str, &[u8])> = datas.iter().map(|d| ("key-a", d.as_slice())).collect();
    let aggregate = kpl_encoder::aggregate(&subs);
    let mut records = Vec::new();
    for n in 0..3 {
        let mut record =
            common::lambda_record(STREAM, SHARD, n, "key-a", &serde_json::json!({ "n": n }));
        if n == 1 {
            record["kinesis"]["data"] = base64::engine::general_purpose::STANDARD
                .encode(&aggregate)
                .into();
        }
        records.push(record);
    }
    common::event(&records)
}

#[tokio::test]
async fn kpl_sub_records_commit_in_chunks_that_end_inside_the_aggregate_and_resume_there() {
    let memory = Arc::new(MemoryLeaseStore::new());
    // The second transaction fails: the first one's checkpoint lies inside the aggregate.
    let store = Arc::new(kinesis_checkpoint::internal::Layered::new(
        Arc::clone(&memory) as Arc<dyn CheckpointStore>,
        FailTransaction {
            fail: 1,
            seen: std::sync::atomic::AtomicUsize::new(0),
        },
    ));
    let processor = Processor::transactional(store, |record: Record| {
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
    let checkpoint = shard.checkpoint.clone().expect("the first chunk moved it");
    assert_eq!(
        checkpoint.to_string(),
        format!("{}/97", sequence(1)),
        "record 0 and 98 sub-records"
    );
    assert_eq!(memory.items("items").len(), 99);

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
    assert_eq!(checkpoint_of(memory.as_ref()).await, Some(sequence(2)));
}

#[tokio::test]
async fn under_per_key_concurrency_a_record_done_above_a_failure_with_writes_runs_again_not_lost() {
    let store = Arc::new(MemoryLeaseStore::new());
    // Record 2 (key-2) fails once; records of other keys above it are done meanwhile.
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let processor = Processor::transactional(store.clone(), move |record: Record| {
        let n = n_of(&record);
        let fail = n == 2 && !failed.swap(true, std::sync::atomic::Ordering::SeqCst);
        std::future::ready(if fail {
            Effect::Retry("busy".into())
        } else {
            Effect::Commit(Writes::from(count_up("items", &format!("item-{n}"))))
        })
    })
    .concurrency(8);
    let first = processor
        .process_batch(batch(STREAM, SHARD, 0..7), &context("a", 60_000))
        .await
        .unwrap();
    let shard = &first.shards[0];
    assert_eq!(shard.stopped.clone().unwrap().0.to_string(), sequence(2));
    assert_eq!(
        store.items("items").len(),
        2,
        "only records 0 and 1, below the failure"
    );
    assert!(
        store.snapshot()[&key()].done_above.is_empty(),
        "records with writes are not remembered"
    );
    for record in shard.records.iter().skip(3) {
        assert_eq!(record.disposition, Disposition::Uncheckpointed);
    }
    let again = processor
        .process_batch(
            common::redeliver_from(&batch(STREAM, SHARD, 0..7), &sequence(2)),
            &context("b", 60_000),
        )
        .await
        .unwrap();
    assert!(again.shards[0].stopped.is_none());
    let items = store.items("items");
    assert_eq!(items.len(), 7);
    for item in &items {
        assert_eq!(item["count"], AttributeValue::N("1".to_owned()), "{item:?}");
    }
}

#[tokio::test]
async fn a_transaction_refused_by_the_lease_writes_nothing_and_reports_the_batch() {
    use kinesis_checkpoint::store::LeaseStore;
    let store = Arc::new(MemoryLeaseStore::new());
    let thief = Arc::clone(&store);
    let processor = Processor::transactional(store.clone(), move |record: Record| {
        let n = n_of(&record);
        let thief = Arc::clone(&thief);
        async move {
            if n == 4 {
                // Another owner takes the lease before the commit.
                let key = key();
                let owner = thief.snapshot()[&key].lease_owner.clone().unwrap();
                thief.release(&key, &owner).await.unwrap();
                assert!(
                    thief
                        .acquire(&key, "thief", std::time::Duration::from_secs(30))
                        .await
                        .unwrap()
                );
            }
            Effect::Commit(Writes::from(count_up("items", &format!("item-{n}"))))
        }
    });
    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..5), &context("a", 60_000))
        .await
        .unwrap();
    let (stopped, reason) = report.shards[0].stopped.clone().unwrap();
    assert_eq!(stopped.to_string(), sequence(0));
    assert_eq!(reason, StopReason::CheckpointFenced);
    assert!(store.items("items").is_empty(), "nothing without the lease");
    assert_eq!(checkpoint_of(store.as_ref()).await, None);
}
