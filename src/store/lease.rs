//! [`LeaseStore`]: the seed crate's store interface, its five methods exactly.
//!
//! Lambda delivers a shard's batches at least once and, after errors or mapping updates, may
//! deliver the same records to two invocations at once. A lease makes one invocation the owner
//! of a shard while it works, and a checkpoint written on condition of still owning it records
//! what is done, so a redelivery skips it. This is the seed crate's contract, kept as it is so
//! that a store written for the seed keeps compiling: `acquire`, `renew`, `checkpoint`, `read`,
//! `release`, and nothing provided. The engine does not call it; it calls
//! [`CheckpointStore`](crate::store::CheckpointStore), and a five-method store reaches the engine
//! through [`SeedStore`](crate::store::SeedStore).
//!
//! The row a store reads ([`LeaseState`]) is the toolkit's wider schema; a five-method store
//! fills in what it keeps (the checkpoint at least) and leaves the rest empty.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::key::LeaseKey;
use crate::sequence::Position;

/// A boxed future that can cross threads: what every [`LeaseStore`] method returns, so the
/// trait stays object safe (`Arc<dyn LeaseStore>`). The same type as `futures`' `BoxFuture`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The error a lease store reports. The processor adds the stream, the shard and the sequence
/// number when it logs or returns one; typed causes (such as
/// [`UnattributedLegacyRow`](crate::store::dynamo::UnattributedLegacyRow)) can be recovered with `downcast_ref`.
pub type LeaseError = Box<dyn StdError + Send + Sync>;

/// The persisted state of one shard's row.
///
/// The seed crate's state held the checkpoint only; the other fields are the toolkit's
/// extensions of the schema, and a store that does not keep them leaves them empty.
///
/// `checkpoint` always names a record done whole (or [`SHARD_END`](crate::sequence::SHARD_END)): that is what the seed
/// crate, the KCL and a person reading the table take it for, and a writer that knows nothing
/// of KPL (the seed crate) moves it alone. Progress *inside* the KPL aggregate after it is kept
/// beside it, in `aggregate_sequence` and `aggregate_sub`, and believed only while that
/// aggregate lies above `checkpoint`: once another writer moves `checkpoint` past it, it is
/// stale and ignored, never believed.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::Position;
/// use kinesis_checkpoint::store::LeaseState;
///
/// let mut state = LeaseState::default();
/// state.checkpoint = Some("1100".to_owned());
/// state.aggregate_sequence = Some("1200".to_owned());
/// state.aggregate_sub = Some(4);
/// assert_eq!(state.position()?, Some(Position::sub_record("1200".parse()?, 4)));
///
/// // A writer that knows nothing of aggregates moved the checkpoint past it: stale.
/// state.checkpoint = Some("1300".to_owned());
/// assert_eq!(state.position()?, Some(Position::record("1300".parse()?)));
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseState {
    /// The last checkpointed sequence number, [`SHARD_END`](crate::sequence::SHARD_END) when the shard is finished, or
    /// `None` when never checkpointed.
    pub checkpoint: Option<String>,
    /// The KPL aggregate in progress after `checkpoint`, when one is: its sequence number.
    /// Believed only while it lies above `checkpoint`.
    pub aggregate_sequence: Option<String>,
    /// The last sub-record of `aggregate_sequence` done (sub-records `0..=aggregate_sub`).
    pub aggregate_sub: Option<u64>,
    /// Who holds the lease, if anyone.
    pub lease_owner: Option<String>,
    /// When the lease lapses, in epoch milliseconds.
    pub lease_expiry: Option<u64>,
    /// The fencing counter, bumped by every write.
    pub lease_counter: u64,
    /// The shard's parents, once learnt from the stream's topology.
    pub parent_shards: Vec<String>,
    /// The row records that the shard has no parents (an original shard), learnt from the
    /// stream's topology: the gate asks the stream nothing more for it, even after a cold start.
    /// `false` in a row that lists its parents, and in one that does not know them yet (written
    /// before this attribute, or by a store that does not keep it): an empty `parent_shards` is
    /// then "unknown", and the gate asks. See [`LeaseState::known_parents`].
    pub parentless: bool,
    /// The record that keeps failing, and how often it has.
    pub failing: Option<FailingRecord>,
    /// When `DynamoDB` may delete the row (epoch seconds), set once the shard is finished.
    pub expires_at: Option<u64>,
    /// Records done above the checkpoint, in order: per-key concurrency finishes records out of
    /// order, and a redelivery skips these. Bounded by
    /// [`Processor::max_done_above`](crate::Processor::max_done_above).
    pub done_above: Vec<Position>,
    /// The record this toolkit last reported to Lambda for the shard and has not done since
    /// (or the first record of a range the mapping skipped and that is not recovered yet): a
    /// batch that starts after it proves that the mapping discarded records (see
    /// [`gap`](crate::gap)). Meaningful only while it is above the checkpoint.
    pub reported: Option<Position>,
}

