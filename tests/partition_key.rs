//! The partition-key mode (for `ParallelizationFactor` above 1), through `Processor`'s public
//! API on the embedded store, with an in-process driver that splits a shard by partition key
//! into up to 10 lanes delivered at once, and redelivers each lane from its reported record, as
//! the event source mapping does.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{context, event, lambda_record, n_of, reported, sequence};
use kinesis_checkpoint::internal::row_key;
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::store::{CheckpointStore, LeaseStore};
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Outcome, Processor, Record};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use serde_json::json;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

fn shard() -> LeaseKey {
    LeaseKey::new(STREAM, SHARD)
}

fn partition_key(n: u64, keys: u64) -> String {
    format!("key-{}", n % keys)
}

/// An event of records `ns`, record `n` under `key-{n % keys}`.
fn batch(ns: &[u64], keys: u64) -> aws_lambda_events::event::kinesis::KinesisEvent {
    let records: Vec<_> = ns
        .iter()
        .map(|&n| {
            lambda_record(
                STREAM,
                SHARD,
                n,
                &partition_key(n, keys),
                &json!({ "n": n }),
            )
        })
        .collect();
    event(&records)
}

/// Every record acknowledged, per partition key in the order it ran; attempts per record.
#[derive(Clone, Default)]
struct Journal {
    per_key: Arc<Mutex<HashMap<String, Vec<u64>>>>,
    attempts: Arc<Mutex<HashMap<u64, u32>>>,
}

