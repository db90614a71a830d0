//! The partition-key mode, for event source mappings with `ParallelizationFactor` above 1.
//!
//! With `ParallelizationFactor` N (2 to 10), Lambda runs up to N batches of one shard at once,
//! split by partition key: order holds per key, not per shard. A shard lease would let one of
//! them run and turn the others away, and a shard checkpoint would skip records of other keys
//! that are still running elsewhere. So in this mode ([`PartitionKeyMode`](crate::PartitionKeyMode)) there is no shard
//! lease and no shard checkpoint: every partition key has a row of its own, keyed
//! `stream:shard:partition-key` in the same table, holding the key's checkpoint, its failing
//! record and a TTL. One invocation:
//!
//! 1. Gates the shard: a child shard waits until each parent is finished (see below).
//! 2. Reads the rows of the batch's partition keys ([`CheckpointStore::read_rows`]: 100 per
//!    `BatchGetItem`, read consistently).
//! 3. Recovers what the lane skipped, when a key's row proves it (see below): those records run
//!    first.
//! 4. Skips every record at or below its key's checkpoint, and dispatches the rest one queue per
//!    key (concurrently with [`Processor::concurrency`](crate::Processor::concurrency) above 1,
//!    otherwise one record at a time); a key stops at its first failure, dead letters as in the
//!    shard mode, with attempts counted in the key's row.
//! 5. Writes each key's row whose checkpoint, failing record or mark changed
//!    ([`CheckpointStore::commit_rows`]: 100 per `TransactWriteItems`), each on condition that its
//!    `lease_counter` is still the one read. A row someone else wrote meanwhile (a concurrent
//!    delivery of the same key, which Lambda does not do by design but AWS does not rule out)
//!    is not written: its records are reported and come again, and its checkpoint skips what
//!    the other delivery did. With a transactional handler the rows go in the transactions
//!    that commit their records' writes (see `transact`), on the same conditions.
//! 6. Reports the lowest record not done: Lambda redelivers from it, and every record above it
//!    that is done is skipped by its key's checkpoint. The shard's report carries no
//!    checkpoint: there is none per shard.
//!
//! **Records the mapping skipped.** The mapping splits the shard into lanes by a hash of the
//! partition key (AWS does not say which), each delivered in order, retried and given up on
//! (`MaximumRetryAttempts`, `MaximumRecordAgeInSeconds`, a bisected half) by itself; a batch is
//! one lane's. No shard row can say where a lane stands, so each key's row remembers where its
//! lane was last reported (the row's `reported`, its *mark*, written in the write the batch
//! makes anyway): the record the batch was reported at, on every key with records at or after
//! it; a held batch marks its keys at its first record; and when the gate knows the mapping
//! gives up on batches ([`Gate::maximum_retry_attempts`](crate::gate::Gate::maximum_retry_attempts),
//! or a record age), every key read is marked at the first record not done before anything
//! runs, since an invocation that dies makes no last write. A batch holding a key whose mark lies
//! before the batch's first record proves the lane went on without it: the range from the
//! lowest such mark up to the batch is read once through the gate's topology (at most
//! [`MAX_RECOVERED_RECORDS`](crate::gap::MAX_RECOVERED_RECORDS) in half the time left, the rest
//! by the next delivery), filtered to the lane's keys (the batch's, and those whose rows carry
//! the same mark: they were in the batch that set it), and their records not done run first.
//! A range read in parts keeps those marks on the lane's keys until it is read whole (a key
//! first met in a later part is the lane's by its mark), and the lane's own row says where the
//! next part starts (see `gaps::Lane`).
//! With a record age told to the gate, a batch nearly as old as the limit is read from its keys'
//! lowest checkpoint (when a mark proves a range too, from those of its keys whose lane has not
//! read on in parts); and the shard's open-marks row lists where its lanes were reported, so
//! that a batch holding a key no row marks reads what a lane dropped after such a mark once it
//! can have (see `open`). The rules are in [`gap::keys`](crate::gap) and `gap::open`; the
//! README's "Not covered" says what no row can prove. No Kinesis call is made unless a row
//! proves a gap, the batch is that old, or an open mark asks it to read.
//!
//! **A consumer of the whole shard** sharing the table (the seed crate's, keyed `stream:shard`):
//! the shard's own row is read with the keys' rows; a live lease on it holds the batch (nothing
//! runs, the first record is reported and the keys marked there, as for a batch the gate
//! holds), and records at or below its checkpoint are done. A child's invocation running this
//! closed parent's tail holds that lease too.
//!
//! **Cost**: with K distinct partition keys in a batch, ⌈(K + 1) / 100⌉ reads (the keys' rows
//! and the shard's) and ⌈K / 100⌉ writes; a batch of 1,000 records over 100 keys costs 3. Keys
//! whose records were all duplicates and whose mark stays are not written. Each row written
//! costs twice the write capacity of a plain write (transactions do); marking early costs one
//! more write per 100 keys whose mark changes (none on a redelivery). With a record age told,
//! the shard's open-marks row is read with the keys' rows, and written once per failure at a
//! record it does not list yet, once when a young retry goes past it, and after each reading
//! for it. A held batch costs a read of its keys' rows, and a write when a mark changes. A gap
//! costs its reading (two requests and one per page of `GetRecords`), one more `BatchGetItem`
//! per 100 keys of the range outside the batch, one more for the lane's rows when marks proved
//! it, and one more `TransactWriteItems` per part but the last of a range read in parts.
//!
//! **Rows** expire ([`Processor::key_ttl`](crate::Processor::key_ttl), by default 8 days, for a
//! stream retention of 7) after their last write: a key silent for longer than the stream
//! keeps records cannot be redelivered.
//!
//! **The gate**: a parent shard is finished when its shard row says `SHARD_END`, when it has
//! expired from the stream, or when it is closed and every record in it is at or below its
//! key's checkpoint or the parent's own row's checkpoint (read from the stream with
//! [`Topology::read_range`](crate::gate::Topology::read_range), in parts of at most 10,000
//! records per held batch, and checked against the key rows); the gate then writes `SHARD_END`
//! on the parent's row, and remembers it for the life of the process. Until then, it keeps for
//! the life of the process only each key's last position in the parent and the keys found done:
//! a held batch reads no record twice and asks only the keys still pending. A parent still open
//! holds the child. With a record age told to the gate, a closed parent's tail the mapping
//! gave up on is run by the held child once no invocation of the parent can run any of it
//! (see `tail`, and the gate's `by_key`).
//!
//! [`CheckpointStore::read_rows`]: crate::store::CheckpointStore::read_rows
//! [`CheckpointStore::commit_rows`]: crate::store::CheckpointStore::commit_rows

