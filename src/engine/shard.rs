//! The shard mode (`ParallelizationFactor` 1): one lease and one checkpoint per shard.
//!
//! One shard's records, in order: claim the lease and read the row in one request, pass the
//! [gate](crate::gate), recover what the mapping skipped ([`recovery`](super::recovery)),
//! dedupe against the checkpoint, dispatch (in order or per key) while the lease is kept alive,
//! and write the checkpoint, the failing record and the release in one conditional write.

use std::sync::Arc;

use tracing::Instrument;

use super::attempt::Runner;
use super::batch::{Entry, Settled, ShardBatch, prior, settled, stop_all};
use super::invocation::{Invocation, LeaseWatch};
use super::keyed;
use super::ordered::{self, Committed, Dispatched};
use super::recovery::{self, Recovery, Tail, recover};
use super::settings::Settings;
use super::shard_lease::{claim, keep_alive, release};
#[cfg(feature = "dynamodb")]
use super::transactional;
use crate::handler::Handler;
use crate::key::LeaseKey;
use crate::report::{Disposition, PositionSource, RecordReports, ShardReport, StopReason};
use crate::sequence::Position;
use crate::store::{
    Below, BoxFuture, CheckpointStore, Commit, LeaseState, ReportedChange, commit_again_once,
};

/// Claim, dedupe, dispatch, checkpoint and release one shard's records.
#[allow(
    clippy::too_many_lines,
    reason = "the steps of one invocation, in order, clearer in one place"
)]
pub(crate) async fn run_shard<H: Handler>(
    settings: &Settings<H>,
    group: ShardBatch,
    invocation: &Invocation,
) -> ShardReport {
    run_shard_at(settings, group, invocation, 0).await
}

/// [`run_shard_at`] boxed, for the run of a parent's tail inside a child's: its type names no
/// future of its own, so the recursion is `Send`.
fn run_boxed<'a, H: Handler>(
    settings: &'a Settings<H>,
    group: ShardBatch,
    invocation: &'a Invocation,
    depth: usize,
) -> BoxFuture<'a, ShardReport> {
    Box::pin(run_shard_at(settings, group, invocation, depth))
}

/// How many generations of closed parents one invocation recovers the tails of, above the
/// delivered shard: a chain of resharding whose every tail the mapping gave up on.
const MAX_TAIL_DEPTH: usize = 3;

