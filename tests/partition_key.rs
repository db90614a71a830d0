//! The partition-key mode (for `ParallelizationFactor` above 1), through `Processor`'s public
//! API on the embedded store, with an in-process driver that splits a shard by partition key
//! into up to 10 lanes delivered at once, and redelivers each lane from its reported record, as
//! the event source mapping does.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{context, event, lambda_record, n_of, reported, sequence};
use kinesis_checkpoint::dead_letter::MemoryDeadLetters;
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::store::row_key;
use kinesis_checkpoint::store::{CheckpointStore, LeaseStore};
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Outcome, Processor, Record};
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
                    let mut commit = kinesis_checkpoint::store::KeyCommit::new(row, counter);
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
    // Each key is marked where the lane was turned away, as for a batch the gate holds: if the
    // mapping gives up on it, the lane's next batch finds what it skipped.
    for k in 0..3 {
        let row = store
            .read(&row_key(&shard(), &format!("key-{k}")))
            .await
            .unwrap();
        assert_eq!(
            row.reported.map(|mark| mark.to_string()),
            Some(sequence(0)),
            "key-{k} is marked at the batch's first record"
        );
        assert_eq!(
            (row.checkpoint, row.failing, row.lease_counter),
            (None, None, 1),
            "key-{k}: nothing done, nothing failing, one write"
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
    stream: kinesis_checkpoint::local::MemoryStream,
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
    stream: &kinesis_checkpoint::local::MemoryStream,
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
) -> (kinesis_checkpoint::local::MemoryStream, Arc<CountingStream>) {
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
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

fn child_with_records(stream: &kinesis_checkpoint::local::MemoryStream) -> String {
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

#[tokio::test]
async fn in_the_partition_key_mode_a_held_child_batch_the_mapping_gave_up_on_runs_once_its_parents_finish()
 {
    use kinesis_checkpoint::gap::GapOutcome;
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let (stream, counting) = split_stream(4, 2);
    let journal = Journal::default();
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::by_partition_key(store.clone(), journal.handler(|_, _| None))
        .gate(Gate::new(counting.clone(), StartingPosition::TrimHorizon));
    let child = child_with_records(&stream);
    let records = stream.records(&child);
    let child_key = LeaseKey::new(STREAM, child.as_str());
    let (count, half) = (records.len(), records.len() / 2);
    assert!(half > 0, "the child holds records on both sides of the cut");

    // The child comes first and is held; each key of the batch is marked at its first record.
    let report = processor
        .process_batch(delivery(&stream, &child, 0..half), &context("c1", 60_000))
        .await
        .unwrap();
    assert!(matches!(
        report.shards[0].stopped,
        Some((_, kinesis_checkpoint::report::StopReason::Held(_)))
    ));
    for record in &records[..half] {
        let key = &record.partition_key;
        let row = LeaseStore::read(&*store, &row_key(&child_key, key))
            .await
            .unwrap();
        assert_eq!(
            row.reported.map(|mark| mark.to_string()),
            Some(records[0].sequence.clone()),
            "{key} is marked where the held batch starts"
        );
    }
    processor
        .process_batch(delivery(&stream, SHARD, 0..4), &context("p1", 60_000))
        .await
        .unwrap();

    // The mapping gave up on the held batch: the next one starts after it.
    let report = processor
        .process_batch(
            delivery(&stream, &child, half..count),
            &context("c2", 60_000),
        )
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    let gap = report.shards[0].gap.as_ref().expect("a gap");
    assert_eq!(gap.outcome, GapOutcome::Recovered);
    assert_eq!(gap.recovered.len(), half, "the held batch's records");
    assert!(
        gap.recovered
            .iter()
            .all(|r| r.disposition == Disposition::Processed)
    );
    let per_key = journal.per_key();
    for (key, ns) in &per_key {
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "{key} in order: {ns:?}");
    }
    let processed: usize = per_key.values().map(Vec::len).sum();
    assert_eq!(processed, 4 + count, "every record once");
}

/// What a lane skipped is read back with the records of every lane in its range: only the
/// lane's keys run. Keys a and b share a lane; c takes another, which is still retrying c's
/// record inside the range: c's record is not run here (it would run twice, beside its lane).
#[tokio::test]
async fn in_the_partition_key_mode_a_skipped_range_runs_only_the_records_of_the_lanes_keys() {
    use kinesis_checkpoint::gap::GapOutcome;
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
    // a0 c1 b2 a3 c4 b5 b6
    for (n, key) in ["a", "c", "b", "a", "c", "b", "b"].iter().enumerate() {
        stream.put(key, json!({ "n": n }).to_string());
    }
    let journal = Journal::default();
    let processor = Processor::by_partition_key(
        Arc::new(MemoryLeaseStore::new()),
        journal.handler(|n, attempt| {
            // c4 keeps failing in c's lane; a3 fails once.
            (n == 4 || (n == 3 && attempt == 1)).then(|| Outcome::retry("not yet"))
        }),
    )
    .gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let records = stream.records(SHARD);
    let lane = |indexes: &[usize]| {
        let mut event = delivery(&stream, SHARD, 0..records.len());
        event.records = indexes.iter().map(|&i| event.records[i].clone()).collect();
        event
    };

    // c's lane: c1 done, c4 reported.
    let report = processor
        .process_batch(lane(&[1, 4]), &context("c", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&report.response()), [records[4].sequence.clone()]);
    // a and b's lane: a3 reported, b2 and b5 done; the mapping gives up on it.
    let report = processor
        .process_batch(lane(&[0, 2, 3, 5]), &context("ab1", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&report.response()), [records[3].sequence.clone()]);
    // The lane's next batch: b6 alone. b's mark (a3) lies behind it.
    let report = processor
        .process_batch(lane(&[6]), &context("ab2", 60_000))
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    let gap = report.shards[0].gap.as_ref().expect("a gap");
    assert_eq!(gap.outcome, GapOutcome::Recovered);
    assert_eq!(
        gap.recovered
            .iter()
            .map(|r| r.position.to_string())
            .collect::<Vec<_>>(),
        [records[3].sequence.clone()],
        "a3 only: b5 is done, and c4 belongs to another lane"
    );
    let per_key = journal.per_key();
    assert_eq!(per_key["a"], [0, 3]);
    assert_eq!(per_key["b"], [2, 5, 6]);
    assert_eq!(per_key["c"], [1], "c4 is left to its own lane");
    assert_eq!(
        journal.attempts.lock().unwrap()[&4],
        1,
        "c4 was tried by its lane only"
    );
}

/// A lane's skipped range longer than one reading (10,000 records) runs in parts, one per
/// delivery of the batch after it: the batch waits (its first record reported) until the last
/// part is read, and every record runs once, in order.
#[tokio::test]
async fn in_the_partition_key_mode_a_skipped_range_longer_than_one_reading_runs_in_parts() {
    use kinesis_checkpoint::gap::{GapOutcome, MAX_RECOVERED_RECORDS};
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    use kinesis_checkpoint::report::StopReason;
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
    let count = MAX_RECOVERED_RECORDS + 500;
    let total = u64::try_from(count).unwrap();
    for n in 0..total {
        let key = if n == 0 { "a" } else { "b" };
        stream.put(key, json!({ "n": n }).to_string());
    }
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let handler = {
        let seen = seen.clone();
        move |record: Record| {
            let n = n_of(&record);
            let mut seen = seen.lock().unwrap();
            let first_try = n == 0 && !seen.contains(&u64::MAX);
            if first_try {
                seen.push(u64::MAX);
            } else {
                seen.push(n);
            }
            std::future::ready(if first_try {
                Outcome::retry("not yet")
            } else {
                Outcome::ack()
            })
        }
    };
    let processor = Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), handler).gate(
        Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon),
    );

    // a0 fails, b1 is done: both are marked at a0. The mapping gives up on the lane's batch
    // and on everything up to the last record, which comes next.
    let report = processor
        .process_batch(delivery(&stream, SHARD, 0..2), &context("1", 60_000))
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_some());
    let last = delivery(&stream, SHARD, count - 1..count);
    let report = processor
        .process_batch(last.clone(), &context("2", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    assert!(
        matches!(shard.stopped, Some((_, StopReason::GapUnread(_)))),
        "{:?}",
        shard.stopped
    );
    let gap = shard.gap.as_ref().expect("a gap");
    assert_eq!(gap.outcome, GapOutcome::Partial);
    assert_eq!(
        gap.recovered.len(),
        MAX_RECOVERED_RECORDS - 2,
        "a0, b2 to b9998"
    );
    let report = processor
        .process_batch(last, &context("3", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    assert!(shard.stopped.is_none(), "{:?}", shard.stopped);
    assert_eq!(
        shard.gap.as_ref().map(|gap| &gap.outcome),
        Some(&GapOutcome::Recovered)
    );
    let mut seen: Vec<u64> = seen
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|&n| n != u64::MAX)
        .collect();
    let b: Vec<u64> = seen.iter().copied().filter(|&n| n != 0).collect();
    assert!(b.windows(2).all(|w| w[0] < w[1]), "b in order");
    seen.sort_unstable();
    assert_eq!(seen, (0..total).collect::<Vec<_>>(), "every record once");
}

/// A key of the lane's reported batch whose records all lie after the first part of a skipped
/// range read in parts: the lane's next batch does not hold it, and its rows are first seen in a
/// later part, which the keys read before have been marked on from. It still counts as the
/// lane's (its mark is the lane's, kept while the range is read in parts; where the reading goes
/// on is the lane's own row), so its record runs, once; records of a key with no mark, which
/// belong to another lane, are left to it.
#[tokio::test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: the lane's batch, the first part, the last part, every row checked"
)]
async fn in_the_partition_key_mode_a_key_whose_skipped_records_all_lie_after_the_first_part_runs_them()
 {
    use kinesis_checkpoint::gap::{GapOutcome, MAX_RECOVERED_RECORDS};
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
    // a0, then b (another lane's, never delivered here), then c and a at the end.
    let c = MAX_RECOVERED_RECORDS + 200;
    for n in 0..=c + 1 {
        let key = match n {
            0 => "a",
            n if n == c => "c",
            n if n == c + 1 => "a",
            _ => "b",
        };
        stream.put(key, json!({ "n": n }).to_string());
    }
    let (c, last) = (u64::try_from(c).unwrap(), c + 1);
    let journal = Journal::default();
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::by_partition_key(
        store.clone(),
        journal.handler(move |n, attempt| {
            ((n == 0 || n == c) && attempt == 1).then(|| Outcome::retry("not yet"))
        }),
    )
    .gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let records = stream.records(SHARD);
    let pick = |indexes: &[usize]| {
        let mut event = delivery(&stream, SHARD, 0..records.len());
        event.records = indexes.iter().map(|&i| event.records[i].clone()).collect();
        event
    };
    let mark = |partition_key: &str| {
        let store = store.clone();
        let row = row_key(&shard(), partition_key);
        async move {
            LeaseStore::read(store.as_ref(), &row)
                .await
                .unwrap()
                .reported
        }
    };

    // The lane's batch a0, c: both fail; both keys are marked at a0. The mapping gives up on
    // it, and the lane's next batch is the last record, a's.
    let report = processor
        .process_batch(
            pick(&[0, usize::try_from(c).unwrap()]),
            &context("1", 60_000),
        )
        .await
        .unwrap();
    let a0 = records[0].sequence.clone();
    assert_eq!(reported(&report.response()), std::slice::from_ref(&a0));
    let report = processor
        .process_batch(pick(&[last]), &context("2", 60_000))
        .await
        .unwrap();
    let gap = report.shards[0].gap.as_ref().expect("a gap");
    assert_eq!(gap.outcome, GapOutcome::Partial, "{gap:?}");
    assert_eq!(
        gap.recovered.len(),
        1,
        "a0 only: c is not in the first part"
    );
    // a keeps the mark that proved the range; the lane's row says where the next part starts.
    let a0_mark = Some(kinesis_checkpoint::Position::record(a0.parse().unwrap()));
    assert_eq!(
        (mark("a").await, mark("c").await),
        (a0_mark.clone(), a0_mark)
    );
    let lane = LeaseKey::new(STREAM, format!("{SHARD}#lane:{a0}"));
    let lane = LeaseStore::read(store.as_ref(), &lane).await.unwrap();
    assert_eq!(
        lane.reported.map(|p| p.to_string()),
        Some(records[MAX_RECOVERED_RECORDS - 1].sequence.clone()),
        "the last record read, not run"
    );
    let report = processor
        .process_batch(pick(&[last]), &context("3", 60_000))
        .await
        .unwrap();
    let shard = &report.shards[0];
    assert!(shard.stopped.is_none(), "{:?}", shard.stopped);
    let gap = shard.gap.as_ref().expect("the rest of the gap");
    assert_eq!(gap.outcome, GapOutcome::Recovered);
    assert_eq!(
        gap.recovered
            .iter()
            .map(|r| r.position.to_string())
            .collect::<Vec<_>>(),
        [records[usize::try_from(c).unwrap()].sequence.clone()],
        "c's record, in the second part"
    );
    let per_key = journal.per_key();
    assert_eq!(per_key["a"], [0, u64::try_from(last).unwrap()]);
    assert_eq!(
        per_key.get("c").map(Vec::as_slice),
        Some(&[c][..]),
        "c's record, in the second part, runs once"
    );
    assert!(
        !per_key.contains_key("b"),
        "b's records are left to b's lane"
    );
    assert_eq!(journal.attempts.lock().unwrap()[&c], 2);
}

