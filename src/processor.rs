//! One Lambda invocation: parse, claim, gate, dedupe, dispatch, checkpoint, answer.
//!
//! Lambda's event source mapping delivers a shard's records at least once, retries from the
//! lowest sequence number a function reports, and reads nothing but that report. The
//! [`Processor`] turns those rules into effectively-once processing: it unpacks KPL aggregates,
//! claims the shard's lease, holds a child shard back until its parents are finished (the
//! [`gate`](crate::gate)), skips what the checkpoint says is done, runs the handler in order
//! until the first record that is not done (moving poison records to the
//! [dead-letter sink](crate::dead_letter)), writes the new checkpoint, the failing record and
//! the release in one conditional write, and reports that one record.
//!
//! Dispatch (running the handler over the records that are not done) is one function with a
//! narrow contract: it takes the pending records and returns what became of each, and the
//! position below which everything is done. A per-partition-key concurrent dispatcher fits the
//! same contract.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use lambda_runtime::{Context, Diagnostic, LambdaEvent, Service};
use tracing::Instrument;

use crate::dead_letter::{DeadLetter, DeadLetterReason, DeadLetterSink};
use crate::gap::GapReport;
use crate::gate::{Gate, Held};
use crate::handler::{Handler, Outcome};
pub use crate::keyed::DEFAULT_MAX_DONE_ABOVE;
use crate::lease::{
    Below, BoxFuture, Claim, Commit, FailingChange, FailingRecord, LeaseKey, LeaseState,
    LeaseStore, ReportedChange,
};
use crate::memory::{millis, now_millis};
use crate::metrics::{Meter, Metrics};
use crate::partition_key::{DEFAULT_KEY_TTL, Mode};
use crate::record::{LambdaKinesisEvent, MalformedRecord, Parsed, Record, parse_event};
use crate::sequence::{Position, SequenceNumber, cmp_record};

/// How long a lease is taken for, unless the invocation's deadline is sooner. Short, so that an
/// invocation that dies holds its shard for seconds; renewed while a long batch runs.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// How many attempts a failing record gets before it is dead-lettered, when a sink is set.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// How long before the deadline dispatching stops, leaving time for the checkpoint write.
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_secs(1);

/// How far another sandbox's clock may run ahead of this one's. The stored lease expiry is this
/// sandbox's clock plus the TTL, and another invocation judges it by its own clock: this one
/// stops counting on the lease that much earlier, so two sandboxes never both believe they hold
/// it.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// Runs a [`Handler`] over Lambda's Kinesis batches, effectively once per record.
///
/// Cloning is cheap: the store and the handler are shared.
///
/// # Examples
///
/// A whole Lambda function:
///
/// ```no_run
/// use std::sync::Arc;
///
/// use kinesis_checkpoint::{DynamoLeaseStore, Outcome, Processor, Record};
///
/// async fn handle(record: Record) -> Outcome {
///     tracing::info!(sequence = %record.sequence(), "processed");
///     Outcome::ack()
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), lambda_runtime::Error> {
///     let config = aws_config::load_from_env().await;
///     let leases = Arc::new(DynamoLeaseStore::new(&config, "orders-leases"));
///     lambda_runtime::run(Processor::new(leases, handle).service()).await
/// }
/// ```
pub struct Processor<H> {
    store: Arc<dyn LeaseStore>,
    handler: Arc<H>,
    dead_letters: Option<Arc<dyn DeadLetterSink>>,
    gate: Option<Arc<Gate>>,
    deaggregate: bool,
    max_attempts: u32,
    lease_ttl: Duration,
    clock_skew: Duration,
    deadline_margin: Duration,
    max_in_flight: usize,
    max_done_above: usize,
    mode: Mode,
    key_ttl: Duration,
    meter: Option<Arc<Meter>>,
}

impl<H> Clone for Processor<H> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            handler: Arc::clone(&self.handler),
            dead_letters: self.dead_letters.clone(),
            gate: self.gate.clone(),
            deaggregate: self.deaggregate,
            max_attempts: self.max_attempts,
            lease_ttl: self.lease_ttl,
            clock_skew: self.clock_skew,
            deadline_margin: self.deadline_margin,
            max_in_flight: self.max_in_flight,
            max_done_above: self.max_done_above,
            mode: self.mode,
            key_ttl: self.key_ttl,
            meter: self.meter.clone(),
        }
    }
}

impl<H> fmt::Debug for Processor<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Processor")
            .field("dead_letters", &self.dead_letters.is_some())
            .field("gate", &self.gate)
            .field("max_attempts", &self.max_attempts)
            .field("lease_ttl", &self.lease_ttl)
            .field("clock_skew", &self.clock_skew)
            .field("deadline_margin", &self.deadline_margin)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_done_above", &self.max_done_above)
            .field("mode", &self.mode)
            .field("metrics", &self.meter.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a batch failed as a whole instead of reporting one record per shard.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// A record without a usable sequence number: no identifier can name it in a partial batch
    /// failure, so the whole batch fails from it and Lambda delivers it again (or bisects).
    /// The records before it were processed and checkpointed.
    #[error("{0}; the batch fails from this record so that Lambda delivers it again")]
    Unreportable(MalformedRecord),
}

impl From<ProcessError> for Diagnostic {
    fn from(error: ProcessError) -> Self {
        Self {
            error_type: "KinesisCheckpoint.ProcessError".to_owned(),
            error_message: error.to_string(),
        }
    }
}

/// What became of one record of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// The handler ran and the record is done.
    Processed,
    /// At or below the checkpoint: done by an earlier delivery, not run again.
    Duplicate,
    /// Reported as the batch item failure: Lambda delivers it again.
    Reported,
    /// After the reported record: not run, delivered again with it.
    NotAttempted,
    /// The record can never succeed and is in the dead-letter sink: done.
    DeadLettered,
    /// The handler ran (or the record was dead-lettered), but the checkpoint could not be
    /// written (the lease was lost or the store failed): Lambda delivers it again and it runs
    /// (or is dead-lettered) again.
    Uncheckpointed,
    /// The handler failed on it, but a lower record of another partition key is the one
    /// reported (per-key concurrency): delivered again with it.
    Failed,
}

impl Disposition {
    /// Whether the record's effect happened in this invocation (processed, or sent to the
    /// dead-letter sink): if the checkpoint does not land, it happens again.
    pub(crate) const fn runs_again_unrecorded(self) -> bool {
        matches!(self, Self::Processed | Self::DeadLettered)
    }
}

impl fmt::Display for Disposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Processed => "processed",
            Self::Duplicate => "skipped (duplicate)",
            Self::Reported => "reported",
            Self::NotAttempted => "not attempted",
            Self::Uncheckpointed => "processed, not checkpointed",
            Self::DeadLettered => "dead-lettered",
            Self::Failed => "failed (a lower record is reported)",
        })
    }
}

/// Why a shard stopped before the end of its records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// Another live owner holds the lease: a concurrent delivery of the same shard.
    LeaseHeld {
        /// The holder, when the store said.
        owner: Option<String>,
    },
    /// The lease store failed (throttled, unreachable, refused).
    Store(String),
    /// The row's checkpoint is not a sequence number.
    BadCheckpoint(String),
    /// The handler asked for the record to be retried.
    Retry(String),
    /// The handler rejected the record and no dead-letter sink takes it, so it is retried.
    Rejected(String),
    /// The handler panicked.
    Panicked(String),
    /// The handler ran into the deadline.
    HandlerTimedOut,
    /// Too little time was left to start another record.
    Deadline,
    /// The lease was lost (a renew failed or it lapsed): another owner may be processing.
    Fenced,
    /// The checkpoint write found the lease in another owner's hands.
    CheckpointFenced,
    /// The checkpoint write failed.
    CheckpointFailed(String),
    /// A record of the batch cannot be understood.
    Malformed(String),
    /// A child shard waits for its parents.
    Held(Held),
    /// The record was to be dead-lettered, but the sink failed: it is retried.
    DeadLetterFailed(String),
    /// Records the mapping skipped could not be read (or not all of them in time): the batch
    /// is reported, and the next invocation reads on from the first record not run.
    GapUnread(String),
}

