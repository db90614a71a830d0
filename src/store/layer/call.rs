//! [`Call`]: what a [`Layer`](super::Layer) sees of each call, and [`Operation`], which one.

use std::time::Duration;

use crate::key::LeaseKey;
use crate::sequence::Position;
use crate::store::checkpoints::{Commit, KeyCommit};

/// Which operation a [`Call`] is: a method of [`CheckpointStore`](crate::store::CheckpointStore) or of [`LeaseStore`](crate::store::LeaseStore).
///
/// ```
/// use kinesis_checkpoint::internal::Operation;
///
/// assert!(Operation::Commit.writes());
/// assert!(!Operation::ReadRows.writes());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// [`LeaseStore::acquire`](crate::store::LeaseStore::acquire).
    Acquire,
    /// [`CheckpointStore::renew`](crate::store::CheckpointStore::renew) or [`LeaseStore::renew`](crate::store::LeaseStore::renew).
    Renew,
    /// [`LeaseStore::checkpoint`](crate::store::LeaseStore::checkpoint).
    Checkpoint,
    /// [`CheckpointStore::read`](crate::store::CheckpointStore::read) or [`LeaseStore::read`](crate::store::LeaseStore::read).
    Read,
    /// [`LeaseStore::release`](crate::store::LeaseStore::release).
    Release,
    /// [`CheckpointStore::acquire_and_read`](crate::store::CheckpointStore::acquire_and_read).
    AcquireAndRead,
    /// [`CheckpointStore::commit`](crate::store::CheckpointStore::commit).
    Commit,
    /// [`CheckpointStore::finish`](crate::store::CheckpointStore::finish).
    Finish,
    /// [`CheckpointStore::read_rows`](crate::store::CheckpointStore::read_rows).
    ReadRows,
    /// [`CheckpointStore::commit_rows`](crate::store::CheckpointStore::commit_rows).
    CommitRows,
    /// `CheckpointStore::transact` (feature `dynamodb`): records' writes and the lease row's
    /// update in one transaction.
    Transact,
    /// `CheckpointStore::transact_rows` (feature `dynamodb`): records' writes and the
    /// partition keys' rows in one transaction.
    TransactRows,
}

impl Operation {
    /// Whether the operation writes a row (every one but the reads).
    ///
    /// ```
    /// # use kinesis_checkpoint::internal::Operation;
    /// assert!(Operation::Commit.writes());
    /// assert!(!Operation::Read.writes());
    /// ```
    #[must_use]
    pub const fn writes(self) -> bool {
        !matches!(self, Self::Read | Self::ReadRows)
    }
}

/// One call on its way through a [`Layer`](super::Layer): the operation and what it carries.
///
/// Its accessors answer `None` (or an empty list) for what the operation does not carry.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::Mutex;
/// use std::time::Duration;
///
/// use kinesis_checkpoint::internal::{Call, Layer, Layered, Next, Operation};
/// use kinesis_checkpoint::store::CheckpointStore;
/// use kinesis_checkpoint::{BoxFuture, LeaseKey, MemoryLeaseStore};
/// use kinesis_checkpoint::store::LeaseError;
///
/// /// Notes each call's operation, keys and ttl.
/// #[derive(Default)]
/// struct Notes(Mutex<Vec<(Operation, Vec<String>, Option<Duration>)>>);
///
/// impl Layer for Notes {
///     fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
///         &'a self,
///         call: Call<'a>,
///         next: Next<'a, T>,
///     ) -> BoxFuture<'a, Result<T, LeaseError>> {
///         let keys = call.keys().iter().map(ToString::to_string).collect();
///         self.0.lock().unwrap().push((call.operation(), keys, call.lease_ttl()));
///         next.run(call)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LeaseError> {
/// let store = Layered::new(Arc::new(MemoryLeaseStore::new()), Notes::default());
/// let key = LeaseKey::new("orders", "shardId-000000000000");
/// store.acquire_and_read(&key, "me", Duration::from_secs(30), None).await?;
/// let notes = store.layer().0.lock().unwrap();
/// assert_eq!(
///     notes[0],
///     (
///         Operation::AcquireAndRead,
///         vec!["orders:shardId-000000000000".to_owned()],
///         Some(Duration::from_secs(30)),
///     )
/// );
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub(super) args: Args<'a>,
}

