//! Gap recovery: records the event source mapping discarded, found and run before the batch.
//!
//! Lambda's mapping gives up on records: after `MaximumRetryAttempts`, past
//! `MaximumRecordAgeInSeconds`, when a mapping is deleted and created again, when records
//! expire. Its on-failure destination then gets the batch's range, never the data, and the next
//! batch simply starts after the records it gave up on. Unchecked, the toolkit would process
//! that batch, move the checkpoint past the skipped records, and nobody would know they were
//! never processed nor dead-lettered.
//!
//! So the shard's row remembers the record the toolkit last reported to Lambda and has not done
//! since ([`LeaseState::reported`], the `reported` attribute). Lambda delivers from the reported
//! record again; a batch that starts *after* it (in the extended order, KPL sub-records
//! included) proves that the mapping skipped records. The processor then reads them from the
//! stream through its gate's [`Topology::read_range`](crate::gate::Topology::read_range)
//! (`GetShardIterator` after the checkpoint, or at the reported record when there is no
//! checkpoint, then `GetRecords` up to the batch's first record) and runs them first, in order,
//! through the same dedupe, dispatch, dead-letter and checkpoint path as the batch. The reading
//! costs requests only once a gap is proven: a normal batch makes no Kinesis call.
//!
//! What the row remembers, by how a shard stops:
//!
//! | the shard stopped at a record because | `reported` |
//! |---|---|
//! | the handler failed on it, a dead letter failed, it is malformed, the deadline came, the lease lapsed without being taken | that record, in the final write |
//! | the gate held the batch | the batch's first record, in the release; an older one still to recover is kept |
//! | the skipped records could not be read, or not all in time | the first record not run, so the next batch reads on from there |
//! | the whole batch was done | removed (unless it names a record above the new checkpoint) |
//! | (another writer, a seed-crate consumer, checkpointed at or past it) | left behind, at or below the checkpoint: a batch that starts after the checkpoint is read from it, since that writer knew nothing of what the mapping skipped |
//! | another owner holds or took the lease, or the store failed | not written: the row belongs to the other owner, or cannot be written |
//!
//! A batch turned away (another owner's live lease, a claim the store refused) is remembered
//! beside it, in `contended`, written without the lease and never removed. A write of the
//! toolkit whose checkpoint reaches the mark it read records that mark in `contended_done`;
//! so a `contended` mark at or below the checkpoint that is not `contended_done` was passed by
//! another writer (a seed consumer that checkpointed inside the batch turned away), and a batch
//! that starts after the checkpoint is read from it, as for `reported`. A mark written between
//! the toolkit's read and its write is not recorded (it was never read): it costs one reading
//! (an empty one: two Kinesis requests), and that batch's write records it.
//!
//! When the records cannot be read (the processor has no gate, or its topology cannot read
//! records), the gap is logged as an error naming stream, shard and range, counted in the `Gap`
//! metric, and the batch goes on: the mapping has already moved past the skipped records and
//! will never deliver them again, so holding the batch would not bring them back; it would only
//! make the mapping give up on this batch as well.
//!
//! The partition-key mode has no shard row to remember a report in: each key's row remembers
//! where the key's lane was reported instead (see `keys`, and the mode's documentation).

use std::time::SystemTime;

use crate::clock::{Clock, SystemClock};
use crate::record::Record;
pub use crate::report::{GapOutcome, GapReport};
use crate::sequence::Position;
pub use crate::sequence::{ReadFrom, SkippedRange};
use crate::store::{LeaseState, ReportedChange};

pub(crate) mod keys;
pub(crate) mod open;

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
    // An overtaken checkpoint lies below any mark still outstanding: it comes first.
    let overtaken = overtaken(state, checkpoint);
    let reported = overtaken.or_else(|| outstanding(state, checkpoint))?;
    if first <= reported {
        return None;
    }
    let Position::Record {
        sequence: before, ..
    } = first
    else {
        return None;
    };
    if let (Some(_), Some(Position::Record { sequence, .. })) = (overtaken, checkpoint)
        && before <= sequence
    {
        // The batch starts at or inside the overtaken checkpoint's record: nothing between.
        return None;
    }
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

/// The range a batch starting at `first` may follow when the mapping dropped records for their
/// age, which leaves no mark in the row: from the checkpoint (from the shard's start, for a
/// shard never checkpointed, when `from_start`) up to `first`. Only when `first`, `age_millis`
/// old, is at least [`SUSPECT_AGE`] of the mapping's `limit_millis` old: the records a mapping
/// drops for age are the oldest, and the first it then delivers is nearly as old in a stream
/// written on. `None` when the row proves nothing can be missing (a batch at or below the
/// checkpoint, a finished shard).
pub(crate) fn suspected(
    checkpoint: Option<&Position>,
    first: &Position,
    (age_millis, limit_millis): (u64, u64),
    from_start: bool,
) -> Option<SkippedRange> {
    let (numerator, denominator) = SUSPECT_AGE;
    if u128::from(age_millis) * denominator < u128::from(limit_millis) * numerator {
        return None;
    }
    if checkpoint.is_some_and(|checkpoint| first <= checkpoint) {
        return None;
    }
    let Position::Record {
        sequence: before, ..
    } = first
    else {
        return None;
    };
    let from = match checkpoint {
        // A finished shard has nothing after it.
        Some(checkpoint) => ReadFrom::resuming(checkpoint)?,
        None if from_start => ReadFrom::TrimHorizon,
        // A `LATEST` mapping never checkpointed: nothing says where it started.
        None => return None,
    };
    Some(SkippedRange {
        from,
        before: before.clone(),
    })
}

