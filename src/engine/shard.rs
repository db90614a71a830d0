//! The shard mode (`ParallelizationFactor` 1): one lease and one checkpoint per shard.
//!
//! One shard's records, in order: claim the lease and read the row in one request (the claim
//! marks the batch it attempts), pass the [gate](crate::gate), recover what a mapping outside
//! the contract skipped ([`recovery`](super::recovery)), dedupe against the checkpoint,
//! dispatch while the lease is kept alive (in order, per key, or one record at a time after a
//! death: [`careful`](super::careful)), and write the checkpoint, the failing record and the
//! release in one conditional write.

use std::sync::Arc;

use super::attempt::Runner;
use super::batch::{Entry, Settled, ShardBatch, stop_all};
use super::careful;
use super::invocation::{Invocation, LeaseWatch};
use super::keyed;
use super::ordered::{self, Committed, Dispatched};
use super::ready::{Ready, last_write};
use super::recovery::{self, Recovery, recover};
use super::settings::Settings;
use super::shard_lease::{Claimed, claim, keep_alive, release};
#[cfg(feature = "dynamodb")]
use super::transactional;
use crate::handler::Handler;
use crate::key::LeaseKey;
use crate::report::{Disposition, PositionSource, RecordReports, ShardReport, StopReason};
use crate::sequence::Position;
use crate::store::{CheckpointStore, Commit, LeaseState, ReportedChange, commit_again_once};

/// Claim, gate, recover, dedupe, dispatch, checkpoint and release one shard's records.
pub(crate) async fn run_shard<H: Handler>(
    settings: &Settings<H>,
    group: ShardBatch,
    invocation: &Invocation,
) -> ShardReport {
    let key = group.key.clone();
    let owner = invocation.owner.as_str();
    let skew = settings.clock_skew.min(settings.lease_ttl / 3);
    let ttl = invocation.lease_ttl(settings.lease_ttl, skew);
    let mut report = ShardReport::empty(key.clone());
    let first = group.entries.first().map(Entry::position);

    // The stored expiry is counted from when the claim was sent, not from its answer: the
    // local view of the lease starts there too, and lapses a skew margin early.
    let lease = LeaseWatch::starting_at(invocation.now(), ttl, skew);
    let Claimed { state, died_at } = match claim(settings, &key, owner, ttl, first.as_ref()).await {
        Ok(claimed) => claimed,
        Err(reason) => return stop_all(report, &group.entries, reason),
    };
    if let Some(died_at) = &died_at {
        tracing::warn!(
            %died_at,
            "an invocation died running this shard (its lease lapsed without a checkpoint); running the batch one record at a time"
        );
        report.died_at = Some(died_at.clone());
    }
    // After a death, and until the record pinned then comes back, one record at a time.
    let careful = died_at.is_some() || careful::suspect(&state);
    // Only in-order dispatch reads the records as it goes: per-key dispatch, the transactional
    // commit and the careful run read every record first.
    let in_order = settings.max_in_flight <= 1 && !settings.transactional && !careful;
    let ShardBatch {
        entries,
        mut payloads,
        ..
    } = if in_order { group } else { group.read_whole() };

    // The gate and a gap's reading may take a while: the lease is renewed meanwhile.
    let preparing = prepare(
        settings,
        (&key, owner),
        state,
        entries,
        invocation,
        &mut report,
    );
    let prepared = tokio::select! {
        biased;
        prepared = preparing => prepared,
        () = keep_alive(settings.store.as_ref(), &key, owner, invocation, &lease) => unreachable!("renewal never ends"),
    };
    let ready = match prepared {
        Ok(ready) => ready,
        Err((entries, reason)) => return stop_all(report, &entries, reason),
    };
    if ready.skipped > 0 {
        tracing::info!(
            skipped = ready.skipped,
            "skipped records at or below the checkpoint"
        );
    }

    let dispatched = dispatch(
        settings,
        invocation,
        &lease,
        &ready,
        payloads.as_mut(),
        careful,
    );
    let committed = dispatched.await;
    finish(report, ready, committed)
}

