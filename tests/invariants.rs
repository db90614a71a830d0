//! Invariants over many seeded scenarios: the local event source delivers a random stream
//! (shards, a split, a merge, duplicate and concurrent deliveries, children delivered early, a
//! `ParallelizationFactor` from 1 to 10, each lane of a shard in an invocation of its own, each
//! invocation a fresh processor as a new process is) to a processor whose store and handler
//! misbehave by chance. After each:
//!
//! 1. every record is processed or dead-lettered, none lost, and none healthy dead-lettered (a
//!    record may be dead-lettered when its failures and the deaths of invocations running it
//!    reach `max_attempts`);
//! 2. a record is handled twice only when an earlier handling was in an invocation that died
//!    before its checkpoint (an injected death, a record that kills its invocation, or a
//!    time-out), or whose checkpoint did not land (the report says so): those are counted, by
//!    cause, and every injected death is matched: the record whose effect it died after is
//!    handled again;
//! 3. per partition key, records are first handled in sequence order (with a
//!    `ParallelizationFactor` above 1, per key Kinesis routed by: a KPL aggregate's own);
//! 4. no record of a child shard is handled before every record of its parents;
//! 5. under the documented mapping (no discards), no invocation runs or dead-letters a record
//!    its event did not deliver.
//!
//! The fault families inside the contract, each drawn by the seed:
//! - deaths: an invocation dies after a handler's effect (8 % of the invocations of 30 % of the
//!   scenarios), and a record kills every invocation that runs it, 1 to 4 times
//!   (`Fault::Kills`): in the shard mode with a store that keeps the claim's mark, one that
//!   kills more than `max_attempts` times must be dead-lettered from its event;
//! - duplicate and concurrent deliveries, early children, lanes of one shard delivered at once;
//! - KPL aggregates (30 %): records packed 1 to 5 to an aggregate of keys bound for one shard,
//!   and the last record of a shard that splits is one, with children delivered early;
//! - large records and awkward errors: the dead-letter family (a third of the scenarios): dead
//!   letters go to a [`MemoryQueue`] that applies SQS's limits through the same chunking code as
//!   SQS, its part sends fail by chance, records are padded past the message size, and handler
//!   errors run to 300 KB of characters SQS refuses; a redrive must give back every
//!   dead-lettered record once, byte for byte (`check_letters`);
//! - throttling, lost answers, latency and stolen leases in the store (`Chaos`);
//! - healthy slow records (`Sluggish`): never charged an attempt for being cut by the deadline;
//! - a store with the seed's five methods only (a quarter of the shard-mode scenarios served one
//!   record at a time), whose stated duplicates are counted, not failed;
//! - a seed-crate consumer on the same table (`seed_consumer.rs`), in both modes, and, in the
//!   partition-key mode, a consumer of the whole shard holding its lease (`holder.rs`);
//! - clock skew between invocations (`skew.rs`).
//!
//! Outside the contract, in the shard mode only (30 % of its scenarios): finite
//! `MaximumRetryAttempts`, the mapping giving up on batches. The row's mark proves each gap at
//! the next batch's start, and gap recovery reads the skipped records back (in parts of 2 to 4
//! records in half of them, `parts.rs`); the stream then goes on with one more record per shard,
//! so a range discarded at the end is found too. Those scenarios draw no reshard (no parent's
//! tail is recovered), no throttle, stolen lease or death (a batch turned away by a lingering
//! lease leaves no mark), and no seed consumer (its checkpoint passes the mark).
//!
//! `INVARIANT_SCENARIOS` (default 10,000) and `INVARIANT_SEED` (default 1) choose the scenarios;
//! a failing one prints its settings and the command that replays it. Each scenario runs alone
//! on a runtime whose time is paused, with one virtual clock for the store, the stream, the
//! event source and every processor: a replay runs exactly as the failing run did (two runs of a
//! seed write the same trace, byte for byte). A failing scenario leaves its trace in
//! `target/invariant-traces/`; `INVARIANT_TRACE=1` leaves every scenario's. `make soak` runs
//! 100,000.

#![allow(
    clippy::cast_possible_truncation,
    clippy::similar_names,
    clippy::struct_excessive_bools,
    clippy::too_many_lines,
    reason = "small random numbers drawn as u64; one checker reads best as one function; a \
              scenario is a set of yes-or-no fault families"
)]

mod common;
// Not in `common`: the function crates that share it build no KPL encoder.
#[path = "invariants/dynamodb.rs"]
mod dynamodb;
#[path = "invariants/holder.rs"]
mod holder;
#[path = "common/kpl.rs"]
mod kpl_encoder;
#[path = "invariants/letters.rs"]
mod letters;
#[path = "invariants/parts.rs"]
mod parts;
#[path = "invariants/seed_consumer.rs"]
mod seed_consumer;
#[path = "invariants/skew.rs"]
mod skew;
#[path = "invariants/transactional.rs"]
mod transactional;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use base64::Engine as _;
use common::faults::{Chaos, ChaosLevels};
use kinesis_checkpoint::clock::Clock;
use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterError};
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::internal::{Call, FailingChange, Layer, Layered, Next};
use kinesis_checkpoint::processor::CheckpointMode;
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::store::{CheckpointStore, LeaseError, LeaseStore, SeedStore};
use kinesis_checkpoint::{
    BoxFuture, DeadLetterSink, Handler, MemoryLeaseStore, Mode, Outcome, Position, Processor,
    Record, SequenceNumber,
};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use kinesis_checkpoint_testing::MemoryQueue;
use kinesis_checkpoint_testing::TokioClock;
use kinesis_checkpoint_testing::local::{
    EventSource, Function, InvocationError, Mapping, MemoryStream, Rng, Shards,
};
use letters::{FlakyQueue, LetterCounts, Letters, awkward_error, check_letters};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// What a record asks its handler to do.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
enum Fault {
    None,
    /// Asks for a retry on its first `n` attempts.
    Retry(u32),
    /// Panics on its first `n` attempts.
    Panic(u32),
    /// Always asks for a retry: dead-lettered after the processor's maximum attempts.
    Stubborn,
    /// Rejected: dead-lettered at once.
    Poison,
    /// Runs past the invocation's deadline on its first attempt.
    Slow,
    /// Healthy but slow: a quarter of the function's time on every attempt, so a record after
    /// it starts near the deadline. Never a reason to dead-letter it.
    Sluggish,
    /// Kills the invocation that runs it (out of memory, an abort) on its first `n` attempts,
    /// before any effect; `u32::MAX`: on every attempt.
    Kills(u32),
}

