//! [`SeedStore`]: the one adapter that makes a store of the seed crate's five methods a
//! [`CheckpointStore`], with what such a store cannot keep said once, here.

use std::sync::Arc;
use std::time::Duration;

use super::checkpoints::{CheckpointStore, Claim, Commit, KeyCommit};
use super::lease::{BoxFuture, LeaseError, LeaseState, LeaseStore};
use super::row::Below;
use crate::key::LeaseKey;
use crate::sequence::{Position, SHARD_END};

/// The owner [`SeedStore::finish`](CheckpointStore::finish) takes a parent's lease as.
const GATE: &str = "kinesis-checkpoint:gate";
/// The owner [`SeedStore::commit_rows`](CheckpointStore::commit_rows) takes a key's row as.
const WRITER: &str = "kinesis-checkpoint:partition-key";
/// How long those two hold a lease they take for a moment.
const MOMENT: Duration = Duration::from_secs(10);

/// A store of the seed crate's five methods ([`LeaseStore`]), as the engine's
/// [`CheckpointStore`]: each of the engine's operations built from those five.
///
/// Five methods can hold a lease and one checkpoint string, so the adapter keeps the lease, the
/// fencing, and every whole record done. Under the documented mapping (both limits at `-1`) no
/// record is lost. What the adapter cannot keep costs duplicates or deaths not counted:
///
/// | not kept | what it costs |
/// |---|---|
/// | `failing` | attempts are counted within one invocation; a rejected record is still dead-lettered at once |
/// | `reported` (the claim's mark) | a record that kills its invocation is not found, so it is retried for ever; no gap is found outside the contract |
/// | `done_above` | records done out of order under per-key concurrency run again after a redelivery |
/// | `parent_shards`, `parentless` | the gate asks the stream for a shard's parents in every invocation |
/// | `expires_at` | a finished shard's row is never deleted by `DynamoDB`'s TTL |
/// | progress inside a KPL aggregate | the sub-records done run again after a redelivery |
/// | one request per step | a claim is `acquire` then `read`, a commit `checkpoint` then `release`; `commit_rows` cannot compare counters, so it misses a concurrent delivery of one key |
/// | transactions | `transact` is refused with [`NoTransactions`] (feature `dynamodb`) |
/// | `requests` | not counted (`None`) |
///
/// `read` and `read_rows` return whatever the inner store's `read` returns: a store that keeps
/// more than the checkpoint (the memory store does) shows it.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use kinesis_checkpoint::store::{CheckpointStore, SeedStore};
/// use kinesis_checkpoint::internal::{Claim, Commit, FailingChange};
/// use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Position};
/// use kinesis_checkpoint::store::{FailingRecord, LeaseStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_checkpoint::store::LeaseError> {
/// // Any store of the five methods; the memory store here, to look at the row.
/// let memory = Arc::new(MemoryLeaseStore::new());
/// let store = SeedStore::new(memory.clone());
/// let key = LeaseKey::new("orders", "shardId-000000000000");
/// let Claim::Acquired { .. } = store.acquire_and_read(&key, "me", Duration::from_secs(30), None).await?
/// else {
///     panic!("nobody else holds it");
/// };
/// let done = Position::record("17".parse()?);
/// let mut commit = Commit::default();
/// commit.checkpoint = Some(done.clone());
/// commit.failing = FailingChange::Set(FailingRecord::first(&done, "boom", 1));
/// assert!(store.commit(&key, "me", &commit).await?);
///
/// let row = LeaseStore::read(memory.as_ref(), &key).await?;
/// assert_eq!(row.checkpoint.as_deref(), Some("17"), "the checkpoint is kept");
/// assert_eq!(row.failing, None, "the failing record is not");
/// assert_eq!(row.lease_owner, None, "and the lease was released");
/// # Ok(())
/// # }
/// ```
pub struct SeedStore<S: ?Sized> {
    store: Arc<S>,
}

impl<S: LeaseStore + ?Sized> SeedStore<S> {
    /// Adapts `store`.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use kinesis_checkpoint::store::SeedStore;
    /// use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    ///
    /// let store = SeedStore::new(Arc::new(MemoryLeaseStore::new()));
    /// let processor = Processor::new(Arc::new(store), |_: Record| async { Outcome::ack() });
    /// ```
    #[must_use]
    pub fn new(store: Arc<S>) -> Self {
        Self { store }
    }

    /// The adapted store.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::store::SeedStore;
    /// # use kinesis_checkpoint::MemoryLeaseStore;
    /// let memory = Arc::new(MemoryLeaseStore::new());
    /// assert!(Arc::ptr_eq(SeedStore::new(memory.clone()).inner(), &memory));
    /// ```
    #[must_use]
    pub fn inner(&self) -> &Arc<S> {
        &self.store
    }

    /// Writes what five methods can of `position`: a whole record or the shard's end; inside an
    /// aggregate, only a check that the lease is still held.
    async fn checkpoint_position(
        &self,
        key: &LeaseKey,
        owner: &str,
        position: &Position,
    ) -> Result<bool, LeaseError> {
        match position.sub_sequence() {
            None => {
                self.store
                    .checkpoint(key, owner, position.checkpoint())
                    .await
            }
            Some(_) => self.store.renew(key, owner, Duration::ZERO).await,
        }
    }

