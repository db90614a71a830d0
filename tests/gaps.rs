//! Records the event source mapping discarded (finite `MaximumRetryAttempts`,
//! `MaximumRecordAgeInSeconds`, a re-created mapping) are found and run before the next batch:
//! against kinesis-local for the stream and moto for the lease table, both on 127.0.0.1. A
//! discard is what the mapping does next: the following batch simply starts after the records
//! it gave up on, which is how these tests deliver it.

mod common;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use common::kinesis::{KinesisLocal, Stream};
use common::moto::{Moto, create_lease_table, unique};
use common::{batch, context};
use kinesis_checkpoint::gap::{GapOutcome, RangeRead, ReadBudget, SkippedRange};
use kinesis_checkpoint::gate::{
    Gate, KinesisTopology, ShardInfo, StartingPosition, Topology, TopologyError,
};
use kinesis_checkpoint::metrics::Metrics;
use kinesis_checkpoint::report::{Disposition, StopReason};
use kinesis_checkpoint::store::{CheckpointStore, LeaseState};
use kinesis_checkpoint::{
    BatchReport, BoxFuture, DynamoLeaseStore, Handler, LeaseKey, MemoryLeaseStore, Outcome,
    Position, Processor, Record,
};
use serde_json::Value;
use tracing_subscriber::fmt::MakeWriter;

const SHARD: &str = "shardId-000000000000";
const PARENT: &str = "shardId-000000000000";
const LEFT: &str = "shardId-000000000001";
const RIGHT: &str = "shardId-000000000002";

fn kinesis() -> &'static KinesisLocal {
    static SERVER: OnceLock<KinesisLocal> = OnceLock::new();
    SERVER.get_or_init(KinesisLocal::start)
}

/// Every `n` the handler processed, in order; `fail` fails once each.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<u64>>>);

impl Seen {
    fn all(&self) -> Vec<u64> {
        self.0.lock().unwrap().clone()
    }

    fn handler(&self, fail: &[u64]) -> impl Handler + use<> {
        let seen = self.clone();
        let failed: Arc<Mutex<Vec<u64>>> = Arc::default();
        let fail = fail.to_vec();
        move |record: Record| {
            let n = record.json::<Value>().unwrap()["n"].as_u64().unwrap();
            let mut failed = failed.lock().unwrap();
            let outcome = if fail.contains(&n) && !failed.contains(&n) {
                failed.push(n);
                Outcome::retry("downstream unavailable")
            } else {
                seen.0.lock().unwrap().push(n);
                Outcome::ack()
            };
            std::future::ready(outcome)
        }
    }
}

/// A topology that counts every call (every one a Kinesis request), reading through `inner`:
/// Kinesis, or a memory stream; its next `fail_reads` readings of a range fail, as a throttled
/// `GetRecords` would.
struct Counting<T> {
    inner: T,
    calls: AtomicUsize,
    fail_reads: AtomicUsize,
}

impl<T: Topology> Topology for Counting<T> {
    fn shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.shards(stream)
    }

    fn exhausted<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, TopologyError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.exhausted(stream, shard, after)
    }

    fn retention<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.retention(stream)
    }

    fn read_range<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        range: &'a SkippedRange,
        budget: ReadBudget,
    ) -> BoxFuture<'a, Result<RangeRead, TopologyError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .fail_reads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Box::pin(async {
                Err(
                    "ProvisionedThroughputExceededException: GetRecords throttled (injected)"
                        .into(),
                )
            });
        }
        self.inner.read_range(stream, shard, range, budget)
    }
}

struct Setup {
    stream: Stream,
    store: DynamoLeaseStore,
    topology: Arc<Counting<KinesisTopology>>,
}

async fn setup(records_per_page: Option<i32>) -> Setup {
    let moto = Moto::shared().sdk_config(1).await;
    let table = unique("leases");
    create_lease_table(&moto, &table).await;
    let kinesis = common::moto::sdk_config(&kinesis().endpoint, 1).await;
    let mut topology = KinesisTopology::new(&kinesis);
    if let Some(page) = records_per_page {
        topology = topology.records_per_page(page);
    }
    Setup {
        stream: Stream::create(&kinesis, &unique("orders")).await,
        store: DynamoLeaseStore::new(&moto, table),
        topology: Arc::new(Counting {
            inner: topology,
            calls: AtomicUsize::new(0),
            fail_reads: AtomicUsize::new(0),
        }),
    }
}

