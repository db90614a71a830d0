//! What the clock does to a batch: a record cut by the invocation's deadline is not charged for
//! it unless it had a fair share of the time, and the local view of the lease never outlives the
//! stored one (counted from the claim's request, renewed while the gate reads the stream), and
//! the cheap reading the engine checks before each record, up to 100 ms behind the precise time,
//! changes no decision: no record starts inside the deadline's margin or after the lease
//! lapsed, no handler's time is stretched, no attempt is charged that the precise time would not
//! charge.

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::faults::faulty;
use common::{batch, context, n_of, redeliver_from, sequence};
use kinesis_checkpoint::gate::{Gate, ShardInfo, StartingPosition, Topology, TopologyError};
use kinesis_checkpoint::report::StopReason;
use kinesis_checkpoint::{
    BoxFuture, DeadLetterSink, LeaseKey, MemoryLeaseStore, Outcome, Processor, Record,
};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use kinesis_checkpoint_testing::TokioClock;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

fn key() -> LeaseKey {
    LeaseKey::new(STREAM, SHARD)
}

/// Every record the handler saw to its end, in order, across invocations and processors.
#[derive(Clone, Default)]
struct Handled(Arc<Mutex<Vec<u64>>>);

impl Handled {
    fn all(&self) -> Vec<u64> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn a_healthy_record_started_near_the_deadline_is_not_charged_an_attempt_nor_dead_lettered() {
    let store = Arc::new(MemoryLeaseStore::new());
    let sink = Arc::new(MemoryDeadLetters::new());
    let handled = Handled::default();
    let seen = handled.clone();
    // Record 0 takes most of the invocation; record 1 needs 400 ms and starts with about 300 ms
    // left, so the deadline cuts it. One attempt is all a record gets before it is dead-lettered.
    let processor = Processor::new(store.clone(), move |record: Record| {
        let seen = seen.clone();
        async move {
            let n = n_of(&record);
            let work = if n == 0 { 900 } else { 400 };
            tokio::time::sleep(Duration::from_millis(work)).await;
            seen.0.lock().unwrap().push(n);
            Outcome::ack()
        }
    })
    .dead_letters(sink.clone() as Arc<dyn DeadLetterSink>)
    .max_attempts(1)
    .deadline_margin(Duration::from_millis(100));

    let first = processor
        .process_batch(batch(STREAM, SHARD, 0..3), &context("r1", 1_300))
        .await
        .unwrap();

    assert_eq!(
        first.shards[0].stopped,
        Some((sequence(1).parse().unwrap(), StopReason::HandlerTimedOut))
    );
    assert!(
        sink.letters().is_empty(),
        "a record cut by the deadline is no poison"
    );
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(0)));
    assert_eq!(
        row.failing, None,
        "the cut is not counted as a failed attempt"
    );

    // Delivered again with the whole invocation to itself, it succeeds.
    let again = processor
        .process_batch(
            redeliver_from(&batch(STREAM, SHARD, 0..3), &sequence(1)),
            &context("r2", 5_000),
        )
        .await
        .unwrap();
    assert_eq!(again.shards[0].stopped, None);
    assert_eq!(handled.all(), [0, 1, 2]);
    assert!(sink.letters().is_empty());
}

#[tokio::test]
async fn a_record_that_hangs_with_the_whole_invocation_to_itself_is_dead_lettered_in_the_end() {
    let store = Arc::new(MemoryLeaseStore::new());
    let sink = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::new(store.clone(), |record: Record| async move {
        if n_of(&record) == 0 {
            std::future::pending::<()>().await;
        }
        Outcome::ack()
    })
    .dead_letters(sink.clone() as Arc<dyn DeadLetterSink>)
    .max_attempts(2)
    .deadline_margin(Duration::from_millis(100));

    let events = batch(STREAM, SHARD, 0..2);
    let first = processor
        .process_batch(events.clone(), &context("r1", 400))
        .await
        .unwrap();
    assert_eq!(
        first.shards[0].stopped,
        Some((sequence(0).parse().unwrap(), StopReason::HandlerTimedOut))
    );
    let row = store.read(&key()).await.unwrap();
    assert_eq!(
        row.failing
            .as_ref()
            .map(|failing| (failing.sequence.clone(), failing.attempts)),
        Some((sequence(0), 1)),
        "a record that had the whole time counts its attempt"
    );

    let second = processor
        .process_batch(events, &context("r2", 400))
        .await
        .unwrap();
    // Its second whole-time attempt is its last: it is dead-lettered, and the deadline then
    // leaves no time for the record after it.
    assert_eq!(
        second.shards[0].stopped,
        Some((sequence(1).parse().unwrap(), StopReason::Deadline))
    );
    let letters = sink.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].record.sequence().to_string(), sequence(0));
    assert_eq!(letters[0].attempts, 2);
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(0)));
    assert_eq!(row.failing, None);
}

