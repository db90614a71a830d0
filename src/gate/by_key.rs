//! The partition-key mode's parent rule: no shard checkpoint says how far a parent got, so a
//! closed parent is finished once each of its records is at or below its key's checkpoint (or
//! the parent's own row's, written by a consumer of the whole shard). What was read of a parent
//! is kept in [`Scans`] between checks.
//!
//! # A closed parent's tail, run by its child
//!
//! The mapping may give up on a closed parent's last batches (finite `MaximumRetryAttempts`,
//! a record age, a bisected half), and it never delivers the parent again: its keys' rows stay
//! short of the parent's records, and the child would be held until the parent expires, those
//! records lost. A held child's invocation may run them itself only when no invocation of the
//! parent can still run any of them. No lease fences a parent key's lane, so that must follow
//! from time alone, and only the mapping's record age limit ([`Gate::maximum_record_age`]) gives
//! a bound: the mapping delivers no batch whose records are older than the limit, a batch is
//! delivered at most the longest batching window (5 minutes) after the mapping took it, and an
//! invocation lasts at most 15 minutes. A batch of the parent holding its youngest record can
//! run (through its lane's gap recovery) any older record of the parent, so the rule judges the
//! parent's youngest record, not the ones not done: once the whole parent has been read (in parts,
//! as the rule below reads it) and its youngest record's `ApproximateArrivalTimestamp` lies more
//! than limit + 20 minutes behind the gate's clock, the verdict names the parent
//! ([`KeyVerdict::tail`]) with its keys not done, and the engine runs their records under the
//! parent's shard lease (sibling children of a split, or the two parents' child of a merge, never
//! run it twice at once; another live owner, a consumer of the whole shard, keeps the child
//! held), then asks again: the parent is then finished and marked `SHARD_END`.
//!
//! `MaximumRetryAttempts` alone gives no bound: the row counts no mapping retries, the time
//! between them is the mapping's (its back-off is not documented, and a throttled or bisected
//! batch is retried apart from its attempts), so a retry of the parent's last batch may come at
//! any time until the records expire from the stream. With retries finite and no record age, a
//! parent's discarded tail still holds its children until the parent expires.
//!
//! A parent longer than what one held check reads may never be read whole: a check in a new
//! process starts again after the parent row's checkpoint, which stops at the first key not
//! done. Until it is, the rule judges a later arrival ([`closed_before`]): the held shard's
//! oldest record, since a closed shard takes no record once closed and its children none before;
//! the verdict's tail then names no keys, and its records run whatever their key, each deduped
//! by its key's row.
//!
//! Cost, only with a record age told: while a key of a closed parent is not done, each held
//! check also reads on in the parent (one part of at most 10,000 records) until it has read the
//! whole parent, to learn its youngest record, and each process reads the held shard's oldest
//! record once; then nothing more until the rule applies.
//!
//! [`Gate::maximum_record_age`]: super::Gate::maximum_record_age

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::lineage::{Lineage, held_unknown};
use super::parent_end;
use super::parent_scan::{self, ParentScan, end_of_everything};
use super::topology::StartingPosition;
use crate::gap::ReadBudget;
use crate::key::LeaseKey;
use crate::report::Held;
use crate::sequence::{Position, ReadFrom, SequenceNumber, SkippedRange};
use crate::store::{CheckpointStore, LeaseError};

/// How long reading a held shard's oldest record may take (see [`closed_before`]).
const OLDEST_READ_TIME: Duration = Duration::from_secs(2);

/// What the partition-key mode learnt of closed parents not yet finished, and of the shards
/// they hold: the arrival of each held shard's oldest record (see [`closed_before`]).
#[derive(Default)]
pub(super) struct Scans {
    parents: Mutex<HashMap<LeaseKey, ParentScan>>,
    oldest: Mutex<HashMap<LeaseKey, u64>>,
}

