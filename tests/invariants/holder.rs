//! In the partition-key mode, a consumer of the whole shard on the same table that takes the
//! shard's lease between invocations and keeps it a while, doing nothing (a seed-crate consumer
//! that took the shard and stopped; its lease lapses). The mode turns every batch of the shard
//! away while that lease is live: nothing runs and the batch is reported at its first record,
//! which the mapping delivers again once the lease has lapsed.
//!
//! It handles nothing, so it adds no rerun to account for: a consumer that handles records
//! from its own checkpoint runs again what the keys' rows say is done (it reads none of them),
//! and that is the seed consumer's family, in the shard mode.

use std::time::Duration;

use kinesis_checkpoint::LeaseKey;
use kinesis_checkpoint::store::LeaseStore;

use super::Shared;

/// Takes `shard`'s lease for `ttl` under `owner`, if it is free: a failed or refused claim
/// (the store's chaos) is a hold that did not happen.
pub async fn hold(
    store: &dyn LeaseStore,
    shared: &Shared,
    (shard, owner): (&str, &str),
    ttl: Duration,
) {
    let key = LeaseKey::new("orders", shard);
    if matches!(store.acquire(&key, owner, ttl).await, Ok(true)) {
        shared.note(format!(
            "{owner} holds {shard}'s lease for {} ms",
            ttl.as_millis()
        ));
        shared.journal.lock().unwrap().holds += 1;
    }
}
