//! Clock skew between sandboxes, as the store sees it: a lease's stored expiry is the writing
//! sandbox's clock plus the TTL, so a sandbox whose clock runs `offset` behind the others' writes
//! leases that lapse `offset` early for everyone else, and one ahead writes leases that last
//! longer. Each invocation gets its own offset; this layer shifts the TTL of every lease it
//! takes or renews by it. The processor's `clock_skew` margin must absorb it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::store::{Call, Layer, Layered, Next};
use kinesis_checkpoint::store::{CheckpointStore, LeaseError};

/// `inner`, with every lease TTL shifted by the invocation's clock offset.
pub type Skewed = Layered<dyn CheckpointStore, Skew>;

/// `inner`, its lease TTLs shifted by `offset_ms` (negative: the sandbox's clock is behind, its
/// leases lapse early).
pub fn skewed(inner: Arc<dyn CheckpointStore>, offset_ms: i64) -> Skewed {
    Layered::new(inner, Skew { offset_ms })
}

/// The offset of one invocation's clock.
pub struct Skew {
    pub offset_ms: i64,
}

impl Skew {
    fn shifted(&self, ttl: Duration) -> Duration {
        let millis = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Duration::from_millis(u64::try_from((millis + self.offset_ms).max(1)).unwrap_or(1))
    }
}

impl Layer for Skew {
    fn around<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        match call.lease_ttl() {
            Some(ttl) => next.run(call.with_lease_ttl(self.shifted(ttl))),
            None => next.run(call),
        }
    }
}
