//! Clock skew between sandboxes, as the store sees it: a lease's stored expiry is the writing
//! sandbox's clock plus the TTL, so a sandbox whose clock runs `offset` behind the others' writes
//! leases that lapse `offset` early for everyone else, and one ahead writes leases that last
//! longer. Each invocation gets its own offset; this wrapper shifts the TTL of every lease it
//! takes or renews by it. The processor's `clock_skew` margin must absorb it.
//!
//! A skew shows only when a sandbox stops renewing and goes on working: a [`Pause`] freezes one
//! (its renewals wait) after its first record, until its stored lease has lapsed and a rival has
//! taken and run the batch. Without the margin its own view of the lease still runs, and it
//! starts records the rival has already done.

use std::time::Duration;

use kinesis_checkpoint::{
    BoxFuture, Claim, Commit, KeyCommit, LeaseError, LeaseKey, LeaseState, LeaseStore, Position,
};

/// `inner`, with every TTL it is given shifted by `offset_ms` (negative: the sandbox's clock is
/// behind, its leases lapse early).
pub struct Skewed {
    inner: std::sync::Arc<dyn LeaseStore>,
    offset_ms: i64,
    /// Held while the sandbox is frozen: a renewal waits for it.
    frozen: tokio::sync::Mutex<()>,
}

/// A freeze of one sandbox: `begin` tells the rival to go once the stored lease lapsed, `done`
/// that it has run the batch.
pub struct Pause {
    skewed: std::sync::Arc<Skewed>,
    pub begin: tokio::sync::Notify,
    pub done: tokio::sync::Notify,
}

impl Pause {
    pub fn new(skewed: std::sync::Arc<Skewed>) -> Self {
        Self {
            skewed,
            begin: tokio::sync::Notify::new(),
            done: tokio::sync::Notify::new(),
        }
    }

    /// Freezes the sandbox (no renewal goes out) until the rival is done, or `at_most`.
    pub async fn freeze(&self, at_most: std::time::Duration) {
        let _frozen = self.skewed.frozen.lock().await;
        self.begin.notify_one();
        let _ = tokio::time::timeout(at_most, self.done.notified()).await;
    }
}

impl Skewed {
    pub fn new(inner: std::sync::Arc<dyn LeaseStore>, offset_ms: i64) -> Self {
        Self {
            inner,
            offset_ms,
            frozen: tokio::sync::Mutex::new(()),
        }
    }

    fn shifted(&self, ttl: Duration) -> Duration {
        let millis = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Duration::from_millis(u64::try_from((millis + self.offset_ms).max(1)).unwrap_or(1))
    }
}

impl LeaseStore for Skewed {
    fn acquire<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.acquire(key, owner, self.shifted(ttl))
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            // A frozen sandbox sends nothing until it thaws.
            drop(self.frozen.lock().await);
            self.inner.renew(key, owner, self.shifted(ttl)).await
        })
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.checkpoint(key, owner, sequence)
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        self.inner.read(key)
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.release(key, owner)
    }

    fn acquire_and_read<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        self.inner
            .acquire_and_read(key, owner, self.shifted(ttl), attempting)
    }

    fn checkpoint_position<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: &'a Position,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.checkpoint_position(key, owner, position)
    }

    fn checkpoint_and_release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.checkpoint_and_release(key, owner, position)
    }

    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.commit(key, owner, commit)
    }

    fn finish<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.finish(key, expected, expires_at)
    }

    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>> {
        self.inner.read_rows(keys)
    }

    fn commit_rows<'a>(
        &'a self,
        commits: &'a [KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>> {
        self.inner.commit_rows(commits)
    }

    fn requests(&self) -> Option<u64> {
        self.inner.requests()
    }

    fn mark_contended<'a>(
        &'a self,
        key: &'a LeaseKey,
        first: &'a Position,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.mark_contended(key, first)
    }
}
