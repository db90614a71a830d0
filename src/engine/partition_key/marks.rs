//! The marks a partition-key batch writes in its keys' rows: where each key's lane was last
//! reported (the rules are [`gap::keys`](crate::gap::keys)). Written in the batch's last write
//! ([`marks`]), before anything runs when the mapping may give up on the batch
//! ([`mark_early`]), and by a batch that runs nothing ([`mark_held`]); what a later batch of the
//! lane reads them for is in `gaps`.

use std::collections::{HashMap, HashSet};

use super::commits::{write, write_marks};
use super::rows::KeyRow;
use crate::engine::batch::Entry;
use crate::engine::settings::Settings;
use crate::gap::keys::{held_mark, kept_mark, next_mark};
use crate::key::LeaseKey;
use crate::sequence::Position;
use crate::store::{KeyCommit, ReportedChange};

/// Each key's new mark once the batch ran (see [`next_mark`]): `reported` is the batch's
/// record reported to Lambda, if any. `pending` is the first record of what the lane skipped
/// that is not done (or not read yet), while there is one: every key read here (the batch's,
/// and those of the lane found in the range) is then marked there, so that whichever of them
/// comes next reads on from it, even after the mapping gave up on this batch too. While the
/// lane's range is read in parts (`in_parts`: the marks that proved it), each key keeps its
/// mark instead (see [`kept_mark`]): the lane's rows say where the reading goes on.
pub(super) fn marks(
    keys: &HashMap<String, KeyRow>,
    batch: &[Entry],
    pending: Option<&Position>,
    reported: Option<&Position>,
    in_parts: Option<&[Position]>,
) -> HashMap<String, ReportedChange> {
    let again: HashSet<&str> = reported.map_or_else(HashSet::new, |reported| {
        batch
            .iter()
            .filter(|entry| entry.position() >= *reported)
            .filter_map(Entry::routing_key)
            .collect()
    });
    keys.iter()
        .map(|(partition_key, row)| {
            let comes_again = row.in_batch && again.contains(partition_key.as_str());
            let old = row.state.reported.as_ref();
            let keep = match in_parts {
                Some(marks) => kept_mark(old, marks),
                None => pending,
            };
            (
                partition_key.clone(),
                next_mark(old, keep, reported, comes_again),
            )
        })
        .filter(|(_, change)| *change != ReportedChange::Keep)
        .collect()
}

/// Marks each key of a held batch at its first record (see [`held_mark`]), so that a batch of
/// the lane after the mapping gave up on this one finds what it skipped. One write, only when
/// a mark changes; a failure is logged, and costs only that finding.
pub(super) async fn mark_held<H>(
    settings: &Settings<H>,
    keys: &HashMap<String, KeyRow>,
    first: &Position,
    now: u64,
) {
    let commits = held_marks(settings, keys, first, now);
    // A row written meanwhile is logged by `write`; nothing else depends on it.
    let _refused = write(settings.store.as_ref(), &commits).await;
}

/// Marks each key read (the batch's, and those of the lane found in a skipped range) at the
/// first of `entries` not done, before anything runs (see [`held_mark`]): only when
/// the gate knows the mapping may give up on a batch (finite `MaximumRetryAttempts`, or a
/// record age). An invocation that dies on every delivery (out of memory, killed at its
/// time-out) never makes its last write; these marks are what the lane's next batch then
/// finds. One write per 100 keys whose mark changes (none on a redelivery: the keys are marked
/// there already). The rows written are updated in `keys` (their counter and mark), so that
/// the batch's last write expects them. A row refused here (another writer changed it since
/// it was read) is read again into `keys` and marked once more (one `BatchGetItem` and one
/// write more, only then); refused twice, it is refused by the last write too, and its records
/// reported.
pub(super) async fn mark_early<H>(
    settings: &Settings<H>,
    keys: &mut HashMap<String, KeyRow>,
    entries: &[Entry],
    shard_checkpoint: Option<&Position>,
    now: u64,
) {
    if !settings
        .gate
        .as_deref()
        .is_some_and(crate::gate::Gate::discards)
    {
        return;
    }
    // A batch done whole (a duplicate delivery) runs nothing, and writes nothing.
    let done = |entry: &Entry| {
        entry
            .routing_key()
            .and_then(|partition_key| keys.get(partition_key))
            .is_some_and(|row| {
                row.checkpoint
                    .iter()
                    .chain(shard_checkpoint)
                    .any(|checkpoint| entry.position() <= *checkpoint)
            })
    };
    let Some(first) = entries
        .iter()
        .find(|entry| !done(entry))
        .map(Entry::position)
    else {
        return;
    };
    let commits = held_marks(settings, keys, &first, now);
    if commits.is_empty() {
        return;
    }
    let refused = mark_rows(settings, keys, &commits).await;
    if refused.is_empty() {
        return;
    }
    // Another writer changed those rows since they were read (a batch of another lane marking
    // keys it found in a range it read, or a concurrent delivery): read again and marked once
    // more. A key left unmarked here would run, and if the invocation then died and the mapping
    // gave up on the batch, nothing would say where its lane stood.
    if reread(settings, keys, &refused).await {
        let again: Vec<(String, KeyCommit)> = held_marks(settings, keys, &first, now)
            .into_iter()
            .filter(|(partition_key, _)| refused.iter().any(|key| key == partition_key))
            .collect();
        let _still_refused = mark_rows(settings, keys, &again).await;
    }
}

