//! A large event (over 2 MB of payloads) is read in two steps: positions first, payloads a
//! chunk of 64 records at a time as in-order dispatch reaches them, each chunk's part of the
//! event freed once read. Every rule of a small batch holds across the chunks' edges: order,
//! the stop and its report, dedupe on redelivery, dead letters with their payloads, records a
//! handler keeps; and the modes that read every record first (per-key dispatch, the
//! partition-key mode, KPL aggregates) still see every record.

mod common;
#[path = "common/kpl.rs"]
mod kpl_encoder;

use std::sync::{Arc, Mutex};

use aws_lambda_events::event::kinesis::KinesisEvent;
use common::{context, event, lambda_record, n_of, redeliver_from, reported, sequence};
use kinesis_checkpoint::processor::CheckpointMode;
use kinesis_checkpoint::{Handler, LeaseKey, MemoryLeaseStore, Outcome, Processor, Record};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use serde_json::{Value, json};

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

/// Records in a large batch: five chunks of 64, the last one in part.
const RECORDS: u64 = 300;

/// Each record's padding: 300 records of 8 KB are 2.4 MB of payloads, above the 2 MB from
/// which an event is read in chunks.
const PAD: usize = 8 * 1024;

/// The payload of record `n`: its number, and padding that says it again.
fn payload(n: u64) -> Value {
    json!({ "n": n, "pad": format!("{n:08}").repeat(PAD / 8) })
}

/// Records `range` of one shard, each with its 8 KB payload.
fn large(range: std::ops::Range<u64>) -> KinesisEvent {
    let records: Vec<Value> = range
        .map(|n| lambda_record(STREAM, SHARD, n, &format!("key-{}", n % 7), &payload(n)))
        .collect();
    event(&records)
}

/// Whether `record` holds record `n`'s payload, whole.
fn holds_its_payload(record: &Record) -> bool {
    let n = n_of(record);
    record.json::<Value>().expect("json") == payload(n) && record.sequence().as_str() == sequence(n)
}

/// Every record a handler saw, in order, across invocations.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<u64>>>);

impl Seen {
    fn all(&self) -> Vec<u64> {
        self.0.lock().unwrap().clone()
    }

    /// A handler that checks each record's payload, notes it, and answers `fail`'s outcome
    /// (or acknowledges it).
    fn handler(
        &self,
        fail: impl Fn(u64) -> Option<Outcome> + Send + Sync + 'static,
    ) -> impl Fn(Record) -> std::future::Ready<Outcome> + Send + Sync + 'static {
        let seen = self.clone();
        move |record: Record| {
            assert!(
                holds_its_payload(&record),
                "record {record} holds another's payload"
            );
            let n = n_of(&record);
            std::future::ready(fail(n).unwrap_or_else(|| {
                seen.0.lock().unwrap().push(n);
                Outcome::ack()
            }))
        }
    }
}

/// Runs the large batch through `processor`, every record done.
async fn run_large<H: Handler, M: CheckpointMode>(processor: &Processor<H, M>) {
    let response = processor
        .process(large(0..RECORDS), &context("r1", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
}

async fn checkpoint_of(store: &MemoryLeaseStore) -> Option<String> {
    store
        .read(&LeaseKey::new(STREAM, SHARD))
        .await
        .unwrap()
        .checkpoint
}

#[tokio::test]
async fn a_large_batch_runs_every_record_in_order_with_its_own_payload() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));

    run_large(&processor).await;
    assert_eq!(seen.all(), (0..RECORDS).collect::<Vec<_>>());
    assert_eq!(checkpoint_of(&store).await, Some(sequence(RECORDS - 1)));
}

