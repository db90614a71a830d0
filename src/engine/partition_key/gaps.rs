//! Records the mapping skipped in a lane, in the partition-key mode: found by the marks of the
//! keys' rows (the rules are [`gap::keys`](crate::gap::keys)), read once per batch, filtered to
//! the keys of the lane, and run before the batch.

use std::collections::HashMap;

use super::commits::write;
use super::marks;
use super::open::OpenMarks;
use super::rows::KeyRow;
use crate::engine::batch::Entry;
use crate::engine::invocation::Invocation;
use crate::engine::recovery::{Keep, Skipped, Unreadable, read_skipped};
use crate::engine::settings::Settings;
use crate::gap::keys::{
    after_shard_checkpoint, aged_range, lane_mark, lane_range, lane_row, lane_start, wider,
};
use crate::gap::{GapOutcome, GapReport, SkippedRange};
use crate::key::{LeaseKey, row_key};
use crate::report::StopReason;
use crate::sequence::{Position, SequenceNumber};
use crate::store::{KeyCommit, LeaseError, LeaseState, ReportedChange, read_rows_again_once};

/// What the keys' rows proved skipped before a batch, and what was read of it.
#[derive(Default)]
pub(super) struct Found {
    /// The records of the lane's keys read, not done yet, in order: to run before the batch.
    pub(super) entries: Vec<Entry>,
    /// The first record not read, when the range was read in part: the next delivery reads on
    /// from it.
    pub(super) unread: Option<Position>,
    /// The last record read before `unread`, filtered out or not.
    pub(super) read_to: Option<SequenceNumber>,
    /// The range, for the shard's report.
    pub(super) gap: Option<GapReport>,
    /// The lane, when its keys' marks proved the range.
    pub(super) lane: Option<Lane>,
    /// The range read covers what the shard's open marks asked this batch to read, and every
    /// key found there not done that is not run here was marked: the open-marks row may say
    /// the reading reached where it stopped (see `open`).
    pub(super) open_read: bool,
    /// No mark proved the range, and it was read from the lowest checkpoint of the batch's
    /// keys for the batch's age (see `commits::AgedPart`).
    pub(super) aged: bool,
}

/// The lane whose keys' marks proved a range, and its rows ([`lane_row`]: one per mark, saying
/// where a range read in parts goes on). A key first met in a later part is known as the
/// lane's by its mark, so while the range is read in parts the marks stay (see
/// [`kept_mark`]) and the lane's rows carry the progress: the first record not done. Read in
/// one `BatchGetItem` when a mark proves a gap, written in one `TransactWriteItems` after each
/// part but the last; a batch with no gap costs nothing more.
pub(super) struct Lane {
    /// The marks that proved the range, lowest first.
    pub(super) marks: Vec<Position>,
    /// The lane's rows as read, one per mark.
    rows: Vec<LeaseState>,
}

/// Why nothing may run: the range could not be read.
pub(super) type Unread = Box<(GapReport, StopReason)>;

