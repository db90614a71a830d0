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
    CannotRead, GapOutcome, GapReport, MAX_RECOVERED_RECORDS, RangeRead, ReadBudget, SkippedRange,
    detect,
};
use crate::gate::{Gate, TopologyError};
use crate::key::LeaseKey;
use crate::record::Record;
use crate::report::{Disposition, RecordReports, ShardReport, StopReason};
use crate::sequence::Position;
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
    let Some(range) = entries
        .first()
        .and_then(|first| detect(state, checkpoint, &first.position()))
    else {
        return Ok(unchanged(entries, None));
    };
    tracing::error!(
        stream = key.stream(),
        shard = key.shard(),
        %range,
        "the event source mapping skipped records (a finite MaximumRetryAttempts or MaximumRecordAgeInSeconds, a re-created mapping, or records expired from the stream)"
    );
    let skipped = match read_skipped(settings, key, &range, invocation).await {
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
    prepend(key, range, skipped, entries)
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
/// invocation's time left (the records must run too) and [`MAX_RECOVERED_RECORDS`].
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

/// The records read, as entries, through the event's own intake: KPL aggregates unpacked as a
/// batch's are.
fn unpack<H>(settings: &Settings<H>, records: Vec<Record>) -> Vec<Entry> {
    let entries: Vec<Entry> = records.into_iter().map(Entry::Record).collect();
    if settings.deaggregate {
        super::batch::deaggregate(entries)
    } else {
        entries
    }
}

/// What [`read_skipped`] read of a range.
struct Skipped {
    /// The records to run, unpacked as a batch's are, in order.
    pub(crate) entries: Vec<Entry>,
    /// The first record not to run here, unpacked: the last one read when the range was read
    /// in part (the next delivery reads on from it). Empty when the whole range was read.
    pub(crate) rest: Vec<Entry>,
    /// Whether the whole range was read.
    pub(crate) complete: bool,
    /// How many stream records were read (a KPL aggregate counts once).
    pub(crate) records: usize,
}

/// Why [`read_skipped`] read nothing.
enum Unreadable {
    /// Nothing can read the range (no gate, or a topology that reads no record): logged as
    /// lost.
    NoReader,
    /// The reading failed; the caller says what that costs.
    Failed(TopologyError),
}

/// Reads a range the mapping will not deliver: through the gate's topology, within half the
/// time left and [`MAX_RECOVERED_RECORDS`], unpacked as a batch's records are.
async fn read_skipped<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    range: &SkippedRange,
    invocation: &Invocation,
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
    let rest = if complete { None } else { records.pop() };
    Ok(Skipped {
        entries: unpack(settings, records),
        rest: rest.map_or_else(Vec::new, |rest| unpack(settings, vec![rest])),
        complete,
        records: read,
    })
}

/// Logs a range nothing can read: neither processed nor dead-lettered.
fn lost(key: &LeaseKey, range: &SkippedRange, why: &str) {
    tracing::warn!(
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
