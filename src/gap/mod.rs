//! Gap recovery, for a mapping outside the contract: records the event source mapping
//! discarded, found and run before the batch.
//!
//! Under the documented mapping (`MaximumRetryAttempts` and `MaximumRecordAgeInSeconds` at
//! `-1`) the mapping never gives up on a record, and nothing here ever acts. With a finite limit,
//! a re-created mapping, or records expired from the stream, the mapping gives up on records:
//! the next batch simply starts after them, and the on-failure destination gets their range,
//! never their data.
//!
//! So the shard's row remembers the record the toolkit last reported to Lambda and has not done
//! since ([`LeaseState::reported`]; the claim also marks the batch it attempts, so a batch an
//! invocation died on counts). A batch that starts *after* it (in the extended order, KPL
//! sub-records included) proves that the mapping skipped records. The processor then logs one
//! error naming the stream, the shard and the range, counts it (the `Gap` metric), and, when its
//! gate's topology reads records ([`Topology::read_range`](crate::gate::Topology::read_range)),
//! reads them (`GetShardIterator` after the checkpoint, then `GetRecords` up to the batch's first
//! record) and runs them first, through the same intake, dedupe, dispatch, dead letters and
//! checkpoint as the batch's own. A normal batch makes no Kinesis call.
//!
//! | the shard stopped at a record because | `reported` |
//! |---|---|
//! | the handler failed on it, a dead letter failed, it is malformed, the deadline came | that record, in the final write |
//! | the gate held the batch | the batch's first record, in the release; an older one is kept |
//! | the skipped records could not be read, or not all in time | the first record not run |
//! | the whole batch was done | removed (unless it names a record above the new checkpoint) |
//! | another owner holds the lease, or the store failed | not written |
//!
//! The partition-key mode keeps no such mark: it requires the documented mapping.

use std::time::SystemTime;

use crate::clock::{Clock, SystemClock};
use crate::record::Record;
pub use crate::report::{GapOutcome, GapReport};
use crate::sequence::Position;
pub use crate::sequence::{ReadFrom, SkippedRange};
use crate::store::{LeaseState, ReportedChange};

/// The most skipped records one invocation reads: Lambda's largest batch. A larger gap is read
/// and run in parts, one per invocation, each continuing after the checkpoint the last one left.
pub const MAX_RECOVERED_RECORDS: usize = 10_000;

/// How much one reading of a skipped range may take.
///
/// ```
/// use kinesis_checkpoint::gap::ReadBudget;
///
/// let budget = ReadBudget::new(100, None);
/// assert_eq!(budget.max_records, 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadBudget {
    /// At most this many stream records (a KPL aggregate counts once).
    pub max_records: usize,
    /// Stop reading at this time, with what was read (`None`: no deadline).
    pub deadline: Option<SystemTime>,
}

impl ReadBudget {
    /// At most `max_records` records, read before `deadline`.
    ///
    /// ```
    /// # use std::time::{Duration, SystemTime};
    /// # use kinesis_checkpoint::gap::ReadBudget;
    /// let budget = ReadBudget::new(10, Some(SystemTime::now() + Duration::from_secs(2)));
    /// assert!(!budget.expired());
    /// ```
    #[must_use]
    pub const fn new(max_records: usize, deadline: Option<SystemTime>) -> Self {
        Self {
            max_records,
            deadline,
        }
    }

    /// Whether the deadline has passed on the system's clock.
    ///
    /// ```
    /// # use kinesis_checkpoint::gap::ReadBudget;
    /// assert!(ReadBudget::new(10, Some(std::time::UNIX_EPOCH)).expired());
    /// ```
    #[must_use]
    pub fn expired(&self) -> bool {
        self.expired_by(&SystemClock)
    }

    /// Whether the deadline has passed on `clock`: a topology that keeps a clock (a simulated
    /// stream on virtual time) reads its own.
    ///
    /// ```
    /// # use kinesis_checkpoint::gap::ReadBudget;
    /// use kinesis_checkpoint::clock::SystemClock;
    ///
    /// assert!(!ReadBudget::new(10, None).expired_by(&SystemClock));
    /// ```
    #[must_use]
    pub fn expired_by(&self, clock: &dyn Clock) -> bool {
        self.deadline
            .is_some_and(|deadline| clock.now() >= deadline)
    }
}

/// What one reading of a skipped range found.
///
/// ```
/// use kinesis_checkpoint::gap::RangeRead;
///
/// let read = RangeRead { records: Vec::new(), complete: true };
/// assert!(read.records.is_empty());
/// ```
#[derive(Debug, Clone)]
pub struct RangeRead {
    /// The range's records, oldest first (aggregates still packed).
    pub records: Vec<Record>,
    /// Whether `records` is the whole range; `false` when the budget ran out first.
    pub complete: bool,
}

/// The error of a topology that cannot read records (the default of
/// [`Topology::read_range`](crate::gate::Topology::read_range)): the processor logs the gap and
/// goes on.
///
/// ```
/// use kinesis_checkpoint::gap::CannotRead;
///
/// let error = CannotRead::new("orders", "shardId-000000000000");
/// assert!(error.to_string().contains("shardId-000000000000"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "this topology cannot read the records of shard {shard} of stream {stream}: give the processor \
     a gate over a topology that reads records (KinesisTopology) to recover what the mapping skips"
)]
pub struct CannotRead {
    stream: String,
    shard: String,
}

