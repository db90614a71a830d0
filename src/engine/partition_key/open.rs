//! The shard's open-marks row, read and written (the rules are [`gap::open`](crate::gap::open)):
//! only with a record age told to the gate. Read in the request that reads the batch's keys'
//! rows; written when a lane is reported or held at a record it does not list yet, and after a
//! reading for it. Each write expects the row's counter as read and, refused (another lane
//! wrote it meanwhile), reads it again and is made once more.

use std::collections::HashMap;

use super::rows::KeyRow;
use crate::engine::batch::Entry;
use crate::engine::settings::Settings;
use crate::gap::open::{open_range, open_row, still_open};
use crate::key::LeaseKey;
use crate::sequence::{Position, SkippedRange};
use crate::store::{KeyCommit, LeaseState, OpenMark, ReportedChange};

/// The shard's open-marks row as read, with the mapping's record age limit.
pub(super) struct OpenMarks {
    row: LeaseKey,
    state: LeaseState,
    /// The record age limit, in milliseconds.
    limit: u64,
}

impl OpenMarks {
    /// The row to read beside the keys' rows of `shard`, when the gate knows a record age.
    pub(super) fn row<H>(settings: &Settings<H>, shard: &LeaseKey) -> Option<LeaseKey> {
        settings.gate.as_deref()?.record_age()?;
        Some(open_row(shard))
    }

    /// The row of `shard` as read (`state`), when the gate knows a record age.
    pub(super) fn new<H>(
        settings: &Settings<H>,
        shard: &LeaseKey,
        state: LeaseState,
    ) -> Option<Self> {
        let (limit, _) = settings.gate.as_deref()?.record_age()?;
        Some(Self {
            row: open_row(shard),
            state,
            limit: crate::store::memory::millis(limit),
        })
    }

    /// The range a batch starting at `first` reads for the open marks, over its keys' rows:
    /// see [`open_range`].
    pub(super) fn range(
        &self,
        keys: &HashMap<String, KeyRow>,
        shard_checkpoint: Option<&Position>,
        first: &Position,
        now: u64,
    ) -> Option<SkippedRange> {
        let rows = keys.values().filter(|row| row.in_batch).map(|row| {
            let checkpoint = row.checkpoint.as_ref().max(shard_checkpoint);
            (checkpoint, row.state.reported.as_ref() == Some(first))
        });
        open_range(
            &self.state.open_marks,
            self.state.reported.as_ref(),
            rows,
            first,
            (now, self.limit),
        )
    }
}

/// Lists `at` (the record a lane was reported or held at) among the open marks, when it is not
/// yet: one write. An entry with no arrival (a malformed record) is not listed.
pub(super) async fn open<H>(settings: &Settings<H>, marks: &mut OpenMarks, at: &Entry, now: u64) {
    settle(settings, marks, None, Some(at), now).await;
}

/// After a batch starting at `first` ran, with Lambda to deliver its lane again from `reported`
/// (if from anywhere): a mark at `first` that the batch went past goes, when `first` is young
/// (less than half the limit old), since the lane delivered its mark again rather than give up
/// on it and nothing after it is near the limit; and `reported` is listed, when it is not yet.
/// At most one write.
pub(super) async fn after_batch<H>(
    settings: &Settings<H>,
    marks: &mut OpenMarks,
    first: &Entry,
    reported: Option<&Entry>,
    now: u64,
) {
    let start = first.position();
    let went_past = reported.is_none_or(|reported| reported.position() > start);
    let young = arrival(first)
        .is_some_and(|arrival| now.saturating_sub(arrival).saturating_mul(2) < marks.limit);
    let passed = (went_past && young).then_some(&start);
    settle(settings, marks, passed, reported, now).await;
}

