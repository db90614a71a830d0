//! A lease store wrapper that injects the faults no emulator produces: an outage, and a lease
//! stolen at a chosen moment by another owner (through the real store, so the refusal that
//! follows is the store's own).
//!
//! Every wrapper here forwards every method of `LeaseStore`, provided ones included: a wrapper
//! that left one out would run the trait's default instead of the wrapped store's own (a
//! `commit` that drops the failing record, `done_above` and the parents), and the tests would
//! test the default.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kinesis_checkpoint::{
    BoxFuture, Claim, Commit, KeyCommit, LeaseError, LeaseKey, LeaseState, LeaseStore, Position,
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
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        Box::pin(async move {
            if self.claim_fails.load(Ordering::SeqCst) {
                return Err("ProvisionedThroughputExceededException: rate of requests exceeds the allowed throughput".into());
            }
            self.inner
                .acquire_and_read(key, owner, ttl, attempting)
                .await
        })
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
        Box::pin(async move {
            if self.steal_before_checkpoint.swap(false, Ordering::SeqCst) {
                self.steal(key, owner).await;
            }
            self.inner
                .checkpoint_and_release(key, owner, position)
                .await
        })
    }

    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            if self.steal_before_checkpoint.swap(false, Ordering::SeqCst) {
                self.steal(key, owner).await;
            }
            self.inner.commit(key, owner, commit).await
        })
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

/// `inner` with the seed crate's five methods only: every provided method runs the trait's
/// default, built on these five, as it would for a store written for the seed crate. It keeps
/// no `reported` and no `contended` mark, so beside a mapping that discards records it loses
/// them by design: the invariant scenarios draw it only where the mapping never gives up.
#[allow(dead_code, reason = "not every test binary uses it")]
pub struct FiveMethods<S>(pub Arc<S>);

impl<S: LeaseStore> LeaseStore for FiveMethods<S> {
    fn acquire<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.0.acquire(key, owner, ttl)
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.0.renew(key, owner, ttl)
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.0.checkpoint(key, owner, sequence)
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        self.0.read(key)
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.0.release(key, owner)
    }
}

/// How often [`Chaos`] misbehaves: each fault a chance per store call.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChaosLevels {
    /// A call fails as a throttled store's would, before reaching the store.
    pub throttle: f64,
    /// A write reaches the store, but its answer is lost: the caller sees an error.
    pub lost_answer: f64,
    /// A call waits up to `max_latency` first.
    pub latency: f64,
    /// How long a slow call may wait.
    pub max_latency: Duration,
    /// Before a renew or a commit, the lease is taken by another owner for `steal_ttl`.
    pub steal: f64,
    /// How long a stolen lease is held.
    pub steal_ttl: Duration,
}

/// Faults by chance, from a seed: throttling, lost answers, latency and stolen leases, on
/// every method of the store.
pub struct Chaos<S> {
    pub inner: Arc<S>,
    levels: ChaosLevels,
    rng: std::sync::Mutex<kinesis_checkpoint::local::Rng>,
    /// Faults injected so far: throttled, lost answers, slow calls, steals.
    pub injected: std::sync::Mutex<[u64; 4]>,
    /// Where every claim and write is noted, with its answer, when set.
    trace: Option<Arc<std::sync::Mutex<Vec<String>>>>,
    /// Rows whose claim was just throttled, and how many of the calls that follow on them are
    /// answered: a throttle refuses a request, it is not an outage of the row (an outage
    /// through every write of every delivery of a batch leaves nothing to remember it by).
    spared: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

impl<S: LeaseStore> Chaos<S> {
    pub fn new(inner: Arc<S>, levels: ChaosLevels, seed: u64) -> Self {
        Self {
            inner,
            levels,
            rng: std::sync::Mutex::new(kinesis_checkpoint::local::Rng::new(seed)),
            injected: std::sync::Mutex::new([0; 4]),
            trace: None,
            spared: std::sync::Mutex::default(),
        }
    }

    /// Notes every claim and write, with its answer, in `trace`.
    #[allow(dead_code, reason = "not every test binary traces")]
    pub fn traced(mut self, trace: Arc<std::sync::Mutex<Vec<String>>>) -> Self {
        self.trace = Some(trace);
        self
    }

    fn note(&self, line: impl FnOnce() -> String) {
        if let Some(trace) = &self.trace {
            trace.lock().unwrap().push(line());
        }
    }

    fn roll(&self, chance: f64, fault: usize) -> bool {
        let hit = self.rng.lock().unwrap().chance(chance);
        if hit {
            self.injected.lock().unwrap()[fault] += 1;
        }
        hit
    }

