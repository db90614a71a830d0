//! What the partition-key mode writes: each key's row, its checkpoint and failing record, 100
//! rows per transaction, each on condition of the counter it was read with.

use std::collections::HashMap;
use std::time::Duration;

use super::rows::KeyRow;
use crate::engine::batch::Entry;
use crate::engine::keyed::State;
use crate::key::LeaseKey;
use crate::report::StopReason;
use crate::sequence::{Position, SequenceNumber};
use crate::store::{Below, CheckpointStore, FailingChange, KeyCommit};

/// The batch whose keys' rows are written: the shard, its entries, the keys' rows as read, and
/// the rows' TTL from `now` (epoch milliseconds).
pub(super) struct Batch<'a> {
    /// The shard (a transactional commit names it in its token and its errors).
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    pub(super) key: &'a LeaseKey,
    pub(super) entries: &'a [Entry],
    pub(super) keys: &'a HashMap<String, KeyRow>,
    pub(super) ttl: Duration,
    pub(super) now: u64,
}

/// [`key_commits`] of `batch`, for the first `states.len()` entries in `states` (the entries
/// after them as not run; they still tell where an aggregate ends).
pub(super) fn key_commits_of(batch: &Batch<'_>, states: &[State]) -> Vec<(String, KeyCommit)> {
    key_commits(batch.entries, states, batch.keys, batch.ttl, batch.now)
}

/// The write each key needs: its new checkpoint (the last record of the key done, in order) and
/// the change to its failing record. Keys with nothing to change are left out.
pub(super) fn key_commits(
    entries: &[Entry],
    states: &[State],
    keys: &HashMap<String, KeyRow>,
    ttl: Duration,
    now: u64,
) -> Vec<(String, KeyCommit)> {
    let expires_at = (now / 1_000).saturating_add(ttl.as_secs());
    let mut changes: HashMap<&str, KeyChange> = HashMap::new();
    for (index, (entry, state)) in entries.iter().zip(states).enumerate() {
        let Some(partition_key) = entry.routing_key() else {
            continue;
        };
        let KeyChange {
            checkpoint,
            prior,
            failing,
            stopped,
        } = changes.entry(partition_key).or_default();
        match state {
            State::Done(_, cleared) if !*stopped => {
                // The key's records of an earlier aggregate (or an earlier record) are all
                // done once a later one of the key is: that record is done whole for the key.
                if let Some((_, done)) = checkpoint.as_ref()
                    && entries[*done].sequence() != entry.sequence()
                {
                    *prior = Some(entries[*done].sequence().clone());
                }
                *checkpoint = Some((entry.position(), index));
                if *cleared {
                    *failing = FailingChange::Clear;
                }
            }
            State::Failed {
                counted: Some(counted),
                ..
            } if !*stopped => {
                *failing = FailingChange::Set(counted.clone());
                *stopped = true;
            }
            _ => *stopped = true,
        }
    }
    let mut commits: Vec<(String, KeyCommit)> = changes
        .into_iter()
        .filter_map(|(partition_key, change)| {
            let row = &keys[partition_key];
            let moved = change
                .checkpoint
                .map(|(position, index)| settled_for_key(entries, partition_key, position, index))
                .filter(|new| row.checkpoint.as_ref().is_none_or(|old| new > old));
            if moved.is_none() && change.failing == FailingChange::Keep {
                return None;
            }
            let mut commit = KeyCommit::new(row.row.clone(), row.state.lease_counter);
            if let Some(moved) = &moved {
                commit.below = Below::of(moved, change.prior.as_ref(), &row.state);
            }
            commit.checkpoint = moved;
            commit.failing = change.failing;
            commit.expires_at = Some(expires_at);
            Some((partition_key.to_owned(), commit))
        })
        .collect();
    commits.sort_by(|a, b| a.0.cmp(&b.0));
    commits
}

/// What one key's row is to record, as the batch is walked.
#[derive(Default)]
struct KeyChange {
    /// The key's last record done in order, and its index in the batch.
    checkpoint: Option<(Position, usize)>,
    /// The record done whole for the key before the aggregate `checkpoint` lies in.
    prior: Option<SequenceNumber>,
    failing: FailingChange,
    stopped: bool,
}

/// `position` (of the entry at `index`), or its whole aggregate when no later sub-record of the
/// aggregate belongs to `partition_key`: then every record of the key in it is done, and the
/// key's row says so as a whole record. An aggregate's sub-records are adjacent in `entries`.
fn settled_for_key(
    entries: &[Entry],
    partition_key: &str,
    position: Position,
    index: usize,
) -> Position {
    let Position::Record {
        sequence,
        sub_sequence: Some(_),
    } = &position
    else {
        return position;
    };
    let more_of_key = entries[index + 1..]
        .iter()
        .take_while(|entry| entry.sequence() == sequence)
        .any(|entry| entry.routing_key() == Some(partition_key));
    if more_of_key {
        position
    } else {
        Position::record(sequence.clone())
    }
}

/// Writes the keys' rows; returns the keys whose row was not written, and why.
pub(super) async fn write(
    store: &dyn CheckpointStore,
    commits: &[(String, KeyCommit)],
) -> Vec<(String, StopReason)> {
    if commits.is_empty() {
        return Vec::new();
    }
    let rows: Vec<KeyCommit> = commits.iter().map(|(_, commit)| commit.clone()).collect();
    match store.commit_rows(&rows).await {
        Ok(written) => commits
            .iter()
            .zip(written)
            .filter(|(_, written)| !written)
            .map(|((partition_key, commit), _)| {
                tracing::error!(
                    row = %commit.row,
                    "another invocation wrote the partition key's row meanwhile; its records are reported"
                );
                (partition_key.clone(), StopReason::CheckpointFenced)
            })
            .collect(),
        Err(error) => {
            tracing::error!(%error, "could not write the partition keys' rows; reporting their records");
            commits
                .iter()
                .map(|(partition_key, _)| {
                    (
                        partition_key.clone(),
                        StopReason::CheckpointFailed(error.to_string()),
                    )
                })
                .collect()
        }
    }
}
