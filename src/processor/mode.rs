//! The two modes as types, each with the settings only it reads.
//!
//! A setting the other mode would ignore is not there to be called: `lease_ttl` on a
//! partition-key processor, which takes no shard lease, or `key_ttl` on a shard processor,
//! which writes no key rows, does not compile.

use std::sync::Arc;
use std::time::Duration;

use super::Processor;
use crate::engine::{Mode, Settings};
use crate::handler::Handler;
use crate::store::CheckpointStore;

mod sealed {
    /// Only this crate's modes: the engine knows no other.
    pub trait Sealed {
        /// The mode the engine runs.
        const MODE: crate::engine::Mode;
    }
}

/// A checkpoint mode: [`ShardMode`] or [`PartitionKeyMode`] (sealed: the engine knows no other).
///
/// Generic code over both modes names it; the settings both share are methods of
/// `Processor<H, M>` for any `M: CheckpointMode`.
///
/// ```
/// use kinesis_checkpoint::processor::CheckpointMode;
/// use kinesis_checkpoint::{Handler, Processor};
///
/// fn with_limits<H: Handler, M: CheckpointMode>(processor: Processor<H, M>) -> Processor<H, M> {
///     processor.max_attempts(5).concurrency(8)
/// }
/// ```
pub trait CheckpointMode: sealed::Sealed + Send + Sync + 'static {}

/// One lease and one checkpoint per shard, for an event source mapping with
/// `ParallelizationFactor` 1: the default mode, [`Processor::new`].
///
/// A concurrent delivery of the shard processes nothing. Its own settings are
/// [`lease_ttl`](Processor::lease_ttl), [`clock_skew`](Processor::clock_skew) and
/// [`max_done_above`](Processor::max_done_above); a partition-key setting does not compile here:
///
/// ```compile_fail
/// # use std::{sync::Arc, time::Duration};
/// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
/// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
///     .key_ttl(Duration::from_hours(25)); // only for Processor::by_partition_key
/// ```
#[derive(Debug, Clone, Copy)]
pub enum ShardMode {}

/// A checkpoint per partition key and no shard lease, for an event source mapping with
/// `ParallelizationFactor` 2 to 10, where Lambda runs several batches of one shard at once
/// (split by partition key): [`Processor::by_partition_key`].
///
/// Every partition key has a row of its own, keyed `stream:shard:partition-key` in the same
/// table, with the key's checkpoint, its failing record and a TTL
/// ([`key_ttl`](Processor::key_ttl), its one setting of its own). A batch reads its keys' rows
/// (100 per `BatchGetItem`, with the shard's own row, so a consumer of the whole shard sharing
/// the table holds it), skips every record at or below its key's checkpoint, dispatches the
/// rest one queue per key, and writes the rows that changed (100 per `TransactWriteItems`), each
/// on condition that nobody wrote it since it was read. The record reported is the lowest one
/// not done. The gate holds a child shard until every record of its parents is at or below its
/// key's checkpoint.
///
/// There is no lease here, so the shard mode's lease settings do not compile:
///
/// ```compile_fail
/// # use std::{sync::Arc, time::Duration};
/// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
/// let processor = Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
///     .lease_ttl(Duration::from_secs(10)); // only for Processor::new, the shard mode
/// ```
///
/// ```compile_fail
/// # use std::{sync::Arc, time::Duration};
/// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
/// let processor = Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
///     .clock_skew(Duration::from_secs(2));
/// ```
///
/// ```compile_fail
/// # use std::sync::Arc;
/// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
/// let processor = Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
///     .concurrency(32)
///     .max_done_above(500);
/// ```
#[derive(Debug, Clone, Copy)]
pub enum PartitionKeyMode {}

impl sealed::Sealed for ShardMode {
    const MODE: Mode = Mode::Shard;
}
impl CheckpointMode for ShardMode {}

