//! Per-key concurrency within one invocation, through `Processor`'s public API on the embedded
//! store, with an in-process driver that redelivers the way the event source mapping does
//! (again from each reported record).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{context, event, lambda_record, n_of, reported, sequence};
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Outcome, Position, Processor, Record};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use serde_json::json;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

fn key() -> LeaseKey {
    LeaseKey::new(STREAM, SHARD)
}

fn position(n: u64) -> Position {
    Position::record(sequence(n).parse().unwrap())
}

/// Records `range`, record `n` under partition key `key-{n % keys}`.
fn batch(
    range: std::ops::Range<u64>,
    keys: u64,
) -> aws_lambda_events::event::kinesis::KinesisEvent {
    let records: Vec<_> = range
        .map(|n| {
            lambda_record(
                STREAM,
                SHARD,
                n,
                &format!("key-{}", n % keys),
                &json!({ "n": n }),
            )
        })
        .collect();
    event(&records)
}

/// What the handler did, across invocations: each record acknowledged, per partition key in
/// the order it ran, and the most handlers that ran at once.
#[derive(Clone, Default)]
struct Journal {
    per_key: Arc<Mutex<HashMap<String, Vec<u64>>>>,
    attempts: Arc<Mutex<HashMap<u64, u32>>>,
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Journal {
    /// A handler that waits `wait`, then fails with `fail(n, attempt)` or acknowledges.
    fn handler(
        &self,
        wait: Duration,
        fail: impl Fn(u64, u32) -> Option<Outcome> + Send + Sync + 'static,
    ) -> impl Fn(Record) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>>
    + Send
    + Sync
    + 'static {
        let journal = self.clone();
        let fail = Arc::new(fail);
        move |record: Record| {
            let journal = journal.clone();
            let fail = fail.clone();
            Box::pin(async move {
                let now = journal.running.fetch_add(1, Ordering::SeqCst) + 1;
                journal.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(wait).await;
                journal.running.fetch_sub(1, Ordering::SeqCst);
                let n = n_of(&record);
                let attempt = {
                    let mut attempts = journal.attempts.lock().unwrap();
                    let attempt = attempts.entry(n).or_default();
                    *attempt += 1;
                    *attempt
                };
                if let Some(outcome) = fail(n, attempt) {
                    return outcome;
                }
                journal
                    .per_key
                    .lock()
                    .unwrap()
                    .entry(record.partition_key().to_owned())
                    .or_default()
                    .push(n);
                Outcome::ack()
            })
        }
    }

    fn per_key(&self) -> HashMap<String, Vec<u64>> {
        self.per_key.lock().unwrap().clone()
    }

    fn done(&self) -> Vec<u64> {
        let mut all: Vec<u64> = self.per_key().into_values().flatten().collect();
        all.sort_unstable();
        all
    }
}

#[tokio::test]
async fn keys_run_concurrently_and_each_key_in_order() {
    let store = Arc::new(MemoryLeaseStore::new());
    let journal = Journal::default();
    let processor = Processor::new(
        store.clone(),
        journal.handler(Duration::from_millis(5), |_, _| None),
    )
    .concurrency(8);

    let response = processor
        .process(batch(0..200, 20), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    assert_eq!(journal.done(), (0..200).collect::<Vec<_>>());
    for (key, ns) in journal.per_key() {
        assert!(ns.is_sorted(), "{key} ran out of order: {ns:?}");
    }
    let most = journal.most.load(Ordering::SeqCst);
    assert!(most > 1 && most <= 8, "{most} handlers at once");
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(199)));
    assert!(row.done_above.is_empty());
}

#[tokio::test]
async fn a_failed_key_stops_while_others_go_on_and_the_lowest_record_not_done_is_reported() {
    let store = Arc::new(MemoryLeaseStore::new());
    let journal = Journal::default();
    // Keys 0..4; record 5 (key-1) fails, so 9, 13, 17 (key-1) must not run.
    let processor = Processor::new(
        store.clone(),
        journal.handler(Duration::from_millis(1), |n, _| {
            (n == 5).then(|| Outcome::retry("downstream busy"))
        }),
    )
    .concurrency(4);

    let report = processor
        .process_batch(batch(0..20, 4), &context("r1", 60_000))
        .await
        .unwrap();

    let shard = &report.shards[0];
    assert_eq!(reported(&report.response()), vec![sequence(5)]);
    assert_eq!(shard.count(Disposition::Reported), 1);
    assert_eq!(shard.count(Disposition::NotAttempted), 3, "9, 13 and 17");
    let done = journal.done();
    assert!(!done.contains(&9) && !done.contains(&13) && !done.contains(&17));
    assert_eq!(done.len(), 16, "every other record ran");
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(4)));
    let above: Vec<Position> = (6..20).filter(|n| n % 4 != 1).map(position).collect();
    assert_eq!(
        row.done_above, above,
        "done above the checkpoint, remembered"
    );
    assert_eq!(row.failing.as_ref().map(|f| f.attempts), Some(1));
}

#[tokio::test]
async fn a_redelivery_skips_what_was_done_above_the_checkpoint_and_finishes_the_rest() {
    let store = Arc::new(MemoryLeaseStore::new());
    let journal = Journal::default();
    let processor = Processor::new(
        store.clone(),
        journal.handler(Duration::from_millis(1), |n, attempt| {
            (n == 5 && attempt == 1).then(|| Outcome::retry("downstream busy"))
        }),
    )
    .concurrency(4);

    let first = processor
        .process(batch(0..20, 4), &context("r1", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&first), vec![sequence(5)]);
    let again = processor
        .process_batch(batch(5..20, 4), &context("r2", 60_000))
        .await
        .unwrap();

    assert!(again.response().batch_item_failures.is_empty());
    assert_eq!(
        again.shards[0].count(Disposition::Processed),
        4,
        "5, 9, 13, 17"
    );
    assert_eq!(again.shards[0].count(Disposition::Duplicate), 11);
    assert_eq!(journal.done(), (0..20).collect::<Vec<_>>(), "each once");
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(19)));
    assert!(row.done_above.is_empty(), "forgotten below the checkpoint");
    assert_eq!(row.failing, None);
}