impl StopReason {
    /// Whether the records were processed but their checkpoint could not be written.
    ///
    /// ```
    /// # use kinesis_checkpoint::StopReason;
    /// assert!(StopReason::CheckpointFenced.is_checkpoint_failure());
    /// assert!(!StopReason::Deadline.is_checkpoint_failure());
    /// ```
    #[must_use]
    pub const fn is_checkpoint_failure(&self) -> bool {
        matches!(self, Self::CheckpointFenced | Self::CheckpointFailed(_))
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LeaseHeld { owner } => write!(
                f,
                "the shard's lease is held by {} (a concurrent delivery)",
                owner.as_deref().unwrap_or("another invocation")
            ),
            Self::Store(error) => write!(f, "the lease store failed: {error}"),
            Self::BadCheckpoint(error) => write!(f, "the stored checkpoint is unreadable: {error}"),
            Self::Retry(error) => write!(f, "the handler asked for a retry: {error}"),
            // Also the dead letter's error when a sink takes the record: say what happened only.
            Self::Rejected(error) => write!(f, "the handler rejected the record: {error}"),
            Self::Panicked(message) => write!(f, "the handler panicked: {message}"),
            Self::HandlerTimedOut => f.write_str("the handler ran into the invocation's deadline"),
            Self::Deadline => f.write_str("too little time left before the invocation's deadline"),
            Self::Fenced => f.write_str("the lease was lost while the batch ran"),
            Self::CheckpointFenced => {
                f.write_str("the checkpoint was refused: another owner took the lease")
            }
            Self::CheckpointFailed(error) => write!(f, "the checkpoint write failed: {error}"),
            Self::Malformed(error) => write!(f, "{error}"),
            Self::Held(held) => write!(f, "held back until its parents are finished: {held}"),
            Self::DeadLetterFailed(error) => write!(f, "the dead-letter sink failed: {error}"),
            Self::GapUnread(error) => write!(
                f,
                "records the event source mapping skipped are not all read yet: {error}"
            ),
        }
    }
}

/// One record's place and fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordReport {
    /// The record's position in its shard.
    pub position: Position,
    /// What became of it.
    pub disposition: Disposition,
}

/// What one invocation did with one shard's records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardReport {
    /// The stream and shard.
    pub key: LeaseKey,
    /// Every record of the shard in the batch, in order.
    pub records: Vec<RecordReport>,
    /// The record reported to Lambda, and why, when the shard stopped early.
    pub stopped: Option<(SequenceNumber, StopReason)>,
    /// The checkpoint this invocation wrote, if it moved.
    pub checkpoint: Option<Position>,
    /// Records the event source mapping skipped before this batch, found and run first (see
    /// [`gap`](crate::gap)).
    pub gap: Option<GapReport>,
}

impl ShardReport {
    /// How many records met `disposition`.
    ///
    /// ```
    /// # use kinesis_checkpoint::{Disposition, ShardReport};
    /// fn print(report: &ShardReport) {
    ///     println!("{} processed", report.count(Disposition::Processed));
    /// }
    /// ```
    #[must_use]
    pub fn count(&self, disposition: Disposition) -> usize {
        self.records
            .iter()
            .filter(|record| record.disposition == disposition)
            .count()
    }
}

/// What one invocation did: one report per shard, in the order the batch named them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// One entry per (stream, shard) of the batch; Lambda sends one.
    pub shards: Vec<ShardReport>,
    /// Reported records that belong to no shard of the batch (a malformed record whose stream
    /// and shard are unknown and that has no neighbour to take them from).
    pub orphans: Vec<(SequenceNumber, StopReason)>,
}

impl BatchReport {
    /// The answer Lambda reads: at most one item per shard, the first record not done; never a
    /// null or empty identifier.
    ///
    /// ```
    /// # use kinesis_checkpoint::BatchReport;
    /// let response = BatchReport::default().response();
    /// assert!(response.batch_item_failures.is_empty(), "nothing failed");
    /// ```
    #[must_use]
    pub fn response(&self) -> KinesisEventResponse {
        let mut response = KinesisEventResponse::default();
        for (sequence, _) in self
            .shards
            .iter()
            .filter_map(|shard| shard.stopped.as_ref())
            .chain(&self.orphans)
        {
            response.add_failure(sequence.as_str());
        }
        response
    }
}

impl<H: Handler> Processor<H> {
    /// A processor that keeps its leases and checkpoints in `store` and runs `handler` on each
    /// record.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    ///
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_record: Record| async {
    ///     Outcome::ack()
    /// });
    /// ```
    pub fn new(store: Arc<dyn LeaseStore>, handler: H) -> Self {
        Self {
            store,
            handler: Arc::new(handler),
            dead_letters: None,
            gate: None,
            deaggregate: true,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            lease_ttl: DEFAULT_LEASE_TTL,
            clock_skew: DEFAULT_CLOCK_SKEW,
            deadline_margin: DEFAULT_DEADLINE_MARGIN,
            max_in_flight: 1,
            max_done_above: DEFAULT_MAX_DONE_ABOVE,
            mode: Mode::Shard,
            key_ttl: DEFAULT_KEY_TTL,
            meter: None,
        }
    }

    /// Emits each invocation's [metrics](crate::metrics) as one `CloudWatch` embedded-metric
    /// line (off by default): records in, processed, duplicates, held, failed, reported,
    /// dead-lettered, the lease store's requests and the checkpoint write's latency.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// use kinesis_checkpoint::metrics::Metrics;
    ///
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .metrics(Metrics::new("Orders"));
    /// ```
    #[must_use]
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        let store = match &self.meter {
            // Set again: replace the settings, not wrap the wrapper.
            Some(meter) => meter.inner(),
            None => Arc::clone(&self.store),
        };
        let (meter, metered) = Meter::new(metrics, store);
        self.store = metered;
        self.meter = Some(Arc::new(meter));
        self
    }

    /// Moves records that can never succeed to `sink`: at once when the handler rejects one, and
    /// after [`max_attempts`](Self::max_attempts) failures (retries, panics, time-outs) of the
    /// same record, counted across invocations in the shard's row. The checkpoint moves past a
    /// record only once the sink has taken it. Without a sink, every failed record is reported
    /// and retried, never dropped.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryDeadLetters, MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .dead_letters(Arc::new(MemoryDeadLetters::new()));
    /// ```
    #[must_use]
    pub fn dead_letters(mut self, sink: Arc<dyn DeadLetterSink>) -> Self {
        self.dead_letters = Some(sink);
        self
    }

    /// Holds a child shard's batches back until its parents are finished (see
    /// [`Gate`]). Without a gate, batches of a child run as they come.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::gate::{Gate, ShardInfo, StartingPosition, Topology};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// fn processor(topology: Arc<dyn Topology>) -> Processor<impl kinesis_checkpoint::Handler> {
    ///     Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///         .gate(Gate::new(topology, StartingPosition::TrimHorizon))
    /// }
    /// ```
    #[must_use]
    pub fn gate(mut self, gate: Gate) -> Self {
        self.gate = Some(Arc::new(gate));
        self
    }

    /// Whether KPL aggregates are unpacked into their user records (on by default). Each
    /// sub-record reaches the handler on its own, with its sub-sequence number, and the
    /// checkpoint can stop inside an aggregate (kept beside it, in `aggregate_sequence` and
    /// `aggregate_sub`), so a redelivery skips the sub-records already done; an aggregate whose
    /// last sub-record is done is checkpointed whole. Turn it off only for a consumer that wants the raw aggregates.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let raw = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .deaggregate(false);
    /// ```
    #[must_use]
    pub const fn deaggregate(mut self, on: bool) -> Self {
        self.deaggregate = on;
        self
    }