impl Fault {
    /// How many attempts of a record with this fault fail (a death counts: the next claim
    /// finds it): it may end in the dead-letter sink once this, with the deaths of invocations
    /// that died while it ran, reaches `max_attempts`.
    fn failures(self) -> u32 {
        match self {
            Self::Stubborn | Self::Poison => u32::MAX,
            Self::Retry(n) | Self::Panic(n) | Self::Kills(n) => n,
            Self::Slow => 1,
            Self::None | Self::Sluggish => 0,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    n: u64,
    fault: Fault,
    /// The size of the error the handler gives (the dead-letter family), else a short one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error_bytes: Option<usize>,
    /// Padding that makes the record larger than a dead-letter message (the family): lowercase
    /// letters, written by [`Payload::to_json`].
    #[serde(default, skip_serializing)]
    pad: String,
}

impl Payload {
    /// The record's data. The padding needs no escaping and goes in as it is: `serde_json`'s
    /// escaping, byte by byte in a debug build, took a quarter of the scenarios' time.
    fn to_json(&self) -> Vec<u8> {
        let mut json = serde_json::to_vec(self).unwrap();
        if !self.pad.is_empty() {
            json.pop(); // the closing brace
            json.extend_from_slice(b",\"pad\":\"");
            json.extend_from_slice(self.pad.as_bytes());
            json.extend_from_slice(b"\"}");
        }
        json
    }
}

/// One handling of a record: which invocation, and when (a global order).
#[derive(Debug, Clone)]
struct Handling {
    invocation: String,
    tick: u64,
    dead_lettered: bool,
}

/// Everything a scenario observed.
#[derive(Default)]
struct Journal {
    /// By record position (sequence/sub-sequence), every handling.
    handlings: HashMap<String, Vec<Handling>>,
    /// Invocations that died before answering.
    died: HashSet<String>,
    /// Each injected death: the invocation, and the record whose effect it died after.
    deaths: Vec<(String, String)>,
    /// Per invocation, records whose checkpoint did not land.
    uncheckpointed: HashSet<(String, String)>,
    /// Records the mapping skipped that an invocation read back and ran.
    recovered: u64,
    /// Invocations a record killed (`Fault::Kills`), by record.
    kills: HashMap<String, u32>,
    /// The invocations each record killed, by record.
    killed_by: HashMap<String, Vec<String>>,
    /// Batches an invocation died running, found by a later claim (the report's `died_at`).
    deaths_found: u64,
    /// Per invocation, the record it started last, and the record it last pinned (a careful
    /// run's mark): a death is charged to either.
    last_started: HashMap<String, String>,
    last_pinned: HashMap<String, String>,
    /// Invocations whose last write did not land (refused, failed, or the lease lost).
    unrecorded_ends: HashSet<String>,
    /// Records run or dead-lettered by an invocation whose event did not deliver them.
    undelivered: Vec<String>,
    /// Shards a seed-crate consumer took over.
    takeovers: u64,
    /// Shard leases a consumer of the whole shard held, doing nothing (`holder.rs`).
    holds: u64,
    /// Invocations frozen past their stored lease while a rival ran their batch.
    pauses: u64,
    /// A seed consumer took a shard over that the toolkit had stopped inside an aggregate.
    handoffs_into_aggregate: u64,
    /// A seed consumer stopped inside an aggregate (before its checkpoint), left to the toolkit.
    handoffs_out_of_aggregate: u64,
    /// Healthy slow records started with at least half of their invocation's time: a starved
    /// machine may still cut one then, and the processor rightly counts that attempt.
    fair_starts: HashSet<(String, String)>,
    attempts: HashMap<String, u32>,
    /// By record position, the payload and partition key of its dead letter, as the sink took it.
    letters: HashMap<String, (Vec<u8>, String)>,
}

/// The handler and the invocation wrapper share one journal, one clock and one trace.
struct Shared {
    journal: Mutex<Journal>,
    tick: AtomicU64,
    /// The scenario's virtual clock: the store, the stream, the event source and every
    /// processor run on it.
    clock: Arc<dyn Clock>,
    /// What happened, in order: written out when the scenario fails.
    trace: Arc<Mutex<Vec<String>>>,
}

impl Shared {
    fn note(&self, line: String) {
        self.trace.lock().unwrap().push(line);
    }

    /// The record at `position` killed `invocation` (`Fault::Kills`).
    fn killed(&self, position: &str, invocation: &str) {
        let mut journal = self.journal.lock().unwrap();
        *journal.kills.entry(position.to_owned()).or_default() += 1;
        journal
            .killed_by
            .entry(position.to_owned())
            .or_default()
            .push(invocation.to_owned());
    }

    /// `record` ran or was dead-lettered in `invocation`, whose event did not deliver it.
    fn undelivered(&self, record: &Record, invocation: &str) {
        let position = record.position().to_string();
        self.note(format!(
            "{invocation} runs {position}, which its event did not deliver"
        ));
        self.journal
            .lock()
            .unwrap()
            .undelivered
            .push(format!("{position} in {invocation}"));
    }

    fn handled(&self, position: &str, invocation: &str, dead_lettered: bool) {
        let tick = self.tick.fetch_add(1, Ordering::SeqCst);
        let how = if dead_lettered {
            "dead-letters"
        } else {
            "handles"
        };
        self.note(format!("{invocation} {how} {position} (tick {tick})"));
        self.journal
            .lock()
            .unwrap()
            .handlings
            .entry(position.to_owned())
            .or_default()
            .push(Handling {
                invocation: invocation.to_owned(),
                tick,
                dead_lettered,
            });
    }
}

/// The function under test: a fresh processor per invocation (cheap: the store, sink and gate
/// are shared), whose handler knows the invocation it runs in and may kill it.
struct Harness {
    store: Arc<dyn CheckpointStore>,
    /// The same table through the seed's five methods, for the seed-crate consumer.
    seed: Arc<dyn LeaseStore>,
    dead_letters: Arc<dyn DeadLetterSink>,
    /// The stream, for a gate per invocation (as a fresh Lambda process would have).
    topology: Arc<MemoryStream>,
    shared: Arc<Shared>,
    mode: Mode,
    in_flight: usize,
    death_chance: f64,
    deadline_margin: Duration,
    max_attempts: u32,
    seed_methods_only: bool,
    /// The mapping may give up on batches (outside the contract): an invocation may then read
    /// records back that its event did not deliver.
    discards: bool,
    /// Skipped ranges are read at most this many records at a time (`parts.rs`).
    read_cap: Option<usize>,
    /// A seed-crate consumer sharing the table takes shards over between invocations.
    seed_consumer: Option<Arc<seed_consumer::Knowledge>>,
    /// Invocations running, by the shard of their event: in the partition-key mode the seed
    /// consumer takes no shard one of them runs (`seed_consumer::take_over`).
    running: Arc<Mutex<HashMap<String, usize>>>,
    /// A consumer of the whole shard holds its lease now and then, between invocations, in
    /// the partition-key mode (`holder.rs`).
    lease_holder: bool,
    /// Each invocation's clock is off by up to this much (milliseconds): the processor's
    /// `clock_skew` margin, which caps at a third of the lease's TTL.
    skew_ms: u64,
    /// The lease's TTL: 150 ms, or three times the skew (the least that gives the margin whole).
    lease_ttl: Duration,
    /// Invocations may pause (a frozen sandbox) past their stored lease while a rival takes the
    /// batch (`skew::Pause`).
    pauses: bool,
    /// Every event of one shard is read in chunks.
    chunked: bool,
    /// Each batch goes as a `DynamoDB` stream's window event (`dynamodb.rs`).
    dynamodb: bool,
    rng: Mutex<Rng>,
}

impl Harness {
    /// The settings both modes share.
    fn configured<H: Handler, M: CheckpointMode>(
        &self,
        processor: Processor<H, M>,
        sink: Arc<dyn DeadLetterSink>,
    ) -> Processor<H, M> {
        let clock = self.shared.clock.clone();
        let topology: Arc<dyn kinesis_checkpoint::gate::Topology> = match self.read_cap {
            Some(cap) => Arc::new(parts::Capped {
                inner: self.topology.clone(),
                cap,
            }),
            None => self.topology.clone(),
        };
        let gate = Gate::new(topology, StartingPosition::TrimHorizon).clock(clock.clone());
        let processor = if self.chunked {
            processor.read_in_chunks_above(0)
        } else {
            processor
        };
        processor
            .clock(clock.clone())
            .dead_letters(sink)
            .gate(gate)
            .concurrency(self.in_flight)
            .max_attempts(self.max_attempts)
            .deadline_margin(self.deadline_margin)
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
            let event_shard = event.records.first().and_then(|record| {
                record
                    .event_id
                    .as_deref()?
                    .split_once(':')
                    .map(|(shard, _)| shard.to_owned())
            });
            let hold = self.lease_holder.then(|| {
                let mut rng = self.rng.lock().unwrap();
                rng.chance(0.15)
                    .then(|| Duration::from_millis(rng.within(20..200)))
            });
            if let (Some(Some(ttl)), Some(shard)) = (hold, event_shard.as_deref()) {
                let owner = format!("holder-{invocation}");
                holder::hold(self.seed.as_ref(), &self.shared, (shard, &owner), ttl).await;
            }
            if let Some(knowledge) = &self.seed_consumer {
                let (records, stop_inside) = {
                    let mut rng = self.rng.lock().unwrap();
                    let records = rng.chance(0.2).then(|| rng.within(1..4) as usize);
                    (records, rng.chance(0.3))
                };
                if let (Some(records), Some(shard)) = (records, event_shard.clone()) {
                    let owner = format!("seed-{invocation}");
                    let busy = || {
                        self.running
                            .lock()
                            .unwrap()
                            .get(&shard)
                            .is_some_and(|&n| n > 0)
                    };
                    seed_consumer::take_over(
                        self.seed.as_ref(),
                        &self.topology,
                        knowledge,
                        &self.shared,
                        (&shard, &owner),
                        (records, stop_inside),
                        (self.mode == Mode::PartitionKey).then_some(&busy as _),
                    )
                    .await;
                }
            }
            let _running = event_shard
                .clone()
                .map(|shard| Running::start(&self.running, shard));
            // A sandbox that freezes after its first record, its clock the furthest behind: its
            // stored lease lapses a whole margin before its own view of it would without one.
            let pausing = self.pauses
                && event.records.len() > 1
                && !invocation.starts_with("rival-")
                && self.rng.lock().unwrap().chance(0.3);
            let skewed = (self.skew_ms > 0).then(|| {
                let spread = self.rng.lock().unwrap().within(0..2 * self.skew_ms + 1);
                let skew = i64::try_from(self.skew_ms).unwrap();
                let offset_ms = if pausing {
                    -skew
                } else {
                    i64::try_from(spread).unwrap() - skew
                };
                self.shared
                    .note(format!("{invocation}'s clock is off by {offset_ms} ms"));
                Arc::new(skew::skewed(self.store.clone(), offset_ms))
            });
            let pause = skewed
                .as_ref()
                .filter(|_| pausing)
                .map(|skewed| Arc::new(skew::Pause::new(skewed.clone())));
            let store: Arc<dyn CheckpointStore> = match &skewed {
                Some(skewed) => skewed.clone(),
                None => self.store.clone(),
            };
            let death = Arc::new(Notify::new());
            // The handling after which this invocation dies, if it does.
            let dies_after = {
                let mut rng = self.rng.lock().unwrap();
                rng.chance(self.death_chance)
                    .then(|| rng.within(1..(event.records.len() as u64 + 1)))
            };
            let handled = Arc::new(AtomicU64::new(0));
            // What the event delivered: under the contract nothing else may run.
            let delivered: Arc<HashSet<String>> = Arc::new(
                event
                    .records
                    .iter()
                    .map(|record| record.kinesis.sequence_number.clone())
                    .collect(),
            );
            let checked = (!self.discards).then(|| delivered.clone());
            let deadline = context.deadline;
            let started = self.shared.clock.now_millis();
            let handler = {
                let (shared, invocation, death, pause, checked) = (
                    self.shared.clone(),
                    invocation.clone(),
                    death.clone(),
                    pause.clone(),
                    checked.clone(),
                );
                move |record: Record| {
                    let (shared, invocation, death, handled, pause) = (
                        shared.clone(),
                        invocation.clone(),
                        death.clone(),
                        handled.clone(),
                        pause.clone(),
                    );
                    let undelivered = checked
                        .as_ref()
                        .is_some_and(|delivered| !delivered.contains(record.sequence().as_str()));
                    async move {
                        if undelivered {
                            shared.undelivered(&record, &invocation);
                        }
                        handle(
                            record,
                            &shared,
                            (&invocation, deadline, started),
                            (&death, pause.as_deref()),
                            &handled,
                            dies_after,
                        )
                        .await
                    }
                }
            };
            // While this invocation is frozen, a rival sandbox takes the batch once the stored
            // lease lapses: a concurrent delivery that came late.
            // It runs to its end even when this invocation is over first (it is another sandbox).
            let finished = Notify::new();
            let rival = {
                let (event, invocation) = (event.clone(), invocation.clone());
                let (pause, shard, finished) = (pause.clone(), event_shard.clone(), &finished);
                async move {
                    if let (Some(pause), Some(shard)) = (pause, shard) {
                        tokio::select! {
                            biased;
                            () = pause.begin.notified() => {}
                            () = finished.notified() => return,
                        }
                        let stream = if self.dynamodb {
                            dynamodb::ARN
                        } else {
                            "orders"
                        };
                        let key = kinesis_checkpoint::LeaseKey::new(stream, shard.as_str());
                        for _ in 0..500 {
                            let now = self.shared.clock.now_millis();
                            let row = self.store.read(&key).await;
                            if row.is_ok_and(|row| row.lease_expiry.is_none_or(|e| e < now)) {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        let rival = format!("rival-{invocation}");
                        self.shared.note(format!(
                            "{invocation} is frozen past its stored lease; {rival} takes the batch"
                        ));
                        self.shared.journal.lock().unwrap().pauses += 1;
                        // The same deadline: Lambda stops this invocation at it, the rival with it.
                        let mut context = common::context(&rival, 0);
                        context.deadline = deadline;
                        let mut cut = Cut {
                            shared: &self.shared,
                            invocation: Some(rival),
                        };
                        let _ = self.invoke(event, context).await;
                        cut.invocation = None;
                        pause.done.notify_one();
                    }
                }
            };
            let sink = Arc::new(Journaled {
                inner: self.dead_letters.clone(),
                shared: self.shared.clone(),
                invocation: invocation.clone(),
                delivered: checked,
            });
            // The mode is the builder's type: only the shard mode has a lease to set.
            let batch = async {
                match self.mode {
                    Mode::Shard if self.dynamodb => {
                        let handler = move |record: Record| handler(dynamodb::original(&record));
                        let sink = Arc::new(dynamodb::Unwrapping(sink));
                        let processor = Processor::new(store, handler)
                            .lease_ttl(self.lease_ttl)
                            .clock_skew(Duration::from_millis(self.skew_ms));
                        let event = dynamodb::through_window(&event);
                        self.configured(processor, sink)
                            .process_batch(event, &context)
                            .await
                    }
                    Mode::Shard => {
                        let processor = Processor::new(store, handler)
                            .lease_ttl(self.lease_ttl)
                            .clock_skew(Duration::from_millis(self.skew_ms));
                        self.configured(processor, sink)
                            .process_batch(event, &context)
                            .await
                    }
                    Mode::PartitionKey => {
                        let processor = Processor::by_partition_key(store, handler);
                        self.configured(processor, sink)
                            .process_batch(event, &context)
                            .await
                    }
                }
            };
            let this = async {
                let outcome = tokio::select! {
                    biased;
                    () = death.notified() => {
                        self.shared.note(format!("{invocation} dies"));
                        self.shared.journal.lock().unwrap().died.insert(invocation.clone());
                        Err(InvocationError::Function(format!("{invocation} died (injected)")))
                    }
                    report = batch => {
                        let report = report.map_err(|e| InvocationError::Function(e.to_string()))?;
                        for shard in &report.shards {
                            let records: Vec<String> = shard
                                .records
                                .iter()
                                .map(|r| format!("{}={:?}", &r.position.to_string()[52..], r.disposition))
                                .collect();
                            self.shared.note(format!(
                                "{invocation} reports {}: stopped {}, {records:?}",
                                shard.key,
                                debug_start(&shard.stopped)
                            ));
                        }
                        let mut journal = self.shared.journal.lock().unwrap();
                        if ended_unrecorded(&report) {
                            journal.unrecorded_ends.insert(invocation.clone());
                        }
                        journal.deaths_found +=
                            report.shards.iter().filter(|shard| shard.died_at.is_some()).count() as u64;
                        for shard in &report.shards {
                            // A checkpoint that did not land (refused, failed, or the lease lost on
                            // the way) leaves every record this invocation handled to be handled
                            // again, the reported one and dead-lettered ones included.
                            let lost = shard.stopped.as_ref().is_some_and(|(_, reason)| {
                                reason.is_checkpoint_failure() || *reason == kinesis_checkpoint::report::StopReason::Fenced
                            }) || shard.count(Disposition::Uncheckpointed) > 0;
                            // A store with the seed's five methods cannot record progress inside an
                            // aggregate (the trait's stated weaker guarantee): the sub-records done
                            // before a stop inside one run again.
                            let stopped_inside = shard
                                .stopped
                                .as_ref()
                                .filter(|_| self.seed_methods_only)
                                .map(|(sequence, _)| format!("{sequence}/"));
                            // Records the mapping skipped and this invocation recovered count too.
                            journal.recovered += shard.gap.as_ref().map_or(0, |gap| gap.recovered.len() as u64);
                            let recovered = shard.gap.iter().flat_map(|gap| gap.recovered.iter().cloned());
                            for record in recovered.chain(&shard.records) {
                                let position = record.position.to_string();
                                let unrecorded = stopped_inside
                                    .as_deref()
                                    .is_some_and(|inside| position.starts_with(inside));
                                if lost || unrecorded || record.disposition == Disposition::Uncheckpointed {
                                    journal.uncheckpointed.insert((invocation.clone(), position));
                                }
                            }
                        }
                        Ok(report.response())
                    }
                };
                finished.notify_one();
                outcome
            };
            tokio::join!(this, rival).0
        })
    }
}

/// An invocation running on its event's shard, counted until it answers or is stopped.
struct Running {
    running: Arc<Mutex<HashMap<String, usize>>>,
    shard: String,
}

impl Running {
    fn start(running: &Arc<Mutex<HashMap<String, usize>>>, shard: String) -> Self {
        *running.lock().unwrap().entry(shard.clone()).or_default() += 1;
        Self {
            running: running.clone(),
            shard,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(n) = self.running.lock().unwrap().get_mut(&self.shard) {
            *n -= 1;
        }
    }
}

/// A rival invocation that has not answered when the invocation it runs beside is stopped:
/// stopped with it, as a timed-out invocation is.
struct Cut<'a> {
    shared: &'a Shared,
    invocation: Option<String>,
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        if let Some(invocation) = self.invocation.take() {
            self.shared
                .note(format!("{invocation} is stopped at the deadline"));
            self.shared.journal.lock().unwrap().died.insert(invocation);
        }
    }
}

/// The dead-letter sink of one invocation: a dead letter is a handling too.
struct Journaled {
    inner: Arc<dyn DeadLetterSink>,
    shared: Arc<Shared>,
    invocation: String,
    /// What the invocation's event delivered, when nothing else may be dead-lettered.
    delivered: Option<Arc<HashSet<String>>>,
}

impl DeadLetterSink for Journaled {
    fn send<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(async move {
            if let Some(delivered) = &self.delivered
                && !delivered.contains(letter.record.sequence().as_str())
            {
                self.shared.undelivered(&letter.record, &self.invocation);
            }
            self.inner.send(letter).await?;
            self.shared.journal.lock().unwrap().letters.insert(
                letter.record.position().to_string(),
                (
                    letter.record.data().to_vec(),
                    letter.record.partition_key().to_owned(),
                ),
            );
            self.shared.handled(
                &letter.record.position().to_string(),
                &self.invocation,
                true,
            );
            Ok(())
        })
    }
}

