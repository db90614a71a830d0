//! The partition-key mode, for event source mappings with `ParallelizationFactor` above 1.
//!
//! With `ParallelizationFactor` N (2 to 10), Lambda runs up to N batches of one shard at once,
//! split by partition key: order holds per key, not per shard. A shard lease would let one of
//! them run and turn the others away, and a shard checkpoint would skip records of other keys
//! that are still running elsewhere. So in this mode ([`PartitionKeyMode`](crate::PartitionKeyMode)) there is no shard
//! lease and no shard checkpoint: every partition key has a row of its own, keyed
//! `stream:shard:partition-key` in the same table, holding the key's checkpoint, its failing
//! record and a TTL. One invocation:
//!
//! 1. Gates the shard: a child shard waits until each parent is finished (see below).
//! 2. Reads the rows of the batch's partition keys ([`CheckpointStore::read_rows`]: 100 per
//!    `BatchGetItem`, read consistently).
//! 3. Skips every record at or below its key's checkpoint, and dispatches the rest one queue per
//!    key (concurrently with [`Processor::concurrency`](crate::Processor::concurrency) above 1,
//!    otherwise one record at a time); a key stops at its first failure, dead letters as in the
//!    shard mode, with attempts counted in the key's row.
//! 4. Writes each key's row whose checkpoint or failing record changed
//!    ([`CheckpointStore::commit_rows`]: 100 per `TransactWriteItems`), each on condition that its
//!    `lease_counter` is still the one read. A row someone else wrote meanwhile (a concurrent
//!    delivery of the same key, which Lambda does not do by design but AWS does not rule out)
//!    is not written: its records are reported and come again, and its checkpoint skips what
//!    the other delivery did.
//! 5. Reports the lowest record not done: Lambda redelivers from it, and every record above it
//!    that is done is skipped by its key's checkpoint. The shard's report carries no
//!    checkpoint: there is none per shard.
//!
//! **A consumer of the whole shard** sharing the table (the seed crate's, keyed `stream:shard`):
//! the shard's own row is read with the keys' rows; a live lease on it holds the batch (nothing
//! runs, the first record is reported), and records at or below its checkpoint are done.
//!
//! **Cost**: with K distinct partition keys in a batch, ⌈(K + 1) / 100⌉ reads (the keys' rows
//! and the shard's) and ⌈K / 100⌉ writes; a batch of 1,000 records over 100 keys costs 3. Keys whose records were all duplicates are not written. Each row
//! written costs twice the write capacity of a plain write (transactions do).
//!
//! **Rows** expire ([`Processor::key_ttl`](crate::Processor::key_ttl), by default 8 days, for a
//! stream retention of 7) after their last write: a key silent for longer than the stream
//! keeps records cannot be redelivered.
//!
//! **The gate**: a parent shard is finished when its shard row says `SHARD_END`, when it has
//! expired from the stream, or when it is closed and every record in it is at or below its
//! key's checkpoint or the parent's own row's checkpoint (read from the stream with
//! [`Topology::read_range`](crate::gate::Topology::read_range), in parts of at most 10,000
//! records per held batch, and checked against the key rows); the gate then writes `SHARD_END`
//! on the parent's row, and remembers it for the life of the process. Until then, it keeps for
//! the life of the process only each key's last position in the parent and the keys found done:
//! a held batch reads no record twice and asks only the keys still pending. A parent still open
//! holds the child.
//!
//! [`CheckpointStore::read_rows`]: crate::store::CheckpointStore::read_rows
//! [`CheckpointStore::commit_rows`]: crate::store::CheckpointStore::commit_rows

use std::collections::HashMap;
use std::time::Duration;

use super::attempt::Runner;
use super::batch::{Entry, ShardBatch, stop_all};
use super::invocation::{Invocation, LeaseWatch};
use super::keyed::{self, Limits, State};
use super::settings::Settings;
use crate::handler::Handler;
use crate::key::{LeaseKey, row_key};
use crate::report::{Disposition, RecordReport, ShardReport, StopReason};
use crate::sequence::{Position, SequenceNumber};
use crate::store::{Below, CheckpointStore, FailingChange, KeyCommit, LeaseState};

