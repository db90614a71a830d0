//! The engine's side of [gap recovery](crate::gap): find the range the mapping skipped, read
//! it, put its records before the batch's, and say what became of them. Everything after that
//! (dedupe, dispatch, dead letters, the checkpoint) is the batch's own path, so a recovered
//! record is treated exactly as a delivered one.
//!
//! Here rather than in `gap`, which holds the rules (when a range was skipped, what the row
//! remembers) over the store's types only: this side works on the engine's entries and reports.

use super::batch::Entry;
use super::invocation::Invocation;
use super::ordered::Dispatched;
use super::settings::Settings;
use crate::gap::{
    CannotRead, GapOutcome, GapReport, MAX_RECOVERED_RECORDS, RangeRead, ReadBudget, ReadFrom,
    SkippedRange, detect, suspected,
};
use crate::gate::{Gate, TopologyError};
use crate::key::LeaseKey;
use crate::record::Record;
use crate::report::{Disposition, RecordReports, ShardReport, StopReason};
use crate::sequence::{Position, SequenceNumber};
use crate::store::LeaseState;

/// The batch's entries with the recovered ones first.
pub(crate) struct Recovery {
    /// The recovered entries, then the batch's.
    pub(crate) entries: Vec<Entry>,
    /// How many of `entries` were recovered.
    pub(crate) recovered: usize,
    /// Dispatch stops before this entry: the first record of a range read in part, which the
    /// next invocation reads on from.
    pub(crate) cut: Option<usize>,
    /// The range found, if any.
    pub(crate) gap: Option<GapReport>,
}

/// What stops the shard before anything runs: the batch's entries, the range, and why.
/// Boxed: it is large, and rare.
pub(crate) type Unrecovered = Box<(Vec<Entry>, GapReport, StopReason)>;

/// Finds the range the mapping skipped before `entries` and reads it through the gate's
/// topology, within half the invocation's time left (the records must run too) and
/// [`MAX_RECOVERED_RECORDS`]. Without a reader, the gap is logged and the batch goes on; a
/// reading that fails stops the shard with the batch reported.
pub(crate) async fn recover<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    state: &LeaseState,
    checkpoint: Option<&Position>,
    entries: Vec<Entry>,
    invocation: &Invocation,
) -> Result<Recovery, Unrecovered> {
    let unchanged = |entries, gap| Recovery {
        entries,
        recovered: 0,
        cut: None,
        gap,
    };
    let proven = entries
        .first()
        .and_then(|first| detect(state, checkpoint, &first.position()));
    // Never checkpointed, under a `TRIM_HORIZON` mapping with a record age: the marked record
    // is the first the mapping delivered, and it may have dropped older ones for their age
    // before delivering anything.
    let from_start = checkpoint.is_none()
        && settings
            .gate
            .as_deref()
            .and_then(Gate::record_age)
            .is_some_and(|(_, from_start)| from_start);
    let (range, suspicion) = match proven {
        Some(range) if from_start => (
            SkippedRange {
                from: ReadFrom::TrimHorizon,
                before: range.before,
            },
            false,
        ),
        Some(range) => (range, false),
        None => match aged(settings, checkpoint, entries.first(), invocation) {
            Some(range) => (range, true),
            None => return Ok(unchanged(entries, None)),
        },
    };
    let skipped = match read_skipped(settings, key, &range, invocation, Keep::ALL).await {
        Ok(skipped) => skipped,
        Err(Unreadable::NoReader) => {
            return Ok(unchanged(
                entries,
                Some(GapReport::new(range, GapOutcome::NoReader)),
            ));
        }
        Err(Unreadable::Failed(error)) => {
            tracing::warn!(
                stream = key.stream(),
                shard = key.shard(),
                %range,
                %error,
                "could not read the records the event source mapping skipped; reporting the batch"
            );
            let reason = StopReason::GapUnread(format!("reading them ({range}) failed: {error}"));
            let gap = GapReport::new(range, GapOutcome::Unread(error.to_string()));
            return Err(Box::new((entries, gap, reason)));
        }
    };
    if suspicion && skipped.complete && skipped.entries.is_empty() && skipped.rest.is_empty() {
        // Nothing was dropped after all: the batch follows its checkpoint.
        return Ok(unchanged(entries, None));
    }
    prepend(key, range, skipped, entries)
}

