//! The partition-key mode's parent rule: no shard checkpoint says how far a parent got, so a
//! closed parent is finished once each of its records is at or below its key's checkpoint (or
//! the parent's own row's, written by a consumer of the whole shard). What was read of a parent
//! is kept in [`Scans`] between checks.
//!
//! A held child never runs a closed parent's records here, unlike the shard mode's parent tail
//! recovery: no lease fences a parent key's lane, so nothing proves that no invocation of the
//! lane runs them now. The mapping's retry schedule is not visible, AWS does not say that the
//! mapping finishes a parent before delivering its children, and a later batch of the lane
//! runs the marked range through its own gap recovery, old records included. A parent whose
//! every record is older than the mapping's record age limit plus the longest invocation
//! (15 minutes) and the longest batching window (5 minutes) has no invocation left that could
//! run them; running such a parent from a child (under the parent's shard lease, against
//! sibling children) would be sound, and is not built. So a parent's discarded tail holds its
//! children until the parent expires from the stream (the README's "Not covered").

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::lineage::{Lineage, held_unknown};
use super::parent_scan::{self, ParentScan};
use super::topology::StartingPosition;
use crate::key::LeaseKey;
use crate::report::Held;
use crate::sequence::Position;
use crate::store::{CheckpointStore, LeaseError};

/// What the partition-key mode learnt of closed parents not yet finished.
#[derive(Default)]
pub(super) struct Scans(Mutex<HashMap<LeaseKey, ParentScan>>);

impl Scans {
    pub(super) fn take(&self, parent: &LeaseKey) -> ParentScan {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(parent)
            .unwrap_or_default()
    }

    pub(super) fn keep(&self, parent: &LeaseKey, scan: ParentScan) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(parent.clone(), scan);
    }
}

/// Whether the shard of `key` may run now in the partition-key mode: `None` when each parent
/// is finished, why the child waits otherwise. The shard's parents come from the topology
/// (cached per process); a parent is finished when its row says `SHARD_END`, when it has
/// expired, or when it is closed and each of its records is at or below its key's
/// checkpoint; the gate then marks it `SHARD_END`.
pub(super) async fn check(
    lineage: &Lineage,
    scans: &Scans,
    store: &dyn CheckpointStore,
    key: &LeaseKey,
) -> Option<Held> {
    let parents = match lineage.shard(key.stream(), key.shard(), false).await {
        Ok(Some(info)) => info.parents,
        Ok(None) => {
            return Some(Held::Unknown {
                error: format!("shard {} is not listed by the stream", key.shard()),
            });
        }
        Err(error) => return Some(held_unknown(&error)),
    };
    for parent in parents {
        let parent = LeaseKey::new(key.stream(), parent.as_str());
        match parent_keys_finished(lineage, scans, store, &parent).await {
            Ok(None) => {}
            Ok(Some(held)) => return Some(held),
            Err(error) => return Some(held_unknown(&error)),
        }
    }
    None
}

async fn parent_keys_finished(
    lineage: &Lineage,
    scans: &Scans,
    store: &dyn CheckpointStore,
    parent: &LeaseKey,
) -> Result<Option<Held>, LeaseError> {
    let (row, info) = match lineage.closed_parent(store, parent).await? {
        Ok(closed) => closed,
        Err(settled) => return Ok(settled),
    };
    // A consumer of the whole shard sharing the table (the seed crate's) may have
    // checkpointed the parent: its records up to there are done, whatever their key.
    let shard_checkpoint = row.position()?;
    let mut scan = scans.take(parent);
    let verdict = scan_parent(lineage, store, parent, shard_checkpoint.as_ref(), &mut scan).await;
    let empty = scan.ends.is_empty();
    scans.keep(parent, scan);
    if let Some(held) = verdict? {
        return Ok(Some(held));
    }
    // An empty parent is finished only once its own parents are (see `parent_finished`).
    if empty
        && let Some(held) = ancestors_finished(lineage, scans, store, parent, &info.parents).await?
    {
        return Ok(Some(held));
    }
    lineage
        .finish(store, parent, row.checkpoint.as_deref())
        .await?;
    if lineage.is_finished(parent) {
        // Finished stays finished: what was learnt of it is no longer needed.
        scans.take(parent);
    }
    Ok(None)
}

/// Checks the closed `parent`'s keys against their rows, reading on in the parent only
/// when every key known so far is done: `None` once every key of the whole parent is.
async fn scan_parent(
    lineage: &Lineage,
    store: &dyn CheckpointStore,
    parent: &LeaseKey,
    shard_checkpoint: Option<&Position>,
    scan: &mut ParentScan,
) -> Result<Option<Held>, LeaseError> {
    let mut read = false;
    loop {
        let pending: Vec<String> = scan.pending().into_iter().map(str::to_owned).collect();
        if !pending.is_empty() {
            let rows: Vec<LeaseKey> = pending
                .iter()
                .map(|partition_key| crate::key::row_key(parent, partition_key))
                .collect();
            let states = store.read_rows(&rows).await?;
            let mut waiting = None;
            for (partition_key, state) in pending.iter().zip(&states) {
                let end = &scan.ends[partition_key];
                let done = state
                    .position()?
                    .iter()
                    .chain(shard_checkpoint)
                    .any(|checkpoint| end <= checkpoint);
                // A key never read here may never come when the mapping does not start
                // at the horizon; at the horizon it will.
                let never_read = state.lease_counter == 0;
                if done {
                    scan.done.insert(partition_key.clone());
                } else if waiting.is_none()
                    && (!never_read || lineage.starting_position == StartingPosition::TrimHorizon)
                {
                    waiting = Some(parent_scan::describe(partition_key, end));
                }
            }
            if let Some(waiting) = waiting {
                return Ok(Some(Held::Unfinished {
                    parent: parent.shard().to_owned(),
                    checkpoint: Some(waiting),
                }));
            }
        }
        if scan.complete {
            return Ok(None);
        }
        if read {
            // One part per check: the next held batch reads on.
            return Ok(Some(Held::Unfinished {
                parent: parent.shard().to_owned(),
                checkpoint: Some(format!(
                    "{} partition keys of the closed parent read so far, all done; reading on",
                    scan.ends.len()
                )),
            }));
        }
        scan.read_on(lineage.topology.as_ref(), parent).await?;
        read = true;
    }
}

/// `None` when every one of `parents` (of the shard `of`) is finished by its keys; why it
/// waits otherwise.
async fn ancestors_finished(
    lineage: &Lineage,
    scans: &Scans,
    store: &dyn CheckpointStore,
    of: &LeaseKey,
    parents: &[String],
) -> Result<Option<Held>, LeaseError> {
    for grandparent in parents {
        let grandparent = LeaseKey::new(of.stream(), grandparent.as_str());
        if let Some(held) =
            Box::pin(parent_keys_finished(lineage, scans, store, &grandparent)).await?
        {
            return Ok(Some(held));
        }
    }
    Ok(None)
}