/// Gate, read the keys' rows, dispatch, write the rows, report: one shard's records in the
/// partition-key mode.
#[allow(
    clippy::too_many_lines,
    reason = "the steps of one invocation in the partition-key mode, in order, clearer in one place"
)]
pub(crate) async fn run_shard<H: Handler>(
    settings: &Settings<H>,
    group: ShardBatch,
    invocation: &Invocation,
) -> ShardReport {
    let ShardBatch { key, entries } = group;
    let report = ShardReport::empty(key.clone());
    if let Some(gate) = settings.gate.as_deref()
        && let Some(held) = gate
            .check_partition_keys(settings.store.as_ref(), &key)
            .await
    {
        tracing::warn!(%held, "holding the shard back until its parents are finished");
        return stop_all(report, &entries, StopReason::Held(held));
    }

    // The rows of the batch's partition keys, read at once.
    let mut partition_keys: Vec<&str> = entries.iter().filter_map(Entry::partition_key).collect();
    partition_keys.sort_unstable();
    partition_keys.dedup();
    let mut rows: Vec<LeaseKey> = partition_keys
        .iter()
        .map(|partition_key| row_key(&key, partition_key))
        .collect();
    // The shard's own row, in the same read: a container consumer sharing the table (the seed
    // crate's, which keys by `stream:shard`) may hold the shard's lease or have checkpointed it.
    rows.push(key.clone());
    let mut states = match settings.store.read_rows(&rows).await {
        Ok(states) => states,
        Err(error) => {
            tracing::error!(%error, "could not read the partition keys' rows; processing nothing");
            return stop_all(report, &entries, StopReason::Store(error.to_string()));
        }
    };
    rows.pop();
    let shard_row = states.pop().unwrap_or_default();
    let shard_checkpoint = match shard_owner(&shard_row, invocation.now()) {
        Some(owner) => {
            tracing::warn!(
                holder = owner,
                "another consumer holds the shard's lease; processing nothing"
            );
            let owner = Some(owner.to_owned());
            return stop_all(report, &entries, StopReason::LeaseHeld { owner });
        }
        None => match shard_row.position() {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                tracing::error!(%error, "the shard's checkpoint is unreadable; processing nothing");
                return stop_all(
                    report,
                    &entries,
                    StopReason::BadCheckpoint(error.to_string()),
                );
            }
        },
    };
    let mut keys: HashMap<&str, KeyRow> = HashMap::with_capacity(rows.len());
    for ((partition_key, row), state) in partition_keys.iter().zip(rows).zip(states) {
        let checkpoint = match state.position() {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                tracing::error!(%error, row = %row, "a partition key's checkpoint is unreadable; processing nothing");
                return stop_all(
                    report,
                    &entries,
                    StopReason::BadCheckpoint(error.to_string()),
                );
            }
        };
        keys.insert(
            partition_key,
            KeyRow {
                row,
                checkpoint,
                state,
            },
        );
    }

    // Dispatch per key; no lease can be lost, so the watch never lapses.
    let lease = LeaseWatch::new(invocation.now(), Duration::MAX);
    // Done: at or below its key's checkpoint, or below the shard's (a shard consumer's
    // progress covers every key).
    let is_done = |entry: &Entry| {
        entry.routing_key().is_some_and(|partition_key| {
            keys[partition_key]
                .checkpoint
                .iter()
                .chain(&shard_checkpoint)
                .any(|checkpoint| entry.position() <= *checkpoint)
        })
    };
    let known = |partition_key: &str| {
        keys.get(partition_key)
            .and_then(|row| row.state.failing.clone())
    };
    let limits = Limits {
        by_routing_key: true,
        max_in_flight: settings.max_in_flight,
        max_done_above: usize::MAX,
    };
    let runner = Runner {
        settings,
        invocation,
        lease: &lease,
    };
    let mut run = keyed::run(&runner, &entries, &known, &is_done, 0, limits).await;

    let commits = key_commits(&entries, &run, &keys, settings.key_ttl, invocation.now());
    let refused = write(settings.store.as_ref(), &commits).await;
    if !refused.is_empty() {
        // Those keys' records run again when redelivered: mark them so, and report from the
        // first of them if it is lower than the first record not done.
        for (index, state) in run.states.iter_mut().enumerate() {
            let refused_key = entries[index]
                .routing_key()
                .is_some_and(|partition_key| refused.iter().any(|(k, _)| k == partition_key));
            // A dead letter whose row was not written is sent again on redelivery: it is
            // not checkpointed either.
            if refused_key && matches!(state, State::Done(d, _) if d.runs_again_unrecorded()) {
                *state = State::Done(Disposition::Uncheckpointed, false);
            }
        }
    }
    finish(&runner, report, &entries, &run, refused).await
}

/// Who holds the shard's lease, when it is live: a consumer of the whole shard sharing the
/// table (the seed crate's, or this toolkit's shard mode), which processes the shard's records
/// itself.
/// `now` is epoch milliseconds.
pub(crate) fn shard_owner(row: &LeaseState, now: u64) -> Option<&str> {
    row.lease_owner
        .as_deref()
        .filter(|_| row.lease_expiry.is_some_and(|expiry| expiry > now))
}

/// A partition key's row as read.
struct KeyRow {
    row: LeaseKey,
    checkpoint: Option<Position>,
    state: LeaseState,
}

/// The write each key needs: its new checkpoint (the last record of the key done, in order)
/// and the change to its failing record. Keys with nothing to change are left out.
fn key_commits(
    entries: &[Entry],
    run: &keyed::Run,
    keys: &HashMap<&str, KeyRow>,
    ttl: Duration,
    now: u64,
) -> Vec<(String, KeyCommit)> {
    let expires_at = (now / 1_000).saturating_add(ttl.as_secs());
    let mut changes: HashMap<&str, KeyChange> = HashMap::new();
    for (index, (entry, state)) in entries.iter().zip(&run.states).enumerate() {
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
async fn write(
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

/// The shard's report: every record's disposition, and the lowest record not done (or not
/// recorded) as the one reported.
async fn finish<H: Handler>(
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
    report
        .records
        .extend(
            entries
                .iter()
                .zip(run.dispositions(reported))
                .map(|(entry, disposition)| RecordReport {
                    position: entry.position(),
                    disposition,
                }),
        );
    if let Some((index, reason)) = stopped {
        let sequence = entries[index].sequence().clone();
        tracing::info!(%sequence, %reason, "reporting the first record not done");
        report.stopped = Some((sequence, reason));
    }
    report
}
