//! The shard's open marks, in the partition-key mode with a record age limit: the rules, apart
//! from reading and writing them.
//!
//! A lane the mapping gave up on for the record age may drop records of a key that was in none
//! of its batches: no row marks that key, and if its next batch, young, comes before any batch
//! has read the range, it runs the key's later record and moves the key's checkpoint past the
//! dropped one (seed 143770 of the invariant scenarios lost a record so). Which lane a key
//! takes is the mapping's secret, so no key's row can say it. One row per shard can: the
//! *open-marks row* (`stream:shard#open`, [`open_row`]) lists each record a lane was reported
//! or held at ([`OpenMark`]), with that record's arrival, and its `reported` says how far a
//! reading for them has gone.
//!
//! - **When records after a mark can be gone**: the mapping drops a record for its age only
//!   once it is older than the limit, and every record after the mark arrived after it; so
//!   nothing after a mark can have been dropped before the marked record is older than the
//!   limit ([`SKEW`] earlier, for clocks that disagree).
//! - **Who may have lost them** ([`open_range`]): a key of the batch whose checkpoint lies
//!   before the highest such mark (a key silent since before it, or new). A key whose
//!   checkpoint lies at or after every mark had a batch since, and that batch read the range if
//!   the key had lost anything in it. Such a batch reads from the lowest mark, or from where the
//!   last such reading stopped, up to its first record: its keys' records found there run first,
//!   and every other key not done there is marked at its first record not done, as for a proven
//!   range, so that its next batch proves the range itself.
//! - **When a mark goes**: when the lane's next batch starts at the mark and goes past it while
//!   the marked record is less than half the limit old (the mapping delivered it again rather
//!   than give up on it, and nothing after it is near the limit); or ([`still_open`]) once a
//!   batch delivered more than the limit plus the longest batching window and invocation (20
//!   minutes) after the marked record arrived has read up to its first record. Every record
//!   dropped after the mark was dropped by then, so it arrived more than the limit before that
//!   batch, and that batch's first record, which the mapping delivered, did not: it lies after
//!   them all.

use crate::key::LeaseKey;
use crate::sequence::{Position, ReadFrom, SkippedRange};
use crate::store::OpenMark;

/// How far an invocation's clock may disagree with the mapping's, in milliseconds: a mark
/// counts as open that long before its record is older than the limit.
pub(crate) const SKEW: u64 = 60_000;

/// How long after the limit the mapping may still drop records after a mark, in milliseconds:
/// its longest batching window (5 minutes) and the longest invocation (15 minutes).
pub(crate) const LATEST_DROP: u64 = 20 * 60_000;

/// The shard's open-marks row: `stream:shard#open`. No shard id holds a `#`, so it is neither
/// a shard's row nor a key's (`stream:shard:partition-key`), nor a lane's (`#lane:`).
pub(crate) fn open_row(shard: &LeaseKey) -> LeaseKey {
    LeaseKey::new(shard.stream(), format!("{}#open", shard.shard()))
}

/// The range a batch starting at `first` reads for the shard's `open` marks, at `now` (epoch
/// milliseconds) with the mapping's record age `limit` (milliseconds): from the lowest mark
/// before `first` whose record is older than the limit, or from `progress` (the first record
/// the last such reading did not read) when that lies after it, up to `first`. Only when one of
/// the batch's `keys` may have lost records there: its checkpoint (`None` for a new key) lies
/// before the highest such mark, or it was marked at `first` by a reading that ended at
/// `first` before it was read whole (the second `bool`). `None` otherwise.
pub(crate) fn open_range<'a>(
    open: &[OpenMark],
    progress: Option<&Position>,
    keys: impl IntoIterator<Item = (Option<&'a Position>, bool)>,
    first: &Position,
    (now, limit): (u64, u64),
) -> Option<SkippedRange> {
    let Position::Record {
        sequence: before, ..
    } = first
    else {
        return None;
    };
    let old_enough = |open: &&OpenMark| {
        open.arrival.saturating_add(limit) <= now.saturating_add(SKEW)
            && matches!(&open.mark, Position::Record { sequence, .. } if sequence < before)
    };
    let lowest = open
        .iter()
        .filter(old_enough)
        .map(|open| &open.mark)
        .min()?;
    let highest = open
        .iter()
        .filter(old_enough)
        .map(|open| &open.mark)
        .max()?;
    let start = match progress {
        Some(progress) if progress >= first => return None,
        Some(progress) if progress > lowest => progress,
        _ => lowest,
    };
    let pending = progress.is_some_and(|progress| progress > lowest);
    let exposed = keys.into_iter().any(|(checkpoint, marked_at_first)| {
        checkpoint.is_none_or(|checkpoint| checkpoint < highest) || (pending && marked_at_first)
    });
    let Position::Record { sequence, .. } = start else {
        return None;
    };
    exposed.then(|| SkippedRange {
        from: ReadFrom::At(sequence.clone()),
        before: before.clone(),
    })
}