async fn handle(
    record: Record,
    shared: &Shared,
    (invocation, deadline, started): (&str, u64, u64),
    (death, pause): (&Notify, Option<&skew::Pause>),
    handled: &AtomicU64,
    dies_after: Option<u64>,
) -> Outcome {
    let position = record.position().to_string();
    let Ok(payload) = serde_json::from_slice::<Payload>(record.data()) else {
        return Outcome::reject("unreadable payload");
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
    let error = |short: String| payload.error_bytes.map_or(short, awkward_error);
    match payload.fault {
        Fault::Retry(n) if attempt <= n => {
            return Outcome::retry(error(format!("attempt {attempt}")));
        }
        Fault::Panic(n) if attempt <= n => panic!("injected panic, attempt {attempt}"),
        Fault::Kills(n) if attempt <= n => {
            // The process dies in the handler, before any effect (an abort, out of memory).
            shared.note(format!("{position} kills {invocation}"));
            shared.killed(&position, invocation);
            death.notify_one();
            std::future::pending::<()>().await;
        }
        Fault::Stubborn => return Outcome::retry(error("never succeeds".to_owned())),
        Fault::Poison => return Outcome::reject(error("poison".to_owned())),
        Fault::Slow if attempt == 1 => {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        Fault::Sluggish => {
            let left = deadline.saturating_sub(shared.clock.now_millis());
            // Half of the invocation's time (400 ms; a rival's is what was left when it
            // started): the processor's own rule for a fair share.
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
    shared.handled(&position, invocation, false);
    let count = handled.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(pause) = pause.filter(|_| count == 1) {
        // Frozen, renewals and all, until the rival has run the batch; thawed in time to
        // answer before the deadline cuts this handler.
        let now = shared.clock.now_millis();
        pause
            .freeze(Duration::from_millis(deadline.saturating_sub(now + 100)))
            .await;
        shared.note(format!("{invocation} thaws"));
    }
    if dies_after == Some(count) {
        // The invocation dies after this record's effect and before any checkpoint.
        shared
            .journal
            .lock()
            .unwrap()
            .deaths
            .push((invocation.to_owned(), position));
        death.notify_one();
        std::future::pending::<()>().await;
    }
    Outcome::ack()
}

/// One scenario's settings, all drawn from its seed.
#[derive(Debug, Clone)]
struct Scenario {
    seed: u64,
    shards: usize,
    records: u64,
    keys: u64,
    mapping: Mapping,
    mode: Mode,
    in_flight: usize,
    death_chance: f64,
    chaos: ChaosLevels,
    fault_chance: f64,
    /// Records packed into KPL aggregates, one just before each split among them.
    kpl: bool,
    /// The store offers the seed crate's five methods only: the trait's defaults do the rest.
    seed_methods_only: bool,
    max_attempts: u32,
    /// The mapping gives up on batches (finite retries, outside the contract; shard mode):
    /// gap recovery must bring every skipped record back.
    discards: bool,
    /// Skipped ranges are read at most this many records at a time (`parts.rs`): a range
    /// longer than one reading, as one of more than 10,000 records is in Lambda.
    read_cap: Option<usize>,
    /// A seed-crate consumer shares the table (shard mode, one record at a time: it knows
    /// nothing of the records done above a checkpoint under per-key concurrency).
    seed_consumer: bool,
    /// In the partition-key mode, a consumer of the whole shard holds the shard's lease now
    /// and then, doing nothing (`holder.rs`).
    lease_holder: bool,
    /// How far apart the invocations' clocks may be (milliseconds; 0: in step).
    skew_ms: u64,
    /// Skewed invocations may freeze past their stored lease while a rival takes the batch.
    pauses: bool,
    /// The dead-letter family, when on.
    letters: Option<Letters>,
    /// Every event of one shard is read in chunks (`Processor::read_in_chunks_above(0)`), as
    /// only events of more than 2 MB are by default: the scenarios' batches are far smaller.
    chunked: bool,
    /// Batches go as a `DynamoDB` stream's window events (shard mode; no KPL, no merge, no
    /// discards: a `DynamoDB` shard has one parent, and nothing reads a skipped range back).
    dynamodb: bool,
}

impl Scenario {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let partition_keys = rng.chance(0.3);
        let mode = if partition_keys {
            Mode::PartitionKey
        } else {
            Mode::Shard
        };
        let factor = if partition_keys {
            rng.within(1..11) as usize
        } else {
            1
        };
        // Mapping discards, outside the contract, in the shard mode only; drawn apart so that
        // every other setting of a seed stays as it was.
        let mut discard_rng = Rng::new(seed ^ 0xD15C_A4D5);
        let discards = discard_rng.chance(0.3) && !partition_keys;
        let mapping = Mapping::default()
            .batch_size(rng.within(1..30) as usize)
            .parallelization_factor(factor)
            .duplicate_deliveries(if rng.chance(0.5) { 0.2 } else { 0.0 })
            // Lambda never delivers one partition key to two invocations at once with a
            // factor above 1; in shard mode a concurrent delivery is fenced by the lease. Not
            // beside discards: a batch turned away by a live lease leaves no mark.
            .concurrent_deliveries(if partition_keys || rng.chance(0.5) || discards {
                0.0
            } else {
                0.2
            })
            .children_before_parents(if rng.chance(0.5) { 0.8 } else { 0.0 })
            .function_timeout(Duration::from_millis(400))
            .maximum_backoff(Duration::from_millis(20))
            .maximum_deliveries(20_000)
            .seed(seed);
        let mapping = if discards {
            mapping.maximum_retry_attempts(Some(discard_rng.within(0..3) as u32))
        } else {
            mapping
        };
        // Half of the discards read what the mapping skipped in parts of 2 to 4 records (as
        // Lambda reads more than 10,000 in parts), drawn apart too. (A part's last record read
        // is where the next one starts: a part of 1 would never move on.)
        let mut parts_rng = Rng::new(seed ^ 0x9A27_5EAD);
        let read_cap = (discards && parts_rng.chance(0.5)).then(|| parts_rng.within(2..5) as usize);
        let chaotic = rng.chance(0.5);
        let in_flight = [1, 1, 4, 16][rng.below(4) as usize];
        // A five-method store keeps no failing record and no records done above the checkpoint
        // (the trait's documented weaker guarantees): it serves one record at a time in shard
        // mode, and its scenarios draw no record that only a remembered attempt count ends.
        // Nor can it remember what was reported: a batch the mapping discards goes unnoticed.
        let seed_methods_only = !partition_keys && in_flight == 1 && rng.chance(0.25) && !discards;
        let skewed = !partition_keys && Rng::new(seed ^ 0x5CE3).chance(SKEW_CHANCE);
        let pauses = skewed && in_flight == 1 && Rng::new(seed ^ 0x9A05E).chance(0.5);
        // In the partition-key mode drawn apart too (30 %), with any concurrency: the mode
        // holds no lease on the shard while it runs, and the consumer takes only a shard no
        // invocation runs. Not beside discards: its checkpoint passes the row's mark.
        let seed_consumer = (!partition_keys
            && in_flight == 1
            && !seed_methods_only
            && !discards
            && Rng::new(seed ^ 0x5EED_C0DE).chance(0.25))
            || (partition_keys && Rng::new(seed ^ 0x5EED_4E75).chance(0.3));
        // Drawn apart, so that every other setting of a seed stays as it was.
        let lease_holder = partition_keys && Rng::new(seed ^ 0x0401_DE25).chance(0.3);
        let dynamodb = !partition_keys
            && !discards
            && !seed_consumer
            && Rng::new(seed ^ 0xDD_B5_7E).chance(0.25);
        Self {
            seed,
            shards: rng.within(1..4) as usize,
            records: rng.within(5..80),
            keys: rng.within(1..12),
            mapping,
            mode,
            in_flight,
            // Not beside discards: a dead invocation's lingering lease turns batches away, and
            // its claim's mark proves no gap when its batch began with records already done.
            death_chance: if rng.chance(0.3) && !discards {
                0.08
            } else {
                0.0
            },
            chaos: if chaotic {
                // Not beside discards: a refused claim, or a release refused and a lease left to
                // linger, turns a batch away without a mark, and so does a stolen lease.
                ChaosLevels {
                    throttle: if discards { 0.0 } else { 0.05 },
                    lost_answer: 0.03,
                    latency: 0.1,
                    max_latency: Duration::from_millis(2),
                    steal: if partition_keys || discards {
                        0.0
                    } else {
                        0.02
                    },
                    steal_ttl: Duration::from_millis(30),
                }
            } else {
                ChaosLevels::default()
            },
            fault_chance: if rng.chance(0.7) { 0.15 } else { 0.0 },
            kpl: rng.chance(0.3) && !dynamodb,
            seed_methods_only,
            max_attempts: rng.within(1..4) as u32,
            discards,
            read_cap,
            // Up to ±1 s between invocations, the processor's default `clock_skew`; their
            // lease is then 3 s (the margin caps at a third of the TTL). The shard mode only,
            // which has a lease.
            // A frozen sandbox (one record at a time, so the whole invocation is frozen) runs
            // with ±100 ms and a 300 ms lease: the freeze, the rival's run and the thaw fit in
            // the function's 400 ms.
            skew_ms: match (skewed, pauses) {
                (true, true) => 100,
                (true, false) => 1_000,
                (false, _) => 0,
            },
            pauses,
            seed_consumer,
            lease_holder,
            letters: Letters::draw(seed),
            // Drawn apart, so that every other setting of a seed stays as it was.
            chunked: Rng::new(seed ^ 0xC4_0C4E).chance(0.5),
            dynamodb,
        }
    }

    /// Writes the stream: records of `keys` keys, with a split and maybe a merge on the way,
    /// some of them packed into KPL aggregates (and then the split shard's last record is one).
    fn stream(&self, rng: &mut Rng, clock: Arc<dyn Clock>) -> Written {
        let stream = MemoryStream::new("orders", self.shards).clock(clock);
        let mut written = Written::default();
        // Discards reshard never: a closed parent's tail the mapping gave up on is recovered by
        // nothing (outside the contract), and its child would wait for it.
        let reshards = !self.discards;
        let split_at = rng
            .chance(0.6)
            .then(|| rng.below(self.records))
            .filter(|_| reshards);
        let merge_at = rng
            .chance(0.5)
            .then(|| rng.below(self.records))
            .filter(|_| reshards && !self.dynamodb);
        let mut children = None;
        let mut n = 0;
        while n < self.records {
            if split_at.is_some_and(|at| n >= at) && children.is_none() && !written.split {
                let key = format!("key-{}", rng.below(self.keys));
                if self.kpl {
                    // The parent's last record is an aggregate: its end is inside one.
                    let count = rng.within(2..6).min(self.records - n).max(1);
                    self.put(&stream, &mut written, rng, &key, n, count);
                    n += count;
                }
                children = Some(stream.split(&stream.shard_of(&key)));
                written.split = true;
                continue;
            }
            if merge_at.is_some_and(|at| n >= at)
                && let Some((left, right)) = children.take()
            {
                stream.merge(&left, &right);
            }
            let key = format!("key-{}", rng.below(self.keys));
            let count = if self.kpl && rng.chance(0.3) {
                rng.within(1..6).min(self.records - n)
            } else {
                0
            };
            self.put(&stream, &mut written, rng, &key, n, count);
            n += count.max(1);
        }
        written.stream = Some(stream);
        written
    }

    /// Puts record `n` under `key`, or, with a `count`, an aggregate of records `n..n + count`
    /// whose first has `key` (the rest have keys of their own, as a KPL producer packs them).
    fn put(
        &self,
        stream: &MemoryStream,
        written: &mut Written,
        rng: &mut Rng,
        key: &str,
        n: u64,
        count: u64,
    ) {
        let fault = |rng: &mut Rng| {
            if !rng.chance(self.fault_chance) {
                return Fault::None;
            }
            match rng.below(8) {
                0 => Fault::Retry(rng.within(1..4) as u32),
                // A record that kills every invocation only where deaths are counted: elsewhere
                // the mapping would retry it for ever (the partition-key mode, a five-method
                // store, a seed consumer releasing a dead invocation's lapsed lease).
                7 if self.discards => Fault::Retry(1),
                7 if self.deaths_counted() && rng.chance(0.5) => Fault::Kills(u32::MAX),
                7 => Fault::Kills(rng.within(1..5) as u32),
                1 => Fault::Panic(rng.within(1..3) as u32),
                // A store without a failing record counts attempts within one invocation only.
                2 if self.seed_methods_only => Fault::Poison,
                2 => Fault::Stubborn,
                3 => Fault::Poison,
                4 => Fault::Slow,
                5 => Fault::Sluggish,
                _ => Fault::Retry(1),
            }
        };
        let payload = |n: u64, fault: Fault| {
            let (error_bytes, pad) = self
                .letters
                .as_ref()
                .map_or((None, String::new()), |letters| letters.record(n));
            Payload {
                n,
                fault,
                error_bytes,
                pad,
            }
            .to_json()
        };
        if count == 0 {
            let fault = fault(rng);
            let payload = payload(n, fault);
            let sequence = stream.put(key, payload);
            written.faults.insert(sequence, fault);
            return;
        }
        // A KPL producer packs only records bound for one shard: the keys that hash there.
        let shard = stream.shard_of(key);
        let fellows: Vec<String> = (0..self.keys)
            .map(|k| format!("key-{k}"))
            .filter(|k| stream.shard_of(k) == shard)
            .collect();
        let mut keys = vec![key.to_owned()];
        keys.extend((1..count).map(|_| fellows[rng.below(fellows.len() as u64) as usize].clone()));
        let payloads: Vec<(Vec<u8>, Fault)> = (n..n + count)
            .map(|n| {
                let fault = fault(rng);
                (payload(n, fault), fault)
            })
            .collect();
        let records: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&payloads)
            .map(|(key, (payload, _))| (key.as_str(), payload.as_slice()))
            .collect();
        let sequence = stream.put(key, kpl_encoder::aggregate(&records));
        for (index, (_, fault)) in payloads.iter().enumerate() {
            written
                .faults
                .insert(sub_position(&sequence, index), *fault);
        }
        written.aggregates.insert(sequence, keys);
    }

    /// Whether a record that kills its invocations is found and, in the end, dead-lettered.
    fn deaths_counted(&self) -> bool {
        self.mode == Mode::Shard && !self.seed_methods_only && !self.seed_consumer
    }

    fn replay(&self) -> String {
        format!(
            "INVARIANT_SEED={} INVARIANT_SCENARIOS=1 cargo test --test invariants -- --nocapture",
            self.seed
        )
    }
}

/// The stream a scenario wrote, and what it put in it.
#[derive(Default)]
struct Written {
    stream: Option<MemoryStream>,
    /// Each aggregate's sequence number, and its user records' partition keys in order.
    aggregates: HashMap<String, Vec<String>>,
    /// The fault of every user record, by position.
    faults: HashMap<String, Fault>,
    split: bool,
}

impl Written {
    /// The user records of `shard` in order: their positions and the keys their order is
    /// kept by. That is each record's own partition key in the shard mode; with a
    /// `ParallelizationFactor` above 1 Lambda keeps order only per key it routes by, which for a
    /// KPL sub-record is its aggregate's (`routing`).
    fn user_records(&self, shard: &str, routing: bool) -> Vec<(String, String)> {
        let stream = self.stream.as_ref().expect("written");
        let mut records = Vec::new();
        for record in stream.records(shard) {
            match self.aggregates.get(&record.sequence) {
                Some(keys) => records.extend(keys.iter().enumerate().map(|(index, key)| {
                    let key = if routing { &record.partition_key } else { key };
                    (sub_position(&record.sequence, index), key.clone())
                })),
                None => records.push((record.sequence.clone(), record.partition_key.clone())),
            }
        }
        records
    }
}

/// A position written `sequence` or `sequence/index`, as it sorts: sequence numbers by length,
/// then digits; sub-records by index.
fn order_key(position: &str) -> (SequenceNumber, Option<u64>) {
    let (sequence, sub) = position
        .split_once('/')
        .map_or((position, None), |(sequence, sub)| {
            (sequence, Some(sub.parse().unwrap()))
        });
    (sequence.parse().unwrap(), sub)
}

/// How a sub-record's position is written: `sequence/index`.
fn sub_position(sequence: &str, index: usize) -> String {
    Position::sub_record(sequence.parse().unwrap(), index as u64).to_string()
}

/// The stream goes on after a run with discards: one more record on every shard (none
/// reshards then), delivered as the batch after everything the mapping delivered or gave up on
/// (until it is answered in full), so a range the mapping discarded at the end is found and
/// recovered as it would be in a live stream.
async fn later_batches(
    scenario: &Scenario,
    stream: &MemoryStream,
    written: &mut Written,
    harness: &Harness,
) {
    let shards: Vec<String> = Shards::list(stream)
        .await
        .expect("a memory stream lists its shards")
        .into_iter()
        .map(|info| info.id)
        .collect();
    for (index, shard) in shards.into_iter().enumerate() {
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
        let record = serde_json::json!({
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": key,
                "sequenceNumber": sequence,
                "data": base64::engine::general_purpose::STANDARD.encode(&payload),
                "approximateArrivalTimestamp": Duration::from_millis(VIRTUAL_EPOCH_MILLIS).as_secs_f64(),
            },
            "eventSource": "aws:kinesis",
            "eventVersion": "1.0",
            "eventID": format!("{shard}:{sequence}"),
            "eventName": "aws:kinesis:record",
            "awsRegion": "us-east-1",
            "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
        });
        let event = common::event(&[record]);
        // Until a lease left by a dead invocation lapses, whatever clock it was written by;
        // counted from the last attempt that handled a record, since the batch first runs the
        // discarded range, each of its faults, deaths and lapsed leases costing attempts of
        // its own. A run that handles nothing more for that long is stuck, and the check after
        // says which record it left.
        let lease_ms = harness.lease_ttl.as_millis() as u64;
        let patience = 30 + 2 * (lease_ms + 2 * scenario.skew_ms) / 20;
        // Progress is a handling, or a death: an invocation a record kills handles nothing
        // and leaves a lease to lapse.
        let progress = || {
            harness.shared.tick.load(Ordering::SeqCst)
                + harness.shared.journal.lock().unwrap().died.len() as u64
        };
        let (mut attempt, mut idle) = (0, 0);
        while idle < patience && attempt < 20 * patience {
            let ticks = progress();
            let mut context = common::context(&format!("later-{index}-{attempt}"), 2_000);
            context.deadline = harness.shared.clock.now_millis() + 2_000;
            harness
                .shared
                .note(format!("later: {shard} gets {}", &sequence[52..]));
            match harness.invoke(event.clone(), context).await {
                Ok(response) if response.batch_item_failures.is_empty() => break,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
            attempt += 1;
            idle = if progress() > ticks { 0 } else { idle + 1 };
        }
    }
}

/// What one scenario counted.
#[derive(Debug, Default)]
struct Counts {
    records: u64,
    deliveries: u64,
    deaths: u64,
    timeouts: u64,
    duplicates_after_death: u64,
    duplicates_after_failed_checkpoint: u64,
    reruns_by_seed_consumer: u64,
    /// In the partition-key mode, records a seed consumer ran again after the mode did them
    /// (it reads none of the keys' rows).
    key_reruns_by_seed_consumer: u64,
    dead_lettered: u64,
    discarded: u64,
    recovered: u64,
    /// Records that killed their invocations, and of them those dead-lettered.
    killers: u64,
    killers_dead_lettered: u64,
    /// Batches an invocation died running, found by a later claim.
    deaths_found: u64,
    takeovers: u64,
    holds: u64,
    pauses: u64,
    handoffs: [u64; 2],
    faults: [u64; 4],
    letters: LetterCounts,
}

/// Runs one scenario, noting what happens in `trace`; a violation is an error.
async fn run(scenario: &Scenario, trace: Arc<Mutex<Vec<String>>>) -> Result<Counts, String> {
    // Virtual: the runtime's time is paused, so the clock stands still while tasks run and
    // jumps to the next timer when all of them wait.
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(VIRTUAL_EPOCH_MILLIS));
    let mut rng = Rng::new(scenario.seed ^ 0x5EED);
    let mut written = scenario.stream(&mut rng, clock.clone());
    let stream = written.stream.clone().expect("written");
    {
        let mut trace = trace.lock().unwrap();
        trace.push(format!("{scenario:?}"));
        for shard in stream.shard_ids() {
            for record in stream.records(&shard) {
                let fault = match written.aggregates.get(&record.sequence) {
                    Some(keys) => format!(
                        "aggregate of {:?}",
                        (0..keys.len())
                            .map(|i| written.faults[&sub_position(&record.sequence, i)])
                            .collect::<Vec<_>>()
                    ),
                    None => serde_json::from_slice::<Payload>(&record.data)
                        .map_or_else(|_| "unreadable".to_owned(), |p| format!("{:?}", p.fault)),
                };
                trace.push(format!(
                    "stream: {shard} {} key {} {fault}",
                    &record.sequence[52..],
                    record.partition_key
                ));
            }
        }
    }
    let memory = Arc::new(MemoryLeaseStore::with_clock(clock.clone()));
    let chaos = Arc::new(
        Chaos::new(memory, scenario.chaos, scenario.seed)
            .traced(trace.clone())
            .around_store(),
    );
    let shared = Arc::new(Shared {
        journal: Mutex::default(),
        tick: AtomicU64::new(0),
        clock: clock.clone(),
        trace,
    });
    let queue = scenario.letters.as_ref().map(|letters| {
        Arc::new(FlakyQueue {
            queue: MemoryQueue::new(letters.max_message_bytes).clock(clock.clone()),
            failure: letters.part_failure,
            rng: Mutex::new(Rng::new(scenario.seed ^ 0xF1A4)),
            refused: AtomicU64::new(0),
            refusals: Mutex::default(),
            trace: shared.trace.clone(),
        })
    });
    let dead_letters: Arc<dyn DeadLetterSink> = match &queue {
        Some(queue) => queue.clone(),
        None => Arc::new(MemoryDeadLetters::new()),
    };
    let store: Arc<dyn CheckpointStore> = if scenario.seed_methods_only {
        Arc::new(SeedStore::new(chaos.clone()))
    } else {
        Arc::new(Layered::new(chaos.clone(), Pins(shared.clone())))
    };
    let harness = Harness {
        store,
        seed: chaos.clone(),
        dead_letters,
        topology: Arc::new(stream.clone()),
        shared: shared.clone(),
        mode: scenario.mode,
        in_flight: scenario.in_flight,
        death_chance: scenario.death_chance,
        deadline_margin: Duration::from_millis(50),
        max_attempts: scenario.max_attempts,
        seed_methods_only: scenario.seed_methods_only,
        discards: scenario.discards,
        read_cap: scenario.read_cap,
        skew_ms: scenario.skew_ms,
        lease_ttl: Duration::from_millis(150).max(Duration::from_millis(3 * scenario.skew_ms)),
        pauses: scenario.pauses,
        chunked: scenario.chunked,
        dynamodb: scenario.dynamodb,
        lease_holder: scenario.lease_holder,
        running: Arc::default(),
        seed_consumer: scenario.seed_consumer.then(|| {
            Arc::new(seed_consumer::Knowledge {
                aggregates: written
                    .aggregates
                    .iter()
                    .map(|(sequence, keys)| (sequence.clone(), keys.len()))
                    .collect(),
                faults: written.faults.clone(),
            })
        }),
        rng: Mutex::new(Rng::new(scenario.seed.rotate_left(17))),
    };
    let harness = Arc::new(harness);
    let report = EventSource::new(stream.clone(), scenario.mapping.clone())
        .clock(clock.clone())
        .run_observed(harness.clone(), |d| {
            let short: Vec<&str> = d.sequences.iter().map(|s| &s[52..]).collect();
            shared.note(format!(
                "source: {} delivered {} lane {} {short:?}: {}",
                d.request_id,
                d.shard,
                d.lane,
                debug_start(&d.outcome)
            ));
        })
        .await
        .map_err(|e| format!("the run stopped: {e}"))?;
    if scenario.discards {
        later_batches(scenario, &stream, &mut written, &harness).await;
    } else if !report.discarded.is_empty() {
        return Err(format!("records discarded: {:?}", report.discarded));
    }
    let letters = match &queue {
        Some(queue) => check_letters(&stream, &shared, queue).await?,
        None => LetterCounts::default(),
    };

    let journal = shared.journal.lock().unwrap();
    let mut counts = Counts {
        deliveries: report.deliveries,
        deaths: journal.died.len() as u64,
        timeouts: report.timed_out.len() as u64,
        faults: *chaos.layer().injected.lock().unwrap(),
        discarded: report.discarded.len() as u64,
        recovered: journal.recovered,
        deaths_found: journal.deaths_found,
        takeovers: journal.takeovers,
        holds: journal.holds,
        pauses: journal.pauses,
        handoffs: [
            journal.handoffs_into_aggregate,
            journal.handoffs_out_of_aggregate,
        ],
        letters,
        ..Counts::default()
    };
    // A death leaves its last record's effect without a checkpoint: that record must come again.
    for (invocation, position) in &journal.deaths {
        if journal.handlings.get(position).map_or(0, Vec::len) < 2 {
            return Err(format!(
                "{invocation} died after handling record {position}, which was never handled again"
            ));
        }
    }
    if let Some(first) = journal.undelivered.first() {
        return Err(format!(
            "under the documented mapping an invocation ran a record its event did not deliver: {first}"
        ));
    }
    let routing = scenario.mode == Mode::PartitionKey;
    // Every record of every shard, with its key and shard, in sequence order.
    let mut first_tick: HashMap<String, u64> = HashMap::new();
    let mut by_key: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for shard in stream.shard_ids() {
        for (position, partition_key) in written.user_records(&shard, routing) {
            counts.records += 1;
            let Some(handlings) = journal.handlings.get(&position) else {
                return Err(format!(
                    "record {position} of {shard} was neither processed nor dead-lettered"
                ));
            };
            let mut sorted = handlings.clone();
            sorted.sort_by_key(|h| h.tick);
            let dead_lettered = sorted.iter().any(|h| h.dead_lettered);
            counts.dead_lettered += u64::from(dead_lettered);
            let fault = written.faults[&position];
            // A healthy slow record cut although it had its fair share (a starved machine) was
            // rightly charged; one never started with it must never be.
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
            let killed = journal.kills.get(&position).copied().unwrap_or_default();
            if let Fault::Kills(n) = fault {
                counts.killers += 1;
                counts.killers_dead_lettered += u64::from(dead_lettered);
                // Each death the next claim found with the record pinned (a careful run's mark)
                // counts: one that reached `max_attempts` so is dead-lettered, not run again.
                let pinned_kills = journal.killed_by.get(&position).map_or(0, |killed| {
                    killed
                        .iter()
                        .filter(|invocation| {
                            journal.last_pinned.get(*invocation) == Some(&position)
                        })
                        .count()
                }) as u32;
                if scenario.deaths_counted()
                    && !dead_lettered
                    && (n == u32::MAX || pinned_kills >= scenario.max_attempts)
                {
                    return Err(format!(
                        "record {position} of {shard} killed {killed} invocations, {pinned_kills} of them pinned ({} attempts allowed), and was never dead-lettered: {sorted:?}",
                        scenario.max_attempts
                    ));
                }
            }
            for pair in sorted.windows(2) {
                let (earlier, later) = (&pair[0], &pair[1]);
                // A seed-crate consumer resumes after `checkpoint`: an aggregate the toolkit
                // stopped inside runs whole again (its done sub-records were never `checkpoint`).
                if later.invocation.starts_with("seed-") && position.contains('/') {
                    counts.reruns_by_seed_consumer += 1;
                    continue;
                }
                // In the partition-key mode it reads none of the keys' rows: it runs again what
                // the mode did after the shard's `checkpoint`. (The mode, which reads that
                // `checkpoint`, must never run again what the consumer checkpointed.)
                if scenario.mode == Mode::PartitionKey
                    && later.invocation.starts_with("seed-")
                    && !earlier.invocation.starts_with("seed-")
                {
                    counts.key_reruns_by_seed_consumer += 1;
                    continue;
                }
                // Lambda stops a function at its timeout wherever it is: like a death, but
                // one the handler never saw coming, so the journal learns it from the source.
                if journal.died.contains(&earlier.invocation)
                    || report.timed_out.contains(&earlier.invocation)
                {
                    counts.duplicates_after_death += 1;
                } else if journal
                    .uncheckpointed
                    .contains(&(earlier.invocation.clone(), position.clone()))
                {
                    counts.duplicates_after_failed_checkpoint += 1;
                } else {
                    return Err(format!(
                        "record {position} of {shard} was handled twice ({sorted:?}), the first time by {} which neither died nor failed to checkpoint it",
                        earlier.invocation
                    ));
                }
            }
            first_tick.insert(position.clone(), sorted[0].tick);
            by_key
                .entry(partition_key)
                .or_default()
                .push((position, sorted[0].tick));
        }
    }
    for (key, records) in &by_key {
        let mut records = records.clone();
        // In the extended order: sequence numbers by length, then digits; sub-records by index.
        records.sort_by_cached_key(|(position, _)| order_key(position));
        if let Some(pair) = records.windows(2).find(|w| w[0].1 > w[1].1) {
            let trail: Vec<String> = records
                .iter()
                .map(|(p, _)| format!("{}:{:?}", &p[50..], journal.handlings[p]))
                .collect();
            return Err(format!(
                "key {key}: record {} was first handled after the later record {}; {trail:#?}",
                pair[0].0, pair[1].0
            ));
        }
    }
    for child in stream.shard_ids() {
        let Some(child_first) = written
            .user_records(&child, routing)
            .iter()
            .map(|(position, _)| first_tick[position])
            .min()
        else {
            continue;
        };
        for parent in stream.parents(&child) {
            for (position, _) in written.user_records(&parent, routing) {
                if first_tick[&position] > child_first {
                    return Err(format!(
                        "child {child} was handled before record {position} of its parent {parent}"
                    ));
                }
            }
        }
    }
    Ok(counts)
}

/// Whether a report says its invocation's last write did not land: refused, failed, or the
/// lease lost on the way.
fn ended_unrecorded(report: &kinesis_checkpoint::BatchReport) -> bool {
    report.shards.iter().any(|shard| {
        shard.stopped.as_ref().is_some_and(|(_, reason)| {
            reason.is_checkpoint_failure()
                || *reason == kinesis_checkpoint::report::StopReason::Fenced
        }) || shard.count(Disposition::Uncheckpointed) > 0
    })
}

/// Notes, per invocation, the record its last careful mark pinned, and whether its last write
/// (the one that releases the lease) did not land (see [`Journal`]).
pub(crate) struct Pins(pub(crate) Arc<Shared>);

impl Layer for Pins {
    fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        let commit = call
            .commit()
            .or_else(|| call.transaction().map(|transaction| &transaction.commit));
        if let (Some(commit), Some(owner)) = (commit, call.owner())
            && commit.keep_lease
            && let FailingChange::Set(pin) = &commit.failing
            && let Ok(position) = Position::from_checkpoint(&pin.sequence, pin.sub_sequence)
        {
            self.0
                .journal
                .lock()
                .unwrap()
                .last_pinned
                .insert(owner.to_owned(), position.to_string());
        }
        // A last write refused or failed leaves the row as the invocation's last mark left it:
        // to the next claim, the invocation died running the record it had pinned.
        let last = commit
            .filter(|commit| !commit.keep_lease)
            .and(call.owner().map(str::to_owned));
        Box::pin(async move {
            let answer = next.run(call).await;
            if let Some(owner) = last
                && !matches!(format!("{answer:?}").as_str(), "Ok(true)" | "Ok(Committed)")
            {
                self.0.journal.lock().unwrap().unrecorded_ends.insert(owner);
            }
            answer
        })
    }
}