/// Runs the ready records (one at a time after a death, per key, or in order) while the lease
/// is kept alive, and writes the checkpoint.
async fn dispatch<H: Handler>(
    settings: &Settings<H>,
    invocation: &Invocation,
    lease: &LeaseWatch,
    ready: &Ready,
    payloads: Option<&mut crate::event::Payloads>,
    careful: bool,
) -> Committed {
    let owner = invocation.owner.as_str();
    #[cfg(feature = "dynamodb")]
    let staged = super::attempt::Staged::default();
    let runner = Runner {
        settings,
        invocation,
        lease,
        #[cfg(feature = "dynamodb")]
        staged: Some(&staged),
    };
    let dispatching = async {
        let pending = &ready.pending()[..ready.runnable];
        let failing = ready.state.failing.clone();
        let done_above = &ready.state.done_above;
        if careful {
            careful::dispatch(&runner, ready, owner).await
        } else if settings.max_in_flight > 1 {
            let limits = keyed::Limits {
                by_routing_key: false,
                max_in_flight: settings.max_in_flight,
                max_done_above: settings.max_done_above,
            };
            keyed::dispatch(&runner, pending, failing, done_above, limits).await
        } else {
            ordered::dispatch(&runner, pending, payloads, failing, done_above).await
        }
    };
    let mut dispatched = tokio::select! {
        biased;
        dispatched = dispatching => dispatched,
        () = keep_alive(settings.store.as_ref(), &ready.key, owner, invocation, lease) => unreachable!("renewal never ends"),
    };
    if ready.runnable < ready.pending().len() {
        recovery::stop_at_unread(&mut dispatched, ready.runnable, ready.pending().len());
    }
    // A careful run whose records' commit may have landed with its answer lost writes nothing
    // more: a last write behind it would move the checkpoint back, and those records' writes
    // would apply again. The lease lapses by itself.
    if let Some((_, StopReason::CheckpointFailed(_))) = &dispatched.stopped
        && careful
    {
        return (dispatched.dispositions, dispatched.stopped, None);
    }
    #[cfg(feature = "dynamodb")]
    if settings.transactional {
        let staged = std::mem::take(
            &mut *staged
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let shard = transactional::Shard {
            key: &ready.key,
            owner,
            state: &ready.state,
            entries: &ready.entries,
            pending: ready.pending(),
        };
        let last = |dispatched: &Dispatched| careful_last(ready, dispatched, careful);
        let commit = transactional::commit(&runner, &shard, staged, dispatched, &last);
        return Box::pin(commit).await;
    }
    commit_plain(settings.store.as_ref(), ready, owner, dispatched, careful).await
}

/// Reads the claimed row's checkpoint, passes the gate and puts the records a mapping outside
/// the contract skipped before the batch's. When nothing may run, releases the lease
/// (remembering the batch) and returns the entries and why.
async fn prepare<H>(
    settings: &Settings<H>,
    (key, owner): (&LeaseKey, &str),
    state: LeaseState,
    entries: Vec<Entry>,
    invocation: &Invocation,
    report: &mut ShardReport,
) -> Result<Ready, (Vec<Entry>, StopReason)> {
    let store = settings.store.as_ref();
    let checkpoint = match state.position() {
        Ok(checkpoint) => checkpoint,
        Err(error) => {
            tracing::error!(%error, "the shard's checkpoint is unreadable; processing nothing");
            release(store, key, owner, None, ReportedChange::Keep).await;
            return Err((entries, StopReason::BadCheckpoint(error.to_string())));
        }
    };
    let first = entries.first().map(Entry::position);
    let mut parent_shards = None;
    if let Some(gate) = &settings.gate {
        let verdict = gate.check(store, key, &state).await;
        if let Some(held) = verdict.held {
            tracing::warn!(%held, "holding the shard back until its parents are finished");
            // The row remembers the held batch: a mapping outside the contract that gives up
            // on it is caught as a gap once the parents are finished.
            let remember = crate::gap::nothing_ran(&state, checkpoint.as_ref(), first.as_ref());
            release(store, key, owner, verdict.learnt_parents, remember).await;
            return Err((entries, StopReason::Held(held)));
        }
        parent_shards = verdict.learnt_parents;
    }
    let Recovery {
        entries,
        recovered,
        cut,
        gap,
    } = match recover(
        settings,
        key,
        &state,
        checkpoint.as_ref(),
        entries,
        invocation,
    )
    .await
    {
        Ok(recovery) => recovery,
        Err(unrecovered) => {
            let (entries, gap, reason) = *unrecovered;
            let remember = crate::gap::nothing_ran(&state, checkpoint.as_ref(), first.as_ref());
            release(store, key, owner, parent_shards, remember).await;
            report.gap = Some(gap);
            return Err((entries, reason));
        }
    };
    report.gap = gap;
    // Dedupe: everything at or below the checkpoint was done by an earlier delivery.
    let skipped = entries
        .iter()
        .take_while(|entry| {
            checkpoint
                .as_ref()
                .is_some_and(|c| entry.cmp_position(c).is_le())
        })
        .count();
    let pending = entries.len() - skipped;
    let runnable = cut.map_or(pending, |cut| cut.saturating_sub(skipped));
    Ok(Ready {
        key: key.clone(),
        state,
        entries,
        checkpoint,
        parent_shards,
        skipped,
        runnable,
        recovered,
    })
}

/// [`last_write`], after a careful run when `careful`: the row's mark is what the run's last
/// mark left, not what the claim read, so it is set or cleared outright (a mark left at or
/// below the checkpoint would hide the next death from the claim that follows it).
fn careful_last(
    ready: &Ready,
    dispatched: &Dispatched,
    careful: bool,
) -> (Option<Position>, Commit) {
    let (progress, mut commit) = last_write(ready, dispatched);
    if careful && commit.reported == ReportedChange::Keep {
        commit.reported = ReportedChange::Clear;
    }
    (progress, commit)
}

/// Writes the last write ([`last_write`]) and releases the lease, in one write. When the
/// write is refused or fails, the records processed here are not recorded: they are marked so
/// and the first of them is reported, since Lambda must deliver them again.
async fn commit_plain(
    store: &dyn CheckpointStore,
    ready: &Ready,
    owner: &str,
    dispatched: Dispatched,
    careful: bool,
) -> Committed {
    let key = &ready.key;
    let (progress, commit) = careful_last(ready, &dispatched, careful);
    let Dispatched {
        mut dispositions,
        stopped,
        ..
    } = dispatched;
    let reason = match commit_again_once(store, key, owner, &commit).await {
        Ok(true) => return (dispositions, stopped, progress),
        Ok(false) => StopReason::CheckpointFenced,
        Err(error) => StopReason::CheckpointFailed(error.to_string()),
    };
    if progress.is_none()
        && !dispositions
            .iter()
            .copied()
            .any(Disposition::runs_again_unrecorded)
    {
        tracing::warn!(%reason, "could not release the lease; it lapses by itself");
        return (dispositions, stopped, None);
    }
    tracing::error!(
        stream = key.stream(),
        shard = key.shard(),
        checkpoint = progress.as_ref().map(tracing::field::display),
        %reason,
        "could not checkpoint; reporting from the first record processed in this invocation"
    );
    let stopped = ordered::unrecorded(&mut dispositions, 0, stopped, reason);
    (dispositions, stopped, None)
}

/// The shard's report once its last write is done: every record's disposition (the report
/// keeps the entries and reads their positions when asked) and the record reported to Lambda.
fn finish(mut report: ShardReport, ready: Ready, committed: Committed) -> ShardReport {
    let (dispositions, stopped, checkpointed) = committed;
    report.checkpoint = checkpointed;
    let Ready {
        entries,
        skipped,
        recovered,
        ..
    } = ready;
    let stopped = stopped.map(|(index, reason)| (skipped + index, reason));
    let entries = Arc::new(Settled(entries));
    let source: Arc<dyn PositionSource> = entries.clone();
    let runs = std::iter::once((Disposition::Duplicate, skipped))
        .chain(dispositions.into_iter().map(|disposition| (disposition, 1)));
    let records = RecordReports::shared(source, 0, runs);
    if let Some((index, reason)) = recovery::report(&mut report, records, recovered, stopped) {
        let sequence = entries.0[index].sequence().clone();
        tracing::info!(%sequence, %reason, "reporting the first record not done");
        report.stopped = Some((sequence, reason));
    }
    report
}