/// A stream of one shard whose listing takes `delay`: a gate that reads it for longer than the
/// lease lives.
struct SlowListing {
    delay: Duration,
}

impl Topology for SlowListing {
    fn shards<'a>(
        &'a self,
        _stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            Ok(vec![ShardInfo::new(SHARD, Vec::<String>::new(), false)])
        })
    }

    fn exhausted<'a>(
        &'a self,
        _stream: &'a str,
        _shard: &'a str,
        _after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, TopologyError>> {
        Box::pin(async { Ok(false) })
    }

    fn retention<'a>(&'a self, _stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>> {
        Box::pin(async { Ok(Duration::from_hours(24)) })
    }
}

#[tokio::test]
async fn a_lease_is_renewed_while_the_gate_reads_so_a_concurrent_delivery_cannot_take_it() {
    let store = Arc::new(MemoryLeaseStore::new());
    let handled = Handled::default();
    let acking = |handled: Handled| {
        move |record: Record| {
            let handled = handled.clone();
            async move {
                handled.0.lock().unwrap().push(n_of(&record));
                Outcome::ack()
            }
        }
    };
    // The gate takes 2.5 s to list the stream; the lease lives 1 s unless renewed.
    let gated = Processor::new(store.clone(), acking(handled.clone()))
        .gate(Gate::new(
            Arc::new(SlowListing {
                delay: Duration::from_millis(2_500),
            }),
            StartingPosition::TrimHorizon,
        ))
        .lease_ttl(Duration::from_secs(1));
    let first = tokio::spawn({
        let gated = gated.clone();
        async move {
            gated
                .process_batch(batch(STREAM, SHARD, 0..5), &context("gated", 60_000))
                .await
        }
    });

    // A concurrent delivery of the same records, while the first is still in the gate and past
    // its lease's first lifetime.
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let concurrent = Processor::new(store.clone(), acking(handled.clone()))
        .process_batch(batch(STREAM, SHARD, 0..5), &context("concurrent", 60_000))
        .await
        .unwrap();

    assert!(
        matches!(
            concurrent.shards[0].stopped,
            Some((_, StopReason::LeaseHeld { .. }))
        ),
        "the lease was renewed during the gate: {:?}",
        concurrent.shards[0].stopped
    );
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.shards[0].stopped, None);
    assert_eq!(handled.all(), [0, 1, 2, 3, 4], "every record ran once");
    assert_eq!(
        store.read(&key()).await.unwrap().checkpoint,
        Some(sequence(4))
    );
}

const START: u64 = 1_800_000_000_000;

/// A clock at `START`, on tokio's paused time.
fn at_start() -> TokioClock {
    TokioClock::starting_at(START)
}

/// An invocation's context whose deadline is `millis` after `START`.
fn deadline_after(millis: u64) -> lambda_runtime::Context {
    let mut context = context("r1", 0);
    context.deadline = START + millis;
    context
}

/// A processor on a clock at `START`, with one attempt per
/// record and a deadline margin of 100 ms, whose handler hangs on record `hanging`; and an
/// invocation context whose deadline is 1 s after `START`.
fn hanging_on(
    store: &Arc<MemoryLeaseStore>,
    hanging: u64,
) -> (
    Processor<impl kinesis_checkpoint::Handler>,
    lambda_runtime::Context,
) {
    let processor = Processor::new(store.clone(), move |record: Record| async move {
        if n_of(&record) == hanging {
            std::future::pending::<()>().await;
        }
        Outcome::ack()
    })
    .clock(Arc::new(at_start()))
    .max_attempts(1)
    .deadline_margin(Duration::from_millis(100));
    (processor, deadline_after(1_000))
}

