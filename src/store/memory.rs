//! [`MemoryLeaseStore`]: leases and checkpoints in the process's memory.
//!
//! The embedded default: it needs no server, so the demo, the local event source and the
//! simulation tests run on it. It keeps the whole schema (sub-sequence checkpoints, owners,
//! expiries, the fencing counter) and does every combined operation under one lock, so it
//! behaves like the `DynamoDB` store's conditional writes. Nothing survives the process.
//!
//! It implements both interfaces: [`CheckpointStore`], which the engine uses, with every field,
//! and the seed crate's [`LeaseStore`], for a consumer of the seed crate sharing it, and for the
//! tests of [`SeedStore`](crate::store::SeedStore).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::checkpoints::{
    CheckpointStore, Claim, Commit, FailingChange, KeyCommit, ReportedChange,
};
use super::lease::{BoxFuture, LeaseError, LeaseState, LeaseStore};
use super::row::{Below, RowForm};
use crate::clock::{self, Clock};
use crate::key::LeaseKey;
use crate::sequence::Position;

/// In-process lease coordination, correct within one process.
///
/// Expired leases are stealable, checkpoints survive release, and two streams with the same
/// shard id are two leases.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore};
/// use kinesis_checkpoint::store::LeaseStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_checkpoint::store::LeaseError> {
/// let store = MemoryLeaseStore::new();
/// let key = LeaseKey::new("orders", "shardId-000000000000");
/// assert!(store.acquire(&key, "a", Duration::from_secs(30)).await?);
/// assert!(!store.acquire(&key, "b", Duration::from_secs(30)).await?, "a holds it");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct MemoryLeaseStore {
    rows: Mutex<HashMap<LeaseKey, LeaseState>>,
    /// What lease expiries are written and judged by.
    clock: Arc<dyn Clock>,
    /// The tables a transactional handler's writes land in, and the request tokens seen.
    #[cfg(feature = "dynamodb")]
    effects: Mutex<effects::Effects>,
}

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        Self::with_clock(clock::system())
    }
}

impl MemoryLeaseStore {
    /// Creates an empty store.
    ///
    /// ```
    /// # use kinesis_checkpoint::MemoryLeaseStore;
    /// let store = MemoryLeaseStore::new();
    /// assert!(store.snapshot().is_empty());
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates an empty store whose lease expiries are written and judged by `clock` (a
    /// simulation's virtual clock; [`new`](Self::new) takes the system's).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use kinesis_checkpoint::clock::SystemClock;
    /// # use kinesis_checkpoint::store::{LeaseError, LeaseStore};
    /// # use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore};
    /// # use std::sync::Arc;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), LeaseError> {
    /// let store = MemoryLeaseStore::with_clock(Arc::new(SystemClock));
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// store.acquire(&key, "a", Duration::from_secs(30)).await?;
    /// assert!(store.snapshot()[&key].lease_expiry.is_some());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            rows: Mutex::default(),
            clock,
            #[cfg(feature = "dynamodb")]
            effects: Mutex::default(),
        }
    }

    /// Every row, for tests and the demo's summary.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore};
    /// # use kinesis_checkpoint::store::LeaseStore;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let store = MemoryLeaseStore::new();
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// store.acquire(&key, "a", Duration::from_secs(30)).await?;
    /// assert_eq!(store.snapshot()[&key].lease_owner.as_deref(), Some("a"));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn snapshot(&self) -> HashMap<LeaseKey, LeaseState> {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<LeaseKey, LeaseState>> {
        // A panic elsewhere cannot leave a row half-written: every change below is a few
        // assignments with nothing that panics in between.
        self.rows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with_row<R>(&self, key: &LeaseKey, change: impl FnOnce(&mut LeaseState) -> R) -> R {
        let mut rows = self.lock();
        if let Some(row) = rows.get_mut(key) {
            return change(row);
        }
        change(rows.entry(key.clone()).or_default())
    }

    /// Takes the lease when it is free, ours, or expired; bumps the counter as a write does.
    fn take(row: &mut LeaseState, owner: &str, ttl: Duration, now: u64) -> bool {
        let held_by_other = row.lease_owner.as_deref().is_some_and(|current| {
            current != owner && row.lease_expiry.is_some_and(|expiry| expiry > now)
        });
        if held_by_other {
            return false;
        }
        row.lease_owner = Some(owner.to_owned());
        row.lease_expiry = Some(now.saturating_add(millis(ttl)));
        row.lease_counter += 1;
        true
    }

    fn owned_by(row: &LeaseState, owner: &str) -> bool {
        row.lease_owner.as_deref() == Some(owner)
    }

    /// Writes `position` in the row's form (see [`LeaseState`]), `below` naming the record
    /// `checkpoint` holds when the position lies inside an aggregate.
    fn write_position(row: &mut LeaseState, position: &Position, below: &Below) {
        RowForm::new(position, below).apply(row);
        row.lease_counter += 1;
    }

    /// Writes every field of `commit` into `row`, and frees the lease when `release`.
    fn write_commit(row: &mut LeaseState, commit: &Commit, release: bool) {
        if let Some(position) = &commit.checkpoint {
            Self::write_position(row, position, &commit.below);
        }
        match &commit.failing {
            FailingChange::Keep => {}
            FailingChange::Set(failing) => row.failing = Some(failing.clone()),
            FailingChange::Clear => row.failing = None,
        }
        if !commit.parent_shards.is_empty() {
            row.parent_shards.clone_from(&commit.parent_shards);
        } else if commit.parentless {
            row.parentless = true;
        }
        if let Some(done_above) = &commit.done_above {
            row.done_above.clone_from(done_above);
        }
        match &commit.reported {
            ReportedChange::Keep => {}
            ReportedChange::Set(position) => row.reported = Some(position.clone()),
            ReportedChange::Clear => row.reported = None,
        }
        if release {
            Self::free(row);
        } else {
            row.lease_counter += 1;
        }
    }

    /// Writes every field of a partition key's `commit` into `row` (its counter checked by
    /// the caller): [`commit_rows`](CheckpointStore::commit_rows) and a transaction's rows.
    pub(super) fn write_key_commit(row: &mut LeaseState, commit: &KeyCommit) {
        if let Some(position) = &commit.checkpoint {
            Self::write_position(row, position, &commit.below);
        } else {
            row.lease_counter += 1;
        }
        match &commit.failing {
            FailingChange::Keep => {}
            FailingChange::Set(failing) => row.failing = Some(failing.clone()),
            FailingChange::Clear => row.failing = None,
        }
        if commit.expires_at.is_some() {
            row.expires_at = commit.expires_at;
        }
    }

    fn free(row: &mut LeaseState) {
        row.lease_owner = None;
        row.lease_expiry = None;
        row.lease_counter += 1;
    }
}