    /// How many failed attempts a record gets before it is dead-lettered (at least 1; default
    /// 3). Only with a [`dead_letters`](Self::dead_letters) sink.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryDeadLetters, MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .dead_letters(Arc::new(MemoryDeadLetters::new()))
    ///     .max_attempts(5);
    /// ```
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// How long each lease is taken or renewed for (capped by the time left before the
    /// deadline). Renewal runs every third of it while the batch runs.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .lease_ttl(Duration::from_secs(10));
    /// ```
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl.max(Duration::from_millis(3));
        self
    }

    /// How far another sandbox's clock may run ahead of this one's (default
    /// [`DEFAULT_CLOCK_SKEW`]). The stored lease expiry is this sandbox's clock plus the TTL and
    /// a concurrent delivery elsewhere judges it by its own clock, so this invocation stops
    /// relying on its lease that much before the expiry it wrote. The margin never exceeds a
    /// third of the lease's TTL; keep the TTL well above the skew.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .clock_skew(Duration::from_millis(2_500));
    /// ```
    #[must_use]
    pub const fn clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = skew;
        self
    }

    /// How long before the deadline no new record is started and a running handler is
    /// stopped, so the checkpoint can be written before Lambda times out.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .deadline_margin(Duration::from_millis(500));
    /// ```
    #[must_use]
    pub const fn deadline_margin(mut self, margin: Duration) -> Self {
        self.deadline_margin = margin;
        self
    }

    /// Runs records of different partition keys concurrently, up to `max_in_flight` at once,
    /// and the records of one key strictly in order (see [`keyed`](crate::keyed)). 1, the
    /// default, runs the whole shard in order, one record at a time.
    ///
    /// When a record of a key fails, no later record of that key runs; other keys go on. The
    /// checkpoint is the highest position below which every record is done, the records done
    /// above it are remembered in the row (at most [`max_done_above`](Self::max_done_above)) so
    /// that a redelivery skips them, and the record reported is the lowest one not done.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .concurrency(32);
    /// ```
    #[must_use]
    pub fn concurrency(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight.max(1);
        self
    }

    /// How many records done above the checkpoint the row may remember (default
    /// [`DEFAULT_MAX_DONE_ABOVE`]), under per-key [`concurrency`](Self::concurrency). At the
    /// bound, no new record starts above the lowest one not done: the rest of the batch is not
    /// attempted and comes back with the redelivery, so nothing runs twice and the row stays
    /// small (a `DynamoDB` item holds 400 KB; a position takes about 60 bytes).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .concurrency(32)
    ///     .max_done_above(500);
    /// ```
    #[must_use]
    pub fn max_done_above(mut self, positions: usize) -> Self {
        self.max_done_above = positions.max(1);
        self
    }

    /// How checkpoints are kept: [`Mode::Shard`] (the default) for an event source mapping with
    /// `ParallelizationFactor` 1, [`Mode::PartitionKey`] for 2 to 10 (see
    /// [`partition_key`](crate::partition_key)).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Mode, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .mode(Mode::PartitionKey)
    ///     .concurrency(16);
    /// ```
    #[must_use]
    pub const fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// How long a partition key's row outlives its last write in [`Mode::PartitionKey`]
    /// (default [`DEFAULT_KEY_TTL`], 8 days): set it to the stream's retention and a day.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Mode, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .mode(Mode::PartitionKey)
    ///     .key_ttl(Duration::from_hours(25));
    /// ```
    #[must_use]
    pub const fn key_ttl(mut self, ttl: Duration) -> Self {
        self.key_ttl = ttl;
        self
    }

    pub(crate) fn store(&self) -> &dyn LeaseStore {
        self.store.as_ref()
    }

    pub(crate) fn gate_ref(&self) -> Option<&Gate> {
        self.gate.as_deref()
    }

    pub(crate) const fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    pub(crate) const fn key_ttl_value(&self) -> Duration {
        self.key_ttl
    }

    pub(crate) const fn deadline_margin_value(&self) -> Duration {
        self.deadline_margin
    }

    /// Whether KPL aggregates are unpacked.
    pub(crate) const fn deaggregates(&self) -> bool {
        #[cfg(feature = "kpl")]
        return self.deaggregate;
        #[cfg(not(feature = "kpl"))]
        false
    }

    /// The processor as a Lambda service, for `lambda_runtime::run`.
    ///
    /// It is `Clone`, as `lambda_runtime::run_concurrent` (feature `concurrency-tokio`, for
    /// Lambda Managed Instances) needs to run several invocations at once in one process: each
    /// invocation claims its shard as its own owner (the function name and its request id), so
    /// two of one shard exclude each other through the lease while other shards proceed.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # async fn run() -> Result<(), lambda_runtime::Error> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// lambda_runtime::run(processor.service()).await
    /// # }
    /// ```
    #[must_use]
    pub fn service(
        self,
    ) -> impl Service<
        LambdaEvent<LambdaKinesisEvent>,
        Response = KinesisEventResponse,
        Error = ProcessError,
        Future = impl Future<Output = Result<KinesisEventResponse, ProcessError>> + Send,
    > + Clone {
        // The event is read as `LambdaKinesisEvent`: exact arrival times, and no timestamp
        // that fails or panics the batch.
        lambda_runtime::service_fn(move |event: LambdaEvent<LambdaKinesisEvent>| {
            let processor = self.clone();
            async move { processor.process(event.payload.0, &event.context).await }
        })
    }

    /// Processes one batch and answers Lambda.
    ///
    /// # Errors
    ///
    /// [`ProcessError::Unreportable`] when a record has no usable sequence number; the records
    /// before it were processed and checkpointed.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// let event = serde_json::from_str(include_str!("../events/batch.json"))?;
    /// let response = processor.process(event, &lambda_runtime::Context::default()).await?;
    /// assert!(response.batch_item_failures.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn process(
        &self,
        event: KinesisEvent,
        context: &Context,
    ) -> Result<KinesisEventResponse, ProcessError> {
        self.process_batch(event, context)
            .await
            .map(|report| report.response())
    }

    /// Processes one batch and says what became of every record: what
    /// [`process`](Self::process) answers Lambda, with the detail.
    ///
    /// # Errors
    ///
    /// As [`process`](Self::process).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{Disposition, MemoryLeaseStore, Outcome, Processor, Record};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// let event: aws_lambda_events::event::kinesis::KinesisEvent =
    ///     serde_json::from_str(include_str!("../events/batch.json"))?;
    /// let context = lambda_runtime::Context::default();
    /// let first = processor.process_batch(event.clone(), &context).await?;
    /// let again = processor.process_batch(event, &context).await?;
    /// assert_eq!(again.shards[0].count(Disposition::Duplicate), first.shards[0].count(Disposition::Processed));
    /// # Ok(())
    /// # }
    /// ```
    #[tracing::instrument(name = "batch", skip_all, fields(request = context.request_id, records = event.records.len()))]
    pub async fn process_batch(
        &self,
        mut event: KinesisEvent,
        context: &Context,
    ) -> Result<BatchReport, ProcessError> {
        let started = self.meter.as_ref().map(|meter| meter.begin());
        let invocation = Invocation::new(context);
        tracing::debug!(
            owner = invocation.owner,
            deadline = context.deadline,
            time_left_ms = invocation.time_left().map(|left| left.as_millis()),
            "batch received"
        );
        let (mut groups, orphans, unreportable) = group(parse_event(&mut event));
        if self.deaggregate {
            for group in &mut groups {
                group.entries = deaggregate(std::mem::take(&mut group.entries));
            }
        }
        let mut report = BatchReport::default();
        let shards = async {
            let mut shards = Vec::with_capacity(groups.len());
            for group in groups {
                let span = tracing::info_span!(
                    "shard",
                    stream = group.key.stream(),
                    shard = group.key.shard(),
                    records = group.entries.len(),
                );
                shards.push(self.run_shard(group, &invocation).instrument(span).await);
            }
            shards
        };
        // Metered, the invocation counts its own requests and checkpoint latencies, apart from
        // others this process runs at the same time (Lambda Managed Instances).
        report.shards = match (&self.meter, &started) {
            (Some(meter), Some(started)) => meter.scope(started, shards).await,
            _ => shards.await,
        };
        for malformed in orphans {
            tracing::error!(%malformed, "reporting a record of unknown stream and shard");
            let sequence = malformed
                .reportable_sequence()
                .expect("orphans are reportable");
            report
                .orphans
                .push((sequence, StopReason::Malformed(malformed.to_string())));
        }
        if let (Some(meter), Some(started)) = (&self.meter, &started) {
            meter.end(started, &report);
        }
        match unreportable {
            Some(malformed) => {
                tracing::error!(%malformed, "failing the whole batch");
                Err(ProcessError::Unreportable(malformed))
            }
            None => Ok(report),
        }
    }

    /// Claim, dedupe, dispatch, checkpoint and release one shard's records.
    #[allow(
        clippy::too_many_lines,
        reason = "the steps of one invocation, in order, clearer in one place"
    )]
    async fn run_shard(&self, group: ShardBatch, invocation: &Invocation) -> ShardReport {
        if self.mode == Mode::PartitionKey {
            return crate::partition_key::run_shard(self, group, invocation).await;
        }
        let ShardBatch { key, entries } = group;
        let owner = invocation.owner.as_str();
        let skew = self.clock_skew.min(self.lease_ttl / 3);
        let ttl = invocation.lease_ttl(self.lease_ttl, skew);
        let report = ShardReport::empty(key.clone(), entries.len());
        let first = entries.first().map(Entry::position);

        // The stored expiry is counted from when the claim was sent, not from its answer: the
        // local view of the lease starts there too, and lapses a skew margin early.
        let lease = LeaseWatch::starting_at(now_millis(), ttl, skew);
        let state = match self
            .claim(&key, owner, ttl, (first.as_ref(), &entries))
            .await
        {
            Ok(state) => state,
            Err(reason) => return report.stop_all(&entries, reason),
        };
        // The gate may read Kinesis for a while: the lease is renewed meanwhile, and a gate that
        // outlasts it leaves nothing dispatched.
        let gated = tokio::select! {
            biased;
            gated = self.pass_gate(&key, owner, &state, first.as_ref()) => gated,
            () = self.keep_alive(&key, owner, invocation, &lease) => unreachable!("renewal never ends"),
        };
        let (checkpoint, parent_shards) = match gated {
            Ok(gated) => gated,
            Err(reason) => return report.stop_all(&entries, reason),
        };

        // Records the mapping skipped run first; `recovered` of the entries are theirs, and
        // dispatch stops before `cut` (a record not read yet) when the range was read in part.
        // Reading them may take a while: the lease is renewed meanwhile.
        let recovering = crate::gap::recover_or_release(
            self,
            (&key, owner),
            (&state, checkpoint.as_ref()),
            parent_shards,
            entries,
            invocation,
            report,
        );
        let recovered = tokio::select! {
            biased;
            recovered = recovering => recovered,
            () = self.keep_alive(&key, owner, invocation, &lease) => unreachable!("renewal never ends"),
        };
        let (recovery, parent_shards, mut report) = match recovered {
            Ok(recovered) => recovered,
            Err(stopped) => return stopped,
        };
        let crate::gap::Recovery {
            entries,
            recovered,
            cut,
            gap,
        } = recovery;
        report.gap = gap;

        // Dedupe: everything at or below the checkpoint was done by an earlier delivery.
        let done_before = |entry: &Entry| {
            checkpoint
                .as_ref()
                .is_some_and(|c| entry.cmp_position(c).is_le())
        };
        let skipped = entries
            .iter()
            .take_while(|entry| done_before(entry))
            .count();
        let (duplicates, pending) = entries.split_at(skipped);
        let mut records: Vec<RecordReport> = duplicates
            .iter()
            .map(|entry| RecordReport {
                position: entry.position(),
                disposition: Disposition::Duplicate,
            })
            .collect();
        if skipped > 0 {
            tracing::info!(skipped, "skipped records at or below the checkpoint");
        }
        let runnable = cut.map_or(pending.len(), |cut| cut.saturating_sub(skipped));

        // Dispatch, with the lease renewed in the background while it runs.
        let failing = state.failing.clone();
        let mut dispatched = tokio::select! {
            biased;
            dispatched = self.dispatch(&pending[..runnable], invocation, &lease, failing, &state.done_above) => dispatched,
            () = self.keep_alive(&key, owner, invocation, &lease) => unreachable!("renewal never ends"),
        };
        if runnable < pending.len() {
            crate::gap::stop_at_unread(&mut dispatched, runnable, pending.len());
        }

        // Checkpoint and release in one conditional write. An aggregate whose last sub-record
        // is done is checkpointed whole: `checkpoint` names records done whole, and a parent
        // ending in it is then exhausted at it.
        let progress = dispatched
            .done_through
            .clone()
            .map(|done| settled(&entries, done))
            .filter(|done| checkpoint.as_ref().is_none_or(|c| done > c));
        let below = progress.as_ref().map_or(Below::Keep, |progress| {
            Below::of(progress, prior(&entries, progress), &state)
        });
        let done_above = crate::keyed::remembered(
            &state.done_above,
            &dispatched.done_above,
            progress.as_ref().or(checkpoint.as_ref()),
        );
        let remember = crate::gap::after_run(
            &state,
            progress.as_ref().or(checkpoint.as_ref()),
            dispatched
                .stopped
                .as_ref()
                .map(|(index, _)| pending[*index].position()),
        );
        let (dispositions, stopped) = self
            .commit(
                &key,
                owner,
                (progress.as_ref(), below),
                (parent_shards, remember),
                done_above,
                dispatched,
            )
            .await;
        if stopped
            .as_ref()
            .is_none_or(|(_, reason)| !reason.is_checkpoint_failure())
        {
            report.checkpoint = progress;
        }

        records.extend(
            pending
                .iter()
                .zip(&dispositions)
                .map(|(entry, disposition)| RecordReport {
                    position: entry.position(),
                    disposition: *disposition,
                }),
        );
        let stopped = stopped.map(|(index, reason)| (skipped + index, reason));
        if let Some((index, reason)) = crate::gap::report(&mut report, records, recovered, stopped)
        {
            let sequence = entries[index].sequence().clone();
            tracing::info!(%sequence, %reason, "reporting the first record not done");
            report.stopped = Some((sequence, reason));
        }
        report
    }

    /// Claims the shard's lease and reads its row in one request; or says why nothing may run,
    /// the lease released.
    async fn claim(
        &self,
        key: &LeaseKey,
        owner: &str,
        ttl: Duration,
        (attempting, batch): (Option<&Position>, &[Entry]),
    ) -> Result<LeaseState, StopReason> {
        let state = match self
            .store
            .acquire_and_read(key, owner, ttl, attempting)
            .await
        {
            Ok(Claim::Acquired(state)) => state,
            Ok(Claim::Held(state)) => {
                let owner = state.lease_owner.clone();
                tracing::warn!(
                    holder = owner.as_deref().unwrap_or("unknown"),
                    "another invocation holds the shard's lease; processing nothing"
                );
                // The holder may be an invocation whose release did not land: should the mapping
                // give up on this batch meanwhile, the next one must find the gap.
                self.turned_away(key, &state, batch).await;
                return Err(StopReason::LeaseHeld { owner });
            }
            Err(error) => {
                tracing::error!(%error, "could not claim the shard's lease; processing nothing");
                self.release(key, owner, Vec::new(), ReportedChange::Keep)
                    .await;
                // The claim's mark of the batch did not land: should the mapping give up on the
                // batch (its retries spent on refused claims), the next one must find the gap.
                // A store that refuses this too has lost nothing yet; one that refuses every
                // write on every delivery of the batch leaves nothing to find it by.
                if attempting.is_some() {
                    match self.store.read(key).await {
                        Ok(state) => self.turned_away(key, &state, batch).await,
                        Err(error) => {
                            tracing::warn!(%error, "could not remember the batch turned away");
                        }
                    }
                }
                return Err(StopReason::Store(error.to_string()));
            }
        };
        Ok(state)
    }

    /// Remembers a batch that ran nothing, in the row's `contended` (written without the lease):
    /// its first record above the checkpoint, since another writer (a seed consumer) may have
    /// done part of it already, and a mark at or below the checkpoint is read as done. The
    /// lowest batch turned away counts, so an older mark still above the checkpoint is kept.
    async fn turned_away(&self, key: &LeaseKey, state: &LeaseState, batch: &[Entry]) {
        let done = state.position().ok().flatten();
        let first = batch
            .iter()
            .map(Entry::position)
            .find(|position| done.as_ref().is_none_or(|done| position > done));
        let older = state.contended.as_ref().filter(|contended| {
            done.as_ref().is_none_or(|done| *contended > done)
                && first.as_ref().is_some_and(|first| *contended <= first)
        });
        if let (Some(first), None) = (&first, older)
            && let Err(error) = self.store.mark_contended(key, first).await
        {
            tracing::warn!(%error, "could not remember the batch turned away");
        }
    }

    /// Reads the claimed row's checkpoint and passes the gate: a child shard waits until its
    /// parents are finished. Returns the checkpoint and the parents just learnt; or why nothing
    /// may run, the lease released.
    async fn pass_gate(
        &self,
        key: &LeaseKey,
        owner: &str,
        state: &LeaseState,
        first: Option<&Position>,
    ) -> Result<(Option<Position>, Vec<String>), StopReason> {
        let checkpoint = match state.position() {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                tracing::error!(%error, "the shard's checkpoint is unreadable; processing nothing");
                self.release(key, owner, Vec::new(), ReportedChange::Keep)
                    .await;
                return Err(StopReason::BadCheckpoint(error.to_string()));
            }
        };
        let Some(gate) = &self.gate else {
            return Ok((checkpoint, Vec::new()));
        };
        let verdict = gate.check(self.store.as_ref(), key, state).await;
        if let Some(held) = verdict.held {
            tracing::warn!(%held, "holding the shard back until its parents are finished");
            // The row remembers the held batch: if the mapping gives up on it, the batch after
            // it is caught as a gap once the parents are finished.
            let remember = crate::gap::nothing_ran(state, checkpoint.as_ref(), first);
            self.release(key, owner, verdict.learnt_parents, remember)
                .await;
            return Err(StopReason::Held(held));
        }
        Ok((checkpoint, verdict.learnt_parents))
    }

    /// Releases the lease without progress (keeping the parents just learnt); a failure only
    /// means the lease lapses by itself.
    pub(crate) async fn release(
        &self,
        key: &LeaseKey,
        owner: &str,
        parent_shards: Vec<String>,
        reported: ReportedChange,
    ) {
        let release = Commit {
            parent_shards,
            reported,
            ..Commit::default()
        };
        if let Err(error) = self.store.commit(key, owner, &release).await {
            tracing::warn!(%error, "could not release the lease; it lapses by itself");
        }
    }

    /// Writes `progress` and what to remember of the failing record, and releases the lease, in
    /// one write. When the write is refused or fails, the
    /// records processed here are not recorded: they are marked so and the first of them is
    /// reported, since Lambda must deliver them again.
    async fn commit(
        &self,
        key: &LeaseKey,
        owner: &str,
        (progress, below): (Option<&Position>, Below),
        (parent_shards, reported): (Vec<String>, ReportedChange),
        done_above: Option<Vec<Position>>,
        dispatched: Dispatched,
    ) -> (Vec<Disposition>, Option<(usize, StopReason)>) {
        let Dispatched {
            mut dispositions,
            stopped,
            failing,
            ..
        } = dispatched;
        let commit = Commit {
            checkpoint: progress.cloned(),
            below,
            failing,
            parent_shards,
            done_above,
            reported,
        };
        let reason = match self.store.commit(key, owner, &commit).await {
            Ok(true) => return (dispositions, stopped),
            Ok(false) => StopReason::CheckpointFenced,
            Err(error) => StopReason::CheckpointFailed(error.to_string()),
        };
        if progress.is_none()
            && !dispositions
                .iter()
                .copied()
                .any(Disposition::runs_again_unrecorded)
        {
            tracing::warn!(%reason, "could not release the lease; it lapses by itself");
            return (dispositions, stopped);
        }
        tracing::error!(
            stream = key.stream(),
            shard = key.shard(),
            checkpoint = progress.map(tracing::field::display),
            %reason,
            "could not checkpoint; reporting from the first record processed in this invocation"
        );
        // A record dead-lettered here is in the sink, but with the checkpoint behind it Lambda
        // would move past it while the row never does: a closed shard would never be found
        // exhausted and its children would wait forever. It is reported like a processed one,
        // and dead-lettered again on redelivery.
        let mut first = None;
        for (index, disposition) in dispositions.iter_mut().enumerate() {
            if disposition.runs_again_unrecorded() {
                *disposition = Disposition::Uncheckpointed;
                first.get_or_insert(index);
            }
        }
        // Under per-key concurrency a record that failed may lie below the first one processed:
        // the lower of the two is reported, or Lambda would skip it.
        let stopped = match (first, stopped) {
            (Some(first), Some((index, stop))) if index < first => Some((index, stop)),
            (Some(first), _) => Some((first, reason)),
            (None, stopped) => stopped,
        };
        (dispositions, stopped)
    }

    /// Runs the handler over `pending` in order until a record is not done, dead-lettering the
    /// records that can never be, and skipping those the row remembers as done above the
    /// checkpoint. With per-key concurrency, [`keyed::dispatch`](crate::keyed) does it.
    async fn dispatch(
        &self,
        pending: &[Entry],
        invocation: &Invocation,
        lease: &LeaseWatch,
        failing: Option<FailingRecord>,
        done_above: &[Position],
    ) -> Dispatched {
        if self.max_in_flight > 1 {
            let limits = crate::keyed::Limits {
                by_routing_key: false,
                max_in_flight: self.max_in_flight,
                max_done_above: self.max_done_above,
            };
            return crate::keyed::dispatch(
                self, pending, invocation, lease, failing, done_above, limits,
            )
            .await;
        }
        let mut failing = Failing {
            known: failing,
            change: FailingChange::Keep,
        };
        let mut dispositions = vec![Disposition::NotAttempted; pending.len()];
        // Every record before `index` is done: the position below which all are done is the
        // previous record's, taken once at the end rather than cloned for every record.
        let done_before = |index: usize| index.checked_sub(1).map(|last| pending[last].position());
        for (index, entry) in pending.iter().enumerate() {
            // Only a row written under per-key concurrency remembers records done above its
            // checkpoint; without them, no position needs building to look one up.
            if !done_above.is_empty() && done_above.binary_search(&entry.position()).is_ok() {
                dispositions[index] = Disposition::Duplicate;
                continue;
            }
            match self.attempt(entry, invocation, lease, &mut failing).await {
                Ok(disposition) => dispositions[index] = disposition,
                Err(reason) => {
                    tracing::warn!(sequence = %entry.sequence(), %reason, "the record is not done; stopping");
                    dispositions[index] = Disposition::Reported;
                    return Dispatched {
                        dispositions,
                        done_through: done_before(index),
                        stopped: Some((index, reason)),
                        failing: failing.change,
                        done_above: Vec::new(),
                    };
                }
            }
        }
        Dispatched {
            dispositions,
            done_through: done_before(pending.len()),
            stopped: None,
            failing: failing.change,
            done_above: Vec::new(),
        }
    }

    /// Runs one record, unless something says the shard must stop before it. A record that
    /// fails is counted in `failing`, and dead-lettered when it is rejected or out of attempts.
    #[tracing::instrument(name = "record", skip_all, fields(
        stream = entry.key().map(LeaseKey::stream),
        shard = entry.key().map(LeaseKey::shard),
        sequence = %entry.sequence(),
        sub_sequence = entry.position().sub_sequence(),
    ))]
    pub(crate) async fn attempt(
        &self,
        entry: &Entry,
        invocation: &Invocation,
        lease: &LeaseWatch,
        failing: &mut Failing,
    ) -> Result<Disposition, StopReason> {
        let record = match entry {
            Entry::Record(record) => record,
            Entry::Malformed(malformed, _) => {
                return Err(StopReason::Malformed(malformed.to_string()));
            }
            Entry::AfterMalformed(_) => {
                return Err(StopReason::Malformed(
                    "an earlier record of the batch cannot be processed".to_owned(),
                ));
            }
            Entry::Undecodable(error) => {
                let reason = StopReason::Rejected(error.to_string());
                return self.failed(error.record(), reason, true, failing).await;
            }
        };
        // One reading of the clock serves both checks and the handler's time limit.
        let now = now_millis();
        if lease.lost_at(now) {
            return Err(StopReason::Fenced);
        }
        let time_left = invocation
            .time_left_at(now)
            .map(|left| left.saturating_sub(self.deadline_margin));
        if time_left.is_some_and(|left| left.is_zero()) {
            return Err(StopReason::Deadline);
        }
        let stop_at = time_left.map(|left| now.saturating_add(millis(left)));
        let (reason, rejected) = match self.call(record.clone(), stop_at).await {
            Ok(Outcome::Ack) => {
                failing.succeeded(record);
                return Ok(Disposition::Processed);
            }
            Ok(Outcome::Retry(error)) => (StopReason::Retry(error.to_string()), false),
            Ok(Outcome::Reject(error)) => (StopReason::Rejected(error.to_string()), true),
            // Cut by the invocation's deadline, not by its own fault: a record started late had
            // no fair chance, and its effect may still land. Only a record given at least half
            // of the invocation's time counts an attempt, so one that hangs is still
            // dead-lettered in the end (it comes first in the redelivery, with the whole time).
            Err(StopReason::HandlerTimedOut) if !invocation.had_fair_share(now) => {
                tracing::warn!(
                    sequence = %record.sequence(),
                    "the record started late and was cut by the deadline; not counted as an attempt"
                );
                return Err(StopReason::HandlerTimedOut);
            }
            Err(reason) => (reason, false),
        };
        self.failed(record, reason, rejected, failing).await
    }

    /// Counts a failure of `record` and dead-letters it when it was `rejected` or is out of
    /// attempts (and a sink is set); otherwise the shard stops there.
    async fn failed(
        &self,
        record: &Record,
        reason: StopReason,
        rejected: bool,
        failing: &mut Failing,
    ) -> Result<Disposition, StopReason> {
        let position = record.position();
        // `Rejected`'s own text is for a shard that stops there (no sink); a dead letter is
        // the other case and says only what the handler said.
        let error = match &reason {
            StopReason::Rejected(message) if self.dead_letters.is_some() => {
                format!("the handler rejected the record: {message}")
            }
            _ => reason.to_string(),
        };
        let attempts = failing.failed(&position, &error);
        let Some(sink) = &self.dead_letters else {
            if rejected {
                tracing::warn!(%reason, "no dead-letter sink is configured: the rejected record is reported and retried");
            }
            return Err(reason);
        };
        let dead_reason = if rejected {
            DeadLetterReason::Rejected
        } else if attempts >= self.max_attempts {
            DeadLetterReason::Exhausted
        } else {
            return Err(reason);
        };
        let letter = DeadLetter::new(record.clone(), attempts, error, dead_reason);
        match sink.send(&letter).await {
            Ok(()) => {
                tracing::warn!(
                    sequence = %record.sequence(),
                    sub_sequence = record.sub_sequence(),
                    attempts,
                    reason = dead_reason.as_str(),
                    error = letter.error,
                    "dead-lettered the record; moving past it"
                );
                failing.succeeded(record);
                Ok(Disposition::DeadLettered)
            }
            Err(sink_error) => {
                tracing::error!(
                    stream = record.stream(),
                    shard = record.shard(),
                    sequence = %record.sequence(),
                    error = %sink_error,
                    "could not dead-letter the record; it is reported and retried"
                );
                Err(StopReason::DeadLetterFailed(sink_error.to_string()))
            }
        }
    }

    /// Calls the handler, turning a panic or a run past `stop_at` (epoch milliseconds) into a
    /// stop.
    fn call(&self, record: Record, stop_at: Option<u64>) -> Guarded<'_> {
        Guarded {
            handler: self.handler.handle(record),
            stop_at,
            timer: None,
        }
    }

    /// Renews the lease every third of its TTL; marks it lost when a renew is refused, and
    /// lets it lapse (as far as dispatch is concerned) when renewals keep failing.
    async fn keep_alive(
        &self,
        key: &LeaseKey,
        owner: &str,
        invocation: &Invocation,
        lease: &LeaseWatch,
    ) {
        loop {
            tokio::time::sleep(lease.ttl / 3).await;
            let ttl = invocation.lease_ttl(lease.ttl, lease.skew());
            let sent = now_millis();
            match self.store.renew(key, owner, ttl).await {
                Ok(true) => lease.renewed(sent, ttl),
                Ok(false) => {
                    tracing::error!(
                        stream = key.stream(),
                        shard = key.shard(),
                        "the lease was taken by another owner; stopping dispatch"
                    );
                    lease.fence();
                    std::future::pending::<()>().await;
                }
                Err(error) => tracing::warn!(%error, "could not renew the lease; retrying"),
            }
        }
    }
}

