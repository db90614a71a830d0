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
use kinesis_checkpoint::store::{CheckpointStore, LeaseState, LeaseStore};
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

    fn processor_by_key(
        &self,
        handler: impl Handler,
        metrics: &Lines,
    ) -> Processor<impl Handler, kinesis_checkpoint::PartitionKeyMode> {
        let gate = Gate::new(self.topology.clone(), StartingPosition::TrimHorizon);
        Processor::by_partition_key(Arc::new(self.store.clone()), handler)
            .gate(gate)
            .metrics(metrics.metrics())
    }

    /// A partition key's row in `shard`.
    async fn key_row(&self, shard: &str, partition_key: &str) -> LeaseState {
        let shard = LeaseKey::new(self.stream.name.as_str(), shard);
        self.store
            .read(&kinesis_checkpoint::store::row_key(&shard, partition_key))
            .await
            .unwrap()
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
    assert_eq!(lines.last()["Gap"], 0);
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

/// The partition-key mode against Kinesis and `DynamoDB`: a lane's batch holds keys a and b;
/// a fails at record 2, b is done. The mapping gives up on the batch, and its next batch holds
/// only b's later records. b's row marks where the lane was reported (record 2), behind that
/// batch: the range is read once, and a's records in it (a's row carries the same mark) run
/// first, in order; b's, done already, are not run again. A normal batch after that reads
/// nothing from Kinesis.
#[tokio::test]
async fn in_the_partition_key_mode_a_lane_batch_given_up_on_is_run_when_a_key_of_it_comes_back() {
    let setup = setup(None).await;
    for n in 0..6 {
        setup
            .stream
            .put(if n % 2 == 0 { "a" } else { "b" }, n)
            .await;
    }
    let seen = Seen::default();
    let lines = Lines::default();
    let processor = setup.processor_by_key(seen.handler(&[2]), &lines);

    let first = setup.delivery(SHARD, 0..6).await;
    let report = deliver(&processor, first.clone(), "k1").await;
    assert!(matches!(
        &report.shards[0].stopped,
        Some((sequence, StopReason::Retry(_))) if *sequence.as_str() == sequence_of(&first, 2)
    ));
    assert_eq!(seen.all(), [0, 1, 3, 5]);
    let mark = Some(sequence_of(&first, 2));
    for key in ["a", "b"] {
        let row = setup.key_row(SHARD, key).await;
        assert_eq!(
            row.reported.as_ref().map(ToString::to_string),
            mark,
            "{key}'s row marks where the lane was reported"
        );
    }

    // The mapping gave up on records 2 to 5; its next batch of the lane holds b's 6 and 7.
    setup.stream.put("b", 6).await;
    setup.stream.put("b", 7).await;
    let calls = setup.kinesis_calls();
    let next = setup.delivery(SHARD, 6..8).await;
    let report = deliver(&processor, next, "k2").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(
        seen.all(),
        [0, 1, 3, 5, 2, 4, 6, 7],
        "a's skipped records first"
    );
    let gap = report.shards[0].gap.as_ref().expect("a gap");
    assert_eq!(gap.outcome, GapOutcome::Recovered);
    assert_eq!(
        gap.recovered
            .iter()
            .map(|r| r.position.to_string())
            .collect::<Vec<_>>(),
        [sequence_of(&first, 2), sequence_of(&first, 4)],
        "a's records only: b's were done"
    );
    assert_eq!(setup.kinesis_calls(), calls + 1, "one read of the range");
    assert_eq!(lines.last()["Recovered"], 2);
    let a = setup.key_row(SHARD, "a").await;
    assert_eq!(a.checkpoint, Some(sequence_of(&first, 4)));
    assert_eq!((a.failing, a.reported), (None, None), "a is settled");
    assert_eq!(setup.key_row(SHARD, "b").await.reported, None);

    setup.stream.put("b", 8).await;
    let calls = setup.kinesis_calls();
    let report = deliver(&processor, setup.delivery(SHARD, 8..9).await, "k3").await;
    assert!(report.shards[0].stopped.is_none() && report.shards[0].gap.is_none());
    assert_eq!(setup.kinesis_calls(), calls, "a normal batch reads nothing");
    assert_eq!(seen.all(), [0, 1, 3, 5, 2, 4, 6, 7, 8]);
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
    stream: kinesis_checkpoint::local::MemoryStream,
    mapping: kinesis_checkpoint::local::Mapping,
    fails: impl Fn(u64) -> u32 + Send + Sync + 'static,
) -> (Vec<u64>, Vec<kinesis_checkpoint::local::Discarded>) {
    use kinesis_checkpoint::local::EventSource;
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

/// [`run_local`] in the partition-key mode, whose gate knows the mapping's record age limit.
async fn run_local_by_key(
    stream: kinesis_checkpoint::local::MemoryStream,
    mapping: kinesis_checkpoint::local::Mapping,
    fails: impl Fn(u64) -> u32 + Send + Sync + 'static,
) -> (Vec<u64>, Vec<kinesis_checkpoint::local::Discarded>) {
    use kinesis_checkpoint::local::EventSource;
    let (seen, handler) = failing_handler(fails);
    let mut gate = Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon);
    if let Some(age) = mapping.maximum_record_age {
        gate = gate.maximum_record_age(age);
    }
    let processor =
        Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), handler).gate(gate);
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

fn orders(stream: &kinesis_checkpoint::local::MemoryStream, range: std::ops::Range<u64>) {
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
    use kinesis_checkpoint::local::{DiscardReason, Mapping, MemoryStream};
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
    use kinesis_checkpoint::local::{DiscardReason, Mapping, MemoryStream, Shards};
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

/// The partition-key mode under `MaximumRetryAttempts` and a `ParallelizationFactor` of 4: a
/// lane's batch that keeps failing is given up on, and the next batch of a key that was in it
/// finds the key's mark behind it, reads the range back and runs the lane's keys' records
/// first. Every record once, in order per key.
#[tokio::test]
async fn in_the_partition_key_mode_with_retry_discards_every_record_is_recovered_once_in_order() {
    use kinesis_checkpoint::local::{DiscardReason, Mapping, MemoryStream};
    for seed in [1, 2, 3] {
        let stream = MemoryStream::new("orders", 2);
        orders(&stream, 0..400);
        // Records of the first half fail more often than the mapping retries; every key
        // has records after them, as in a stream written on.
        let mapping = Mapping::default()
            .batch_size(20)
            .parallelization_factor(4)
            .maximum_retry_attempts(Some(1))
            .duplicate_deliveries(0.1)
            .seed(seed);
        let (seen, discarded) =
            run_local_by_key(
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

/// The partition-key mode under `MaximumRecordAgeInSeconds` and a `ParallelizationFactor` of
/// 3: while a lane is stuck on a failing record, its records behind grow too old and are
/// dropped, some never delivered at all; the keys' marks, and the age of the lane's next
/// batch, bring them all back.
#[tokio::test]
async fn in_the_partition_key_mode_with_age_discards_every_record_is_recovered_once_in_order() {
    use kinesis_checkpoint::local::{DiscardReason, Mapping, MemoryStream, Shards};
    let stream = MemoryStream::new("orders", 2);
    orders(&stream, 0..100);
    stream.advance(Duration::from_secs(10));
    orders(&stream, 100..300);
    let mapping = Mapping::default()
        .batch_size(20)
        .parallelization_factor(3)
        .maximum_record_age(Some(Duration::from_millis(10_500)))
        .seed(7);
    let (seen, discarded) = run_local_by_key(stream, mapping, |n| {
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
    stream: &kinesis_checkpoint::local::MemoryStream,
    shard: &str,
    range: std::ops::Range<usize>,
) -> KinesisEvent {
    memory_delivery_arrived(stream, shard, range, |_| 1_764_512_345.0)
}

/// [`memory_delivery`], each record's arrival (epoch seconds) told by `arrival`.
fn memory_delivery_arrived(
    stream: &kinesis_checkpoint::local::MemoryStream,
    shard: &str,
    range: std::ops::Range<usize>,
    arrival: impl Fn(&kinesis_checkpoint::local::StreamRecord) -> f64,
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
    use kinesis_checkpoint::local::MemoryStream;
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

#[tokio::test]
async fn a_batch_cut_by_the_deadline_is_remembered_and_its_skipped_rest_recovered() {
    use kinesis_checkpoint::local::MemoryStream;
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
    kinesis_checkpoint::local::MemoryStream,
    Arc<MemoryLeaseStore>,
    Seen,
    Processor<impl Handler + use<>>,
) {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
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
        kinesis_checkpoint::store::Claim::Acquired(_)
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

#[tokio::test]
async fn a_batch_turned_away_by_a_lingering_lease_and_given_up_on_is_recovered_by_the_next() {
    let (stream, store, seen, processor) = lingering_setup();
    let key = LeaseKey::new("orders", SHARD);
    // An earlier invocation did records 0 and 1, but its release did not land: its lease lingers.
    let done = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 0..2),
            &context("done", 60_000),
        )
        .await
        .unwrap();
    assert_eq!(done.shards[0].stopped, None);
    assert!(
        store
            .acquire(&key, "lingering", Duration::from_millis(300))
            .await
            .unwrap()
    );
    // Records 2 and 3 are turned away by it, until the mapping gives up on them.
    let turned_away = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 2..4),
            &context("away", 60_000),
        )
        .await
        .unwrap();
    assert!(matches!(
        turned_away.shards[0].stopped,
        Some((_, StopReason::LeaseHeld { .. }))
    ));
    let row = CheckpointStore::read(store.as_ref(), &key).await.unwrap();
    assert_eq!(
        row.contended.map(|p| p.to_string()),
        Some(stream.records(SHARD)[2].sequence.clone()),
        "the batch turned away is remembered without the lease"
    );
    assert_eq!(row.lease_owner.as_deref(), Some("lingering"));
    // The lease lapses; the next batch starts at record 4.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 4..6),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(
        next.shards[0].gap.is_some(),
        "the contended mark proves the gap"
    );
    assert_eq!(seen.all(), [0, 1, 2, 3, 4, 5]);
}

/// The partition-key mode: a lane's batch turned away by a live lease on the shard (a seed-crate
/// consumer's, or a child's invocation running this closed parent's tail) runs nothing and is
/// reported at its first record; the mapping, with no retries, gives up on it. Its keys are
/// marked there, as for a batch the gate holds, so the lane's next batch reads the range and
/// runs those records first. Unmarked, that batch moved the keys' checkpoints past them (seed
/// 7023668 of the invariant scenarios: a record neither processed nor dead-lettered).
#[tokio::test]
async fn in_the_partition_key_mode_a_batch_turned_away_by_a_live_shard_lease_and_given_up_on_is_recovered_by_the_next()
 {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    for n in 0..6_u64 {
        stream.put(
            &format!("customer-{}", n % 2),
            serde_json::json!({ "n": n }).to_string(),
        );
    }
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let gate = Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
        .maximum_retry_attempts(0);
    let processor = Processor::by_partition_key(store.clone(), seen.handler(&[])).gate(gate);
    done_then_turned_away(
        store.as_ref(),
        &processor,
        &stream,
        2..4,
        Duration::from_millis(300),
    )
    .await;
    let key = LeaseKey::new("orders", SHARD);
    let first_away = stream.records(SHARD)[2].sequence.clone();
    for customer in ["customer-0", "customer-1"] {
        let row = CheckpointStore::read(
            store.as_ref(),
            &kinesis_checkpoint::store::row_key(&key, customer),
        )
        .await
        .unwrap();
        assert_eq!(
            row.reported.map(|mark| mark.to_string()),
            Some(first_away.clone()),
            "{customer}'s row marks where the lane was turned away"
        );
        assert_eq!(
            row.checkpoint,
            Some(
                stream.records(SHARD)[usize::from(customer == "customer-1")]
                    .sequence
                    .clone()
            ),
            "{customer}'s checkpoint is where the first batch left it"
        );
    }
    assert_eq!(seen.all(), [0, 1], "nothing of the batch turned away ran");
    // The lease lapses; the mapping gave up on records 2 and 3, and the lane's next batch holds
    // both keys' later records.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 4..6),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert_eq!(next.shards[0].stopped, None, "{next:?}");
    assert!(
        next.shards[0].gap.is_some(),
        "the keys' marks prove the gap"
    );
    assert_eq!(
        seen.all(),
        [0, 1, 2, 3, 4, 5],
        "the records turned away run first, once, in order"
    );
}

/// A shard that merely lags (a slow handler, nothing failing) reports nothing, so when the
/// mapping drops its oldest records for `MaximumRecordAgeInSeconds` no row remembers them. The
/// batch that comes next starts with a record nearly as old as the limit: the processor, told
/// the mapping's limit through its gate, reads from the checkpoint up to that batch and runs
/// what it finds first. On virtual time: the records are written ten milliseconds apart, the
/// handler takes thirty milliseconds a record for the first sixty, and nothing waits really.
#[tokio::test(start_paused = true)]
async fn a_lagging_shard_whose_oldest_records_age_out_unreported_has_them_read_back_and_run() {
    use kinesis_checkpoint::clock::{Clock, TokioClock};
    use kinesis_checkpoint::local::{DiscardReason, EventSource, Mapping, MemoryStream};
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
    let stream = MemoryStream::new("orders", 1).clock(clock.clone());
    for n in 0..200 {
        orders(&stream, n..n + 1);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seen = Seen::default();
    let handler = {
        let seen = seen.clone();
        move |record: Record| {
            let seen = seen.clone();
            async move {
                let n = record.json::<Value>().unwrap()["n"].as_u64().unwrap();
                if n < 60 {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                seen.0.lock().unwrap().push(n);
                Outcome::ack()
            }
        }
    };
    let limit = Duration::from_secs(3);
    let processor = Processor::new(
        Arc::new(MemoryLeaseStore::with_clock(clock.clone())),
        handler,
    )
    .clock(clock.clone())
    .gate(
        Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
            .clock(clock.clone())
            .maximum_record_age(limit),
    );
    let mapping = Mapping::default()
        .batch_size(10)
        .maximum_record_age(Some(limit))
        .seed(3);
    let report = EventSource::new(stream, mapping)
        .clock(clock)
        .run(Arc::new(processor))
        .await
        .unwrap();
    assert!(
        report
            .discarded
            .iter()
            .any(|d| d.reason == DiscardReason::TooOld),
        "the mapping dropped records too old: {:?}",
        report.discarded
    );
    assert_eq!(
        report.partial_failures, 0,
        "nothing failed, nothing was reported"
    );
    assert_all_once_in_order(seen.all(), 200, 9, report.discarded.len());
}

#[tokio::test]
async fn a_batch_whose_claim_the_store_refused_and_the_mapping_gave_up_on_is_recovered_by_the_next()
{
    refused_claim(false).await;
}

/// The same, the reading of the row after the refused claim and the mark after it each
/// refused once too (throttled): a mapping with no retries delivers the batch only once, and
/// nothing remembered it (seed 202189 of the invariant scenarios lost a closed parent's first
/// batch so). Both are now tried again once.
#[tokio::test]
async fn a_batch_whose_claim_and_the_read_and_mark_after_it_were_each_refused_once_is_still_remembered()
 {
    refused_claim(true).await;
}

/// Records 0 and 1 done; every claim of 2 and 3 refused, and with `refused_once` the read and
/// the mark after the claim each refused once; the mapping gives up on them and delivers 4 and 5.
async fn refused_claim(refused_once: bool) {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    orders(&stream, 0..6);
    let store = Arc::new(common::faults::faulty(Arc::new(MemoryLeaseStore::new())));
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(&[])).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let key = LeaseKey::new("orders", SHARD);
    let done = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 0..2),
            &context("done", 60_000),
        )
        .await
        .unwrap();
    assert_eq!(done.shards[0].stopped, None);
    // Every claim of records 2 and 3 is throttled (its mark of the batch never lands), until
    // the mapping gives up on them.
    store.layer().claim_fails.store(true, Ordering::SeqCst);
    if refused_once {
        store.layer().reads_fail.store(1, Ordering::SeqCst);
        store.layer().marks_fail.store(1, Ordering::SeqCst);
    }
    let refused = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 2..4),
            &context("refused", 60_000),
        )
        .await
        .unwrap();
    assert!(matches!(
        refused.shards[0].stopped,
        Some((_, StopReason::Store(_)))
    ));
    let row = CheckpointStore::read(store.as_ref(), &key).await.unwrap();
    assert_eq!(
        row.contended.map(|p| p.to_string()),
        Some(stream.records(SHARD)[2].sequence.clone()),
        "the batch whose claim was refused is remembered by a write after it"
    );
    store.layer().claim_fails.store(false, Ordering::SeqCst);
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 4..6),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(next.shards[0].gap.is_some(), "the mark proves the gap");
    assert_eq!(seen.all(), [0, 1, 2, 3, 4, 5], "once each, in order");
}

