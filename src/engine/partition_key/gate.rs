//! The partition-key mode's gate: a child shard waits until every record of its parents is at
//! or below its key's checkpoint (the rule is the gate's, `gate::by_key`), and what the gate
//! learnt of a parent read in part is recorded for gates in other processes.

use crate::engine::invocation::Invocation;
use crate::engine::settings::Settings;
use crate::key::LeaseKey;
use crate::report::Held;
use crate::sequence::{Position, SequenceNumber};
use crate::store::{Claim, Commit, commit_again_once};

/// Gates the shard of `key`: `None` when it may run (or the processor has no gate), why it
/// waits otherwise.
pub(super) async fn gate<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    invocation: &Invocation,
) -> Option<Held> {
    let gate = settings.gate.as_deref()?;
    let verdict = gate
        .check_partition_keys(settings.store.as_ref(), key)
        .await;
    if verdict.held.is_some()
        && let Some((parent, done)) = &verdict.done_through
    {
        record_done_through(settings, parent, done, invocation).await;
    }
    verdict.held
}

/// Records in the closed `parent`'s row that every record of it up to `done` is done (the
/// gate read it in part and found each key's last record done), under the parent's lease: a
/// gate in another process, which keeps nothing of this one's reading, then reads on after it
/// instead of reading the same first part again on every held delivery. The key mode reads the
/// parent row's checkpoint as done for every key. Two writes per part read; nothing when
/// another owner holds the lease (the next held delivery tries again).
async fn record_done_through<H>(
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
        Ok(Claim::Acquired { state, .. }) => state,
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
