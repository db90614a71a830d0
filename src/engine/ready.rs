//! The shard's batch as dispatch takes it, and the write of the shard's row that records what
//! dispatch did: shared by the in-order, per-key and careful runs and by the transactional
//! commit, so that each writes the row the same way.

use super::batch::{Entry, prior, settled};
use super::keyed;
use super::ordered::Dispatched;
use crate::key::LeaseKey;
use crate::sequence::Position;
use crate::store::{Below, Commit, LeaseState};

/// The shard as dispatch takes it: the claimed row, the batch (skipped records first), and
/// what the steps before dispatch settled.
pub(super) struct Ready {
    pub(super) key: LeaseKey,
    pub(super) state: LeaseState,
    pub(super) entries: Vec<Entry>,
    /// The checkpoint as read: everything at or below it is done.
    pub(super) checkpoint: Option<Position>,
    /// The parents the gate just learnt, to write with the checkpoint.
    pub(super) parent_shards: Option<Vec<String>>,
    /// How many of `entries` lead them as duplicates, at or below the checkpoint.
    pub(super) skipped: usize,
    /// How many records after those may run: fewer than all when a skipped range was read in
    /// part (the rest comes with the next delivery).
    pub(super) runnable: usize,
    /// How many of `entries` were read back from the stream (a gap).
    pub(super) recovered: usize,
}

impl Ready {
    /// The records after the duplicates: the ones dispatch is given, up to `runnable`.
    pub(super) fn pending(&self) -> &[Entry] {
        &self.entries[self.skipped..]
    }
}

/// What a write of the shard's row carries, given what dispatch did so far: the checkpoint
/// (an aggregate whose last sub-record is done is checkpointed whole: `checkpoint` names
/// records done whole, and a parent ending in it is then exhausted at it), the record below
/// it, the failing record, the parents just learnt, the records done above it and the
/// reported record. The first is the new checkpoint, when it moved.
pub(super) fn last_write(ready: &Ready, dispatched: &Dispatched) -> (Option<Position>, Commit) {
    let Ready {
        state,
        entries,
        checkpoint,
        ..
    } = ready;
    let checkpoint = checkpoint.as_ref();
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
        .map(|(index, _)| ready.pending()[*index].position());
    let reported = crate::gap::after_run(state, progress.as_ref().or(checkpoint), stopped_at);
    let commit = Commit {
        checkpoint: progress.clone(),
        below,
        failing: dispatched.failing.clone(),
        done_above,
        reported,
        ..Commit::default()
    }
    .learnt_parents(ready.parent_shards.clone());
    (progress, commit)
}
