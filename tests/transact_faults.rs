//! A transactional processor under the store faults of `Faulty` on its transactions: refused
//! (throttled), the answer lost after the transaction landed (for good, or resent by the SDK
//! with its request token), and the lease stolen just before one. Each batch is 150 records of
//! one write each: two transactions, the first keeping the lease, the second releasing it.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aws_sdk_dynamodb::types::{AttributeValue, Update};
use common::faults::{Faults, Faulty, faulty};
use common::{batch, context, n_of, reported, sequence};
use kinesis_checkpoint::effects::{ItemId, Write, Writes};
use kinesis_checkpoint::processor::Effect;
use kinesis_checkpoint::report::{BatchReport, Disposition, StopReason};
use kinesis_checkpoint::store::{CheckpointStore, LeaseState};
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Processor, Record};

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";
const TABLE: &str = "orders";
/// Two transactions: 99 records and the lease row, then 51 and the lease row.
const RECORDS: u64 = COUNT as u64;
const COUNT: usize = 150;

fn key() -> LeaseKey {
    LeaseKey::new(STREAM, SHARD)
}

fn item(n: u64) -> ItemId {
    let key = HashMap::from([("id".to_owned(), AttributeValue::S(format!("order-{n}")))]);
    ItemId::new(TABLE, &key)
}

/// Record `n` adds one to its order's `applied`.
fn processor(
    store: Arc<dyn CheckpointStore>,
) -> Processor<
    kinesis_checkpoint::processor::Transactional<
        impl kinesis_checkpoint::processor::TransactionalHandler,
    >,
    kinesis_checkpoint::ShardMode,
> {
    Processor::transactional(store, |record: Record| {
        let n = n_of(&record);
        let update = Update::builder()
            .table_name(TABLE)
            .key("id", AttributeValue::S(format!("order-{n}")))
            .update_expression("ADD applied :one")
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .build()
            .unwrap();
        std::future::ready(Effect::Commit(Writes::from(Write::update(update))))
    })
}

/// How often each record's write landed, in record order.
fn applied(memory: &MemoryLeaseStore) -> Vec<u64> {
    (0..RECORDS).map(|n| memory.writes_of(&item(n))).collect()
}

fn row(memory: &MemoryLeaseStore) -> LeaseState {
    memory.snapshot()[&key()].clone()
}