    /// Latency and throttling, before a call.
    async fn before(&self) -> Result<(), LeaseError> {
        if self.roll(self.levels.latency, 2) {
            let micros = self
                .rng
                .lock()
                .unwrap()
                .below(u64::try_from(self.levels.max_latency.as_micros()).unwrap_or(0) + 1);
            tokio::time::sleep(Duration::from_micros(micros)).await;
        }
        if self.roll(self.levels.throttle, 0) {
            self.note(|| "store: a call throttled (injected)".to_owned());
            return Err("ProvisionedThroughputExceededException: rate of requests exceeds the allowed throughput (injected)".into());
        }
        Ok(())
    }

    /// Latency and throttling before a call on `key`, unless a throttled claim spared it.
    async fn before_on(&self, key: &LeaseKey) -> Result<(), LeaseError> {
        let spared = {
            let mut spared = self.spared.lock().unwrap();
            spared.get_mut(&key.to_string()).is_some_and(|left| {
                let spare = *left > 0;
                *left = left.saturating_sub(1);
                spare
            })
        };
        if spared {
            return Ok(());
        }
        self.before().await
    }

    /// A write's answer lost on its way back.
    fn after<T>(&self, result: Result<T, LeaseError>) -> Result<T, LeaseError> {
        if result.is_ok() && self.roll(self.levels.lost_answer, 1) {
            self.note(|| "store: the answer below is lost (injected)".to_owned());
            return Err("the connection was reset after the request was sent (injected)".into());
        }
        result
    }

    async fn maybe_steal(&self, key: &LeaseKey, owner: &str) {
        if self.roll(self.levels.steal, 3) {
            self.note(|| format!("store: the lease of {key} is stolen from {owner} (injected)"));
            // The owner's lease lapses and another owner takes it for a while.
            let _ = self.inner.release(key, owner).await;
            let _ = self
                .inner
                .acquire(key, "thief", self.levels.steal_ttl)
                .await;
        }
    }
}

impl<S: LeaseStore> LeaseStore for Chaos<S> {
    fn acquire<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            self.inner.acquire(key, owner, ttl).await
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            self.maybe_steal(key, owner).await;
            self.inner.renew(key, owner, ttl).await
        })
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            let written = self.inner.checkpoint(key, owner, sequence).await;
            self.after(written)
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        Box::pin(async move {
            self.before_on(key).await?;
            self.inner.read(key).await
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            self.inner.release(key, owner).await
        })
    }

    fn acquire_and_read<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        Box::pin(async move {
            if let Err(error) = self.before().await {
                self.spared.lock().unwrap().insert(key.to_string(), 2);
                return Err(error);
            }
            let claim = self
                .inner
                .acquire_and_read(key, owner, ttl, attempting)
                .await;
            self.note(|| format!("store: {owner} claims {key}: {claim:?}"));
            claim
        })
    }

    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a kinesis_checkpoint::Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            self.maybe_steal(key, owner).await;
            let written = self.inner.commit(key, owner, commit).await;
            let written = self.after(written);
            self.note(|| format!("store: {owner} commits {key} {commit:?}: {written:?}"));
            written
        })
    }

    fn finish<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            let written = self.inner.finish(key, expected, expires_at).await;
            let written = self.after(written);
            self.note(|| format!("store: finish {key} expecting {expected:?}: {written:?}"));
            written
        })
    }

    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            let rows = self.inner.read_rows(keys).await;
            self.note(|| format!("store: read rows {keys:?}: {rows:?}"));
            rows
        })
    }

    fn commit_rows<'a>(
        &'a self,
        commits: &'a [kinesis_checkpoint::KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            let written = self.inner.commit_rows(commits).await;
            let written = self.after(written);
            self.note(|| format!("store: commit rows {commits:?}: {written:?}"));
            written
        })
    }

    fn checkpoint_position<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: &'a Position,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            let written = self.inner.checkpoint_position(key, owner, position).await;
            self.after(written)
        })
    }

    fn checkpoint_and_release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            self.before().await?;
            self.maybe_steal(key, owner).await;
            let written = self
                .inner
                .checkpoint_and_release(key, owner, position)
                .await;
            self.after(written)
        })
    }

    fn requests(&self) -> Option<u64> {
        self.inner.requests()
    }

    fn mark_contended<'a>(
        &'a self,
        key: &'a LeaseKey,
        first: &'a Position,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            self.before_on(key).await?;
            let written = self.inner.mark_contended(key, first).await;
            let written = self.after(written);
            self.note(|| format!("store: {key} marked contended at {first}: {written:?}"));
            written
        })
    }
}
