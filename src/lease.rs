//! Shard leases and checkpoints: who may process a shard now, and how far it got.
//!
//! Lambda delivers a shard's batches at least once and, after errors or mapping updates, may
//! deliver the same records to two invocations at once. A lease makes one invocation the owner of
//! a shard while it works, and a checkpoint written on condition of still owning it records what
//! is done, so a redelivery skips it. The storage is a trait, [`LeaseStore`], with the seed
//! crate's five methods; the toolkit's extensions are provided methods built on those five, so a
//! store written for the seed keeps compiling, and a store that can do better (the `DynamoDB`
//! one) overrides them to save round trips.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

pub use crate::row::Below;
pub(crate) use crate::row::RowForm;
use crate::sequence::{Position, SequenceError};

/// The checkpoint value marking a shard fully consumed; its children may start.
pub const SHARD_END: &str = "SHARD_END";

/// A boxed future that can cross threads: what every [`LeaseStore`] method returns, so the
/// trait stays object safe (`Arc<dyn LeaseStore>`). The same type as `futures`' `BoxFuture`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The error a lease store reports. The processor adds the stream, the shard and the sequence
/// number when it logs or returns one; typed causes (such as
/// [`UnattributedLegacyRow`](crate::UnattributedLegacyRow)) can be recovered with `downcast_ref`.
pub type LeaseError = Box<dyn StdError + Send + Sync>;

/// The name one shard's lease and checkpoint live under: the stream and the shard id.
///
/// Every stream's first shard is `shardId-000000000000`, so a store keys by both, and one table
/// serves every stream. Both parts are shared: each record of a batch carries its key.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::LeaseKey;
///
/// let key = LeaseKey::new("orders", "shardId-000000000003");
/// assert_eq!(key.stream(), "orders");
/// assert_eq!(key.to_string(), "orders:shardId-000000000003");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey {
    stream: Arc<str>,
    shard: Arc<str>,
}

impl LeaseKey {
    /// The lease of `shard` on `stream`.
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// assert_eq!(key.shard(), "shardId-000000000000");
    /// ```
    #[must_use]
    pub fn new(stream: impl Into<Arc<str>>, shard: impl Into<Arc<str>>) -> Self {
        Self {
            stream: stream.into(),
            shard: shard.into(),
        }
    }

    /// The stream the shard belongs to.
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// assert_eq!(LeaseKey::new("orders", "shardId-000000000000").stream(), "orders");
    /// ```
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The shard id, unique within its stream only.
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// assert_eq!(LeaseKey::new("orders", "shardId-000000000001").shard(), "shardId-000000000001");
    /// ```
    #[must_use]
    pub fn shard(&self) -> &str {
        &self.shard
    }
}

/// `stream:shard`, the `lease_key` of the shard's row. A stream name holds no colon, so the form
/// is unambiguous.
impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.stream, self.shard)
    }
}

/// The persisted state of one shard's row.
///
/// The seed crate's state held the checkpoint only; the other fields are the toolkit's
/// extensions of the schema, and a store that does not keep them leaves them empty.
///
/// `checkpoint` always names a record done whole (or [`SHARD_END`]): that is what the seed
/// crate, the KCL and a person reading the table take it for, and a writer that knows nothing
/// of KPL (the seed crate) moves it alone. Progress *inside* the KPL aggregate after it is kept
/// beside it, in `aggregate_sequence` and `aggregate_sub`, and believed only while that
/// aggregate lies above `checkpoint`: once another writer moves `checkpoint` past it, it is
/// stale and ignored, never believed.
///
/// Rows of version 0.1.0 kept the position inside an aggregate in `checkpoint` itself, with
/// `checkpoint_sub` (`checkpoint = S, checkpoint_sub = k`: everything before `S` and `S`'s
/// sub-records `0..=k` done, `S` not done whole). They are read as they meant it, and the next
/// write past `S` rewrites them in the new form (see [`Below::Legacy`]).
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::{LeaseState, Position};
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
/// # Ok::<(), kinesis_checkpoint::SequenceError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseState {
    /// The last checkpointed sequence number, [`SHARD_END`] when the shard is finished, or
    /// `None` when never checkpointed.
    pub checkpoint: Option<String>,
    /// The 0.1.0 form of a position inside a KPL aggregate: `checkpoint` is the aggregate and
    /// its sub-records `0..=checkpoint_sub` are done. Read, and kept until the aggregate is done
    /// whole; never written otherwise. `None` in every row of the current form.
    pub checkpoint_sub: Option<u64>,
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
    /// The first record of the last batch turned away by a live lease of another owner (a
    /// concurrent delivery, or an owner whose release did not land): written without the
    /// lease and never removed by the owner, so that the mapping giving up on that batch
    /// while the lease lingers is still found as a gap. Meaningful only while it is above the
    /// checkpoint.
    pub contended: Option<Position>,
}