/// Writes the marks of `commits` and updates the rows in `keys` that took them (their counter,
/// mark and expiry), so that the batch's last write expects them; returns the keys whose rows
/// refused them.
async fn mark_rows<H>(
    settings: &Settings<H>,
    keys: &mut HashMap<String, KeyRow>,
    commits: &[(String, KeyCommit)],
) -> Vec<String> {
    let mut refused = write(settings.store.as_ref(), commits).await;
    if !refused.is_empty() {
        refused = landed_meanwhile(settings, commits, refused).await;
    }
    for (partition_key, commit) in commits {
        if refused.iter().any(|(key, _)| key == partition_key) {
            continue;
        }
        if let Some(row) = keys.get_mut(partition_key) {
            row.state.lease_counter = commit.expected_counter + 1;
            if let ReportedChange::Set(mark) = &commit.reported {
                row.state.reported = Some(mark.clone());
            }
            if commit.expires_at.is_some() {
                row.state.expires_at = commit.expires_at;
            }
        }
    }
    refused.into_iter().map(|(key, _)| key).collect()
}

/// Reads the rows of the `refused` keys again into `keys` (their state and checkpoint as they
/// are now). `false` when the reading fails or a checkpoint read is unusable: the rows stay as
/// first read, and the batch's last write refuses them.
async fn reread<H>(
    settings: &Settings<H>,
    keys: &mut HashMap<String, KeyRow>,
    refused: &[String],
) -> bool {
    let rows: Vec<LeaseKey> = refused
        .iter()
        .filter_map(|partition_key| keys.get(partition_key).map(|row| row.row.clone()))
        .collect();
    let Ok(states) = settings.store.read_rows(&rows).await else {
        return false;
    };
    let mut fresh = Vec::with_capacity(states.len());
    for (partition_key, state) in refused.iter().zip(states) {
        let Ok(checkpoint) = state.position() else {
            return false;
        };
        fresh.push((partition_key, state, checkpoint));
    }
    for (partition_key, state, checkpoint) in fresh {
        if let Some(row) = keys.get_mut(partition_key) {
            row.state = state;
            row.checkpoint = checkpoint;
        }
    }
    true
}

/// Marks each key of `strangers` at its record given beside it: a key found in a range the
/// lane skipped that is neither the batch's nor the lane's by its mark, not done at that
/// record (see [`held_mark`]: not when its mark is lower). Its lane may be another one, still
/// to deliver the record (the mark then proves nothing, and that delivery removes it), or this
/// one, which passed it: the key's next batch, starting after the mark, then proves the range
/// and runs the record first. One write per 100 keys whose mark changes; a row refused (its
/// lane's invocation wrote it meanwhile) or a failure is logged, and costs only that finding.
pub(super) async fn mark_strangers<H>(
    settings: &Settings<H>,
    strangers: &[(KeyRow, Position)],
    now: u64,
) -> bool {
    let expires_at = (now / 1_000).saturating_add(settings.key_ttl.as_secs());
    let commits: Vec<(String, KeyCommit)> = strangers
        .iter()
        .filter_map(|(row, first)| {
            mark_at(row, first, expires_at).map(|commit| (row.row.to_string(), commit))
        })
        .collect();
    if !commits.is_empty() {
        tracing::info!(
            keys = commits.len(),
            "marking the partition keys of a skipped range that are neither the batch's nor its lane's, at their first record not done"
        );
    }
    write_marks(settings.store.as_ref(), &commits).await
}

/// The write that marks `row` at `first` (see [`held_mark`]), when its mark changes.
fn mark_at(row: &KeyRow, first: &Position, expires_at: u64) -> Option<KeyCommit> {
    let change = held_mark(row.state.reported.as_ref(), first);
    (change != ReportedChange::Keep).then(|| {
        let mut commit = KeyCommit::new(row.row.clone(), row.state.lease_counter);
        commit.reported = change;
        commit.expires_at = Some(expires_at.max(row.state.expires_at.unwrap_or(0)));
        commit
    })
}

/// Of the `refused` rows of `commits`, those another writer changed: a row that holds exactly
/// this write (the mark, one counter more) is ours, written by a first try whose answer was
/// lost (the second try is then refused). Read once; when that fails, all stay refused.
async fn landed_meanwhile<H>(
    settings: &Settings<H>,
    commits: &[(String, KeyCommit)],
    refused: Vec<(String, crate::report::StopReason)>,
) -> Vec<(String, crate::report::StopReason)> {
    let tried: Vec<&KeyCommit> = refused
        .iter()
        .filter_map(|(partition_key, _)| {
            commits
                .iter()
                .find(|(key, _)| key == partition_key)
                .map(|(_, commit)| commit)
        })
        .collect();
    let rows: Vec<LeaseKey> = tried.iter().map(|commit| commit.row.clone()).collect();
    let Ok(states) = settings.store.read_rows(&rows).await else {
        return refused;
    };
    refused
        .into_iter()
        .zip(tried.into_iter().zip(states))
        .filter(|(_, (commit, state))| {
            let ours = state.lease_counter == commit.expected_counter + 1
                && matches!(&commit.reported, ReportedChange::Set(mark) if state.reported.as_ref() == Some(mark));
            !ours
        })
        .map(|(refused, _)| refused)
        .collect()
}

/// The writes that mark each key of `keys` at `first` (see [`held_mark`]), in key order.
fn held_marks<H>(
    settings: &Settings<H>,
    keys: &HashMap<String, KeyRow>,
    first: &Position,
    now: u64,
) -> Vec<(String, KeyCommit)> {
    let expires_at = (now / 1_000).saturating_add(settings.key_ttl.as_secs());
    let mut commits: Vec<(String, KeyCommit)> = keys
        .iter()
        .filter_map(|(partition_key, row)| {
            mark_at(row, first, expires_at).map(|commit| (partition_key.clone(), commit))
        })
        .collect();
    commits.sort_by(|a, b| a.0.cmp(&b.0));
    commits
}
