//! [`Layer`] and [`Layered`]: how a store wrapper is written without forwarding every method.
//!
//! A wrapper that implements a store trait itself must forward each method by hand, and one it
//! leaves out, or forwards to the wrong method, degrades the wrapped store behind every test
//! and metric that uses it. Here the method list is spelled once, in [`Layered`], which
//! implements [`CheckpointStore`] (and [`LeaseStore`], when the inner store is one) by handing
//! every call to one hook, [`Layer::around`]. The hook sees which operation is called, on which
//! key(s), with which arguments ([`Call`]), and wraps the call's future ([`Next`]): time it,
//! fail it, delay it, steal the lease first, note the answer. The one argument it may change is
//! the lease's ttl ([`Call::with_lease_ttl`]); everything a write carries reaches the inner
//! store as the engine wrote it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::checkpoints::{CheckpointStore, Claim, Commit, KeyCommit};
use super::lease::{BoxFuture, LeaseError, LeaseState, LeaseStore};
use crate::key::LeaseKey;
use crate::sequence::Position;

/// What a store wrapper does around each call: the one hook of [`Layered`].
///
/// The hook gets the call and `next`, the call on its way to the inner store. It returns the
/// call's future: usually `next.run(call)` wrapped in something, as in the example. Not
/// running `next` answers for the store (an injected outage); running it with
/// [`call.with_lease_ttl`](Call::with_lease_ttl) changes the ttl the inner store gets. A
/// layer cannot change anything else a call carries.
///
/// # Examples
///
/// A layer that counts writes, over the memory store:
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use kinesis_checkpoint::store::{Call, CheckpointStore, Layer, Layered, Next, Operation};
/// use kinesis_checkpoint::{BoxFuture, LeaseError, LeaseKey, MemoryLeaseStore, Position};
///
/// #[derive(Default)]
/// struct CountWrites(AtomicU64);
///
/// impl Layer for CountWrites {
///     fn around<'a, T: std::fmt::Debug + Send + 'a>(
///         &'a self,
///         call: Call<'a>,
///         next: Next<'a, T>,
///     ) -> BoxFuture<'a, Result<T, LeaseError>> {
///         if !matches!(call.operation(), Operation::Read | Operation::ReadRows) {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///         next.run(call)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LeaseError> {
/// let store = Layered::new(Arc::new(MemoryLeaseStore::new()), CountWrites::default());
/// let key = LeaseKey::new("orders", "shardId-000000000000");
/// store.mark_contended(&key, &Position::record("7".parse()?)).await?;
/// CheckpointStore::read(&store, &key).await?;
/// assert_eq!(store.layer().0.load(Ordering::Relaxed), 1);
/// # Ok(())
/// # }
/// ```
pub trait Layer: Send + Sync + 'static {
    /// Wraps one call: `next.run(call)` sends it to the inner store.
    fn around<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>>;
}

/// Which operation a [`Call`] is: a method of [`CheckpointStore`] or of [`LeaseStore`].
///
/// ```
/// use kinesis_checkpoint::store::Operation;
///
/// assert!(Operation::Commit.writes());
/// assert!(!Operation::ReadRows.writes());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// [`LeaseStore::acquire`].
    Acquire,
    /// [`CheckpointStore::renew`] or [`LeaseStore::renew`].
    Renew,
    /// [`LeaseStore::checkpoint`].
    Checkpoint,
    /// [`CheckpointStore::read`] or [`LeaseStore::read`].
    Read,
    /// [`LeaseStore::release`].
    Release,
    /// [`CheckpointStore::acquire_and_read`].
    AcquireAndRead,
    /// [`CheckpointStore::commit`].
    Commit,
    /// [`CheckpointStore::finish`].
    Finish,
    /// [`CheckpointStore::read_rows`].
    ReadRows,
    /// [`CheckpointStore::commit_rows`].
    CommitRows,
    /// [`CheckpointStore::mark_contended`].
    MarkContended,
}

impl Operation {
    /// Whether the operation writes a row (every one but the reads).
    ///
    /// ```
    /// # use kinesis_checkpoint::store::Operation;
    /// assert!(Operation::MarkContended.writes());
    /// assert!(!Operation::Read.writes());
    /// ```
    #[must_use]
    pub const fn writes(self) -> bool {
        !matches!(self, Self::Read | Self::ReadRows)
    }
}