#[tokio::test]
async fn records_after_a_seed_consumers_checkpoint_past_the_reported_record_are_recovered_when_the_mapping_gave_up_on_them()
 {
    after_a_seed_consumers_checkpoint(false).await;
}

/// The same, with the first delivery of the batch after the gap unable to read it (a throttled
/// `GetRecords`): it runs nothing. It marked its own first record as reported, over the row's
/// `reported` the seed consumer had passed, which was what proved the gap; its redelivery then
/// started at the reported record and found none, and records 4 and 5 were lost (seed 126940 of
/// the invariant scenarios). Now a batch that runs nothing leaves such a row's marks as they
/// are.
#[tokio::test]
async fn a_batch_after_a_seed_consumers_checkpoint_that_cannot_read_the_gap_keeps_it_proven_for_its_redelivery()
 {
    after_a_seed_consumers_checkpoint(true).await;
}

/// Records 0 to 3 delivered, record 2 failing; a seed-crate consumer takes the shard over and
/// checkpoints 3; the mapping gives up on records 2 to 5, and delivers 6 and 7, whose first
/// reading of the gap fails when `read_fails`.
async fn after_a_seed_consumers_checkpoint(read_fails: bool) {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    orders(&stream, 0..8);
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let topology = Arc::new(Counting {
        inner: stream.clone(),
        calls: AtomicUsize::new(0),
        fail_reads: AtomicUsize::new(0),
    });
    let processor = Processor::new(store.clone(), seen.handler(&[2]))
        .gate(Gate::new(topology.clone(), StartingPosition::TrimHorizon));
    let key = LeaseKey::new("orders", SHARD);
    let reported = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 0..4),
            &context("first", 60_000),
        )
        .await
        .unwrap();
    assert!(reported.shards[0].stopped.is_some(), "record 2 is reported");
    // A seed-crate consumer takes the shard over, runs records 2 and 3 and checkpoints 3 with
    // the seed's methods, knowing nothing of `reported`.
    assert!(
        store
            .acquire(&key, "seed", Duration::from_secs(30))
            .await
            .unwrap()
    );
    seen.0.lock().unwrap().extend([2, 3]);
    let third = stream.records(SHARD)[3].sequence.clone();
    assert!(store.checkpoint(&key, "seed", &third).await.unwrap());
    store.release(&key, "seed").await.unwrap();
    // Meanwhile the mapping gave up on records 2 to 5; its next batch starts at 6.
    if read_fails {
        topology.fail_reads.store(1, Ordering::SeqCst);
        let unread = processor
            .process_batch(
                memory_delivery(&stream, SHARD, 6..8),
                &context("unread", 60_000),
            )
            .await
            .unwrap();
        assert!(unread.shards[0].stopped.is_some(), "{unread:?}");
        assert_eq!(seen.all(), [0, 1, 2, 3], "nothing ran");
        let row = CheckpointStore::read(store.as_ref(), &key).await.unwrap();
        assert_eq!(
            row.reported.as_ref().map(ToString::to_string),
            Some(stream.records(SHARD)[2].sequence.clone()),
            "the passed mark stays, and still proves the gap"
        );
    }
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 6..8),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(next.shards[0].gap.is_some(), "{next:?}");
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "once each, in order"
    );
}

#[tokio::test]
async fn a_batch_turned_away_after_a_seed_consumer_did_part_of_it_is_remembered_above_its_checkpoint()
 {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    orders(&stream, 0..8);
    let store = Arc::new(common::faults::faulty(Arc::new(MemoryLeaseStore::new())));
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(&[])).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let key = LeaseKey::new("orders", SHARD);
    let done = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 0..2),
            &context("done", 60_000),
        )
        .await
        .unwrap();
    assert_eq!(done.shards[0].stopped, None);
    // A seed-crate consumer runs records 2 and 3 and checkpoints 3.
    assert!(
        store
            .acquire(&key, "seed", Duration::from_secs(30))
            .await
            .unwrap()
    );
    seen.0.lock().unwrap().extend([2, 3]);
    let third = stream.records(SHARD)[3].sequence.clone();
    assert!(store.checkpoint(&key, "seed", &third).await.unwrap());
    store.release(&key, "seed").await.unwrap();
    // The mapping's batch of records 2 to 5 finds its claim refused, until it gives up on it.
    store.layer().claim_fails.store(true, Ordering::SeqCst);
    let refused = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 2..6),
            &context("refused", 60_000),
        )
        .await
        .unwrap();
    assert!(refused.shards[0].stopped.is_some());
    let row = CheckpointStore::read(store.as_ref(), &key).await.unwrap();
    assert_eq!(
        row.contended.map(|p| p.to_string()),
        Some(stream.records(SHARD)[4].sequence.clone()),
        "the batch's first record not done is remembered, not one below the checkpoint"
    );
    store.layer().claim_fails.store(false, Ordering::SeqCst);
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 6..8),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(next.shards[0].gap.is_some(), "{next:?}");
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "once each, in order"
    );
}

/// Batches turned away by a seed consumer's live lease, which checkpointed past the first of
/// them meanwhile: the `contended` mark at or below its checkpoint proves the gap (the next
/// batch after the checkpoint is read from it), and the next batch turned away wrote its own
/// first record over it, so its redelivery found no gap and records 3 and 4 were passed (seed
/// 44647 of the invariant scenarios). Now a batch turned away keeps such a mark.
#[tokio::test]
async fn a_batch_turned_away_after_a_seed_consumer_passed_the_contended_mark_keeps_the_proof() {
    let store = Arc::new(MemoryLeaseStore::new());
    let (stream, _, seen, processor) = contended_setup(store.clone());
    let key = LeaseKey::new("orders", SHARD);
    let records = stream.records(SHARD);
    // A seed consumer takes the shard; the mapping's batch of 2 to 4 is turned away.
    done_then_turned_away(
        store.as_ref(),
        &processor,
        &stream,
        2..5,
        Duration::from_secs(30),
    )
    .await;
    // The seed consumer runs record 2 and checkpoints it, past the mark; the mapping gives up
    // on 2 to 4, and its batch of 5 and 6 is turned away too.
    seen.0.lock().unwrap().push(2);
    assert!(
        store
            .checkpoint(&key, "seed", &records[2].sequence)
            .await
            .unwrap()
    );
    let again = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 5..7),
            &context("again", 60_000),
        )
        .await
        .unwrap();
    assert!(again.shards[0].stopped.is_some());
    let row = CheckpointStore::read(store.as_ref(), &key).await.unwrap();
    assert_eq!(
        row.contended.map(|p| p.to_string()),
        Some(records[2].sequence.clone()),
        "the passed mark stays, and still proves the gap"
    );
    store.release(&key, "seed").await.unwrap();
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 5..7),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(next.shards[0].gap.is_some(), "{next:?}");
    assert_eq!(
        seen.all(),
        (0..7).collect::<Vec<_>>(),
        "once each, in order"
    );
}