impl Journal {
    fn handler(
        &self,
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
                tokio::time::sleep(Duration::from_micros(100)).await;
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
}

/// Delivers `total` records over `keys` keys as the mapping does with `parallelization`: each
/// key belongs to one lane, the lanes run at once, each in batches of up to `size` from its
/// reported record on.
async fn drive<H: kinesis_checkpoint::Handler, M: kinesis_checkpoint::processor::CheckpointMode>(
    processor: &Processor<H, M>,
    total: u64,
    keys: u64,
    parallelization: u64,
    size: usize,
) {
    let lanes: Vec<Vec<u64>> = (0..parallelization)
        .map(|lane| {
            (0..total)
                .filter(|n| (n % keys) % parallelization == lane)
                .collect()
        })
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (lane, records) in lanes.into_iter().enumerate() {
        let processor = processor.clone();
        tasks.spawn(async move {
            let mut from = 0;
            let mut invocation = 0;
            while from < records.len() {
                invocation += 1;
                assert!(invocation < 10_000, "lane {lane} made no progress");
                let to = (from + size).min(records.len());
                let response = processor
                    .process(
                        batch(&records[from..to], keys),
                        &context(&format!("lane{lane}-{invocation}"), 60_000),
                    )
                    .await
                    .unwrap();
                from = match reported(&response).first() {
                    Some(reported) => (from..to)
                        .find(|&index| sequence(records[index]) == *reported)
                        .unwrap(),
                    None => to,
                };
            }
        });
    }
    while let Some(lane) = tasks.join_next().await {
        lane.unwrap();
    }
}

/// A small deterministic generator, so a failing seed can be replayed.
fn random(seed: u64, count: u64) -> Vec<u64> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % 100
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_parallelization_1_to_10_and_random_failures_every_record_is_done_once_in_key_order() {
    const TOTAL: u64 = 300;
    const KEYS: u64 = 23;
    for parallelization in [1, 2, 3, 5, 10] {
        for in_flight in [1, 8] {
            let seed = parallelization * 100 + u64::try_from(in_flight).unwrap();
            let store = Arc::new(MemoryLeaseStore::new());
            let letters = Arc::new(MemoryDeadLetters::new());
            let journal = Journal::default();
            let dice = random(seed, TOTAL);
            let processor = Processor::by_partition_key(
                store.clone(),
                journal.handler(move |n, attempt| match dice[usize::try_from(n).unwrap()] {
                    0..=1 => Some(Outcome::reject("poison")),
                    2..=11 if attempt <= 2 => Some(Outcome::retry("transient")),
                    _ => None,
                }),
            )
            .dead_letters(letters.clone())
            .concurrency(in_flight);

            drive(&processor, TOTAL, KEYS, parallelization, 40).await;

            let case = format!("parallelization {parallelization}, {in_flight} in flight");
            let mut all: Vec<u64> = journal.per_key().into_values().flatten().collect();
            all.extend(letters.letters().iter().map(|letter| n_of(&letter.record)));
            all.sort_unstable();
            assert_eq!(
                all,
                (0..TOTAL).collect::<Vec<_>>(),
                "{case}: each record once"
            );
            for (key, ns) in journal.per_key() {
                assert!(ns.is_sorted(), "{case}: {key} out of order: {ns:?}");
            }
            // Every key's row holds its last record; the shard has no row of its own.
            for k in 0..KEYS {
                let last = (0..TOTAL).rev().find(|n| n % KEYS == k).unwrap();
                let row = store
                    .read(&row_key(&shard(), &format!("key-{k}")))
                    .await
                    .unwrap();
                assert_eq!(row.checkpoint, Some(sequence(last)), "{case}: key-{k}");
                assert_eq!(row.lease_owner, None);
                assert!(row.expires_at.is_some(), "{case}: key rows expire");
            }
            assert!(
                !store.snapshot().contains_key(&shard()),
                "{case}: no shard lease"
            );
        }
    }
}

#[tokio::test]
async fn a_failed_key_is_reported_at_its_lowest_record_and_other_keys_are_checkpointed() {
    let store = Arc::new(MemoryLeaseStore::new());
    let journal = Journal::default();
    let processor = Processor::by_partition_key(
        store.clone(),
        journal.handler(|n, _| (n == 5).then(|| Outcome::retry("busy"))),
    );
    let ns: Vec<u64> = (0..12).collect();

    let report = processor
        .process_batch(batch(&ns, 4), &context("r1", 60_000))
        .await
        .unwrap();

    assert_eq!(reported(&report.response()), vec![sequence(5)]);
    let shard_report = &report.shards[0];
    assert_eq!(
        shard_report.count(Disposition::NotAttempted),
        1,
        "record 9 of key-1"
    );
    let checkpoint = |k: &str| {
        let store = store.clone();
        let k = k.to_owned();
        async move { store.read(&row_key(&shard(), &k)).await.unwrap().checkpoint }
    };
    assert_eq!(checkpoint("key-1").await, Some(sequence(1)));
    assert_eq!(checkpoint("key-2").await, Some(sequence(10)));
    let failing = store
        .read(&row_key(&shard(), "key-1"))
        .await
        .unwrap()
        .failing
        .unwrap();
    assert_eq!((failing.sequence, failing.attempts), (sequence(5), 1));

    // The redelivery from record 5 runs key-1 only: the rest is at or below its key's row.
    let again = processor
        .process_batch(batch(&ns[5..], 4), &context("r2", 60_000))
        .await
        .unwrap();
    assert_eq!(again.shards[0].count(Disposition::Duplicate), 5);
    assert_eq!(reported(&again.response()), vec![sequence(5)]);
    assert_eq!(journal.per_key()["key-1"], vec![1]);
}

#[tokio::test]
async fn a_key_row_written_by_another_delivery_meanwhile_is_not_overwritten_and_is_reported() {
    let store = Arc::new(MemoryLeaseStore::new());
    let journal = Journal::default();
    let racing = store.clone();
    // While key-0's record 4 runs, another delivery of key-0 checkpoints record 4 first.
    let processor = Processor::by_partition_key(store.clone(), {
        let handler = journal.handler(|_, _| None);
        move |record: Record| {
            let racing = racing.clone();
            let acknowledged = handler(record.clone());
            async move {
                if n_of(&record) == 4 {
                    let row = row_key(&shard(), "key-0");
                    let counter = racing.read(&row).await.unwrap().lease_counter;
                    let mut commit = kinesis_checkpoint::internal::KeyCommit::new(row, counter);
                    commit.checkpoint = Some(kinesis_checkpoint::Position::record(
                        sequence(4).parse().unwrap(),
                    ));
                    assert_eq!(racing.commit_rows(&[commit]).await.unwrap(), vec![true]);
                }
                acknowledged.await
            }
        }
    });
    let ns: Vec<u64> = (0..12).collect();
    processor
        .process(batch(&ns[..2], 4), &context("r0", 60_000))
        .await
        .unwrap();

    let report = processor
        .process_batch(batch(&ns[2..], 4), &context("r1", 60_000))
        .await
        .unwrap();

    let shard_report = &report.shards[0];
    assert_eq!(
        shard_report.stopped.as_ref().map(|(s, _)| s.to_string()),
        Some(sequence(4)),
        "key-0's records here are reported"
    );
    assert_eq!(
        shard_report.count(Disposition::Uncheckpointed),
        1,
        "record 8 of key-0"
    );
    let row = store.read(&row_key(&shard(), "key-0")).await.unwrap();
    assert_eq!(
        row.checkpoint,
        Some(sequence(4)),
        "the other delivery's write stands"
    );
}

/// The shard's row as the seed crate's consumer writes it: its lease, then its checkpoint, both
/// through the seed's five methods on `stream:shard`.
async fn container_consumer(store: &MemoryLeaseStore, checkpoint: Option<u64>, live: bool) {
    let ttl = if live {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    };
    assert!(store.acquire(&shard(), "container-1", ttl).await.unwrap());
    if let Some(n) = checkpoint {
        assert!(
            store
                .checkpoint(&shard(), "container-1", &sequence(n))
                .await
                .unwrap()
        );
    }
}

#[tokio::test]
async fn in_the_partition_key_mode_a_live_shard_lease_of_a_container_consumer_holds_the_batch() {
    let store = Arc::new(MemoryLeaseStore::new());
    container_consumer(&store, None, true).await;
    let journal = Journal::default();
    let processor = Processor::by_partition_key(store.clone(), journal.handler(|_, _| None));

    let ns: Vec<u64> = (0..6).collect();
    let report = processor
        .process_batch(batch(&ns, 3), &context("held", 60_000))
        .await
        .unwrap();

    let shard_report = &report.shards[0];
    assert!(
        matches!(
            &shard_report.stopped,
            Some((at, kinesis_checkpoint::report::StopReason::LeaseHeld { owner: Some(owner) }))
                if *at.as_str() == sequence(0) && owner == "container-1"
        ),
        "{shard_report:?}"
    );
    assert_eq!(shard_report.count(Disposition::NotAttempted), 5);
    assert!(journal.per_key().is_empty(), "nothing processed");
    // Nothing is written: the mapping delivers the batch again.
    for k in 0..3 {
        let row = store
            .read(&row_key(&shard(), &format!("key-{k}")))
            .await
            .unwrap();
        assert_eq!(
            (row.checkpoint, row.failing, row.lease_counter),
            (None, None, 0),
            "key-{k}: nothing done, nothing written"
        );
    }
}

#[tokio::test]
async fn in_the_partition_key_mode_records_at_or_below_a_container_consumers_checkpoint_are_duplicates()
 {
    let store = Arc::new(MemoryLeaseStore::new());
    // The container consumer processed records 0 to 4 and let its lease lapse.
    container_consumer(&store, Some(4), false).await;
    let journal = Journal::default();
    let processor = Processor::by_partition_key(store.clone(), journal.handler(|_, _| None));

    let ns: Vec<u64> = (0..10).collect();
    let report = processor
        .process_batch(batch(&ns, 3), &context("after", 60_000))
        .await
        .unwrap();

    assert!(report.shards[0].stopped.is_none());
    assert_eq!(report.shards[0].count(Disposition::Duplicate), 5);
    assert_eq!(report.shards[0].count(Disposition::Processed), 5);
    let mut processed: Vec<u64> = journal.per_key().into_values().flatten().collect();
    processed.sort_unstable();
    assert_eq!(processed, [5, 6, 7, 8, 9]);
    let row = store.read(&row_key(&shard(), "key-2")).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(8)), "key-2's last record");
    let shard_row = store.read(&shard()).await.unwrap();
    assert_eq!(
        shard_row.checkpoint,
        Some(sequence(4)),
        "the shard row is left alone"
    );
}