    /// The record done whole that `below` names under a position inside an aggregate, if any.
    fn whole_below(position: Option<&Position>, below: &Below) -> Option<Position> {
        match (position, below) {
            (Some(position), Below::Record(prior)) if position.sub_sequence().is_some() => {
                Some(Position::record(prior.clone()))
            }
            _ => None,
        }
    }
}

impl<S: LeaseStore + ?Sized> crate::store::sealed::Sealed for SeedStore<S> {}

impl<S: LeaseStore + ?Sized> CheckpointStore for SeedStore<S> {
    fn acquire_and_read<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        // Nowhere to mark `attempting` (see `reported` above).
        let _ = attempting;
        Box::pin(async move {
            let acquired = self.store.acquire(key, owner, ttl).await?;
            let state = self.store.read(key).await?;
            // Without a mark of the batch, a lapsed owner proves no death (see `reported`).
            Ok(if acquired {
                Claim::Acquired {
                    state,
                    lapsed_mark: None,
                }
            } else {
                Claim::Held(state)
            })
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.store.renew(key, owner, ttl)
    }

    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        // Only the checkpoint is written (see the list above for the other fields).
        Box::pin(async move {
            if let Some(prior) = Self::whole_below(commit.checkpoint.as_ref(), &commit.below)
                && !self.checkpoint_position(key, owner, &prior).await?
            {
                return Ok(false);
            }
            if let Some(position) = &commit.checkpoint
                && !self.checkpoint_position(key, owner, position).await?
            {
                return Ok(false);
            }
            if !commit.keep_lease {
                self.store.release(key, owner).await?;
            }
            Ok(true)
        })
    }

    fn finish<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        // Nowhere to keep `expires_at`.
        let _ = expires_at;
        Box::pin(async move {
            if !self.store.acquire(key, GATE, MOMENT).await? {
                return Ok(false);
            }
            let row = self.store.read(key).await?;
            let unchanged = row.checkpoint.as_deref() == expected && row.unfinished().is_none();
            let written = unchanged && self.store.checkpoint(key, GATE, SHARD_END).await?;
            self.store.release(key, GATE).await?;
            Ok(written)
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        self.store.read(key)
    }

    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>> {
        Box::pin(async move {
            let mut states = Vec::with_capacity(keys.len());
            for key in keys {
                states.push(self.store.read(key).await?);
            }
            Ok(states)
        })
    }

    fn commit_rows<'a>(
        &'a self,
        commits: &'a [KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>> {
        // Neither the counter nor the failing record nor `expires_at` nor `reported` (see above).
        Box::pin(async move {
            let mut written = Vec::with_capacity(commits.len());
            for commit in commits {
                if !self.store.acquire(&commit.row, WRITER, MOMENT).await? {
                    written.push(false);
                    continue;
                }
                let mut ok = true;
                if let Some(prior) = Self::whole_below(commit.checkpoint.as_ref(), &commit.below) {
                    ok = self
                        .checkpoint_position(&commit.row, WRITER, &prior)
                        .await?;
                }
                if let Some(position) = &commit.checkpoint
                    && ok
                {
                    ok = self
                        .checkpoint_position(&commit.row, WRITER, position)
                        .await?;
                }
                self.store.release(&commit.row, WRITER).await?;
                written.push(ok);
            }
            Ok(written)
        })
    }

    #[cfg(feature = "dynamodb")]
    fn transact<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        transaction: &'a super::checkpoints::Transaction,
    ) -> BoxFuture<'a, Result<super::checkpoints::Transacted, LeaseError>> {
        // Five methods cannot commit anything with the checkpoint: refuse rather than write
        // the records' effects apart from it.
        let _ = (owner, transaction);
        let error = NoTransactions {
            row: key.to_string(),
        };
        Box::pin(async move { Err(Box::new(error) as LeaseError) })
    }

    #[cfg(feature = "dynamodb")]
    fn transact_rows<'a>(
        &'a self,
        transaction: &'a super::checkpoints::RowsTransaction,
    ) -> BoxFuture<'a, Result<super::checkpoints::RowsTransacted, LeaseError>> {
        // As `transact`: nothing written apart from the rows (which it cannot keep either).
        let error = NoTransactions {
            row: transaction
                .rows
                .first()
                .map(|commit| commit.row.to_string())
                .unwrap_or_default(),
        };
        Box::pin(async move { Err(Box::new(error) as LeaseError) })
    }

    fn requests(&self) -> Option<u64> {
        None
    }
}

/// A transactional processor over a [`SeedStore`]: a store of the seed crate's five methods
/// cannot commit a record's writes with the checkpoint, so nothing is written.
///
/// ```
/// use kinesis_checkpoint::internal::NoTransactions;
///
/// let error = NoTransactions { row: "orders:shardId-000000000000".into() };
/// assert!(error.to_string().contains("five methods"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the store of row '{row}' has only the seed crate's five methods, which cannot commit a \
     record's writes with the checkpoint; use MemoryLeaseStore or DynamoLeaseStore"
)]
pub struct NoTransactions {
    /// The row the transaction was for.
    pub row: String,
}