/// Under a `TRIM_HORIZON` mapping with a record age, a shard's first delivery may come after
/// the mapping dropped its oldest records for their age: the record the row marks (here the
/// batch whose claim was refused, `contended`) is then not where the shard starts. A gap the
/// mark proves on a shard never checkpointed is read from the shard's start.
#[tokio::test(start_paused = true)]
async fn a_shard_whose_first_records_aged_out_before_its_first_delivery_has_them_read_from_its_start()
 {
    use kinesis_checkpoint::clock::{Clock, TokioClock};
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1).clock(clock.clone());
    orders(&stream, 0..6);
    let memory = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
    let store = Arc::new(common::faults::faulty(memory));
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(&[]))
        .clock(clock.clone())
        .gate(
            Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
                .clock(clock)
                .maximum_record_age(Duration::from_mins(1)),
        );
    // Records 0 and 1 were dropped for their age before the mapping delivered anything; every
    // claim of its first delivery (2 and 3) is throttled, until it gives up on them too.
    store.layer().claim_fails.store(true, Ordering::SeqCst);
    let refused = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 2..4),
            &context("refused", 60_000),
        )
        .await
        .unwrap();
    assert!(matches!(
        refused.shards[0].stopped,
        Some((_, StopReason::Store(_)))
    ));
    store.layer().claim_fails.store(false, Ordering::SeqCst);
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 4..6),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(next.shards[0].gap.is_some(), "the mark proves the gap");
    assert_eq!(seen.all(), [0, 1, 2, 3, 4, 5], "once each, in order");
}

/// A memory stream whose shard 0 holds records 0 to 3 of one key and is then split; the key's
/// records 4 to 7 go to the child that returns. A processor over it on the memory store.
fn split_setup(
    fail: &[u64],
) -> (
    kinesis_checkpoint::local::MemoryStream,
    Arc<MemoryLeaseStore>,
    Seen,
    Processor<impl Handler + use<>>,
    String,
) {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
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

#[tokio::test]
async fn a_child_held_by_a_closed_parent_whose_last_batch_the_mapping_gave_up_on_runs_the_parents_tail_first()
 {
    let (stream, store, seen, processor, child) = split_setup(&[2]);
    let done = processor
        .process_batch(
            memory_delivery(&stream, PARENT, 0..2),
            &context("p1", 60_000),
        )
        .await
        .unwrap();
    assert!(done.shards[0].stopped.is_none());
    // Record 2 fails; the mapping gives up on the parent's last batch and never delivers the
    // parent again.
    let failed = processor
        .process_batch(
            memory_delivery(&stream, PARENT, 2..4),
            &context("p2", 60_000),
        )
        .await
        .unwrap();
    assert!(failed.shards[0].stopped.is_some());
    let parent = LeaseKey::new("orders", PARENT);
    assert!(store.read(&parent).await.unwrap().reported.is_some());

    let report = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert!(report.response().batch_item_failures.is_empty());
    let tail = &report.shards[0].parents;
    assert_eq!(tail.len(), 1, "{report:?}");
    assert_eq!(tail[0].key, parent);
    assert_eq!(tail[0].count(Disposition::Processed), 2);
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "the parent's tail first, once each, in order"
    );
    let row = store.read(&parent).await.unwrap();
    assert_eq!(row.position().unwrap(), Some(Position::ShardEnd));
    assert_eq!(row.lease_owner, None, "the parent's lease is released");
}

#[tokio::test(start_paused = true)]
async fn a_child_whose_never_read_parent_aged_out_whole_runs_the_parents_records_first() {
    use kinesis_checkpoint::clock::{Clock, TokioClock};
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1).clock(clock.clone());
    for n in 0..4_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    stream.split(SHARD);
    for n in 4..8_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    let child = stream.shard_of("customer");
    let store = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(&[]))
        .clock(clock.clone())
        .gate(
            Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
                .clock(clock)
                .maximum_record_age(Duration::from_mins(1)),
        );
    // Young, the parent's records may still be delivered by the mapping: the child waits and
    // runs none of them.
    let early = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(held(&early), "{early:?}");
    assert!(seen.all().is_empty(), "nothing ran: {:?}", seen.all());
    // Every record of the parent is now older than the limit: the mapping dropped them all
    // without delivering the parent once, which leaves it no row at all.
    tokio::time::sleep(Duration::from_mins(2)).await;
    let report = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c2", 60_000),
        )
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    let tail = &report.shards[0].parents;
    assert_eq!(tail.len(), 1, "{report:?}");
    assert_eq!(tail[0].count(Disposition::Processed), 4);
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "the parent's records first, once each, in order"
    );
    let parent = LeaseKey::new("orders", PARENT);
    let row = store.read(&parent).await.unwrap();
    assert_eq!(row.position().unwrap(), Some(Position::ShardEnd));
}

#[tokio::test(start_paused = true)]
async fn a_child_whose_parents_rest_aged_out_after_its_last_delivery_runs_that_rest_first() {
    use kinesis_checkpoint::clock::{Clock, TokioClock};
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1).clock(clock.clone());
    for n in 0..4_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    stream.split(SHARD);
    for n in 4..8_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    let child = stream.shard_of("customer");
    let store = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(&[]))
        .clock(clock.clone())
        .gate(
            Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
                .clock(clock)
                .maximum_record_age(Duration::from_mins(1)),
        );
    let done = processor
        .process_batch(
            memory_delivery(&stream, PARENT, 0..2),
            &context("p1", 60_000),
        )
        .await
        .unwrap();
    assert!(done.shards[0].stopped.is_none());
    // The parent's batch was done whole (its row proves no trouble), and then its records 2
    // and 3 grew older than the limit before the mapping delivered them: it dropped them.
    tokio::time::sleep(Duration::from_mins(2)).await;
    let report = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(report.shards[0].parents.len(), 1, "{report:?}");
    assert_eq!(report.shards[0].parents[0].count(Disposition::Processed), 2);
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "the parent's rest first, once each, in order"
    );
}

#[tokio::test]
async fn a_child_stays_held_while_another_live_owner_holds_its_closed_parents_lease() {
    let (stream, store, seen, processor, child) = split_setup(&[2]);
    for (range, request) in [(0..2, "p1"), (2..4, "p2")] {
        processor
            .process_batch(
                memory_delivery(&stream, PARENT, range),
                &context(request, 60_000),
            )
            .await
            .unwrap();
    }
    let parent = LeaseKey::new("orders", PARENT);
    let claim = store
        .acquire_and_read(&parent, "rival", Duration::from_mins(1), None)
        .await
        .unwrap();
    assert!(matches!(
        claim,
        kinesis_checkpoint::store::Claim::Acquired(_)
    ));

    let report = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(held(&report), "{report:?}");
    assert!(matches!(
        &report.shards[0].parents[0].stopped,
        Some((_, StopReason::LeaseHeld { .. }))
    ));
    assert_eq!(
        seen.all(),
        [0, 1],
        "nothing of the parent's tail nor the child ran"
    );
    assert_eq!(
        store.read(&parent).await.unwrap().lease_owner.as_deref(),
        Some("rival")
    );
}

#[tokio::test]
async fn a_child_whose_closed_parent_shows_no_trouble_waits_without_reading_the_parent() {
    let (stream, _store, seen, processor, child) = split_setup(&[]);
    processor
        .process_batch(
            memory_delivery(&stream, PARENT, 0..2),
            &context("p1", 60_000),
        )
        .await
        .unwrap();
    // The child comes before the rest of its parent: the mapping is still delivering it.
    let report = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(held(&report));
    assert!(report.shards[0].parents.is_empty(), "{report:?}");
    assert_eq!(seen.all(), [0, 1]);
}

#[tokio::test]
async fn against_kinesis_a_closed_parents_tail_the_mapping_gave_up_on_runs_in_its_childs_invocation()
 {
    let setup = setup(None).await;
    setup.put("customer", 0..3).await;
    setup.stream.split(PARENT).await;
    setup.put("customer", 3..7).await;
    let child = if setup.stream.batch(LEFT).await.records.is_empty() {
        RIGHT
    } else {
        LEFT
    };
    let seen = Seen::default();
    let lines = Lines::default();
    let processor = setup.processor(seen.handler(&[1]), &lines);

    let first = deliver(&processor, setup.delivery(PARENT, 0..1).await, "p1").await;
    assert!(first.shards[0].stopped.is_none());
    // Record 1 fails and the mapping gives up on the parent's last batch (1 and 2).
    let failed = deliver(&processor, setup.delivery(PARENT, 1..3).await, "p2").await;
    assert!(failed.shards[0].stopped.is_some());

    let report = deliver(&processor, setup.delivery(child, 0..4).await, "c1").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(
        seen.all(),
        (0..7).collect::<Vec<_>>(),
        "the parent's tail first, once each, in order"
    );
    assert_eq!(
        setup.row(PARENT).await.position().unwrap(),
        Some(Position::ShardEnd)
    );
    assert_eq!(lines.last()["Recovered"], 2);
}

/// A memory stream that reads at most `cap` records at a time, as a small budget would.
struct Capped {
    stream: kinesis_checkpoint::local::MemoryStream,
    cap: usize,
}

impl Topology for Capped {
    fn shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
        self.stream.shards(stream)
    }

    fn exhausted<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, TopologyError>> {
        self.stream.exhausted(stream, shard, after)
    }

    fn retention<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>> {
        Topology::retention(&self.stream, stream)
    }

    fn read_range<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        range: &'a SkippedRange,
        budget: ReadBudget,
    ) -> BoxFuture<'a, Result<RangeRead, TopologyError>> {
        let budget = ReadBudget::new(budget.max_records.min(self.cap), budget.deadline);
        self.stream.read_range(stream, shard, range, budget)
    }
}

#[tokio::test]
async fn a_parents_tail_longer_than_one_reading_runs_over_several_deliveries_of_its_child() {
    let (stream, store, seen, _, child) = split_setup(&[]);
    let processor = Processor::new(store.clone(), seen.handler(&[1])).gate(Gate::new(
        Arc::new(Capped {
            stream: stream.clone(),
            cap: 2,
        }),
        StartingPosition::TrimHorizon,
    ));
    processor
        .process_batch(
            memory_delivery(&stream, PARENT, 0..1),
            &context("p1", 60_000),
        )
        .await
        .unwrap();
    // Record 1 fails; the mapping gives up on the parent's last batch (1 to 3).
    processor
        .process_batch(
            memory_delivery(&stream, PARENT, 1..4),
            &context("p2", 60_000),
        )
        .await
        .unwrap();

    // Two records read (1 and 2): 1 runs, 2 is where the next delivery reads on.
    let first = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(held(&first), "{first:?}");
    assert_eq!(first.shards[0].parents[0].count(Disposition::Processed), 1);
    assert_eq!(seen.all(), [0, 1]);
    let parent = store.read(&LeaseKey::new("orders", PARENT)).await.unwrap();
    assert_eq!(
        parent.reported.map(|at| at.to_string()),
        Some(stream.records(PARENT)[2].sequence.clone()),
        "the parent's commit proves the rest of the tail"
    );

    let second = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c2", 60_000),
        )
        .await
        .unwrap();
    assert!(second.shards[0].stopped.is_none(), "{second:?}");
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "once each, in order"
    );
}