/// The row's `lease_counter` after the batch is done once without a fault: every lease write
/// (the claim, each transaction's checkpoint, the release) counts.
async fn clean_counter() -> u64 {
    let memory = Arc::new(MemoryLeaseStore::new());
    let response = processor(memory.clone())
        .process(batch(STREAM, SHARD, 0..RECORDS), &context("clean", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    row(&memory).lease_counter
}

/// The row after a batch done whole by a released claim, `counter` its `lease_counter`:
/// every field.
fn assert_done_whole(row: &LeaseState, counter: u64) {
    assert_eq!(row.checkpoint, Some(sequence(RECORDS - 1)));
    assert_eq!(
        (row.aggregate_sequence.as_ref(), row.aggregate_sub),
        (None, None)
    );
    assert_eq!((row.lease_owner.as_deref(), row.lease_expiry), (None, None));
    assert_eq!(row.lease_counter, counter);
    assert_eq!(row.failing, None);
    assert!(row.done_above.is_empty());
    assert_eq!(row.reported, None);
}

/// The arrange step of each fault test: the memory store behind `Faulty`, with the fault
/// `arm` picks turned on, and the first delivery's report of the batch.
async fn first_delivery_with(
    arm: fn(&Faults<MemoryLeaseStore>) -> &AtomicBool,
) -> (
    Arc<MemoryLeaseStore>,
    Arc<Faulty<MemoryLeaseStore>>,
    BatchReport,
) {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    arm(store.layer()).store(true, Ordering::SeqCst);
    let report = processor(store.clone())
        .process_batch(batch(STREAM, SHARD, 0..RECORDS), &context("a", 60_000))
        .await
        .unwrap();
    (memory, store, report)
}

/// The first delivery stopped at its first record with none recorded, and reported it: why.
fn stopped_at_the_first_record(report: &BatchReport) -> StopReason {
    let shard = &report.shards[0];
    let (stopped, reason) = shard.stopped.clone().expect("stopped");
    assert_eq!(stopped.to_string(), sequence(0));
    assert_eq!(
        shard.count(Disposition::Uncheckpointed),
        COUNT,
        "none recorded"
    );
    assert_eq!(shard.checkpoint, None, "as far as the engine knows");
    assert_eq!(reported(&report.response()), vec![sequence(0)]);
    reason
}

#[tokio::test]
async fn refused_transactions_commit_nothing_report_the_first_record_and_release_the_lease_for_the_redelivery()
 {
    let (memory, store, report) = first_delivery_with(|faults| &faults.transact_fails).await;
    let StopReason::CheckpointFailed(error) = stopped_at_the_first_record(&report) else {
        panic!("a failed checkpoint: {:?}", report.shards[0].stopped);
    };
    assert!(
        error.contains("ProvisionedThroughputExceededException"),
        "{error}"
    );
    assert_eq!(applied(&memory), vec![0; COUNT], "nothing landed");
    assert_eq!(memory.transactions(), 0);
    let after = row(&memory);
    assert_eq!(after.checkpoint, None);
    assert_eq!(after.lease_owner, None, "released for the redelivery");
    assert_eq!(after.failing, None);

    store.layer().transact_fails.store(false, Ordering::SeqCst);
    let again = processor(store)
        .process(batch(STREAM, SHARD, 0..RECORDS), &context("b", 60_000))
        .await
        .unwrap();
    assert!(reported(&again).is_empty());
    assert_eq!(applied(&memory), vec![1; COUNT], "each once");
    assert_eq!(memory.transactions(), 2);
    // The refused invocation's claim and release, beside a clean run's writes.
    assert_done_whole(&row(&memory), clean_counter().await + 2);
}

#[tokio::test]
async fn a_transaction_whose_answer_was_lost_and_that_the_sdk_resends_with_its_token_applies_once()
{
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    // The first transaction: 99 records, the lease kept for the second. Without the token,
    // the resend would find the lease still ours and apply them again.
    store
        .layer()
        .resend_transact_after_lost_answer
        .store(true, Ordering::SeqCst);
    let report = processor(store.clone())
        .process_batch(batch(STREAM, SHARD, 0..RECORDS), &context("a", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    assert_eq!(shard.stopped, None);
    assert_eq!(shard.count(Disposition::Processed), COUNT);
    assert_eq!(
        shard.checkpoint.as_ref().map(ToString::to_string),
        Some(sequence(RECORDS - 1))
    );
    assert!(reported(&report.response()).is_empty());
    assert_eq!(applied(&memory), vec![1; COUNT], "each once");
    assert_eq!(memory.transactions(), 2, "the resend is not a third");
    assert!(
        !store
            .layer()
            .resend_transact_after_lost_answer
            .load(Ordering::SeqCst),
        "the fault was used"
    );
    // The resend wrote nothing: the row is a clean run's.
    assert_done_whole(&row(&memory), clean_counter().await);
}

#[tokio::test]
async fn a_transaction_whose_answer_was_lost_for_good_is_reported_and_its_redelivery_applies_nothing_again()
 {
    let (memory, store, report) = first_delivery_with(|faults| &faults.lose_transact_answer).await;
    let reason = stopped_at_the_first_record(&report);
    assert!(
        matches!(&reason, StopReason::CheckpointFailed(error) if error.contains("connection was reset")),
        "{reason:?}"
    );
    // The first transaction did land: its 99 records and the checkpoint at the 99th.
    let landed: Vec<u64> = (0..RECORDS).map(|n| u64::from(n < 99)).collect();
    assert_eq!(applied(&memory), landed);
    let after = row(&memory);
    assert_eq!(after.checkpoint, Some(sequence(98)));
    assert_eq!(after.lease_owner, None, "released after the error");

    let again = processor(store)
        .process_batch(batch(STREAM, SHARD, 0..RECORDS), &context("b", 60_000))
        .await
        .unwrap();
    let shard = &again.shards[0];
    assert_eq!(shard.stopped, None);
    assert_eq!(
        shard.count(Disposition::Duplicate),
        99,
        "below the checkpoint"
    );
    assert_eq!(shard.count(Disposition::Processed), 51);
    assert!(reported(&again.response()).is_empty());
    assert_eq!(applied(&memory), vec![1; COUNT], "each once");
    assert_eq!(memory.transactions(), 2);
    // The first invocation's claim, first transaction and release; the redelivery's claim
    // and one transaction with its release: a clean run's writes and two more.
    assert_done_whole(&row(&memory), clean_counter().await + 2);
}

#[tokio::test]
async fn a_transaction_after_its_lease_was_stolen_is_fenced_commits_nothing_and_leaves_the_lease_to_its_thief()
 {
    let (memory, _store, report) =
        first_delivery_with(|faults| &faults.steal_before_transact).await;
    assert_eq!(
        stopped_at_the_first_record(&report),
        StopReason::CheckpointFenced
    );
    assert_eq!(
        applied(&memory),
        vec![0; COUNT],
        "nothing without the lease"
    );
    assert_eq!(memory.transactions(), 0);
    let after = row(&memory);
    assert_eq!(after.checkpoint, None);
    assert_eq!(after.lease_owner.as_deref(), Some("thief"));
    assert_eq!(after.failing, None);
}