impl Scans {
    pub(super) fn take(&self, parent: &LeaseKey) -> ParentScan {
        self.parents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(parent)
            .unwrap_or_default()
    }

    pub(super) fn keep(&self, parent: &LeaseKey, scan: ParentScan) {
        self.parents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(parent.clone(), scan);
    }
}

/// The partition-key mode's verdict on a shard.
#[derive(Debug, Default)]
pub(crate) struct KeyVerdict {
    /// `None` when each parent is finished: the shard may run. Why it waits otherwise.
    pub(crate) held: Option<Held>,
    /// The closed parent that holds it, when no invocation of that parent can still run any of
    /// its records (see [the module](self)): the child's invocation may run them.
    pub(crate) tail: Option<KeyTail>,
    /// A closed parent read in part whose every record up to this one is done, above its row's
    /// checkpoint: the child's invocation records it there, so that a gate in another process
    /// reads on from it instead of from the parent's start (what a gate learns of a parent is
    /// kept in its own process only).
    pub(crate) done_through: Option<(LeaseKey, SequenceNumber)>,
}

/// A closed parent's tail no invocation of the parent can run any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyTail {
    /// The parent.
    pub(crate) parent: LeaseKey,
    /// Its partition keys not done (each with a record above its row's checkpoint and the
    /// parent row's), sorted, when the whole parent was read; `None` when it was read in part
    /// only (its records are then run whatever their key, each deduped by its key's row).
    pub(crate) keys: Option<Vec<String>>,
    /// Where to read: after the parent row's checkpoint (from the horizon without one) to the
    /// shard's end.
    pub(crate) range: SkippedRange,
}

/// Whether the shard of `key` may run now in the partition-key mode (see [`KeyVerdict`]). The
/// shard's parents come from the topology (cached per process); a parent is finished when its
/// row says `SHARD_END`, when it has expired, or when it is closed and each of its records is
/// at or below its key's checkpoint; the gate then marks it `SHARD_END`. `tails`: the age
/// (milliseconds) past which a closed parent's youngest record proves that no invocation of the
/// parent can run any of its records; `None` (no record age told): never.
pub(super) async fn check(
    lineage: &Lineage,
    scans: &Scans,
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    tails: Option<u64>,
) -> KeyVerdict {
    let held = |held| KeyVerdict {
        held: Some(held),
        ..KeyVerdict::default()
    };
    let parents = match lineage.shard(key.stream(), key.shard(), false).await {
        Ok(Some(info)) => info.parents,
        Ok(None) => {
            return held(Held::Unknown {
                error: format!("shard {} is not listed by the stream", key.shard()),
            });
        }
        Err(error) => return held(held_unknown(&error)),
    };
    let tails = tails.map(|bound| Tails { bound, held: key });
    for parent in parents {
        let parent = LeaseKey::new(key.stream(), parent.as_str());
        match parent_keys_finished(lineage, scans, store, &parent, tails).await {
            Ok(None) => {}
            Ok(Some(verdict)) => return verdict,
            Err(error) => return held(held_unknown(&error)),
        }
    }
    KeyVerdict::default()
}

/// The tail rule of a check (see [the module](self)), when the gate knows the record age.
#[derive(Clone, Copy)]
struct Tails<'a> {
    /// The age (milliseconds) past which a closed parent's youngest record proves that no
    /// invocation of the parent can run any of its records.
    bound: u64,
    /// The shard the check is for: every record of its ancestors arrived before its own.
    held: &'a LeaseKey,
}

