//! The store's side of the metrics: what one invocation's store calls cost, counted while it
//! runs.
//!
//! One process may run several invocations at once (Lambda Managed Instances, or a test that
//! calls one processor concurrently), so the figures are kept per invocation: the invocation
//! runs inside [`scope`], where the stores count their requests ([`count_request`]) and the
//! [`Timed`] layer the latency of each final write into the invocation's own [`Counters`].
//! [`metrics`](crate::metrics) reads them when the invocation ends.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::checkpoints::CheckpointStore;
use super::layer::{Call, Layer, Layered, Next, Operation};
use super::lease::{BoxFuture, LeaseError};
use crate::clock::Clock;

/// What one invocation counts while it runs.
#[derive(Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
}

impl Counters {
    /// The requests counted so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The final writes' latencies, taken out.
    pub(crate) fn take_latencies(&self) -> Vec<Duration> {
        std::mem::take(
            &mut *self
                .latencies
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

tokio::task_local! {
    /// The counters of the invocation being polled, whichever task polls it.
    static INVOCATION: Arc<Counters>;
}

/// `work`, one invocation, counting into `counters` whichever task polls it. A plain
/// function, not an `async` one: another state machine over `work` would hold it twice.
pub(crate) fn scope<F: Future>(
    counters: Arc<Counters>,
    work: F,
) -> impl Future<Output = F::Output> {
    INVOCATION.scope(counters, work)
}

/// Counts one lease-table request for the invocation being polled, if it is metered.
#[cfg(feature = "dynamodb")]
pub(crate) fn count_request() {
    let _ = INVOCATION.try_with(|counters| counters.requests.fetch_add(1, Ordering::Relaxed));
}

fn record_latency(latency: Duration) {
    let _ = INVOCATION.try_with(|counters| {
        counters
            .latencies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(latency);
    });
}

/// Times each final write ([`commit`](CheckpointStore::commit), and the partition-key mode's
/// [`commit_rows`](CheckpointStore::commit_rows)) and passes every call on unchanged, so the
/// inner store's one-request combinations stay one request.
pub(crate) struct Timed {
    /// What the latency is measured on.
    pub(crate) clock: Arc<dyn Clock>,
}

impl Layer for Timed {
    fn wrap<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        // The last writes only: a mark that keeps the lease (after a death) is not one.
        let last = match call.operation() {
            Operation::Commit => call.commit().is_some_and(|commit| !commit.keep_lease),
            Operation::CommitRows => true,
            _ => false,
        };
        if !last {
            return next.run(call);
        }
        Box::pin(async move {
            let started = self.clock.monotonic();
            let written = next.run(call).await;
            record_latency(self.clock.monotonic().saturating_sub(started));
            written
        })
    }
}

/// A store whose final writes are timed.
pub(crate) type Metered = Layered<dyn CheckpointStore, Timed>;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::key::LeaseKey;
    use crate::store::memory::MemoryLeaseStore;
    use crate::store::{Commit, KeyCommit};

    #[tokio::test]
    async fn the_timed_store_times_each_final_write_and_no_mark() {
        let memory = Arc::new(MemoryLeaseStore::new());
        let inner: Arc<dyn CheckpointStore> = memory.clone();
        let store: Metered = Layered::new(
            inner,
            Timed {
                clock: crate::clock::system(),
            },
        );
        let counters = Arc::new(Counters::default());
        let key = LeaseKey::new("orders", "shardId-000000000000");
        let writes = async {
            let ttl = Duration::from_secs(10);
            store.acquire_and_read(&key, "a", ttl, None).await.unwrap();
            let mark = Commit {
                keep_lease: true,
                ..Commit::default()
            };
            assert!(store.commit(&key, "a", &mark).await.unwrap());
            assert!(store.commit(&key, "a", &Commit::default()).await.unwrap());
            let row = KeyCommit::new(LeaseKey::new("orders", "shardId-000000000000:k"), 0);
            store.commit_rows(&[row]).await.unwrap();
        };
        scope(counters.clone(), writes).await;
        assert_eq!(
            counters.take_latencies().len(),
            2,
            "the last write and the rows"
        );
    }
}