/// The range before the batch's `first` entry that the mapping may have dropped for its age
/// (see [`suspected`]): only with a gate that knows the mapping's record age limit.
fn aged<H>(
    settings: &Settings<H>,
    checkpoint: Option<&Position>,
    first: Option<&Entry>,
    invocation: &Invocation,
) -> Option<SkippedRange> {
    let (limit, from_start) = settings.gate.as_deref()?.record_age()?;
    let first = first?;
    let arrival = crate::clock::millis_since_epoch(first.arrival()?);
    let age = invocation.now().saturating_sub(arrival);
    suspected(
        checkpoint,
        &first.position(),
        (age, crate::store::memory::millis(limit)),
        from_start,
    )
}

/// Puts the records read of `range` before the batch's `entries`.
fn prepend(
    key: &LeaseKey,
    range: SkippedRange,
    skipped: Skipped,
    entries: Vec<Entry>,
) -> Result<Recovery, Unrecovered> {
    let Skipped {
        entries: mut recovered,
        rest,
        complete,
        records: read,
        ..
    } = skipped;
    let unchanged = |entries, gap| Recovery {
        entries,
        recovered: 0,
        cut: None,
        gap,
    };
    if recovered.is_empty() && rest.is_empty() {
        if complete {
            tracing::warn!(
                stream = key.stream(),
                shard = key.shard(),
                %range,
                "the event source mapping skipped records, but the stream holds none of them any more (expired?)"
            );
            return Ok(unchanged(
                entries,
                Some(GapReport::new(range, GapOutcome::Recovered)),
            ));
        }
        let reason =
            StopReason::GapUnread(format!("no record {range} could be read in the time left"));
        let gap = GapReport::new(range, GapOutcome::Unread("out of time".to_owned()));
        return Err(Box::new((entries, gap, reason)));
    }
    // Read in part: the last record read does not run here; it is where the next invocation
    // reads on from (the row remembers it as the reported record).
    let cut = (!rest.is_empty()).then_some(recovered.len());
    recovered.extend(rest);
    let outcome = if complete {
        tracing::info!(
            stream = key.stream(),
            shard = key.shard(),
            %range,
            records = read,
            "the event source mapping skipped records; running them before the batch"
        );
        GapOutcome::Recovered
    } else {
        tracing::warn!(
            stream = key.stream(),
            shard = key.shard(),
            %range,
            records = read,
            "the event source mapping skipped more records than one invocation reads; running the first ones, the next invocation reads on"
        );
        GapOutcome::Partial
    };
    let count = recovered.len();
    recovered.extend(entries);
    Ok(Recovery {
        entries: recovered,
        recovered: count,
        cut,
        gap: Some(GapReport::new(range, outcome)),
    })
}

/// Reads `range` of the shard of `key` through the gate's topology, within half the
/// invocation's time left (the records must run too) and [`MAX_RECOVERED_RECORDS`]: the one
/// reading of both gap recovery and parent tail recovery.
async fn read<H>(
    settings: &Settings<H>,
    gate: &Gate,
    key: &LeaseKey,
    range: &SkippedRange,
    invocation: &Invocation,
) -> Result<RangeRead, TopologyError> {
    let deadline = invocation
        .time_left()
        .map(|left| invocation.clock().now() + left.saturating_sub(settings.deadline_margin) / 2);
    let budget = ReadBudget::new(MAX_RECOVERED_RECORDS, deadline);
    gate.topology()
        .read_range(key.stream(), key.shard(), range, budget)
        .await
}

/// The records read, as entries, unpacked as a batch's are.
fn unpack<H>(settings: &Settings<H>, records: Vec<Record>) -> Vec<Entry> {
    let entries: Vec<Entry> = records.into_iter().map(Entry::Record).collect();
    #[cfg(feature = "kpl")]
    if settings.deaggregate {
        return super::batch::deaggregate(entries);
    }
    // Without the `kpl` feature, nothing is unpacked.
    let _ = settings;
    entries
}