impl sealed::Sealed for PartitionKeyMode {
    const MODE: Mode = Mode::PartitionKey;
}
impl CheckpointMode for PartitionKeyMode {}

/// The shard mode's constructor and settings.
impl<H: Handler> Processor<H, ShardMode> {
    /// A processor in the shard mode ([`ShardMode`]) that keeps its leases and checkpoints in
    /// `store` and runs `handler` on each record.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    ///
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_record: Record| async {
    ///     Outcome::ack()
    /// });
    /// ```
    pub fn new(store: Arc<dyn CheckpointStore>, handler: H) -> Self {
        Self::with(mode_settings::<H, ShardMode>(store, handler))
    }

    /// How long each lease is taken or renewed for (capped by the time left before the
    /// deadline; default [`DEFAULT_LEASE_TTL`](super::DEFAULT_LEASE_TTL)). Renewal runs every
    /// third of it while the batch runs.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .lease_ttl(Duration::from_secs(10));
    /// ```
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lease_ttl = ttl.max(Duration::from_millis(3));
        self
    }

    /// How far another sandbox's clock may run ahead of this one's (default
    /// [`DEFAULT_CLOCK_SKEW`](super::DEFAULT_CLOCK_SKEW)). The stored lease expiry is this
    /// sandbox's clock plus the TTL and a concurrent delivery elsewhere judges it by its own
    /// clock, so this invocation stops relying on its lease that much before the expiry it
    /// wrote. The margin never exceeds a third of the lease's TTL; keep the TTL well above the
    /// skew.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .clock_skew(Duration::from_millis(2_500));
    /// ```
    #[must_use]
    pub const fn clock_skew(mut self, skew: Duration) -> Self {
        self.settings.clock_skew = skew;
        self
    }

    /// How many records done above the checkpoint the row may remember (default
    /// [`DEFAULT_MAX_DONE_ABOVE`](super::DEFAULT_MAX_DONE_ABOVE)), under per-key
    /// [`concurrency`](Processor::concurrency). At the bound, no new record starts above the
    /// lowest one not done: the rest of the batch is not attempted and comes back with the
    /// redelivery, so nothing runs twice and the row stays small (a `DynamoDB` item holds
    /// 400 KB; a position takes about 60 bytes).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .concurrency(32)
    ///     .max_done_above(500);
    /// ```
    #[must_use]
    pub fn max_done_above(mut self, positions: usize) -> Self {
        self.settings.max_done_above = positions.max(1);
        self
    }
}

/// The partition-key mode's constructor and setting.
impl<H: Handler> Processor<H, PartitionKeyMode> {
    /// A processor in the partition-key mode ([`PartitionKeyMode`], for `ParallelizationFactor`
    /// 2 to 10) that keeps a checkpoint per partition key in `store` and runs `handler` on each
    /// record.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    ///
    /// let processor =
    ///     Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), |_: Record| async {
    ///         Outcome::ack()
    ///     })
    ///     .concurrency(16);
    /// ```
    pub fn by_partition_key(store: Arc<dyn CheckpointStore>, handler: H) -> Self {
        Self::with(mode_settings::<H, PartitionKeyMode>(store, handler))
    }

    /// How long a partition key's row outlives its last write (default
    /// [`DEFAULT_KEY_TTL`](super::DEFAULT_KEY_TTL), 8 days): set it to the stream's retention
    /// and a day. A key silent for longer than the stream keeps records cannot be redelivered.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .key_ttl(Duration::from_hours(25));
    /// ```
    #[must_use]
    pub const fn key_ttl(mut self, ttl: Duration) -> Self {
        self.settings.key_ttl = ttl;
        self
    }
}

/// The defaults, in mode `M`.
fn mode_settings<H, M: CheckpointMode>(store: Arc<dyn CheckpointStore>, handler: H) -> Settings<H> {
    let mut settings = Settings::new(store, handler);
    settings.mode = <M as sealed::Sealed>::MODE;
    settings
}
