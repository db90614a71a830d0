//! What one processor runs with: the store, the handler, the dead-letter sink, the gate, the
//! limits, and their defaults.
//!
//! The builder ([`Processor`](crate::Processor)) fills these in; every part of the engine reads
//! them from here, so no mode, dispatcher or attempt depends on the builder itself.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{self, Clock};
use crate::dead_letter::DeadLetterSink;
use crate::gate::Gate;
use crate::metrics::Meter;
use crate::store::CheckpointStore;

/// How long a lease is taken for, unless the invocation's deadline is sooner. Short, so that an
/// invocation that dies holds its shard for seconds; renewed while a long batch runs.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// How many attempts a failing record gets before it is dead-lettered, when a sink is set.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// How long before the deadline dispatching stops, leaving time for the checkpoint write.
pub const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_secs(1);

/// How far another sandbox's clock may run ahead of this one's. The stored lease expiry is this
/// sandbox's clock plus the TTL, and another invocation judges it by its own clock: this one
/// stops counting on the lease that much earlier, so two sandboxes never both believe they hold
/// it.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// How many records done above the checkpoint a row remembers at most, by default: about
/// 60 KB of a `DynamoDB` item's 400 KB, with 56-digit sequence numbers.
pub const DEFAULT_MAX_DONE_ABOVE: usize = 1_000;

/// How a processor keeps its checkpoints, as a value: which fits the event source mapping's
/// `ParallelizationFactor`. The builder takes the mode as a type
/// ([`ShardMode`](crate::ShardMode), [`PartitionKeyMode`](crate::PartitionKeyMode)); this is
/// the same choice read from configuration, for a function that branches at start-up.
///
/// ```
/// use std::sync::Arc;
///
/// use kinesis_checkpoint::{MemoryLeaseStore, Mode, Outcome, Processor, Record};
///
/// async fn handle(_: Record) -> Outcome {
///     Outcome::ack()
/// }
///
/// let store = Arc::new(MemoryLeaseStore::new());
/// // ParallelizationFactor above 1:
/// let mode: Mode = "partition-key".parse()?;
/// match mode {
///     Mode::Shard => drop(Processor::new(store, handle).service()),
///     Mode::PartitionKey => drop(Processor::by_partition_key(store, handle).service()),
/// }
/// # Ok::<(), kinesis_checkpoint::processor::UnknownMode>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// One lease and one checkpoint per shard: for `ParallelizationFactor` 1 (the default).
    /// A concurrent delivery of the shard processes nothing.
    #[default]
    Shard,
    /// A checkpoint per partition key and no shard lease: for `ParallelizationFactor` 2 to 10,
    /// where Lambda runs several batches of one shard at once.
    PartitionKey,
}

/// A mode name that is neither `shard` nor `partition-key`.
///
/// ```
/// use kinesis_checkpoint::Mode;
///
/// let error = "parallel".parse::<Mode>().unwrap_err();
/// assert!(error.to_string().contains("ParallelizationFactor 2 to 10"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "checkpoint mode '{0}' is neither 'shard' (ParallelizationFactor 1) nor 'partition-key' \
     (ParallelizationFactor 2 to 10)"
)]
pub struct UnknownMode(String);

impl std::str::FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "shard" => Ok(Self::Shard),
            "partition-key" => Ok(Self::PartitionKey),
            other => Err(UnknownMode(other.to_owned())),
        }
    }
}

/// How long a partition key's row outlives its last write, by default: a week's retention and
/// a day.
pub const DEFAULT_KEY_TTL: Duration = Duration::from_hours(8 * 24);

/// The settings of one processor, as the engine reads them: each field is what the
/// [`Processor`](crate::Processor) method of the same name sets.
pub(crate) struct Settings<H> {
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) handler: Arc<H>,
    pub(crate) dead_letters: Option<Arc<dyn DeadLetterSink>>,
    pub(crate) gate: Option<Arc<Gate>>,
    pub(crate) deaggregate: bool,
    pub(crate) max_attempts: u32,
    pub(crate) lease_ttl: Duration,
    pub(crate) clock_skew: Duration,
    pub(crate) deadline_margin: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) max_done_above: usize,
    pub(crate) mode: Mode,
    pub(crate) key_ttl: Duration,
    pub(crate) meter: Option<Arc<Meter>>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The handler stages `DynamoDB` writes ([`Processor::transactional`](crate::Processor::transactional)):
    /// each is committed with the checkpoint, in transactions.
    pub(crate) transactional: bool,
    /// Above this many bytes of payloads, an event of one shard is read in two steps.
    pub(crate) read_in_chunks_above: usize,
}

impl<H> Settings<H> {
    /// The defaults, over `store` and `handler`.
    pub(crate) fn new(store: Arc<dyn CheckpointStore>, handler: H) -> Self {
        Self {
            store,
            handler: Arc::new(handler),
            dead_letters: None,
            gate: None,
            deaggregate: true,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            lease_ttl: DEFAULT_LEASE_TTL,
            clock_skew: DEFAULT_CLOCK_SKEW,
            deadline_margin: DEFAULT_DEADLINE_MARGIN,
            max_in_flight: 1,
            max_done_above: DEFAULT_MAX_DONE_ABOVE,
            mode: Mode::Shard,
            key_ttl: DEFAULT_KEY_TTL,
            meter: None,
            clock: clock::system(),
            transactional: false,
            read_in_chunks_above: crate::event::LARGE,
        }
    }
}

impl<H> Clone for Settings<H> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            handler: Arc::clone(&self.handler),
            dead_letters: self.dead_letters.clone(),
            gate: self.gate.clone(),
            deaggregate: self.deaggregate,
            max_attempts: self.max_attempts,
            lease_ttl: self.lease_ttl,
            clock_skew: self.clock_skew,
            deadline_margin: self.deadline_margin,
            max_in_flight: self.max_in_flight,
            max_done_above: self.max_done_above,
            mode: self.mode,
            key_ttl: self.key_ttl,
            meter: self.meter.clone(),
            clock: Arc::clone(&self.clock),
            transactional: self.transactional,
            read_in_chunks_above: self.read_in_chunks_above,
        }
    }
}