/// What to keep of a range read by [`read_skipped`].
#[derive(Clone, Copy)]
pub(crate) struct Keep<'a> {
    /// Only records older than this (epoch milliseconds of age, against the invocation's
    /// clock): the first younger one is not run, and is where the next delivery reads on.
    pub(crate) older_than: Option<u64>,
    /// The entries (unpacked) to run; the others are left out.
    pub(crate) filter: &'a (dyn Fn(&Entry) -> bool + Sync),
}

impl Keep<'_> {
    /// Every record read.
    pub(crate) const ALL: Keep<'static> = Keep {
        older_than: None,
        filter: &|_| true,
    };
}

/// What [`read_skipped`] read of a range.
pub(crate) struct Skipped {
    /// The records to run, unpacked as a batch's are, in order, filtered.
    pub(crate) entries: Vec<Entry>,
    /// The first record not to run here, unpacked: the last one read when the range was read
    /// in part (the next delivery reads on from it), or the first one too young. Empty when
    /// every record read is in `entries` or filtered out.
    pub(crate) rest: Vec<Entry>,
    /// Whether the whole range was read.
    pub(crate) complete: bool,
    /// How many stream records were read (a KPL aggregate counts once).
    pub(crate) records: usize,
    /// The last record read before `rest`, filtered out or not.
    pub(crate) read_to: Option<SequenceNumber>,
}

impl Skipped {
    /// Where the next delivery reads on from, when not everything read is to run here.
    pub(crate) fn unread(&self) -> Option<Position> {
        self.rest
            .first()
            .map(|entry| Position::record(entry.sequence().clone()))
    }
}

/// Why [`read_skipped`] read nothing.
pub(crate) enum Unreadable {
    /// Nothing can read the range (no gate, or a topology that reads no record): logged as
    /// lost.
    NoReader,
    /// The reading failed; the caller says what that costs.
    Failed(TopologyError),
}

/// The one reading of a range the mapping will not deliver (gap recovery in both modes, and a
/// closed parent's tail): through the gate's topology, within half the time left and
/// [`MAX_RECOVERED_RECORDS`], unpacked as a batch's records are; `keep` bounds it by age and
/// filters what runs.
pub(crate) async fn read_skipped<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    range: &SkippedRange,
    invocation: &Invocation,
    keep: Keep<'_>,
) -> Result<Skipped, Unreadable> {
    let Some(gate) = settings.gate.as_deref() else {
        lost(
            key,
            range,
            "the processor has no gate, whose topology would read them",
        );
        return Err(Unreadable::NoReader);
    };
    let RangeRead {
        mut records,
        complete,
    } = match read(settings, gate, key, range, invocation).await {
        Ok(read) => read,
        Err(error) if error.downcast_ref::<CannotRead>().is_some() => {
            lost(key, range, &error.to_string());
            return Err(Unreadable::NoReader);
        }
        Err(error) => return Err(Unreadable::Failed(error)),
    };
    let read = records.len();
    // Read in part: the last record read is where the next delivery reads on from.
    let mut rest = if complete { None } else { records.pop() };
    if let Some(limit) = keep.older_than {
        let now = invocation.now();
        let young = records.iter().position(|record| {
            now.saturating_sub(crate::clock::millis_since_epoch(record.arrival())) <= limit
        });
        if let Some(young) = young {
            rest = records.drain(young..).next();
        }
    }
    let read_to = records.last().map(|last| last.sequence().clone());
    let mut entries = unpack(settings, records);
    entries.retain(|entry| (keep.filter)(entry));
    Ok(Skipped {
        entries,
        rest: rest.map_or_else(Vec::new, |rest| unpack(settings, vec![rest])),
        complete,
        records: read,
        read_to,
    })
}

/// What a held child's invocation read of a closed parent's tail.
pub(crate) struct Tail {
    /// The tail's records after the parent's checkpoint (an aggregate the checkpoint is inside
    /// of whole: dedupe drops the sub-records done), to run as a batch of the parent.
    pub(crate) entries: Vec<Entry>,
    /// The first record not run, when the tail was read in part: the parent's row is marked
    /// there, so that the next held batch of a child reads on.
    pub(crate) unread: Option<Position>,
}