impl ShardReport {
    /// A report of `key` with room for `records`, nothing done yet.
    pub(crate) fn empty(key: LeaseKey, records: usize) -> Self {
        Self {
            key,
            records: Vec::with_capacity(records),
            stopped: None,
            checkpoint: None,
            gap: None,
        }
    }

    /// Reports the first record and marks every record not attempted: the shard does nothing.
    pub(crate) fn stop_all(mut self, entries: &[Entry], reason: StopReason) -> Self {
        self.records.extend(
            entries
                .iter()
                .enumerate()
                .map(|(index, entry)| RecordReport {
                    position: entry.position(),
                    disposition: if index == 0 {
                        Disposition::Reported
                    } else {
                        Disposition::NotAttempted
                    },
                }),
        );
        self.stopped = entries
            .first()
            .map(|entry| (entry.sequence().clone(), reason));
        self
    }
}

/// The result of dispatching the pending records.
pub(crate) struct Dispatched {
    /// One per pending record.
    pub(crate) dispositions: Vec<Disposition>,
    /// The position below which (inclusive) every pending record is done.
    pub(crate) done_through: Option<Position>,
    /// The index of the record to report, and why.
    pub(crate) stopped: Option<(usize, StopReason)>,
    /// What to remember of the record that failed.
    pub(crate) failing: FailingChange,
    /// Records done above `done_through`, in order (per-key concurrency only).
    pub(crate) done_above: Vec<Position>,
}

