//! The partition-key mode's gap rules, over the keys' rows.
//!
//! With `ParallelizationFactor` above 1 the mapping splits a shard into lanes by a hash of the
//! partition key that AWS does not document: each lane is delivered in order, one batch at a
//! time, and retried, bisected and given up on by itself. A batch is one lane's; so every key
//! in one batch shares a lane, and a lane is redelivered from the record it was reported at.
//! No shard row can say where a lane stands, and no key's checkpoint can either (a key with
//! nothing left to do says nothing of its lane). So each key's row remembers, in `reported`,
//! the record its lane was last reported from (its **mark**): written on every key of the
//! batch that has records at or after the reported one (they come again from there), and
//! removed once a batch of the key reports nothing at or before them. An invocation that dies
//! makes no write, so when the mapping may give up on a batch (finite `MaximumRetryAttempts`
//! or a record age, told to the gate) the keys are marked ([`held_mark`]) at the first record
//! not done before the batch runs, as a held batch's are.
//!
//! - **Proven**: a batch holding a key whose mark lies before the batch's first record
//!   ([`lane_mark`]) shows that the lane went on without delivering the marked record again:
//!   the mapping gave up on records from the mark on (`MaximumRetryAttempts`,
//!   `MaximumRecordAgeInSeconds`, a bisected half discarded).
//! - **Who lost them**: the keys of this batch (same lane) and the keys whose row carries the
//!   same mark (they were in the batch that set it: same lane). Records of the range of any
//!   other key may belong to another lane, which may still be delivering them: never run here.
//!   Such a key not done at a record of the range is marked there instead ([`held_mark`]): if
//!   its lane is this one, which passed the record, the key's next batch starts after the mark
//!   and proves the range; if it is another, that lane delivers the record at or after the
//!   mark, which proves nothing, and its write removes the mark.
//! - **Read in parts** (a range longer than one reading, 10,000 records in half the time
//!   left): a key of the lane may have no record in the parts read so far, so its row is only
//!   found in a later part, by its mark. So while the range is read in parts the lane's keys
//!   keep their marks ([`kept_mark`]; a key read without one is given the lowest), and where
//!   the reading goes on is written in the lane's own row ([`lane_row`], one per mark, its
//!   `reported` the first record not done): the next batch reads on from there
//!   ([`lane_start`]) and still knows the lane's keys by their marks.
//! - **Suspected** ([`aged_range`]): a mapping with a record age limit drops a lagging lane's
//!   oldest records without any report; a batch whose first record is nearly as old as the
//!   limit is read before, from the lowest checkpoint of its keys (as in the shard mode).

use super::suspected;
use crate::key::LeaseKey;
use crate::sequence::{Position, ReadFrom, SequenceNumber, SkippedRange};
use crate::store::{LeaseState, ReportedChange};

/// The mark of a key's row that a batch starting at `first` proves skipped: the row marks a
/// record of an earlier sequence number than `first` (the lane was reported from it and went
/// on without delivering it again), and the batch starts after the checkpoint of any consumer
/// of the whole shard. A mark at or below that checkpoint still proves it: the consumer did
/// the records up to its checkpoint, but the lane's batch reported at the mark may hold records
/// after it, which the mapping gave up on as well (as the shard mode reads from a checkpoint
/// another writer moved past its reported record); the range is then read from the checkpoint
/// ([`after_shard_checkpoint`]).
pub(crate) fn lane_mark<'a>(
    state: &'a LeaseState,
    shard_checkpoint: Option<&Position>,
    first: &Position,
) -> Option<&'a Position> {
    let mark = state.reported.as_ref()?;
    if shard_checkpoint.is_some_and(|done| first <= done) {
        return None;
    }
    match (mark, first) {
        // The same aggregate delivered again is not past it: Lambda delivers records whole.
        (
            Position::Record { sequence, .. },
            Position::Record {
                sequence: before, ..
            },
        ) if sequence < before => Some(mark),
        _ => None,
    }
}

/// The range to read for the proven `marks` (not empty) before a batch starting at `first`:
/// at the lowest mark (the marked record is not done) up to `first`.
pub(crate) fn lane_range(marks: &[Position], first: &SequenceNumber) -> Option<SkippedRange> {
    let Some(Position::Record { sequence, .. }) = marks.iter().min() else {
        return None;
    };
    Some(SkippedRange {
        from: ReadFrom::At(sequence.clone()),
        before: first.clone(),
    })
}

/// `range`, started after the checkpoint of a consumer of the whole shard when that lies
/// within it: the records up to there are done, whatever their key.
pub(crate) fn after_shard_checkpoint(
    range: SkippedRange,
    shard_checkpoint: Option<&Position>,
) -> SkippedRange {
    let Some(from) = shard_checkpoint.and_then(ReadFrom::resuming) else {
        return range;
    };
    if earlier(&range.from, &from).is_lt() {
        SkippedRange { from, ..range }
    } else {
        range
    }
}

