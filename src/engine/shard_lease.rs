//! The shard mode's lease, as one invocation holds it: claimed with the row read in one
//! request, kept alive while the batch runs, and released without progress when nothing may
//! run.

use std::time::Duration;

use super::invocation::{Invocation, LeaseWatch};
use super::settings::Settings;
use crate::key::LeaseKey;
use crate::report::StopReason;
use crate::sequence::Position;
use crate::store::{CheckpointStore, Claim, Commit, LeaseState, ReportedChange, commit_again_once};

/// The shard as claimed: its row, and where an earlier invocation died, if one did.
pub(super) struct Claimed {
    pub(super) state: LeaseState,
    /// The batch or record an invocation was running when it died: its lease lapsed without a
    /// commit, leaving the mark its claim (or a careful run) wrote.
    pub(super) died_at: Option<Position>,
}

/// Claims the shard's lease and reads its row in one request, marking `attempting` (the batch's
/// first record) as the batch this invocation runs; or says why nothing may run.
pub(super) async fn claim<H>(
    settings: &Settings<H>,
    key: &LeaseKey,
    owner: &str,
    ttl: Duration,
    attempting: Option<&Position>,
) -> Result<Claimed, StopReason> {
    match settings
        .store
        .acquire_and_read(key, owner, ttl, attempting)
        .await
    {
        // Any mark counts, even at or below the checkpoint: a claim marks its batch's first
        // record, which a redelivery's duplicates may put there.
        Ok(Claim::Acquired { state, lapsed_mark }) => Ok(Claimed {
            state,
            died_at: lapsed_mark,
        }),
        Ok(Claim::Held(state)) => {
            let owner = state.lease_owner;
            tracing::warn!(
                holder = owner.as_deref().unwrap_or("unknown"),
                "another invocation holds the shard's lease; processing nothing"
            );
            Err(StopReason::LeaseHeld { owner })
        }
        Err(error) => {
            tracing::error!(%error, "could not claim the shard's lease; processing nothing");
            // The claim may have landed with its answer lost: let the lease go.
            release(
                settings.store.as_ref(),
                key,
                owner,
                None,
                ReportedChange::Keep,
            )
            .await;
            Err(StopReason::Store(error.to_string()))
        }
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