/// What each operation carries, as its method takes it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Args<'a> {
    Acquire {
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    },
    Renew {
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    },
    Checkpoint {
        key: &'a LeaseKey,
        owner: &'a str,
        sequence: &'a str,
    },
    Read {
        key: &'a LeaseKey,
    },
    Release {
        key: &'a LeaseKey,
        owner: &'a str,
    },
    AcquireAndRead {
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    },
    Commit {
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    },
    Finish {
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    },
    ReadRows {
        keys: &'a [LeaseKey],
    },
    CommitRows {
        commits: &'a [KeyCommit],
    },
    #[cfg(feature = "dynamodb")]
    Transact {
        key: &'a LeaseKey,
        owner: &'a str,
        transaction: &'a crate::store::Transaction,
    },
    #[cfg(feature = "dynamodb")]
    TransactRows {
        transaction: &'a crate::store::RowsTransaction,
    },
}

impl<'a> Call<'a> {
    /// The operation called.
    #[must_use]
    pub const fn operation(&self) -> Operation {
        match self.args {
            Args::Acquire { .. } => Operation::Acquire,
            Args::Renew { .. } => Operation::Renew,
            Args::Checkpoint { .. } => Operation::Checkpoint,
            Args::Read { .. } => Operation::Read,
            Args::Release { .. } => Operation::Release,
            Args::AcquireAndRead { .. } => Operation::AcquireAndRead,
            Args::Commit { .. } => Operation::Commit,
            Args::Finish { .. } => Operation::Finish,
            Args::ReadRows { .. } => Operation::ReadRows,
            Args::CommitRows { .. } => Operation::CommitRows,
            #[cfg(feature = "dynamodb")]
            Args::Transact { .. } => Operation::Transact,
            #[cfg(feature = "dynamodb")]
            Args::TransactRows { .. } => Operation::TransactRows,
        }
    }

