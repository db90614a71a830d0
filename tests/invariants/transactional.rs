//! The transactional family: exactly-once effects under deaths at every point of an invocation.
//!
//! Each scenario of the family is drawn as any shard-mode scenario is (shards, a split and a
//! merge with children delivered early, duplicate and concurrent deliveries, KPL aggregates,
//! per-key concurrency, handler retries, panics, rejects and time-outs, store chaos, mapping
//! discards with gap recovery, clock skew) and then run twice on the same stream: once with a
//! transactional handler, whose effect is its writes into a table of the memory store's table
//! model, committed with the checkpoint; once with a plain handler, whose effect is applied by
//! the handler itself. Both meet the same deaths: an invocation dies after a record's handler,
//! or before or after any of its store calls (the claim, renewals, the gate's reads and marks,
//! each transaction or commit), by chance.
//!
//! The count that matters is how often a record's effect was applied: for the transactional
//! handler it is read from the store's tables ([`MemoryLeaseStore::writes_of`]), not from the
//! handler's bookkeeping, and it must be exactly once for every record not dead-lettered, and at
//! most once for a dead-lettered one; each key's running total (every third record adds to it)
//! must be the number of its records applied. The plain handler may apply a record again after
//! a death (counted, and above 0 over the run: that is the window the transactional handler
//! closes). Neither may lose a record, dead-letter a healthy one, break the order of first
//! handlings per partition key, or handle a child before its parents.
//!
//! Not drawn here: the seed's five methods (`SeedStore` refuses transactions) and a seed-crate
//! consumer beside it (its effects are not the handler's); frozen sandboxes (`skew::Pause`);
//! the partition-key mode (the transactional handler is the shard mode's); beside mapping
//! discards, a death before the invocation's claim landed (a batch the mapping gives up on
//! after deliveries that wrote nothing leaves nothing to find it by, not covered in the
//! README: seed 31 loses a closed parent's tail so when it is drawn).
//!
//! `TRANSACTIONAL_SCENARIOS` sets how many scenarios the family runs (by default a fifth of
//! `INVARIANT_SCENARIOS`); `INVARIANT_SEED` the first; a failing one leaves its trace in
//! `target/invariant-traces/` as the other families do.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use aws_sdk_dynamodb::types::{AttributeValue, Update};
use base64::Engine as _;
use kinesis_checkpoint::clock::Clock;
use kinesis_checkpoint::effects::{ItemId, Write, Writes};
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::internal::{Call, Layer, Layered, Next, Operation};
use kinesis_checkpoint::processor::Effect;
use kinesis_checkpoint::store::{CheckpointStore, LeaseError};
use kinesis_checkpoint::{
    BoxFuture, DeadLetterSink, MemoryLeaseStore, Mode, Outcome, Processor, Record,
};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use kinesis_checkpoint_testing::TokioClock;
use kinesis_checkpoint_testing::local::{
    EventSource, Function, InvocationError, MemoryStream, Rng, Shards,
};
use tokio::sync::Notify;

use super::common::faults::Chaos;
use super::{
    Fault, Journaled, Payload, Scenario, Shared, VIRTUAL_EPOCH_MILLIS, Written,
    dead_letter_allowed, order_key, skew,
};

/// The table the transactional handler writes: one item per record, one per partition key.
const TABLE: &str = "effects";

/// Which handler a run of the family uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Its effect is its writes, committed with the checkpoint.
    Transactional,
    /// Its effect is applied by the handler, before the checkpoint.
    Plain,
}

/// What one run of a family scenario counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub records: u64,
    /// Invocations that died (injected) and timed out.
    pub deaths: u64,
    pub timeouts: u64,
    /// Of the deaths, those at a store call.
    pub deaths_at_calls: u64,
    /// Records whose handler ran again after an earlier run in an invocation that died.
    pub handled_again: u64,
    /// Records whose effect was applied more than once.
    pub applied_again: u64,
    pub dead_lettered: u64,
    pub discarded: u64,
    pub recovered: u64,
    /// Transactions the store committed (the transactional side).
    pub transactions: u64,
    /// Store faults injected: throttled, lost answers, slow calls, steals, readings of rows
    /// throttled (aimed; none here).
    pub faults: [u64; 4],
}