impl Setup {
    fn processor(&self, handler: impl Handler, metrics: &Lines) -> Processor<impl Handler> {
        let gate = Gate::new(self.topology.clone(), StartingPosition::TrimHorizon);
        Processor::new(Arc::new(self.store.clone()), handler)
            .gate(gate)
            .metrics(metrics.metrics())
    }

    async fn put(&self, key: &str, range: std::ops::Range<u64>) {
        for n in range {
            self.stream.put(key, n).await;
        }
    }

    /// The records `range` (by index) of `shard`, as one delivery.
    async fn delivery(&self, shard: &str, range: std::ops::Range<usize>) -> KinesisEvent {
        let mut event = self.stream.batch(shard).await;
        event.records = event.records.drain(range).collect();
        event
    }

    async fn row(&self, shard: &str) -> LeaseState {
        self.store
            .read(&LeaseKey::new(self.stream.name.as_str(), shard))
            .await
            .unwrap()
    }

    fn kinesis_calls(&self) -> usize {
        self.topology.calls.load(Ordering::SeqCst)
    }
}

/// The embedded-metric lines of the processor, parsed.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn metrics(&self) -> Metrics {
        let lines = Arc::clone(&self.0);
        Metrics::new("GapsTest").sink(Arc::new(move |line: &str| {
            lines.lock().unwrap().push(line.to_owned());
        }))
    }

    fn last(&self) -> Value {
        serde_json::from_str(self.0.lock().unwrap().last().expect("a metrics line")).unwrap()
    }
}

async fn deliver<M: kinesis_checkpoint::processor::CheckpointMode>(
    processor: &Processor<impl Handler, M>,
    event: KinesisEvent,
    request: &str,
) -> BatchReport {
    processor
        .process_batch(event, &context(request, 60_000))
        .await
        .unwrap()
}

fn sequence_of(event: &KinesisEvent, index: usize) -> String {
    event.records[index].kinesis.sequence_number.clone()
}

#[tokio::test]
async fn a_batch_after_a_discarded_range_runs_the_skipped_records_first() {
    let setup = setup(None).await;
    setup.put("customer", 0..10).await;
    let seen = Seen::default();
    let lines = Lines::default();
    let processor = setup.processor(seen.handler(&[3]), &lines);

    let first = setup.delivery(SHARD, 0..10).await;
    let report = deliver(&processor, first.clone(), "a").await;
    assert!(matches!(
        &report.shards[0].stopped,
        Some((sequence, StopReason::Retry(_))) if *sequence.as_str() == sequence_of(&first, 3)
    ));
    let row = setup.row(SHARD).await;
    assert_eq!(
        row.checkpoint.as_deref(),
        Some(sequence_of(&first, 2).as_str())
    );
    assert_eq!(
        row.reported.as_ref().map(ToString::to_string),
        Some(sequence_of(&first, 3)),
        "the row remembers the reported record"
    );
    assert_eq!(row.lease_owner, None);
    assert_eq!(row.failing.as_ref().map(|f| f.attempts), Some(1));

    // The mapping gives up on the batch from record 3: the next one starts at record 10.
    setup.put("customer", 10..15).await;
    let calls = setup.kinesis_calls();
    let next = setup.delivery(SHARD, 10..15).await;
    let report = deliver(&processor, next.clone(), "b").await;

    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(
        seen.all(),
        (0..15).collect::<Vec<_>>(),
        "once each, in order"
    );
    let gap = report.shards[0].gap.as_ref().expect("a gap");
    assert_eq!(gap.outcome, GapOutcome::Recovered);
    assert_eq!(
        gap.range.to_string(),
        format!(
            "after {} up to {}",
            sequence_of(&first, 2),
            sequence_of(&next, 0)
        )
    );
    assert_eq!(gap.recovered.len(), 7, "records 3 to 9");
    assert!(
        gap.recovered
            .iter()
            .all(|r| r.disposition == Disposition::Processed)
    );
    assert_eq!(setup.kinesis_calls(), calls + 1, "one read of the range");
    assert_eq!(lines.last()["Recovered"], 7);
    assert_eq!(lines.last()["Gap"], 1, "one gap proven");
    assert_eq!(lines.last()["Processed"], 5, "the batch's own records");

    let row = setup.row(SHARD).await;
    assert_eq!(
        row.checkpoint.as_deref(),
        Some(sequence_of(&next, 4).as_str())
    );
    assert_eq!(row.reported, None, "nothing is outstanding");
    assert_eq!(row.failing, None, "record 3 is done");
    assert_eq!(row.lease_owner, None);
}

