//! A record that kills its invocation (out of memory, an abort, a crash): the next claim finds
//! the batch the dead invocation was running by the mark its claim left and its lapsed lease,
//! runs the batch one record at a time, each pinned in the row before it runs, and counts
//! each death on the record it pins; a record out of attempts is dead-lettered from the event
//! without running again. On the embedded store, on virtual time: an invocation dies when the
//! test drops its future.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{batch, context, n_of, redeliver_from, reported, sequence};
use kinesis_checkpoint::clock::Clock;
use kinesis_checkpoint::internal::{Call, Layer, Layered, Next, Operation};
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::store::{LeaseError, LeaseStore};
use kinesis_checkpoint::{
    BoxFuture, Handler, LeaseKey, MemoryLeaseStore, Outcome, Position, Processor, Record,
};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use kinesis_checkpoint_testing::TokioClock;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

/// Counts the writes that keep the lease (a careful run's marks) and every other call.
#[derive(Default)]
struct Calls(Mutex<HashMap<&'static str, usize>>);

impl Calls {
    fn count(&self, what: &'static str) -> usize {
        self.0
            .lock()
            .unwrap()
            .get(what)
            .copied()
            .unwrap_or_default()
    }

    fn reset(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl Layer for Calls {
    fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        let what = match (call.operation(), call.commit()) {
            (Operation::Commit, Some(commit)) if commit.keep_lease => "mark",
            (Operation::Commit, _) => "commit",
            (Operation::AcquireAndRead, _) => "claim",
            _ => "other",
        };
        *self.0.lock().unwrap().entry(what).or_default() += 1;
        next.run(call)
    }
}

/// Every record the handler finished, in order; the record `killer` never comes back.
#[derive(Clone, Default)]
struct Ran(Arc<Mutex<Vec<u64>>>);

impl Ran {
    fn handler(&self, killer: u64) -> impl Handler + use<> {
        let ran = self.clone();
        move |record: Record| {
            let ran = ran.clone();
            async move {
                let n = n_of(&record);
                if n == killer {
                    // The process dies here: the test drops the invocation.
                    std::future::pending::<()>().await;
                }
                ran.0.lock().unwrap().push(n);
                Outcome::ack()
            }
        }
    }

    fn all(&self) -> Vec<u64> {
        self.0.lock().unwrap().clone()
    }
}

struct Setup {
    clock: Arc<dyn Clock>,
    memory: Arc<MemoryLeaseStore>,
    calls: Arc<Layered<MemoryLeaseStore, Counting>>,
    letters: Arc<MemoryDeadLetters>,
    ran: Ran,
}

/// [`Calls`], shared with the test.
struct Counting(Arc<Calls>);

impl Layer for Counting {
    fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        self.0.wrap(call, next)
    }
}

impl Setup {
    fn new() -> Self {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_764_512_345_000));
        let memory = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
        Self {
            calls: Arc::new(Layered::new(memory.clone(), Counting(Arc::default()))),
            memory,
            clock,
            letters: Arc::new(MemoryDeadLetters::new()),
            ran: Ran::default(),
        }
    }

    fn processor(&self, killer: u64, max_attempts: u32) -> Processor<impl Handler + use<>> {
        Processor::new(self.calls.clone(), self.ran.handler(killer))
            .clock(self.clock.clone())
            .lease_ttl(Duration::from_millis(300))
            .dead_letters(self.letters.clone())
            .max_attempts(max_attempts)
    }

    /// Delivers `event` as the mapping does; `None` when the invocation died (it ran longer
    /// than a second: the killer never comes back), after which its lease lapses.
    async fn deliver(
        &self,
        processor: &Processor<impl Handler>,
        event: aws_lambda_events::event::kinesis::KinesisEvent,
        request: &str,
    ) -> Option<kinesis_checkpoint::BatchReport> {
        let mut context = context(request, 0);
        context.deadline = self.clock.now_millis() + 60_000;
        let answer = tokio::time::timeout(
            Duration::from_secs(1),
            processor.process_batch(event, &context),
        )
        .await;
        if answer.is_err() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        answer.ok().map(Result::unwrap)
    }

    fn row(&self) -> kinesis_checkpoint::store::LeaseState {
        self.memory.snapshot()[&LeaseKey::new(STREAM, SHARD)].clone()
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_death_the_next_claim_runs_the_batch_one_record_at_a_time_each_pinned() {
    let setup = Setup::new();
    // Record 2 kills the first invocation only.
    let processor = setup.processor(2, 3);
    let event = batch(STREAM, SHARD, 0..5);
    assert!(
        setup
            .deliver(&processor, event.clone(), "r1")
            .await
            .is_none()
    );
    assert_eq!(
        setup.ran.all(),
        [0, 1],
        "the first invocation died at record 2"
    );
    let row = setup.row();
    assert_eq!(row.checkpoint, None, "it wrote nothing but its claim");
    assert_eq!(
        row.reported,
        Some(Position::record(sequence(0).parse().unwrap())),
        "the claim's mark"
    );

    // The second delivery: the killer comes back this time (a new process).
    setup.calls.layer().0.reset();
    let healed = setup.processor(u64::MAX, 3);
    let report = setup
        .deliver(&healed, event, "r2")
        .await
        .expect("the record comes back now");
    let shard = &report.shards[0];
    assert_eq!(
        shard.died_at,
        Some(Position::record(sequence(0).parse().unwrap())),
        "the claim found the batch the dead invocation ran"
    );
    assert_eq!(setup.ran.all(), [0, 1, 0, 1, 2, 3, 4]);
    assert_eq!(shard.count(Disposition::Processed), 5);
    let calls = &setup.calls.layer().0;
    assert_eq!(calls.count("mark"), 5, "one mark before each record");
    assert_eq!((calls.count("claim"), calls.count("commit")), (1, 1));
    let row = setup.row();
    assert_eq!(row.checkpoint, Some(sequence(4)));
    assert_eq!(row.failing, None, "no pin is left");
    assert_eq!(row.lease_owner, None);

    // The next batch pays nothing: two requests, as ever.
    calls.reset();
    let next = setup
        .deliver(&healed, batch(STREAM, SHARD, 5..8), "r3")
        .await
        .unwrap();
    assert_eq!(next.shards[0].died_at, None);
    assert_eq!(
        (
            calls.count("claim"),
            calls.count("commit"),
            calls.count("mark")
        ),
        (1, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_record_that_kills_every_invocation_is_dead_lettered_after_max_attempts_pinned_deaths() {
    let setup = Setup::new();
    let processor = setup.processor(2, 2);
    let batch = batch(STREAM, SHARD, 0..5);
    let (mut event, mut deliveries, mut deaths) = (batch.clone(), 0, 0);
    let report = loop {
        deliveries += 1;
        assert!(deliveries < 10, "never dead-lettered");
        match setup
            .deliver(&processor, event.clone(), &format!("r{deliveries}"))
            .await
        {
            None => deaths += 1,
            Some(report) => match reported(&report.response()).first() {
                None => break report,
                Some(from) => event = redeliver_from(&batch, from),
            },
        }
    };
    // One death finds the batch; the next two, each with record 2 pinned, count; the fourth
    // delivery dead-letters it without running it.
    assert_eq!((deaths, deliveries), (3, 4));
    assert_eq!(report.shards[0].count(Disposition::DeadLettered), 1);
    let letters = setup.letters.letters();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.record.sequence().as_str(), sequence(2));
    assert_eq!(letter.attempts, 2);
    assert!(letter.error.contains("died"), "{}", letter.error);
    assert_eq!(n_of(&letter.record), 2, "sent from the event's payload");
    let ran = setup.ran.all();
    assert_eq!(
        ran.iter().filter(|n| **n > 2).count(),
        2,
        "the records after it run once: {ran:?}"
    );
    assert!(ran.ends_with(&[3, 4]), "in order, after it: {ran:?}");
    let row = setup.row();
    assert_eq!(row.checkpoint, Some(sequence(4)));
    assert_eq!(row.failing, None);
}

/// A five-method store keeps no mark: a death goes unnoticed, and the shard runs as ever.
#[tokio::test(start_paused = true)]
async fn a_store_of_the_seed_crates_five_methods_finds_no_death() {
    let setup = Setup::new();
    let seed = Arc::new(kinesis_checkpoint::store::SeedStore::new(
        setup.memory.clone(),
    ));
    let processor = |killer| {
        Processor::new(seed.clone(), setup.ran.handler(killer))
            .clock(setup.clock.clone())
            .lease_ttl(Duration::from_millis(300))
    };
    let event = batch(STREAM, SHARD, 0..3);
    assert!(
        setup
            .deliver(&processor(1), event.clone(), "r1")
            .await
            .is_none()
    );
    let report = setup
        .deliver(&processor(u64::MAX), event, "r2")
        .await
        .unwrap();
    assert_eq!(report.shards[0].died_at, None);
    assert!(
        LeaseStore::read(setup.memory.as_ref(), &LeaseKey::new(STREAM, SHARD))
            .await
            .unwrap()
            .failing
            .is_none()
    );
}