impl Counts {
    fn add(&mut self, other: &Self) {
        self.records += other.records;
        self.deaths += other.deaths;
        self.timeouts += other.timeouts;
        self.deaths_at_calls += other.deaths_at_calls;
        self.handled_again += other.handled_again;
        self.applied_again += other.applied_again;
        self.dead_lettered += other.dead_lettered;
        self.discarded += other.discarded;
        self.recovered += other.recovered;
        self.transactions += other.transactions;
        for (total, n) in self.faults.iter_mut().zip(other.faults) {
            *total += n;
        }
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} records, {} invocations died ({} at a store call) and {} timed out, {} records handled again after either, {} applied again, {} dead-lettered, {} discarded by the mapping and {} recovered, {} transactions; store faults: {} throttled, {} lost answers, {} slow calls, {} stolen leases",
            self.records,
            self.deaths,
            self.deaths_at_calls,
            self.timeouts,
            self.handled_again,
            self.applied_again,
            self.dead_lettered,
            self.discarded,
            self.recovered,
            self.transactions,
            self.faults[0],
            self.faults[1],
            self.faults[2],
            self.faults[3],
        )
    }
}

/// The family's scenario of `seed`: drawn as any scenario, then narrowed to what a
/// transactional handler runs in (see the module's documentation).
pub fn scenario(seed: u64) -> Scenario {
    let mut scenario = Scenario::new(seed);
    if scenario.mode == Mode::PartitionKey {
        scenario.mode = Mode::Shard;
        scenario.mapping = scenario.mapping.clone().parallelization_factor(1);
        scenario.in_flight = 1;
    }
    // Deaths in most scenarios: the family is about them.
    let mut rng = Rng::new(seed ^ 0x7A5C_7104);
    if scenario.death_chance == 0.0 || rng.chance(0.5) {
        scenario.death_chance = [0.05, 0.1, 0.2][rng.below(3) as usize];
    }
    // Outside the contract, discards draw no death (see `tests/invariants.rs`).
    if scenario.discards {
        scenario.death_chance = 0.0;
    }
    scenario.seed_methods_only = false;
    scenario.seed_consumer = false;
    scenario.pauses = false;
    scenario.letters = None;
    scenario
}

/// Where an invocation dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    /// After the handler of its `n`th record (1-based) did its work.
    AfterRecord(u64),
    /// Before its store call of this index is sent.
    BeforeCall(usize),
    /// After that call was applied, before its answer arrives.
    AfterCall(usize),
}

/// Kills its invocation at its planned store call.
struct Reap {
    plan: Option<Death>,
    calls: AtomicUsize,
    death: Arc<Notify>,
    shared: Arc<Shared>,
    invocation: String,
    /// Set when this layer killed the invocation.
    struck: Arc<AtomicBool>,
    /// Beside mapping discards: die only once a claim of this invocation landed (see
    /// [`Harness::invoke`]).
    after_a_claim: bool,
    claimed: AtomicBool,
}

impl Reap {
    async fn die(&self, death: Death, call: &Call<'_>) {
        self.shared.note(format!(
            "{} dies {death:?} ({:?})",
            self.invocation,
            call.operation()
        ));
        self.struck.store(true, Ordering::SeqCst);
        self.death.notify_one();
        std::future::pending::<()>().await;
    }
}

impl Layer for Reap {
    fn wrap<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        Box::pin(async move {
            let index = self.calls.fetch_add(1, Ordering::SeqCst);
            let armed = || !self.after_a_claim || self.claimed.load(Ordering::SeqCst);
            if self.plan == Some(Death::BeforeCall(index)) && armed() {
                self.die(Death::BeforeCall(index), &call).await;
            }
            let operation = call.operation();
            let answer = next.run(call).await;
            if operation == Operation::AcquireAndRead && answer.is_ok() {
                self.claimed.store(true, Ordering::SeqCst);
            }
            if self.plan == Some(Death::AfterCall(index)) && armed() {
                self.die(Death::AfterCall(index), &call).await;
            }
            answer
        })
    }
}

/// The function under test, with a fresh processor per invocation.
struct Harness {
    store: Arc<dyn CheckpointStore>,
    memory: Arc<MemoryLeaseStore>,
    dead_letters: Arc<dyn DeadLetterSink>,
    topology: Arc<MemoryStream>,
    shared: Arc<Shared>,
    side: Side,
    scenario: Scenario,
    lease_ttl: Duration,
    /// The plain handler's effects: by record position, how often applied.
    effects: Arc<Mutex<HashMap<String, u64>>>,
    /// Invocations killed at a store call.
    deaths_at_calls: AtomicU64,
    rng: Mutex<Rng>,
}

