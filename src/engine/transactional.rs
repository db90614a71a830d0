//! The shard mode's last write with a transactional handler: the records' writes committed
//! with the checkpoint, in as few `TransactWriteItems` as the service's limits allow.
//!
//! Dispatch ran the handler over the records and kept each done record's writes
//! ([`Staged`](super::attempt::Staged)); nothing of them is written yet. Here they are cut into
//! chunks, in order ([`next_chunk`](crate::effects)): each chunk is one transaction of its
//! records' writes and the lease row's update, on condition that the lease is still ours.
//! A chunk before the last moves the checkpoint to its last record and keeps the lease; the
//! last carries everything the invocation's last write carries
//! (`ready::last_write`) and releases it. A batch whose records wrote
//! nothing sends the plain last write, as a processor of a plain handler does. A chunk before
//! the last also writes `reported` at the first record it leaves: the next chunk may fail or
//! the invocation die, and a later batch must still prove the rest skipped (see
//! `outstanding_after`).
//!
//! A write refused by its own condition cancels its transaction, so nothing of it lands. The
//! record it belongs to is that failure: the chunk is cut before it and sent again, and the
//! record is treated as its [`OnConditionFailed`](crate::effects::OnConditionFailed) says, through the attempt runner, like any
//! failure: retried (reported, its attempts counted, dead-lettered once out of them) or
//! rejected (dead-lettered, and the records after it go on). A record whose writes break a
//! limit on their own can never commit and is rejected the same way.
//!
//! Under per-key concurrency, a record done above the first record not done is remembered in
//! the row (`done_above`) only when it wrote nothing: one with writes is not committed (its
//! writes cannot be, with the checkpoint behind it), so it runs again on redelivery.

use std::collections::BTreeMap;

use super::attempt::{Failing, Runner};
use super::batch::{Entry, prior, settled};
use super::ordered::{self, Committed, Dispatched};
use super::refused::refusal;
use crate::effects::{Room, TooLarge, Write, Writes, next_chunk, token};
use crate::handler::Handler;
use crate::key::LeaseKey;
use crate::report::{Disposition, StopReason};
use crate::sequence::Position;
use crate::store::{
    Below, Commit, FailingChange, FailingRecord, LeaseState, ReportedChange, Transacted,
    Transaction,
};

/// The room a transaction has beside the lease row's update, whose expressions and values
/// (a failing record's error, up to its cap; the records done above the checkpoint) are
/// bounded well below this.
const LEASE_ACTION_BYTES: usize = 256 * 1024;

/// The shard whose records are committed, as the shard mode read it.
pub(crate) struct Shard<'a> {
    pub(crate) key: &'a LeaseKey,
    pub(crate) owner: &'a str,
    /// The row as the claim read it: its counter names the claim in the request tokens.
    pub(crate) state: &'a LeaseState,
    /// Every entry of the batch, for where a checkpoint settles.
    pub(crate) entries: &'a [Entry],
    /// The entries dispatched, which `dispatched` describes.
    pub(crate) pending: &'a [Entry],
}