/// [`run_shard`] for a shard `depth` generations above the delivered one (0: the batch's own;
/// above: a parent whose tail a held child's invocation recovers).
#[allow(
    clippy::too_many_lines,
    reason = "the steps of one invocation, in order, clearer in one place"
)]
async fn run_shard_at<H: Handler>(
    settings: &Settings<H>,
    group: ShardBatch,
    invocation: &Invocation,
    depth: usize,
) -> ShardReport {
    // Only in-order dispatch reads the records as it goes: per-key dispatch and the
    // transactional commit read every record's key first.
    let in_order = settings.max_in_flight <= 1 && !settings.transactional;
    let group = if in_order { group } else { group.read_whole() };
    let ShardBatch {
        key,
        entries,
        mut payloads,
        reads_on,
    } = group;
    let owner = invocation.owner.as_str();
    let skew = settings.clock_skew.min(settings.lease_ttl / 3);
    let ttl = invocation.lease_ttl(settings.lease_ttl, skew);
    let mut report = ShardReport::empty(key.clone());
    let first = entries.first().map(Entry::position);

    // The stored expiry is counted from when the claim was sent, not from its answer: the
    // local view of the lease starts there too, and lapses a skew margin early.
    let lease = LeaseWatch::starting_at(invocation.now(), ttl, skew);
    let state = match claim(settings, &key, owner, ttl, (first.as_ref(), &entries)).await {
        Ok(state) => state,
        Err(reason) => return stop_all(report, &entries, reason),
    };
    // The gate may read Kinesis for a while: the lease is renewed meanwhile, and a gate that
    // outlasts it leaves nothing dispatched.
    let gated = tokio::select! {
        biased;
        gated = pass_gate(settings, (&key, owner), &state, first.as_ref(), (invocation, depth)) => gated,
        () = keep_alive(settings.store.as_ref(), &key, owner, invocation, &lease) => unreachable!("renewal never ends"),
    };
    let (gated, parents) = gated;
    report.parents = parents;
    let (checkpoint, parent_shards) = match gated {
        Ok(gated) => gated,
        Err(reason) => return stop_all(report, &entries, reason),
    };

    // Records the mapping skipped run first; `recovered` of the entries are theirs, and
    // dispatch stops before `cut` (a record not read yet) when the range was read in part.
    // Reading them may take a while: the lease is renewed meanwhile.
    let recovering = recover_or_release(
        settings,
        (&key, owner),
        (&state, checkpoint.as_ref()),
        parent_shards,
        entries,
        invocation,
        &mut report,
    );
    let recovered = tokio::select! {
        biased;
        recovered = recovering => recovered,
        () = keep_alive(settings.store.as_ref(), &key, owner, invocation, &lease) => unreachable!("renewal never ends"),
    };
    let (recovery, parent_shards) = match recovered {
        Ok(recovered) => recovered,
        Err(stopped) => return stop_all(report, &stopped.0, stopped.1),
    };
    let Recovery {
        entries,
        recovered,
        cut,
        gap,
    } = recovery;
    report.gap = gap;

    // Dedupe: everything at or below the checkpoint was done by an earlier delivery.
    let done_before = |entry: &Entry| {
        checkpoint
            .as_ref()
            .is_some_and(|c| entry.cmp_position(c).is_le())
    };
    let skipped = entries
        .iter()
        .take_while(|entry| done_before(entry))
        .count();
    let pending = &entries[skipped..];
    if skipped > 0 {
        tracing::info!(skipped, "skipped records at or below the checkpoint");
    }
    let runnable = cut.map_or(pending.len(), |cut| cut.saturating_sub(skipped));

    // Dispatch, with the lease renewed in the background while it runs.
    #[cfg(feature = "dynamodb")]
    let staged = super::attempt::Staged::default();
    let runner = Runner {
        settings,
        invocation,
        lease: &lease,
        #[cfg(feature = "dynamodb")]
        staged: Some(&staged),
    };
    let failing = state.failing.clone();
    let dispatching = async {
        let pending = &pending[..runnable];
        if settings.max_in_flight > 1 {
            let limits = keyed::Limits {
                by_routing_key: false,
                max_in_flight: settings.max_in_flight,
                max_done_above: settings.max_done_above,
            };
            keyed::dispatch(&runner, pending, failing, &state.done_above, limits).await
        } else {
            let payloads = payloads.as_mut();
            ordered::dispatch(&runner, pending, payloads, failing, &state.done_above).await
        }
    };
    let mut dispatched = tokio::select! {
        biased;
        dispatched = dispatching => dispatched,
        () = keep_alive(settings.store.as_ref(), &key, owner, invocation, &lease) => unreachable!("renewal never ends"),
    };
    if runnable < pending.len() {
        recovery::stop_at_unread(&mut dispatched, runnable, pending.len());
    }

    // Checkpoint and release in one conditional write; with a transactional handler, the
    // records' writes with it, in as many transactions as the limits ask for (see
    // `transactional`).
    let last = |dispatched: &Dispatched| {
        last_write(
            (&entries, reads_on.as_ref()),
            pending,
            (&state, checkpoint.as_ref()),
            parent_shards.as_deref(),
            dispatched,
        )
    };
    #[cfg(feature = "dynamodb")]
    let (dispositions, stopped, checkpointed) = if settings.transactional {
        let staged = std::mem::take(
            &mut *staged
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let shard = transactional::Shard {
            key: &key,
            owner,
            state: &state,
            entries: &entries,
            pending,
        };
        // Boxed: the largest state this function awaits, held in place it made every shard's
        // run larger by half, transactional or not.
        Box::pin(transactional::commit(
            &runner, &shard, staged, dispatched, &last,
        ))
        .await
    } else {
        commit_plain(settings.store.as_ref(), &key, owner, dispatched, &last).await
    };
    #[cfg(not(feature = "dynamodb"))]
    let (dispositions, stopped, checkpointed) =
        commit_plain(settings.store.as_ref(), &key, owner, dispatched, &last).await;
    report.checkpoint = checkpointed;

    // The report keeps the entries and reads their positions when asked: no report is built
    // per record.
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

/// Reads the claimed row's checkpoint and passes the gate: a child shard waits until its
/// parents are finished, and its invocation may recover a parent's tail meanwhile (see the
/// gate's "Parent tail recovery"). Returns the checkpoint and the parents just learnt, or why
/// nothing may run, the lease released; and the reports of the parents' tails run.
async fn pass_gate<H: Handler>(
    settings: &Settings<H>,
    (key, owner): (&LeaseKey, &str),
    state: &LeaseState,
    first: Option<&Position>,
    (invocation, depth): (&Invocation, usize),
) -> (
    Result<(Option<Position>, Option<Vec<String>>), StopReason>,
    Vec<ShardReport>,
) {
    let mut parents = Vec::new();
    let gated = gate_or_tail(
        settings,
        (key, owner),
        state,
        first,
        (invocation, depth),
        &mut parents,
    )
    .await;
    (gated, parents)
}

/// [`pass_gate`], the reports of the parents' tails run pushed to `parents`.
async fn gate_or_tail<H: Handler>(
    settings: &Settings<H>,
    (key, owner): (&LeaseKey, &str),
    state: &LeaseState,
    first: Option<&Position>,
    (invocation, depth): (&Invocation, usize),
    parents: &mut Vec<ShardReport>,
) -> Result<(Option<Position>, Option<Vec<String>>), StopReason> {
    let checkpoint = match state.position() {
        Ok(checkpoint) => checkpoint,
        Err(error) => {
            tracing::error!(%error, "the shard's checkpoint is unreadable; processing nothing");
            release(
                settings.store.as_ref(),
                key,
                owner,
                None,
                ReportedChange::Keep,
            )
            .await;
            return Err(StopReason::BadCheckpoint(error.to_string()));
        }
    };
    let Some(gate) = &settings.gate else {
        return Ok((checkpoint, None));
    };
    let mut verdict = gate.check(settings.store.as_ref(), key, state).await;
    // A merge has two parents, each perhaps with a tail to run: one recovery per parent.
    while verdict.held.is_some() && parents.len() < 2 && depth < MAX_TAIL_DEPTH {
        let Some(parent) = verdict.tail.take() else {
            break;
        };
        let Some((tail, whole)) = parent_tail(settings, &parent, invocation, depth).await else {
            break;
        };
        parents.push(tail);
        if !whole {
            break;
        }
        let learnt = verdict.learnt_parents.take();
        verdict = gate.check(settings.store.as_ref(), key, state).await;
        if verdict.learnt_parents.is_none() {
            verdict.learnt_parents = learnt;
        }
    }
    if let Some(held) = verdict.held {
        tracing::warn!(%held, "holding the shard back until its parents are finished");
        // The row remembers the held batch: if the mapping gives up on it, the batch after
        // it is caught as a gap once the parents are finished.
        let remember = crate::gap::nothing_ran(state, checkpoint.as_ref(), first);
        release(
            settings.store.as_ref(),
            key,
            owner,
            verdict.learnt_parents,
            remember,
        )
        .await;
        return Err(StopReason::Held(held));
    }
    Ok((checkpoint, verdict.learnt_parents))
}

/// Runs the tail of the closed `parent` that holds a child: read after its checkpoint to the
/// shard's end (see [`read_tail`](recovery::read_tail)) and run as a batch of the parent, under
/// its lease, through the same claim, gate, dedupe, dispatch and commit as a delivered batch.
/// `None` when nothing was read; otherwise the parent's report, and whether its tail ran to the
/// shard's end (then the gate finds it exhausted).
async fn parent_tail<H: Handler>(
    settings: &Settings<H>,
    parent: &LeaseKey,
    invocation: &Invocation,
    depth: usize,
) -> Option<(ShardReport, bool)> {
    let row = match settings.store.read(parent).await {
        Ok(row) => row,
        Err(error) => {
            tracing::warn!(%error, parent = parent.shard(), "could not read the parent's row; the child stays held");
            return None;
        }
    };
    let Tail { entries, unread } = recovery::read_tail(settings, parent, &row, invocation).await?;
    let batch = ShardBatch {
        key: parent.clone(),
        entries,
        payloads: None,
        reads_on: unread.clone(),
    };
    // Boxed: a parent's run may recover its own parent's tail in turn. In a span of its own,
    // inside the child's: its lines name the parent's records, and the parent as their shard.
    let span = tracing::info_span!(
        "shard",
        stream = parent.stream(),
        shard = parent.shard(),
        records = batch.entries.len(),
    );
    let report = run_boxed(settings, batch, invocation, depth + 1)
        .instrument(span)
        .await;
    let ran_whole = report.stopped.is_none();
    Some((report, ran_whole && unread.is_none()))
}

/// What the last write of an invocation carries, given what dispatch did: the checkpoint
/// (an aggregate whose last sub-record is done is checkpointed whole: `checkpoint` names
/// records done whole, and a parent ending in it is then exhausted at it), the record below
/// it, the failing record, the parents just learnt, the records done above it and the
/// reported record. The first is the new checkpoint, when it moved.
pub(crate) fn last_write(
    (entries, reads_on): (&[Entry], Option<&Position>),
    pending: &[Entry],
    (state, checkpoint): (&LeaseState, Option<&Position>),
    parent_shards: Option<&[String]>,
    dispatched: &Dispatched,
) -> (Option<Position>, Commit) {
    let progress = dispatched
        .done_through
        .clone()
        .map(|done| settled(entries, done))
        .filter(|done| checkpoint.is_none_or(|c| done > c));
    let below = progress.as_ref().map_or(Below::Keep, |progress| {
        Below::of(progress, prior(entries, progress), state)
    });
    let done_above = keyed::remembered(
        &state.done_above,
        &dispatched.done_above,
        progress.as_ref().or(checkpoint),
    );
    let stopped_at = dispatched
        .stopped
        .as_ref()
        .map(|(index, _)| pending[*index].position());
    let reported = crate::gap::after_run(
        state,
        progress.as_ref().or(checkpoint),
        stopped_at.or_else(|| reads_on.cloned()),
    );
    let commit = Commit {
        checkpoint: progress.clone(),
        below,
        failing: dispatched.failing.clone(),
        done_above,
        reported,
        contended_done: crate::gap::contended_done(state, progress.as_ref().or(checkpoint)),
        ..Commit::default()
    }
    .learnt_parents(parent_shards.map(<[String]>::to_vec));
    (progress, commit)
}

/// Writes the last write ([`last_write`]) and releases the lease, in one write. When the
/// write is refused or fails, the records processed here are not recorded: they are marked so
/// and the first of them is reported, since Lambda must deliver them again.
async fn commit_plain(
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    owner: &str,
    dispatched: Dispatched,
    last: &(dyn Fn(&Dispatched) -> (Option<Position>, Commit) + Sync),
) -> Committed {
    let (progress, commit) = last(&dispatched);
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

/// Finds and reads the range the mapping skipped before `entries` (see [`recover`](super::recovery::recover)); when
/// nothing may run, releases the lease, remembering the batch, notes the gap in `report`, and
/// returns the entries and why the shard stops. Otherwise the recovery and the parents to write
/// with the checkpoint.
///
/// The report is lent, not moved in and out: each move copied it whole, and the report in this
/// future's state made the shard's run larger (BENCHMARKS.md, section 1, eighteenth round).
async fn recover_or_release<H>(
    settings: &Settings<H>,
    (key, owner): (&LeaseKey, &str),
    (state, checkpoint): (&LeaseState, Option<&Position>),
    parent_shards: Option<Vec<String>>,
    entries: Vec<Entry>,
    invocation: &Invocation,
    report: &mut ShardReport,
) -> Result<(Recovery, Option<Vec<String>>), (Vec<Entry>, StopReason)> {
    let first = entries.first().map(Entry::position);
    match recover(settings, key, state, checkpoint, entries, invocation).await {
        Ok(recovery) => Ok((recovery, parent_shards)),
        Err(unrecovered) => {
            let (entries, gap, reason) = *unrecovered;
            let remember = crate::gap::nothing_ran(state, checkpoint, first.as_ref());
            release(settings.store.as_ref(), key, owner, parent_shards, remember).await;
            report.gap = Some(gap);
            Err((entries, reason))
        }
    }
}
