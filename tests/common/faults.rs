//! Store layers that inject the faults no emulator produces: an outage, and a lease stolen at a
//! chosen moment by another owner (through the real store, so the refusal that follows is the
//! store's own); and faults by chance, from a seed.
//!
//! Each is a [`Layer`] in a [`Layered`] store, which routes every method of the store through
//! it: a layer cannot leave a method out and so degrade the store it wraps.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kinesis_checkpoint::internal::KeyCommit;
use kinesis_checkpoint::internal::{Call, Layer, Layered, Next, Operation};
use kinesis_checkpoint::store::{CheckpointStore, LeaseError, LeaseStore};
use kinesis_checkpoint::{BoxFuture, LeaseKey};

/// The error a throttled request gets from the service, `suffix` saying which fault refused it.
fn throughput_exceeded(suffix: &str) -> LeaseError {
    format!(
        "ProvisionedThroughputExceededException: rate of requests exceeds the allowed throughput{suffix}"
    )
    .into()
}

/// `inner` behind [`Faults`]: every fault off until switched on through [`Layered::layer`].
pub type Faulty<S> = Layered<S, Faults<S>>;

/// Wraps `inner`, whose own lease methods steal the lease when a fault says so.
pub fn faulty<S: LeaseStore + CheckpointStore>(inner: Arc<S>) -> Faulty<S> {
    Layered::new(
        inner.clone(),
        Faults {
            store: inner,
            claim_fails: AtomicBool::new(false),
            steal_on_renew: AtomicBool::new(false),
            renewals_fail: AtomicBool::new(false),
            steal_before_checkpoint: AtomicBool::new(false),
            lose_commit_answer: AtomicBool::new(false),
            throttle_next_commit: AtomicBool::new(false),
            transact_fails: AtomicBool::new(false),
            lose_transact_answer: AtomicBool::new(false),
            resend_transact_after_lost_answer: AtomicBool::new(false),
            steal_before_transact: AtomicBool::new(false),
            rows_written_before_commit_rows: AtomicBool::new(false),
        },
    )
}

/// The faults of [`Faulty`].
pub struct Faults<S> {
    /// The store the lease is stolen through.
    store: Arc<S>,
    /// Claims fail as a throttled store's would.
    pub claim_fails: AtomicBool,
    /// The next renew finds the lease taken by `thief`.
    pub steal_on_renew: AtomicBool,
    /// Renewals are refused as a throttled store's would be: the lease lapses when its TTL
    /// runs out.
    pub renewals_fail: AtomicBool,
    /// The final write finds the lease taken by `thief`.
    pub steal_before_checkpoint: AtomicBool,
    /// The next commit lands, but its answer is lost: the caller sees an error.
    pub lose_commit_answer: AtomicBool,
    /// The next commit is refused as a throttled store's would be, before reaching it: nothing
    /// is written and the lease stays taken.
    pub throttle_next_commit: AtomicBool,
    /// Transactions are refused as a throttled store's would be, before reaching it.
    pub transact_fails: AtomicBool,
    /// The next transaction lands, but its answer is lost: the caller sees an error.
    pub lose_transact_answer: AtomicBool,
    /// The next transaction lands, its answer is lost, and the SDK sends it again with its
    /// request token: the caller gets the answer to the resend (see [`resend`]).
    pub resend_transact_after_lost_answer: AtomicBool,
    /// The next transaction finds the lease taken by `thief`.
    pub steal_before_transact: AtomicBool,
    /// Before the next writing of partition-key rows, another writer writes each of them (a
    /// concurrent delivery of the same keys): the writing is refused.
    pub rows_written_before_commit_rows: AtomicBool,
}

impl<S: LeaseStore> Faults<S> {
    async fn steal(&self, key: &LeaseKey, owner: &str) {
        // The lease lapses (its owner stopped renewing) and another owner takes it.
        self.store.release(key, owner).await.unwrap();
        assert!(
            self.store
                .acquire(key, "thief", Duration::from_mins(1))
                .await
                .unwrap()
        );
    }
}