/// A parent's tail run in parts whose commit lands but whose answer is lost: the child's
/// invocation sees a failed checkpoint, yet the row still proves the rest of the tail, since
/// the commit itself reported where the next part starts (a mark written after it, only when
/// the run looked whole, was never written, and the landed commit had cleared the proof: the
/// child was held until the parent expired).
#[tokio::test]
async fn a_parents_tail_run_in_parts_whose_commit_answer_was_lost_still_runs_to_its_end_over_the_childs_deliveries()
 {
    let (stream, memory, seen, _, child) = split_setup(&[]);
    let store = Arc::new(common::faults::faulty(memory.clone()));
    let processor = Processor::new(store.clone(), seen.handler(&[1])).gate(Gate::new(
        Arc::new(Capped {
            stream: stream.clone(),
            cap: 2,
        }),
        StartingPosition::TrimHorizon,
    ));
    for (range, id) in [(0..1, "p1"), (1..4, "p2")] {
        processor
            .process_batch(
                memory_delivery(&stream, PARENT, range),
                &context(id, 60_000),
            )
            .await
            .unwrap();
    }
    // The mapping gave up on the parent's last batch (1 to 3). The tail's first part (1, 2)
    // runs 1, and its commit lands with the answer lost.
    store
        .layer()
        .lose_commit_answer
        .store(true, Ordering::SeqCst);
    let first = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(held(&first), "{first:?}");
    // Written again once after the lost answer, the commit is refused: the first one landed
    // and released the lease.
    assert!(
        matches!(
            &first.shards[0].parents[0].stopped,
            Some((_, StopReason::CheckpointFenced))
        ),
        "{first:?}"
    );
    assert!(
        !store.layer().lose_commit_answer.load(Ordering::SeqCst),
        "the fault was used"
    );
    let records = stream.records(PARENT);
    let parent = memory.read(&LeaseKey::new("orders", PARENT)).await.unwrap();
    assert_eq!(
        parent.checkpoint.as_deref(),
        Some(records[1].sequence.as_str()),
        "the commit landed"
    );
    assert_eq!(
        parent.reported.map(|at| at.to_string()),
        Some(records[2].sequence.clone()),
        "and proves the rest of the tail"
    );
    assert_eq!(parent.lease_owner, None, "released in the same write");

    for id in ["c2", "c3"] {
        processor
            .process_batch(memory_delivery(&stream, &child, 0..4), &context(id, 60_000))
            .await
            .unwrap();
    }
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "the rest of the tail, then the child, once each, in order"
    );
    assert_eq!(
        memory
            .read(&LeaseKey::new("orders", PARENT))
            .await
            .unwrap()
            .position()
            .unwrap(),
        Some(Position::ShardEnd)
    );
}

/// The partition-key mode against Kinesis and `DynamoDB`, with a mapping that gives up on a
/// batch after its first delivery (`MaximumRetryAttempts` 0, told to the gate): the invocation
/// dies on record 2 of the lane's batch (out of memory, killed at its time-out), so it never
/// makes its last write. The keys were marked before anything ran: the lane's next batch, b's
/// later records only, reads the range once and runs what the death left, in order.
#[tokio::test]
async fn in_the_partition_key_mode_a_batch_the_invocation_died_on_and_the_mapping_gave_up_on_is_run_by_the_lanes_next_batch()
 {
    let setup = setup(None).await;
    for n in 0..4 {
        setup
            .stream
            .put(if n % 2 == 0 { "a" } else { "b" }, n)
            .await;
    }
    let seen = Seen::default();
    let hung = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler = {
        let seen = seen.clone();
        move |record: Record| {
            let n = record.json::<Value>().unwrap()["n"].as_u64().unwrap();
            let dies = n == 2 && !hung.swap(true, Ordering::SeqCst);
            seen.0.lock().unwrap().push(n);
            async move {
                if dies {
                    std::future::pending::<()>().await;
                }
                Outcome::ack()
            }
        }
    };
    let lines = Lines::default();
    let gate =
        Gate::new(setup.topology.clone(), StartingPosition::TrimHorizon).maximum_retry_attempts(0);
    let processor = Processor::by_partition_key(Arc::new(setup.store.clone()), handler)
        .gate(gate)
        .metrics(lines.metrics());

    let first = setup.delivery(SHARD, 0..4).await;
    let died = tokio::time::timeout(
        Duration::from_secs(3),
        processor.process_batch(first.clone(), &context("k1", 60_000)),
    )
    .await;
    assert!(died.is_err(), "the invocation never answers");
    assert_eq!(seen.all(), [0, 1, 2]);
    for key in ["a", "b"] {
        let row = setup.key_row(SHARD, key).await;
        assert_eq!(
            row.reported.as_ref().map(ToString::to_string),
            Some(sequence_of(&first, 0)),
            "{key}'s row was marked before the batch ran"
        );
        assert_eq!(row.checkpoint, None, "nothing was checkpointed");
    }

    // The mapping gave up on records 0 to 3; the lane's next batch holds b's 4 and 5.
    setup.stream.put("b", 4).await;
    setup.stream.put("b", 5).await;
    let calls = setup.kinesis_calls();
    let report = deliver(&processor, setup.delivery(SHARD, 4..6).await, "k2").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    let gap = report.shards[0].gap.as_ref().expect("a gap");
    assert_eq!(gap.outcome, GapOutcome::Recovered);
    assert_eq!(gap.recovered.len(), 4, "records 0 to 3, none checkpointed");
    assert_eq!(setup.kinesis_calls(), calls + 1, "one read of the range");
    assert_eq!(
        seen.all(),
        [0, 1, 2, 0, 1, 2, 3, 4, 5],
        "run again after the death, then in order"
    );
    let a = setup.key_row(SHARD, "a").await;
    assert_eq!(a.checkpoint, Some(sequence_of(&first, 2)));
    assert_eq!(a.reported, None, "a is settled");
}

/// A clock `ahead` of the system's by a moving offset: kinesis-local stamps its records with the
/// real time, and the processor judges their age on this one.
#[derive(Debug, Default)]
struct Ahead(std::sync::atomic::AtomicU64);

impl Ahead {
    fn by(&self, offset: Duration) {
        self.0
            .store(u64::try_from(offset.as_millis()).unwrap(), Ordering::SeqCst);
    }
}

impl kinesis_checkpoint::clock::Clock for Ahead {
    fn now_millis(&self) -> u64 {
        kinesis_checkpoint::clock::SystemClock.now_millis() + self.0.load(Ordering::SeqCst)
    }

    fn sleep(&self, duration: Duration) -> kinesis_checkpoint::clock::Sleep {
        kinesis_checkpoint::clock::SystemClock.sleep(duration)
    }

    fn monotonic(&self) -> Duration {
        kinesis_checkpoint::clock::SystemClock.monotonic()
    }
}

/// The mapping's record age limit in the partition-key tail tests, and how long after it no
/// invocation of a parent can run its records any more: the limit, the longest batching window
/// (5 minutes) and the longest invocation (15 minutes).
const AGE_LIMIT: Duration = Duration::from_mins(1);
const BEYOND_EVERY_INVOCATION: Duration = Duration::from_mins(21);

#[tokio::test]
async fn in_the_partition_key_mode_a_closed_parents_tail_the_mapping_gave_up_on_is_run_by_its_held_child_once_no_invocation_of_the_parent_can_run_it()
 {
    let setup = setup(None).await;
    setup.put("customer", 0..3).await;
    setup.stream.put("other", 100).await;
    setup.stream.split(PARENT).await;
    setup.put("customer", 3..7).await;
    let child = if setup.stream.batch(LEFT).await.records.is_empty() {
        RIGHT
    } else {
        LEFT
    };
    let seen = Seen::default();
    let lines = Lines::default();
    let clock = Arc::new(Ahead::default());
    let gate = Gate::new(setup.topology.clone(), StartingPosition::TrimHorizon)
        .clock(clock.clone())
        .maximum_record_age(AGE_LIMIT);
    let processor = Processor::by_partition_key(Arc::new(setup.store.clone()), seen.handler(&[1]))
        .clock(clock.clone())
        .gate(gate)
        .metrics(lines.metrics());
    let at = |request: &str| {
        let mut context = context(request, 0);
        context.deadline = kinesis_checkpoint::clock::Clock::now_millis(clock.as_ref()) + 60_000;
        context
    };
    let deliver =
        async |event, request: &str| processor.process_batch(event, &at(request)).await.unwrap();

    let first = deliver(setup.delivery(PARENT, 0..1).await, "p1").await;
    assert!(first.shards[0].stopped.is_none());
    // Record 1 fails and the mapping gives up on the parent's last batch (1, 2 and other's 100)
    // for good; it never delivers the parent again.
    let failed = deliver(setup.delivery(PARENT, 1..4).await, "p2").await;
    assert!(failed.shards[0].stopped.is_some());
    assert_eq!(seen.all(), [0, 100]);

    // Young, the parent's records could still be run by a retry of the mapping's: held.
    let early = deliver(setup.delivery(child, 0..4).await, "c1").await;
    assert!(held(&early), "{early:?}");
    assert!(early.shards[0].parents.is_empty(), "{early:?}");

    clock.by(BEYOND_EVERY_INVOCATION + Duration::from_secs(5));
    let report = deliver(setup.delivery(child, 0..4).await, "c2").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert!(report.response().batch_item_failures.is_empty());
    let tail = &report.shards[0].parents;
    assert_eq!(tail.len(), 1, "{report:?}");
    assert_eq!(
        tail[0].key,
        LeaseKey::new(setup.stream.name.as_str(), PARENT)
    );
    assert_eq!(tail[0].count(Disposition::Processed), 2, "{tail:?}");
    assert_eq!(
        seen.all(),
        [0, 100, 1, 2, 3, 4, 5, 6],
        "the parent's tail first, once each, in key order; other's record is done already"
    );
    assert_eq!(lines.last()["Recovered"], 2);
    let parent = setup.row(PARENT).await;
    assert_eq!(parent.position().unwrap(), Some(Position::ShardEnd));
    assert_eq!(parent.lease_owner, None, "the parent's lease is released");
    let customer = setup.key_row(PARENT, "customer").await;
    assert_eq!(customer.failing, None, "the key is settled");
}

/// A memory stream on virtual time in the partition-key mode whose shard 0 holds records 0 to 3
/// of one key and is then split (the key's 4 to 7 go to the child returned); the parent's
/// records 0 and 1 are done, 2 fails and the mapping gives up on 2 and 3. The gate is told the
/// mapping's record age when `age`.
async fn key_tail_setup(
    age: bool,
) -> (
    kinesis_checkpoint::local::MemoryStream,
    Arc<MemoryLeaseStore>,
    Seen,
    Processor<impl Handler + use<>, kinesis_checkpoint::PartitionKeyMode>,
    String,
) {
    use kinesis_checkpoint::clock::{Clock, TokioClock};
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1).clock(clock.clone());
    for n in 0..4_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    stream.split(SHARD);
    for n in 4..8_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    let child = stream.shard_of("customer");
    let store = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
    let seen = Seen::default();
    let mut gate =
        Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon).clock(clock.clone());
    if age {
        gate = gate.maximum_record_age(AGE_LIMIT);
    }
    let processor = Processor::by_partition_key(store.clone(), seen.handler(&[2]))
        .clock(clock)
        .gate(gate);
    for (range, request) in [(0..2, "p1"), (2..4, "p2")] {
        processor
            .process_batch(
                memory_delivery(&stream, PARENT, range),
                &context(request, 60_000),
            )
            .await
            .unwrap();
    }
    assert_eq!(seen.all(), [0, 1]);
    (stream, store, seen, processor, child)
}