/// The row of the lane whose keys carry `mark`, on the shard of `shard`: its `reported` is the
/// first record of the lane's skipped range not done yet, while the range is read in parts.
/// `stream:shard#lane:mark`: no shard id holds a `#`, so it is neither a shard's row nor a
/// key's (`stream:shard:partition-key`), and nothing that reads those ever reads it.
pub(crate) fn lane_row(shard: &LeaseKey, mark: &Position) -> LeaseKey {
    LeaseKey::new(shard.stream(), format!("{}#lane:{mark}", shard.shard()))
}

/// Where the lane of `mark` reads on from before a batch starting at `first`: the lane row's
/// `progress` (every record of the lane's keys before it is done), when it lies before the
/// batch; the mark itself otherwise. The progress may lie below the mark: a range widened for
/// the batch's age to where its keys may have lost records before the mark is read from there.
pub(crate) fn lane_start<'a>(
    mark: &'a Position,
    progress: Option<&'a Position>,
    first: &Position,
) -> &'a Position {
    progress
        .filter(|progress| *progress < first)
        .unwrap_or(mark)
}

/// The mark a key keeps while the lane's range (found by `marks`, not empty) is read in parts:
/// its own when it is one of them, so that whichever of the lane's keys comes next still
/// proves the range and still knows the keys not read yet; the lowest otherwise (a key of the
/// batch with no mark, or another).
pub(crate) fn kept_mark<'a>(
    old: Option<&'a Position>,
    marks: &'a [Position],
) -> Option<&'a Position> {
    old.filter(|old| marks.contains(old))
        .or_else(|| marks.iter().min())
}

/// The range a batch starting at `first`, `age` old of the mapping's `limit` (milliseconds),
/// may follow when the lane dropped records for their age: from the lowest of the batch's
/// keys' `checkpoints` (a key never checkpointed: from the shard's start when `from_start`,
/// otherwise it bounds nothing) up to `first`. `None` when `first` is young, or no key's
/// checkpoint lies below it.
pub(crate) fn aged_range<'a>(
    checkpoints: impl IntoIterator<Item = Option<&'a Position>>,
    first: &Position,
    age: (u64, u64),
    from_start: bool,
) -> Option<SkippedRange> {
    checkpoints
        .into_iter()
        .filter_map(|checkpoint| suspected(checkpoint, first, age, from_start))
        .min_by(|a, b| earlier(&a.from, &b.from))
}

/// `range`, started earlier when `other` (before the same record) starts earlier: a lane's
/// proven range and what a key of the batch whose row proves nothing may have lost for its age.
pub(crate) fn wider(range: SkippedRange, other: Option<SkippedRange>) -> SkippedRange {
    match other {
        Some(other) if earlier(&other.from, &range.from).is_lt() => SkippedRange {
            from: other.from,
            before: range.before,
        },
        _ => range,
    }
}

/// Whichever of two starts reads more of the shard first.
fn earlier(a: &ReadFrom, b: &ReadFrom) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let rank = |from: &ReadFrom| match from {
        ReadFrom::TrimHorizon => (None, 0),
        ReadFrom::At(sequence) => (Some(sequence.clone()), 0),
        ReadFrom::After(sequence) => (Some(sequence.clone()), 1),
    };
    let ((a, a_after), (b, b_after)) = (rank(a), rank(b));
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => a.cmp(&b).then(a_after.cmp(&b_after)),
    }
}

/// A key's new mark, from its row's `old` one: `keep` when the batch could not settle what the
/// lane skipped (it stays marked, or marked where the next reading goes on); otherwise the
/// record the batch was `reported` at when the key has records at or after it (`comes_again`),
/// and none when the lane is past the key's records.
pub(crate) fn next_mark(
    old: Option<&Position>,
    keep: Option<&Position>,
    reported: Option<&Position>,
    comes_again: bool,
) -> ReportedChange {
    let target = keep.or(reported.filter(|_| comes_again));
    match (old, target) {
        (old, Some(target)) if old != Some(target) => ReportedChange::Set(target.clone()),
        (Some(_), None) => ReportedChange::Clear,
        _ => ReportedChange::Keep,
    }
}