/// Whether a record at `position` with `fault` may have been dead-lettered after
/// `max_attempts` attempts: its failures, and the deaths of invocations that died (or whose
/// last write did not land) while it was the last record they started (a killer's own are in
/// its fault already), reach the limit.
fn dead_letter_allowed(
    journal: &Journal,
    timed_out: &[String],
    (position, fault): (&str, Fault),
    max_attempts: u32,
) -> Result<(), String> {
    // An invocation that died, timed out or lost its lease before its last write landed is,
    // to the next claim, one that died running the record it had pinned.
    let ended_unrecorded = |invocation: &String| {
        journal.died.contains(invocation)
            || timed_out.contains(invocation)
            || journal.unrecorded_ends.contains(invocation)
    };
    let died_running = journal
        .last_started
        .iter()
        .chain(&journal.last_pinned)
        .filter(|(invocation, last)| last.as_str() == position && ended_unrecorded(invocation))
        .map(|(invocation, _)| invocation)
        .collect::<HashSet<_>>()
        .len() as u32;
    let killed = journal.kills.get(position).copied().unwrap_or_default();
    let charged = fault
        .failures()
        .saturating_add(died_running.saturating_sub(killed));
    if charged >= max_attempts {
        return Ok(());
    }
    Err(format!(
        "({fault:?}, {max_attempts} attempts allowed, {died_running} invocations died running it) was dead-lettered"
    ))
}