/// The failing record as dispatch goes: the one the row remembered, and the change to write.
pub(crate) struct Failing {
    pub(crate) known: Option<FailingRecord>,
    pub(crate) change: FailingChange,
}

impl Failing {
    /// Counts a failure of the record at `position`; returns its attempts so far.
    fn failed(&mut self, position: &Position, error: &str) -> u32 {
        let now = now_millis();
        let next = match &self.known {
            Some(known) => known.again(position, error, now),
            None => FailingRecord::first(position, error, now),
        };
        let attempts = next.attempts;
        self.known = Some(next.clone());
        self.change = FailingChange::Set(next);
        attempts
    }

    /// `record` is done (processed or dead-lettered): forget it if it is the failing one.
    fn succeeded(&mut self, record: &Record) {
        // Most records were never failing: no position is built for them.
        if self
            .known
            .as_ref()
            .is_some_and(|known| known.is(&record.position()))
        {
            self.known = None;
            self.change = FailingChange::Clear;
        }
    }
}

/// 2001-09-09 in epoch milliseconds: every real deadline is later.
const PLAUSIBLE_EPOCH_MILLIS: u64 = 1_000_000_000_000;

/// This invocation's identity and deadline.
pub(crate) struct Invocation {
    owner: String,
    /// When the batch arrived, epoch milliseconds.
    started: u64,
    /// Epoch milliseconds; `None` when the context has none (a test's default context).
    deadline: Option<u64>,
}