impl LeaseState {
    /// The checkpoint in the extended order, or `None` when the shard was never checkpointed.
    ///
    /// # Errors
    ///
    /// A stored checkpoint that is neither a sequence number nor [`SHARD_END`]: the row was
    /// written by something else, and guessing would skip or replay records.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseState, Position, SHARD_END};
    /// let mut state = LeaseState::default();
    /// assert_eq!(state.position()?, None);
    /// state.checkpoint = Some(SHARD_END.to_owned());
    /// assert_eq!(state.position()?, Some(Position::ShardEnd));
    /// # Ok::<(), kinesis_checkpoint::SequenceError>(())
    /// ```
    pub fn position(&self) -> Result<Option<Position>, SequenceError> {
        Ok(self.partial_aggregate()?.or(self.whole()?))
    }
}

/// A record that failed and will be delivered again, as the shard's row remembers it: the
/// attempts survive invocations and cold starts, so a record that keeps failing can be moved
/// to the dead-letter sink after a set number of them.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::{FailingRecord, Position};
///
/// let position = Position::record("42".parse()?);
/// let first = FailingRecord::first(&position, "timeout", 1_700_000_000_000);
/// let second = first.again(&position, "timeout", 1_700_000_060_000);
/// assert_eq!(second.attempts, 2);
/// assert_eq!(second.first_failure, 1_700_000_000_000);
/// # Ok::<(), kinesis_checkpoint::SequenceError>(())
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
    /// # use kinesis_checkpoint::{FailingRecord, Position};
    /// let failing = FailingRecord::first(&Position::sub_record("9".parse()?, 2), "boom", 5);
    /// assert_eq!((failing.attempts, failing.sub_sequence), (1, Some(2)));
    /// # Ok::<(), kinesis_checkpoint::SequenceError>(())
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
    /// # use kinesis_checkpoint::{FailingRecord, Position};
    /// let position = Position::record("9".parse()?);
    /// assert!(FailingRecord::first(&position, "boom", 5).is(&position));
    /// assert!(!FailingRecord::first(&position, "boom", 5).is(&Position::record("10".parse()?)));
    /// # Ok::<(), kinesis_checkpoint::SequenceError>(())
    /// ```
    #[must_use]
    pub fn is(&self, position: &Position) -> bool {
        self.sequence == position.checkpoint() && self.sub_sequence == position.sub_sequence()
    }

    /// One more failure of the record at `position`: counted on when it is this record, the
    /// first failure of a new one otherwise.
    ///
    /// ```
    /// # use kinesis_checkpoint::{FailingRecord, Position};
    /// let nine = Position::record("9".parse()?);
    /// let ten = Position::record("10".parse()?);
    /// let failing = FailingRecord::first(&nine, "boom", 5);
    /// assert_eq!(failing.again(&nine, "boom", 6).attempts, 2);
    /// assert_eq!(failing.again(&ten, "boom", 6).attempts, 1);
    /// # Ok::<(), kinesis_checkpoint::SequenceError>(())
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