/// Commits the records' `staged` writes with the checkpoint and the last write (`last`), in
/// chunks; returns what the shard mode's plain last write returns.
pub(crate) async fn commit<H: Handler>(
    runner: &Runner<'_, H>,
    shard: &Shard<'_>,
    mut staged: BTreeMap<Position, Writes>,
    mut dispatched: Dispatched,
    last: &(dyn Fn(&Dispatched) -> (Option<Position>, Commit) + Sync),
) -> Committed {
    let Shard { state, pending, .. } = *shard;
    let mut done = dispatched.done_through.as_ref().map_or(0, |through| {
        pending.partition_point(|entry| entry.cmp_position(through).is_le())
    });
    drop_done_above(&mut staged, &mut dispatched, pending, done);
    // Records before `start` are committed; `checkpointed` is where their last chunk left the
    // checkpoint; `revision` tells apart the transactions of one range re-planned after a
    // refusal, which must not share a request token.
    let mut start = 0;
    let mut checkpointed = None;
    let mut revision = 0_u32;
    // Whether a chunk committed moved the row's `reported` (see `outstanding_after`).
    let mut moved_reported = false;
    'chunks: loop {
        let (index, reason, rejected) = 'refused: {
            match plan(shard, &staged, (start, done), &dispatched, last) {
                Err(too_large) => {
                    // Alone it breaks a limit: it can never commit.
                    staged.remove(&pending[start].position());
                    (start, StopReason::Rejected(too_large.to_string()), true)
                }
                Ok(mut chunk) => {
                    if chunk.is_last && moved_reported {
                        restored(state, &mut chunk.commit.reported);
                    }
                    let sets_reported = matches!(chunk.commit.reported, ReportedChange::Set(_));
                    let stop = match send(runner, shard, chunk.transaction(shard, start, revision))
                        .await
                    {
                        Ok(Transacted::Committed) if chunk.is_last => {
                            let checkpoint = chunk.progress.or(checkpointed);
                            return (dispatched.dispositions, dispatched.stopped, checkpoint);
                        }
                        Ok(Transacted::Committed) => {
                            checkpointed = chunk.progress;
                            start = chunk.end;
                            moved_reported |= sets_reported;
                            continue 'chunks;
                        }
                        Ok(Transacted::Refused { action, reason }) => {
                            let entries = (shard.pending, shard.key);
                            break 'refused refusal(
                                entries,
                                &mut staged,
                                &chunk.owners,
                                action,
                                &reason,
                            );
                        }
                        Ok(Transacted::Fenced) => StopReason::CheckpointFenced,
                        Err(error) => StopReason::CheckpointFailed(error.to_string()),
                    };
                    let stopped = (start, checkpointed);
                    return give_up(runner, shard, dispatched, last, stopped, stop).await;
                }
            }
        };
        let known = state.failing.as_ref();
        let cut = refuse(
            runner,
            &mut dispatched,
            pending,
            (index, known),
            reason,
            rejected,
        );
        if let Some(cut) = cut.await {
            done = cut;
        }
        revision += 1;
    }
}

/// The commit stopped at the chunk from `start` (`reason`), the checkpoint where the chunks
/// before it left it: the records from `start` on are reported as not recorded, and the lease
/// is let go when the store failed (it is still ours).
async fn give_up<H: Handler>(
    runner: &Runner<'_, H>,
    shard: &Shard<'_>,
    dispatched: Dispatched,
    last: &(dyn Fn(&Dispatched) -> (Option<Position>, Commit) + Sync),
    (start, checkpointed): (usize, Option<Position>),
    reason: StopReason,
) -> Committed {
    let key = shard.key;
    tracing::error!(
        stream = key.stream(),
        shard = key.shard(),
        checkpoint = checkpointed.as_ref().map(tracing::field::display),
        %reason,
        "could not commit the records' writes with the checkpoint; reporting from the first record not committed"
    );
    if matches!(reason, StopReason::CheckpointFailed(_)) {
        // The lease is still ours (kept for the next chunk, or the last one's release did not
        // land): let it go, so that the redelivery need not wait for it to lapse. The failing
        // record goes with it: a careful run's pin of a record it never ran must not stay
        // counted.
        let failing = last(&dispatched).1.failing;
        release(runner, key, shard.owner, failing).await;
    }
    let Dispatched {
        mut dispositions,
        stopped,
        ..
    } = dispatched;
    let stopped = ordered::unrecorded(&mut dispositions, start, stopped, reason);
    (dispositions, stopped, checkpointed)
}