/// A duration in whole milliseconds, saturating: a lease of centuries is still a lease.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl LeaseStore for MemoryLeaseStore {
    fn acquire<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            Ok(self.with_row(key, |row| {
                Self::take(row, owner, ttl, self.clock.now_millis())
            }))
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(Self::renew(self, key, owner, ttl))
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            Ok(self.with_row(key, |row| {
                let ours = Self::owned_by(row, owner);
                // As the seed crate's stores do: `checkpoint` alone, whatever else the row holds
                // (a partial aggregate below it is stale from now on, and ignored).
                if ours {
                    row.checkpoint = Some(sequence.to_owned());
                    row.lease_counter += 1;
                }
                ours
            }))
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        Box::pin(Self::read(self, key))
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            self.with_row(key, |row| {
                if Self::owned_by(row, owner) {
                    Self::free(row);
                }
            });
            Ok(())
        })
    }
}

impl crate::store::sealed::Sealed for MemoryLeaseStore {}

impl CheckpointStore for MemoryLeaseStore {
    fn acquire_and_read<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        Box::pin(async move {
            Ok(self.with_row(key, |row| {
                let lapsed = row
                    .lease_owner
                    .as_ref()
                    .is_some_and(|before| before != owner);
                let mark = row.reported.clone();
                if Self::take(row, owner, ttl, self.clock.now_millis()) {
                    if row.reported.is_none() {
                        row.reported = attempting.cloned();
                    }
                    Claim::Acquired {
                        state: row.clone(),
                        lapsed_mark: mark.filter(|_| lapsed),
                    }
                } else {
                    Claim::Held(row.clone())
                }
            }))
        })
    }

    fn finish<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            Ok(self.with_row(key, |row| {
                let unchanged = row.checkpoint.as_deref() == expected && row.unfinished().is_none();
                if unchanged {
                    Self::write_position(row, &Position::ShardEnd, &Below::Keep);
                    row.expires_at = Some(expires_at);
                }
                unchanged
            }))
        })
    }

    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            Ok(self.with_row(key, |row| {
                let ours = Self::owned_by(row, owner);
                if ours {
                    Self::write_commit(row, commit, !commit.keep_lease);
                }
                ours
            }))
        })
    }

    fn commit_rows<'a>(
        &'a self,
        commits: &'a [KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>> {
        Box::pin(async move {
            let mut rows = self.lock();
            Ok(commits
                .iter()
                .map(|commit| {
                    let row = rows.entry(commit.row.clone()).or_default();
                    let unchanged = row.lease_counter == commit.expected_counter;
                    if unchanged {
                        Self::write_key_commit(row, commit);
                    }
                    unchanged
                })
                .collect())
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(Self::renew(self, key, owner, ttl))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        Box::pin(Self::read(self, key))
    }

    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>> {
        Box::pin(async move {
            let rows = self.lock();
            Ok(keys
                .iter()
                .map(|key| rows.get(key).cloned().unwrap_or_default())
                .collect())
        })
    }

    #[cfg(feature = "dynamodb")]
    fn transact<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        transaction: &'a crate::store::Transaction,
    ) -> BoxFuture<'a, Result<crate::store::Transacted, LeaseError>> {
        Box::pin(async move { self.transact_now(key, owner, transaction) })
    }

    #[cfg(feature = "dynamodb")]
    fn transact_rows<'a>(
        &'a self,
        transaction: &'a crate::store::RowsTransaction,
    ) -> BoxFuture<'a, Result<crate::store::RowsTransacted, LeaseError>> {
        Box::pin(async move { self.transact_rows_now(transaction) })
    }

    fn requests(&self) -> Option<u64> {
        // Memory is not a backend: nothing is billed.
        None
    }
}