#[tokio::test]
async fn a_held_child_whose_first_batch_was_discarded_recovers_it_once_its_parents_finish() {
    let setup = setup(None).await;
    setup.put("customer", 0..3).await;
    setup.stream.split(PARENT).await;
    setup.put("customer", 3..11).await;
    let child = if setup.stream.batch(LEFT).await.records.is_empty() {
        RIGHT
    } else {
        LEFT
    };
    let seen = Seen::default();
    let lines = Lines::default();
    let processor = setup.processor(seen.handler(&[]), &lines);

    // The child comes first and is held; the mapping gives up on that batch (records 3 to 6),
    // then on the next one (7 and 8).
    let early = setup.delivery(child, 0..4).await;
    let report = deliver(&processor, early.clone(), "c1").await;
    assert!(held(&report));
    assert_eq!(
        setup.row(child).await.reported.map(|r| r.to_string()),
        Some(sequence_of(&early, 0)),
        "the held batch is remembered"
    );
    // Held again with a later batch: the older report is kept, not overwritten.
    let later = setup.delivery(child, 4..6).await;
    assert!(matches!(
        deliver(&processor, later, "c2").await.shards[0].stopped,
        Some((_, StopReason::Held(_)))
    ));
    assert_eq!(
        setup.row(child).await.reported.map(|r| r.to_string()),
        Some(sequence_of(&early, 0))
    );

    assert!(
        deliver(&processor, setup.delivery(PARENT, 0..3).await, "p1")
            .await
            .shards[0]
            .stopped
            .is_none()
    );
    // That batch was given up on too: the mapping goes on with the child's records 9 and 10.
    let report = deliver(&processor, setup.delivery(child, 6..8).await, "c3").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    let gap = report.shards[0].gap.as_ref().expect("a gap");
    assert_eq!(
        gap.range.to_string(),
        format!(
            "from {} up to {}",
            sequence_of(&early, 0),
            sequence_of(&setup.delivery(child, 6..7).await, 0)
        )
    );
    assert_eq!(
        seen.all(),
        (0..11).collect::<Vec<_>>(),
        "once each, in order"
    );
    assert_eq!(lines.last()["Recovered"], 6);
    assert_eq!(setup.row(child).await.reported, None);
}

#[tokio::test]
async fn a_gap_larger_than_one_get_records_page_is_read_page_by_page() {
    let setup = setup(Some(3)).await;
    setup.put("customer", 0..20).await;
    let seen = Seen::default();
    let lines = Lines::default();
    let processor = setup.processor(seen.handler(&[2]), &lines);

    let report = deliver(&processor, setup.delivery(SHARD, 0..20).await, "a").await;
    assert!(matches!(
        report.shards[0].stopped,
        Some((_, StopReason::Retry(_)))
    ));
    // Records 2 to 16 are discarded: 15 records, five pages of three.
    let report = deliver(&processor, setup.delivery(SHARD, 17..20).await, "b").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(report.shards[0].gap.as_ref().unwrap().recovered.len(), 15);
    assert_eq!(
        seen.all(),
        (0..20).collect::<Vec<_>>(),
        "once each, in order"
    );
}