/// Finds what the lane of `batch` skipped, from the rows in `keys` (the batch's keys; the
/// rows of the other keys of the lane found in the range are added), and reads it. No request
/// when no row proves anything and the batch is not suspect for its age.
pub(super) async fn recover<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    batch: &[Entry],
    keys: &mut HashMap<String, KeyRow>,
    shard_checkpoint: Option<&Position>,
    invocation: &Invocation,
    open: Option<&OpenMarks>,
) -> Result<Found, Unread> {
    let Some(first) = batch.first() else {
        return Ok(Found::default());
    };
    let start = first.position();
    // A key no row marks may have lost records after a mark another lane of the shard left.
    let opened = open
        .and_then(|open| open.range(keys, shard_checkpoint, &start, invocation.now()))
        .map(|range| after_shard_checkpoint(range, shard_checkpoint));
    let mut detected: Vec<Position> = keys
        .values()
        .filter_map(|row| lane_mark(&row.state, shard_checkpoint, &start))
        .cloned()
        .collect();
    detected.sort();
    detected.dedup();
    let mut lane = None;
    let mut aged_read = false;
    let range = if detected.is_empty() {
        let aged = aged(settings, keys.values(), first, shard_checkpoint, invocation);
        aged_read = aged.is_some();
        match unproven(aged, opened.clone()) {
            Some(range) => range,
            None => return Ok(Found::default()),
        }
    } else {
        let (range, found) = proven_range(
            settings,
            key,
            keys,
            (&detected, first),
            shard_checkpoint,
            invocation,
        )
        .await?;
        lane = Some(found);
        after_shard_checkpoint(wider(range, opened.clone()), shard_checkpoint)
    };
    let opened = opened.is_some();
    let suspicion = detected.is_empty();
    let Some(skipped) = read(settings, key, &range, invocation).await? else {
        return Ok(no_reader(range));
    };
    if !skipped.complete && skipped.entries.is_empty() && skipped.rest.is_empty() {
        let reason =
            StopReason::GapUnread(format!("no record {range} could be read in the time left"));
        let gap = GapReport::new(range, GapOutcome::Unread("out of time".to_owned()));
        return Err(Box::new((gap, reason)));
    }
    // Read in part: the last record read is where the next delivery reads on from.
    let unread = skipped.unread();
    let read_to = skipped.read_to.clone();
    let complete = skipped.complete;
    let entries = skipped.entries;
    let lane_keys = LaneKeys {
        detected: &detected,
        shard_checkpoint,
        now: invocation.now(),
    };
    let (entries, all_marked) = match of_the_lane(settings, key, entries, keys, lane_keys).await {
        Ok(found) => found,
        Err(error) => {
            let reason = StopReason::GapUnread(format!(
                "reading the rows of the partition keys in {range} failed: {error}"
            ));
            return Err(Box::new((
                GapReport::new(range, GapOutcome::Unread(error)),
                reason,
            )));
        }
    };
    let open_read = opened && all_marked;
    if suspicion && complete && entries.is_empty() {
        // Nothing was dropped after all: each key's records follow its checkpoint.
        return Ok(Found {
            open_read,
            ..Found::default()
        });
    }
    let outcome = if complete {
        GapOutcome::Recovered
    } else {
        GapOutcome::Partial
    };
    tracing::info!(
        stream = key.stream(),
        shard = key.shard(),
        %range,
        records = entries.len(),
        complete,
        "records of the partition keys' lane the event source mapping skipped: running them before the batch"
    );
    Ok(Found {
        entries,
        unread,
        read_to,
        gap: Some(GapReport::new(range, outcome)),
        lane,
        open_read,
        aged: aged_read,
    })
}

/// The range to read when no mark proves one: for the batch's age (from its keys' lowest
/// checkpoint), widened to the shard's open marks' range; or that range alone.
fn unproven(aged: Option<SkippedRange>, opened: Option<SkippedRange>) -> Option<SkippedRange> {
    match aged {
        Some(range) => Some(wider(range, opened)),
        None => opened,
    }
}

