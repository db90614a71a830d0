//! The shard mode's lease, as one invocation holds it: claimed with the row read in one
//! request (a claim refused or a lease held elsewhere remembers the batch turned away), kept
//! alive while the batch runs, and released without progress when nothing may run.

use std::time::Duration;

use super::batch::Entry;
use super::invocation::{Invocation, LeaseWatch};
use super::settings::Settings;
use crate::key::LeaseKey;
use crate::report::StopReason;
use crate::sequence::Position;
use crate::store::{CheckpointStore, Claim, Commit, LeaseState, ReportedChange, commit_again_once};

/// Claims the shard's lease and reads its row in one request; or says why nothing may run,
/// the lease released.
pub(super) async fn claim<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    owner: &str,
    ttl: Duration,
    (attempting, batch): (Option<&Position>, &[Entry]),
) -> Result<LeaseState, StopReason> {
    let state = match settings
        .store
        .acquire_and_read(key, owner, ttl, attempting)
        .await
    {
        Ok(Claim::Acquired(state)) => state,
        Ok(Claim::Held(state)) => {
            let owner = state.lease_owner.clone();
            tracing::warn!(
                holder = owner.as_deref().unwrap_or("unknown"),
                "another invocation holds the shard's lease; processing nothing"
            );
            // The holder may be an invocation whose release did not land: should the mapping
            // give up on this batch meanwhile, the next one must find the gap.
            turned_away(settings.store.as_ref(), key, &state, batch).await;
            return Err(StopReason::LeaseHeld { owner });
        }
        Err(error) => {
            tracing::error!(%error, "could not claim the shard's lease; processing nothing");
            release(
                settings.store.as_ref(),
                key,
                owner,
                None,
                ReportedChange::Keep,
            )
            .await;
            // The claim's mark of the batch did not land: should the mapping give up on the
            // batch (its retries spent on refused claims), the next one must find the gap.
            // A store that refuses this too has lost nothing yet; one that refuses every
            // write on every delivery of the batch leaves nothing to find it by. The row is
            // read, and the mark written, again once after a failure (a throttle refuses one
            // request): a mapping with no retries delivers the batch only this once.
            if attempting.is_some() {
                let read = match settings.store.read(key).await {
                    Err(error) => {
                        tracing::warn!(%error, "could not read the row of the batch turned away; reading it again");
                        settings.store.read(key).await
                    }
                    read => read,
                };
                match read {
                    Ok(state) => turned_away(settings.store.as_ref(), key, &state, batch).await,
                    Err(error) => {
                        tracing::warn!(%error, "could not remember the batch turned away");
                    }
                }
            }
            return Err(StopReason::Store(error.to_string()));
        }
    };
    Ok(state)
}

/// Remembers a batch that ran nothing, in the row's `contended` (written without the lease):
/// its first record above the checkpoint, since another writer (a seed consumer) may have
/// done part of it already, and a mark at or below the checkpoint is read as done. The
/// lowest batch turned away counts, so an older mark still above the checkpoint is kept.
async fn turned_away(
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    state: &LeaseState,
    batch: &[Entry],
) {
    let done = state.position().ok().flatten();
    let first = batch
        .iter()
        .map(Entry::position)
        .find(|position| done.as_ref().is_none_or(|done| position > done));
    let older = state.contended.as_ref().filter(|contended| {
        done.as_ref().is_none_or(|done| *contended > done)
            && first.as_ref().is_some_and(|first| *contended <= first)
    });
    // A checkpoint another writer moved past the row's marks proves the gap already; a mark of
    // this batch would hide it (see `gap::proven_after_checkpoint`).
    let proven = crate::gap::proven_after_checkpoint(state, done.as_ref());
    let Some(first) = first.filter(|_| older.is_none() && !proven) else {
        return;
    };
    // Written again once after a failure, as the claim's mark it stands in for would be.
    let marked = match store.mark_contended(key, &first).await {
        Err(error) => {
            tracing::warn!(%error, "could not remember the batch turned away; writing it again");
            store.mark_contended(key, &first).await
        }
        marked => marked,
    };
    if let Err(error) = marked {
        tracing::warn!(%error, "could not remember the batch turned away");
    }
}

/// Releases the lease without progress (keeping the parents just learnt); a failure only
/// means the lease lapses by itself.
pub(crate) async fn release(
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    owner: &str,
    parent_shards: Option<Vec<String>>,
    reported: ReportedChange,
) {
    let release = Commit {
        reported,
        ..Commit::default()
    }
    .learnt_parents(parent_shards);
    if let Err(error) = commit_again_once(store, key, owner, &release).await {
        tracing::warn!(%error, "could not release the lease; it lapses by itself");
    }
}

/// Renews the lease every third of its TTL; marks it lost when a renew is refused, and
/// lets it lapse (as far as dispatch is concerned) when renewals keep failing.
pub(super) async fn keep_alive(
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    owner: &str,
    invocation: &Invocation,
    lease: &LeaseWatch,
) {
    loop {
        invocation.clock().sleep(lease.ttl / 3).await;
        let ttl = invocation.lease_ttl(lease.ttl, lease.skew());
        let sent = invocation.now();
        match store.renew(key, owner, ttl).await {
            Ok(true) => lease.renewed(sent, ttl),
            Ok(false) => {
                tracing::error!(
                    stream = key.stream(),
                    shard = key.shard(),
                    "the lease was taken by another owner; stopping dispatch"
                );
                lease.fence();
                std::future::pending::<()>().await;
            }
            Err(error) => tracing::warn!(%error, "could not renew the lease; retrying"),
        }
    }
}
