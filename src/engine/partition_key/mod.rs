//! The partition-key mode, for event source mappings with `ParallelizationFactor` above 1.
//!
//! With `ParallelizationFactor` N (2 to 10), Lambda runs up to N batches of one shard at once,
//! split by partition key: order holds per key, not per shard. A shard lease would let one of
//! them run and turn the others away, and a shard checkpoint would skip records of other keys
//! still running elsewhere. So in this mode there is no shard lease and no shard checkpoint:
//! every partition key has a row of its own, keyed `stream:shard:partition-key` in the same
//! table, holding the key's checkpoint, its failing record and a TTL. One invocation:
//!
//! 1. Gates the shard: a child waits until every record of its parents is at or below its
//!    key's checkpoint (`gate`).
//! 2. Reads the rows of the batch's partition keys and the shard's own row
//!    ([`CheckpointStore::read_rows`]: 100 per `BatchGetItem`, read consistently). A live lease
//!    on the shard's row (a consumer of the whole shard sharing the table) holds the batch; its
//!    checkpoint marks every record up to it done.
//! 3. Skips every record at or below its key's checkpoint, and dispatches the rest one queue per
//!    key; a key stops at its first failure, with attempts and dead letters as in the shard mode.
//! 4. Writes each key's row whose checkpoint or failing record changed
//!    ([`CheckpointStore::commit_rows`]: 100 per `TransactWriteItems`), each on condition that its
//!    `lease_counter` is still the one read. A row someone else wrote meanwhile (a concurrent
//!    delivery of the same key) is not written: its records are reported and come again. With a
//!    transactional handler the rows go in the transactions that commit their records' writes.
//! 5. Reports the lowest record not done: Lambda redelivers from it, and every record above it
//!    that is done is skipped by its key's checkpoint.
//!
//! The mode relies on the documented mapping: it neither detects nor recovers records the
//! mapping discards, and it does not count deaths (no claim marks a batch, so an invocation
//! that dies leaves nothing behind).
//!
//! **Cost**: with K distinct partition keys in a batch, ⌈(K + 1) / 100⌉ reads and ⌈K / 100⌉
//! writes; keys whose records were all duplicates are not written. Rows expire
//! ([`Processor::key_ttl`](crate::Processor::key_ttl)) after their last write.
//!
//! [`CheckpointStore::read_rows`]: crate::store::CheckpointStore::read_rows
//! [`CheckpointStore::commit_rows`]: crate::store::CheckpointStore::commit_rows

use std::time::Duration;

use super::attempt::Runner;
use super::batch::{ShardBatch, stop_all};
use super::invocation::{Invocation, LeaseWatch};
use super::keyed::State;
use super::settings::Settings;
use crate::handler::Handler;
use crate::report::{Disposition, ShardReport, StopReason};
use crate::sequence::Position;
use crate::store::LeaseState;

mod commits;
mod finish;
mod gate;
mod last_write;
mod rows;
#[cfg(feature = "dynamodb")]
mod transact;

use commits::Batch;
use finish::finish;
use rows::{KeyRow, Read, RowsUnread, read_keys, run_by_key};

/// Gate, read the keys' rows, dispatch, write the rows, report: one shard's records in the
/// partition-key mode.
pub(crate) async fn run_shard<H: Handler>(
    settings: &Settings<H>,
    group: ShardBatch,
    invocation: &Invocation,
) -> ShardReport {
    // Every stage of this mode reads the records' keys: every record is read first.
    let ShardBatch { key, entries, .. } = group.read_whole();
    let report = ShardReport::empty(key.clone());
    if let Some(held) = gate::gate(settings, &key, invocation).await {
        tracing::warn!(%held, "holding the shard back until its parents are finished");
        return stop_all(report, &entries, StopReason::Held(held));
    }
    let (keys, shard_checkpoint) = match rows(settings, &key, &entries, invocation.now()).await {
        Ok(read) => read,
        Err(reason) => return stop_all(report, &entries, reason),
    };

    // Dispatch per key; no lease can be lost, so the watch never lapses.
    let lease = LeaseWatch::new(invocation.now(), Duration::MAX);
    #[cfg(feature = "dynamodb")]
    let staged = super::attempt::Staged::default();
    let runner = Runner {
        settings,
        invocation,
        lease: &lease,
        #[cfg(feature = "dynamodb")]
        staged: Some(&staged),
    };
    let mut run = run_by_key(&runner, &entries, &keys, shard_checkpoint.as_ref()).await;
    let batch = Batch {
        key: &key,
        entries: &entries,
        keys: &keys,
        ttl: settings.key_ttl,
        now: invocation.now(),
    };
    let refused = last_write::commit(&runner, &batch, &mut run).await;
    // (A transactional commit marks them itself: a key's earlier transactions may have landed.)
    if !refused.is_empty() && !settings.transactional {
        // Those keys' records run again when redelivered: mark them so.
        for (entry, state) in entries.iter().zip(run.states.iter_mut()) {
            let refused_key = entry
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

/// The keys' rows and the shard's checkpoint; or why nothing runs: the rows could not be read,
/// a checkpoint is unreadable, or a consumer of the whole shard holds its lease.
async fn rows<H>(
    settings: &Settings<H>,
    key: &crate::key::LeaseKey,
    entries: &[super::batch::Entry],
    now: u64,
) -> Result<(std::collections::HashMap<String, KeyRow>, Option<Position>), StopReason> {
    let Read { keys, shard } = match read_keys(settings.store.as_ref(), key, entries).await {
        Ok(read) => read,
        Err(RowsUnread::Store(error)) => {
            tracing::error!(%error, "could not read the partition keys' rows; processing nothing");
            return Err(StopReason::Store(error.to_string()));
        }
        Err(RowsUnread::Checkpoint(row, error)) => {
            tracing::error!(%error, row = %row, "a partition key's checkpoint is unreadable; processing nothing");
            return Err(StopReason::BadCheckpoint(error.to_string()));
        }
    };
    if let Some(owner) = shard_owner(&shard, now) {
        tracing::warn!(
            holder = owner,
            "another consumer holds the shard's lease; processing nothing"
        );
        let owner = Some(owner.to_owned());
        return Err(StopReason::LeaseHeld { owner });
    }
    match shard.position() {
        Ok(checkpoint) => Ok((keys, checkpoint)),
        Err(error) => {
            tracing::error!(%error, "the shard's checkpoint is unreadable; processing nothing");
            Err(StopReason::BadCheckpoint(error.to_string()))
        }
    }
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