#[tokio::test]
async fn a_normal_batch_makes_no_kinesis_call() {
    let setup = setup(None).await;
    setup.put("customer", 0..12).await;
    let seen = Seen::default();
    let lines = Lines::default();
    let processor = setup.processor(seen.handler(&[5]), &lines);

    // The first batch lists the shards once (the gate's topology is cached per process).
    deliver(&processor, setup.delivery(SHARD, 0..4).await, "warm").await;
    let calls = setup.kinesis_calls();
    let steady = deliver(&processor, setup.delivery(SHARD, 4..8).await, "steady").await;
    assert!(matches!(
        steady.shards[0].stopped,
        Some((_, StopReason::Retry(_)))
    ));
    // Redelivered from the reported record, then duplicates, then the next batch.
    deliver(&processor, setup.delivery(SHARD, 5..10).await, "again").await;
    deliver(&processor, setup.delivery(SHARD, 0..10).await, "duplicate").await;
    deliver(&processor, setup.delivery(SHARD, 10..12).await, "next").await;

    assert_eq!(
        setup.kinesis_calls(),
        calls,
        "no Kinesis call without a gap"
    );
    assert_eq!(seen.all(), (0..12).collect::<Vec<_>>());
    assert_eq!(lines.last()["Recovered"], 0);
}

/// Everything a subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test]
async fn without_a_topology_that_reads_records_a_gap_is_an_error_and_a_metric_and_the_batch_goes_on()
 {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let seen = Seen::default();
    let lines = Lines::default();
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::new(store.clone(), seen.handler(&[3])).metrics(lines.metrics());

    let first = deliver(&processor, batch("orders", SHARD, 0..10), "a").await;
    assert!(first.shards[0].stopped.is_some());
    let report = deliver(&processor, batch("orders", SHARD, 10..12), "b").await;

    assert!(report.shards[0].stopped.is_none(), "the batch goes on");
    assert_eq!(seen.all(), [0, 1, 2, 10, 11]);
    assert_eq!(
        report.shards[0].gap.as_ref().map(|gap| &gap.outcome),
        Some(&GapOutcome::NoReader)
    );
    assert_eq!(lines.last()["Gap"], 1);
    assert_eq!(lines.last()["Recovered"], 0);
    let text = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    let line = text
        .lines()
        .find(|line| line.contains("ERROR") && line.contains("skipped records"))
        .unwrap_or_else(|| panic!("an error line: {text}"));
    for part in [
        "stream=\"orders\"",
        "shard=\"shardId-000000000000\"",
        &format!(
            "range=after {} up to {}",
            common::sequence(2),
            common::sequence(10)
        ),
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
    let row = store.read(&LeaseKey::new("orders", SHARD)).await.unwrap();
    assert_eq!(
        row.checkpoint.as_deref(),
        Some(common::sequence(11).as_str())
    );
    assert_eq!(row.reported, None);
}

/// Runs `stream` through the local event source with `mapping`; the handler fails each record
/// `fails(n)` times first. Returns every `n` processed, in order, and the run's discards.
async fn run_local(
    stream: kinesis_checkpoint_testing::local::MemoryStream,
    mapping: kinesis_checkpoint_testing::local::Mapping,
    fails: impl Fn(u64) -> u32 + Send + Sync + 'static,
) -> (Vec<u64>, Vec<kinesis_checkpoint_testing::local::Discarded>) {
    use kinesis_checkpoint_testing::local::EventSource;
    let (seen, handler) = failing_handler(fails);
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), handler).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let report = EventSource::new(stream, mapping)
        .run(Arc::new(processor))
        .await
        .unwrap();
    (seen.all(), report.discarded)
}

/// A handler that fails each record `fails(n)` times first, and what it processed.
fn failing_handler<F>(fails: F) -> (Seen, impl Handler + use<F>)
where
    F: Fn(u64) -> u32 + Send + Sync + 'static,
{
    let seen = Seen::default();
    let attempts: Arc<Mutex<std::collections::HashMap<u64, u32>>> = Arc::default();
    let handler = {
        let seen = seen.clone();
        move |record: Record| {
            let n = record.json::<Value>().unwrap()["n"].as_u64().unwrap();
            let mut attempts = attempts.lock().unwrap();
            let attempt = attempts.entry(n).or_default();
            *attempt += 1;
            let outcome = if *attempt <= fails(n) {
                Outcome::retry("downstream unavailable")
            } else {
                seen.0.lock().unwrap().push(n);
                Outcome::ack()
            };
            std::future::ready(outcome)
        }
    };
    (seen, handler)
}