impl Invocation {
    fn new(context: &Context) -> Self {
        // Lambda's request ids are unique; a context without one (a test's) still needs an owner
        // no other invocation shares, or two of them would both hold the lease.
        static LOCAL: AtomicU64 = AtomicU64::new(0);
        let request = if context.request_id.is_empty() {
            format!(
                "local-{}-{}",
                std::process::id(),
                LOCAL.fetch_add(1, Ordering::Relaxed)
            )
        } else {
            context.request_id.clone()
        };
        let function = &context.env_config.function_name;
        let started = now_millis();
        Self {
            started,
            owner: if function.is_empty() {
                request
            } else {
                format!("{function}:{request}")
            },
            deadline: match context.deadline {
                0 => None,
                // `cargo lambda watch` (1.9) sends its timeout, not an epoch deadline. A value
                // before 2001 cannot be a deadline: read it as the time left from now.
                relative if relative < PLAUSIBLE_EPOCH_MILLIS => {
                    Some(started.saturating_add(relative))
                }
                deadline => Some(deadline),
            },
        }
    }

    pub(crate) fn time_left(&self) -> Option<Duration> {
        self.time_left_at(now_millis())
    }

    /// The time left at `now` (epoch milliseconds), for a caller that has read the clock.
    fn time_left_at(&self, now: u64) -> Option<Duration> {
        self.deadline
            .map(|deadline| Duration::from_millis(deadline.saturating_sub(now)))
    }