/// How many scenarios `cargo test` runs unless `INVARIANT_SCENARIOS` says otherwise: on
/// virtual time, 10,000 take about what 1,000 took on the wall clock.
const DEFAULT_SCENARIOS: u64 = 10_000;

/// Writes a scenario's trace to `target/invariant-traces/seed-N.log`.
fn write_trace(seed: u64, trace: &[String]) {
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/invariant-traces");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join(format!("seed-{seed}.log")),
        trace.join("\n") + "\n",
    )
    .unwrap();
}

/// The share of scenarios whose invocations' clocks disagree.
const SKEW_CHANCE: f64 = 0.3;

/// Where every scenario's virtual clock starts: 2025-11-30T14:19:05Z, so times look real.
const VIRTUAL_EPOCH_MILLIS: u64 = 1_764_512_345_000;

/// The first 500 bytes of `value`'s `Debug` text, and `…` if there is more. A handler's error can
/// be 300 KB of characters that `Debug` escapes one by one (the dead-letter family): written in
/// full into every trace, they took a tenth of the scenarios' time, and a trace line needs only
/// their start. The writing stops at the limit.
fn debug_start(value: &impl std::fmt::Debug) -> String {
    struct Start(String);
    impl std::fmt::Write for Start {
        fn write_str(&mut self, text: &str) -> std::fmt::Result {
            let room = 500 - self.0.len();
            if text.len() <= room {
                self.0.push_str(text);
                return Ok(());
            }
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.0.push_str(&text[..cut]);
            Err(std::fmt::Error)
        }
    }
    let mut start = Start(String::new());
    if std::fmt::write(&mut start, format_args!("{value:?}")).is_err() {
        start.0.push('…');
    }
    start.0
}

