//! A closed parent's tail run by its held child, in the partition-key mode: the gate names a
//! parent none of whose records any invocation of the parent can still run (its youngest record
//! is older than the mapping's record age limit plus the longest batching window and the
//! longest invocation; the rule is the gate's, `gate::by_key`). The child's invocation then
//! claims the parent's shard lease (sibling children of a split, and the child of a merge's
//! two parents, never run it twice at once; another live owner, a consumer of the whole shard,
//! keeps the child held), reads the parent after its row's checkpoint to its end with the one
//! reader of skipped records, filtered to the keys not done when the gate read the whole parent
//! (every record otherwise, deduped by its key's row), runs them per key in order with
//! attempts and dead letters as a batch's, commits the keys' rows, and moves the parent row's
//! checkpoint to the last record before the first one not done (the key mode reads it as done
//! for every key: the next delivery reads on from there), releasing the lease in the same
//! write. A tail run to its end lets the gate find the parent finished and mark it
//! `SHARD_END`; otherwise the child stays held, and its next delivery goes on.

use std::collections::{HashMap, HashSet};

use super::commits::Batch;
use super::finish::finish;
use super::last_write;
use super::rows::{Read, read_keys, run_by_key};
use crate::engine::attempt::Runner;
use crate::engine::batch::Entry;
use crate::engine::invocation::{Invocation, LeaseWatch};
use crate::engine::keyed::{self, State};
use crate::engine::recovery::{Keep, Skipped, Unreadable, read_skipped};
use crate::engine::settings::Settings;
use crate::gate::KeyTail;
use crate::handler::Handler;
use crate::key::LeaseKey;
use crate::report::{Disposition, Held, ShardReport};
use crate::sequence::{Position, SequenceNumber};
use crate::store::{BoxFuture, Claim, Commit, LeaseState, commit_again_once};

/// How many generations of closed parents one invocation runs the tails of, above the delivered
/// shard: a chain of resharding whose every tail the mapping gave up on.
const MAX_TAIL_DEPTH: usize = 3;

/// Gates the shard of `key`, running the tails of closed parents the gate names (one per parent,
/// two at most: a merge): `None` when the shard may run, why it waits otherwise. The tails' reports
/// go to `parents`.
pub(super) async fn gate<H: Handler>(
    settings: &Settings<H>,
    key: &LeaseKey,
    invocation: &Invocation,
    parents: &mut Vec<ShardReport>,
) -> Option<Held> {
    gate_at(settings, key, invocation, parents, 0).await
}

/// [`gate`] for a shard `depth` generations above the delivered one: a parent's tail runs only
/// once its own parents are finished (their tails run first, up to [`MAX_TAIL_DEPTH`]).
fn gate_at<'a, H: Handler>(
    settings: &'a Settings<H>,
    key: &'a LeaseKey,
    invocation: &'a Invocation,
    parents: &'a mut Vec<ShardReport>,
    depth: usize,
) -> BoxFuture<'a, Option<Held>> {
    Box::pin(async move {
        let gate = settings.gate.as_deref()?;
        let mut verdict = gate
            .check_partition_keys(settings.store.as_ref(), key)
            .await;
        while verdict.held.is_some() && parents.len() < 2 && depth < MAX_TAIL_DEPTH {
            let Some(tail) = verdict.tail.take() else {
                break;
            };
            let Some((report, whole)) = run_tail(settings, key, &tail, invocation, depth).await
            else {
                break;
            };
            parents.push(report);
            if !whole {
                break;
            }
            verdict = gate
                .check_partition_keys(settings.store.as_ref(), key)
                .await;
        }
        if verdict.held.is_some()
            && let Some((parent, done)) = &verdict.done_through
        {
            record_done_through(settings, parent, done, invocation).await;
        }
        verdict.held
    })
}

