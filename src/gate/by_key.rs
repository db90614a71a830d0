//! The partition-key mode's parent rule: no shard checkpoint says how far a parent got, so a
//! closed parent is finished once each of its records is at or below its key's checkpoint (or
//! the parent's own row's, written by a consumer of the whole shard). What was read of a parent
//! is kept in [`Scans`] between checks.
//!
//! A parent longer than what one held check reads is read in parts, one per held check, each
//! continuing where the last ended; a part whose keys are all done is recorded in the parent
//! row's checkpoint by the child's invocation ([`KeyVerdict::done_through`]), so that a check
//! in another process reads on after it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::lineage::{Lineage, held_unknown};
use super::parent_scan::{self, ParentScan};
use super::topology::StartingPosition;
use crate::key::LeaseKey;
use crate::report::Held;
use crate::sequence::{Position, SequenceNumber};
use crate::store::{CheckpointStore, LeaseError};

/// What the partition-key mode learnt of closed parents not yet finished.
#[derive(Default)]
pub(super) struct Scans {
    parents: Mutex<HashMap<LeaseKey, ParentScan>>,
}

impl Scans {
    pub(super) fn take(&self, parent: &LeaseKey) -> ParentScan {
        self.parents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(parent)
            .unwrap_or_default()
    }

    pub(super) fn keep(&self, parent: &LeaseKey, scan: ParentScan) {
        self.parents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(parent.clone(), scan);
    }
}

/// The partition-key mode's verdict on a shard.
#[derive(Debug, Default)]
pub(crate) struct KeyVerdict {
    /// `None` when each parent is finished: the shard may run. Why it waits otherwise.
    pub(crate) held: Option<Held>,
    /// A closed parent read in part whose every record up to this one is done, above its row's
    /// checkpoint: the child's invocation records it there, so that a gate in another process
    /// reads on from it instead of from the parent's start (what a gate learns of a parent is
    /// kept in its own process only).
    pub(crate) done_through: Option<(LeaseKey, SequenceNumber)>,
}

/// Whether the shard of `key` may run now in the partition-key mode (see [`KeyVerdict`]). The
/// shard's parents come from the topology (cached per process); a parent is finished when its
/// row says `SHARD_END`, when it has expired, or when it is closed and each of its records is
/// at or below its key's checkpoint; the gate then marks it `SHARD_END`.
pub(super) async fn check(
    lineage: &Lineage,
    scans: &Scans,
    store: &dyn CheckpointStore,
    key: &LeaseKey,
) -> KeyVerdict {
    let held = |held| KeyVerdict {
        held: Some(held),
        ..KeyVerdict::default()
    };
    let parents = match lineage.shard(key.stream(), key.shard(), false).await {
        Ok(Some(info)) => info.parents,
        Ok(None) => {
            return held(Held::Unknown {
                error: format!("shard {} is not listed by the stream", key.shard()),
            });
        }
        Err(error) => return held(held_unknown(&error)),
    };
    for parent in parents {
        let parent = LeaseKey::new(key.stream(), parent.as_str());
        match parent_keys_finished(lineage, scans, store, &parent).await {
            Ok(None) => {}
            Ok(Some(verdict)) => return verdict,
            Err(error) => return held(held_unknown(&error)),
        }
    }
    KeyVerdict::default()
}

/// `None` when `parent` is finished; why the child waits otherwise.
async fn parent_keys_finished(
    lineage: &Lineage,
    scans: &Scans,
    store: &dyn CheckpointStore,
    parent: &LeaseKey,
) -> Result<Option<KeyVerdict>, LeaseError> {
    let (row, info) = match lineage.closed_parent(store, parent).await? {
        Ok(closed) => closed,
        Err(settled) => {
            return Ok(settled.map(|held| KeyVerdict {
                held: Some(held),
                ..KeyVerdict::default()
            }));
        }
    };
    // A consumer of the whole shard sharing the table (the seed crate's) may have
    // checkpointed the parent: its records up to there are done, whatever their key.
    let shard_checkpoint = row.position()?;
    let mut scan = scans.take(parent);
    scan.starting_after(shard_checkpoint.as_ref());
    let verdict = scan_parent(lineage, store, parent, shard_checkpoint.as_ref(), &mut scan).await;
    let empty = scan.ends.is_empty();
    let done_through = scan
        .done_through()
        .filter(|done| {
            shard_checkpoint
                .as_ref()
                .is_none_or(|checkpoint| Position::record((*done).clone()) > *checkpoint)
        })
        .map(|done| (parent.clone(), done.clone()));
    scans.keep(parent, scan);
    if let Some(held) = verdict? {
        return Ok(Some(KeyVerdict {
            held: Some(held),
            done_through,
        }));
    }
    // An empty parent is finished only once its own parents are (see `parent_finished`).
    if empty
        && let Some(verdict) =
            ancestors_finished(lineage, scans, store, parent, &info.parents).await?
    {
        return Ok(Some(verdict));
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

/// Checks the closed `parent`'s keys against their rows, reading on in the parent only when
/// every key known so far is done: `None` once every key of the whole parent is done;
/// otherwise why the child waits.
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
                    waiting = Some(partition_key.clone());
                }
            }
            if let Some(first) = waiting {
                return Ok(Some(Held::Unfinished {
                    parent: parent.shard().to_owned(),
                    checkpoint: Some(parent_scan::describe(&first, &scan.ends[&first])),
                }));
            }
        }
        if scan.complete {
            return Ok(None);
        }
        if read {
            // One part per check: the next held batch reads on.
            let held = Held::Unfinished {
                parent: parent.shard().to_owned(),
                checkpoint: Some(format!(
                    "{} partition keys of the closed parent read so far, all done; reading on",
                    scan.ends.len()
                )),
            };
            return Ok(Some(held));
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
) -> Result<Option<KeyVerdict>, LeaseError> {
    for grandparent in parents {
        let grandparent = LeaseKey::new(of.stream(), grandparent.as_str());
        if let Some(verdict) =
            Box::pin(parent_keys_finished(lineage, scans, store, &grandparent)).await?
        {
            return Ok(Some(verdict));
        }
    }
    Ok(None)
}