async fn deliver_child(
    processor: &Processor<impl Handler, kinesis_checkpoint::PartitionKeyMode>,
    stream: &kinesis_checkpoint::local::MemoryStream,
    child: &str,
    request: &str,
) -> BatchReport {
    processor
        .process_batch(
            memory_delivery(stream, child, 0..4),
            &context(request, 60_000),
        )
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_child_stays_held_while_its_closed_parents_youngest_record_could_still_be_run_by_an_invocation_of_the_parent()
 {
    let (stream, store, seen, processor, child) = key_tail_setup(true).await;
    let early = deliver_child(&processor, &stream, &child, "c1").await;
    assert!(held(&early));
    // Older than the limit, but a batch the mapping took just before the limit may still be
    // waiting out its batching window, or running.
    tokio::time::sleep(Duration::from_secs(BEYOND_EVERY_INVOCATION.as_secs() - 1)).await;
    let report = deliver_child(&processor, &stream, &child, "c2").await;
    assert!(held(&report), "{report:?}");
    assert!(report.shards[0].parents.is_empty(), "{report:?}");
    assert_eq!(seen.all(), [0, 1], "nothing of the parent's tail ran");
    let parent = LeaseKey::new("orders", PARENT);
    assert_eq!(store.read(&parent).await.unwrap().lease_owner, None);

    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = deliver_child(&processor, &stream, &child, "c3").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(report.shards[0].parents[0].count(Disposition::Processed), 2);
    assert_eq!(seen.all(), (0..8).collect::<Vec<_>>());
    assert_eq!(
        store.read(&parent).await.unwrap().position().unwrap(),
        Some(Position::ShardEnd)
    );
}

#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_child_stays_held_while_another_live_owner_holds_its_closed_parents_lease()
 {
    let (stream, store, seen, processor, child) = key_tail_setup(true).await;
    let early = deliver_child(&processor, &stream, &child, "c1").await;
    assert!(early.shards[0].stopped.is_some());
    tokio::time::sleep(BEYOND_EVERY_INVOCATION * 2).await;
    // A consumer of the whole shard (or a sibling child's invocation) holds the parent.
    let parent = LeaseKey::new("orders", PARENT);
    let claim = store
        .acquire_and_read(&parent, "rival", Duration::from_mins(5), None)
        .await
        .unwrap();
    assert!(matches!(
        claim,
        kinesis_checkpoint::store::Claim::Acquired(_)
    ));
    let report = deliver_child(&processor, &stream, &child, "c2").await;
    assert!(held(&report), "{report:?}");
    assert_eq!(seen.all(), [0, 1], "nothing of the parent's tail ran");
    assert_eq!(
        store.read(&parent).await.unwrap().lease_owner.as_deref(),
        Some("rival")
    );

    // Once the rival's lease lapses, the tail runs.
    tokio::time::sleep(Duration::from_mins(6)).await;
    let report = deliver_child(&processor, &stream, &child, "c3").await;
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    assert_eq!(seen.all(), (0..8).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_without_a_record_age_told_a_closed_parents_tail_the_mapping_gave_up_on_keeps_its_child_held()
 {
    let (stream, store, seen, processor, child) = key_tail_setup(false).await;
    tokio::time::sleep(Duration::from_hours(6)).await;
    let report = deliver_child(&processor, &stream, &child, "c1").await;
    assert!(held(&report), "{report:?}");
    assert!(report.shards[0].parents.is_empty());
    assert_eq!(seen.all(), [0, 1]);
    let parent = LeaseKey::new("orders", PARENT);
    assert_eq!(store.read(&parent).await.unwrap().lease_owner, None);
}

/// A memory stream of records 0 to 7 on one shard, counted, and a processor over it on
/// `store` whose handler notes every `n`.
fn contended_setup<S: CheckpointStore>(
    store: Arc<S>,
) -> (
    kinesis_checkpoint::local::MemoryStream,
    Arc<Counting<kinesis_checkpoint::local::MemoryStream>>,
    Seen,
    Processor<impl Handler + use<S>>,
) {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    orders(&stream, 0..8);
    let topology = Arc::new(Counting {
        inner: stream.clone(),
        calls: AtomicUsize::new(0),
        fail_reads: AtomicUsize::new(0),
    });
    let seen = Seen::default();
    let processor = Processor::new(store, seen.handler(&[]))
        .gate(Gate::new(topology.clone(), StartingPosition::TrimHorizon));
    (stream, topology, seen, processor)
}

#[tokio::test]
async fn records_after_a_seed_consumers_checkpoint_inside_a_batch_turned_away_on_every_delivery_are_recovered_by_the_next_batch()
 {
    seed_inside_a_batch_turned_away(Arc::new(MemoryLeaseStore::new())).await;
}

#[tokio::test]
async fn on_dynamodb_records_after_a_seed_consumers_checkpoint_inside_a_batch_turned_away_on_every_delivery_are_recovered_by_the_next_batch()
 {
    let moto = Moto::shared().sdk_config(1).await;
    let table = unique("leases");
    create_lease_table(&moto, &table).await;
    seed_inside_a_batch_turned_away(Arc::new(DynamoLeaseStore::new(&moto, table))).await;
}

/// Records 0 and 1 done; then a seed-crate consumer takes the shard's lease for `lease`, and
/// the mapping's batch of the records `away` is turned away (in the shard mode, marked
/// `contended` at its first record): nothing of it runs, and it is reported at its first record.
async fn done_then_turned_away<
    S: CheckpointStore + LeaseStore,
    M: kinesis_checkpoint::processor::CheckpointMode,
>(
    store: &S,
    processor: &Processor<impl Handler, M>,
    stream: &kinesis_checkpoint::local::MemoryStream,
    away: std::ops::Range<usize>,
    lease: Duration,
) {
    let done = processor
        .process_batch(
            memory_delivery(stream, SHARD, 0..2),
            &context("done", 60_000),
        )
        .await
        .unwrap();
    assert_eq!(done.shards[0].stopped, None);
    let key = LeaseKey::new("orders", SHARD);
    assert!(store.acquire(&key, "seed", lease).await.unwrap());
    let first_away = stream.records(SHARD)[away.start].sequence.clone();
    let turned_away = processor
        .process_batch(
            memory_delivery(stream, SHARD, away),
            &context("away", 60_000),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            &turned_away.shards[0].stopped,
            Some((at, StopReason::LeaseHeld { owner: Some(owner) }))
                if at.as_str() == first_away && owner == "seed"
        ),
        "{turned_away:?}"
    );
}

/// A batch turned away on every delivery by a seed consumer's lease, inside which the seed
/// consumer then checkpoints; the mapping gives up on it, and the next batch recovers the
/// records after the seed's checkpoint, on `store`.
async fn seed_inside_a_batch_turned_away<S: CheckpointStore + LeaseStore>(store: Arc<S>) {
    let (stream, _, seen, processor) = contended_setup(store.clone());
    let key = LeaseKey::new("orders", SHARD);
    // A seed-crate consumer holds the shard's lease: the mapping's batch of records 2 to 5 is
    // turned away on every delivery (marked `contended` at 2) and never claimed.
    done_then_turned_away(
        store.as_ref(),
        &processor,
        &stream,
        2..6,
        Duration::from_secs(30),
    )
    .await;
    // The seed consumer runs records 2 and 3, checkpoints 3 with the seed's methods (the mark
    // is now below its checkpoint, and nothing else says so) and lets the shard go.
    seen.0.lock().unwrap().extend([2, 3]);
    let third = stream.records(SHARD)[3].sequence.clone();
    assert!(store.checkpoint(&key, "seed", &third).await.unwrap());
    store.release(&key, "seed").await.unwrap();
    let row = CheckpointStore::read(store.as_ref(), &key).await.unwrap();
    assert_eq!(
        row.contended.map(|p| p.to_string()),
        Some(stream.records(SHARD)[2].sequence.clone())
    );
    assert_eq!(row.reported, None, "nothing else marks the batch");
    // The mapping gave up on records 2 to 5; its next batch starts at 6.
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 6..8),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(next.shards[0].gap.is_some(), "{next:?}");
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "records 4 and 5 once, before the batch, in order"
    );
    let row = CheckpointStore::read(store.as_ref(), &key).await.unwrap();
    assert_eq!(
        row.contended_done, row.contended,
        "the recovering write records the mark done"
    );
}

#[tokio::test]
async fn the_owners_write_past_a_contended_mark_records_it_done_and_the_next_normal_batch_makes_no_kinesis_call()
 {
    let store = Arc::new(MemoryLeaseStore::new());
    let (stream, topology, seen, processor) = contended_setup(store.clone());
    let key = LeaseKey::new("orders", SHARD);
    let done = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 0..2),
            &context("done", 60_000),
        )
        .await
        .unwrap();
    assert_eq!(done.shards[0].stopped, None);
    // A concurrent delivery of records 2 to 5 is turned away by a lingering lease.
    assert!(
        store
            .acquire(&key, "lingering", Duration::from_millis(50))
            .await
            .unwrap()
    );
    let turned_away = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 2..6),
            &context("away", 60_000),
        )
        .await
        .unwrap();
    assert!(turned_away.shards[0].stopped.is_some());
    let mark = Position::record(stream.records(SHARD)[2].sequence.parse().unwrap());
    tokio::time::sleep(Duration::from_millis(80)).await;
    // Its redelivery runs it: the owner's write moves the checkpoint past the mark.
    let owner = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 2..6),
            &context("owner", 60_000),
        )
        .await
        .unwrap();
    assert!(owner.shards[0].stopped.is_none() && owner.shards[0].gap.is_none());
    let row = CheckpointStore::read(store.as_ref(), &key).await.unwrap();
    assert_eq!(row.contended.as_ref(), Some(&mark), "the mark stays");
    assert_eq!(row.contended_done, Some(mark), "recorded done by the owner");
    // The next batch is a normal one: no gap, and not one call to the stream.
    let calls = topology.calls.load(Ordering::SeqCst);
    let next = processor
        .process_batch(
            memory_delivery(&stream, SHARD, 6..8),
            &context("next", 60_000),
        )
        .await
        .unwrap();
    assert!(next.shards[0].gap.is_none(), "{next:?}");
    assert_eq!(
        topology.calls.load(Ordering::SeqCst),
        calls,
        "no Kinesis call"
    );
    assert_eq!(seen.all(), (0..8).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_child_held_by_a_closed_parent_whose_last_batch_was_turned_away_and_checkpointed_inside_by_a_seed_consumer_runs_the_rest_of_it_first()
 {
    let (stream, store, seen, processor, child) = split_setup(&[]);
    let parent = LeaseKey::new("orders", PARENT);
    let done = processor
        .process_batch(
            memory_delivery(&stream, PARENT, 0..2),
            &context("p1", 60_000),
        )
        .await
        .unwrap();
    assert!(done.shards[0].stopped.is_none());
    // A seed consumer holds the parent's lease: the parent's last batch (records 2 and 3) is
    // turned away on every delivery, and the mapping gives up on it.
    assert!(
        store
            .acquire(&parent, "seed", Duration::from_secs(30))
            .await
            .unwrap()
    );
    let turned_away = processor
        .process_batch(
            memory_delivery(&stream, PARENT, 2..4),
            &context("p2", 60_000),
        )
        .await
        .unwrap();
    assert!(matches!(
        turned_away.shards[0].stopped,
        Some((_, StopReason::LeaseHeld { .. }))
    ));
    // The seed consumer runs record 2 only, checkpoints it and lets the parent go.
    seen.0.lock().unwrap().push(2);
    let second = stream.records(PARENT)[2].sequence.clone();
    assert!(store.checkpoint(&parent, "seed", &second).await.unwrap());
    store.release(&parent, "seed").await.unwrap();

    let report = processor
        .process_batch(
            memory_delivery(&stream, &child, 0..4),
            &context("c1", 60_000),
        )
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_none(), "{report:?}");
    let tail = &report.shards[0].parents;
    assert_eq!(tail.len(), 1, "{report:?}");
    assert_eq!(tail[0].count(Disposition::Processed), 1);
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "record 3 first, once each, in order"
    );
    let row = store.read(&parent).await.unwrap();
    assert_eq!(row.position().unwrap(), Some(Position::ShardEnd));
}