/// One call on its way through a [`Layer`]: the operation and what it carries.
///
/// Its accessors answer `None` (or an empty list) for what the operation does not carry.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::Mutex;
/// use std::time::Duration;
///
/// use kinesis_checkpoint::store::{Call, CheckpointStore, Layer, Layered, Next, Operation};
/// use kinesis_checkpoint::{BoxFuture, LeaseError, LeaseKey, MemoryLeaseStore};
///
/// /// Notes each call's operation, keys and ttl.
/// #[derive(Default)]
/// struct Notes(Mutex<Vec<(Operation, Vec<String>, Option<Duration>)>>);
///
/// impl Layer for Notes {
///     fn around<'a, T: std::fmt::Debug + Send + 'a>(
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
    args: Args<'a>,
}

/// What each operation carries, as its method takes it.
#[derive(Debug, Clone, Copy)]
enum Args<'a> {
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
    MarkContended {
        key: &'a LeaseKey,
        first: &'a Position,
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
            Args::MarkContended { .. } => Operation::MarkContended,
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
            | Args::Finish { key, .. }
            | Args::MarkContended { key, .. } => Some(key),
            Args::ReadRows { .. } | Args::CommitRows { .. } => None,
        }
    }

    /// Every row the call is about, in the order the call names them.
    #[must_use]
    pub fn keys(&self) -> Vec<&'a LeaseKey> {
        match self.args {
            Args::ReadRows { keys } => keys.iter().collect(),
            Args::CommitRows { commits } => commits.iter().map(|commit| &commit.row).collect(),
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

    /// The write of [`CheckpointStore::commit`].
    #[must_use]
    pub const fn commit(&self) -> Option<&'a Commit> {
        match self.args {
            Args::Commit { commit, .. } => Some(commit),
            _ => None,
        }
    }

    /// The writes of [`CheckpointStore::commit_rows`]; empty for every other call.
    #[must_use]
    pub const fn key_commits(&self) -> &'a [KeyCommit] {
        match self.args {
            Args::CommitRows { commits } => commits,
            _ => &[],
        }
    }

    /// The record the call names: the claim's `attempting`, the contended batch's `first`.
    #[must_use]
    pub const fn position(&self) -> Option<&'a Position> {
        match self.args {
            Args::AcquireAndRead { attempting, .. } => attempting,
            Args::MarkContended { first, .. } => Some(first),
            _ => None,
        }
    }

    /// The sequence number [`LeaseStore::checkpoint`] writes.
    #[must_use]
    pub const fn sequence(&self) -> Option<&'a str> {
        match self.args {
            Args::Checkpoint { sequence, .. } => Some(sequence),
            _ => None,
        }
    }

    /// What [`CheckpointStore::finish`] expects the checkpoint to be, and its `expires_at`.
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
    const fn ttl_or(&self, ttl: Duration) -> Duration {
        match self.lease_ttl() {
            Some(ttl) => ttl,
            None => ttl,
        }
    }
}

/// A call on its way to the inner store: [`run`](Self::run) sends it.
pub struct Next<'a, T> {
    send: Box<dyn FnOnce(Call<'a>) -> BoxFuture<'a, Result<T, LeaseError>> + Send + 'a>,
}

impl<'a, T> Next<'a, T> {
    fn new(
        send: impl FnOnce(Call<'a>) -> BoxFuture<'a, Result<T, LeaseError>> + Send + 'a,
    ) -> Self {
        Self {
            send: Box::new(send),
        }
    }

    /// Sends `call`, the one [`Layer::around`] was given (possibly with another lease ttl), to
    /// the inner store; the future is the store's.
    #[must_use]
    pub fn run(self, call: Call<'a>) -> BoxFuture<'a, Result<T, LeaseError>> {
        (self.send)(call)
    }
}

impl<T> fmt::Debug for Next<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Next")
    }
}