#[tokio::test]
async fn a_stop_in_a_later_chunk_is_reported_and_the_whole_batch_again_runs_only_the_rest() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    // Record 200 is inside the fourth chunk (192 to 255), and fails once.
    let failed = Arc::new(Mutex::new(false));
    let once = Arc::clone(&failed);
    let processor = Processor::new(
        store.clone(),
        seen.handler(move |n| {
            let mut failed = once.lock().unwrap();
            (n == 200 && !*failed).then(|| {
                *failed = true;
                Outcome::retry("not yet")
            })
        }),
    );
    let batch = large(0..RECORDS);

    let first = processor
        .process(batch.clone(), &context("r1", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&first), [sequence(200)]);
    assert_eq!(checkpoint_of(&store).await, Some(sequence(199)));
    assert_eq!(seen.all(), (0..200).collect::<Vec<_>>());

    // The whole batch again (a mapping that gave up on the report would not, but a duplicate
    // delivery does): the first 200 are deduped, across three chunks and part of a fourth.
    let again = processor
        .process(batch.clone(), &context("r2", 60_000))
        .await
        .unwrap();
    assert!(reported(&again).is_empty());
    assert_eq!(seen.all(), (0..RECORDS).collect::<Vec<_>>());
    assert_eq!(checkpoint_of(&store).await, Some(sequence(RECORDS - 1)));

    // And from the reported record on, as the mapping retries: nothing runs twice.
    let retried = processor
        .process(
            redeliver_from(&batch, &sequence(200)),
            &context("r3", 60_000),
        )
        .await
        .unwrap();
    assert!(reported(&retried).is_empty());
    assert_eq!(seen.all(), (0..RECORDS).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_rejected_record_of_a_large_batch_is_dead_lettered_with_its_payload() {
    let store = Arc::new(MemoryLeaseStore::new());
    let letters = Arc::new(MemoryDeadLetters::new());
    let seen = Seen::default();
    let processor = Processor::new(
        store.clone(),
        seen.handler(|n| (n == 150 || n == 299).then(|| Outcome::reject("not an order"))),
    )
    .dead_letters(letters.clone());

    run_large(&processor).await;
    let lettered: Vec<u64> = letters.letters().iter().map(|l| n_of(&l.record)).collect();
    assert_eq!(lettered, [150, 299]);
    assert!(
        letters
            .letters()
            .iter()
            .all(|l| holds_its_payload(&l.record))
    );
    let ran: Vec<u64> = (0..RECORDS).filter(|n| *n != 150 && *n != 299).collect();
    assert_eq!(seen.all(), ran);
    assert_eq!(checkpoint_of(&store).await, Some(sequence(RECORDS - 1)));
}

#[tokio::test]
async fn records_a_handler_keeps_outlive_their_chunk_with_their_payloads() {
    let store = Arc::new(MemoryLeaseStore::new());
    let kept = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&kept);
    let processor = Processor::new(store, move |record: Record| {
        keep.lock().unwrap().push(record);
        std::future::ready(Outcome::ack())
    });

    run_large(&processor).await;

    let kept = kept.lock().unwrap();
    assert_eq!(kept.len(), usize::try_from(RECORDS).unwrap());
    for (n, record) in (0..RECORDS).zip(kept.iter()) {
        assert_eq!(n_of(record), n);
        assert!(holds_its_payload(record));
        assert_eq!(record.partition_key(), format!("key-{}", n % 7));
        assert_eq!(record.shard(), SHARD);
    }
}

#[tokio::test]
async fn per_key_dispatch_of_a_large_batch_runs_every_record_in_its_keys_order() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None)).concurrency(4);

    run_large(&processor).await;
    let mut all = seen.all();
    for key in 0..7 {
        let of_key: Vec<u64> = all.iter().copied().filter(|n| n % 7 == key).collect();
        assert!(of_key.is_sorted(), "key {key} ran out of order: {of_key:?}");
    }
    all.sort_unstable();
    assert_eq!(all, (0..RECORDS).collect::<Vec<_>>());
    assert_eq!(checkpoint_of(&store).await, Some(sequence(RECORDS - 1)));
}

#[tokio::test]
async fn the_partition_key_mode_reads_a_large_batch_whole_and_runs_every_record() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::by_partition_key(store, seen.handler(|_| None));

    run_large(&processor).await;
    let mut all = seen.all();
    all.sort_unstable();
    assert_eq!(all, (0..RECORDS).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_kpl_aggregate_in_a_large_batch_is_unpacked_in_its_place() {
    let store = Arc::new(MemoryLeaseStore::new());
    let ran = Arc::new(Mutex::new(Vec::new()));
    let note = Arc::clone(&ran);
    let processor = Processor::new(store.clone(), move |record: Record| {
        note.lock()
            .unwrap()
            .push((record.sequence().to_string(), record.sub_sequence()));
        std::future::ready(Outcome::ack())
    });
    // Record 100 is an aggregate of three sub-records.
    let subs: [(&str, &[u8]); 3] = [("a", b"first"), ("b", b"second"), ("a", b"third")];
    let mut batch = large(0..RECORDS);
    batch.records[100].kinesis.data.0 = kpl_encoder::aggregate(&subs);

    let response = processor
        .process(batch, &context("r1", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    let ran = ran.lock().unwrap().clone();
    assert_eq!(ran.len(), usize::try_from(RECORDS).unwrap() + 2);
    assert_eq!(ran[99], (sequence(99), None));
    assert_eq!(
        ran[100..103],
        [
            (sequence(100), Some(0)),
            (sequence(100), Some(1)),
            (sequence(100), Some(2)),
        ]
    );
    assert_eq!(ran[103], (sequence(101), None));
    assert_eq!(checkpoint_of(&store).await, Some(sequence(RECORDS - 1)));
}