/// A record that failed and will be delivered again, as the shard's row remembers it: the
/// attempts survive invocations and cold starts, so a record that keeps failing can be moved
/// to the dead-letter sink after a set number of them.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::Position;
/// use kinesis_checkpoint::store::FailingRecord;
///
/// let position = Position::record("42".parse()?);
/// let first = FailingRecord::first(&position, "timeout", 1_700_000_000_000);
/// let second = first.again(&position, "timeout", 1_700_000_060_000);
/// assert_eq!(second.attempts, 2);
/// assert_eq!(second.first_failure, 1_700_000_000_000);
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailingRecord {
    /// The record's sequence number.
    pub sequence: String,
    /// Its sub-sequence inside a KPL aggregate, if any.
    pub sub_sequence: Option<u64>,
    /// How many attempts failed.
    pub attempts: u32,
    /// The last attempt's error.
    pub last_error: String,
    /// When the first attempt failed, in epoch milliseconds.
    pub first_failure: u64,
    /// When the last attempt failed, in epoch milliseconds.
    pub last_failure: u64,
}

/// The longest error a row keeps: a `DynamoDB` item is limited to 400 KB, and the first lines of
/// an error say what it is.
pub const MAX_ERROR_CHARS: usize = 1_000;

impl FailingRecord {
    /// The first failure of the record at `position`.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::store::FailingRecord;
    /// let failing = FailingRecord::first(&Position::sub_record("9".parse()?, 2), "boom", 5);
    /// assert_eq!((failing.attempts, failing.sub_sequence), (1, Some(2)));
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn first(position: &Position, error: &str, now_millis: u64) -> Self {
        Self {
            sequence: position.checkpoint().to_owned(),
            sub_sequence: position.sub_sequence(),
            attempts: 1,
            last_error: truncated(error),
            first_failure: now_millis,
            last_failure: now_millis,
        }
    }

    /// Whether this is the record at `position`.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::store::FailingRecord;
    /// let position = Position::record("9".parse()?);
    /// assert!(FailingRecord::first(&position, "boom", 5).is(&position));
    /// assert!(!FailingRecord::first(&position, "boom", 5).is(&Position::record("10".parse()?)));
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn is(&self, position: &Position) -> bool {
        self.sequence == position.checkpoint() && self.sub_sequence == position.sub_sequence()
    }

    /// One more failure of the record at `position`: counted on when it is this record, the
    /// first failure of a new one otherwise.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::store::FailingRecord;
    /// let nine = Position::record("9".parse()?);
    /// let ten = Position::record("10".parse()?);
    /// let failing = FailingRecord::first(&nine, "boom", 5);
    /// assert_eq!(failing.again(&nine, "boom", 6).attempts, 2);
    /// assert_eq!(failing.again(&ten, "boom", 6).attempts, 1);
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn again(&self, position: &Position, error: &str, now_millis: u64) -> Self {
        if !self.is(position) {
            return Self::first(position, error, now_millis);
        }
        Self {
            attempts: self.attempts.saturating_add(1),
            last_error: truncated(error),
            last_failure: now_millis,
            ..self.clone()
        }
    }
}

fn truncated(error: &str) -> String {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((end, _)) => format!("{}…", &error[..end]),
        None => error.to_owned(),
    }
}

/// Durable coordination for shard leases and checkpoints.
///
/// The contract is the seed crate's, after the vendor's consumer library: `acquire` takes a
/// shard for an owner (stealing an expired lease), `renew` heartbeats it, and `checkpoint`
/// records progress on condition of still holding the lease. A `false` from `renew` or
/// `checkpoint` means the owner has been fenced and must stop processing at once. Every call
/// names the shard by its [`LeaseKey`].
///
/// The trait has no provided method, and gets none: an extension with a default would be
/// silently degraded in every store and wrapper that did not override it. The toolkit's
/// extensions are [`CheckpointStore`](crate::store::CheckpointStore)'s, every one required; a
/// store of these five methods is made one by [`SeedStore`](crate::store::SeedStore), which
/// says once what such a store cannot keep.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore};
/// use kinesis_checkpoint::store::LeaseStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_checkpoint::store::LeaseError> {
/// let store = MemoryLeaseStore::new();
/// let key = LeaseKey::new("orders", "shardId-000000000000");
/// assert!(store.acquire(&key, "me", Duration::from_secs(30)).await?);
/// assert!(store.checkpoint(&key, "me", "17").await?);
/// store.release(&key, "me").await?;
/// assert_eq!(LeaseStore::read(&store, &key).await?.checkpoint.as_deref(), Some("17"));
/// # Ok(())
/// # }
/// ```
pub trait LeaseStore: Send + Sync + 'static {
    /// Attempts to take the shard's lease for `owner`, valid for `ttl`. Returns `false` when
    /// another live owner holds it.
    fn acquire<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>>;

    /// Heartbeats the lease. Returns `false` when the lease is no longer held (fenced).
    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>>;

    /// Records `sequence` as the shard's checkpoint, on condition that `owner` holds the lease.
    /// Returns `false` when fenced.
    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<bool, LeaseError>>;

    /// Reads the shard's persisted state, whoever owns it.
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>>;

    /// Releases the lease so another owner can take it without waiting for expiry. Releasing a
    /// lease that is no longer ours does nothing.
    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>>;
}