impl<S: CheckpointStore> Faults<S> {
    /// Writes each of `rows` as another writer would: one counter more, nothing else changed.
    async fn write_rows(&self, rows: Vec<&LeaseKey>) {
        let rows: Vec<LeaseKey> = rows.into_iter().cloned().collect();
        let states = self.store.read_rows(&rows).await.unwrap();
        let commits: Vec<KeyCommit> = rows
            .into_iter()
            .zip(states)
            .map(|(row, state)| KeyCommit::new(row, state.lease_counter))
            .collect();
        assert!(
            self.store
                .commit_rows(&commits)
                .await
                .unwrap()
                .iter()
                .all(|landed| *landed)
        );
    }
}

impl<S: LeaseStore + CheckpointStore> Layer for Faults<S> {
    fn wrap<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        let throttled = || {
            Box::pin(async { Err(throughput_exceeded("")) }) as BoxFuture<'a, Result<T, LeaseError>>
        };
        let (mut lose, mut resend) = (false, false);
        let steal = match call.operation() {
            Operation::AcquireAndRead if self.claim_fails.load(Ordering::SeqCst) => {
                return throttled();
            }
            Operation::Transact if self.transact_fails.load(Ordering::SeqCst) => {
                return throttled();
            }
            Operation::Renew if self.renewals_fail.load(Ordering::SeqCst) => return throttled(),
            Operation::Renew => self.steal_on_renew.swap(false, Ordering::SeqCst),
            Operation::Commit if self.throttle_next_commit.swap(false, Ordering::SeqCst) => {
                return throttled();
            }
            Operation::Commit => {
                lose = self.lose_commit_answer.swap(false, Ordering::SeqCst);
                self.steal_before_checkpoint.swap(false, Ordering::SeqCst)
            }
            Operation::Transact => {
                lose = self.lose_transact_answer.swap(false, Ordering::SeqCst);
                resend = self
                    .resend_transact_after_lost_answer
                    .swap(false, Ordering::SeqCst);
                self.steal_before_transact.swap(false, Ordering::SeqCst)
            }
            _ => false,
        };
        let overwrite = call.operation() == Operation::CommitRows
            && self
                .rows_written_before_commit_rows
                .swap(false, Ordering::SeqCst);
        Box::pin(async move {
            if steal && let (Some(key), Some(owner)) = (call.key(), call.owner()) {
                self.steal(key, owner).await;
            }
            if overwrite {
                self.write_rows(call.keys()).await;
            }
            let answer = next.run(call).await;
            if resend {
                return resend_after_lost_answer(self.store.as_ref(), &call, answer).await;
            }
            if lose && answer.is_ok() {
                return Err(
                    "the connection was reset after the request was sent (injected)".into(),
                );
            }
            answer
        })
    }
}