/// The range a lane's `detected` marks prove skipped before a batch starting at `first`
/// (`keys`: the batch's rows), with the lane's rows: from where each mark's reading goes on,
/// widened for the batch's age, after a whole-shard consumer's checkpoint.
async fn proven_range<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    keys: &HashMap<String, KeyRow>,
    (detected, first): (&[Position], &Entry),
    shard_checkpoint: Option<&Position>,
    invocation: &Invocation,
) -> Result<(SkippedRange, Lane), Unread> {
    let start = first.position();
    let marked: Vec<(&str, &Position)> = keys
        .iter()
        .filter_map(|(partition_key, row)| {
            lane_mark(&row.state, shard_checkpoint, &start)
                .map(|mark| (partition_key.as_str(), mark))
        })
        .collect();
    tracing::warn!(
        stream = key.stream(),
        shard = key.shard(),
        keys = ?marked,
        first = %first.sequence(),
        "a batch starts after the record its partition keys' lane was reported at: the event source mapping skipped records"
    );
    let found = read_lane(settings, key, detected.to_vec())
        .await
        .map_err(|error| lane_unread(detected, first.sequence(), &error))?;
    let starts: Vec<Position> = found.starts(&start).into_iter().cloned().collect();
    let range =
        lane_range(&starts, first.sequence()).unwrap_or_else(|| unreachable!("marks found"));
    // A key of the batch may have lost records for their age before its mark (a held
    // batch's mark says nothing of what was dropped before it) or with no mark at all: read
    // from its checkpoint too, when the batch is suspect. Not a key whose lane has read on
    // in parts: everything of it before where the reading goes on is settled.
    let unsettled = keys.values().filter(|row| {
        lane_mark(&row.state, shard_checkpoint, &start)
            .is_none_or(|mark| !found.progressed(mark, &start))
    });
    let range = after_shard_checkpoint(
        wider(
            range,
            aged(settings, unsettled, first, shard_checkpoint, invocation),
        ),
        shard_checkpoint,
    );
    Ok((range, found))
}

/// Why nothing may run when the rows of the lane of `marks` could not be read, before a batch
/// starting at `first`: the range they prove, unread.
fn lane_unread(marks: &[Position], first: &SequenceNumber, error: &LeaseError) -> Unread {
    let range = lane_range(marks, first).unwrap_or_else(|| unreachable!("marks found"));
    let reason = StopReason::GapUnread(format!(
        "reading where the lane's reading of {range} goes on failed: {error}"
    ));
    Box::new((
        GapReport::new(range, GapOutcome::Unread(error.to_string())),
        reason,
    ))
}

/// Reads the rows of the lane of `marks` (see [`Lane`]), again once after a failure (a
/// throttle refuses one request). A reading that fails twice is the batch's failure: where the
/// lane's reading goes on may lie below its marks (a range widened for a batch's age), so
/// reading from the marks instead would pass records of the lane's keys that are not done.
async fn read_lane<H>(
    settings: &Settings<H>,
    shard: &LeaseKey,
    marks: Vec<Position>,
) -> Result<Lane, LeaseError> {
    let rows: Vec<LeaseKey> = marks.iter().map(|mark| lane_row(shard, mark)).collect();
    let rows = read_rows_again_once(settings.store.as_ref(), &rows, "the lane's").await?;
    Ok(Lane { marks, rows })
}

impl Lane {
    /// Whether the lane's reading of `mark` has gone on in parts, before a batch starting at
    /// `first`: from the mark, or from below it when the range was widened for the batch's age
    /// (the lane's keys' records before where it goes on are then done too).
    fn progressed(&self, mark: &Position, first: &Position) -> bool {
        self.marks.iter().zip(&self.rows).any(|(own, row)| {
            own == mark
                && row
                    .reported
                    .as_ref()
                    .is_some_and(|progress| progress < first)
        })
    }

    /// Where each mark's reading goes on from, before a batch starting at `first`.
    fn starts<'a>(&'a self, first: &Position) -> Vec<&'a Position> {
        self.marks
            .iter()
            .enumerate()
            .map(|(index, mark)| {
                let progress = self.rows.get(index).and_then(|row| row.reported.as_ref());
                lane_start(mark, progress, first)
            })
            .collect()
    }
}

/// After a part of a range read only because the batch was old (no mark proved it), whose
/// keys are now marked at `mark` (a record of theirs, so no other lane's mark: the first record
/// of the part not done, or the batch's first): writes the lane's row of that mark, saying that
/// the reading goes on from `progress`, so that a batch of the lane after the mapping gave up on
/// this one reads on from there. A redelivery of this one reads on from the keys' checkpoints
/// (a part done whole moved them: `AgedPart`). One `BatchGetItem` and one `TransactWriteItems`.
pub(super) async fn settle_aged<H>(
    settings: &Settings<H>,
    shard: &LeaseKey,
    mark: &Position,
    progress: &Position,
    now: u64,
) {
    match read_lane(settings, shard, vec![mark.clone()]).await {
        Ok(lane) => advance_lane(settings, shard, &lane, progress, now).await,
        // As a failed write of it: it costs a part read again.
        Err(error) => {
            tracing::warn!(%error, %mark, "could not read the lane's row; where its reading goes on is not written");
        }
    }
}