/// The item of the record at `position`.
fn record_item(position: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([(
        "id".to_owned(),
        AttributeValue::S(format!("record {position}")),
    )])
}

/// The item of a partition key's running total.
fn key_item(key: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([("id".to_owned(), AttributeValue::S(format!("key {key}")))])
}

/// Whether the record at `position` adds to its key's total too (two items, and a chunk ends
/// before a second record of its key): about every third.
fn adds_to_total(position: &str) -> bool {
    position.bytes().map(u64::from).sum::<u64>() % 3 == 0
}

fn add_one(key: HashMap<String, AttributeValue>) -> Write {
    Write::update(
        Update::builder()
            .table_name(TABLE)
            .set_key(Some(key))
            .update_expression("ADD applied :one")
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .build()
            .expect("a table, a key and an expression"),
    )
}

/// What the handler made of a record, before it is an [`Effect`] or an [`Outcome`].
enum Decision {
    Done,
    Retry(String),
    Reject(String),
    /// The record kills its invocation, before any effect.
    Die,
}

/// The faults a record asks for, as the shared handler of `tests/invariants.rs` plays them.
async fn decide(
    record: &Record,
    shared: &Shared,
    invocation: &str,
    deadline: u64,
    started: u64,
) -> Decision {
    let position = record.position().to_string();
    let Ok(payload) = serde_json::from_slice::<Payload>(record.data()) else {
        return Decision::Reject("unreadable payload".to_owned());
    };
    let attempt = {
        let mut journal = shared.journal.lock().unwrap();
        journal
            .last_started
            .insert(invocation.to_owned(), position.clone());
        let attempt = journal.attempts.entry(position.clone()).or_default();
        *attempt += 1;
        *attempt
    };
    match payload.fault {
        Fault::Kills(n) if attempt <= n => return Decision::Die,
        Fault::Retry(n) if attempt <= n => return Decision::Retry(format!("attempt {attempt}")),
        Fault::Panic(n) if attempt <= n => panic!("injected panic, attempt {attempt}"),
        Fault::Stubborn => return Decision::Retry("never succeeds".to_owned()),
        Fault::Poison => return Decision::Reject("poison".to_owned()),
        Fault::Slow if attempt == 1 => tokio::time::sleep(Duration::from_secs(5)).await,
        Fault::Sluggish => {
            let left = deadline.saturating_sub(shared.clock.now_millis());
            if left >= deadline.saturating_sub(started) / 2 {
                shared
                    .journal
                    .lock()
                    .unwrap()
                    .fair_starts
                    .insert((invocation.to_owned(), position.clone()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        _ => {}
    }
    Decision::Done
}

/// One invocation's death plan and signal.
#[derive(Clone)]
struct Dying {
    death: Arc<Notify>,
    after_record: Option<u64>,
    handled: Arc<AtomicU64>,
}

impl Dying {
    /// The record at `position` kills the invocation (`Fault::Kills`).
    async fn killed_by(&self, shared: &Shared, invocation: &str, position: &str) -> ! {
        shared.note(format!("{position} kills {invocation}"));
        shared.killed(position, invocation);
        self.death.notify_one();
        std::future::pending::<()>().await;
        unreachable!("a dead invocation runs nothing more")
    }

    /// After a record's work: dies here when this is the planned record.
    async fn after(&self, shared: &Shared, invocation: &str, position: &str) {
        let count = self.handled.fetch_add(1, Ordering::SeqCst) + 1;
        if self.after_record == Some(count) {
            shared.note(format!("{invocation} dies after handling {position}"));
            shared
                .journal
                .lock()
                .unwrap()
                .deaths
                .push((invocation.to_owned(), position.to_owned()));
            self.death.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

impl Harness {
    fn gate(&self) -> Gate {
        Gate::new(self.topology.clone(), StartingPosition::TrimHorizon)
            .clock(self.shared.clock.clone())
    }

    async fn batch(
        &self,
        store: Arc<dyn CheckpointStore>,
        event: KinesisEvent,
        context: &lambda_runtime::Context,
        dying: &Dying,
    ) -> Result<kinesis_checkpoint::BatchReport, kinesis_checkpoint::ProcessError> {
        let invocation = context.request_id.clone();
        let (deadline, started) = (context.deadline, self.shared.clock.now_millis());
        let sink = Arc::new(Journaled {
            inner: self.dead_letters.clone(),
            shared: self.shared.clone(),
            invocation: invocation.clone(),
            delivered: None,
        });
        let skew = Duration::from_millis(self.scenario.skew_ms);
        match self.side {
            Side::Transactional => {
                let (shared, dying) = (self.shared.clone(), dying.clone());
                let handler = move |record: Record| {
                    let (shared, invocation, dying) =
                        (shared.clone(), invocation.clone(), dying.clone());
                    async move {
                        let position = record.position().to_string();
                        match decide(&record, &shared, &invocation, deadline, started).await {
                            Decision::Retry(error) => Effect::Retry(error.into()),
                            Decision::Reject(error) => Effect::Reject(error.into()),
                            Decision::Die => dying.killed_by(&shared, &invocation, &position).await,
                            Decision::Done => {
                                shared.handled(&position, &invocation, false);
                                let mut writes = Writes::from(add_one(record_item(&position)));
                                if adds_to_total(&position) {
                                    writes.push(add_one(key_item(record.partition_key())));
                                }
                                dying.after(&shared, &invocation, &position).await;
                                Effect::Commit(writes)
                            }
                        }
                    }
                };
                Processor::transactional(store, handler)
                    .lease_ttl(self.lease_ttl)
                    .clock_skew(skew)
                    .clock(self.shared.clock.clone())
                    .dead_letters(sink)
                    .gate(self.gate())
                    .concurrency(self.scenario.in_flight)
                    .max_attempts(self.scenario.max_attempts)
                    .deadline_margin(Duration::from_millis(50))
                    .process_batch(event, context)
                    .await
            }
            Side::Plain => {
                let (shared, dying, effects) =
                    (self.shared.clone(), dying.clone(), self.effects.clone());
                let handler = move |record: Record| {
                    let (shared, invocation, dying, effects) = (
                        shared.clone(),
                        invocation.clone(),
                        dying.clone(),
                        effects.clone(),
                    );
                    async move {
                        let position = record.position().to_string();
                        match decide(&record, &shared, &invocation, deadline, started).await {
                            Decision::Retry(error) => Outcome::retry(error),
                            Decision::Reject(error) => Outcome::reject(error),
                            Decision::Die => dying.killed_by(&shared, &invocation, &position).await,
                            Decision::Done => {
                                shared.handled(&position, &invocation, false);
                                // The effect, applied by the handler before any checkpoint.
                                *effects.lock().unwrap().entry(position.clone()).or_default() += 1;
                                dying.after(&shared, &invocation, &position).await;
                                Outcome::ack()
                            }
                        }
                    }
                };
                Processor::new(store, handler)
                    .lease_ttl(self.lease_ttl)
                    .clock_skew(skew)
                    .clock(self.shared.clock.clone())
                    .dead_letters(sink)
                    .gate(self.gate())
                    .concurrency(self.scenario.in_flight)
                    .max_attempts(self.scenario.max_attempts)
                    .deadline_margin(Duration::from_millis(50))
                    .process_batch(event, context)
                    .await
            }
        }
    }
}

impl Function for Harness {
    fn invoke(
        &self,
        event: KinesisEvent,
        context: lambda_runtime::Context,
    ) -> BoxFuture<'_, Result<KinesisEventResponse, InvocationError>> {
        Box::pin(async move {
            let invocation = context.request_id.clone();
            let (offset_ms, plan) = {
                let mut rng = self.rng.lock().unwrap();
                let skew = self.scenario.skew_ms;
                let offset = (skew > 0).then(|| {
                    i64::try_from(rng.within(0..2 * skew + 1)).unwrap()
                        - i64::try_from(skew).unwrap()
                });
                let plan = rng
                    .chance(self.scenario.death_chance)
                    .then(|| match rng.below(3) {
                        0 => Death::AfterRecord(rng.within(1..event.records.len() as u64 + 1)),
                        // The claim, the gate's calls, renewals, each chunk's transaction.
                        1 => Death::BeforeCall(rng.below(6) as usize),
                        _ => Death::AfterCall(rng.below(6) as usize),
                    });
                (offset, plan)
            };
            let mut store = self.store.clone();
            if let Some(offset_ms) = offset_ms {
                self.shared
                    .note(format!("{invocation}'s clock is off by {offset_ms} ms"));
                store = Arc::new(skew::skewed(store, offset_ms));
            }
            let death = Arc::new(Notify::new());
            let struck = Arc::new(AtomicBool::new(false));
            let call_plan = plan.filter(|plan| !matches!(plan, Death::AfterRecord(_)));
            if call_plan.is_some() {
                store = Arc::new(Layered::new(
                    store,
                    Reap {
                        plan: call_plan,
                        calls: AtomicUsize::new(0),
                        death: death.clone(),
                        shared: self.shared.clone(),
                        invocation: invocation.clone(),
                        struck: struck.clone(),
                        // A batch the mapping gives up on after a delivery whose every store
                        // write failed leaves nothing to find it by (open, in the README): a
                        // parent's, its children wait for for good. The other family kills an
                        // invocation only after a handler, past its claim, too.
                        after_a_claim: self.scenario.discards,
                        claimed: AtomicBool::new(false),
                    },
                ));
            }
            let dying = Dying {
                death: death.clone(),
                after_record: match plan {
                    Some(Death::AfterRecord(n)) => Some(n),
                    _ => None,
                },
                handled: Arc::default(),
            };
            tokio::select! {
                biased;
                () = death.notified() => {
                    self.shared.journal.lock().unwrap().died.insert(invocation.clone());
                    if struck.load(Ordering::SeqCst) {
                        self.deaths_at_calls.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(InvocationError::Function(format!("{invocation} died (injected)")))
                }
                report = self.batch(store, event, &context, &dying) => {
                    let report = report.map_err(|e| InvocationError::Function(e.to_string()))?;
                    if super::ended_unrecorded(&report) {
                        self.shared.journal.lock().unwrap().unrecorded_ends.insert(invocation.clone());
                    }
                    for shard in &report.shards {
                        self.shared.note(format!(
                            "{invocation} reports {}: stopped {:?}, {:?}",
                            shard.key,
                            shard.stopped,
                            shard.records.iter().map(|r| format!("{}={:?}", &r.position.to_string()[52..], r.disposition)).collect::<Vec<_>>()
                        ));
                        let recovered = shard.gap.as_ref().map_or(0, |gap| gap.recovered.len() as u64);
                        self.shared.journal.lock().unwrap().recovered += recovered;
                    }
                    Ok(report.response())
                }
            }
        })
    }
}

/// The stream goes on after the run, as in `tests/invariants.rs`'s `later_batches`: one more
/// record on every open shard, delivered until answered in full, so that a range the mapping
/// discarded at the end is found and recovered.
async fn later_batches(stream: &MemoryStream, written: &mut Written, harness: &Harness) {
    let scenario = &harness.scenario;
    let open: Vec<String> = Shards::list(stream)
        .await
        .expect("a memory stream lists its shards")
        .into_iter()
        .filter(|info| !info.closed)
        .map(|info| info.id)
        .collect();
    for (index, shard) in open.into_iter().enumerate() {
        let key = (0..10_000)
            .map(|k| format!("later-{k}"))
            .find(|key| stream.shard_of(key) == shard)
            .expect("some key hashes to every shard");
        let n = scenario.records + index as u64;
        let payload = Payload {
            n,
            fault: Fault::None,
            error_bytes: None,
            pad: String::new(),
        }
        .to_json();
        let sequence = stream.put(&key, payload.clone());
        written.faults.insert(sequence.clone(), Fault::None);
        let arrival_millis = VIRTUAL_EPOCH_MILLIS;
        let record = serde_json::json!({
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": key,
                "sequenceNumber": sequence,
                "data": base64::engine::general_purpose::STANDARD.encode(&payload),
                "approximateArrivalTimestamp": Duration::from_millis(arrival_millis).as_secs_f64(),
            },
            "eventSource": "aws:kinesis",
            "eventVersion": "1.0",
            "eventID": format!("{shard}:{sequence}"),
            "eventName": "aws:kinesis:record",
            "awsRegion": "us-east-1",
            "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
        });
        let event = super::common::event(&[record]);
        let patience = 30 + 2 * (harness.lease_ttl.as_millis() as u64 + 2 * scenario.skew_ms) / 20;
        // Progress is a handling, as in `tests/invariants.rs`, or a death: an invocation
        // killed at its claim handles nothing and leaves a lease to lapse, and a few of them
        // in a row (a fifth of the invocations die in some scenarios) outlast the patience.
        let progress = || {
            harness.shared.tick.load(Ordering::SeqCst)
                + harness.shared.journal.lock().unwrap().died.len() as u64
        };
        let (mut attempt, mut idle) = (0, 0);
        while idle < patience && attempt < 20 * patience {
            let ticks = progress();
            let mut context = super::common::context(&format!("later-{index}-{attempt}"), 2_000);
            context.deadline = harness.shared.clock.now_millis() + 2_000;
            match harness.invoke(event.clone(), context).await {
                Ok(response) if response.batch_item_failures.is_empty() => break,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
            attempt += 1;
            idle = if progress() > ticks { 0 } else { idle + 1 };
        }
    }
}

/// Runs the family's `scenario` with `side`'s handler; a violation is an error.
pub async fn run(
    scenario: &Scenario,
    side: Side,
    trace: Arc<Mutex<Vec<String>>>,
) -> Result<Counts, String> {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(VIRTUAL_EPOCH_MILLIS));
    let mut rng = Rng::new(scenario.seed ^ 0x5EED);
    let mut written = scenario.stream(&mut rng, clock.clone());
    let stream = written.stream.clone().expect("written");
    let scenario = scenario.clone();
    {
        let mut trace = trace.lock().unwrap();
        trace.push(format!("{side:?} {scenario:?}"));
        for shard in stream.shard_ids() {
            let records: Vec<String> = stream
                .records(&shard)
                .iter()
                .map(|record| record.sequence[52..].to_owned())
                .collect();
            trace.push(format!(
                "stream: {shard} (parents {:?}): {records:?}",
                stream.parents(&shard)
            ));
        }
    }
    let memory = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
    let chaos = Arc::new(
        Chaos::new(memory.clone(), scenario.chaos, scenario.seed)
            .traced(trace.clone())
            .around_store(),
    );
    let shared = Arc::new(Shared {
        journal: Mutex::default(),
        tick: AtomicU64::new(0),
        clock: clock.clone(),
        trace,
    });
    let lease_ttl = Duration::from_millis(150).max(Duration::from_millis(3 * scenario.skew_ms));
    let harness = Arc::new(Harness {
        store: Arc::new(Layered::new(chaos.clone(), super::Pins(shared.clone()))),
        memory: memory.clone(),
        dead_letters: Arc::new(MemoryDeadLetters::new()),
        topology: Arc::new(stream.clone()),
        shared: shared.clone(),
        side,
        scenario: scenario.clone(),
        lease_ttl,
        effects: Arc::default(),
        deaths_at_calls: AtomicU64::new(0),
        rng: Mutex::new(Rng::new(scenario.seed.rotate_left(17))),
    });
    let report = EventSource::new(stream.clone(), scenario.mapping.clone())
        .clock(clock.clone())
        .run_observed(harness.clone(), |d| {
            let short: Vec<&str> = d.sequences.iter().map(|s| &s[52..]).collect();
            shared.note(format!(
                "source: {} delivered {} lane {} {short:?}: {:?}",
                d.request_id, d.shard, d.lane, d.outcome
            ));
        })
        .await
        .map_err(|e| format!("the run stopped: {e}"))?;
    if scenario.discards {
        later_batches(&stream, &mut written, &harness).await;
    } else if !report.discarded.is_empty() {
        return Err(format!("records discarded: {:?}", report.discarded));
    }
    let journal = shared.journal.lock().unwrap();
    let mut counts = Counts {
        deaths: journal.died.len() as u64,
        timeouts: report.timed_out.len() as u64,
        deaths_at_calls: harness.deaths_at_calls.load(Ordering::SeqCst),
        discarded: report.discarded.len() as u64,
        recovered: journal.recovered,
        transactions: memory.transactions(),
        faults: *chaos.layer().injected.lock().unwrap(),
        ..Counts::default()
    };
    let effects = harness.effects.lock().unwrap();
    let applied = |position: &str| match side {
        Side::Transactional => harness
            .memory
            .writes_of(&ItemId::new(TABLE, &record_item(position))),
        Side::Plain => effects.get(position).copied().unwrap_or(0),
    };
    let mut first_tick: HashMap<String, u64> = HashMap::new();
    let mut by_key: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    let mut totals: HashMap<String, u64> = HashMap::new();
    for shard in stream.shard_ids() {
        for (position, partition_key) in written.user_records(&shard, false) {
            counts.records += 1;
            let times = applied(&position);
            let handlings = journal
                .handlings
                .get(&position)
                .cloned()
                .unwrap_or_default();
            let mut sorted = handlings;
            sorted.sort_by_key(|h| h.tick);
            let dead_lettered = sorted.iter().any(|h| h.dead_lettered);
            counts.dead_lettered += u64::from(dead_lettered);
            if times == 0 && !dead_lettered {
                return Err(format!(
                    "record {position} of {shard} was lost: its effect was never applied and it was not dead-lettered ({sorted:?})"
                ));
            }
            let fault = written.faults[&position];
            let starved = fault == Fault::Sluggish
                && sorted.iter().filter(|h| h.dead_lettered).all(|h| {
                    journal
                        .fair_starts
                        .contains(&(h.invocation.clone(), position.clone()))
                });
            if dead_lettered && !starved {
                dead_letter_allowed(
                    &journal,
                    &report.timed_out,
                    (&position, fault),
                    scenario.max_attempts,
                )
                .map_err(|why| format!("record {position} of {shard} {why}: {sorted:?}"))?;
            }
            if times > 1 {
                counts.applied_again += 1;
                if side == Side::Transactional {
                    return Err(format!(
                        "record {position} of {shard}: its writes were applied {times} times ({sorted:?})"
                    ));
                }
            }
            let handled: Vec<_> = sorted.iter().filter(|h| !h.dead_lettered).collect();
            if handled.windows(2).any(|pair| {
                journal.died.contains(&pair[0].invocation)
                    || report.timed_out.contains(&pair[0].invocation)
            }) {
                counts.handled_again += 1;
            }
            if adds_to_total(&position) {
                *totals.entry(partition_key.clone()).or_default() += times;
            }
            if let Some(first) = sorted.first() {
                first_tick.insert(position.clone(), first.tick);
                by_key
                    .entry(partition_key)
                    .or_default()
                    .push((position, first.tick));
            }
        }
    }
    if side == Side::Transactional {
        for (key, expected) in &totals {
            let total = harness
                .memory
                .item(TABLE, &key_item(key))
                .and_then(|item| match item.get("applied") {
                    Some(AttributeValue::N(n)) => n.parse::<u64>().ok(),
                    _ => None,
                })
                .unwrap_or(0);
            if total != *expected {
                return Err(format!(
                    "key {key}: its total is {total}, but {expected} of its records that add to it were applied"
                ));
            }
        }
    }
    for (key, records) in &by_key {
        let mut records = records.clone();
        records.sort_by_cached_key(|(position, _)| order_key(position));
        if let Some(pair) = records.windows(2).find(|w| w[0].1 > w[1].1) {
            return Err(format!(
                "key {key}: record {} was first handled after the later record {}",
                pair[0].0, pair[1].0
            ));
        }
    }
    for child in stream.shard_ids() {
        let Some(child_first) = written
            .user_records(&child, false)
            .iter()
            .filter_map(|(position, _)| first_tick.get(position).copied())
            .min()
        else {
            continue;
        };
        for parent in stream.parents(&child) {
            for (position, _) in written.user_records(&parent, false) {
                if first_tick
                    .get(&position)
                    .is_some_and(|tick| *tick > child_first)
                {
                    return Err(format!(
                        "child {child} was handled before record {position} of its parent {parent}"
                    ));
                }
            }
        }
    }
    Ok(counts)
}

/// Runs the family's scenario of `seed` with `side`'s handler alone on a paused runtime of its
/// own, as `run_one` does; returns its outcome and its trace.
fn run_one(seed: u64, side: Side) -> (Scenario, Result<Counts, String>, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let scenario = scenario(seed);
    let trace = Arc::new(Mutex::new(Vec::new()));
    let outcome = runtime.block_on(async {
        tokio::time::timeout(Duration::from_mins(2), run(&scenario, side, trace.clone()))
            .await
            .unwrap_or_else(|_| Err("the run did not end within two minutes".into()))
    });
    drop(runtime);
    let trace = std::mem::take(&mut *trace.lock().unwrap());
    (scenario, outcome, trace)
}

/// The family runs one in this many of `INVARIANT_SCENARIOS` (each twice, once per handler):
/// 2,000 in `make test`, about as long again as a tenth of the other families' 10,000;
/// `TRANSACTIONAL_SCENARIOS` sets the count itself.
const FAMILY_SHARE: u64 = 5;

#[test]
fn a_transactional_handler_applies_no_record_twice_under_deaths_at_every_point_where_a_plain_one_does()
 {
    super::quiet_injected_panics();
    let count: u64 = std::env::var("TRANSACTIONAL_SCENARIOS").map_or_else(
        |_| {
            std::env::var("INVARIANT_SCENARIOS")
                .map_or(super::DEFAULT_SCENARIOS, |n| n.parse().unwrap())
                .div_ceil(FAMILY_SHARE)
        },
        |n| n.parse().unwrap(),
    );
    let first: u64 = std::env::var("INVARIANT_SEED").map_or(1, |n| n.parse().unwrap());
    let runs: Vec<(u64, Side)> = (first..first + count)
        .flat_map(|seed| [(seed, Side::Transactional), (seed, Side::Plain)])
        .collect();
    let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let next = AtomicUsize::new(0);
    let outcomes = Mutex::new(Vec::with_capacity(runs.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.min(runs.len()) {
            scope.spawn(|| {
                while let Some(&(seed, side)) = runs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let (scenario, outcome, trace) = run_one(seed, side);
                    if outcome.is_err() || std::env::var_os("INVARIANT_TRACE").is_some() {
                        super::write_trace(seed, &trace);
                    }
                    if outcome.is_err() {
                        let tail = &trace[trace.len().saturating_sub(60)..];
                        eprintln!(
                            "seed {seed} ({side:?}), the trace's last lines:\n{}",
                            tail.join("\n")
                        );
                    }
                    outcomes.lock().unwrap().push((scenario, side, outcome));
                }
            });
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap();
    outcomes.sort_by_key(|(scenario, side, _)| (scenario.seed, *side == Side::Plain));
    let (mut transactional, mut plain) = (Counts::default(), Counts::default());
    let mut failures = Vec::new();
    for (scenario, side, outcome) in outcomes {
        match (outcome, side) {
            (Ok(counts), Side::Transactional) => transactional.add(&counts),
            (Ok(counts), Side::Plain) => plain.add(&counts),
            (Err(violation), _) => {
                eprintln!(
                    "transactional family, scenario {} ({side:?}) failed: {violation}\n  {scenario:?}\n  trace: target/invariant-traces/seed-{}.log\n  replay: {}",
                    scenario.seed,
                    scenario.seed,
                    scenario.replay()
                );
                failures.push((scenario.seed, side));
            }
        }
    }
    eprintln!("transactional family, {count} scenarios, each with both handlers:");
    eprintln!("  transactional handler: {transactional}");
    eprintln!("  plain handler:         {plain}");
    assert!(failures.is_empty(), "failing scenarios: {failures:?}");
    if count >= 20 {
        assert!(
            transactional.deaths_at_calls > 0 && plain.deaths_at_calls > 0,
            "no death at a store call was injected: the injection is not working"
        );
        assert!(
            plain.applied_again > 0,
            "the plain handler applied no record twice: the deaths do not reach the window"
        );
        assert!(
            transactional.handled_again > 0,
            "no record of the transactional handler ran again after a death: the deaths did not test it"
        );
    }
}

#[test]
fn two_runs_of_the_same_transactional_family_seeds_write_byte_identical_traces() {
    super::quiet_injected_panics();
    for seed in 1..=16 {
        for side in [Side::Transactional, Side::Plain] {
            let (_, outcome, trace) = run_one(seed, side);
            let (_, again, retrace) = run_one(seed, side);
            assert!(
                trace.len() > 10,
                "seed {seed} ({side:?}) traced almost nothing"
            );
            assert_eq!(
                outcome.as_ref().err(),
                again.as_ref().err(),
                "seed {seed} ({side:?}) ended differently"
            );
            if let Some(line) = trace.iter().zip(&retrace).position(|(a, b)| a != b) {
                panic!(
                    "seed {seed} ({side:?}): the traces differ from line {line}:\n  {}\n  {}",
                    trace[line], retrace[line]
                );
            }
            assert_eq!(trace.len(), retrace.len(), "seed {seed} ({side:?})");
        }
    }
}
