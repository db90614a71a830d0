//! When a closed parent's youngest record arrived, learnt over several held checks, in several
//! processes: the partition-key mode's tail rule (`by_key`) judges that record.
//!
//! The gate's scan of a parent ([`ParentScan`](super::parent_scan::ParentScan)) lives in its
//! process, and a scan begun in a new one reads on only after the parent row's checkpoint,
//! which stops at the first key not done. A parent longer than what one held check reads, whose
//! child's every held delivery lands in a new sandbox, was then never read to its end, and its
//! youngest record never learnt. So the reading towards the end goes on from where the last
//! check left it, written in the parent's own scan row (`stream:shard#scan`, its `reported`; no
//! shard id holds a `#`, so no reader of shard or key rows meets it): one part per held check,
//! each starting at the last record the one before read. The part that reaches the end holds
//! the youngest record (a shard's arrival times follow its sequence numbers, up to the
//! seconds of clock skew the rule's 20 minutes cover).
//!
//! Cost, only while a key of the parent is not done and the gate is told the record age: one
//! `BatchGetItem`, one part read from Kinesis and one `TransactWriteItems` per held check.

use super::lineage::Lineage;
use super::parent_scan::{MAX_RECORDS_PER_CHECK, end_of_everything};
use crate::gap::ReadBudget;
use crate::key::LeaseKey;
use crate::sequence::{Position, ReadFrom, SequenceNumber, SkippedRange};
use crate::store::{CheckpointStore, KeyCommit, ReportedChange};

/// How long a scan row outlives its last write (seconds): longer than any stream keeps a record.
const SCAN_ROW_TTL_SECONDS: u64 = 366 * 24 * 3_600;

/// The row holding how far the reading of `parent` towards its end got.
pub(super) fn scan_row(parent: &LeaseKey) -> LeaseKey {
    LeaseKey::new(parent.stream(), format!("{}#scan", parent.shard()))
}

/// Reads one more part of `parent` towards its end, from where the last check left it (or
/// from `read_to`, this process's own reading, when that is further), and writes where the next
/// one starts: the arrival (epoch milliseconds) of its youngest record once the part reaches
/// the end; `None` before, or when the row or the stream cannot be read (logged).
pub(super) async fn youngest_arrival(
    lineage: &Lineage,
    store: &dyn CheckpointStore,
    parent: &LeaseKey,
    read_to: Option<&SequenceNumber>,
) -> Option<u64> {
    let row = scan_row(parent);
    let state = match store.read_rows(std::slice::from_ref(&row)).await {
        Ok(mut states) => states.pop().unwrap_or_default(),
        Err(error) => {
            tracing::warn!(%error, parent = parent.shard(), "could not read how far the closed parent was read towards its end");
            return None;
        }
    };
    let reached = match &state.reported {
        Some(Position::Record { sequence, .. }) => Some(sequence),
        _ => None,
    };
    let start = reached.max(read_to).cloned();
    let range = SkippedRange {
        from: start.clone().map_or(ReadFrom::TrimHorizon, ReadFrom::At),
        before: end_of_everything(),
    };
    let budget = ReadBudget::new(MAX_RECORDS_PER_CHECK, None);
    let read = match lineage
        .topology
        .read_range(parent.stream(), parent.shard(), &range, budget)
        .await
    {
        Ok(read) => read,
        Err(error) => {
            tracing::warn!(%error, parent = parent.shard(), "could not read the closed parent towards its end");
            return None;
        }
    };
    if read.complete {
        return read
            .records
            .iter()
            .map(|record| crate::clock::millis_since_epoch(record.arrival()))
            .max();
    }
    let last = read.records.last().map(|record| record.sequence().clone());
    if let Some(last) = last.filter(|last| start.as_ref().is_none_or(|start| last > start)) {
        let mut commit = KeyCommit::new(row, state.lease_counter);
        commit.reported = ReportedChange::Set(Position::record(last));
        commit.expires_at =
            Some((lineage.clock.now_millis() / 1_000).saturating_add(SCAN_ROW_TTL_SECONDS));
        // Refused: another check wrote it meanwhile; either way the next one reads on.
        if let Err(error) = store.commit_rows(&[commit]).await {
            tracing::warn!(%error, parent = parent.shard(), "could not write how far the closed parent was read towards its end");
        }
    }
    None
}