/// Records in the closed `parent`'s row that every record of it up to `done` is done (the
/// gate read it in part and found each key's last record done), under the parent's lease: a
/// gate in another process, which keeps nothing of this one's reading, then reads on after it
/// instead of reading the same first part again on every held delivery. The key mode reads the
/// parent row's checkpoint as done for every key. Two writes per part read; nothing when
/// another owner holds the lease (the next held delivery tries again).
async fn record_done_through<H: Handler>(
    settings: &Settings<H>,
    parent: &LeaseKey,
    done: &SequenceNumber,
    invocation: &Invocation,
) {
    let owner = invocation.owner.as_str();
    let skew = settings.clock_skew.min(settings.lease_ttl / 3);
    let ttl = invocation.lease_ttl(settings.lease_ttl, skew);
    let row = match settings
        .store
        .acquire_and_read(parent, owner, ttl, None)
        .await
    {
        Ok(Claim::Acquired(row)) => row,
        Ok(Claim::Held(_)) => return,
        Err(error) => {
            tracing::warn!(%error, parent = parent.shard(), "could not claim the closed parent's lease to record how far it is done");
            return;
        }
    };
    let done = Position::record(done.clone());
    let checkpoint = row.position().ok().flatten();
    let commit = Commit {
        checkpoint: Some(done).filter(|done| checkpoint.as_ref().is_none_or(|c| done > c)),
        ..Commit::default()
    };
    if let Err(error) = commit_again_once(settings.store.as_ref(), parent, owner, &commit).await {
        tracing::warn!(%error, parent = parent.shard(), "could not record how far the closed parent is done; its lease lapses by itself");
    }
}

/// Claims the parent's lease and runs its tail: `None` when the lease or the records could not
/// be had (logged; the child stays held); otherwise the parent's report, and whether the tail
/// ran to the parent's end.
async fn run_tail<H: Handler>(
    settings: &Settings<H>,
    child: &LeaseKey,
    tail: &KeyTail,
    invocation: &Invocation,
    depth: usize,
) -> Option<(ShardReport, bool)> {
    let parent = &tail.parent;
    // The parent's own parents first: its records come after theirs.
    let mut above = Vec::new();
    if let Some(held) = gate_at(settings, parent, invocation, &mut above, depth + 1).await {
        tracing::info!(%held, parent = parent.shard(), "the closed parent waits for its own parents; the child stays held");
        let mut report = ShardReport::empty(parent.clone());
        report.parents = above;
        return (!report.parents.is_empty()).then_some((report, false));
    }
    let owner = invocation.owner.as_str();
    let skew = settings.clock_skew.min(settings.lease_ttl / 3);
    let ttl = invocation.lease_ttl(settings.lease_ttl, skew);
    let sent = invocation.now();
    let row = match settings
        .store
        .acquire_and_read(parent, owner, ttl, None)
        .await
    {
        Ok(Claim::Acquired(row)) => row,
        Ok(Claim::Held(row)) => {
            tracing::warn!(
                parent = parent.shard(),
                holder = row.lease_owner.as_deref().unwrap_or("unknown"),
                "another owner holds the closed parent's lease; the child stays held"
            );
            return None;
        }
        Err(error) => {
            tracing::warn!(%error, parent = parent.shard(), "could not claim the closed parent's lease; the child stays held");
            return None;
        }
    };
    // No renewal: dispatch stops once the lease's local view lapses, and the next delivery
    // goes on.
    let lease = LeaseWatch::starting_at(sent, ttl, skew);
    let ran = run_claimed(settings, child, tail, &row, invocation, &lease).await;
    let (mut report, complete, done_to) = match ran {
        Some(ran) => ran,
        None => (ShardReport::empty(parent.clone()), false, None),
    };
    report.parents = above;
    let checkpoint = row.position().ok().flatten();
    let commit = Commit {
        checkpoint: done_to.map(Position::record).filter(|done| {
            checkpoint
                .as_ref()
                .is_none_or(|checkpoint| done > checkpoint)
        }),
        ..Commit::default()
    };
    let released = match commit_again_once(settings.store.as_ref(), parent, owner, &commit).await {
        Ok(written) => written,
        Err(error) => {
            tracing::warn!(%error, parent = parent.shard(), "could not release the closed parent's lease; it lapses by itself");
            false
        }
    };
    let whole = complete && released && report.stopped.is_none();
    Some((report, whole))
}

/// Reads and runs the tail under the parent's lease: the report, whether every record of the
/// parent was read, and the last record up to which every record read is done. `None` when
/// nothing could be read.
async fn run_claimed<H: Handler>(
    settings: &Settings<H>,
    child: &LeaseKey,
    tail: &KeyTail,
    row: &LeaseState,
    invocation: &Invocation,
    lease: &LeaseWatch,
) -> Option<(ShardReport, bool, Option<SequenceNumber>)> {
    let skipped = read(settings, child, tail, invocation).await?;
    let complete = skipped.complete && skipped.rest.is_empty();
    let report = run_keys(
        settings,
        &tail.parent,
        &skipped.entries,
        row,
        (invocation, lease),
    )
    .await?;
    let done_to = match &report.stopped {
        // Every record before the first not done is done whole.
        Some((first, _)) => skipped
            .entries
            .iter()
            .map(Entry::sequence)
            .filter(|sequence| *sequence < first)
            .max()
            .cloned(),
        // Every record read is done, those filtered out too.
        None => skipped.read_to,
    };
    Some((report, complete, done_to))
}