/// The next transaction: the records from `start` that fit, their writes and the lease row's
/// update.
struct Chunk {
    /// The record after its last.
    end: usize,
    /// Whether it is the invocation's last write (and releases the lease).
    is_last: bool,
    /// The checkpoint it writes, when it moves.
    progress: Option<Position>,
    commit: Commit,
    writes: Vec<Write>,
    /// The record (its index in the pending records) each write belongs to.
    owners: Vec<usize>,
}

impl Chunk {
    /// What to send: the plain last write when nothing is written with it (one request, as a
    /// plain handler's), else a transaction with a token of its range and `revision`.
    fn transaction(&mut self, shard: &Shard<'_>, start: usize, revision: u32) -> Send {
        let commit = std::mem::take(&mut self.commit);
        let writes = std::mem::take(&mut self.writes);
        if writes.is_empty() && self.is_last {
            // The plain last write (or a careful run's mark: it keeps the lease).
            return Send::Plain(commit);
        }
        let first = shard.pending[start].position().to_string();
        let last = format!("{}#{revision}", shard.pending[self.end - 1].position());
        let row = shard.key.to_string();
        let token = token(&row, shard.state.lease_counter, &first, &last);
        Send::Transaction(Transaction::new(commit, writes, token))
    }
}

/// One write of the commit.
enum Send {
    Plain(Commit),
    Transaction(Transaction),
}

/// Plans the chunk of the records from `start` to `done` (exclusive): `Err` when the first
/// alone breaks a limit.
fn plan(
    shard: &Shard<'_>,
    staged: &BTreeMap<Position, Writes>,
    (start, done): (usize, usize),
    dispatched: &Dispatched,
    last: &(dyn Fn(&Dispatched) -> (Option<Position>, Commit) + Sync),
) -> Result<Chunk, TooLarge> {
    let records = &shard.pending[start..done];
    let writes_of: Vec<Option<&Writes>> = records
        .iter()
        .map(|entry| staged.get(&entry.position()))
        .collect();
    let len = next_chunk(&writes_of, Room::beside(LEASE_ACTION_BYTES), |_| Room::NONE)?;
    let end = start + len;
    let is_last = end == done;
    let (progress, commit) = if is_last {
        last(dispatched)
    } else {
        let entries = shard.entries;
        let position = settled(entries, shard.pending[end - 1].position());
        let below = Below::of(&position, prior(entries, &position), shard.state);
        let commit = Commit {
            checkpoint: Some(position.clone()),
            below,
            reported: outstanding_after(shard, &position, shard.pending[end].position()),
            keep_lease: true,
            ..Commit::default()
        };
        (Some(position), commit)
    };
    let mut writes: Vec<Write> = Vec::new();
    let mut owners: Vec<usize> = Vec::new();
    for (index, record_writes) in writes_of[..len].iter().enumerate() {
        if let Some(record_writes) = record_writes {
            writes.extend(record_writes.iter().cloned());
            owners.extend(std::iter::repeat_n(start + index, record_writes.len()));
        }
    }
    Ok(Chunk {
        end,
        is_last,
        progress,
        commit,
        writes,
        owners,
    })
}

/// What a chunk before the last (moving the checkpoint to `checkpoint`, the record `next`
/// after it still to commit) leaves in the row's `reported`: the lowest record above the
/// checkpoint not known done. The next chunk may fail, or the invocation die, and the records
/// from `next` on run again only if a later batch can still prove them skipped: a batch the
/// claim marked (`reported` at its first record) whose gap records commit in part leaves
/// records between the checkpoint and that mark that the next delivery of the batch, starting
/// at the mark, would read as delivered.
fn outstanding_after(shard: &Shard<'_>, checkpoint: &Position, next: Position) -> ReportedChange {
    match shard.state.reported.as_ref() {
        Some(reported) if reported > checkpoint && *reported <= next => ReportedChange::Keep,
        _ => ReportedChange::Set(next),
    }
}