/// `inner` with `layer` around every call: a store wrapper that cannot forget a method.
///
/// It implements [`CheckpointStore`], and [`LeaseStore`] when `inner` is one, by routing each
/// method through [`Layer::around`]; [`requests`](CheckpointStore::requests), which sends
/// nothing, is the inner store's. See [`Layer`] for an example.
///
/// With both traits in scope, call the methods both have (`read`, `renew`) by their trait:
/// `CheckpointStore::read(&store, &key)`.
pub struct Layered<S: ?Sized, L> {
    inner: Arc<S>,
    layer: L,
}

impl<S: ?Sized, L: Layer> Layered<S, L> {
    /// `inner`, each call going through `layer`.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::store::{Call, Layer, Layered, Next};
    /// # use kinesis_checkpoint::{BoxFuture, LeaseError, MemoryLeaseStore, Outcome, Processor, Record};
    /// struct Nothing;
    ///
    /// impl Layer for Nothing {
    ///     fn around<'a, T: std::fmt::Debug + Send + 'a>(
    ///         &'a self,
    ///         call: Call<'a>,
    ///         next: Next<'a, T>,
    ///     ) -> BoxFuture<'a, Result<T, LeaseError>> {
    ///         next.run(call)
    ///     }
    /// }
    ///
    /// let store = Layered::new(Arc::new(MemoryLeaseStore::new()), Nothing);
    /// let processor = Processor::new(Arc::new(store), |_: Record| async { Outcome::ack() });
    /// ```
    #[must_use]
    pub fn new(inner: Arc<S>, layer: L) -> Self {
        Self { inner, layer }
    }

    /// The wrapped store.
    #[must_use]
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The layer.
    #[must_use]
    pub fn layer(&self) -> &L {
        &self.layer
    }

    fn route<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        args: Args<'a>,
        send: impl FnOnce(Call<'a>) -> BoxFuture<'a, Result<T, LeaseError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        self.layer.around(Call { args }, Next::new(send))
    }
}

impl<S: CheckpointStore + ?Sized, L: Layer> CheckpointStore for Layered<S, L> {
    fn acquire_and_read<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        let args = Args::AcquireAndRead {
            key,
            owner,
            ttl,
            attempting,
        };
        self.route(args, move |call| {
            self.inner
                .acquire_and_read(key, owner, call.ttl_or(ttl), attempting)
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.route(Args::Renew { key, owner, ttl }, move |call| {
            CheckpointStore::renew(&*self.inner, key, owner, call.ttl_or(ttl))
        })
    }

    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.route(Args::Commit { key, owner, commit }, move |_| {
            self.inner.commit(key, owner, commit)
        })
    }

    fn finish<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        let args = Args::Finish {
            key,
            expected,
            expires_at,
        };
        self.route(args, move |_| self.inner.finish(key, expected, expires_at))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        self.route(Args::Read { key }, move |_| {
            CheckpointStore::read(&*self.inner, key)
        })
    }

    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>> {
        self.route(Args::ReadRows { keys }, move |_| self.inner.read_rows(keys))
    }

    fn commit_rows<'a>(
        &'a self,
        commits: &'a [KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>> {
        self.route(Args::CommitRows { commits }, move |_| {
            self.inner.commit_rows(commits)
        })
    }

    fn mark_contended<'a>(
        &'a self,
        key: &'a LeaseKey,
        first: &'a Position,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.route(Args::MarkContended { key, first }, move |_| {
            self.inner.mark_contended(key, first)
        })
    }

    fn requests(&self) -> Option<u64> {
        self.inner.requests()
    }
}

impl<S: LeaseStore + ?Sized, L: Layer> LeaseStore for Layered<S, L> {
    fn acquire<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.route(Args::Acquire { key, owner, ttl }, move |call| {
            self.inner.acquire(key, owner, call.ttl_or(ttl))
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.route(Args::Renew { key, owner, ttl }, move |call| {
            LeaseStore::renew(&*self.inner, key, owner, call.ttl_or(ttl))
        })
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        let args = Args::Checkpoint {
            key,
            owner,
            sequence,
        };
        self.route(args, move |_| self.inner.checkpoint(key, owner, sequence))
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        self.route(Args::Read { key }, move |_| {
            LeaseStore::read(&*self.inner, key)
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.route(Args::Release { key, owner }, move |_| {
            self.inner.release(key, owner)
        })
    }
}
