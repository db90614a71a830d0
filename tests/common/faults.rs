//! A lease store wrapper that injects the faults no emulator produces: an outage, and a lease
//! stolen at a chosen moment by another owner (through the real store, so the refusal that
//! follows is the store's own).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kinesis_checkpoint::{
    BoxFuture, Claim, LeaseError, LeaseKey, LeaseState, LeaseStore, Position,
};

/// Wraps `inner`; every fault is off until switched on.
pub struct Faulty<S> {
    pub inner: Arc<S>,
    /// Claims fail as a throttled store's would.
    pub claim_fails: AtomicBool,
    /// The next renew finds the lease taken by `thief`.
    pub steal_on_renew: AtomicBool,
    /// The final write finds the lease taken by `thief`.
    pub steal_before_checkpoint: AtomicBool,
}

impl<S: LeaseStore> Faulty<S> {
    pub fn new(inner: Arc<S>) -> Self {
        Self {
            inner,
            claim_fails: AtomicBool::new(false),
            steal_on_renew: AtomicBool::new(false),
            steal_before_checkpoint: AtomicBool::new(false),
        }
    }

    async fn steal(&self, key: &LeaseKey, owner: &str) {
        // The lease lapses (its owner stopped renewing) and another owner takes it.
        self.inner.release(key, owner).await.unwrap();
        assert!(
            self.inner
                .acquire(key, "thief", Duration::from_mins(1))
                .await
                .unwrap()
        );
    }
}

impl<S: LeaseStore> LeaseStore for Faulty<S> {
    fn acquire<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.acquire(key, owner, ttl)
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            if self.steal_on_renew.swap(false, Ordering::SeqCst) {
                self.steal(key, owner).await;
            }
            self.inner.renew(key, owner, ttl).await
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
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        Box::pin(async move {
            if self.claim_fails.load(Ordering::SeqCst) {
                return Err("ProvisionedThroughputExceededException: rate of requests exceeds the allowed throughput".into());
            }
            self.inner.acquire_and_read(key, owner, ttl).await
        })
    }

    fn checkpoint_and_release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            if self.steal_before_checkpoint.swap(false, Ordering::SeqCst) {
                self.steal(key, owner).await;
            }
            self.inner
                .checkpoint_and_release(key, owner, position)
                .await
        })
    }
}