/// `None` when `parent` is finished; why the child waits otherwise, and the tail it may run.
async fn parent_keys_finished(
    lineage: &Lineage,
    scans: &Scans,
    store: &dyn CheckpointStore,
    parent: &LeaseKey,
    tails: Option<Tails<'_>>,
) -> Result<Option<KeyVerdict>, LeaseError> {
    let (row, info) = match lineage.closed_parent(store, parent).await? {
        Ok(closed) => closed,
        Err(settled) => {
            return Ok(settled.map(|held| KeyVerdict {
                held: Some(held),
                ..KeyVerdict::default()
            }));
        }
    };
    // A consumer of the whole shard sharing the table (the seed crate's) may have
    // checkpointed the parent: its records up to there are done, whatever their key.
    let shard_checkpoint = row.position()?;
    let mut scan = scans.take(parent);
    scan.starting_after(shard_checkpoint.as_ref());
    let learn = tails.is_some();
    let verdict = scan_parent(
        lineage,
        store,
        parent,
        shard_checkpoint.as_ref(),
        (&mut scan, learn),
    )
    .await;
    let empty = scan.ends.is_empty();
    let complete = scan.complete;
    let youngest = scan.youngest.filter(|_| complete);
    let done_through = scan
        .done_through()
        .filter(|done| {
            shard_checkpoint
                .as_ref()
                .is_none_or(|checkpoint| Position::record((*done).clone()) > *checkpoint)
        })
        .map(|done| (parent.clone(), done.clone()));
    let read_to = scan.read_to().cloned();
    scans.keep(parent, scan);
    if let Some((held, waiting)) = verdict? {
        let now = lineage.clock.now_millis();
        // The parent's youngest record: read here, or learnt over the checks of every process
        // (`parent_end`: a check in a new process starts again after the parent row's
        // checkpoint, so a long parent may never be read whole here); until then a later
        // arrival, the held shard's oldest record's.
        let youngest = match (youngest, tails) {
            (Some(youngest), _) => Some(youngest),
            (None, Some(tails)) if !waiting.is_empty() => {
                match parent_end::youngest_arrival(lineage, store, parent, read_to.as_ref()).await {
                    Some(youngest) => Some(youngest),
                    None => closed_before(lineage, scans, tails.held).await,
                }
            }
            (None, _) => None,
        };
        // No invocation of the parent can run any of its records any more.
        let beyond = tails
            .zip(youngest)
            .is_some_and(|(tails, youngest)| now.saturating_sub(youngest) > tails.bound);
        let from = match &shard_checkpoint {
            None => Some(ReadFrom::TrimHorizon),
            Some(checkpoint) => ReadFrom::resuming(checkpoint),
        };
        let tail = from
            .filter(|_| beyond && !waiting.is_empty())
            .map(|from| KeyTail {
                parent: parent.clone(),
                // Every key not done is known only once the whole parent was read.
                keys: complete.then_some(waiting),
                range: SkippedRange {
                    from,
                    before: end_of_everything(),
                },
            });
        return Ok(Some(KeyVerdict {
            held: Some(held),
            tail,
            done_through,
        }));
    }
    // An empty parent is finished only once its own parents are (see `parent_finished`).
    if empty
        && let Some(verdict) =
            ancestors_finished(lineage, scans, store, parent, &info.parents, tails).await?
    {
        return Ok(Some(verdict));
    }
    lineage
        .finish(store, parent, row.checkpoint.as_deref())
        .await?;
    if lineage.is_finished(parent) {
        // Finished stays finished: what was learnt of it is no longer needed.
        scans.take(parent);
    }
    Ok(None)
}