use std::collections::HashMap;
use std::time::Duration;

use super::attempt::Runner;
use super::batch::{Entry, ShardBatch, stop_all};
use super::invocation::{Invocation, LeaseWatch};
use super::keyed::{self, State};
use super::settings::Settings;
use crate::handler::Handler;
use crate::report::{Disposition, ShardReport, StopReason};
use crate::store::LeaseState;

mod commits;
mod finish;
mod gaps;
mod last_write;
mod marks;
mod open;
mod rows;
mod tail;
#[cfg(feature = "dynamodb")]
mod transact;

use commits::{AgedPart, Batch};
use finish::finish;
use gaps::Found;
use open::OpenMarks;
use rows::{KeyRow, RowsUnread, read_keys, run_by_key};

/// Gate, read the keys' rows, recover what the lane skipped, dispatch, write the rows, report:
/// one shard's records in the partition-key mode.
#[allow(
    clippy::too_many_lines,
    reason = "the steps of one invocation in the partition-key mode, in order, clearer in one place"
)]
pub(crate) async fn run_shard<H: Handler>(
    settings: &Settings<H>,
    group: ShardBatch,
    invocation: &Invocation,
) -> ShardReport {
    // Every stage of this mode reads the records' keys: every record is read first.
    let ShardBatch { key, entries, .. } = group.read_whole();
    let mut report = ShardReport::empty(key.clone());
    // A closed parent's tail no invocation of the parent can run any more is run here first.
    let held = tail::gate(settings, &key, invocation, &mut report.parents).await;

    // The rows of the batch's partition keys, and the shard's own, read at once.
    // With a record age told, the shard's open marks too.
    let open_row = OpenMarks::row(settings, &key);
    let read = read_keys(settings.store.as_ref(), &key, &entries, open_row)
        .await
        .map(|read| {
            let open = read
                .open
                .and_then(|state| OpenMarks::new(settings, &key, state));
            (read.keys, read.shard, open)
        });
    if let Some(held) = held {
        tracing::warn!(%held, "holding the shard back until its parents are finished");
        if let Ok((keys, _, mut open)) = read {
            mark_unrun(settings, &keys, open.as_mut(), &entries, invocation.now()).await;
        }
        return stop_all(report, &entries, StopReason::Held(held));
    }
    let (mut keys, shard_row, mut open) = match read {
        Ok(read) => read,
        Err(RowsUnread::Store(error)) => {
            tracing::error!(%error, "could not read the partition keys' rows; processing nothing");
            return stop_all(report, &entries, StopReason::Store(error.to_string()));
        }
        Err(RowsUnread::Checkpoint(row, error)) => {
            tracing::error!(%error, row = %row, "a partition key's checkpoint is unreadable; processing nothing");
            return stop_all(
                report,
                &entries,
                StopReason::BadCheckpoint(error.to_string()),
            );
        }
    };
    let shard_checkpoint = match shard_owner(&shard_row, invocation.now()) {
        Some(owner) => {
            tracing::warn!(
                holder = owner,
                "another consumer holds the shard's lease; processing nothing"
            );
            let owner = Some(owner.to_owned());
            mark_unrun(settings, &keys, open.as_mut(), &entries, invocation.now()).await;
            return stop_all(report, &entries, StopReason::LeaseHeld { owner });
        }
        None => match shard_row.position() {
            Ok(checkpoint) => checkpoint,
            Err(error) => {
                tracing::error!(%error, "the shard's checkpoint is unreadable; processing nothing");
                return stop_all(
                    report,
                    &entries,
                    StopReason::BadCheckpoint(error.to_string()),
                );
            }
        },
    };

    // Records of the lane the mapping skipped run first, in order, as the batch's own.
    let found = gaps::recover(
        settings,
        &key,
        &entries,
        &mut keys,
        shard_checkpoint.as_ref(),
        invocation,
        open.as_ref(),
    )
    .await;
    let Found {
        entries: mut all,
        unread,
        read_to,
        gap,
        lane,
        open_read,
        aged,
    } = match found {
        Ok(found) => found,
        Err(unread) => {
            let (gap, reason) = *unread;
            // Nothing runs and the batch is reported at its first record, as a held batch is.
            mark_unrun(settings, &keys, open.as_mut(), &entries, invocation.now()).await;
            let mut report = stop_all(report, &entries, reason);
            report.gap = Some(gap);
            return report;
        }
    };
    let recovered = all.len();
    all.extend(entries);
    let entries = all;
    // When the mapping may give up on the batch, its keys are marked before anything runs: an
    // invocation that dies on every delivery leaves those marks for the lane's next batch.
    marks::mark_early(
        settings,
        &mut keys,
        &entries,
        shard_checkpoint.as_ref(),
        invocation.now(),
    )
    .await;

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
    // A range read in part runs alone: the batch comes again once the rest is read.
    let runnable = if unread.is_some() {
        recovered
    } else {
        entries.len()
    };
    let mut run = run_by_key(
        &runner,
        &entries[..runnable],
        &keys,
        shard_checkpoint.as_ref(),
    )
    .await;
    run.states.resize_with(entries.len(), || State::Waiting);

    // The first record of what the lane skipped not done (or not read yet), while there is one.
    // A part read only for the batch's age and done whole is settled by its keys' checkpoints
    // instead (`AgedPart`): where it goes on may be any key's record.
    let pending = |run: &keyed::Run| {
        let lowest = run.lowest_not_done();
        if lowest < recovered {
            Some(entries[lowest].position())
        } else {
            unread.clone().filter(|_| lane.is_some())
        }
    };
    // (Not a part read for the shard's open marks alone: it started at a mark, not at the
    // keys' checkpoints, so it says nothing of their records before it.)
    let aged_part = read_to
        .filter(|_| aged && unread.is_some())
        .map(|through| AgedPart { through, recovered });
    // A range read in part: the lane's keys keep the marks that proved it, and its rows say
    // where the next part starts.
    let in_parts = lane
        .as_ref()
        .filter(|_| unread.is_some())
        .map(|lane| lane.marks.as_slice());
    // Where Lambda redelivers the lane from: the lowest record of the batch not done, or the
    // batch's first while anything the lane skipped is not done.
    // (For the run's states as they end: a record failing at the commit lowers it.)
    let marks = |run: &keyed::Run| {
        let lowest = run.lowest_not_done();
        let pending = pending(run);
        let reported_at = if pending.is_none() {
            entries.get(lowest).map(Entry::position)
        } else {
            entries.get(recovered).map(Entry::position)
        };
        marks::marks(
            &keys,
            &entries[recovered..],
            pending.as_ref(),
            reported_at.as_ref(),
            in_parts,
        )
    };
    let batch = Batch {
        key: &key,
        entries: &entries,
        keys: &keys,
        ttl: settings.key_ttl,
        now: invocation.now(),
        aged_part,
    };
    let refused = last_write::commit(&runner, &batch, &mut run, &marks).await;
    // Once every key's row is written, the lane's rows say where the next part starts.
    if let (Some(lane), Some(progress), true) = (
        lane.as_ref().filter(|_| in_parts.is_some()),
        pending(&run),
        refused.is_empty(),
    ) {
        gaps::advance_lane(settings, &key, lane, &progress, invocation.now()).await;
    }
    if let Some(open) = &mut open {
        // Once every key's row is written: where the reading for the open marks stopped.
        if let (true, true, Some(first)) = (open_read, refused.is_empty(), entries.get(recovered)) {
            let through = unread.clone().unwrap_or_else(|| first.position());
            open::advance(settings, open, &through, unread.is_none(), invocation.now()).await;
        }
        // The record Lambda delivers the lane from again, which the mapping may give up on (at
        // most the batch's first when a key's row was refused: its records come again).
        let lowest = run.lowest_not_done();
        let reported = if pending(&run).is_some() || !refused.is_empty() {
            entries.get(recovered)
        } else {
            entries.get(lowest)
        };
        if let Some(first) = entries.get(recovered) {
            open::after_batch(settings, open, first, reported, invocation.now()).await;
        }
    }
    // A range read in part only because the batch was old (no mark proved it): its keys are
    // marked at its first record not done (one of theirs) or, the part done whole, at the
    // batch's first record, and the lane's row of that mark says where the reading goes on.
    // (Never at where the next part starts: that record may be any key's, another lane's mark.)
    if let (None, Some(unread), true) = (lane.as_ref(), unread.as_ref(), refused.is_empty()) {
        let at = match pending(&run) {
            Some(failed) => Some((failed.clone(), failed)),
            None => entries
                .get(recovered)
                .map(|first| (first.position(), unread.clone())),
        };
        if let Some((mark, progress)) = at {
            gaps::settle_aged(settings, &key, &mark, &progress, invocation.now()).await;
        }
    }
    // (A transactional commit marks them itself: a key's earlier transactions may have landed.)
    if !refused.is_empty() && !settings.transactional {
        // Those keys' records run again when redelivered: mark them so, and report from the
        // first of them if it is lower than the first record not done.
        for (index, state) in run.states.iter_mut().enumerate() {
            let refused_key = entries[index]
                .routing_key()
                .is_some_and(|partition_key| refused.iter().any(|(k, _)| k == partition_key));
            // A dead letter whose row was not written is sent again on redelivery: it is
            // not checkpointed either.
            if refused_key && matches!(state, State::Done(d, _) if d.runs_again_unrecorded()) {
                *state = State::Done(Disposition::Uncheckpointed, false);
            }
        }
    }
    let mut report = report;
    report.gap = gap;
    let cut = (unread.is_some()).then_some(recovered);
    finish(&runner, report, &entries, &run, refused, recovered, cut).await
}

/// Marks the batch's keys at its first record, and lists that record among the shard's open
/// marks, for a batch of which nothing runs and which is reported there: held by the gate, by
/// another consumer's live lease on the shard (the seed crate's, or a child's invocation running
/// this closed parent's tail), or by a skipped range it could not read. A batch of the lane
/// after the mapping gave up on this one (with no retries it delivers it only once) then finds
/// what it skipped; unmarked, the lane's next batch moved its keys' checkpoints past it.
async fn mark_unrun<H>(
    settings: &Settings<H>,
    keys: &HashMap<String, KeyRow>,
    open: Option<&mut OpenMarks>,
    entries: &[Entry],
    now: u64,
) {
    let Some(first) = entries.first() else {
        return;
    };
    marks::mark_held(settings, keys, &first.position(), now).await;
    if let Some(open) = open {
        open::open(settings, open, first, now).await;
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