/// What the last write of an invocation does to the row's [`FailingRecord`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FailingChange {
    /// Leave it as it is.
    #[default]
    Keep,
    /// Remember this failure.
    Set(FailingRecord),
    /// Forget it: the record succeeded or was dead-lettered.
    Clear,
}

/// What the last write of an invocation does to the row's [`reported`](LeaseState::reported)
/// record, the one a later batch is checked against for records the mapping skipped.
///
/// ```
/// use kinesis_checkpoint::{Commit, Position, ReportedChange};
///
/// let mut commit = Commit::default();
/// assert_eq!(commit.reported, ReportedChange::Keep);
/// commit.reported = ReportedChange::Set(Position::record("42".parse()?));
/// # Ok::<(), kinesis_checkpoint::SequenceError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReportedChange {
    /// Leave it as it is.
    #[default]
    Keep,
    /// This record was reported (or is the first of a skipped range still to recover).
    Set(Position),
    /// Nothing is outstanding: the whole batch was done.
    Clear,
}

/// The last write of an invocation: progress to record, and the failing record to remember.
///
/// ```
/// use kinesis_checkpoint::{Commit, FailingChange, Position};
///
/// let mut commit = Commit::default();
/// commit.checkpoint = Some(Position::record("42".parse()?));
/// commit.failing = FailingChange::Clear;
/// assert!(commit.parent_shards.is_empty());
/// # Ok::<(), kinesis_checkpoint::SequenceError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Commit {
    /// The new checkpoint, when it moved: a whole record (an aggregate whose last sub-record
    /// is done is written whole), [`Position::ShardEnd`], or a position inside an aggregate.
    pub checkpoint: Option<Position>,
    /// When `checkpoint` lies inside an aggregate: the record the row's `checkpoint` attribute
    /// names below it.
    pub below: Below,
    /// The change to the failing record.
    pub failing: FailingChange,
    /// The shard's parents, when they were just learnt from the stream (empty: leave as is).
    pub parent_shards: Vec<String>,
    /// The records done above the new checkpoint, when they changed (`Some` of an empty list
    /// forgets them all; `None` leaves them as they are).
    pub done_above: Option<Vec<Position>>,
    /// The change to the record reported to Lambda (see [`LeaseState::reported`]).
    pub reported: ReportedChange,
}

/// [`LeaseStore::checkpoint_and_release`] for a store whose [`commit`](LeaseStore::commit)
/// writes everything in one request: the same write, keeping the failing record as it is.
pub(crate) fn checkpoint_and_release_by_commit<'a, S: LeaseStore + ?Sized>(
    store: &'a S,
    key: &'a LeaseKey,
    owner: &'a str,
    position: Option<&'a Position>,
) -> BoxFuture<'a, Result<bool, LeaseError>> {
    let commit = Commit {
        checkpoint: position.cloned(),
        ..Commit::default()
    };
    Box::pin(async move { store.commit(key, owner, &commit).await })
}

/// The write of one partition key's row in the partition-key mode (see
/// [`partition_key`](crate::partition_key)): applied only if nobody wrote the row since it was
/// read, that is if its `lease_counter` is still `expected_counter`.
///
/// ```
/// use kinesis_checkpoint::partition_key::row_key;
/// use kinesis_checkpoint::{KeyCommit, LeaseKey, Position};
///
/// let shard = LeaseKey::new("orders", "shardId-000000000000");
/// let mut commit = KeyCommit::new(row_key(&shard, "customer-7"), 0);
/// commit.checkpoint = Some(Position::record("42".parse()?));
/// assert_eq!(commit.row.to_string(), "orders:shardId-000000000000:customer-7");
/// # Ok::<(), kinesis_checkpoint::SequenceError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyCommit {
    /// The partition key's row.
    pub row: LeaseKey,
    /// The row's `lease_counter` when it was read (0 for a row that did not exist).
    pub expected_counter: u64,
    /// The key's new checkpoint, when it moved.
    pub checkpoint: Option<Position>,
    /// When `checkpoint` lies inside an aggregate: the record the row's `checkpoint` attribute
    /// names below it.
    pub below: Below,
    /// The change to the key's failing record.
    pub failing: FailingChange,
    /// When `DynamoDB` may delete the row (epoch seconds).
    pub expires_at: Option<u64>,
}

