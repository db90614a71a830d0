//! The partition-key mode's rows as read: one per key of the batch, and the shard's own.

use std::collections::HashMap;

use crate::engine::attempt::Runner;
use crate::engine::batch::Entry;
use crate::engine::keyed::{self, Limits};
use crate::handler::Handler;
use crate::key::{LeaseKey, row_key};
use crate::sequence::Position;
use crate::store::{CheckpointStore, LeaseError, LeaseState};

/// A partition key's row as read.
pub(super) struct KeyRow {
    pub(super) row: LeaseKey,
    pub(super) checkpoint: Option<Position>,
    pub(super) state: LeaseState,
}

/// Why the keys' rows could not be used.
pub(super) enum RowsUnread {
    Store(LeaseError),
    Checkpoint(LeaseKey, crate::sequence::SequenceError),
}

/// The rows read before a batch runs: its keys', and the shard's own.
pub(super) struct Read {
    pub(super) keys: HashMap<String, KeyRow>,
    pub(super) shard: LeaseState,
}

/// Reads the rows of the partition keys of `entries` (by the key Kinesis routed by) and the
/// shard's own row, in one [`CheckpointStore::read_rows`].
pub(super) async fn read_keys(
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    entries: &[Entry],
) -> Result<Read, RowsUnread> {
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
    let mut states = store.read_rows(&rows).await.map_err(RowsUnread::Store)?;
    rows.pop();
    let shard = states.pop().unwrap_or_default();
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
            },
        );
    }
    Ok(Read { keys, shard })
}

/// Runs `entries` per partition key, in order per key, against the keys' rows as read: a
/// record is done at or below its key's checkpoint, or below the shard's (a shard consumer's
/// progress covers every key), and a key's failing record is the one its row remembers. No
/// bound on the records done above a checkpoint: each key's row holds its own.
pub(super) async fn run_by_key<H: Handler>(
    runner: &Runner<'_, H>,
    entries: &[Entry],
    keys: &HashMap<String, KeyRow>,
    shard_checkpoint: Option<&Position>,
) -> keyed::Run {
    let is_done = |entry: &Entry| {
        entry.routing_key().is_some_and(|partition_key| {
            keys[partition_key]
                .checkpoint
                .iter()
                .chain(shard_checkpoint)
                .any(|checkpoint| entry.position() <= *checkpoint)
        })
    };
    let known = |partition_key: &str| {
        keys.get(partition_key)
            .and_then(|row| row.state.failing.clone())
    };
    let limits = Limits {
        by_routing_key: true,
        max_in_flight: runner.settings.max_in_flight,
        max_done_above: usize::MAX,
    };
    keyed::run(runner, entries, &known, &is_done, 0, limits).await
}