    /// Whether a record started at `started` (epoch milliseconds) had at least half of the
    /// invocation's time: only then is a run into the deadline the record's own fault.
    fn had_fair_share(&self, started: u64) -> bool {
        self.deadline.is_none_or(|deadline| {
            let budget = deadline.saturating_sub(self.started);
            deadline.saturating_sub(started) >= budget / 2
        })
    }

    /// A lease outlives the invocation that holds it by the clock-skew margin at most: an
    /// invocation that dies blocks its shard that long past its deadline, and the local view of
    /// the lease (which ends a margin early) lasts to the deadline.
    fn lease_ttl(&self, wanted: Duration, skew: Duration) -> Duration {
        self.time_left().map_or(wanted, |left| {
            wanted.min(left + skew).max(Duration::from_millis(1))
        })
    }
}

/// The lease as dispatch sees it: lost when a renew was refused or when it lapsed without one.
///
/// The store's expiry is the writer's clock at the request plus the TTL, and a rival judges it
/// by its own clock: the local view counts from the moment the request was *sent* and ends a
/// skew margin early, so it never outlives the stored lease, however slow the answer or the
/// gate, and whichever sandbox's clock runs ahead.
pub(crate) struct LeaseWatch {
    ttl: Duration,
    skew: u64,
    lost: AtomicBool,
    lapses_at: AtomicU64,
}

impl LeaseWatch {
    /// A lease that never lapses (the partition-key mode holds none).
    pub(crate) fn new(ttl: Duration) -> Self {
        Self::starting_at(now_millis(), ttl, Duration::ZERO)
    }

    /// A lease for `ttl` whose claim was sent at `sent` (epoch milliseconds).
    pub(crate) fn starting_at(sent: u64, ttl: Duration, skew: Duration) -> Self {
        let skew = millis(skew);
        Self {
            ttl,
            skew,
            lost: AtomicBool::new(false),
            lapses_at: AtomicU64::new(Self::lapse(sent, ttl, skew)),
        }
    }

    fn lapse(sent: u64, ttl: Duration, skew: u64) -> u64 {
        sent.saturating_add(millis(ttl)).saturating_sub(skew)
    }

    /// The margin the local view ends early by.
    fn skew(&self) -> Duration {
        Duration::from_millis(self.skew)
    }

    /// A renew sent at `sent` (epoch milliseconds) was granted for `ttl`.
    fn renewed(&self, sent: u64, ttl: Duration) {
        self.lapses_at
            .store(Self::lapse(sent, ttl, self.skew), Ordering::Relaxed);
    }

    fn fence(&self) {
        self.lost.store(true, Ordering::Relaxed);
    }

    /// Whether the lease is lost at `now` (epoch milliseconds).
    fn lost_at(&self, now: u64) -> bool {
        self.lost.load(Ordering::Relaxed) || now >= self.lapses_at.load(Ordering::Relaxed)
    }
}

/// One item of a shard's batch: a record, or a malformed one that stops the shard where it
/// stands.
pub(crate) enum Entry {
    Record(Record),
    Malformed(MalformedRecord, SequenceNumber),
    AfterMalformed(Record),
    /// A KPL aggregate whose MD5 matches but whose contents cannot be read: a poison record,
    /// dead-lettered whole.
    Undecodable(crate::kpl::KplError),
}

impl Entry {
    /// The stream and shard, when the record could be read.
    fn key(&self) -> Option<&LeaseKey> {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => Some(record.key()),
            Self::Malformed(..) => None,
            Self::Undecodable(error) => Some(error.record().key()),
        }
    }

    /// The partition key the record runs under, or `None` for an entry that stops the shard
    /// where it stands (a malformed record, or one after it).
    pub(crate) fn partition_key(&self) -> Option<&str> {
        match self {
            Self::Record(record) => Some(record.partition_key()),
            Self::Malformed(..) | Self::AfterMalformed(_) => None,
            Self::Undecodable(error) => Some(error.record().partition_key()),
        }
    }

    /// The key Kinesis routed the record by (the aggregate's for a KPL sub-record), or `None`
    /// as for [`partition_key`](Self::partition_key): what the mapping keeps order by when
    /// `ParallelizationFactor` is above 1.
    pub(crate) fn routing_key(&self) -> Option<&str> {
        match self {
            Self::Record(record) => Some(record.routing_key()),
            Self::Malformed(..) | Self::AfterMalformed(_) => None,
            Self::Undecodable(error) => Some(error.record().routing_key()),
        }
    }

    /// The key records run in order by: the routing key in the partition-key mode, the
    /// record's own otherwise.
    pub(crate) fn ordering_key(&self, routing: bool) -> Option<&str> {
        if routing {
            self.routing_key()
        } else {
            self.partition_key()
        }
    }

    pub(crate) fn sequence(&self) -> &SequenceNumber {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => record.sequence(),
            Self::Malformed(_, sequence) => sequence,
            Self::Undecodable(error) => error.record().sequence(),
        }
    }

    /// How the entry's position compares with `other`, without building the position.
    fn cmp_position(&self, other: &Position) -> std::cmp::Ordering {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => {
                cmp_record(record.sequence(), record.sub_sequence(), other)
            }
            Self::Malformed(_, sequence) => cmp_record(sequence, None, other),
            Self::Undecodable(error) => {
                let record = error.record();
                cmp_record(record.sequence(), record.sub_sequence(), other)
            }
        }
    }

    pub(crate) fn position(&self) -> Position {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => record.position(),
            Self::Malformed(_, sequence) => Position::record(sequence.clone()),
            Self::Undecodable(error) => error.record().position(),
        }
    }
}