/// Reads the tail after the parent row's checkpoint to its end, filtered to its keys not done.
async fn read<H>(
    settings: &Settings<H>,
    child: &LeaseKey,
    tail: &KeyTail,
    invocation: &Invocation,
) -> Option<Skipped> {
    let KeyTail {
        parent,
        keys: waiting,
        range,
    } = tail;
    // With the keys not done known, only theirs; otherwise every record, deduped by its key's
    // row when it runs.
    let waiting: Option<HashSet<&str>> = waiting
        .as_ref()
        .map(|keys| keys.iter().map(String::as_str).collect());
    let filter = |entry: &Entry| {
        entry.routing_key().is_some_and(|partition_key| {
            waiting
                .as_ref()
                .is_none_or(|waiting| waiting.contains(partition_key))
        })
    };
    let keep = Keep {
        older_than: None,
        filter: &filter,
    };
    let skipped = match read_skipped(settings, parent, range, invocation, keep).await {
        Ok(skipped) => skipped,
        Err(Unreadable::NoReader) => return None,
        Err(Unreadable::Failed(error)) => {
            tracing::warn!(%error, parent = parent.shard(), %range, "could not read the closed parent's tail; the child stays held");
            return None;
        }
    };
    tracing::info!(
        stream = parent.stream(),
        parent = parent.shard(),
        child = child.shard(),
        %range,
        records = skipped.entries.len(),
        complete = skipped.complete && skipped.rest.is_empty(),
        "a closed parent's tail holds a child and no invocation of the parent can run it any more (older than the record age limit, the longest batching window and the longest invocation): running it under the parent's lease"
    );
    Some(skipped)
}

/// Runs `entries` of the closed `parent` (whose row is `row`) per key in order, dedupe by the
/// keys' rows and the parent row's checkpoint, and writes the keys' rows: the parent's report.
/// `None` when the keys' rows could not be read.
async fn run_keys<H: Handler>(
    settings: &Settings<H>,
    parent: &LeaseKey,
    entries: &[Entry],
    row: &LeaseState,
    (invocation, lease): (&Invocation, &LeaseWatch),
) -> Option<ShardReport> {
    let shard_checkpoint = row.position().ok().flatten();
    let Ok(Read { keys, .. }) = read_keys(settings.store.as_ref(), parent, entries, None).await
    else {
        tracing::warn!(
            parent = parent.shard(),
            "could not read the closed parent's keys' rows; the child stays held"
        );
        return None;
    };
    #[cfg(feature = "dynamodb")]
    let staged = crate::engine::attempt::Staged::default();
    let runner = Runner {
        settings,
        invocation,
        lease,
        #[cfg(feature = "dynamodb")]
        staged: Some(&staged),
    };
    let mut run = run_by_key(&runner, entries, &keys, shard_checkpoint.as_ref()).await;
    let batch = Batch {
        key: parent,
        entries,
        keys: &keys,
        ttl: settings.key_ttl,
        now: invocation.now(),
        aged_part: None,
    };
    // The parent's lanes are delivered no more: the keys' marks stay as they are.
    let marks = |_: &keyed::Run| HashMap::new();
    let refused = last_write::commit(&runner, &batch, &mut run, &marks).await;
    if !refused.is_empty() && !settings.transactional {
        for (entry, state) in entries.iter().zip(run.states.iter_mut()) {
            let refused_key = entry
                .routing_key()
                .is_some_and(|partition_key| refused.iter().any(|(k, _)| k == partition_key));
            if refused_key && matches!(state, State::Done(d, _) if d.runs_again_unrecorded()) {
                *state = State::Done(Disposition::Uncheckpointed, false);
            }
        }
    }
    let report = finish(
        &runner,
        ShardReport::empty(parent.clone()),
        entries,
        &run,
        refused,
        0,
        None,
    )
    .await;
    Some(report)
}