impl KeyCommit {
    /// A write of `row` that changes nothing yet, expecting the counter read.
    ///
    /// ```
    /// # use kinesis_checkpoint::{KeyCommit, LeaseKey};
    /// let commit = KeyCommit::new(LeaseKey::new("orders", "shardId-000000000000:k"), 3);
    /// assert_eq!(commit.expected_counter, 3);
    /// ```
    #[must_use]
    pub fn new(row: LeaseKey, expected_counter: u64) -> Self {
        Self {
            row,
            expected_counter,
            checkpoint: None,
            below: Below::Keep,
            failing: FailingChange::Keep,
            expires_at: None,
        }
    }
}

/// What [`LeaseStore::acquire_and_read`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The lease is ours; the row as it stands after taking it.
    Acquired(LeaseState),
    /// Another live owner holds the lease; the row as it stands, naming that owner when the
    /// store knows it.
    Held(LeaseState),
}

/// Durable coordination for shard leases and checkpoints.
///
/// The contract is the seed crate's, after the vendor's consumer library: `acquire` takes a
/// shard for an owner (stealing an expired lease), `renew` heartbeats it, and `checkpoint`
/// records progress on condition of still holding the lease. A `false` from `renew` or
/// `checkpoint` means the owner has been fenced and must stop processing at once. Every call
/// names the shard by its [`LeaseKey`].
///
/// The provided methods are the toolkit's extensions. Their defaults are built on the five
/// required ones, so any store works; a store that can do a combination in one request should
/// override them.
///
/// A store of the five methods only keeps no `reported` and no `contended` mark: with a mapping
/// that gives up on records (a finite `MaximumRetryAttempts` or `MaximumRecordAgeInSeconds`), a
/// batch it discards goes unnoticed and its records are lost. Gap recovery needs `commit`,
/// `acquire_and_read` and `mark_contended` implemented (as `MemoryLeaseStore` and
/// `DynamoLeaseStore` do).
///
/// # Examples
///
/// A store needs only the five methods; the processor calls the extensions.
///
/// ```
/// use std::time::Duration;
///
/// use kinesis_checkpoint::{Claim, LeaseKey, LeaseStore, MemoryLeaseStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_checkpoint::LeaseError> {
/// let store = MemoryLeaseStore::new();
/// let key = LeaseKey::new("orders", "shardId-000000000000");
/// let Claim::Acquired(state) = store.acquire_and_read(&key, "me", Duration::from_secs(30), None).await?
/// else {
///     panic!("nobody else holds it");
/// };
/// assert_eq!(state.checkpoint, None);
/// assert!(store.checkpoint(&key, "me", "17").await?);
/// store.release(&key, "me").await?;
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

    /// Takes the lease and reads the row: the first step of every invocation.
    ///
    /// `attempting` is the first record the invocation is about to run. A store that keeps
    /// [`reported`](LeaseState::reported) marks it there in the same write unless the row names
    /// a reported record already, so that a batch the invocation dies on (out of memory, killed
    /// at its timeout), and that the mapping then gives up on, is found as a gap by the next
    /// batch; the row returned is the one after that write.
    ///
    /// The default calls [`acquire`](Self::acquire) then [`read`](Self::read), two requests, and
    /// cannot mark `attempting`: with such a store a batch the mapping discards after an
    /// invocation died on it goes unnoticed. A store that can return the row from the acquiring
    /// write should do it in one.
    fn acquire_and_read<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        let _ = attempting;
        Box::pin(async move {
            let acquired = self.acquire(key, owner, ttl).await?;
            let state = self.read(key).await?;
            Ok(if acquired {
                Claim::Acquired(state)
            } else {
                Claim::Held(state)
            })
        })
    }

    /// Records `position` (a sequence number, possibly inside a KPL aggregate, or
    /// [`Position::ShardEnd`]) as the checkpoint, on condition that `owner` holds the lease.
    /// Returns `false` when fenced.
    ///
    /// A position inside an aggregate records the progress inside it beside `checkpoint`
    /// (`aggregate_sequence`, `aggregate_sub`), leaving `checkpoint` itself as it is: the caller
    /// writes the record done whole before the aggregate first, as the default
    /// [`commit`](Self::commit) does.
    ///
    /// The default can store only what [`checkpoint`](Self::checkpoint) can: a whole record or
    /// the shard's end. A position inside an aggregate is then not written (the default only
    /// checks, by a renew, that the lease is still held), so the sub-records done so far run
    /// again after a redelivery: a duplicate, never a loss. Once the aggregate's last
    /// sub-record is done, the engine checkpoints the aggregate whole, which the default
    /// writes. Stores that keep the aggregate's progress override this.
    fn checkpoint_position<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: &'a Position,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        match position.sub_sequence() {
            None => self.checkpoint(key, owner, position.checkpoint()),
            Some(_) => self.renew(key, owner, Duration::ZERO),
        }
    }

    /// Records `position`, when there is progress to record, and releases the lease: the last
    /// step of every invocation. Returns `false` when fenced, in which case nothing was written.
    ///
    /// The default calls [`checkpoint_position`](Self::checkpoint_position) then
    /// [`release`](Self::release); a store with conditional writes should do both in one.
    fn checkpoint_and_release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            if let Some(position) = position
                && !self.checkpoint_position(key, owner, position).await?
            {
                return Ok(false);
            }
            self.release(key, owner).await?;
            Ok(true)
        })
    }

    /// Writes `commit` and releases the lease, in one conditional write where the store can:
    /// the last step of every invocation. Returns `false` when fenced, in which case nothing
    /// was written.
    ///
    /// The default writes, for a position inside an aggregate, the record done whole before it
    /// ([`Below::Record`]) first, through [`checkpoint_position`](Self::checkpoint_position),
    /// then calls [`checkpoint_and_release`](Self::checkpoint_and_release); if the lease is
    /// lost between the two, the first (true) progress stays written. It keeps no failing
    /// record, so attempts are counted within one invocation only: a record is dead-lettered
    /// when it is rejected, and one that keeps asking for a retry is retried until the mapping
    /// gives up on it, as it would be without this toolkit. Nor does it keep the records done
    /// above the checkpoint (`done_above`) or the shard's parents: a redelivery runs those
    /// records again (a duplicate, never a loss), and the gate asks the topology for the parents
    /// again. Stores that keep `failing` and `done_above` override this.
    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            if let (Some(position), Below::Record(prior)) = (&commit.checkpoint, &commit.below)
                && position.sub_sequence().is_some()
                && !self
                    .checkpoint_position(key, owner, &Position::record(prior.clone()))
                    .await?
            {
                return Ok(false);
            }
            self.checkpoint_and_release(key, owner, commit.checkpoint.as_ref())
                .await
        })
    }

    /// Marks a shard finished (`SHARD_END`) that the parent gate proved exhausted, unless its
    /// checkpoint is no longer `expected` (someone moved it meanwhile) or the row records
    /// something not done at it: a partial aggregate or a failing record above the checkpoint
    /// ([`LeaseState::unfinished`]). `expires_at` (epoch seconds) lets `DynamoDB` delete the
    /// row after the stream's retention. Returns whether it was written.
    ///
    /// The default takes the shard's lease for a moment, checks the row, writes `SHARD_END` and
    /// releases; it cannot keep `expires_at`.
    fn finish<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        const GATE: &str = "kinesis-checkpoint:gate";
        let _ = expires_at;
        Box::pin(async move {
            if !self.acquire(key, GATE, Duration::from_secs(10)).await? {
                return Ok(false);
            }
            let row = self.read(key).await?;
            let unchanged = row.checkpoint.as_deref() == expected && row.unfinished().is_none();
            let written = unchanged && self.checkpoint(key, GATE, SHARD_END).await?;
            self.release(key, GATE).await?;
            Ok(written)
        })
    }

    /// Reads many rows at once, in the order of `keys`: the partition-key mode reads every
    /// partition key of a batch this way.
    ///
    /// The default reads them one by one; the `DynamoDB` store reads 100 per request.
    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>> {
        Box::pin(async move {
            let mut states = Vec::with_capacity(keys.len());
            for key in keys {
                states.push(self.read(key).await?);
            }
            Ok(states)
        })
    }

    /// Writes many partition keys' rows, each only if its counter is still the one read;
    /// returns, in order, whether each was written (`false`: another invocation wrote it).
    ///
    /// The default writes one row at a time through [`acquire`](Self::acquire),
    /// [`checkpoint_position`](Self::checkpoint_position) and [`release`](Self::release): it
    /// cannot compare counters nor keep the failing record, so it does not detect a concurrent
    /// delivery of the same key. The `DynamoDB` store writes 100 rows per
    /// `TransactWriteItems`, each on condition of its counter.
    fn commit_rows<'a>(
        &'a self,
        commits: &'a [KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>> {
        const WRITER: &str = "kinesis-checkpoint:partition-key";
        Box::pin(async move {
            let mut written = Vec::with_capacity(commits.len());
            for commit in commits {
                if !self
                    .acquire(&commit.row, WRITER, Duration::from_secs(10))
                    .await?
                {
                    written.push(false);
                    continue;
                }
                let mut ok = true;
                if let (Some(position), Below::Record(prior)) = (&commit.checkpoint, &commit.below)
                    && position.sub_sequence().is_some()
                {
                    ok = self
                        .checkpoint_position(&commit.row, WRITER, &Position::record(prior.clone()))
                        .await?;
                }
                if let Some(position) = &commit.checkpoint
                    && ok
                {
                    ok = self
                        .checkpoint_position(&commit.row, WRITER, position)
                        .await?;
                }
                self.release(&commit.row, WRITER).await?;
                written.push(ok);
            }
            Ok(written)
        })
    }
    /// How many requests this store has sent to its backend since it was made, or `None` when
    /// it does not count them (the default). The processor's
    /// [metrics](crate::Processor::metrics) report the difference over an invocation, so the
    /// figure is what the backend billed, not an estimate.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseStore, MemoryLeaseStore};
    /// assert_eq!(MemoryLeaseStore::new().requests(), None, "memory is not a backend");
    /// ```
    fn requests(&self) -> Option<u64> {
        None
    }

    /// Remembers `first`, the first record of a batch turned away because another owner holds
    /// the lease, in the row's [`contended`](LeaseState::contended), without the lease: the
    /// owner may be an invocation whose release did not land, and the mapping may give up on
    /// the batch before the lease lapses.
    ///
    /// The default remembers nothing (a store of the seed's five methods has nowhere to keep
    /// it): with such a store a batch the mapping discards while the lease lingers goes
    /// unnoticed.
    fn mark_contended<'a>(
        &'a self,
        key: &'a LeaseKey,
        first: &'a Position,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        let _ = (key, first);
        Box::pin(async { Ok(()) })
    }
    // A new provided method must be forwarded by `metrics::Metered` too, or a processor with
    // metrics on would run its default instead of the wrapped store's own.
}