/// Keeps the injected panics out of the output, once per process.
fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let injected = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("injected panic"));
            if !injected {
                default_hook(info);
            }
        }));
    });
}

/// Runs the scenario of `seed` alone on a runtime of its own whose time is paused: everything
/// it waits for (back-offs, leases of dead invocations running out, slow handlers, time-outs)
/// takes no real time, and it sees the same times however loaded the machine is. Returns the
/// scenario, its outcome and its trace.
fn run_one(seed: u64) -> (Scenario, Result<Counts, String>, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let scenario = Scenario::new(seed);
    let trace = Arc::new(Mutex::new(Vec::new()));
    let outcome = runtime.block_on(async {
        // A scenario that never ends is a violation too (a shard stuck for good): two minutes
        // of virtual time are hundreds of function time-outs.
        tokio::time::timeout(Duration::from_mins(2), run(&scenario, trace.clone()))
            .await
            .unwrap_or_else(|_| Err("the run did not end within two minutes".into()))
    });
    // The runtime goes first: tasks it still holds (a stray invocation) hold the trace too.
    drop(runtime);
    let trace = std::mem::take(&mut *trace.lock().unwrap());
    (scenario, outcome, trace)
}

/// Runs `seeds` on every core, each scenario on its own paused runtime (see [`run_one`]); the
/// outcomes in seed order. With `keep_traces`, every trace is returned; otherwise only failing
/// ones.
fn run_seeds(
    seeds: &[u64],
    keep_traces: bool,
) -> Vec<(Scenario, Result<Counts, String>, Vec<String>)> {
    let threads = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outcomes = Mutex::new(Vec::with_capacity(seeds.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.min(seeds.len()) {
            scope.spawn(|| {
                while let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let (scenario, outcome, mut trace) = run_one(seed);
                    if outcome.is_err() || std::env::var_os("INVARIANT_TRACE").is_some() {
                        write_trace(seed, &trace);
                    }
                    if outcome.is_err() {
                        // CI keeps the output, not the files: the end of the story goes there.
                        let tail = &trace[trace.len().saturating_sub(60)..];
                        eprintln!("seed {seed}, the trace's last lines:\n{}", tail.join("\n"));
                    }
                    if !keep_traces && outcome.is_ok() {
                        trace = Vec::new();
                    }
                    outcomes.lock().unwrap().push((scenario, outcome, trace));
                }
            });
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap();
    outcomes.sort_by_key(|(scenario, _, _)| scenario.seed);
    outcomes
}

#[test]
fn two_runs_of_the_same_seeds_write_byte_identical_traces_however_loaded_the_machine_is() {
    quiet_injected_panics();
    // Seeds of every family: discards, the dead-letter family, KPL, skew, seed consumers,
    // deaths and both modes are among the first few dozen.
    let seeds: Vec<u64> = (1..=24).collect();
    let first = run_seeds(&seeds, true);
    // The second run competes with threads that spin: a machine under load.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let second = std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                let mut x = 0_u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(
                        x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                    );
                }
            });
        }
        let second = run_seeds(&seeds, true);
        stop.store(true, Ordering::Relaxed);
        second
    });
    for ((scenario, outcome, trace), (_, again, retrace)) in first.iter().zip(&second) {
        let seed = scenario.seed;
        assert!(trace.len() > 10, "seed {seed} traced almost nothing");
        assert_eq!(
            outcome.as_ref().err(),
            again.as_ref().err(),
            "seed {seed} ended differently"
        );
        let (bytes, again) = (trace.join("\n"), retrace.join("\n"));
        if bytes != again {
            let line = trace
                .iter()
                .zip(retrace)
                .position(|(a, b)| a != b)
                .unwrap_or(trace.len().min(retrace.len()));
            panic!(
                "seed {seed}: the traces differ from line {line}:\n  {:?}\n  {:?}",
                trace.get(line),
                retrace.get(line)
            );
        }
    }
}

