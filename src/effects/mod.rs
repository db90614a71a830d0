//! Exactly-once effects into `DynamoDB`: a record's writes committed in one transaction with
//! the checkpoint past it.
//!
//! Effectively-once leaves one window open: an invocation that dies between a handler's effect
//! and the checkpoint runs the record again, and the effect happens twice. When the effect is a
//! write into `DynamoDB`, the window can be closed: the handler does not write, it says what to
//! write ([`Writes`]), and the processor commits those writes and the checkpoint's advance, on
//! condition of still holding the lease, in one `TransactWriteItems`. Either both land or
//! neither does; a record whose writes did not land was not checkpointed, and runs again.
//!
//! A transaction holds at most 100 actions and 4 MB, and no two actions on one item
//! (the engine cuts a batch's records into as few transactions as those limits
//! allow, each moving the checkpoint to its last record). Each carries a `ClientRequestToken`
//! made from the shard, the claim's fencing counter and the range of records, so the SDK's
//! retry of a transaction whose answer was lost applies it once (`DynamoDB` remembers a token
//! for 10 minutes). A write refused by its own condition cancels its transaction: the records
//! before it are committed without it, and the record fails as its
//! [`OnConditionFailed`] says, with a [`ConditionFailed`] error that names the table, the key
//! and the condition.
//!
//! The handler's side is [`TransactionalHandler`](crate::processor::TransactionalHandler),
//! run by [`Processor::transactional`](crate::Processor::transactional) (the shard mode) or
//! [`Processor::transactional_by_partition_key`](crate::Processor::transactional_by_partition_key),
//! where the checkpoint action is each key's row instead of the lease row. This module holds
//! what the stores share: the writes, the limits, and the tables the memory store keeps.
//!
//! | file | what |
//! |---|---|
//! | `write` | [`Write`], [`Writes`], [`ItemId`], [`OnConditionFailed`] |
//! | `chunk` | the limits and how records are cut into transactions; the request token |
//! | `model` | the memory store's tables and the expressions it evaluates |

mod chunk;
mod model;
mod write;

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

pub use chunk::{MAX_ACTIONS, MAX_BYTES, TooLarge};
pub(crate) use chunk::{Room, next_chunk, token};
pub use model::{Item, Unsupported};
pub(crate) use model::{Refused, Tables};
pub use write::{ItemId, MissingKey, OnConditionFailed, Write, Writes};

/// A record's writes refused by their own condition: the transaction was cancelled, nothing of
/// it landed, and the record failed.
///
/// ```
/// use kinesis_checkpoint::effects::ConditionFailed;
///
/// let error = ConditionFailed::new("balances {id = \"a-1\"}", Some("total >= :amount"), "ConditionalCheckFailed");
/// assert_eq!(
///     error.to_string(),
///     "the write to balances {id = \"a-1\"} was refused by its condition 'total >= :amount' (ConditionalCheckFailed)"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the write to {item} was refused by its condition '{condition}' ({reason})")]
pub struct ConditionFailed {
    item: String,
    condition: String,
    reason: String,
}

impl ConditionFailed {
    /// The write to `item` (table and key) refused by `condition`, as the store said
    /// (`reason`).
    #[must_use]
    pub fn new(item: &str, condition: Option<&str>, reason: &str) -> Self {
        Self {
            item: item.to_owned(),
            condition: condition.unwrap_or("(none)").to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// Of `write`, for `reason`.
    pub(crate) fn of(write: &Write, reason: &str) -> Self {
        Self::new(&write.item().to_string(), write.condition(), reason)
    }
}

/// Where a transactional handler's writes go while the engine runs it.
type Slot = Arc<Mutex<Option<Writes>>>;

tokio::task_local! {
    static STAGE: Slot;
}

/// Runs `future` (a handler's) so that [`stage`] inside it reaches this run; returns its output
/// and what it staged.
pub(crate) async fn staging<F: Future>(future: F) -> (F::Output, Option<Writes>) {
    let slot = Slot::default();
    let output = STAGE.scope(Arc::clone(&slot), future).await;
    let staged = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    (output, staged)
}

/// A transactional handler reached outside the engine's transactional path (through a
/// wrapper of its own): its writes would be lost, so the record fails instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a transactional handler ran outside Processor::transactional, where its writes cannot be \
     committed; the record is not done"
)]
pub struct NotStaging;

/// Hands `writes` to the run [`staging`] set up.
pub(crate) fn stage(writes: Writes) -> Result<(), NotStaging> {
    STAGE
        .try_with(|slot| {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(writes);
        })
        .map_err(|_| NotStaging)
}
