//! The partition-key mode's rows as read: one per key of the batch, and the shard's own.

use std::collections::HashMap;

use crate::engine::batch::Entry;
use crate::key::{LeaseKey, row_key};
use crate::sequence::Position;
use crate::store::{CheckpointStore, LeaseError, LeaseState};

/// A partition key's row as read.
pub(super) struct KeyRow {
    pub(super) row: LeaseKey,
    pub(super) checkpoint: Option<Position>,
    pub(super) state: LeaseState,
    /// The key has records in the batch (not only in a range the lane skipped).
    pub(super) in_batch: bool,
}

/// Why the keys' rows could not be used.
pub(super) enum RowsUnread {
    Store(LeaseError),
    Checkpoint(LeaseKey, crate::sequence::SequenceError),
}

/// Reads the rows of the partition keys of `entries` (by the key Kinesis routed by) and the
/// shard's own row, in one [`CheckpointStore::read_rows`].
pub(super) async fn read_keys(
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    entries: &[Entry],
) -> Result<(HashMap<String, KeyRow>, LeaseState), RowsUnread> {
    let mut partition_keys: Vec<&str> = entries.iter().filter_map(Entry::routing_key).collect();
    partition_keys.sort_unstable();
    partition_keys.dedup();
    let mut rows: Vec<LeaseKey> = partition_keys
        .iter()
        .map(|partition_key| row_key(key, partition_key))
        .collect();
    // A container consumer sharing the table (the seed crate's, which keys by `stream:shard`)
    // may hold the shard's lease or have checkpointed it.
    rows.push(key.clone());
    // Read again once after a failure (a throttle refuses one request): a batch that runs
    // nothing leaves no mark, and the mapping may give up on it.
    let mut states = match store.read_rows(&rows).await {
        Ok(states) => states,
        Err(error) => {
            tracing::warn!(%error, "could not read the partition keys' rows; reading them again");
            store.read_rows(&rows).await.map_err(RowsUnread::Store)?
        }
    };
    rows.pop();
    let shard_row = states.pop().unwrap_or_default();
    let mut keys = HashMap::with_capacity(rows.len());
    for ((partition_key, row), state) in partition_keys.iter().zip(rows).zip(states) {
        let checkpoint = match state.position() {
            Ok(checkpoint) => checkpoint,
            Err(error) => return Err(RowsUnread::Checkpoint(row, error)),
        };
        keys.insert(
            (*partition_key).to_owned(),
            KeyRow {
                row,
                checkpoint,
                state,
                in_batch: true,
            },
        );
    }
    Ok((keys, shard_row))
}