/// Writes where the lane's range read in part goes on (`progress`: the first record of it not
/// done) into the lane's rows, one per mark, in one `TransactWriteItems` per 100 marks. Only
/// after the keys' rows were all written: a key refused there runs its records again, so the
/// reading must not pass them. A failure is logged; it costs only a part read again.
pub(super) async fn advance_lane<H>(
    settings: &Settings<H>,
    shard: &LeaseKey,
    lane: &Lane,
    progress: &Position,
    now: u64,
) {
    let expires_at = (now / 1_000).saturating_add(settings.key_ttl.as_secs());
    let commits: Vec<(String, KeyCommit)> = lane
        .marks
        .iter()
        .zip(&lane.rows)
        .filter(|(_, row)| row.reported.as_ref() != Some(progress))
        .map(|(mark, row)| {
            let mut commit = KeyCommit::new(lane_row(shard, mark), row.lease_counter);
            commit.reported = ReportedChange::Set(progress.clone());
            commit.expires_at = Some(expires_at);
            (mark.to_string(), commit)
        })
        .collect();
    // A row written meanwhile (another delivery of the lane read on) is logged by `write`.
    let _refused = write(settings.store.as_ref(), &commits).await;
}

/// Reads `range` with the one reader of skipped records: `None` when nothing can read it
/// (logged as lost).
async fn read<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    range: &SkippedRange,
    invocation: &Invocation,
) -> Result<Option<Skipped>, Unread> {
    match read_skipped(settings, key, range, invocation, Keep::ALL).await {
        Ok(skipped) => Ok(Some(skipped)),
        Err(Unreadable::NoReader) => Ok(None),
        Err(Unreadable::Failed(error)) => {
            tracing::warn!(
                stream = key.stream(),
                shard = key.shard(),
                %range,
                %error,
                "could not read the records the event source mapping skipped; reporting the batch"
            );
            let reason = StopReason::GapUnread(format!("reading them ({range}) failed: {error}"));
            Err(Box::new((
                GapReport::new(range.clone(), GapOutcome::Unread(error.to_string())),
                reason,
            )))
        }
    }
}

/// A range nothing can read: logged as lost, and the batch goes on (the mapping will never
/// deliver it again; holding the batch would only make it give up on this one too).
fn no_reader(range: SkippedRange) -> Found {
    Found {
        gap: Some(GapReport::new(range, GapOutcome::NoReader)),
        ..Found::default()
    }
}

/// The range before the batch's `first` record the lane may have dropped for its age, over the
/// rows of `keys`: only with a gate that knows the mapping's record age limit (see
/// [`aged_range`]).
fn aged<'a, H>(
    settings: &Settings<H>,
    keys: impl Iterator<Item = &'a KeyRow>,
    first: &Entry,
    shard_checkpoint: Option<&Position>,
    invocation: &Invocation,
) -> Option<SkippedRange> {
    let (limit, from_start) = settings.gate.as_deref()?.record_age()?;
    let Entry::Record(record) = first else {
        return None;
    };
    let arrival = crate::clock::millis_since_epoch(record.arrival());
    let age = invocation.now().saturating_sub(arrival);
    // A key's records are done up to its checkpoint or the shard's, whichever is later.
    let checkpoints = keys.map(|row| row.checkpoint.as_ref().max(shard_checkpoint));
    aged_range(
        checkpoints,
        &record.position(),
        (age, crate::store::memory::millis(limit)),
        from_start,
    )
}

/// What tells the keys of a range read apart: the marks that proved it (none when it was read
/// for the batch's age), the checkpoint of a consumer of the whole shard, and the time.
struct LaneKeys<'a> {
    detected: &'a [Position],
    shard_checkpoint: Option<&'a Position>,
    now: u64,
}