/// How old (of the mapping's `MaximumRecordAgeInSeconds`) a batch's first record must be for
/// [`suspected`] to read before it: three quarters. The quarter left covers the time between
/// the mapping's age check and the invocation, and records written in between those the
/// mapping dropped and the first it kept.
const SUSPECT_AGE: (u128, u128) = (3, 4);

/// The row's reported record, while it is above the checkpoint: a checkpoint at or past it
/// (written by this toolkit or by another consumer of the table) means it was done since.
fn outstanding<'a>(state: &'a LeaseState, checkpoint: Option<&Position>) -> Option<&'a Position> {
    // A batch turned away by a lingering lease counts as reported too: the lowest of the two.
    [state.reported.as_ref(), state.contended.as_ref()]
        .into_iter()
        .flatten()
        .filter(|reported| checkpoint.is_none_or(|checkpoint| *reported > checkpoint))
        .min()
}

/// The checkpoint, when it was moved to or past the reported record or the `contended` mark
/// by another writer: the toolkit's own writes never leave `reported` at or below the
/// checkpoint (a batch done whole removes it), and a write of its own that moves the
/// checkpoint to or past the mark it read records that mark as
/// [`contended_done`](LeaseState::contended_done); but a seed-crate consumer sharing the table
/// checkpoints without knowing of either. Its checkpoint says nothing of the records after it
/// that the mapping may have given up on meanwhile, so a batch that starts after the
/// checkpoint is read from it. (A mark written by a batch turned away between the toolkit's
/// read and its write is taken for one: it costs that one reading, and the write after it
/// records it done.)
fn overtaken<'a>(state: &LeaseState, checkpoint: Option<&'a Position>) -> Option<&'a Position> {
    let checkpoint = checkpoint.filter(|checkpoint| **checkpoint != Position::ShardEnd)?;
    let reported = state
        .reported
        .as_ref()
        .is_some_and(|reported| reported <= checkpoint);
    let contended = state.contended.as_ref().is_some_and(|contended| {
        contended <= checkpoint && state.contended_done.as_ref() != Some(contended)
    });
    (reported || contended).then_some(checkpoint)
}

/// Whether the row's checkpoint was moved past its marks by another writer ([`overtaken`]): no
/// record after it is known done, and the next batch after it is read from it. A batch that
/// runs nothing must then leave the marks as they are: a mark of its own first record would
/// put the lowest record not known done after the records between the checkpoint and the
/// batch, and its redelivery would find no gap before it.
pub(crate) fn proven_after_checkpoint(state: &LeaseState, checkpoint: Option<&Position>) -> bool {
    overtaken(state, checkpoint).is_some()
}

/// Whether the row's `contended` mark is not known done: above the checkpoint, or at or below
/// it but passed by another writer (not [`contended_done`](LeaseState::contended_done)). A
/// closed parent's row showing one proves trouble to the gate.
pub(crate) fn contended_open(state: &LeaseState, checkpoint: Option<&Position>) -> bool {
    state.contended.as_ref().is_some_and(|mark| {
        checkpoint.is_none_or(|done| mark > done) || state.contended_done.as_ref() != Some(mark)
    })
}

/// The `contended` mark of the row as read, when a write of this toolkit whose checkpoint is
/// `after` lands: the toolkit did the batch it marks (or read what another writer passed), so
/// the write records it done, unless it already is. Never a mark the toolkit did not read.
pub(crate) fn contended_done(state: &LeaseState, after: Option<&Position>) -> Option<Position> {
    let contended = state.contended.as_ref()?;
    let reached = after.is_some_and(|after| contended <= after);
    (reached && state.contended_done.as_ref() != Some(contended)).then(|| contended.clone())
}