/// One handling of a record, as a boxed future.
type Handling = std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>>;

/// A handler that records every record it starts, and never finishes `hangs` on its first
/// `deaths` tries (the invocation is then dropped, as Lambda kills one out of memory or at its
/// time-out: nothing after the handler runs).
fn dying_handler(
    hangs: u64,
    deaths: u32,
) -> (
    Arc<Mutex<Vec<u64>>>,
    impl Fn(Record) -> Handling + Send + Sync + 'static,
) {
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let tries = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let handler = {
        let seen = seen.clone();
        move |record: Record| {
            let n = n_of(&record);
            seen.lock().unwrap().push(n);
            let dies =
                n == hangs && tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < deaths;
            Box::pin(async move {
                if dies {
                    std::future::pending::<()>().await;
                }
                Outcome::ack()
            }) as Handling
        }
    };
    (seen, handler)
}

/// A batch on every delivery of which the invocation dies before it writes anything (out of
/// memory, killed at its time-out) is given up on by a mapping with finite
/// `MaximumRetryAttempts`. Told so, the processor marks the batch's keys before running it:
/// the lane's next batch finds the mark behind it and runs the lost records first, in order.
#[tokio::test]
async fn in_the_partition_key_mode_a_batch_every_invocation_dies_on_is_run_by_the_lanes_next_batch()
{
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
    // a0 b1 a2 b3 | a4 b5
    for (n, key) in ["a", "b", "a", "b", "a", "b"].iter().enumerate() {
        stream.put(key, json!({ "n": n }).to_string());
    }
    let records = stream.records(SHARD);
    // a2 hangs on the batch's two deliveries (MaximumRetryAttempts 1).
    let (seen, handler) = dying_handler(2, 2);
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::by_partition_key(store.clone(), handler).gate(
        Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
            .maximum_retry_attempts(1),
    );
    for delivery_id in ["1", "2"] {
        let dies = tokio::time::timeout(
            Duration::from_millis(300),
            processor.process_batch(
                delivery(&stream, SHARD, 0..4),
                &context(delivery_id, 60_000),
            ),
        )
        .await;
        assert!(dies.is_err(), "the invocation never answers");
    }
    let a = store.read(&row_key(&shard(), "a")).await.unwrap();
    assert_eq!(
        a.reported.map(|mark| mark.to_string()),
        Some(records[0].sequence.clone()),
        "marked before anything ran"
    );
    // The mapping gave up on the batch; the lane goes on with a4 b5.
    let gap = lanes_next_batch_recovers(&processor, delivery(&stream, SHARD, 4..6), "3").await;
    assert_eq!(gap.recovered.len(), 4, "a0 b1 a2 b3 run first");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5],
        "twice started and killed, then every record in order"
    );
    let a = store.read(&row_key(&shard(), "a")).await.unwrap();
    assert_eq!(a.checkpoint, Some(records[4].sequence.clone()));
    assert_eq!(a.reported, None, "the lane is past it");
}