/// The `open` marks that stay once a batch delivered at `now` has read up to its own first
/// record `first` (see the [module documentation](self)).
pub(crate) fn still_open(
    open: &[OpenMark],
    first: &Position,
    (now, limit): (u64, u64),
) -> Vec<OpenMark> {
    open.iter()
        .filter(|open| {
            let settled =
                open.mark < *first && now > open.arrival.saturating_add(limit + LATEST_DROP + SKEW);
            !settled
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sequence: u64) -> Position {
        Position::record(sequence.to_string().parse().expect("a sequence number"))
    }

    const LIMIT: u64 = 60_000;

    #[test]
    fn a_mark_opens_only_once_its_record_is_nearly_as_old_as_the_limit() {
        let open = [OpenMark::new(at(10), 1_000_000)];
        let new_key = [(None, false)];
        let young = 1_000_000 + LIMIT - SKEW - 1;
        assert_eq!(
            open_range(&open, None, new_key, &at(20), (young, LIMIT)),
            None
        );
        let range = open_range(&open, None, new_key, &at(20), (young + 1, LIMIT));
        assert_eq!(
            range.map(|range| range.to_string()),
            Some("from 10 up to 20".to_owned())
        );
    }

    #[test]
    fn only_a_key_whose_checkpoint_lies_before_the_highest_open_mark_reads_it() {
        let open = [
            OpenMark::new(at(10), 1_000_000),
            OpenMark::new(at(14), 1_000_100),
        ];
        let now = (2_000_000, LIMIT);
        let seen_since = [(Some(&at(15)), false)];
        assert_eq!(open_range(&open, None, seen_since, &at(20), now), None);
        let silent = at(12);
        let range = open_range(&open, None, [(Some(&silent), false)], &at(20), now);
        assert_eq!(
            range.map(|range| range.to_string()),
            Some("from 10 up to 20".to_owned())
        );
        assert_eq!(
            open_range(&open, None, [(None, false)], &at(14), now).map(|r| r.to_string()),
            Some("from 10 up to 14".to_owned()),
            "a mark at or after the batch's first record is not its lane's past"
        );
    }

    #[test]
    fn a_reading_goes_on_from_where_the_last_one_stopped() {
        let open = [OpenMark::new(at(10), 1_000_000)];
        let now = (2_000_000, LIMIT);
        let range = open_range(&open, Some(&at(16)), [(None, false)], &at(20), now);
        assert_eq!(
            range.map(|range| range.to_string()),
            Some("from 16 up to 20".to_owned())
        );
        assert_eq!(
            open_range(&open, Some(&at(20)), [(None, false)], &at(20), now),
            None,
            "read up to the batch already"
        );
        assert_eq!(
            open_range(&open, Some(&at(16)), [(Some(&at(17)), true)], &at(20), now)
                .map(|range| range.to_string()),
            Some("from 16 up to 20".to_owned()),
            "a key marked at the batch's first record by a reading not read whole reads on"
        );
        assert_eq!(
            open_range(&open, Some(&at(16)), [(Some(&at(17)), false)], &at(20), now),
            None
        );
    }

    #[test]
    fn a_mark_goes_once_a_batch_late_enough_has_read_up_to_its_first_record() {
        let open = [
            OpenMark::new(at(10), 1_000_000),
            OpenMark::new(at(30), 1_000_000),
        ];
        let late = 1_000_000 + LIMIT + LATEST_DROP + SKEW + 1;
        assert_eq!(still_open(&open, &at(20), (late - 1, LIMIT)), open.to_vec());
        assert_eq!(
            still_open(&open, &at(20), (late, LIMIT)),
            [OpenMark::new(at(30), 1_000_000)],
            "a mark after the batch's first record stays"
        );
    }
}