/// Every record once, in order per key (`keys` keys, record `n` under `customer-{n % keys}`).
fn assert_all_once_in_order(mut seen: Vec<u64>, total: u64, keys: u64, discarded: usize) {
    for key in 0..keys {
        let of_key: Vec<u64> = seen.iter().copied().filter(|n| n % keys == key).collect();
        assert!(
            of_key.windows(2).all(|pair| pair[0] < pair[1]),
            "customer-{key} out of order: {of_key:?}"
        );
    }
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..total).collect::<Vec<_>>(),
        "every record once ({discarded} discarded by the mapping)"
    );
}

fn orders(stream: &kinesis_checkpoint_testing::local::MemoryStream, range: std::ops::Range<u64>) {
    for n in range {
        stream.put(
            &format!("customer-{}", n % 9),
            serde_json::json!({ "n": n }).to_string(),
        );
    }
}

/// The local event source's `MaximumRetryAttempts` discards, as Lambda's: a batch that keeps
/// failing is given up on and the next one starts after it. Gap recovery reads the skipped
/// records back from the stream, so every record is processed once, in order per key. (The
/// recovered record that fails again makes the mapping give up on the next batch too, and so
/// on until it succeeds: each time the next batch reads on from the checkpoint.)
#[tokio::test]
async fn with_the_local_mappings_retry_discards_every_record_is_recovered_once_in_order() {
    use kinesis_checkpoint_testing::local::{DiscardReason, Mapping, MemoryStream};
    for seed in [1, 2, 3] {
        let stream = MemoryStream::new("orders", 2);
        orders(&stream, 0..400);
        // Every 25th record of the first 200 fails three times: more than the mapping
        // retries. None near a shard's end: a discarded last batch is recovered only by a
        // later batch of its shard, which a stream that stops being written never gets.
        let mapping = Mapping::default()
            .batch_size(20)
            .maximum_retry_attempts(Some(1))
            .duplicate_deliveries(0.1)
            .seed(seed);
        let (seen, discarded) =
            run_local(
                stream,
                mapping,
                |n| {
                    if n < 200 && n % 25 == 0 { 3 } else { 0 }
                },
            )
            .await;
        assert!(
            discarded
                .iter()
                .any(|d| d.reason == DiscardReason::RetriesExhausted),
            "the mapping gave up on batches"
        );
        assert_all_once_in_order(seen, 400, 9, discarded.len());
    }
}

/// The local event source's `MaximumRecordAgeInSeconds` discards, as Lambda's: while a shard
/// is stuck on a failing record, the records behind it grow too old and are given up on one by
/// one, until a young one comes. Gap recovery reads them all back.
#[tokio::test]
async fn with_the_local_mappings_age_discards_every_record_is_recovered_once_in_order() {
    use kinesis_checkpoint_testing::local::{DiscardReason, Mapping, MemoryStream, Shards};
    let stream = MemoryStream::new("orders", 2);
    orders(&stream, 0..100);
    // The next records arrive ten seconds later: young when the first ones are too old, and
    // for a hundred rounds of deliveries after that.
    stream.advance(Duration::from_secs(10));
    orders(&stream, 100..300);
    let mapping = Mapping::default()
        .batch_size(20)
        .maximum_record_age(Some(Duration::from_millis(10_500)))
        .seed(7);
    let (seen, discarded) = run_local(stream, mapping, |n| {
        if [10, 30, 60, 71].contains(&n) { 8 } else { 0 }
    })
    .await;
    assert!(
        discarded.iter().any(|d| d.reason == DiscardReason::TooOld),
        "the mapping gave up on records too old"
    );
    assert_all_once_in_order(seen, 300, 9, discarded.len());
}

/// The records of a memory stream's `shard`, `range` of them, as one delivery.
fn memory_delivery(
    stream: &kinesis_checkpoint_testing::local::MemoryStream,
    shard: &str,
    range: std::ops::Range<usize>,
) -> KinesisEvent {
    memory_delivery_arrived(stream, shard, range, |_| 1_764_512_345.0)
}