/// The early mark is written on the rows as read; another writer may have written one since
/// (a batch of another lane marking keys it found in a range it read). Refused, the rows are
/// read again and marked once more: a key left unmarked would run, and if the invocation then
/// died and the mapping gave up on the batch, its lane's next batch would find nothing behind it.
#[tokio::test]
async fn in_the_partition_key_mode_a_row_written_by_another_before_the_early_mark_is_read_again_and_marked()
 {
    use common::faults::faulty;
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    use std::sync::atomic::Ordering;
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
    // a0 | a1
    for n in 0..2 {
        stream.put("a", json!({ "n": n }).to_string());
    }
    let records = stream.records(SHARD);
    // a0 hangs on its only delivery (MaximumRetryAttempts 0).
    let (seen, handler) = dying_handler(0, 1);
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    let processor = Processor::by_partition_key(store.clone(), handler).gate(
        Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
            .maximum_retry_attempts(0),
    );
    store
        .layer()
        .rows_written_before_commit_rows
        .store(true, Ordering::SeqCst);
    let dies = tokio::time::timeout(
        Duration::from_millis(300),
        processor.process_batch(delivery(&stream, SHARD, 0..1), &context("1", 60_000)),
    )
    .await;
    assert!(dies.is_err(), "the invocation never answers");
    let a = memory.read(&row_key(&shard(), "a")).await.unwrap();
    assert_eq!(
        a.reported.map(|mark| mark.to_string()),
        Some(records[0].sequence.clone()),
        "marked, on the row as the other writer left it"
    );
    assert_eq!(
        a.lease_counter, 2,
        "the other writer's write, then the mark"
    );
    // The mapping gave up on the batch; the lane goes on with a1.
    let gap = lanes_next_batch_recovers(&processor, delivery(&stream, SHARD, 1..2), "2").await;
    assert_eq!(gap.recovered.len(), 1, "a0 runs first");
    assert_eq!(*seen.lock().unwrap(), [0, 0, 1], "a0 runs again, then a1");
}

