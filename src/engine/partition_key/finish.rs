//! The partition-key mode's report of a run: every record's disposition and the record reported
//! to Lambda, for a delivered batch and for a closed parent's tail alike.

use crate::engine::attempt::Runner;
use crate::engine::batch::Entry;
use crate::engine::keyed::{self, State};
use crate::engine::recovery;
use crate::handler::Handler;
use crate::report::{Disposition, RecordReport, RecordReports, ShardReport, StopReason};

/// The shard's report: every record's disposition, and the lowest record not done (or not
/// recorded) as the one reported. The first `recovered` entries are the lane's skipped
/// records, reported under the gap; when one of them is not done, or the range was read in
/// part (`cut`: dispatch stopped there), the batch's first record is reported.
pub(super) async fn finish<H: Handler>(
    runner: &Runner<'_, H>,
    mut report: ShardReport,
    entries: &[Entry],
    run: &keyed::Run,
    refused: Vec<(String, StopReason)>,
    recovered: usize,
    cut: Option<usize>,
) -> ShardReport {
    let lowest = run.lowest_not_done();
    let first_refused = entries.iter().zip(&run.states).position(|(entry, state)| {
        matches!(state, State::Done(Disposition::Uncheckpointed, _))
            && entry.routing_key().is_some()
    });
    let stopped = match first_refused {
        Some(index) if index < lowest => {
            let partition_key = entries[index].routing_key().unwrap_or_default();
            let reason = refused
                .into_iter()
                .find(|(k, _)| k == partition_key)
                .map_or(StopReason::CheckpointFenced, |(_, reason)| reason);
            Some((index, reason))
        }
        _ if cut.is_some_and(|cut| lowest >= cut) => Some((
            recovered,
            StopReason::GapUnread(format!(
                "one invocation reads at most {} of them, in half its time left; the next one reads on",
                crate::gap::MAX_RECOVERED_RECORDS
            )),
        )),
        _ if lowest < entries.len() => Some((lowest, run.reason(lowest, runner, entries).await)),
        _ => None,
    };
    let reported = stopped.as_ref().map_or(entries.len(), |(index, _)| *index);
    let records: RecordReports = entries
        .iter()
        .zip(run.dispositions(reported))
        .map(|(entry, disposition)| RecordReport {
            position: entry.position(),
            disposition,
        })
        .collect();
    if let Some((index, reason)) = recovery::report(&mut report, records, recovered, stopped) {
        let sequence = entries[index].sequence().clone();
        tracing::info!(%sequence, %reason, "reporting the first record not done");
        report.stopped = Some((sequence, reason));
    }
    report
}
