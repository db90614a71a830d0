//! The shard mode's parent rule: a parent is finished when its row says `SHARD_END`, when it
//! has expired from the stream, or when it is provably exhausted (closed, nothing left undone
//! at its checkpoint, and nothing after it in the stream), and then the gate marks it so.
//!
//! A held child may also be told which closed parent's tail its invocation may recover itself
//! ([`Verdict::tail`]; see "Parent tail recovery" in the [gate](super)): one whose row proves
//! trouble.

use super::lineage::{Lineage, held_unknown};
use super::parent_scan::end_of_everything;
use super::topology::StartingPosition;
use crate::gap::{ReadFrom, SkippedRange};
use crate::key::LeaseKey;
use crate::report::Held;
use crate::sequence::Position;
use crate::store::{CheckpointStore, LeaseError, LeaseState};

/// What the gate found for a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `None` when the shard may run; why it waits otherwise.
    pub held: Option<Held>,
    /// The shard's parents as just learnt from the stream, to be written to its row (an empty
    /// list: it has none); `None` when the row already knew them, or nothing was learnt.
    pub learnt_parents: Option<Vec<String>>,
    /// The closed, unfinished parent (or ancestor) that holds the shard and whose row proves
    /// trouble: the invocation may recover its tail under its lease, then ask again.
    pub(crate) tail: Option<LeaseKey>,
}

/// A verdict that holds the shard because `error` left its parents unknown.
fn unknown(error: &dyn std::fmt::Display) -> Verdict {
    Verdict {
        held: Some(held_unknown(error)),
        learnt_parents: None,
        tail: None,
    }
}

/// Whether the shard of `key`, whose row is `state`, may run now. `aged`: the mapping has a
/// record age limit and starts at `TRIM_HORIZON` (a parent never read may have been dropped
/// whole for its age, see [`troubled`]).
pub(super) async fn check(
    lineage: &Lineage,
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    state: &LeaseState,
    aged: bool,
) -> Verdict {
    // A row that records the parents (or that there are none) costs the stream nothing: after
    // a cold start, an original shard's batch asks Kinesis no question.
    let (parents, learnt_parents) = if let Some(known) = state.known_parents() {
        (known.to_vec(), None)
    } else {
        match lineage.shard(key.stream(), key.shard(), false).await {
            Ok(Some(info)) => (info.parents.clone(), Some(info.parents)),
            Ok(None) => {
                return Verdict {
                    held: Some(Held::Unknown {
                        error: format!("shard {} is not listed by the stream", key.shard()),
                    }),
                    learnt_parents: None,
                    tail: None,
                };
            }
            Err(error) => return unknown(&error),
        }
    };
    for parent in parents {
        match parent_finished(
            lineage,
            store,
            &LeaseKey::new(key.stream(), parent.as_str()),
        )
        .await
        {
            Ok(None) => {}
            Ok(Some(held)) => {
                let tail = match troubled(store, key, &held, aged).await {
                    Ok(tail) => tail,
                    Err(error) => return unknown(&error),
                };
                return Verdict {
                    held: Some(held),
                    learnt_parents,
                    tail,
                };
            }
            Err(error) => return unknown(&error),
        }
    }
    Verdict {
        held: None,
        learnt_parents,
        tail: None,
    }
}

/// The closed parent that `held` names, when its row proves trouble: a `reported` record (the
/// toolkit removes it once it passes it; one left at or below the checkpoint was overtaken by
/// another writer, which knew nothing of what the mapping skipped), or a `contended` mark
/// not known done (above the checkpoint, or passed by another writer). The mapping may have given up on the batch it names, and if that was
/// the parent's last, it will never deliver the parent again. Also any closed parent not
/// finished, when the mapping has a record age limit (`aged`): the records of its tail older
/// than the limit the mapping dropped (or will) without a delivery, which leaves no mark (a
/// parent never read: no row at all); its tail is read, and only the records already too old
/// run unless the row proves trouble (the engine's `read_tail`).
async fn troubled(
    store: &dyn CheckpointStore,
    child: &LeaseKey,
    held: &Held,
    aged: bool,
) -> Result<Option<LeaseKey>, LeaseError> {
    let (Held::Unfinished { parent, .. } | Held::NeverRead { parent }) = held else {
        return Ok(None);
    };
    let parent = LeaseKey::new(child.stream(), parent.as_str());
    if aged {
        return Ok(Some(parent));
    }
    let row = store.read(&parent).await?;
    let checkpoint = row.position().ok().flatten();
    let contended = crate::gap::contended_open(&row, checkpoint.as_ref());
    Ok((row.reported.is_some() || contended).then_some(parent))
}