impl MemoryLeaseStore {
    /// Reads `key`'s row, whoever owns it; an absent row is the default state. The same read
    /// as both traits' `read`, callable without naming one.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let store = MemoryLeaseStore::new();
    /// let row = store.read(&LeaseKey::new("orders", "shardId-000000000000")).await?;
    /// assert_eq!(row.checkpoint, None);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Never: the signature is the stores' own.
    #[allow(
        clippy::unused_async,
        reason = "the same call as the DynamoDB store's, awaited alike"
    )]
    pub async fn read(&self, key: &LeaseKey) -> Result<LeaseState, LeaseError> {
        Ok(self.lock().get(key).cloned().unwrap_or_default())
    }

    /// Heartbeats `owner`'s lease for another `ttl`; `false` when it is no longer held. The
    /// same renew as both traits' `renew`, callable without naming one.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore};
    /// # use kinesis_checkpoint::store::LeaseStore;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let store = MemoryLeaseStore::new();
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// assert!(!store.renew(&key, "a", Duration::from_secs(30)).await?, "never taken");
    /// assert!(store.acquire(&key, "a", Duration::from_secs(30)).await?);
    /// assert!(store.renew(&key, "a", Duration::from_secs(30)).await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Never: the signature is the stores' own.
    #[allow(
        clippy::unused_async,
        reason = "the same call as the DynamoDB store's, awaited alike"
    )]
    pub async fn renew(
        &self,
        key: &LeaseKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, LeaseError> {
        Ok(self.with_row(key, |row| {
            let ours = Self::owned_by(row, owner);
            if ours {
                row.lease_expiry = Some(self.clock.now_millis().saturating_add(millis(ttl)));
                row.lease_counter += 1;
            }
            ours
        }))
    }

    /// Writes `position` as the checkpoint under `owner`'s lease, keeping the lease: a
    /// position inside an aggregate beside the checkpoint, in the row's form. Returns `false`
    /// when fenced. The
    /// engine does not need it (its last write is [`commit`](CheckpointStore::commit)); tools
    /// and tests that write a row step by step do.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Position};
    /// # use kinesis_checkpoint::store::LeaseStore;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let store = MemoryLeaseStore::new();
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// store.acquire(&key, "a", Duration::from_secs(30)).await?;
    /// let inside = Position::sub_record("9".parse()?, 2);
    /// assert!(store.checkpoint_position(&key, "a", &inside).await?);
    /// assert_eq!(store.snapshot()[&key].position()?, Some(inside));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Never: the signature is the stores' own.
    #[allow(
        clippy::unused_async,
        reason = "the same call as the DynamoDB store's, awaited alike"
    )]
    pub async fn checkpoint_position(
        &self,
        key: &LeaseKey,
        owner: &str,
        position: &Position,
    ) -> Result<bool, LeaseError> {
        Ok(self.with_row(key, |row| {
            let ours = Self::owned_by(row, owner);
            if ours {
                let below = Below::of(position, None, row);
                Self::write_position(row, position, &below);
            }
            ours
        }))
    }
}

#[cfg(feature = "dynamodb")]
#[path = "memory_effects.rs"]
mod effects;