/// The `entries` read that belong to the batch's lane and are not done: the keys of the batch
/// (`keys` holds their rows), and the keys whose row carries one of the `detected` marks (they
/// were in the batch that set it), whose rows are read here and added to `keys`. Any other
/// key's records belong to another lane, which may be delivering them now, or to this one,
/// which passed them (which lane a key takes is the mapping's secret): such a key not done at
/// a record read here is marked there ([`marks::mark_strangers`]), so that its next batch, if it comes
/// after that record, proves the range and runs it first.
async fn of_the_lane<H>(
    settings: &Settings<H>,
    shard: &LeaseKey,
    mut entries: Vec<Entry>,
    keys: &mut HashMap<String, KeyRow>,
    lane: LaneKeys<'_>,
) -> Result<(Vec<Entry>, bool), String> {
    let LaneKeys {
        detected,
        shard_checkpoint,
        now,
    } = lane;
    let mut others: Vec<&str> = entries
        .iter()
        .filter_map(Entry::routing_key)
        .filter(|partition_key| !keys.contains_key(*partition_key))
        .collect();
    others.sort_unstable();
    others.dedup();
    let others: Vec<String> = others.into_iter().map(str::to_owned).collect();
    let mut strangers: Vec<(&str, KeyRow)> = Vec::new();
    // Whether every key of the range not done is run here or marked.
    let mut all_marked = true;
    if !others.is_empty() {
        let rows: Vec<LeaseKey> = others
            .iter()
            .map(|partition_key| row_key(shard, partition_key))
            .collect();
        // Read again once after a failure: a stranger left unmarked, in a range read for the
        // batch's age, has nothing to prove the range to its next batch when that one comes
        // young (seed 7219311 of the invariant scenarios lost records so, to one throttle).
        let states = match read_rows_again_once(
            settings.store.as_ref(),
            &rows,
            "the range's other partition keys'",
        )
        .await
        {
            Ok(states) => states,
            Err(error) if !detected.is_empty() => return Err(error.to_string()),
            // Read for the batch's age only: nothing of the lane depends on them, and the
            // strangers go unmarked (logged).
            Err(error) => {
                tracing::warn!(%error, "could not read the rows of the other partition keys in the range; they are not marked");
                all_marked = false;
                Vec::new()
            }
        };
        for ((partition_key, row), state) in others.iter().zip(rows).zip(states) {
            let marked = state
                .reported
                .as_ref()
                .is_some_and(|mark| detected.contains(mark));
            let checkpoint = match state.position() {
                Ok(checkpoint) => checkpoint,
                Err(error) if marked => return Err(error.to_string()),
                // Not the lane's by its mark: nothing says where it is done, so it is not marked.
                Err(_) => {
                    all_marked = false;
                    continue;
                }
            };
            let read = KeyRow {
                row,
                checkpoint,
                state,
                in_batch: false,
            };
            if marked {
                keys.insert(partition_key.clone(), read);
            } else {
                strangers.push((partition_key.as_str(), read));
            }
        }
    }
    let not_done = |entry: &Entry, row: &KeyRow| {
        !row.checkpoint
            .iter()
            .chain(shard_checkpoint)
            .any(|done| entry.position() <= *done)
    };
    let stranger_marks: Vec<(KeyRow, Position)> = strangers
        .into_iter()
        .filter_map(|(partition_key, row)| {
            let first = entries
                .iter()
                .find(|entry| entry.routing_key() == Some(partition_key) && not_done(entry, &row))?
                .position();
            Some((row, first))
        })
        .collect();
    entries.retain(|entry| {
        entry
            .routing_key()
            .and_then(|k| keys.get(k))
            .is_some_and(|row| not_done(entry, row))
    });
    let marked = marks::mark_strangers(settings, &stranger_marks, now).await;
    Ok((entries, all_marked && marked))
}
