//! [`Layer`] and [`Layered`]: how a store wrapper is written without forwarding every method.
//!
//! A wrapper that implements a store trait itself must forward each method by hand, and one it
//! leaves out, or forwards to the wrong method, degrades the wrapped store behind every test
//! and metric that uses it. Here the method list is spelled once, in [`Layered`], which
//! implements [`CheckpointStore`] (and [`LeaseStore`], when the inner store is one) by handing
//! every call to one hook, [`Layer::wrap`]. The hook sees which operation is called, on which
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

mod call;
#[cfg(test)]
mod tests;

use call::Args;
pub use call::{Call, Operation};

/// What a store wrapper does with each call: the one hook of [`Layered`].
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
/// use kinesis_checkpoint::internal::{Call, Layer, Layered, Next, Operation};
/// use kinesis_checkpoint::store::CheckpointStore;
/// use kinesis_checkpoint::{BoxFuture, LeaseKey, MemoryLeaseStore, Position};
/// use kinesis_checkpoint::store::LeaseError;
///
/// #[derive(Default)]
/// struct CountWrites(AtomicU64);
///
/// impl Layer for CountWrites {
///     fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
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
/// store.renew(&key, "me", std::time::Duration::from_secs(30)).await?;
/// CheckpointStore::read(&store, &key).await?;
/// assert_eq!(store.layer().0.load(Ordering::Relaxed), 1);
/// # Ok(())
/// # }
/// ```
pub trait Layer: Send + Sync + 'static {
    /// Wraps one call: `next.run(call)` sends it to the inner store.
    fn wrap<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>>;
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

    /// Sends `call`, the one [`Layer::wrap`] was given (possibly with another lease ttl), to
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

/// `inner` with `layer` over every call: a store wrapper that cannot forget a method.
///
/// It implements [`CheckpointStore`], and [`LeaseStore`] when `inner` is one, by routing each
/// method through [`Layer::wrap`]; [`requests`](CheckpointStore::requests), which sends
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
    /// # use kinesis_checkpoint::internal::{Call, Layer, Layered, Next};
    /// # use kinesis_checkpoint::{BoxFuture, MemoryLeaseStore, Outcome, Processor, Record};
    /// # use kinesis_checkpoint::store::LeaseError;
    /// struct Nothing;
    ///
    /// impl Layer for Nothing {
    ///     fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
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
        self.layer.wrap(Call { args }, Next::new(send))
    }
}

impl<S: CheckpointStore + ?Sized, L: Layer> crate::store::sealed::Sealed for Layered<S, L> {}

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

    #[cfg(feature = "dynamodb")]
    fn transact<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        transaction: &'a super::checkpoints::Transaction,
    ) -> BoxFuture<'a, Result<super::checkpoints::Transacted, LeaseError>> {
        let args = Args::Transact {
            key,
            owner,
            transaction,
        };
        self.route(args, move |_| self.inner.transact(key, owner, transaction))
    }

    #[cfg(feature = "dynamodb")]
    fn transact_rows<'a>(
        &'a self,
        transaction: &'a super::checkpoints::RowsTransaction,
    ) -> BoxFuture<'a, Result<super::checkpoints::RowsTransacted, LeaseError>> {
        let args = Args::TransactRows { transaction };
        self.route(args, move |_| self.inner.transact_rows(transaction))
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