/// A topology over a memory stream that counts the reads of a parent's records, and the
/// records each read returned.
struct CountingStream {
    stream: kinesis_checkpoint_testing::local::MemoryStream,
    reads: Mutex<Vec<usize>>,
}

impl kinesis_checkpoint::gate::Topology for CountingStream {
    fn shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> kinesis_checkpoint::BoxFuture<
        'a,
        Result<Vec<kinesis_checkpoint::gate::ShardInfo>, kinesis_checkpoint::gate::TopologyError>,
    > {
        self.stream.shards(stream)
    }

    fn exhausted<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        after: Option<&'a str>,
    ) -> kinesis_checkpoint::BoxFuture<'a, Result<bool, kinesis_checkpoint::gate::TopologyError>>
    {
        self.stream.exhausted(stream, shard, after)
    }

    fn retention<'a>(
        &'a self,
        stream: &'a str,
    ) -> kinesis_checkpoint::BoxFuture<'a, Result<Duration, kinesis_checkpoint::gate::TopologyError>>
    {
        self.stream.retention(stream)
    }

    fn records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
    ) -> kinesis_checkpoint::BoxFuture<
        'a,
        Result<Vec<Record>, kinesis_checkpoint::gate::TopologyError>,
    > {
        Box::pin(async move {
            let records =
                kinesis_checkpoint::gate::Topology::records(&self.stream, stream, shard).await?;
            self.reads.lock().unwrap().push(records.len());
            Ok(records)
        })
    }

    fn read_range<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        range: &'a kinesis_checkpoint::gap::SkippedRange,
        budget: kinesis_checkpoint::gap::ReadBudget,
    ) -> kinesis_checkpoint::BoxFuture<
        'a,
        Result<kinesis_checkpoint::gap::RangeRead, kinesis_checkpoint::gate::TopologyError>,
    > {
        Box::pin(async move {
            let read = self.stream.read_range(stream, shard, range, budget).await?;
            self.reads.lock().unwrap().push(read.records.len());
            Ok(read)
        })
    }
}