#[tokio::test(start_paused = true)]
async fn a_handler_is_not_stretched_past_the_deadline_less_its_margin() {
    let store = Arc::new(MemoryLeaseStore::new());
    let (processor, context) = hanging_on(&store, 1);

    let started = tokio::time::Instant::now();
    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..3), &context)
        .await
        .unwrap();

    assert_eq!(
        report.shards[0].stopped,
        Some((sequence(1).parse().unwrap(), StopReason::HandlerTimedOut))
    );
    // The deadline less its margin is 900 ms away; a limit counted from the lagging reading
    // would end 300 ms later, inside the margin.
    let elapsed = started.elapsed();
    assert!(
        (Duration::from_millis(900)..Duration::from_millis(910)).contains(&elapsed),
        "stopped after {elapsed:?}"
    );
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(0)));
}

#[tokio::test(start_paused = true)]
async fn no_record_starts_inside_the_deadline_margin() {
    let store = Arc::new(MemoryLeaseStore::new());
    // Record 0 hangs until its time limit, the deadline less its margin, and is dead-lettered
    // (one attempt). The cheap reading then says 50 ms are left before the margin; the precise
    // one says none, and record 1 must not start.
    let (processor, context) = hanging_on(&store, 0);
    let sink = Arc::new(MemoryDeadLetters::new());
    let processor = processor.dead_letters(sink.clone() as Arc<dyn DeadLetterSink>);

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..2), &context)
        .await
        .unwrap();

    assert_eq!(sink.letters().len(), 1, "record 0 had the whole time");
    assert_eq!(
        report.shards[0].stopped,
        Some((sequence(1).parse().unwrap(), StopReason::Deadline))
    );
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(0)));
}

#[tokio::test(start_paused = true)]
async fn no_record_starts_once_the_lease_has_lapsed() {
    // Renewals are refused, so the local view of the lease lapses 600 ms after the claim (a TTL
    // of 900 ms less its skew margin, a third of it). Record 0 takes 620 ms: the precise clock
    // then says the lease has lapsed, the cheap reading, 50 ms behind, that 30 ms are left; a
    // rival may hold the shard by now, and record 1 must not start.
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    store.layer().renewals_fail.store(true, Ordering::SeqCst);
    let handled = Handled::default();
    let seen = handled.clone();
    let processor = Processor::new(store.clone(), move |record: Record| {
        let seen = seen.clone();
        async move {
            if n_of(&record) == 0 {
                tokio::time::sleep(Duration::from_millis(620)).await;
            }
            seen.0.lock().unwrap().push(n_of(&record));
            Outcome::ack()
        }
    })
    .clock(Arc::new(at_start()))
    .lease_ttl(Duration::from_millis(900));
    let context = deadline_after(60_000);

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..2), &context)
        .await
        .unwrap();

    assert_eq!(handled.all(), vec![0]);
    assert_eq!(
        report.shards[0].stopped,
        Some((sequence(1).parse().unwrap(), StopReason::Fenced))
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_started_record_is_never_charged_for_the_deadline() {
    // Record 0 takes 520 ms of the invocation's 1 s. Record 1 then starts past the middle by
    // the precise clock (480 ms left: less than half, no fair chance) and before it by the
    // cheap reading, 50 ms behind (530 ms left). It hangs into its time limit: not its own
    // fault, so with one attempt allowed it must not be dead-lettered.
    let store = Arc::new(MemoryLeaseStore::new());
    let sink = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::new(store.clone(), |record: Record| async move {
        match n_of(&record) {
            0 => tokio::time::sleep(Duration::from_millis(520)).await,
            _ => std::future::pending::<()>().await,
        }
        Outcome::ack()
    })
    .clock(Arc::new(at_start()))
    .max_attempts(1)
    .deadline_margin(Duration::from_millis(100))
    .dead_letters(sink.clone() as Arc<dyn DeadLetterSink>);
    let context = deadline_after(1_000);

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..2), &context)
        .await
        .unwrap();

    assert!(sink.letters().is_empty(), "record 1 had no fair chance");
    assert_eq!(
        report.shards[0].stopped,
        Some((sequence(1).parse().unwrap(), StopReason::HandlerTimedOut))
    );
    let row = store.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(0)));
    assert_eq!(row.failing, None, "no attempt charged");
}
