//! What an invocation did, record by record: the reports [`Processor::process_batch`] returns
//! and the metrics read.
//!
//! A shard's records are kept by ranges ([`RecordReports`]): runs of records that met one
//! disposition, over the batch's own records, whose positions are read only when asked for. A
//! batch of 10,000 records that all went one way is one run, not 10,000 reports built, each
//! holding a clone of its sequence number, at the end of every invocation.
//!
//! A leaf: these types name positions, keys and reasons, and import nothing that runs an
//! invocation, so the engine that fills them in, the metrics that count them and the gap
//! recovery that adds to them all depend on this module and never on each other.
//!
//! [`Processor::process_batch`]: crate::Processor::process_batch

mod records;

use std::fmt;

use aws_lambda_events::event::streams::KinesisEventResponse;

use crate::key::LeaseKey;
use crate::sequence::{Position, SequenceNumber, SkippedRange};

pub(crate) use self::records::PositionSource;
pub use self::records::{Iter, RecordReports};

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
    /// # use kinesis_checkpoint::report::StopReason;
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
    /// Every record of the shard in the batch, in order, kept by ranges.
    pub records: RecordReports,
    /// The record reported to Lambda, and why, when the shard stopped early.
    pub stopped: Option<(SequenceNumber, StopReason)>,
    /// The checkpoint this invocation wrote, if it moved.
    pub checkpoint: Option<Position>,
    /// Records the event source mapping skipped before this batch, found and run first (see
    /// [`gap`](crate::gap)).
    pub gap: Option<GapReport>,
    /// The batch or record an earlier invocation was running when it died (its lease lapsed
    /// without a checkpoint): this invocation ran the batch one record at a time.
    pub died_at: Option<Position>,
}

impl ShardReport {
    /// How many records met `disposition`.
    ///
    /// ```
    /// # use kinesis_checkpoint::report::{Disposition, ShardReport};
    /// fn print(report: &ShardReport) {
    ///     println!("{} processed", report.count(Disposition::Processed));
    /// }
    /// ```
    #[must_use]
    pub fn count(&self, disposition: Disposition) -> usize {
        self.records.count(disposition)
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

impl ShardReport {
    /// A report of `key`, nothing done yet.
    pub(crate) fn empty(key: LeaseKey) -> Self {
        Self {
            key,
            records: RecordReports::default(),
            stopped: None,
            checkpoint: None,
            gap: None,
            died_at: None,
        }
    }
}

/// Why a child shard waits.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Held {
    /// The parent still has records after its checkpoint.
    Unfinished {
        /// The parent shard.
        parent: String,
        /// Its checkpoint, if it has one.
        checkpoint: Option<String>,
    },
    /// The parent is still open.
    ParentOpen {
        /// The parent shard.
        parent: String,
    },
    /// The parent was never read here and has records, and the mapping starts at
    /// `TRIM_HORIZON`: they will be delivered.
    NeverRead {
        /// The parent shard.
        parent: String,
    },
    /// Kinesis or the lease store could not answer; the batch waits rather than guess.
    Unknown {
        /// What failed.
        error: String,
    },
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unfinished { parent, checkpoint } => write!(
                f,
                "parent {parent} has records after its checkpoint ({})",
                checkpoint.as_deref().unwrap_or("none")
            ),
            Self::ParentOpen { parent } => write!(f, "parent {parent} is still open"),
            Self::NeverRead { parent } => write!(
                f,
                "parent {parent} has records not yet delivered and the mapping starts at TRIM_HORIZON"
            ),
            Self::Unknown { error } => write!(f, "the parents could not be checked: {error}"),
        }
    }
}

/// What became of a range the mapping skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GapOutcome {
    /// Every record of the range was read and ran (or the shard stopped in it as usual).
    Recovered,
    /// Only part of the range could be read in time: the rest is read by the next invocation.
    Partial,
    /// The range could not be read: the batch was reported, nothing ran.
    Unread(String),
    /// Nothing can read the range: it was logged as lost and the batch went on.
    NoReader,
}

/// A range the mapping skipped, found by one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GapReport {
    /// The range.
    pub range: SkippedRange,
    /// Its records that were read, in order, and what became of each.
    pub recovered: Vec<RecordReport>,
    /// What became of the range.
    pub outcome: GapOutcome,
}

impl GapReport {
    pub(crate) const fn new(range: SkippedRange, outcome: GapOutcome) -> Self {
        Self {
            range,
            recovered: Vec::new(),
            outcome,
        }
    }
}