/// A merge's child held by two closed parents, whose last batches the mapping gave up on, in
/// the partition-key mode: once no invocation of either parent can run their records, the
/// child's invocation runs both tails (each under its parent's lease, each parent's keys in
/// order), both parents are finished, and the child's own records run after.
#[tokio::test(start_paused = true)]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: both parents' batches, the merge, the child held, then run"
)]
async fn in_the_partition_key_mode_a_merges_child_runs_both_closed_parents_tails_then_its_own_records()
 {
    use kinesis_checkpoint::clock::{Clock, TokioClock};
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 2).clock(clock.clone());
    let parents = ["shardId-000000000000", "shardId-000000000001"];
    // One key routed to each parent.
    let key_of = |shard: &str| {
        (0..1_000)
            .map(|n| format!("customer-{n}"))
            .find(|key| stream.shard_of(key) == shard)
            .unwrap()
    };
    let keys = [key_of(parents[0]), key_of(parents[1])];
    for (key, base) in keys.iter().zip([0_u64, 10]) {
        for n in base..base + 4 {
            stream.put(key, serde_json::json!({ "n": n }).to_string());
        }
    }
    let store = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
    let seen = Seen::default();
    let gate = Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon)
        .clock(clock.clone())
        .maximum_record_age(AGE_LIMIT);
    let processor = Processor::by_partition_key(store.clone(), seen.handler(&[2, 12]))
        .clock(clock)
        .gate(gate);
    // Each parent: its first two records done, the third fails, and the mapping gives up on
    // its last batch.
    for (index, parent) in parents.iter().enumerate() {
        for (range, request) in [(0..2, "1"), (2..4, "2")] {
            processor
                .process_batch(
                    memory_delivery(&stream, parent, range),
                    &context(&format!("p{index}-{request}"), 60_000),
                )
                .await
                .unwrap();
        }
    }
    assert_eq!(seen.all(), [0, 1, 10, 11]);
    let child = stream.merge(parents[0], parents[1]);
    for (key, base) in keys.iter().zip([20_u64, 30]) {
        for n in base..base + 2 {
            stream.put(key, serde_json::json!({ "n": n }).to_string());
        }
    }
    let deliver_merged = async |request: &str| {
        processor
            .process_batch(
                memory_delivery(&stream, &child, 0..4),
                &context(request, 60_000),
            )
            .await
            .unwrap()
    };
    let early = deliver_merged("c1").await;
    assert!(held(&early), "{early:?}");
    assert!(early.shards[0].parents.is_empty(), "{early:?}");

    tokio::time::sleep(BEYOND_EVERY_INVOCATION + Duration::from_secs(5)).await;
    let report = deliver_merged("c2").await;
    let shard = &report.shards[0];
    assert!(shard.stopped.is_none(), "{report:?}");
    let mut tails: Vec<(String, usize)> = shard
        .parents
        .iter()
        .map(|tail| {
            (
                tail.key.shard().to_owned(),
                tail.count(Disposition::Processed),
            )
        })
        .collect();
    tails.sort();
    assert_eq!(
        tails,
        [(parents[0].to_owned(), 2), (parents[1].to_owned(), 2)],
        "{report:?}"
    );
    let all = seen.all();
    assert_eq!(&all[..4], [0, 1, 10, 11]);
    let mut tails_ran = all[4..8].to_vec();
    tails_ran.sort_unstable();
    assert_eq!(tails_ran, [2, 3, 12, 13], "both tails before the child");
    let at = |n: u64| all.iter().position(|&m| m == n).unwrap();
    assert!(at(2) < at(3) && at(12) < at(13), "each key in order");
    let mut child_ran = all[8..].to_vec();
    child_ran.sort_unstable();
    assert_eq!(
        child_ran,
        [20, 21, 30, 31],
        "the child's own records, once each, after"
    );
    for parent in parents {
        let row = store.read(&LeaseKey::new("orders", parent)).await.unwrap();
        assert_eq!(
            row.position().unwrap(),
            Some(Position::ShardEnd),
            "{parent}"
        );
        assert_eq!(row.lease_owner, None, "{parent}'s lease is released");
    }
}

/// Whether the report's first shard was held back (by its parents).
fn held(report: &BatchReport) -> bool {
    matches!(&report.shards[0].stopped, Some((_, StopReason::Held(_))))
}

/// The memory stream's records of `shard` at `indexes`, as one batch of a lane.
fn memory_pick(
    stream: &kinesis_checkpoint::local::MemoryStream,
    shard: &str,
    indexes: &[usize],
) -> KinesisEvent {
    let mut event = memory_delivery(stream, shard, 0..stream.records(shard).len());
    event.records = indexes.iter().map(|&i| event.records[i].clone()).collect();
    event
}

/// [`memory_pick`], each record arriving when the stream's clock says it did.
#[allow(
    clippy::cast_precision_loss,
    reason = "epoch milliseconds of this century fit a double's mantissa"
)]
fn memory_pick_arrived(
    stream: &kinesis_checkpoint::local::MemoryStream,
    shard: &str,
    indexes: &[usize],
) -> KinesisEvent {
    let mut event = memory_delivery_arrived(stream, shard, 0..stream.records(shard).len(), |r| {
        r.arrival_millis as f64 / 1_000.0
    });
    event.records = indexes.iter().map(|&i| event.records[i].clone()).collect();
    event
}

/// A clock, a stream of one shard on it holding `keys` in order (record `n` is `{"n": n}`), a
/// store, and a partition-key processor whose gate is told the mapping's record age and reads
/// at most two records at a time, failing each record of `fail` once.
fn aged_parts_setup(
    keys: &[&str],
    fail: &[u64],
) -> (
    kinesis_checkpoint::local::MemoryStream,
    Arc<common::faults::Faulty<MemoryLeaseStore>>,
    Seen,
    Processor<impl Handler + use<>, kinesis_checkpoint::PartitionKeyMode>,
) {
    use kinesis_checkpoint::clock::{Clock, TokioClock};
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1).clock(clock.clone());
    for (n, key) in keys.iter().enumerate() {
        stream.put(key, serde_json::json!({ "n": n }).to_string());
    }
    // Every fault off until a test switches one on: the memory store as it is.
    let store = Arc::new(common::faults::faulty(Arc::new(
        MemoryLeaseStore::with_clock(clock.clone()),
    )));
    let seen = Seen::default();
    let gate = Gate::new(
        Arc::new(Capped {
            stream: stream.clone(),
            cap: 2,
        }),
        StartingPosition::TrimHorizon,
    )
    .clock(clock.clone())
    .maximum_record_age(AGE_LIMIT);
    let processor = Processor::by_partition_key(store.clone(), seen.handler(fail))
        .clock(clock)
        .gate(gate);
    (stream, store, seen, processor)
}

/// Delivers `batch` until it runs (at most `most` times): the deliveries it took.
async fn deliver_until_run(
    processor: &Processor<impl Handler, kinesis_checkpoint::PartitionKeyMode>,
    batch: &KinesisEvent,
    most: usize,
    seen: &Seen,
) -> usize {
    for delivery in 1..=most {
        let report = processor
            .process_batch(batch.clone(), &context(&format!("d{delivery}"), 60_000))
            .await
            .unwrap();
        if report.shards[0].stopped.is_none() {
            return delivery;
        }
    }
    panic!("still not run after {most} deliveries: {:?}", seen.all());
}

/// A lane's range proven by a key's mark, widened for the batch's age to where the key's
/// records may have been dropped before it (here the shard's start), and read in parts: the
/// first part ends before the mark. Where the reading went on was written to the lane's row but
/// not believed below the mark, and the widening started again at the shard's start: the same
/// first part was read on every delivery, and the batch never ran.
#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_lanes_range_widened_for_its_age_and_read_in_parts_goes_on_from_a_part_ending_before_the_mark()
 {
    let (stream, _, seen, processor) = aged_parts_setup(&["b", "b", "a", "b", "a"], &[2]);
    // The lane's batch a2 fails: a is marked there, and the mapping gives up on it.
    let report = processor
        .process_batch(memory_pick(&stream, SHARD, &[2]), &context("1", 60_000))
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_some(), "{report:?}");
    // The lane's next batch, a4, nearly as old as the limit: read from the shard's start.
    tokio::time::sleep(Duration::from_secs(58)).await;
    let deliveries =
        deliver_until_run(&processor, &memory_pick(&stream, SHARD, &[4]), 6, &seen).await;
    assert!(deliveries > 1, "read in parts");
    assert_eq!(
        seen.all(),
        [2, 4],
        "a's, once each, in order; b's are b's lane's"
    );
}

/// A lane reported at a1 (a marked there) and given up on; meanwhile a consumer of the whole
/// shard (a seed consumer, or the gate recording how far a closed parent is done) checkpointed
/// the shard at a1. The mark at or below that checkpoint was taken as settled, though the
/// lane's batch held a2 after it: the lane's next batch ran without it (seeds 201762, 219737
/// and 240210 of the invariant scenarios). Now the mark still proves the gap, read after the
/// shard's checkpoint.
#[tokio::test]
async fn in_the_partition_key_mode_a_mark_a_shard_consumers_checkpoint_passed_still_proves_the_records_after_it()
 {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    for n in 0..4_u64 {
        stream.put("a", serde_json::json!({ "n": n }).to_string());
    }
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::by_partition_key(store.clone(), seen.handler(&[1])).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let first = processor
        .process_batch(
            memory_pick(&stream, SHARD, &[0, 1, 2]),
            &context("1", 60_000),
        )
        .await
        .unwrap();
    assert!(
        first.shards[0].stopped.is_some(),
        "a1 is reported: {first:?}"
    );
    assert_eq!(seen.all(), [0]);
    // A consumer of the whole shard does a1 and checkpoints it.
    let shard = LeaseKey::new("orders", SHARD);
    assert!(
        store
            .acquire(&shard, "seed", Duration::from_secs(30))
            .await
            .unwrap()
    );
    seen.0.lock().unwrap().push(1);
    let a1 = stream.records(SHARD)[1].sequence.clone();
    assert!(store.checkpoint(&shard, "seed", &a1).await.unwrap());
    store.release(&shard, "seed").await.unwrap();
    // The mapping gave up on a1 and a2; the lane's next batch holds a3.
    let next = processor
        .process_batch(memory_pick(&stream, SHARD, &[3]), &context("2", 60_000))
        .await
        .unwrap();
    assert!(next.shards[0].stopped.is_none(), "{next:?}");
    assert!(
        next.shards[0].gap.is_some(),
        "the mark proves the gap: {next:?}"
    );
    assert_eq!(seen.all(), [0, 1, 2, 3], "once each, in order");
}

/// A lane's batch that proves a gap but cannot read it (a throttled `GetRecords`) runs
/// nothing, and is reported at its first record as a held batch is; its keys were not marked
/// there, so when the mapping gave up on it too, a key whose only records were in it (c's 2)
/// was known to no mark, and its next batch ran without them (seed 179388 of the invariant
/// scenarios). Now the batch's keys are marked at its first record, as a held batch's are.
#[tokio::test]
async fn in_the_partition_key_mode_a_batch_that_cannot_read_its_lanes_gap_marks_its_keys() {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    for (n, key) in ["a", "a", "c", "a", "c"].iter().enumerate() {
        stream.put(key, serde_json::json!({ "n": n }).to_string());
    }
    let topology = Arc::new(Counting {
        inner: stream.clone(),
        calls: AtomicUsize::new(0),
        fail_reads: AtomicUsize::new(0),
    });
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::by_partition_key(store.clone(), seen.handler(&[0]))
        .gate(Gate::new(topology.clone(), StartingPosition::TrimHorizon));
    // a0 fails (a is marked there); the mapping gives up on it.
    let first = processor
        .process_batch(memory_pick(&stream, SHARD, &[0]), &context("1", 60_000))
        .await
        .unwrap();
    assert!(first.shards[0].stopped.is_some(), "{first:?}");
    // The lane's next batch proves the gap from a0, whose reading fails: nothing runs, and
    // the mapping gives up on this batch too.
    topology.fail_reads.store(1, Ordering::SeqCst);
    let unread = processor
        .process_batch(
            memory_pick(&stream, SHARD, &[1, 2, 3]),
            &context("2", 60_000),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            unread.shards[0].stopped,
            Some((_, StopReason::GapUnread(_)))
        ),
        "{unread:?}"
    );
    assert_eq!(seen.all(), Vec::<u64>::new());
    let c = key_state(store.as_ref(), "c").await;
    assert_eq!(
        c.reported.map(|mark| mark.to_string()),
        Some(stream.records(SHARD)[1].sequence.clone()),
        "c is marked where the lane was reported"
    );
    // The lane's next batch holds only c's 4: c's mark proves the gap, and c's 2 runs first.
    let next = processor
        .process_batch(memory_pick(&stream, SHARD, &[4]), &context("3", 60_000))
        .await
        .unwrap();
    assert!(next.shards[0].stopped.is_none(), "{next:?}");
    assert_eq!(
        seen.all(),
        [2, 4],
        "c's, once each, in order; a's are a's lane's"
    );
}