/// The records of `shard` of a memory stream, `range` of them, as one delivery.
fn delivery(
    stream: &kinesis_checkpoint_testing::local::MemoryStream,
    shard: &str,
    range: std::ops::Range<usize>,
) -> aws_lambda_events::event::kinesis::KinesisEvent {
    use base64::Engine;
    let records: Vec<serde_json::Value> = stream.records(shard)[range]
        .iter()
        .map(|r| {
            json!({
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

/// A stream whose shard 0 holds `parent` records over `keys` keys, split, and 8 records in its
/// children; a partition-key processor gated over it, counting the parent's reads.
fn split_stream(
    parent: u64,
    keys: u64,
) -> (
    kinesis_checkpoint_testing::local::MemoryStream,
    Arc<CountingStream>,
) {
    let stream = kinesis_checkpoint_testing::local::MemoryStream::new(STREAM, 1);
    for n in 0..parent {
        stream.put(&partition_key(n, keys), json!({ "n": n }).to_string());
    }
    stream.split(SHARD);
    for n in parent..parent + 8 {
        stream.put(&partition_key(n, keys), json!({ "n": n }).to_string());
    }
    let counting = Arc::new(CountingStream {
        stream: stream.clone(),
        reads: Mutex::new(Vec::new()),
    });
    (stream, counting)
}

fn child_with_records(stream: &kinesis_checkpoint_testing::local::MemoryStream) -> String {
    ["shardId-000000000001", "shardId-000000000002"]
        .into_iter()
        .find(|child| !stream.records(child).is_empty())
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn in_the_partition_key_mode_held_child_batches_read_their_parent_once() {
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let (stream, counting) = split_stream(40, 4);
    let journal = Journal::default();
    let processor = Processor::by_partition_key(
        Arc::new(MemoryLeaseStore::new()),
        journal.handler(|n, attempt| (n == 5 && attempt == 1).then(|| Outcome::retry("not yet"))),
    )
    .gate(Gate::new(counting.clone(), StartingPosition::TrimHorizon));
    let child = child_with_records(&stream);
    let held = |report: &kinesis_checkpoint::BatchReport| {
        matches!(
            report.shards[0].stopped,
            Some((_, kinesis_checkpoint::report::StopReason::Held(_)))
        )
    };

    let parent = processor
        .process_batch(delivery(&stream, SHARD, 0..40), &context("p1", 60_000))
        .await
        .unwrap();
    assert_eq!(
        reported(&parent.response()),
        [stream.records(SHARD)[5].sequence.clone()]
    );
    for attempt in 0..4 {
        let report = processor
            .process_batch(
                delivery(&stream, &child, 0..stream.records(&child).len()),
                &context(&format!("c{attempt}"), 60_000),
            )
            .await
            .unwrap();
        assert!(held(&report), "key-1 of the parent is not done: {report:?}");
    }
    processor
        .process_batch(delivery(&stream, SHARD, 5..40), &context("p2", 60_000))
        .await
        .unwrap();
    let report = processor
        .process_batch(
            delivery(&stream, &child, 0..stream.records(&child).len()),
            &context("c-last", 60_000),
        )
        .await
        .unwrap();
    assert!(!held(&report), "{report:?}");

    assert_eq!(
        *counting.reads.lock().unwrap(),
        [40],
        "the parent is read once for five checks"
    );
    let processed: usize = journal.per_key().values().map(Vec::len).sum();
    assert_eq!(processed, 40 + stream.records(&child).len());
}

#[tokio::test]
async fn in_the_partition_key_mode_a_large_parent_is_read_in_bounded_parts() {
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let (stream, counting) = split_stream(12_000, 10);
    let processor =
        Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), |_: Record| async {
            Outcome::ack()
        })
        .gate(Gate::new(counting.clone(), StartingPosition::TrimHorizon));
    let child = child_with_records(&stream);

    let parent = processor
        .process_batch(delivery(&stream, SHARD, 0..12_000), &context("p1", 60_000))
        .await
        .unwrap();
    assert!(parent.shards[0].stopped.is_none());
    let first = processor
        .process_batch(
            delivery(&stream, &child, 0..stream.records(&child).len()),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            first.shards[0].stopped,
            Some((_, kinesis_checkpoint::report::StopReason::Held(_)))
        ),
        "the parent is not read to its end by one check: {first:?}"
    );
    let second = processor
        .process_batch(
            delivery(&stream, &child, 0..stream.records(&child).len()),
            &context("c2", 60_000),
        )
        .await
        .unwrap();
    assert!(second.shards[0].stopped.is_none(), "{second:?}");

    let reads = counting.reads.lock().unwrap().clone();
    assert_eq!(reads, [10_000, 2_000], "at most 10,000 records per check");
}

#[tokio::test]
async fn in_the_partition_key_mode_a_parent_a_container_consumer_checkpointed_to_its_end_is_finished()
 {
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let (stream, counting) = split_stream(40, 4);
    let store = Arc::new(MemoryLeaseStore::new());
    // The container consumer processed the whole parent and let its lease lapse, without
    // writing SHARD_END.
    let last = stream.records(SHARD)[39].sequence.clone();
    assert!(
        store
            .acquire(&shard(), "container-1", Duration::ZERO)
            .await
            .unwrap()
    );
    assert!(
        store
            .checkpoint(&shard(), "container-1", &last)
            .await
            .unwrap()
    );
    let processor =
        Processor::by_partition_key(store.clone(), |_: Record| async { Outcome::ack() })
            .gate(Gate::new(counting, StartingPosition::TrimHorizon));
    let child = child_with_records(&stream);

    let report = processor
        .process_batch(
            delivery(&stream, &child, 0..stream.records(&child).len()),
            &context("c1", 60_000),
        )
        .await
        .unwrap();

    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(
        store.read(&shard()).await.unwrap().checkpoint.as_deref(),
        Some(kinesis_checkpoint::sequence::SHARD_END),
        "the gate marked the parent finished"
    );
}

/// Loses the answer of the first `commit_rows` (the write lands, the caller sees an error).
#[derive(Default)]
struct LosesFirstAnswer(std::sync::atomic::AtomicBool);

impl kinesis_checkpoint::internal::Layer for LosesFirstAnswer {
    fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: kinesis_checkpoint::internal::Call<'a>,
        next: kinesis_checkpoint::internal::Next<'a, T>,
    ) -> kinesis_checkpoint::BoxFuture<'a, Result<T, kinesis_checkpoint::store::LeaseError>> {
        let rows = matches!(
            call.operation(),
            kinesis_checkpoint::internal::Operation::CommitRows
        );
        Box::pin(async move {
            let answer = next.run(call).await;
            if rows && !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Err("the answer was lost (injected)".into());
            }
            answer
        })
    }
}

/// A write of the keys' rows that landed with its answer lost reports the batch; its
/// redelivery finds every record at or below its key's checkpoint and runs none again.
#[tokio::test]
async fn in_the_partition_key_mode_rows_written_with_their_answer_lost_run_nothing_twice() {
    use kinesis_checkpoint::internal::Layered;
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(Layered::new(memory.clone(), LosesFirstAnswer::default()));
    let journal = Journal::default();
    let processor = Processor::by_partition_key(store, journal.handler(|_, _| None));
    let ns: Vec<u64> = (0..8).collect();
    let first = processor
        .process_batch(batch(&ns, 3), &context("r1", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&first.response()), vec![sequence(0)]);
    let again = processor
        .process_batch(batch(&ns, 3), &context("r2", 60_000))
        .await
        .unwrap();
    assert!(reported(&again.response()).is_empty());
    assert_eq!(again.shards[0].count(Disposition::Duplicate), 8);
    let ran: usize = journal.per_key().values().map(Vec::len).sum();
    assert_eq!(ran, 8, "each record once");
}