/// `position`, or the whole aggregate when `position` is the last of its sub-records in
/// `entries` (which hold every sub-record of an aggregate: Lambda delivers Kinesis records
/// whole, and they are unpacked here). `entries` are in the shard's order.
pub(crate) fn settled(entries: &[Entry], position: Position) -> Position {
    let Position::Record {
        sequence,
        sub_sequence: Some(_),
    } = &position
    else {
        return position;
    };
    let next = entries.partition_point(|entry| entry.cmp_position(&position).is_le());
    if entries
        .get(next)
        .is_some_and(|entry| entry.sequence() == sequence)
    {
        return position;
    }
    Position::record(sequence.clone())
}

/// The record just before the aggregate `position` lies in, when `entries` hold one: done
/// whole, since everything below `position` is done.
pub(crate) fn prior<'a>(entries: &'a [Entry], position: &Position) -> Option<&'a SequenceNumber> {
    let Position::Record {
        sequence,
        sub_sequence: Some(_),
    } = position
    else {
        return None;
    };
    let first = entries.partition_point(|entry| entry.sequence() < sequence);
    first.checked_sub(1).map(|index| entries[index].sequence())
}

/// Replaces every KPL aggregate among `entries` by its sub-records, in order; an aggregate that
/// cannot be read becomes [`Entry::Undecodable`]. Plain records pass through untouched.
pub(crate) fn deaggregate(entries: Vec<Entry>) -> Vec<Entry> {
    let aggregate = |entry: &Entry| match entry {
        Entry::Record(record) => crate::kpl::is_aggregate(record.data()),
        _ => false,
    };
    // Most batches hold no aggregate: keep their entries where they are, rather than move
    // them all into a new vector (see BENCHMARKS.md: large allocations cost most here).
    if !entries.iter().any(aggregate) {
        return entries;
    }
    let mut expanded = Vec::with_capacity(entries.len());
    for entry in entries {
        match entry {
            Entry::Record(record) if crate::kpl::is_aggregate(record.data()) => {
                match crate::kpl::deaggregate(record) {
                    Ok(records) => {
                        expanded.extend(records.into_records().into_iter().map(Entry::Record));
                    }
                    Err(error) => expanded.push(Entry::Undecodable(error)),
                }
            }
            other => expanded.push(other),
        }
    }
    expanded
}

/// One shard's records in the order of the event.
pub(crate) struct ShardBatch {
    pub(crate) key: LeaseKey,
    pub(crate) entries: Vec<Entry>,
}

/// Groups the batch by stream and shard, keeping order. The first malformed record ends the
/// batch for every shard: it joins its own shard's group (or its neighbour's, when its shard is
/// unknown) and stops it; records after it are not dispatched. Every later malformed record
/// joins a group the same way, so that its shard reports it (or an earlier record) even when
/// no other record of that shard follows the first. Returns the groups, the malformed records
/// that belong to no group, and the first malformed record without a sequence number that no
/// earlier report of its shard covers, which fails the whole batch.
fn group(
    parsed: Vec<Parsed>,
) -> (
    Vec<ShardBatch>,
    Vec<MalformedRecord>,
    Option<MalformedRecord>,
) {
    let mut groups: Vec<ShardBatch> = Vec::new();
    let mut orphans = Vec::new();
    let neighbour_key = |index: usize| -> Option<LeaseKey> {
        let before = parsed[..index].iter().rev().find_map(|p| p.as_ref().ok());
        let after = || parsed[index + 1..].iter().find_map(|p| p.as_ref().ok());
        before.or_else(after).map(|record| record.key().clone())
    };
    let cut = parsed.iter().position(Result::is_err);
    // Computed before `parsed` is consumed: the neighbours are looked up by index. Only for a
    // batch that holds a malformed record: a vector as long as the batch costs most of the
    // grouping (see BENCHMARKS.md), and a well-formed batch needs none of it.
    let malformed_keys: Vec<Option<LeaseKey>> = if cut.is_some() {
        parsed
            .iter()
            .enumerate()
            .map(|(index, item)| match item {
                Ok(_) => None,
                Err(malformed) => match (&malformed.stream, &malformed.shard) {
                    (Some(stream), Some(shard)) => {
                        Some(LeaseKey::new(stream.as_str(), shard.as_str()))
                    }
                    _ => neighbour_key(index),
                },
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut unreportable = None;
    let total = parsed.len();
    for (index, item) in parsed.into_iter().enumerate() {
        let (key, entry) = match item {
            Ok(record) => {
                let key = record.key().clone();
                if cut.is_some_and(|cut| index > cut) {
                    // Past the malformed record: not dispatched, but its shard reports from it
                    // when the malformed record is not in the same group.
                    (key, Entry::AfterMalformed(record))
                } else {
                    (key, Entry::Record(record))
                }
            }
            Err(malformed) => {
                let key = malformed_keys[index].clone();
                let Some(sequence) = malformed.reportable_sequence() else {
                    // Past the first malformed record, every entry of a group stops it: a
                    // group that already has one reports a record before this one.
                    let covered = key.as_ref().is_some_and(|key| {
                        groups
                            .iter()
                            .any(|group| group.key == *key && group.stops_after_malformed())
                    });
                    if !covered && unreportable.is_none() {
                        unreportable = Some(malformed);
                    }
                    continue;
                };
                let Some(key) = key else {
                    // No record of the batch names a shard: the first report covers the rest.
                    if orphans.is_empty() {
                        orphans.push(malformed);
                    }
                    continue;
                };
                (key, Entry::Malformed(malformed, sequence))
            }
        };
        if let Some(group) = groups.iter_mut().find(|group| group.key == key) {
            group.entries.push(entry);
        } else {
            // Lambda sends one shard per batch: the first group is sized for the rest of the
            // batch at once. Growing it record by record would reallocate it a dozen times for
            // 10,000 records, and each large allocation makes glibc's malloc consolidate every
            // small block the event's parsing just freed.
            let capacity = if groups.is_empty() { total - index } else { 1 };
            let mut entries = Vec::with_capacity(capacity);
            entries.push(entry);
            groups.push(ShardBatch { key, entries });
        }
    }
    (groups, orphans, unreportable)
}

impl ShardBatch {
    /// Whether the group holds an entry from the first malformed record on, which stops it.
    fn stops_after_malformed(&self) -> bool {
        self.entries
            .iter()
            .any(|entry| matches!(entry, Entry::Malformed(..) | Entry::AfterMalformed(_)))
    }
}

/// A handler's future, guarded: a panic becomes an error, so one bad record cannot take the
/// batch (and its checkpoint) down with it, and a run past `stop_at` is stopped.
///
/// The timer is armed only once the handler waits: one that finishes on its first poll costs
/// no timer, and `tokio::time::timeout` would not have stopped it either, since it polls the
/// future before its deadline. Armed, it fires at `stop_at` however long that first poll took.
struct Guarded<'a> {
    handler: BoxFuture<'a, Outcome>,
    /// Epoch milliseconds; `None` when the invocation has no deadline.
    stop_at: Option<u64>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Guarded<'_> {
    type Output = Result<Outcome, StopReason>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let handler = &mut this.handler;
        match std::panic::catch_unwind(AssertUnwindSafe(|| handler.as_mut().poll(cx))) {
            Ok(Poll::Ready(outcome)) => return Poll::Ready(Ok(outcome)),
            Ok(Poll::Pending) => {}
            Err(panic) => {
                return Poll::Ready(Err(StopReason::Panicked(
                    panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic without a message".to_owned()),
                )));
            }
        }
        let Some(stop_at) = this.stop_at else {
            return Poll::Pending;
        };
        let timer = this.timer.get_or_insert_with(|| {
            let left = Duration::from_millis(stop_at.saturating_sub(now_millis()));
            Box::pin(tokio::time::sleep(left))
        });
        timer
            .as_mut()
            .poll(cx)
            .map(|()| Err(StopReason::HandlerTimedOut))
    }
}