/// [`memory_delivery`], each record's arrival (epoch seconds) told by `arrival`.
fn memory_delivery_arrived(
    stream: &kinesis_checkpoint_testing::local::MemoryStream,
    shard: &str,
    range: std::ops::Range<usize>,
    arrival: impl Fn(&kinesis_checkpoint_testing::local::StreamRecord) -> f64,
) -> KinesisEvent {
    use base64::Engine;
    let records: Vec<Value> = stream.records(shard)[range]
        .iter()
        .map(|r| {
            serde_json::json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": r.partition_key,
                    "sequenceNumber": r.sequence,
                    "data": base64::engine::general_purpose::STANDARD.encode(&r.data),
                    "approximateArrivalTimestamp": arrival(r),
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("{shard}:{}", r.sequence),
                "eventName": "aws:kinesis:record",
                "awsRegion": "us-east-1",
                "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
            })
        })
        .collect();
    common::event(&records)
}

/// A KPL aggregate made by `aws-kinesis-agg` (`tests/fixtures/kpl`), as the bytes Kinesis holds.
fn aggregate_bytes(name: &str) -> Vec<u8> {
    use base64::Engine;
    let path = common::root().join(format!("tests/fixtures/kpl/{name}.json"));
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(fixture["data_base64"].as_str().unwrap())
        .unwrap()
}

/// A record the handler saw: its sequence number and sub-sequence.
type Sub = (String, Option<u64>);

#[tokio::test]
async fn a_gap_that_starts_inside_a_kpl_aggregate_runs_its_remaining_sub_records_first() {
    use kinesis_checkpoint_testing::local::MemoryStream;
    let stream = MemoryStream::new("orders", 1);
    stream.put("plain", "p0");
    let aggregate = stream.put("customer", aggregate_bytes("ten_sub_records"));
    for text in ["p2", "p3", "p4"] {
        stream.put("plain", text);
    }
    // Sub-record 4 of the aggregate fails twice.
    let seen: Arc<Mutex<Vec<Sub>>> = Arc::default();
    let handler = {
        let seen = seen.clone();
        let failures = Arc::new(AtomicUsize::new(0));
        move |record: Record| {
            let outcome = if record.sub_sequence() == Some(4)
                && failures.fetch_add(1, Ordering::SeqCst) < 2
            {
                Outcome::retry("downstream unavailable")
            } else {
                seen.lock()
                    .unwrap()
                    .push((record.sequence().to_string(), record.sub_sequence()));
                Outcome::ack()
            };
            std::future::ready(outcome)
        }
    };
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::new(store.clone(), handler).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));

    let first = processor
        .process_batch(memory_delivery(&stream, SHARD, 0..3), &context("a", 60_000))
        .await
        .unwrap();
    assert_eq!(
        first.shards[0].stopped.as_ref().map(|(s, _)| s.to_string()),
        Some(aggregate.clone())
    );
    let row = store.read(&LeaseKey::new("orders", SHARD)).await.unwrap();
    assert_eq!(
        row.reported,
        Some(Position::sub_record(aggregate.parse().unwrap(), 4))
    );
    // The mapping gives up on it; the next batch (p3, p4) finds the gap inside the aggregate,
    // whose sub-record 4 fails again: the batch is reported, the row still names sub-record 4.
    let second = processor
        .process_batch(memory_delivery(&stream, SHARD, 3..5), &context("b", 60_000))
        .await
        .unwrap();
    let p3 = stream.records(SHARD)[3].sequence.clone();
    assert_eq!(
        second.shards[0]
            .stopped
            .as_ref()
            .map(|(s, _)| s.to_string()),
        Some(p3.clone()),
        "{second:?}"
    );
    let gap = second.shards[0].gap.as_ref().expect("a gap");
    assert_eq!(
        gap.range.to_string(),
        format!("from {aggregate} up to {p3}")
    );
    assert_eq!(
        gap.recovered
            .iter()
            .filter(|r| r.disposition == Disposition::Duplicate)
            .count(),
        4,
        "sub-records 0 to 3 were done"
    );
    let third = processor
        .process_batch(memory_delivery(&stream, SHARD, 3..5), &context("c", 60_000))
        .await
        .unwrap();
    assert!(third.shards[0].stopped.is_none(), "{third:?}");

    let records = stream.records(SHARD);
    let mut expected = vec![(records[0].sequence.clone(), None)];
    expected.extend((0..10).map(|sub| (aggregate.clone(), Some(sub))));
    expected.extend(records[2..].iter().map(|r| (r.sequence.clone(), None)));
    assert_eq!(*seen.lock().unwrap(), expected, "once each, in order");
}