/// `call`, a transaction that landed with `answer`, sent again with its request token, as
/// the SDK retries a request whose answer was lost: the resend must answer as the first did
/// (a store that applied it again, or refused it, broke the token's promise: an error saying
/// so reaches the caller).
async fn resend_after_lost_answer<S: CheckpointStore, T: fmt::Debug>(
    store: &S,
    call: &Call<'_>,
    answer: Result<T, LeaseError>,
) -> Result<T, LeaseError> {
    let first = match &answer {
        Ok(first) => format!("{first:?}"),
        Err(_) => return answer,
    };
    let (Some(key), Some(owner), Some(transaction)) =
        (call.key(), call.owner(), call.transaction())
    else {
        return answer;
    };
    let again = store.transact(key, owner, transaction).await?;
    if format!("{again:?}") == first {
        answer
    } else {
        Err(format!(
            "the resend of transaction {} with its token answered {again:?}, the first {first}",
            transaction.token
        )
        .into())
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

/// `inner` behind [`Chaos`].
pub type Chaotic<S> = Layered<S, Chaos<S>>;

/// Faults by chance, from a seed: throttling, lost answers, latency and stolen leases, on
/// every method of the store (of both interfaces: a [`SeedStore`](kinesis_checkpoint::store::SeedStore)
/// over a `Chaotic` store meets them in the seed's five methods).
pub struct Chaos<S> {
    /// The store a lease is stolen through.
    store: Arc<S>,
    levels: ChaosLevels,
    rng: std::sync::Mutex<kinesis_checkpoint_testing::local::Rng>,
    /// Faults injected so far: throttled, lost answers, slow calls, steals.
    pub injected: std::sync::Mutex<[u64; 4]>,
    /// Where every claim and write is noted, with its answer, when set.
    trace: Option<Arc<std::sync::Mutex<Vec<String>>>>,
}

impl<S: LeaseStore + CheckpointStore> Chaos<S> {
    /// The chaos layer for `inner`, drawing from `seed`; wrap with [`Chaos::around_store`].
    pub fn new(inner: Arc<S>, levels: ChaosLevels, seed: u64) -> Self {
        Self {
            store: inner,
            levels,
            rng: std::sync::Mutex::new(kinesis_checkpoint_testing::local::Rng::new(seed)),
            injected: std::sync::Mutex::new([0; 4]),
            trace: None,
        }
    }

    /// Notes every claim and write, with its answer, in `trace`.
    #[allow(dead_code, reason = "not every test binary traces")]
    pub fn traced(mut self, trace: Arc<std::sync::Mutex<Vec<String>>>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The store this layer was made for, behind it.
    pub fn around_store(self) -> Chaotic<S> {
        Layered::new(self.store.clone(), self)
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
            return Err(throughput_exceeded(" (injected)"));
        }
        Ok(())
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
            let _ = self.store.release(key, owner).await;
            let _ = self
                .store
                .acquire(key, "thief", self.levels.steal_ttl)
                .await;
        }
    }

    /// The trace line of `call`'s answer, for the calls the trace follows.
    fn line<T: fmt::Debug>(call: &Call<'_>, answer: &Result<T, LeaseError>) -> Option<String> {
        let key = || call.key().map(ToString::to_string).unwrap_or_default();
        let owner = call.owner().unwrap_or_default();
        Some(match call.operation() {
            Operation::AcquireAndRead => format!("store: {owner} claims {}: {answer:?}", key()),
            Operation::Commit => format!(
                "store: {owner} commits {} {:?}: {answer:?}",
                key(),
                call.commit()?
            ),
            Operation::Finish => format!(
                "store: finish {} expecting {:?}: {answer:?}",
                key(),
                call.finish()?.0
            ),
            Operation::ReadRows => format!("store: read rows {:?}: {answer:?}", call.keys()),
            Operation::CommitRows => {
                format!("store: commit rows {:?}: {answer:?}", call.key_commits())
            }
            Operation::Transact => {
                let transaction = call.transaction()?;
                format!(
                    "store: {owner} transacts {} writes with {} {:?}{}: {answer:?}",
                    transaction.writes.len(),
                    key(),
                    transaction.commit,
                    if transaction.commit.keep_lease {
                        ""
                    } else {
                        " and releases"
                    }
                )
            }
            _ => return None,
        })
    }
}

impl<S: LeaseStore + CheckpointStore> Layer for Chaos<S> {
    fn wrap<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        let operation = call.operation();
        Box::pin(async move {
            self.before().await?;
            if matches!(
                operation,
                Operation::Renew | Operation::Commit | Operation::Transact
            ) && let (Some(key), Some(owner)) = (call.key(), call.owner())
            {
                self.maybe_steal(key, owner).await;
            }
            let mut answer = next.run(call).await;
            if operation == Operation::Transact
                && answer.is_ok()
                && self.roll(self.levels.lost_answer, 1)
            {
                // The answer is lost: half the time the SDK sends the transaction again with
                // its request token (which must apply it once), half the time it gives up.
                let resend = self.rng.lock().unwrap().chance(0.5);
                self.note(|| {
                    format!(
                        "store: the answer below is lost (injected){}",
                        if resend {
                            "; the SDK resends it with its token"
                        } else {
                            ""
                        }
                    )
                });
                answer = if resend {
                    resend_after_lost_answer(self.store.as_ref(), &call, answer).await
                } else {
                    Err("the connection was reset after the request was sent (injected)".into())
                };
            }
            if matches!(
                operation,
                Operation::Checkpoint
                    | Operation::Commit
                    | Operation::Finish
                    | Operation::CommitRows
            ) {
                answer = self.after(answer);
            }
            if self.trace.is_some()
                && let Some(line) = Self::line(&call, &answer)
            {
                self.note(|| line);
            }
            answer
        })
    }
}