/// The row of `partition_key` of the shard [`SHARD`] of the stream `orders`, as stored.
async fn key_state(store: &dyn CheckpointStore, partition_key: &str) -> LeaseState {
    CheckpointStore::read(
        store,
        &LeaseKey::new("orders", format!("{SHARD}:{partition_key}")),
    )
    .await
    .unwrap()
}

/// A key in neither the lane's reported batch nor the batch that finds the gap: a0 is reported
/// (a is marked there) and the mapping gives up on it and on b1, which it never delivered; the
/// lane's next batch holds a2, whose mark proves the range and reads a0 and b1. b is neither
/// the batch's key nor marked, so b1 is left to b's lane, which may be another one; but it is
/// this one, and b's next batch (b3) carried no mark, so it ran without b1 (seeds 219882 and,
/// in the other order, 143770 of the invariant scenarios). Now b is marked at b1 when the
/// range is read, and b's next batch proves the range and runs b1 first.
#[tokio::test]
async fn in_the_partition_key_mode_a_key_found_in_a_skipped_range_that_is_neither_the_batchs_nor_marked_is_marked_there()
 {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    for (n, key) in ["a", "b", "a", "b"].iter().enumerate() {
        stream.put(key, serde_json::json!({ "n": n }).to_string());
    }
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::by_partition_key(store.clone(), seen.handler(&[0])).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let first = processor
        .process_batch(memory_pick(&stream, SHARD, &[0]), &context("1", 60_000))
        .await
        .unwrap();
    assert!(
        first.shards[0].stopped.is_some(),
        "a0 is reported: {first:?}"
    );
    // The mapping gave up on a0 and on b1; the lane's next batch holds a2.
    let found = processor
        .process_batch(memory_pick(&stream, SHARD, &[2]), &context("2", 60_000))
        .await
        .unwrap();
    assert!(found.shards[0].stopped.is_none(), "{found:?}");
    assert!(
        found.shards[0].gap.is_some(),
        "a's mark proves the range: {found:?}"
    );
    assert_eq!(seen.all(), [0, 2], "a's, in order; b1 is left to b's lane");
    let b = key_state(store.as_ref(), "b").await;
    assert_eq!(
        b.reported.map(|mark| mark.to_string()),
        Some(stream.records(SHARD)[1].sequence.clone()),
        "b is marked at b1, its first record not done"
    );
    assert_eq!(b.checkpoint, None, "and nothing of b is done");
    // b's next batch: its mark proves the range from b1, which runs first.
    let next = processor
        .process_batch(memory_pick(&stream, SHARD, &[3]), &context("3", 60_000))
        .await
        .unwrap();
    assert!(next.shards[0].stopped.is_none(), "{next:?}");
    assert!(
        next.shards[0].gap.is_some(),
        "b's mark proves the range: {next:?}"
    );
    assert_eq!(
        seen.all(),
        [0, 2, 1, 3],
        "every record once, in order per key"
    );
    let b = key_state(store.as_ref(), "b").await;
    assert_eq!(b.reported, None, "b's lane is past its mark");
}

/// The marks the open-marks row of the shard [`SHARD`] of `orders` lists, as stored.
async fn open_marks(store: &dyn CheckpointStore) -> Vec<String> {
    let row = LeaseKey::new("orders", format!("{SHARD}#open"));
    let state = CheckpointStore::read(store, &row).await.unwrap();
    state
        .open_marks
        .iter()
        .map(|open| open.mark.to_string())
        .collect()
}

/// The other order (seed 143770 of the invariant scenarios): a0 is reported and the mapping
/// gives up on it for its age, and on b1 after it, which it never delivered; b's next batch
/// (b2, young) comes before any batch of the lane read the range. b has no row and no mark, and
/// b2 is too young to be suspect, so b2 ran, b's checkpoint passed b1, and no later reading
/// took b1 for anything but done. Now the shard's open-marks row lists a0 (with its arrival)
/// when the lane is reported there; once a0 is older than the limit, a batch holding a key
/// whose checkpoint lies before it reads from a0: b1 runs before b2, and a is marked at a0.
/// The mark goes once a batch delivered the limit and 20 minutes after a0 arrived has read up
/// to its first record.
#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_young_batch_of_a_key_no_row_marks_reads_from_an_open_mark_older_than_the_limit()
 {
    let (stream, store, seen, processor) = aged_parts_setup(&["a", "b"], &[0]);
    let open_row = LeaseKey::new("orders", format!("{SHARD}#open"));
    let first = processor
        .process_batch(
            memory_pick_arrived(&stream, SHARD, &[0]),
            &context("1", 60_000),
        )
        .await
        .unwrap();
    assert!(
        first.shards[0].stopped.is_some(),
        "a0 is reported: {first:?}"
    );
    let a0 = stream.records(SHARD)[0].sequence.clone();
    assert_eq!(
        open_marks(store.as_ref()).await,
        std::slice::from_ref(&a0),
        "the lane's mark is open"
    );
    // The mapping drops a0 and b1 for their age; b2 is written just now.
    tokio::time::sleep(AGE_LIMIT + Duration::from_secs(1)).await;
    stream.put("b", serde_json::json!({ "n": 2 }).to_string());
    let young = processor
        .process_batch(
            memory_pick_arrived(&stream, SHARD, &[2]),
            &context("2", 60_000),
        )
        .await
        .unwrap();
    assert!(young.shards[0].stopped.is_none(), "{young:?}");
    assert!(
        young.shards[0].gap.is_some(),
        "the open mark's range is read: {young:?}"
    );
    assert_eq!(
        seen.all(),
        [1, 2],
        "b's, once each, in order; a0 is a's lane's"
    );
    let a = key_state(store.as_ref(), "a").await;
    assert_eq!(
        a.reported.map(|mark| mark.to_string()),
        Some(a0.clone()),
        "a stays marked at a0"
    );
    let open = CheckpointStore::read(store.as_ref(), &open_row)
        .await
        .unwrap();
    let b2 = stream.records(SHARD)[2].sequence.clone();
    assert_eq!(
        open.reported.as_ref().map(ToString::to_string),
        Some(b2.clone()),
        "the reading stopped at b2"
    );
    assert_eq!(open.open_marks.len(), 1, "a0 is still open: {open:?}");
    // a's next batch proves its own range from its mark (read two records at a time): a0
    // runs first.
    stream.put("a", serde_json::json!({ "n": 3 }).to_string());
    let a3 = memory_pick_arrived(&stream, SHARD, &[3]);
    deliver_until_run(&processor, &a3, 3, &seen).await;
    assert_eq!(
        seen.all(),
        [1, 2, 0, 3],
        "every record once, in order per key"
    );
    assert_eq!(
        open_marks(store.as_ref()).await,
        std::slice::from_ref(&a0),
        "a3's first delivery was reported at a3, and its next went past it, young: a3's mark went"
    );
    // Long after: a new key's batch reads on, and a0's mark goes.
    tokio::time::sleep(Duration::from_mins(23)).await;
    stream.put("c", serde_json::json!({ "n": 4 }).to_string());
    let c4 = processor
        .process_batch(
            memory_pick_arrived(&stream, SHARD, &[4]),
            &context("4", 60_000),
        )
        .await
        .unwrap();
    assert!(c4.shards[0].stopped.is_none(), "{c4:?}");
    assert_eq!(seen.all(), [1, 2, 0, 3, 4]);
    assert_eq!(
        open_marks(store.as_ref()).await,
        Vec::<String>::new(),
        "no record after a0 can be dropped any more"
    );
    let open = CheckpointStore::read(store.as_ref(), &open_row)
        .await
        .unwrap();
    assert_eq!(
        open.reported.map(|progress| progress.to_string()),
        Some(stream.records(SHARD)[4].sequence.clone())
    );
}

/// The same widened range, its lane's row unreadable when the lane's next batch comes (a
/// throttled read, twice). The range was then read from the lane's mark, as if nothing of it
/// had been read: where the first part ended may lie below the mark, and a batch not old enough
/// to be widened again passed the lane's key's records in between (seed 134302 of the
/// invariant scenarios lost one so). Now that delivery runs nothing and reports the batch, and
/// the next one reads on from the lane's row.
#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_lane_whose_row_cannot_be_read_does_not_read_its_range_from_its_mark()
 {
    let (stream, faults, seen, processor) = aged_parts_setup(&["a", "a", "b", "a", "a"], &[3]);
    // a0 and a1 were dropped for their age before any delivery; a3 fails (a is marked there),
    // and the mapping gives up on it.
    let report = processor
        .process_batch(memory_pick(&stream, SHARD, &[3]), &context("1", 60_000))
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_some(), "{report:?}");
    // a4, nearly as old as the limit: its range is read from the shard's start, two records
    // at a time; the first part runs a0 and the lane's row says the reading goes on at a1.
    tokio::time::sleep(Duration::from_secs(58)).await;
    let first = processor
        .process_batch(memory_pick(&stream, SHARD, &[4]), &context("2", 60_000))
        .await
        .unwrap();
    assert!(
        first.shards[0].stopped.is_some(),
        "read in parts: {first:?}"
    );
    assert_eq!(seen.all(), [0]);
    // The mapping gives up on a4 too; the lane's next batch is a5, written just now.
    stream.put("a", serde_json::json!({ "n": 5 }).to_string());
    let a5 = memory_pick(&stream, SHARD, &[5]);
    faults
        .layer()
        .lane_reads_fail
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let unread = processor
        .process_batch(a5.clone(), &context("3", 60_000))
        .await
        .unwrap();
    assert!(
        matches!(
            unread.shards[0].stopped,
            Some((_, StopReason::GapUnread(_)))
        ),
        "{unread:?}"
    );
    assert_eq!(seen.all(), [0], "nothing ran without the lane's row");
    deliver_until_run(&processor, &a5, 6, &seen).await;
    assert_eq!(seen.all(), [0, 1, 3, 4, 5], "a's, once each, in order");
}

/// A range read only for the batch's age (no mark proves it) whose part ends at a record that
/// is another lane's mark: the batch's keys were marked there, the lane's row of that mark
/// (another lane's, read on past this lane's records) was taken for theirs, and those records
/// were skipped. Now a part read whole moves the keys' checkpoints to its end instead.
#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_range_read_in_parts_for_the_batchs_age_does_not_take_another_lanes_row_for_its_own()
 {
    let keys = ["b", "a", "b", "b", "b", "a", "b"];
    let (stream, store, seen, processor) = aged_parts_setup(&keys, &[1]);
    // a's lane: a1 fails (a marked there), then the mapping gives up on it, and a5, old, reads
    // the lane's range in parts: the lane's row at a1 goes on to b4.
    let report = processor
        .process_batch(memory_pick(&stream, SHARD, &[1]), &context("a1", 60_000))
        .await
        .unwrap();
    assert!(report.shards[0].stopped.is_some(), "{report:?}");
    tokio::time::sleep(Duration::from_secs(58)).await;
    deliver_until_run(&processor, &memory_pick(&stream, SHARD, &[5]), 6, &seen).await;
    assert_eq!(seen.all(), [1, 5]);
    let records = stream.records(SHARD);
    let lane = LeaseKey::new("orders", format!("{SHARD}#lane:{}", records[1].sequence));
    assert!(
        CheckpointStore::read(store.as_ref(), &lane)
            .await
            .unwrap()
            .reported
            .is_some(),
        "a's lane's row"
    );
    // b's lane lost b0, b2, b3 and b4 for their age; its batch b6, as old, reads from the
    // shard's start, its first part ending at a1, a's mark.
    let deliveries =
        deliver_until_run(&processor, &memory_pick(&stream, SHARD, &[6]), 8, &seen).await;
    assert!(deliveries > 1, "read in parts");
    let b: Vec<u64> = seen
        .all()
        .into_iter()
        .filter(|n| keys[usize::try_from(*n).unwrap()] == "b")
        .collect();
    assert_eq!(b, [0, 2, 3, 4, 6], "b's, once each, in order");
}