/// A skipped range read back from Kinesis goes through the event's own intake: the KPL
/// aggregates in it reach the handler unpacked, each sub-record once, in order.
#[tokio::test]
async fn a_skipped_range_read_back_from_kinesis_unpacks_its_kpl_aggregates() {
    let setup = setup(None).await;
    setup.put("customer", 0..1).await;
    for _ in 0..2 {
        let aggregate = aggregate_bytes("ten_sub_records");
        setup.stream.put_bytes("aggregate", aggregate).await;
    }
    setup.put("customer", 3..5).await;
    // Sub-record 2 of the first aggregate asks for a retry once.
    let seen: Arc<Mutex<Vec<Sub>>> = Arc::default();
    let handler = {
        let seen = seen.clone();
        let failed = Arc::new(AtomicUsize::new(0));
        move |record: Record| {
            let first = record.sub_sequence() == Some(2) && seen.lock().unwrap().len() == 3;
            let outcome = if first && failed.fetch_add(1, Ordering::SeqCst) == 0 {
                Outcome::retry("downstream unavailable")
            } else {
                seen.lock()
                    .unwrap()
                    .push((record.sequence().to_string(), record.sub_sequence()));
                Outcome::ack()
            };
            std::future::ready(outcome)
        }
    };
    let processor = setup.processor(handler, &Lines::default());
    let whole = setup.delivery(SHARD, 0..5).await;
    let report = deliver(&processor, whole.clone(), "a").await;
    assert!(report.shards[0].stopped.is_some(), "{report:?}");
    // The mapping gives up on the batch; the next one starts at record 3.
    let report = deliver(&processor, setup.delivery(SHARD, 3..5).await, "b").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(
        report.shards[0].gap.as_ref().map(|gap| gap.outcome.clone()),
        Some(GapOutcome::Recovered)
    );
    let sequences: Vec<String> = (0..5).map(|index| sequence_of(&whole, index)).collect();
    let mut expected = vec![(sequences[0].clone(), None)];
    for aggregate in &sequences[1..3] {
        expected.extend((0..10).map(|sub| (aggregate.clone(), Some(sub))));
    }
    expected.extend(
        sequences[3..]
            .iter()
            .map(|sequence| (sequence.clone(), None)),
    );
    assert_eq!(
        *seen.lock().unwrap(),
        expected,
        "once each, in order, unpacked"
    );
}

#[tokio::test]
async fn a_batch_cut_by_the_deadline_is_remembered_and_its_skipped_rest_recovered() {
    use kinesis_checkpoint_testing::local::MemoryStream;
    let stream = MemoryStream::new("orders", 1);
    for n in 0..8_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    let seen = Seen::default();
    let handler = {
        let seen = seen.clone();
        move |record: Record| {
            let seen = seen.clone();
            async move {
                let n = record.json::<Value>().unwrap()["n"].as_u64().unwrap();
                if n == 1 {
                    // Runs into the deadline (its margin included) of a short invocation.
                    tokio::time::sleep(Duration::from_millis(700)).await;
                }
                seen.0.lock().unwrap().push(n);
                Outcome::ack()
            }
        }
    };
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::new(store.clone(), handler).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));

    let first = processor
        .process_batch(memory_delivery(&stream, SHARD, 0..5), &context("a", 1_500))
        .await
        .unwrap();
    let one = stream.records(SHARD)[1].sequence.clone();
    assert!(
        matches!(
            &first.shards[0].stopped,
            Some((at, StopReason::Deadline | StopReason::HandlerTimedOut)) if at.to_string() == one
        ),
        "{first:?}"
    );
    let row = store.read(&LeaseKey::new("orders", SHARD)).await.unwrap();
    assert_eq!(row.reported.map(|r| r.to_string()), Some(one));
    // The mapping gives up on records 1 to 4; the next batch holds 5 to 7.
    let next = processor
        .process_batch(memory_delivery(&stream, SHARD, 5..8), &context("b", 60_000))
        .await
        .unwrap();
    assert!(next.shards[0].stopped.is_none(), "{next:?}");
    assert_eq!(next.shards[0].gap.as_ref().unwrap().recovered.len(), 4);
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "once each, in order"
    );
}