/// Reads the tail of the closed `parent`, whose row is `row`, after its checkpoint to the
/// shard's end, with [`read_skipped`] (see the gate's "Parent tail recovery"). `None` when
/// there is nothing to run: no gate, no record read, or a reading that failed (logged; the
/// child stays held).
pub(crate) async fn read_tail<H>(
    settings: &Settings<H>,
    parent: &LeaseKey,
    row: &LeaseState,
    invocation: &Invocation,
) -> Option<Tail> {
    let gate = settings.gate.as_deref()?;
    let range = gate.tail_range(row)?;
    // A parent whose row proves no trouble (no `reported` record, no `contended` mark that
    // is above its checkpoint or that another writer passed; never read: no row at all) has its tail read only because the mapping
    // has a record age limit. Records older than the limit the mapping drops, never delivering
    // them; younger ones it may still deliver, so they are left to it (the first of them is
    // where the next held child reads on).
    let checkpoint = row.position().ok().flatten();
    let proven = row.reported.is_some() || crate::gap::contended_open(row, checkpoint.as_ref());
    let older_than = gate
        .record_age()
        .filter(|_| !proven)
        .map(|(limit, _)| crate::store::memory::millis(limit));
    let keep = Keep {
        older_than,
        ..Keep::ALL
    };
    let skipped = match read_skipped(settings, parent, &range, invocation, keep).await {
        Ok(skipped) => skipped,
        Err(Unreadable::NoReader) => return None,
        Err(Unreadable::Failed(error)) => {
            tracing::warn!(
                stream = parent.stream(),
                parent = parent.shard(),
                %range,
                %error,
                "could not read the tail of a closed parent the mapping no longer delivers; the child stays held"
            );
            return None;
        }
    };
    if skipped.entries.is_empty() {
        return None;
    }
    tracing::info!(
        stream = parent.stream(),
        parent = parent.shard(),
        %range,
        records = skipped.records,
        complete = skipped.complete,
        "a closed parent's tail holds a child and its row proves trouble: running the tail under the parent's lease"
    );
    let unread = skipped.unread();
    Some(Tail {
        entries: skipped.entries,
        unread,
    })
}

/// Logs a range nothing can read: neither processed nor dead-lettered.
pub(crate) fn lost(key: &LeaseKey, range: &SkippedRange, why: &str) {
    tracing::error!(
        stream = key.stream(),
        shard = key.shard(),
        %range,
        why,
        "the event source mapping skipped records that cannot be read here: they are neither processed nor dead-lettered; replay the range by hand"
    );
}

/// Dispatch ran `runnable` of the `pending` records, the rest being a range read in part: the
/// shard stops at the first record not read, unless it stopped before.
pub(crate) fn stop_at_unread(dispatched: &mut Dispatched, runnable: usize, pending: usize) {
    dispatched
        .dispositions
        .resize(pending, Disposition::NotAttempted);
    if dispatched.stopped.is_none() {
        dispatched.dispositions[runnable] = Disposition::Reported;
        dispatched.stopped = Some((
            runnable,
            StopReason::GapUnread(format!(
                "one invocation reads at most {MAX_RECOVERED_RECORDS} of them, in half its time left; the next one reads on"
            )),
        ));
    }
}

/// Puts `records` (one per entry) into the report: the first `recovered` under the gap, the
/// rest as the batch's. Returns the entry to report to Lambda: a recovered record is not in the
/// batch, so when the shard stopped at one, the batch's first record is reported instead (the
/// row remembers the recovered one, and the next batch reads on from the checkpoint).
pub(crate) fn report(
    report: &mut ShardReport,
    mut records: RecordReports,
    recovered: usize,
    stopped: Option<(usize, StopReason)>,
) -> Option<(usize, StopReason)> {
    let batch = records.split_off(recovered);
    if let Some(gap) = &mut report.gap {
        gap.recovered = records.iter().collect();
    }
    report.records.append(batch);
    match stopped {
        Some((index, reason)) if index < recovered => {
            report
                .records
                .replace_first(Disposition::NotAttempted, Disposition::Reported);
            Some((recovered, reason))
        }
        other => other,
    }
}
