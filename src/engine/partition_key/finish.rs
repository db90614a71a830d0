//! The partition-key mode's report of a run: every record's disposition and the record reported
//! to Lambda.

use crate::engine::attempt::Runner;
use crate::engine::batch::Entry;
use crate::engine::keyed::{self, State};
use crate::handler::Handler;
use crate::report::{Disposition, RecordReport, RecordReports, ShardReport, StopReason};

/// The shard's report: every record's disposition, and the lowest record not done (or not
/// recorded) as the one reported.
pub(super) async fn finish<H: Handler>(
    runner: &Runner<'_, H>,
    mut report: ShardReport,
    entries: &[Entry],
    run: &keyed::Run,
    refused: Vec<(String, StopReason)>,
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
    report.records.append(records);
    if let Some((index, reason)) = stopped {
        let sequence = entries[index].sequence().clone();
        tracing::info!(%sequence, %reason, "reporting the first record not done");
        report.stopped = Some((sequence, reason));
    }
    report
}