/// Deliveries of a two-record-batch memory stream's shard 0, and a processor over it on the
/// memory store whose handler notes every `n`.
fn lingering_setup() -> (
    kinesis_checkpoint_testing::local::MemoryStream,
    Arc<MemoryLeaseStore>,
    Seen,
    Processor<impl Handler + use<>>,
) {
    let stream = kinesis_checkpoint_testing::local::MemoryStream::new("orders", 1);
    orders(&stream, 0..6);
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(&[])).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    (stream, store, seen, processor)
}

#[tokio::test]
async fn a_batch_an_invocation_died_on_and_the_mapping_gave_up_on_is_recovered_by_the_next() {
    let (stream, store, seen, processor) = lingering_setup();
    let key = LeaseKey::new("orders", SHARD);
    // The invocation of records 0 and 1 claims the shard and dies before any other write (out
    // of memory, killed at its timeout): all the row learns is the claim.
    let first = Position::record(stream.records(SHARD)[0].sequence.parse().unwrap());
    let claim = store
        .acquire_and_read(&key, "dead", Duration::from_millis(1), Some(&first))
        .await
        .unwrap();
    assert!(matches!(
        claim,
        kinesis_checkpoint::internal::Claim::Acquired { .. }
    ));
    tokio::time::sleep(Duration::from_millis(5)).await;
    // The mapping gives up on that batch; the next one starts at record 2.
    let report = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 2..4),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(
        report.shards[0].gap.is_some(),
        "the claim's mark proves the gap"
    );
    assert_eq!(
        seen.all(),
        [0, 1, 2, 3],
        "the skipped batch runs first, once, in order"
    );
}

/// A memory stream whose shard 0 holds records 0 to 3 of one key and is then split; the key's
/// records 4 to 7 go to the child that returns. A processor over it on the memory store.
fn split_setup(
    fail: &[u64],
) -> (
    kinesis_checkpoint_testing::local::MemoryStream,
    Arc<MemoryLeaseStore>,
    Seen,
    Processor<impl Handler + use<>>,
    String,
) {
    let stream = kinesis_checkpoint_testing::local::MemoryStream::new("orders", 1);
    for n in 0..4_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    stream.split(SHARD);
    for n in 4..8_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    let child = stream.shard_of("customer");
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(fail)).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    (stream, store, seen, processor, child)
}

/// The documented mapping never gives up: a child delivered while its parent retries a record
/// waits, and its invocation runs none of the parent's records; the mapping delivers them.
#[tokio::test]
async fn a_child_delivered_while_its_parent_retries_a_record_waits_and_runs_none_of_the_parents_records()
 {
    let (stream, _store, seen, processor, child) = split_setup(&[2]);
    let parent = processor
        .process_batch(
            memory_delivery(&stream, PARENT, 0..4),
            &context("p1", 60_000),
        )
        .await
        .unwrap();
    assert!(
        parent.shards[0].stopped.is_some(),
        "record 2 asks for a retry"
    );
    for attempt in ["c1", "c2"] {
        let report = processor
            .process_batch(
                memory_delivery(&stream, &child, 0..4),
                &context(attempt, 60_000),
            )
            .await
            .unwrap();
        assert!(held(&report));
        assert!(report.shards[0].gap.is_none(), "{report:?}");
        assert_eq!(
            seen.all(),
            [0, 1],
            "the parent's records wait for the mapping"
        );
    }
    processor
        .process_batch(
            memory_delivery(&stream, PARENT, 2..4),
            &context("p2", 60_000),
        )
        .await
        .unwrap();
    let report = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c3", 60_000),
        )
        .await
        .unwrap();
    assert!(!held(&report), "{report:?}");
    assert_eq!(seen.all(), [0, 1, 2, 3, 4, 5, 6, 7]);
}

/// Whether the report's first shard was held back (by its parents).
fn held(report: &BatchReport) -> bool {
    matches!(&report.shards[0].stopped, Some((_, StopReason::Held(_))))
}