#[tokio::test]
async fn at_the_bound_no_record_starts_above_the_lowest_not_done_and_nothing_runs_twice() {
    let store = Arc::new(MemoryLeaseStore::new());
    let journal = Journal::default();
    let processor = Processor::new(
        store.clone(),
        journal.handler(Duration::from_millis(1), |n, attempt| {
            (n == 0 && attempt <= 2).then(|| Outcome::retry("downstream busy"))
        }),
    )
    .concurrency(4)
    .max_done_above(5);

    let first = processor
        .process_batch(batch(0..40, 4), &context("r1", 60_000))
        .await
        .unwrap();
    let row = store.read(&key()).await.unwrap();
    assert_eq!(reported(&first.response()), vec![sequence(0)]);
    assert_eq!(row.checkpoint, None);
    assert_eq!(row.done_above.len(), 5, "{:?}", row.done_above);
    assert_eq!(journal.done().len(), 5, "nothing started past the bound");

    // The redelivery skips the five, and stops at the bound again while record 0 fails.
    processor
        .process(batch(0..40, 4), &context("r2", 60_000))
        .await
        .unwrap();
    assert_eq!(store.read(&key()).await.unwrap().done_above.len(), 5);
    let last = processor
        .process(batch(0..40, 4), &context("r3", 60_000))
        .await
        .unwrap();
    assert!(reported(&last).is_empty());
    assert_eq!(journal.done(), (0..40).collect::<Vec<_>>(), "each once");
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(39)));
    assert!(row.done_above.is_empty());
}

#[tokio::test]
async fn a_rejected_record_is_dead_lettered_and_its_key_goes_on() {
    let store = Arc::new(MemoryLeaseStore::new());
    let letters = Arc::new(MemoryDeadLetters::new());
    let journal = Journal::default();
    let processor = Processor::new(
        store.clone(),
        journal.handler(Duration::from_millis(1), |n, _| {
            (n == 6).then(|| Outcome::reject("not an order"))
        }),
    )
    .dead_letters(letters.clone())
    .concurrency(16);

    let report = processor
        .process_batch(batch(0..30, 3), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(report.response().batch_item_failures.is_empty());
    assert_eq!(report.shards[0].count(Disposition::DeadLettered), 1);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].record.sequence().as_str(), sequence(6));
    let key0 = &journal.per_key()["key-0"];
    assert_eq!(
        key0,
        &(0..30).step_by(3).filter(|n| *n != 6).collect::<Vec<_>>()
    );
    assert_eq!(
        store.read(&key()).await.unwrap().checkpoint,
        Some(sequence(29))
    );
}

/// A small deterministic generator, so a failing seed can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Delivers `total` records in batches of up to `size` the way the event source mapping does,
/// from the reported record after a partial failure, until every record is checkpointed.
async fn drive(
    processor: &Processor<impl kinesis_checkpoint::Handler>,
    total: u64,
    size: u64,
    keys: u64,
) {
    let mut from = 0;
    let mut invocations = 0;
    while from < total {
        invocations += 1;
        assert!(invocations < 10_000, "the shard made no progress");
        let to = (from + size).min(total);
        let response = processor
            .process(
                batch(from..to, keys),
                &context(&format!("r{invocations}"), 60_000),
            )
            .await
            .unwrap();
        from = match reported(&response).first() {
            Some(reported) => (from..to).find(|n| sequence(*n) == *reported).unwrap(),
            None => to,
        };
    }
}

#[tokio::test]
async fn with_random_failures_every_record_is_done_once_and_each_key_in_order() {
    for (seed, in_flight) in [(7_u64, 2_usize), (11, 8), (23, 32), (42, 128)] {
        let store = Arc::new(MemoryLeaseStore::new());
        let letters = Arc::new(MemoryDeadLetters::new());
        let journal = Journal::default();
        let failures: HashMap<u64, u64> = {
            let mut random = XorShift(seed);
            (0..400).map(|n| (n, random.next() % 100)).collect()
        };
        let processor = Processor::new(
            store.clone(),
            journal.handler(Duration::from_micros(200), move |n, attempt| {
                // 10% of records fail twice, 2% are poison: rejected, dead-lettered.
                match failures[&n] {
                    0..=1 => Some(Outcome::reject("poison")),
                    2..=11 if attempt <= 2 => Some(Outcome::retry("transient")),
                    _ => None,
                }
            }),
        )
        .dead_letters(letters.clone())
        .concurrency(in_flight)
        .max_done_above(50);

        drive(&processor, 400, 100, 13).await;

        let poison: Vec<u64> = letters
            .letters()
            .iter()
            .map(|letter| n_of(&letter.record))
            .collect();
        let mut all = journal.done();
        all.extend(&poison);
        all.sort_unstable();
        assert_eq!(
            all,
            (0..400).collect::<Vec<_>>(),
            "seed {seed}: each record once"
        );
        for (key, ns) in journal.per_key() {
            assert!(ns.is_sorted(), "seed {seed}: {key} out of order: {ns:?}");
        }
        let row = store.read(&key()).await.unwrap();
        assert_eq!(row.checkpoint, Some(sequence(399)));
        assert!(row.done_above.is_empty());
    }
}