/// The last write's `reported` once a chunk before it moved the row's: where the last write
/// keeps it, it is the row's as the claim read it again.
fn restored(state: &LeaseState, reported: &mut ReportedChange) {
    if *reported == ReportedChange::Keep {
        *reported = state
            .reported
            .clone()
            .map_or(ReportedChange::Clear, ReportedChange::Set);
    }
}

/// Sends one write of the commit.
async fn send<H>(
    runner: &Runner<'_, H>,
    shard: &Shard<'_>,
    send: Send,
) -> Result<Transacted, crate::store::LeaseError> {
    let store = runner.settings.store.as_ref();
    match send {
        Send::Plain(commit) => store
            .commit(shard.key, shard.owner, &commit)
            .await
            .map(|written| {
                if written {
                    Transacted::Committed
                } else {
                    Transacted::Fenced
                }
            }),
        Send::Transaction(transaction) => {
            store.transact(shard.key, shard.owner, &transaction).await
        }
    }
}

/// A record done above the first not done (per-key concurrency) whose writes are not
/// committed: forgotten in `done_above`, so that it runs again, and marked so.
fn drop_done_above(
    staged: &mut BTreeMap<Position, Writes>,
    dispatched: &mut Dispatched,
    pending: &[Entry],
    done: usize,
) {
    for (index, entry) in pending.iter().enumerate().skip(done) {
        let position = entry.position();
        if staged
            .remove(&position)
            .is_some_and(|writes| !writes.is_empty())
        {
            dispatched.done_above.retain(|above| *above != position);
            if dispatched.dispositions[index] == Disposition::Processed {
                dispatched.dispositions[index] = Disposition::Uncheckpointed;
            }
        }
    }
}

/// The record at `index` failed at the commit (`reason`): counted and, when `rejected` or out
/// of attempts, dead-lettered, through the attempt runner. Returns the new end of the records
/// to commit when the shard stops at it (the records after it are not committed: they run
/// again); `None` when it was dead-lettered, and the records after it go on. `known` is the
/// failing record the row held, for when dispatch left it as it was.
async fn refuse<H: Handler>(
    runner: &Runner<'_, H>,
    dispatched: &mut Dispatched,
    pending: &[Entry],
    (index, known): (usize, Option<&FailingRecord>),
    reason: StopReason,
    rejected: bool,
) -> Option<usize> {
    let Entry::Record(record) = &pending[index] else {
        unreachable!("only a record runs, and only a record has writes");
    };
    let mut failing = Failing {
        // Dispatch forgot the row's failing record when it succeeded there: the failure
        // now is the same record's, and counts on from the row's attempts.
        known: match &dispatched.failing {
            FailingChange::Set(failing) => Some(failing.clone()),
            FailingChange::Clear | FailingChange::Keep => known.cloned(),
        },
        change: dispatched.failing.clone(),
    };
    let outcome = runner.failed(record, reason, rejected, &mut failing).await;
    dispatched.failing = failing.change;
    match outcome {
        Ok(disposition) => {
            dispatched.dispositions[index] = disposition;
            None
        }
        Err(reason) => {
            dispatched.dispositions[index] = Disposition::Reported;
            for disposition in &mut dispatched.dispositions[index + 1..] {
                if disposition.runs_again_unrecorded() {
                    *disposition = Disposition::Uncheckpointed;
                }
            }
            dispatched.done_through = index.checked_sub(1).map(|last| pending[last].position());
            dispatched.done_above.clear();
            dispatched.stopped = Some((index, reason));
            Some(index)
        }
    }
}

/// Releases the lease after a chunk failed, without progress, writing `failing`.
async fn release<H: Handler>(
    runner: &Runner<'_, H>,
    key: &LeaseKey,
    owner: &str,
    failing: FailingChange,
) {
    let release = Commit {
        failing,
        ..Commit::default()
    };
    if let Err(error) = runner.settings.store.commit(key, owner, &release).await {
        tracing::warn!(%error, "could not release the lease; it lapses by itself");
    }
}