/// Delivers `batch`, the lane's next after the mapping gave up on one, and checks that it ran
/// whole after the records it found lost behind it: what it recovered.
async fn lanes_next_batch_recovers<H: kinesis_checkpoint::Handler>(
    processor: &Processor<H, kinesis_checkpoint::PartitionKeyMode>,
    batch: aws_lambda_events::event::kinesis::KinesisEvent,
    delivery_id: &str,
) -> kinesis_checkpoint::gap::GapReport {
    let report = processor
        .process_batch(batch, &context(delivery_id, 60_000))
        .await
        .unwrap();
    let lane = &report.shards[0];
    assert!(lane.stopped.is_none(), "{:?}", lane.stopped);
    let gap = lane.gap.clone().expect("the lost batch is found");
    assert_eq!(gap.outcome, kinesis_checkpoint::gap::GapOutcome::Recovered);
    gap
}

/// Without a mapping that gives up on batches, nothing is written before a batch runs: a
/// batch of a key costs its read and its write, as before.
#[tokio::test]
async fn in_the_partition_key_mode_keys_are_marked_early_only_when_the_mapping_may_give_up() {
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
    for n in 0..4 {
        stream.put("a", json!({ "n": n }).to_string());
    }
    let (seen, handler) = dying_handler(1, 1);
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::by_partition_key(store.clone(), handler).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let dies = tokio::time::timeout(
        Duration::from_millis(300),
        processor.process_batch(delivery(&stream, SHARD, 0..2), &context("1", 60_000)),
    )
    .await;
    assert!(dies.is_err());
    let a = store.read(&row_key(&shard(), "a")).await.unwrap();
    assert_eq!(
        a.lease_counter, 0,
        "nothing written: the mapping never gives up"
    );
    // It delivers the batch again until it is done.
    let report = processor
        .process_batch(delivery(&stream, SHARD, 0..2), &context("2", 60_000))
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_none());
    assert_eq!(*seen.lock().unwrap(), [0, 1, 0, 1]);
}