impl CannotRead {
    /// The error for `shard` of `stream`.
    ///
    /// ```
    /// # use kinesis_checkpoint::gap::CannotRead;
    /// let _ = CannotRead::new("orders", "shardId-000000000000");
    /// ```
    #[must_use]
    pub fn new(stream: impl Into<String>, shard: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            shard: shard.into(),
        }
    }
}

/// The range the mapping skipped before a batch starting at `first`, if it did: the row
/// remembers a reported record above its checkpoint, and the batch starts after it.
pub(crate) fn detect(
    state: &LeaseState,
    checkpoint: Option<&Position>,
    first: &Position,
) -> Option<SkippedRange> {
    let reported = outstanding(state, checkpoint)?;
    if first <= reported {
        return None;
    }
    let Position::Record {
        sequence: before, ..
    } = first
    else {
        return None;
    };
    let from = match checkpoint {
        Some(checkpoint) => ReadFrom::resuming(checkpoint)?,
        // Never checkpointed: the mapping started at the reported record (its first delivery),
        // so nothing before it was skipped; reading from the horizon would run records that a
        // mapping starting at `LATEST` never meant to deliver.
        None => match reported {
            Position::Record { sequence, .. } => ReadFrom::At(sequence.clone()),
            Position::ShardEnd => return None,
        },
    };
    Some(SkippedRange {
        from,
        before: before.clone(),
    })
}

/// The row's reported record, while it is above the checkpoint: a checkpoint at or past it
/// (written by this toolkit or by another consumer of the table) means it was done since.
fn outstanding<'a>(state: &'a LeaseState, checkpoint: Option<&Position>) -> Option<&'a Position> {
    state
        .reported
        .as_ref()
        .filter(|reported| checkpoint.is_none_or(|checkpoint| *reported > checkpoint))
}

/// What to remember of a batch starting at `first` that runs nothing (held, unreadable gap):
/// the lowest record not known done, so that a later batch starting after it is caught.
pub(crate) fn nothing_ran(
    state: &LeaseState,
    checkpoint: Option<&Position>,
    first: Option<&Position>,
) -> ReportedChange {
    let first = first.filter(|first| checkpoint.is_none_or(|checkpoint| *first > checkpoint));
    match (outstanding(state, checkpoint), first) {
        (Some(reported), Some(first)) if reported <= first => ReportedChange::Keep,
        (_, Some(first)) => ReportedChange::Set(first.clone()),
        (_, None) => ReportedChange::Keep,
    }
}

/// What to remember once a batch ran: the record the shard stopped at; or, when it ran to its
/// end, nothing (unless the row names a record above the new checkpoint).
pub(crate) fn after_run(
    state: &LeaseState,
    checkpoint: Option<&Position>,
    stopped_at: Option<Position>,
) -> ReportedChange {
    match stopped_at {
        Some(position) => ReportedChange::Set(position),
        None if outstanding(state, checkpoint).is_some() => ReportedChange::Keep,
        None if state.reported.is_some() => ReportedChange::Clear,
        None => ReportedChange::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(n: u64) -> Position {
        Position::record(n.to_string().parse().unwrap())
    }

    fn row(reported: Option<Position>) -> LeaseState {
        LeaseState {
            reported,
            ..LeaseState::default()
        }
    }

    #[test]
    fn a_batch_after_the_reported_record_proves_a_gap_from_the_checkpoint() {
        let state = row(Some(at(20)));
        let range = detect(&state, Some(&at(10)), &at(30)).expect("a gap");
        assert_eq!(range.from, ReadFrom::After("10".parse().unwrap()));
        assert_eq!(range.before, "30".parse().unwrap());
        assert_eq!(detect(&state, Some(&at(10)), &at(20)), None, "redelivery");
        assert_eq!(detect(&state, Some(&at(25)), &at(25)), None, "done since");
        assert_eq!(detect(&row(None), Some(&at(10)), &at(30)), None);
    }

    #[test]
    fn a_shard_never_checkpointed_reads_from_its_reported_record() {
        let range = detect(&row(Some(at(20))), None, &at(30)).expect("a gap");
        assert_eq!(range.from, ReadFrom::At("20".parse().unwrap()));
    }

    #[test]
    fn a_checkpoint_inside_an_aggregate_reads_the_aggregate_again() {
        let state = row(Some(Position::sub_record("10".parse().unwrap(), 4)));
        let checkpoint = Position::sub_record("10".parse().unwrap(), 3);
        let range = detect(&state, Some(&checkpoint), &at(30)).expect("a gap");
        assert_eq!(range.from, ReadFrom::At("10".parse().unwrap()));
        let first = Position::sub_record("10".parse().unwrap(), 0);
        assert_eq!(detect(&state, Some(&checkpoint), &first), None);
    }

    #[test]
    fn a_held_batch_keeps_an_older_report_still_to_recover() {
        let state = row(Some(at(20)));
        assert_eq!(
            nothing_ran(&state, Some(&at(10)), Some(&at(30))),
            ReportedChange::Keep
        );
        assert_eq!(
            nothing_ran(&state, Some(&at(10)), Some(&at(15))),
            ReportedChange::Set(at(15))
        );
        assert_eq!(
            nothing_ran(&row(None), Some(&at(10)), Some(&at(5))),
            ReportedChange::Keep,
            "a duplicate says nothing"
        );
        assert_eq!(
            after_run(&state, Some(&at(30)), None),
            ReportedChange::Clear
        );
        assert_eq!(after_run(&state, Some(&at(12)), None), ReportedChange::Keep);
    }
}