/// Removes the mark at `passed` and lists `at`, each when given; writes only a change.
async fn settle<H>(
    settings: &Settings<H>,
    marks: &mut OpenMarks,
    passed: Option<&Position>,
    at: Option<&Entry>,
    now: u64,
) {
    let mark = at.and_then(|at| Some(OpenMark::new(at.position(), arrival(at)?)));
    let change = |state: &LeaseState| {
        let mut open = state.open_marks.clone();
        open.retain(|open| Some(&open.mark) != passed);
        if let Some(mark) = &mark
            && !open.iter().any(|open| open.mark == mark.mark)
        {
            open.push(mark.clone());
            open.sort();
        }
        (open != state.open_marks).then_some((open, ReportedChange::Keep))
    };
    write(settings, marks, now, change).await;
}

/// After a reading for the open marks that reached `through` (the first record it did not
/// read; the batch's first when `complete`): the row says the next reading starts there, and,
/// read up to the batch, the marks settled by it go (see [`still_open`]). One write.
pub(super) async fn advance<H>(
    settings: &Settings<H>,
    marks: &mut OpenMarks,
    through: &Position,
    complete: bool,
    now: u64,
) {
    let limit = marks.limit;
    let read_on = |state: &LeaseState| {
        let open = if complete {
            still_open(&state.open_marks, through, (now, limit))
        } else {
            state.open_marks.clone()
        };
        let progress = match &state.reported {
            Some(old) if old >= through => ReportedChange::Keep,
            _ => ReportedChange::Set(through.clone()),
        };
        (open != state.open_marks || progress != ReportedChange::Keep).then_some((open, progress))
    };
    write(settings, marks, now, read_on).await;
}

/// Writes the change `change` makes of the row's state (none: nothing to write), expecting the
/// counter read; refused, reads the row again and writes the change of that once more. The
/// state written is kept in `marks`, so that a later write expects it.
async fn write<H>(
    settings: &Settings<H>,
    marks: &mut OpenMarks,
    now: u64,
    change: impl Fn(&LeaseState) -> Option<(Vec<OpenMark>, ReportedChange)>,
) {
    let expires_at = (now / 1_000).saturating_add(settings.key_ttl.as_secs());
    let store = settings.store.as_ref();
    let mut state = marks.state.clone();
    for again in [false, true] {
        let Some((open, progress)) = change(&state) else {
            return;
        };
        // Never shortened: the row outlives the latest mark written to it.
        let expires = Some(expires_at.max(state.expires_at.unwrap_or(0)));
        let mut commit = KeyCommit::new(marks.row.clone(), state.lease_counter);
        commit.open_marks = Some(open.clone());
        commit.reported = progress.clone();
        commit.expires_at = expires;
        match store.commit_rows(&[commit]).await {
            Ok(written) if written.first() == Some(&true) => {
                state.open_marks = open;
                if let ReportedChange::Set(progress) = progress {
                    state.reported = Some(progress);
                }
                state.expires_at = expires;
                state.lease_counter += 1;
                marks.state = state;
                return;
            }
            Ok(_) if !again => {}
            Ok(_) => {
                tracing::warn!(row = %marks.row, "the shard's open marks were written meanwhile, twice; not written");
                return;
            }
            Err(error) => {
                tracing::warn!(row = %marks.row, %error, "could not write the shard's open marks");
                return;
            }
        }
        state = match store.read_rows(std::slice::from_ref(&marks.row)).await {
            Ok(mut rows) => rows.pop().unwrap_or_default(),
            Err(error) => {
                tracing::warn!(row = %marks.row, %error, "could not read the shard's open marks again");
                return;
            }
        };
    }
}

/// When the record of `entry` arrived in the stream, in epoch milliseconds.
fn arrival(entry: &Entry) -> Option<u64> {
    let arrival = match entry {
        Entry::Record(record) | Entry::AfterMalformed(record) => record.arrival(),
        Entry::Undecodable(error) => error.record().arrival(),
        Entry::Placed(placed) => placed.arrival,
        Entry::Malformed(..) => return None,
    };
    Some(crate::clock::millis_since_epoch(arrival))
}
