//! Clock skew between sandboxes, as the store sees it: a lease's stored expiry is the writing
//! sandbox's clock plus the TTL, so a sandbox whose clock runs `offset` behind the others' writes
//! leases that lapse `offset` early for everyone else, and one ahead writes leases that last
//! longer. Each invocation gets its own offset; this layer shifts the TTL of every lease it
//! takes or renews by it. The processor's `clock_skew` margin must absorb it.
//!
//! A skew shows only when a sandbox stops renewing and goes on working: a [`Pause`] freezes one
//! (its renewals wait) after its first record, until its stored lease has lapsed and a rival has
//! taken and run the batch. Without the margin its own view of the lease still runs, and it
//! starts records the rival has already done.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::internal::{Call, Layer, Layered, Next, Operation};
use kinesis_checkpoint::store::{CheckpointStore, LeaseError};

/// `inner`, with every lease TTL shifted by the invocation's clock offset.
pub type Skewed = Layered<dyn CheckpointStore, Skew>;

/// `inner`, its lease TTLs shifted by `offset_ms` (negative: the sandbox's clock is behind, its
/// leases lapse early).
pub fn skewed(inner: Arc<dyn CheckpointStore>, offset_ms: i64) -> Skewed {
    Layered::new(
        inner,
        Skew {
            offset_ms,
            frozen: tokio::sync::Mutex::new(()),
        },
    )
}

/// The offset of one invocation's clock, and whether the sandbox is frozen.
pub struct Skew {
    pub offset_ms: i64,
    /// Held while the sandbox is frozen: a renewal waits for it.
    frozen: tokio::sync::Mutex<()>,
}

/// A freeze of one sandbox: `begin` tells the rival to go once the stored lease lapsed, `done`
/// that it has run the batch.
#[allow(dead_code, reason = "tests/layers.rs uses the layer only")]
pub struct Pause {
    skewed: Arc<Skewed>,
    pub begin: tokio::sync::Notify,
    pub done: tokio::sync::Notify,
}

#[allow(dead_code, reason = "tests/layers.rs uses the layer only")]
impl Pause {
    pub fn new(skewed: Arc<Skewed>) -> Self {
        Self {
            skewed,
            begin: tokio::sync::Notify::new(),
            done: tokio::sync::Notify::new(),
        }
    }

    /// Freezes the sandbox (no renewal goes out) until the rival is done, or `at_most`.
    pub async fn freeze(&self, at_most: Duration) {
        let _frozen = self.skewed.layer().frozen.lock().await;
        self.begin.notify_one();
        let _ = tokio::time::timeout(at_most, self.done.notified()).await;
    }
}

impl Skew {
    fn shifted(&self, ttl: Duration) -> Duration {
        let millis = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Duration::from_millis(u64::try_from((millis + self.offset_ms).max(1)).unwrap_or(1))
    }
}

impl Layer for Skew {
    fn wrap<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        let Some(ttl) = call.lease_ttl() else {
            return next.run(call);
        };
        let call = call.with_lease_ttl(self.shifted(ttl));
        if call.operation() != Operation::Renew {
            return next.run(call);
        }
        Box::pin(async move {
            // A frozen sandbox sends nothing until it thaws.
            drop(self.frozen.lock().await);
            next.run(call).await
        })
    }
}
