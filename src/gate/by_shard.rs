//! The shard mode's parent rule: a parent is finished when its row says `SHARD_END`, when it
//! has expired from the stream, or when it is provably exhausted (closed, nothing left undone
//! at its checkpoint, and nothing after it in the stream), and then the gate marks it so.

use super::lineage::{Lineage, held_unknown};
use super::topology::StartingPosition;
use crate::key::LeaseKey;
use crate::report::Held;
use crate::store::{CheckpointStore, LeaseError, LeaseState};

/// What the gate found for a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `None` when the shard may run; why it waits otherwise.
    pub held: Option<Held>,
    /// The shard's parents as just learnt from the stream, to be written to its row (an empty
    /// list: it has none); `None` when the row already knew them, or nothing was learnt.
    pub learnt_parents: Option<Vec<String>>,
}

/// A verdict that holds the shard because `error` left its parents unknown.
fn unknown(error: &dyn std::fmt::Display) -> Verdict {
    Verdict {
        held: Some(held_unknown(error)),
        learnt_parents: None,
    }
}

/// Whether the shard of `key`, whose row is `state`, may run now.
pub(super) async fn check(
    lineage: &Lineage,
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    state: &LeaseState,
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
                return Verdict {
                    held: Some(held),
                    learnt_parents,
                };
            }
            Err(error) => return unknown(&error),
        }
    }
    Verdict {
        held: None,
        learnt_parents,
    }
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
    // A partial aggregate or a failing record after the checkpoint is not done, although the
    // stream may hold nothing after it: the parent is not exhausted.
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