/// Checks the closed `parent`'s keys against their rows, reading on in the parent only
/// when every key known so far is done (or, with `learn`, until the whole parent is read: its
/// youngest record tells when its tail may run from a child): `None` once every key of the
/// whole parent is done; otherwise why the child waits, and the keys known not done.
async fn scan_parent(
    lineage: &Lineage,
    store: &dyn CheckpointStore,
    parent: &LeaseKey,
    shard_checkpoint: Option<&Position>,
    (scan, learn): (&mut ParentScan, bool),
) -> Result<Option<(Held, Vec<String>)>, LeaseError> {
    let mut read = false;
    loop {
        let pending: Vec<String> = scan.pending().into_iter().map(str::to_owned).collect();
        if !pending.is_empty() {
            let rows: Vec<LeaseKey> = pending
                .iter()
                .map(|partition_key| crate::key::row_key(parent, partition_key))
                .collect();
            let states = store.read_rows(&rows).await?;
            let mut waiting = Vec::new();
            for (partition_key, state) in pending.iter().zip(&states) {
                let end = &scan.ends[partition_key];
                let done = state
                    .position()?
                    .iter()
                    .chain(shard_checkpoint)
                    .any(|checkpoint| end <= checkpoint);
                // A key never read here may never come when the mapping does not start
                // at the horizon; at the horizon it will.
                let never_read = state.lease_counter == 0;
                if done {
                    scan.done.insert(partition_key.clone());
                } else if !never_read || lineage.starting_position == StartingPosition::TrimHorizon
                {
                    waiting.push(partition_key.clone());
                }
            }
            if let Some(first) = waiting.first() {
                if learn && !scan.complete && !read {
                    // One part per check, to learn the parent's youngest record.
                    scan.read_on(lineage.topology.as_ref(), parent).await?;
                }
                let held = Held::Unfinished {
                    parent: parent.shard().to_owned(),
                    checkpoint: Some(parent_scan::describe(first, &scan.ends[first])),
                };
                return Ok(Some((held, waiting)));
            }
        }
        if scan.complete {
            return Ok(None);
        }
        if read {
            // One part per check: the next held batch reads on.
            let held = Held::Unfinished {
                parent: parent.shard().to_owned(),
                checkpoint: Some(format!(
                    "{} partition keys of the closed parent read so far, all done; reading on",
                    scan.ends.len()
                )),
            };
            return Ok(Some((held, Vec::new())));
        }
        scan.read_on(lineage.topology.as_ref(), parent).await?;
        read = true;
    }
}

/// `None` when every one of `parents` (of the shard `of`) is finished by its keys; why it
/// waits otherwise, and the tail it may run.
async fn ancestors_finished(
    lineage: &Lineage,
    scans: &Scans,
    store: &dyn CheckpointStore,
    of: &LeaseKey,
    parents: &[String],
    tails: Option<Tails<'_>>,
) -> Result<Option<KeyVerdict>, LeaseError> {
    for grandparent in parents {
        let grandparent = LeaseKey::new(of.stream(), grandparent.as_str());
        if let Some(verdict) = Box::pin(parent_keys_finished(
            lineage,
            scans,
            store,
            &grandparent,
            tails,
        ))
        .await?
        {
            return Ok(Some(verdict));
        }
    }
    Ok(None)
}

/// The arrival (epoch milliseconds) of the oldest record still in `held`, read once per process:
/// a closed shard takes no record after it closed, and its children take records only once it
/// has, so each record of every ancestor of `held` arrived no later. `None` when it cannot be
/// read (logged; the parent's own youngest record, once it has been read whole, still serves).
async fn closed_before(lineage: &Lineage, scans: &Scans, held: &LeaseKey) -> Option<u64> {
    let known = scans
        .oldest
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(held)
        .copied();
    if known.is_some() {
        return known;
    }
    let range = SkippedRange {
        from: ReadFrom::TrimHorizon,
        before: end_of_everything(),
    };
    // One record; a few empty pages at most, as an open shard's reading never ends by itself.
    let deadline = lineage.clock.now() + OLDEST_READ_TIME;
    let budget = ReadBudget::new(1, Some(deadline));
    let read = lineage
        .topology
        .read_range(held.stream(), held.shard(), &range, budget)
        .await;
    let oldest = match read {
        Ok(read) => read
            .records
            .first()
            .map(|record| crate::clock::millis_since_epoch(record.arrival()))?,
        Err(error) => {
            tracing::warn!(stream = held.stream(), shard = held.shard(), %error, "could not read the held shard's oldest record, which bounds when its closed parents' tails may run");
            return None;
        }
    };
    scans
        .oldest
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(held.clone(), oldest);
    Some(oldest)
}