/// Where a closed parent's tail starts, from its row (`None` when it is finished): after its
/// checkpoint, at the aggregate the checkpoint is inside of (dedupe drops the sub-records done),
/// or, never checkpointed, at the horizon when the mapping starts there, else at the row's first
/// mark (the mapping's first delivery). It ends at the shard's end.
pub(super) fn tail_range(lineage: &Lineage, row: &LeaseState) -> Option<SkippedRange> {
    let from = match row.position().ok()? {
        Some(checkpoint) => ReadFrom::resuming(&checkpoint)?,
        None if lineage.starting_position == StartingPosition::TrimHorizon => ReadFrom::TrimHorizon,
        None => match [row.reported.as_ref(), row.contended.as_ref()]
            .into_iter()
            .flatten()
            .min()?
        {
            Position::Record { sequence, .. } => ReadFrom::At(sequence.clone()),
            Position::ShardEnd => return None,
        },
    };
    Some(SkippedRange {
        from,
        before: end_of_everything(),
    })
}

/// `None` when the parent is finished; why the child waits otherwise.
async fn parent_finished(
    lineage: &Lineage,
    store: &dyn CheckpointStore,
    parent: &LeaseKey,
) -> Result<Option<Held>, LeaseError> {
    let (row, info) = match lineage.closed_parent(store, parent).await? {
        Ok(closed) => closed,
        Err(settled) => return Ok(settled),
    };
    // A partial aggregate or a failing record at the checkpoint is not done, although the
    // stream may hold nothing after the checkpoint (the aggregate is the record at it, in
    // rows of the 0.1.0 form): the parent is not exhausted.
    if let Some(undone) = row.unfinished() {
        return Ok(Some(Held::Unfinished {
            parent: parent.shard().to_owned(),
            checkpoint: Some(format!(
                "{}: {undone}",
                row.checkpoint.as_deref().unwrap_or("none")
            )),
        }));
    }
    let after = row.checkpoint.as_deref();
    if lineage
        .topology
        .exhausted(parent.stream(), parent.shard(), after)
        .await?
    {
        // A parent never processed (no checkpoint: it had nothing to deliver) is finished
        // only once its own parents are: a merge of two empty children of a split must not
        // let its child run before the split's parent is done.
        if after.is_none()
            && let Some(held) = ancestors_finished(lineage, store, parent, &info.parents).await?
        {
            return Ok(Some(held));
        }
        lineage.finish(store, parent, after).await?;
        return Ok(None);
    }
    let never_read =
        row.checkpoint.is_none() && row.lease_owner.is_none() && row.lease_counter == 0;
    if never_read {
        if lineage.starting_position == StartingPosition::TrimHorizon {
            return Ok(Some(Held::NeverRead {
                parent: parent.shard().to_owned(),
            }));
        }
        tracing::warn!(
            parent = parent.shard(),
            "the parent was never read here and the mapping does not start at TRIM_HORIZON: not waiting for it"
        );
        return Ok(None);
    }
    Ok(Some(Held::Unfinished {
        parent: parent.shard().to_owned(),
        checkpoint: row.checkpoint,
    }))
}

/// `None` when every one of `parents` (of the shard `of`) is finished; why it waits
/// otherwise.
async fn ancestors_finished(
    lineage: &Lineage,
    store: &dyn CheckpointStore,
    of: &LeaseKey,
    parents: &[String],
) -> Result<Option<Held>, LeaseError> {
    for grandparent in parents {
        let grandparent = LeaseKey::new(of.stream(), grandparent.as_str());
        if let Some(held) = Box::pin(parent_finished(lineage, store, &grandparent)).await? {
            return Ok(Some(held));
        }
    }
    Ok(None)
}