/// A range read only for the batch's age finds records of a key that is neither the batch's
/// nor its lane's: the key is marked at its first record not done there, so that its next
/// batch, young, proves the range and runs them first. The reading of that key's row is
/// refused once (a throttle refuses one request) and read again: unread, the key went unmarked,
/// and its records were lost (seed 7219311 of the invariant scenarios).
#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_key_found_in_a_range_read_for_the_batchs_age_is_marked_when_the_reading_of_its_row_is_refused_once()
 {
    let keys = ["s", "a", "s", "a"];
    let (stream, store, seen, processor) = aged_parts_setup(&keys, &[]);
    // The mapping dropped s0, a1 and s2 for their age; a's batch a3 is nearly as old.
    tokio::time::sleep(Duration::from_secs(58)).await;
    store
        .layer()
        .key_reads_fail
        .store(1, std::sync::atomic::Ordering::SeqCst);
    deliver_until_run(&processor, &memory_pick(&stream, SHARD, &[3]), 4, &seen).await;
    assert_eq!(
        seen.all(),
        [1, 3],
        "a's records, the lane's, once each, in order"
    );
    assert_eq!(
        store
            .layer()
            .key_reads_fail
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the reading of s's row was refused once"
    );
    let s = CheckpointStore::read(
        store.as_ref(),
        &kinesis_checkpoint::store::row_key(&LeaseKey::new("orders", SHARD), "s"),
    )
    .await
    .unwrap();
    assert_eq!(
        s.reported.map(|mark| mark.to_string()),
        Some(stream.records(SHARD)[0].sequence.clone()),
        "s is marked at its first record not done"
    );
    // s's next record comes, young: its mark proves the range, and s0 and s2 run first.
    stream.put("s", serde_json::json!({ "n": 4 }).to_string());
    deliver_until_run(&processor, &memory_pick(&stream, SHARD, &[4]), 4, &seen).await;
    assert_eq!(seen.all(), [1, 3, 0, 2, 4], "s's, once each, in order");
}

/// A parent of eight records (a customer's and a supplier's in turn) on a clock, split, its
/// first batch of two done and the rest given up on by the mapping; a fresh partition-key
/// processor per process (`fresh`), its gate told the record age and reading two records a part.
struct LongParent {
    clock: Arc<dyn kinesis_checkpoint::clock::Clock>,
    stream: kinesis_checkpoint::local::MemoryStream,
    store: Arc<MemoryLeaseStore>,
    seen: Seen,
}

impl LongParent {
    async fn split() -> Self {
        use kinesis_checkpoint::clock::TokioClock;
        let clock: Arc<dyn kinesis_checkpoint::clock::Clock> =
            Arc::new(TokioClock::starting_at(1_764_512_345_000));
        let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1).clock(clock.clone());
        for n in 0..8_u64 {
            let key = if n % 2 == 0 { "customer" } else { "supplier" };
            stream.put(key, serde_json::json!({ "n": n }).to_string());
        }
        stream.split(SHARD);
        let setup = Self {
            store: Arc::new(MemoryLeaseStore::with_clock(clock.clone())),
            clock,
            stream,
            seen: Seen::default(),
        };
        setup
            .fresh()
            .process_batch(
                memory_delivery(&setup.stream, PARENT, 0..2),
                &context("p", 60_000),
            )
            .await
            .unwrap();
        assert_eq!(setup.seen.all(), [0, 1]);
        setup
    }

    /// The processor of a new process: nothing learnt of the parent yet.
    fn fresh(&self) -> Processor<impl Handler + use<>, kinesis_checkpoint::PartitionKeyMode> {
        let gate = Gate::new(
            Arc::new(Capped {
                stream: self.stream.clone(),
                cap: 2,
            }),
            StartingPosition::TrimHorizon,
        )
        .clock(self.clock.clone())
        .maximum_record_age(AGE_LIMIT);
        Processor::by_partition_key(self.store.clone(), self.seen.handler(&[]))
            .clock(self.clock.clone())
            .gate(gate)
    }
}

/// A closed parent too long for one held check to read whole, whose tail the mapping gave up on,
/// checked by a fresh process at every held delivery. Each fresh gate starts again after the
/// parent row's checkpoint and reads a part or two, so it never learnt the parent's youngest
/// record, and the tail rule never applied: the child was held until the parent expired, the
/// tail lost. Now the held shard's oldest record, which arrived after every record of its
/// parents, bounds the parent's youngest, and the tail (its keys not all known) runs whatever
/// its keys, deduped by their rows.
#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_closed_parents_tail_too_long_for_one_check_runs_from_its_child_checked_by_fresh_processes()
 {
    let setup = LongParent::split().await;
    for n in 8..10_u64 {
        setup
            .stream
            .put("customer", serde_json::json!({ "n": n }).to_string());
    }
    let LongParent {
        stream,
        store,
        seen,
        ..
    } = &setup;
    let child = stream.shard_of("customer");
    let fresh = || setup.fresh();

    let deliver = async |request: &str| {
        fresh()
            .process_batch(
                memory_delivery(stream, &child, 0..2),
                &context(request, 60_000),
            )
            .await
            .unwrap()
    };
    let early = deliver("c0").await;
    assert!(held(&early), "{early:?}");
    tokio::time::sleep(BEYOND_EVERY_INVOCATION + Duration::from_secs(5)).await;
    let mut deliveries = 0;
    loop {
        deliveries += 1;
        assert!(deliveries <= 8, "the child is still held: {:?}", seen.all());
        let report = deliver(&format!("c{deliveries}")).await;
        if report.shards[0].stopped.is_none() {
            break;
        }
    }
    let all = seen.all();
    let mut parent_ran = all[..8].to_vec();
    parent_ran.sort_unstable();
    assert_eq!(
        parent_ran,
        (0..8).collect::<Vec<_>>(),
        "the whole tail, once each"
    );
    let supplier = |n: &u64| *n < 8 && n % 2 == 1;
    let customer: Vec<u64> = all.iter().copied().filter(|n| !supplier(n)).collect();
    let suppliers: Vec<u64> = all.iter().copied().filter(supplier).collect();
    assert_eq!(
        customer,
        [0, 2, 4, 6, 8, 9],
        "the customer's in order, the child's last"
    );
    assert_eq!(suppliers, [1, 3, 5, 7], "the supplier's in order");
    assert_eq!(all[8..], [8, 9]);
    assert_eq!(
        store
            .read(&LeaseKey::new("orders", PARENT))
            .await
            .unwrap()
            .position()
            .unwrap(),
        Some(Position::ShardEnd)
    );
}

/// The same, but the child's first record arrives long after the split: its oldest record
/// bounds nothing while its batch can still be delivered, and a fresh gate never read the parent
/// to its end. The reading towards the end now goes on from the parent's scan row, one part per
/// held check in whatever process, until it meets the youngest record.
#[tokio::test(start_paused = true)]
async fn in_the_partition_key_mode_a_closed_parents_end_is_learnt_over_fresh_processes_when_its_child_starts_late()
 {
    let setup = LongParent::split().await;
    let LongParent {
        stream,
        store,
        seen,
        ..
    } = &setup;
    let fresh = || setup.fresh();
    // The child's first records, long after the parent's last.
    tokio::time::sleep(BEYOND_EVERY_INVOCATION + Duration::from_secs(5)).await;
    for n in 8..10_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    let child = stream.shard_of("customer");
    let mut deliveries = 0;
    loop {
        deliveries += 1;
        assert!(
            deliveries <= 12,
            "the child is still held: {:?}",
            seen.all()
        );
        let report = fresh()
            .process_batch(
                memory_delivery(stream, &child, 0..2),
                &context(&format!("c{deliveries}"), 60_000),
            )
            .await
            .unwrap();
        if report.shards[0].stopped.is_none() {
            break;
        }
    }
    let all = seen.all();
    let mut parent_ran = all[..8].to_vec();
    parent_ran.sort_unstable();
    assert_eq!(
        parent_ran,
        (0..8).collect::<Vec<_>>(),
        "the whole tail, once each"
    );
    assert_eq!(all[8..], [8, 9]);
    let scan = LeaseKey::new("orders", format!("{PARENT}#scan"));
    assert!(
        store.read(&scan).await.unwrap().reported.is_some(),
        "how far the reading got is in the parent's scan row"
    );
}

/// The partition-key mode's gate reads a closed parent in parts (10,000 records per held batch)
/// and keeps what it read in its own process only. A child whose every held delivery lands in
/// a fresh process (a new sandbox) read the same first part each time and was held until the
/// parent expired. Now a part whose keys are all done is recorded in the parent's row, and the
/// next process reads on after it.
#[tokio::test]
async fn in_the_partition_key_mode_a_closed_parent_read_in_parts_by_fresh_processes_is_found_done_and_lets_its_child_run()
 {
    parent_read_in_parts_by_fresh_processes(false).await;
}

/// The same, with the write that records the first part done refused once (a throttle). It
/// took the parent's lease to write, and the lease lingered for its whole TTL: every held
/// delivery meanwhile found it taken and recorded nothing, so a long parent moved one part per
/// lease instead of one per delivery (seeds 13548 and 17411 of the invariant scenarios: the
/// child still held when its key's last record stopped coming). Now the parent's row is written
/// again once, as the keys' rows are.
#[tokio::test]
async fn in_the_partition_key_mode_a_refused_write_of_how_far_a_closed_parent_is_done_does_not_leave_its_lease_taken()
 {
    parent_read_in_parts_by_fresh_processes(true).await;
}

/// A parent of six records of one key, split and done, then its child (two records) delivered
/// to a fresh processor per delivery whose gate reads two records a part, until it runs; with
/// `throttled`, the first write of the parent's row is refused once.
async fn parent_read_in_parts_by_fresh_processes(throttled: bool) {
    let stream = kinesis_checkpoint::local::MemoryStream::new("orders", 1);
    for n in 0..6_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    stream.split(SHARD);
    for n in 6..8_u64 {
        stream.put("customer", serde_json::json!({ "n": n }).to_string());
    }
    let child = stream.shard_of("customer");
    let store = Arc::new(common::faults::faulty(Arc::new(MemoryLeaseStore::new())));
    let seen = Seen::default();
    // A gate per process, reading at most two records a part.
    let fresh = || {
        Processor::by_partition_key(store.clone(), seen.handler(&[])).gate(Gate::new(
            Arc::new(Capped {
                stream: stream.clone(),
                cap: 2,
            }),
            StartingPosition::TrimHorizon,
        ))
    };
    let parent_done = fresh()
        .process_batch(
            memory_delivery(&stream, PARENT, 0..6),
            &context("p", 60_000),
        )
        .await
        .unwrap();
    assert!(parent_done.shards[0].stopped.is_none(), "{parent_done:?}");
    assert_eq!(seen.all(), (0..6).collect::<Vec<_>>());

    let records = stream.records(PARENT);
    let parent = LeaseKey::new("orders", PARENT);
    store
        .layer()
        .throttle_next_commit
        .store(throttled, std::sync::atomic::Ordering::SeqCst);
    let mut deliveries = 0;
    loop {
        deliveries += 1;
        assert!(deliveries <= 6, "the child is still held: {:?}", seen.all());
        let report = fresh()
            .process_batch(
                memory_delivery(&stream, &child, 0..2),
                &context(&format!("c{deliveries}"), 60_000),
            )
            .await
            .unwrap();
        if deliveries == 1 {
            assert!(held(&report), "{report:?}");
            let row = CheckpointStore::read(store.as_ref(), &parent)
                .await
                .unwrap();
            assert_eq!(
                row.checkpoint.as_deref(),
                Some(records[1].sequence.as_str()),
                "the first part, found done, is recorded in the parent's row"
            );
            assert_eq!(row.lease_owner, None, "and the parent's lease released");
        }
        if report.shards[0].stopped.is_none() {
            break;
        }
    }
    assert_eq!(
        seen.all(),
        (0..8).collect::<Vec<_>>(),
        "each once, in order"
    );
    assert_eq!(
        CheckpointStore::read(store.as_ref(), &parent)
            .await
            .unwrap()
            .position()
            .unwrap(),
        Some(Position::ShardEnd)
    );
}