/// What to remember of a batch starting at `first` that runs nothing (held, unreadable gap):
/// the lowest record not known done, so that a later batch starting after it is caught. A
/// checkpoint another writer moved past the row's marks ([`overtaken`]) already says that: no
/// record after it is known done, and it is read from whatever batch comes next. So the marks
/// stay as they are then; marking this batch's first record instead would put the lowest record
/// not known done after the records between the checkpoint and the batch, and a redelivery of
/// the batch would find no gap before it.
pub(crate) fn nothing_ran(
    state: &LeaseState,
    checkpoint: Option<&Position>,
    first: Option<&Position>,
) -> ReportedChange {
    let first = first.filter(|first| checkpoint.is_none_or(|checkpoint| *first > checkpoint));
    if first.is_some() && proven_after_checkpoint(state, checkpoint) {
        return ReportedChange::Keep;
    }
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
    fn a_checkpoint_another_writer_moved_past_the_reported_record_is_read_after() {
        // A seed consumer checkpointed 25 without knowing of `reported` 20; the mapping may
        // have given up on records after 25 meanwhile.
        let state = row(Some(at(20)));
        let range = detect(&state, Some(&at(25)), &at(30)).expect("read after it");
        assert_eq!(range.from, ReadFrom::After("25".parse().unwrap()));
        assert_eq!(range.before, "30".parse().unwrap());
        assert_eq!(detect(&state, Some(&at(25)), &at(25)), None, "a redelivery");
        assert_eq!(detect(&state, Some(&at(25)), &at(20)), None, "done already");
        assert_eq!(
            detect(&state, Some(&Position::ShardEnd), &at(30)),
            None,
            "finished"
        );
        // A batch turned away since (contended 30) proves nothing about what lies between the
        // overtaken checkpoint and it.
        let contended = LeaseState {
            contended: Some(at(30)),
            ..row(Some(at(20)))
        };
        let range = detect(&contended, Some(&at(25)), &at(30)).expect("read after it");
        assert_eq!(range.from, ReadFrom::After("25".parse().unwrap()));
    }

    #[test]
    fn a_contended_mark_another_writer_checkpointed_past_is_read_after_its_checkpoint() {
        // A batch from 20 was turned away (contended 20); a seed consumer checkpointed 25
        // inside it, knowing nothing of the mark; the mapping may have given up on the rest.
        let passed = LeaseState {
            contended: Some(at(20)),
            ..LeaseState::default()
        };
        let range = detect(&passed, Some(&at(25)), &at(30)).expect("read after it");
        assert_eq!(range.from, ReadFrom::After("25".parse().unwrap()));
        assert_eq!(
            detect(&passed, Some(&at(25)), &at(25)),
            None,
            "a redelivery"
        );
        // The toolkit's own write past the mark recorded it done: a normal batch.
        let done = LeaseState {
            contended_done: Some(at(20)),
            ..passed.clone()
        };
        assert_eq!(detect(&done, Some(&at(25)), &at(30)), None);
        // A newer mark than the one recorded done is another batch turned away.
        let newer = LeaseState {
            contended: Some(at(22)),
            ..done.clone()
        };
        assert!(detect(&newer, Some(&at(25)), &at(30)).is_some());
    }

    #[test]
    fn a_write_records_done_only_the_mark_it_read_and_reached() {
        let state = LeaseState {
            contended: Some(at(20)),
            ..LeaseState::default()
        };
        assert_eq!(contended_done(&state, Some(&at(20))), Some(at(20)));
        assert_eq!(contended_done(&state, Some(&at(30))), Some(at(20)));
        assert_eq!(contended_done(&state, Some(&at(19))), None, "not reached");
        assert_eq!(contended_done(&state, None), None, "never checkpointed");
        let recorded = LeaseState {
            contended_done: Some(at(20)),
            ..state
        };
        assert_eq!(contended_done(&recorded, Some(&at(30))), None, "already");
        assert_eq!(contended_done(&row(None), Some(&at(30))), None, "no mark");
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
    fn a_batch_nearly_as_old_as_the_record_age_limit_is_suspected_to_follow_dropped_records() {
        let limit = 60_000;
        let range = suspected(Some(&at(10)), &at(30), (45_000, limit), false).expect("suspected");
        assert_eq!(range.from, ReadFrom::After("10".parse().unwrap()));
        assert_eq!(
            suspected(Some(&at(10)), &at(30), (44_999, limit), false),
            None,
            "young"
        );
        assert_eq!(
            suspected(Some(&at(30)), &at(30), (59_000, limit), false),
            None,
            "redelivery"
        );
        assert_eq!(
            suspected(None, &at(30), (59_000, limit), true).map(|range| range.from),
            Some(ReadFrom::TrimHorizon)
        );
        assert_eq!(
            suspected(None, &at(30), (59_000, limit), false),
            None,
            "LATEST"
        );
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

    #[test]
    fn a_held_batch_after_a_checkpoint_another_writer_moved_past_the_report_keeps_the_proof() {
        // A seed consumer checkpointed 25, past the reported 20: everything after 25 is
        // unknown, and a batch at 30 proves it. Held, the batch must not mark 30 instead.
        let state = row(Some(at(20)));
        assert_eq!(
            nothing_ran(&state, Some(&at(25)), Some(&at(30))),
            ReportedChange::Keep
        );
        assert!(
            detect(&state, Some(&at(25)), &at(30)).is_some(),
            "still proven"
        );
        assert_eq!(
            nothing_ran(&state, Some(&at(25)), Some(&at(22))),
            ReportedChange::Keep,
            "a duplicate says nothing"
        );
    }
}