#[test]
fn every_record_is_handled_once_in_order_and_parents_first_under_faults() {
    quiet_injected_panics();
    let count: u64 =
        std::env::var("INVARIANT_SCENARIOS").map_or(DEFAULT_SCENARIOS, |n| n.parse().unwrap());
    let first: u64 = std::env::var("INVARIANT_SEED").map_or(1, |n| n.parse().unwrap());
    let mut totals = Counts::default();
    let mut failures = Vec::new();
    let seeds: Vec<u64> = (first..first + count).collect();
    let outcomes = run_seeds(&seeds, false);
    for (scenario, outcome, _) in outcomes {
        let seed = scenario.seed;
        match outcome {
            Ok(counts) => {
                totals.records += counts.records;
                totals.deliveries += counts.deliveries;
                totals.deaths += counts.deaths;
                totals.timeouts += counts.timeouts;
                totals.duplicates_after_death += counts.duplicates_after_death;
                totals.duplicates_after_failed_checkpoint +=
                    counts.duplicates_after_failed_checkpoint;
                totals.reruns_by_seed_consumer += counts.reruns_by_seed_consumer;
                totals.key_reruns_by_seed_consumer += counts.key_reruns_by_seed_consumer;
                totals.discarded += counts.discarded;
                totals.recovered += counts.recovered;
                totals.killers += counts.killers;
                totals.killers_dead_lettered += counts.killers_dead_lettered;
                totals.deaths_found += counts.deaths_found;
                totals.takeovers += counts.takeovers;
                totals.holds += counts.holds;
                totals.pauses += counts.pauses;
                totals.handoffs[0] += counts.handoffs[0];
                totals.handoffs[1] += counts.handoffs[1];
                totals.dead_lettered += counts.dead_lettered;
                for (total, n) in totals.faults.iter_mut().zip(counts.faults) {
                    *total += n;
                }
                totals.letters.add(&counts.letters);
            }
            Err(violation) => {
                eprintln!(
                    "scenario {seed} failed: {violation}\n  {scenario:?}\n  trace: target/invariant-traces/seed-{seed}.log\n  replay: {}",
                    scenario.replay()
                );
                failures.push(seed);
            }
        }
    }
    eprintln!(
        "{count} scenarios: {} records, {} deliveries, {} dead-lettered; {} invocations died and {} timed out, {} records handled again after either, {} after a checkpoint that did not land, {} sub-records run again by a seed consumer resuming before their aggregate; store faults injected: {} throttled, {} lost answers, {} slow calls, {} stolen leases",
        totals.records,
        totals.deliveries,
        totals.dead_lettered,
        totals.deaths,
        totals.timeouts,
        totals.duplicates_after_death,
        totals.duplicates_after_failed_checkpoint,
        totals.reruns_by_seed_consumer,
        totals.faults[0],
        totals.faults[1],
        totals.faults[2],
        totals.faults[3],
    );
    eprintln!("{}", totals.letters);
    eprintln!(
        "deaths: {} batches an invocation died running found by the next claim; {} records killed their invocations, {} of them dead-lettered for it",
        totals.deaths_found, totals.killers, totals.killers_dead_lettered,
    );
    eprintln!(
        "outside the contract: {} records given up on by the mapping, {} read back and run by gap recovery; a seed consumer took {} shards over ({} inside an aggregate the toolkit stopped in; it stopped inside one {} times, left to the toolkit; in the partition-key mode it ran {} records again that the mode had done); {} invocations froze past their stored lease while a rival ran their batch; a consumer of the whole shard held its lease {} times in the partition-key mode",
        totals.discarded,
        totals.recovered,
        totals.takeovers,
        totals.handoffs[0],
        totals.handoffs[1],
        totals.key_reruns_by_seed_consumer,
        totals.pauses,
        totals.holds,
    );
    assert!(
        count < 100 || totals.deaths > 0,
        "no death was injected: the death injection is not working"
    );
    assert!(
        count < 1_000 || (totals.deaths_found > 0 && totals.killers_dead_lettered > 0),
        "no death was found, or no killer dead-lettered: the death family is not drawn"
    );
    assert!(
        count < 1_000 || totals.holds > 0,
        "no shard lease was held in the partition-key mode: the lease-holder family is not drawn"
    );
    assert!(
        count < 1_000 || totals.key_reruns_by_seed_consumer > 0,
        "no seed consumer ran a record in the partition-key mode: its family is not drawn"
    );
    assert!(
        count < 1_000 || totals.recovered > 0,
        "no gap was recovered in the shard mode: the discard family is not drawn"
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
}