/// What marking early costs, counted by moto's request recorder on `DynamoDB`: 1,000 records
/// over 100 keys, once with a mapping that never gives up (`MaximumRetryAttempts` -1, no
/// record age) and once with one that does (`Gate::maximum_retry_attempts`): one
/// `TransactWriteItems` more per 100 keys, and none on a redelivery of the batch, whose keys
/// are marked where it comes again already.
#[tokio::test]
async fn in_the_partition_key_mode_marking_early_costs_one_write_per_hundred_keys_and_none_on_a_redelivery()
 {
    use common::moto::{Moto, create_lease_table, unique};
    use kinesis_checkpoint::DynamoLeaseStore;
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    let count = |requests: &[String], operation: &str| {
        requests
            .iter()
            .filter(|target| target.as_str() == format!("DynamoDB_20120810.{operation}"))
            .count()
    };
    let moto = Moto::start(true);
    let config = moto.sdk_config(1).await;
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
    for n in 0..1_000 {
        stream.put(&partition_key(n, 100), json!({ "n": n }).to_string());
    }
    let failing = stream.records(SHARD)[500].sequence.clone();
    let mut figures = Vec::new();
    for discards in [false, true] {
        let table = unique("early");
        create_lease_table(&config, &table).await;
        let store = Arc::new(DynamoLeaseStore::new(&config, &table));
        let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handler = {
            let failing = failing.clone();
            move |record: Record| {
                let retry = record.sequence().as_str() == failing
                    && !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst);
                async move {
                    if retry {
                        Outcome::retry("downstream busy")
                    } else {
                        Outcome::ack()
                    }
                }
            }
        };
        let mut gate = Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon);
        if discards {
            gate = gate.maximum_retry_attempts(2);
        }
        let processor = Processor::by_partition_key(store, handler)
            .concurrency(32)
            .gate(gate);
        let mut costs = Vec::new();
        for (range, request) in [(0..1_000, "failing"), (500..1_000, "redelivered")] {
            moto.start_recording();
            let report = processor
                .process_batch(delivery(&stream, SHARD, range), &context(request, 60_000))
                .await
                .unwrap();
            let requests = moto.stop_recording();
            let expect_reported = request == "failing";
            assert_eq!(report.shards[0].stopped.is_some(), expect_reported);
            costs.push((
                count(&requests, "BatchGetItem"),
                count(&requests, "TransactWriteItems"),
                requests.len(),
            ));
        }
        println!(
            "partition-key mode, 1,000 records over 100 keys, mapping {}: failing batch {} BatchGetItem + {} TransactWriteItems = {}; redelivered half {} + {} = {}",
            if discards {
                "that gives up (marks early)"
            } else {
                "that never gives up"
            },
            costs[0].0,
            costs[0].1,
            costs[0].2,
            costs[1].0,
            costs[1].1,
            costs[1].2,
        );
        figures.push(costs);
    }
    let (never, gives_up) = (&figures[0], &figures[1]);
    assert_eq!(never[0], (2, 1, 3), "reads of 101 rows, one write");
    assert_eq!(
        gives_up[0],
        (2, 2, 4),
        "one write more: the marks, before anything ran"
    );
    assert_eq!(
        never[1], gives_up[1],
        "a redelivery's keys are marked already"
    );
}