/// A held batch starting at `first` runs nothing: each key is marked there, unless its mark is
/// lower (still to recover once the batch may run).
pub(crate) fn held_mark(old: Option<&Position>, first: &Position) -> ReportedChange {
    match old {
        Some(old) if old <= first => ReportedChange::Keep,
        _ => ReportedChange::Set(first.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(n: u64) -> Position {
        Position::record(n.to_string().parse().unwrap())
    }

    fn marked(mark: Position) -> LeaseState {
        LeaseState {
            reported: Some(mark),
            ..LeaseState::default()
        }
    }

    #[test]
    fn a_batch_after_a_keys_mark_proves_its_lane_skipped_from_the_mark() {
        let row = marked(at(20));
        assert_eq!(lane_mark(&row, None, &at(30)), Some(&at(20)));
        assert_eq!(lane_mark(&row, None, &at(20)), None, "redelivered from it");
        assert_eq!(lane_mark(&row, None, &at(10)), None, "an older batch");
        assert_eq!(
            lane_mark(&row, Some(&at(25)), &at(30)),
            Some(&at(20)),
            "a shard consumer did the records up to 25, not the lane's batch after them"
        );
        assert_eq!(
            lane_mark(&row, Some(&at(30)), &at(30)),
            None,
            "a shard consumer did the whole batch"
        );
        let range = lane_range(&[at(20)], &"30".parse().unwrap()).expect("a range");
        assert_eq!(
            after_shard_checkpoint(range.clone(), Some(&at(25))).from,
            ReadFrom::After("25".parse().unwrap()),
            "read after what the shard consumer did"
        );
        assert_eq!(after_shard_checkpoint(range.clone(), Some(&at(10))), range);
        assert_eq!(lane_mark(&LeaseState::default(), None, &at(30)), None);
        let inside = marked(Position::sub_record("20".parse().unwrap(), 3));
        let again = Position::sub_record("20".parse().unwrap(), 0);
        assert_eq!(
            lane_mark(&inside, None, &again),
            None,
            "the aggregate again"
        );
        let range = lane_range(&[at(40), at(20)], &"50".parse().unwrap()).expect("a range");
        assert_eq!(range.from, ReadFrom::At("20".parse().unwrap()));
        let aged = SkippedRange {
            from: ReadFrom::TrimHorizon,
            before: "50".parse().unwrap(),
        };
        assert_eq!(wider(range.clone(), Some(aged)).from, ReadFrom::TrimHorizon);
        let later = SkippedRange {
            from: ReadFrom::After("30".parse().unwrap()),
            before: "50".parse().unwrap(),
        };
        assert_eq!(
            wider(range.clone(), Some(later)),
            range,
            "the lane's is earlier"
        );
    }

    #[test]
    fn a_lane_read_in_parts_goes_on_from_its_row_and_its_keys_keep_their_marks() {
        let shard = LeaseKey::new("orders", "shardId-000000000000");
        assert_eq!(
            lane_row(&shard, &at(20)).to_string(),
            "orders:shardId-000000000000#lane:20"
        );
        let (mark, first) = (at(20), at(50));
        assert_eq!(lane_start(&mark, Some(&at(30)), &first), &at(30));
        assert_eq!(lane_start(&mark, None, &first), &at(20));
        assert_eq!(
            lane_start(&mark, Some(&at(10)), &first),
            &at(10),
            "a range widened for its age goes on below the mark"
        );
        assert_eq!(
            lane_start(&mark, Some(&at(50)), &first),
            &at(20),
            "not before"
        );
        let marks = [at(20), at(40)];
        assert_eq!(kept_mark(Some(&at(40)), &marks), Some(&at(40)));
        assert_eq!(kept_mark(None, &marks), Some(&at(20)));
        assert_eq!(kept_mark(Some(&at(30)), &marks), Some(&at(20)));
    }

    #[test]
    fn an_old_batch_is_read_from_the_lowest_checkpoint_of_its_keys() {
        let limit = 60_000;
        let (ten, twenty) = (at(10), at(20));
        let range = aged_range([Some(&twenty), Some(&ten)], &at(30), (50_000, limit), false)
            .expect("suspected");
        assert_eq!(range.from, ReadFrom::After("10".parse().unwrap()));
        assert_eq!(
            aged_range([Some(&ten)], &at(30), (10_000, limit), false),
            None,
            "young"
        );
        let range = aged_range([Some(&ten), None], &at(30), (50_000, limit), true).expect("any");
        assert_eq!(
            range.from,
            ReadFrom::TrimHorizon,
            "a key never checkpointed"
        );
        assert_eq!(
            aged_range([None], &at(30), (50_000, limit), false),
            None,
            "LATEST: nothing bounds it"
        );
    }

    #[test]
    fn a_key_is_marked_where_its_lane_comes_again_and_unmarked_once_past() {
        let (ten, twenty) = (at(10), at(20));
        assert_eq!(
            next_mark(None, None, Some(&twenty), true),
            ReportedChange::Set(at(20))
        );
        assert_eq!(
            next_mark(Some(&twenty), None, Some(&twenty), true),
            ReportedChange::Keep
        );
        assert_eq!(
            next_mark(Some(&ten), None, Some(&twenty), false),
            ReportedChange::Clear,
            "nothing of the key comes again"
        );
        assert_eq!(next_mark(None, None, None, true), ReportedChange::Keep);
        assert_eq!(
            next_mark(Some(&ten), Some(&ten), Some(&twenty), true),
            ReportedChange::Keep,
            "not settled: kept"
        );
        assert_eq!(held_mark(Some(&ten), &twenty), ReportedChange::Keep);
        assert_eq!(held_mark(None, &twenty), ReportedChange::Set(at(20)));
    }
}