    /// The one row the call is about; `None` for the calls on many rows (see
    /// [`keys`](Self::keys)).
    #[must_use]
    pub const fn key(&self) -> Option<&'a LeaseKey> {
        match self.args {
            Args::Acquire { key, .. }
            | Args::Renew { key, .. }
            | Args::Checkpoint { key, .. }
            | Args::Read { key }
            | Args::Release { key, .. }
            | Args::AcquireAndRead { key, .. }
            | Args::Commit { key, .. }
            | Args::Finish { key, .. } => Some(key),
            #[cfg(feature = "dynamodb")]
            Args::Transact { key, .. } => Some(key),
            Args::ReadRows { .. } | Args::CommitRows { .. } => None,
            #[cfg(feature = "dynamodb")]
            Args::TransactRows { .. } => None,
        }
    }

    /// Every row the call is about, in the order the call names them.
    #[must_use]
    pub fn keys(&self) -> Vec<&'a LeaseKey> {
        match self.args {
            Args::ReadRows { keys } => keys.iter().collect(),
            Args::CommitRows { commits } => commits.iter().map(|commit| &commit.row).collect(),
            #[cfg(feature = "dynamodb")]
            Args::TransactRows { transaction } => {
                transaction.rows.iter().map(|commit| &commit.row).collect()
            }
            _ => self.key().into_iter().collect(),
        }
    }

    /// The lease owner the call acts for, when it acts for one.
    #[must_use]
    pub const fn owner(&self) -> Option<&'a str> {
        match self.args {
            Args::Acquire { owner, .. }
            | Args::Renew { owner, .. }
            | Args::Checkpoint { owner, .. }
            | Args::Release { owner, .. }
            | Args::AcquireAndRead { owner, .. }
            | Args::Commit { owner, .. } => Some(owner),
            #[cfg(feature = "dynamodb")]
            Args::Transact { owner, .. } => Some(owner),
            _ => None,
        }
    }

    /// How long the lease the call takes or renews is to last.
    #[must_use]
    pub const fn lease_ttl(&self) -> Option<Duration> {
        match self.args {
            Args::Acquire { ttl, .. }
            | Args::Renew { ttl, .. }
            | Args::AcquireAndRead { ttl, .. } => Some(ttl),
            _ => None,
        }
    }

    /// The same call with the lease lasting `ttl` instead (a clock that runs fast or slow, as
    /// the store sees it). A call that takes no lease is returned as it is.
    ///
    /// The one change a layer can make: everything else the call carries reaches the inner
    /// store unchanged.
    #[must_use]
    pub const fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        match &mut self.args {
            Args::Acquire { ttl: old, .. }
            | Args::Renew { ttl: old, .. }
            | Args::AcquireAndRead { ttl: old, .. } => *old = ttl,
            _ => {}
        }
        self
    }

    /// The write of [`CheckpointStore::commit`](crate::store::CheckpointStore::commit).
    #[must_use]
    pub const fn commit(&self) -> Option<&'a Commit> {
        match self.args {
            Args::Commit { commit, .. } => Some(commit),
            _ => None,
        }
    }

    /// The transaction of `CheckpointStore::transact` (feature `dynamodb`): its records'
    /// writes, its commit of the lease row, its token.
    #[cfg(feature = "dynamodb")]
    #[must_use]
    pub const fn transaction(&self) -> Option<&'a crate::store::Transaction> {
        match self.args {
            Args::Transact { transaction, .. } => Some(transaction),
            _ => None,
        }
    }

    /// The transaction of `CheckpointStore::transact_rows` (feature `dynamodb`): its records'
    /// writes, its keys' rows, its token.
    #[cfg(feature = "dynamodb")]
    #[must_use]
    pub const fn rows_transaction(&self) -> Option<&'a crate::store::RowsTransaction> {
        match self.args {
            Args::TransactRows { transaction } => Some(transaction),
            _ => None,
        }
    }

    /// The rows' writes of [`CheckpointStore::commit_rows`](crate::store::CheckpointStore::commit_rows)
    /// (and of `transact_rows`); empty for every other call.
    #[must_use]
    pub fn key_commits(&self) -> &'a [KeyCommit] {
        match self.args {
            Args::CommitRows { commits } => commits,
            #[cfg(feature = "dynamodb")]
            Args::TransactRows { transaction } => &transaction.rows,
            _ => &[],
        }
    }

    /// The record the call names: the claim's `attempting`.
    #[must_use]
    pub const fn position(&self) -> Option<&'a Position> {
        match self.args {
            Args::AcquireAndRead { attempting, .. } => attempting,
            _ => None,
        }
    }

    /// The sequence number [`LeaseStore::checkpoint`](crate::store::LeaseStore::checkpoint) writes.
    #[must_use]
    pub const fn sequence(&self) -> Option<&'a str> {
        match self.args {
            Args::Checkpoint { sequence, .. } => Some(sequence),
            _ => None,
        }
    }

    /// What [`CheckpointStore::finish`](crate::store::CheckpointStore::finish) expects the checkpoint to be, and its `expires_at`.
    #[must_use]
    pub const fn finish(&self) -> Option<(Option<&'a str>, u64)> {
        match self.args {
            Args::Finish {
                expected,
                expires_at,
                ..
            } => Some((expected, expires_at)),
            _ => None,
        }
    }

    /// The lease ttl of this call, or `ttl` when it carries none: what [`Next`] sends.
    pub(super) const fn ttl_or(&self, ttl: Duration) -> Duration {
        match self.lease_ttl() {
            Some(ttl) => ttl,
            None => ttl,
        }
    }
}
