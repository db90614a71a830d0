//! What the partition-key mode writes: each key's row, its checkpoint, failing record and mark,
//! 100 rows per transaction, each on condition of the counter it was read with.

use std::collections::HashMap;
use std::time::Duration;

use super::rows::KeyRow;
use crate::engine::batch::Entry;
use crate::engine::keyed::{self, State};
use crate::key::LeaseKey;
use crate::report::StopReason;
use crate::sequence::{Position, SequenceNumber};
use crate::store::{Below, CheckpointStore, FailingChange, KeyCommit, ReportedChange};

/// The batch whose keys' rows are written: the shard, its entries (the lane's skipped records
/// first), the keys' rows as read, and the rows' TTL from `now` (epoch milliseconds).
pub(super) struct Batch<'a> {
    /// The shard (a transactional commit names it in its token and its errors).
    #[cfg_attr(not(feature = "dynamodb"), allow(dead_code))]
    pub(super) key: &'a LeaseKey,
    pub(super) entries: &'a [Entry],
    pub(super) keys: &'a HashMap<String, KeyRow>,
    pub(super) ttl: Duration,
    pub(super) now: u64,
    /// A part of what the batch's keys may have lost for their age, read before it.
    pub(super) aged_part: Option<AgedPart>,
}

/// A part of a range read only because the batch was old (no mark proved it), its keys' records
/// in it the first `recovered` entries: once every one of them is done, every record of the
/// batch's keys up to `through` (the part's last record before the one the next part starts at,
/// read whether it was theirs or not) is done, and their checkpoints move there, so that the
/// next delivery reads on after it. (A mark there would be no lane's own: the record may be
/// any key's, and another lane's keys may be marked at it.)
pub(super) struct AgedPart {
    pub(super) through: SequenceNumber,
    pub(super) recovered: usize,
}

/// The marks the keys' rows are to carry, for the states a run is in: a record that fails at
/// the commit lowers the record reported, and the marks with it.
pub(super) type Marks<'a> = dyn Fn(&keyed::Run) -> HashMap<String, ReportedChange> + Sync + 'a;

/// [`key_commits`] of `batch`, for the first `states.len()` entries in `states` (the entries
/// after them as not run; they still tell where an aggregate ends).
pub(super) fn key_commits_of(
    batch: &Batch<'_>,
    states: &[State],
    marks: &HashMap<String, ReportedChange>,
) -> Vec<(String, KeyCommit)> {
    let mut commits = key_commits(
        batch.entries,
        states,
        batch.keys,
        marks,
        batch.ttl,
        batch.now,
    );
    if let Some(part) = &batch.aged_part {
        settle_aged_part(&mut commits, batch, states, part);
    }
    commits
}

/// Moves the checkpoint of each of the batch's keys to the end of the aged `part` read, once
/// every record of it run here is done (see [`AgedPart`]).
fn settle_aged_part(
    commits: &mut Vec<(String, KeyCommit)>,
    batch: &Batch<'_>,
    states: &[State],
    part: &AgedPart,
) {
    let done = states.len() >= part.recovered
        && states[..part.recovered]
            .iter()
            .all(|state| matches!(state, State::Done(..)));
    if !done {
        return;
    }
    let through = Position::record(part.through.clone());
    let expires_at = (batch.now / 1_000).saturating_add(batch.ttl.as_secs());
    for (partition_key, row) in batch.keys.iter().filter(|(_, row)| row.in_batch) {
        if row.checkpoint.as_ref().is_some_and(|old| *old >= through) {
            continue;
        }
        let index = commits.iter().position(|(key, _)| key == partition_key);
        let index = index.unwrap_or_else(|| {
            let mut commit = KeyCommit::new(row.row.clone(), row.state.lease_counter);
            commit.expires_at = Some(expires_at);
            commits.push((partition_key.clone(), commit));
            commits.len() - 1
        });
        let commit = &mut commits[index].1;
        if commit
            .checkpoint
            .as_ref()
            .is_none_or(|moved| *moved < through)
        {
            commit.checkpoint = Some(through.clone());
            commit.below = Below::Keep;
        }
    }
    commits.sort_by(|a, b| a.0.cmp(&b.0));
}

/// The write each key needs: its new checkpoint (the last record of the key done, in order),
/// the change to its failing record and to its mark (`marks`, which may name keys without
/// records here). Keys with nothing to change are left out.
pub(super) fn key_commits(
    entries: &[Entry],
    states: &[State],
    keys: &HashMap<String, KeyRow>,
    marks: &HashMap<String, ReportedChange>,
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
    for partition_key in marks.keys() {
        changes.entry(partition_key.as_str()).or_default();
    }
    let mut commits: Vec<(String, KeyCommit)> = changes
        .into_iter()
        .filter_map(|(partition_key, change)| {
            let row = &keys[partition_key];
            let moved = change
                .checkpoint
                .map(|(position, index)| settled_for_key(entries, partition_key, position, index))
                .filter(|new| row.checkpoint.as_ref().is_none_or(|old| new > old));
            let reported = marks.get(partition_key).cloned().unwrap_or_default();
            if moved.is_none()
                && change.failing == FailingChange::Keep
                && reported == ReportedChange::Keep
            {
                return None;
            }
            let mut commit = KeyCommit::new(row.row.clone(), row.state.lease_counter);
            if let Some(moved) = &moved {
                commit.below = Below::of(moved, change.prior.as_ref(), &row.state);
            }
            commit.checkpoint = moved;
            commit.failing = change.failing;
            commit.expires_at = Some(expires_at);
            commit.reported = reported;
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
    match commit_again_once(store, commits).await {
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

/// Writes the keys' rows, again once after a failure (a throttle refuses one request; the marks
/// in these rows are what finds a batch the mapping gives up on). A first write that landed
/// with its answer lost makes the second one refused, as a row written meanwhile is.
async fn commit_again_once(
    store: &dyn CheckpointStore,
    commits: &[(String, KeyCommit)],
) -> Result<Vec<bool>, crate::store::LeaseError> {
    let rows: Vec<KeyCommit> = commits.iter().map(|(_, commit)| commit.clone()).collect();
    let answer = store.commit_rows(&rows).await;
    if let Err(error) = &answer {
        tracing::warn!(%error, "could not write the partition keys' rows; writing them again");
        return store.commit_rows(&rows).await;
    }
    answer
}

/// Writes marks in other keys' rows than the batch's (their records run elsewhere): a row
/// refused (written meanwhile) or a failure is logged, and only the finding the mark was for
/// is lost; nothing of the batch depends on it. Whether every row was written.
pub(super) async fn write_marks(
    store: &dyn CheckpointStore,
    commits: &[(String, KeyCommit)],
) -> bool {
    if commits.is_empty() {
        return true;
    }
    match commit_again_once(store, commits).await {
        Ok(written) => {
            let mut all = true;
            for ((_, commit), _) in commits.iter().zip(written).filter(|(_, written)| !written) {
                all = false;
                tracing::info!(
                    row = %commit.row,
                    "the partition key's row was written meanwhile; it is not marked"
                );
            }
            all
        }
        Err(error) => {
            tracing::warn!(%error, "could not mark the partition keys' rows");
            false
        }
    }
}