/// Loses the answer of the first `commit_rows` (the write lands, the caller sees an error).
#[derive(Default)]
struct LosesFirstAnswer(std::sync::atomic::AtomicBool);

impl kinesis_checkpoint::store::Layer for LosesFirstAnswer {
    fn around<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: kinesis_checkpoint::store::Call<'a>,
        next: kinesis_checkpoint::store::Next<'a, T>,
    ) -> kinesis_checkpoint::BoxFuture<'a, Result<T, kinesis_checkpoint::store::LeaseError>> {
        let rows = matches!(
            call.operation(),
            kinesis_checkpoint::store::Operation::CommitRows
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

/// The early marks' write lands but its answer is lost, so its second try is refused: the rows
/// hold exactly that write (the mark, one counter more), so the batch takes them as its own,
/// runs, and checkpoints, instead of reporting its records to run them again.
#[tokio::test]
async fn in_the_partition_key_mode_early_marks_whose_answer_was_lost_are_taken_as_written() {
    use kinesis_checkpoint::gate::{Gate, StartingPosition};
    use kinesis_checkpoint::store::Layered;
    let stream = kinesis_checkpoint::local::MemoryStream::new(STREAM, 1);
    for n in 0..3 {
        stream.put(&partition_key(n, 2), json!({ "n": n }).to_string());
    }
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(Layered::new(
        memory.clone() as Arc<dyn CheckpointStore>,
        LosesFirstAnswer::default(),
    ));
    let (seen, handler) = dying_handler(u64::MAX, 0);
    let processor = Processor::by_partition_key(store, handler).gate(
        Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
            .maximum_retry_attempts(1),
    );
    let report = processor
        .process_batch(delivery(&stream, SHARD, 0..3), &context("1", 60_000))
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(*seen.lock().unwrap(), [0, 1, 2]);
    let records = stream.records(SHARD);
    let row = memory.read(&row_key(&shard(), "key-0")).await.unwrap();
    assert_eq!(row.checkpoint, Some(records[2].sequence.clone()));
    assert_eq!(row.reported, None, "marked, then cleared by the last write");
}
