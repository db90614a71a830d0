//! [`CheckpointStore`]: the interface the engine talks to, every method required.
//!
//! An invocation claims a shard and reads its row in one step, renews the lease while it works,
//! and ends with one write that records the checkpoint, the failing record, the records done
//! above the checkpoint, the shard's parents and the reported record, and releases the lease.
//! The gate marks exhausted parents finished; the partition-key mode reads and writes many rows
//! at once. Those are this trait's methods, and it has no provided one: a store (or a wrapper)
//! that does not write a field cannot compile by leaving a method out, it has to say so in its
//! own body. The one store that legitimately cannot keep the toolkit's fields, a store of the
//! seed crate's five methods, is adapted once, by [`SeedStore`](crate::store::SeedStore).

use std::time::Duration;

use super::lease::{BoxFuture, FailingRecord, LeaseError, LeaseState};
use super::row::Below;
use crate::key::LeaseKey;
use crate::sequence::Position;

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
/// use kinesis_checkpoint::Position;
/// use kinesis_checkpoint::internal::{Commit, ReportedChange};
///
/// let mut commit = Commit::default();
/// assert_eq!(commit.reported, ReportedChange::Keep);
/// commit.reported = ReportedChange::Set(Position::record("42".parse()?));
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
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
/// use kinesis_checkpoint::Position;
/// use kinesis_checkpoint::internal::{Commit, FailingChange};
///
/// let mut commit = Commit::default();
/// commit.checkpoint = Some(Position::record("42".parse()?));
/// commit.failing = FailingChange::Clear;
/// assert!(commit.parent_shards.is_empty());
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// The stream says the shard has no parents, just learnt: the row records it
    /// ([`LeaseState::parentless`]). Ignored when `parent_shards` lists any.
    pub parentless: bool,
    /// The records done above the new checkpoint, when they changed (`Some` of an empty list
    /// forgets them all; `None` leaves them as they are).
    pub done_above: Option<Vec<Position>>,
    /// The change to the record reported to Lambda (see [`LeaseState::reported`]).
    pub reported: ReportedChange,
    /// Keep the lease: a mark written while the batch runs. By default the write releases it,
    /// as the invocation's last write does.
    pub keep_lease: bool,
}

impl Commit {
    /// The commit with the parents the gate just learnt from the stream (`None`: it learnt
    /// nothing, the row keeps what it records): listed in `parent_shards`, or, when there are
    /// none, recorded as [`parentless`](Commit::parentless).
    pub(crate) fn learnt_parents(mut self, learnt: Option<Vec<String>>) -> Self {
        if let Some(parents) = learnt {
            self.parentless = parents.is_empty();
            self.parent_shards = parents;
        }
        self
    }
}

/// The write of one partition key's row in the partition-key mode (see
/// [`partition_key`](crate::PartitionKeyMode)): applied only if nobody wrote the row since it was
/// read, that is if its `lease_counter` is still `expected_counter`.
///
/// ```
/// use kinesis_checkpoint::internal::row_key;
/// use kinesis_checkpoint::{LeaseKey, Position};
/// use kinesis_checkpoint::internal::KeyCommit;
///
/// let shard = LeaseKey::new("orders", "shardId-000000000000");
/// let mut commit = KeyCommit::new(row_key(&shard, "customer-7"), 0);
/// commit.checkpoint = Some(Position::record("42".parse()?));
/// assert_eq!(commit.row.to_string(), "orders:shardId-000000000000:customer-7");
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// # use kinesis_checkpoint::LeaseKey;
    /// # use kinesis_checkpoint::internal::KeyCommit;
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

/// One transaction of [`CheckpointStore::transact`]: records' writes and the lease row's
/// update, committed together or not at all.
///
/// ```
/// use kinesis_checkpoint::Position;
/// use kinesis_checkpoint::internal::{Commit, Transaction};
///
/// let mut commit = Commit::default();
/// commit.checkpoint = Some(Position::record("42".parse()?));
/// commit.keep_lease = true;
/// let transaction = Transaction::new(commit, Vec::new(), "kc-token".to_owned());
/// assert!(transaction.commit.keep_lease && transaction.writes.is_empty());
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[cfg(feature = "dynamodb")]
#[derive(Debug, Clone)]
pub struct Transaction {
    /// What the lease row's action writes, every field as [`CheckpointStore::commit`] writes
    /// it: for a chunk before the last, the checkpoint at its last record and the lease kept;
    /// for the last, all the invocation's last write carries.
    pub commit: Commit,
    /// The records' writes, in order; [`Transacted::Refused`] names one by its index here.
    pub writes: Vec<crate::effects::Write>,
    /// The `ClientRequestToken`: the same for a retry of this transaction, so that it applies
    /// once.
    pub token: String,
}

#[cfg(feature = "dynamodb")]
impl Transaction {
    /// A transaction of `writes` and `commit` (which says whether the lease is kept).
    #[must_use]
    pub const fn new(commit: Commit, writes: Vec<crate::effects::Write>, token: String) -> Self {
        Self {
            commit,
            writes,
            token,
        }
    }
}

/// What became of a [`Transaction`].
#[cfg(feature = "dynamodb")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transacted {
    /// Everything landed.
    Committed,
    /// The lease is no longer ours: nothing landed.
    Fenced,
    /// The write at `action` (an index of [`Transaction::writes`]) was refused by its own
    /// condition: nothing landed.
    Refused {
        /// The write's index.
        action: usize,
        /// What the store said (`ConditionalCheckFailed`).
        reason: String,
    },
}

/// One transaction of [`CheckpointStore::transact_rows`], the partition-key mode's: records'
/// writes and the rows of the partition keys they advance, committed together or not at all.
///
/// Each row's update is a [`KeyCommit`], conditioned on its counter as
/// [`commit_rows`](CheckpointStore::commit_rows) conditions it: the checkpoint action of the
/// transaction, which fences a concurrent delivery of the same key.
///
/// ```
/// use kinesis_checkpoint::internal::{KeyCommit, RowsTransaction};
/// use kinesis_checkpoint::LeaseKey;
///
/// let row = KeyCommit::new(LeaseKey::new("orders", "shardId-000000000000:customer-7"), 3);
/// let transaction = RowsTransaction::new(vec![row], Vec::new(), "kc-token".to_owned());
/// assert_eq!(transaction.rows[0].expected_counter, 3);
/// ```
#[cfg(feature = "dynamodb")]
#[derive(Debug, Clone)]
pub struct RowsTransaction {
    /// The keys' rows, each written only if its counter is still the one expected;
    /// [`RowsTransacted::Fenced`] names them by their index here.
    pub rows: Vec<KeyCommit>,
    /// The records' writes, in order; [`RowsTransacted::Refused`] names one by its index here.
    pub writes: Vec<crate::effects::Write>,
    /// The `ClientRequestToken`: the same for a retry of this transaction, so that it applies
    /// once.
    pub token: String,
}

#[cfg(feature = "dynamodb")]
impl RowsTransaction {
    /// A transaction of `writes` and the keys' `rows`.
    #[must_use]
    pub const fn new(
        rows: Vec<KeyCommit>,
        writes: Vec<crate::effects::Write>,
        token: String,
    ) -> Self {
        Self {
            rows,
            writes,
            token,
        }
    }
}

/// What became of a [`RowsTransaction`].
#[cfg(feature = "dynamodb")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowsTransacted {
    /// Everything landed.
    Committed,
    /// These rows (indices of [`RowsTransaction::rows`]) were written by someone else since
    /// they were read: nothing landed.
    Fenced(Vec<usize>),
    /// The write at `action` (an index of [`RowsTransaction::writes`]) was refused by its own
    /// condition, and no row was fenced: nothing landed.
    Refused {
        /// The write's index.
        action: usize,
        /// What the store said (`ConditionalCheckFailed`).
        reason: String,
    },
}

/// What [`CheckpointStore::acquire_and_read`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The lease is ours.
    Acquired {
        /// The row as it stands after taking it.
        state: LeaseState,
        /// The row's mark ([`reported`](LeaseState::reported)) as an owner whose lease had
        /// lapsed without a release left it: the batch, or the record, an invocation was
        /// running when it died. `None` when the lease was free or ours, or no mark was left.
        lapsed_mark: Option<Position>,
    },
    /// Another live owner holds the lease; the row as it stands, naming that owner when the
    /// store knows it.
    Held(LeaseState),
}

/// Durable leases and checkpoints, as the engine uses them; sealed.
///
/// Processors take an `Arc<dyn CheckpointStore>`: a
/// [`DynamoLeaseStore`](crate::store::dynamo::DynamoLeaseStore), a
/// [`MemoryLeaseStore`](crate::MemoryLeaseStore), or a store of the seed crate's five methods
/// through [`SeedStore::new`](crate::store::SeedStore::new). Its methods carry the engine's
/// row forms, which change with the engine, so no other type implements it.
///
/// The contract, for every implementation:
///
/// - a write conditional on the lease (`renew`, `commit`) returns `Ok(false)` when `owner` no
///   longer holds it (fenced), and then writes nothing;
/// - every field a write carries reaches the row, or the store says in its documentation which
///   it cannot keep (see [`SeedStore`](crate::store::SeedStore));
/// - `Err` is for the store failing (throttling, the network), never for a refused condition.
///
/// ```
/// use std::sync::Arc;
///
/// use kinesis_checkpoint::store::CheckpointStore;
/// use kinesis_checkpoint::MemoryLeaseStore;
///
/// let store: Arc<dyn CheckpointStore> = Arc::new(MemoryLeaseStore::new());
/// ```
pub trait CheckpointStore: super::sealed::Sealed + Send + Sync + 'static {
    /// Takes the lease for `owner`, valid for `ttl`, and reads the row: the first step of every
    /// invocation.
    ///
    /// `attempting` is the first record the invocation is about to run: the store marks it in
    /// [`reported`](LeaseState::reported) in the same write unless the row names a reported
    /// record already, so that a batch the invocation dies on (out of memory, killed at its
    /// timeout), and that the mapping then gives up on, is found as a gap by the next batch.
    /// The row returned is the one after that write; when another live owner holds the lease,
    /// [`Claim::Held`] with the row as it stands.
    fn acquire_and_read<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>>;

    /// Heartbeats the lease for another `ttl`. Returns `false` when the lease is no longer held
    /// (fenced): the owner must stop at once.
    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>>;

    /// Writes `commit` and releases the lease, in one conditional write: the last step of every
    /// invocation. Returns `false` when fenced, in which case nothing was written.
    ///
    /// Every field of [`Commit`] is applied: the checkpoint (a position inside an aggregate
    /// beside the record [`Below`] names), the failing record, the parents when not empty,
    /// `done_above` when `Some`, and the reported record.
    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>>;

    /// Marks a shard finished (`SHARD_END`) that the parent gate proved exhausted, unless its
    /// checkpoint is no longer `expected` (someone moved it meanwhile) or the row records
    /// something not done at it: a partial aggregate or a failing record above the checkpoint
    /// ([`LeaseState::unfinished`]). `expires_at` (epoch seconds) lets `DynamoDB` delete the
    /// row after the stream's retention. Returns whether it was written.
    fn finish<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>>;

    /// Reads the row, whoever owns it; an absent row is the default state.
    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>>;

    /// Reads many rows at once, in the order of `keys`: the partition-key mode reads every
    /// partition key of a batch this way.
    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>>;

    /// Writes many partition keys' rows, each only if its counter is still
    /// [`expected_counter`](KeyCommit::expected_counter); returns, in order, whether each was
    /// written (`false`: another invocation wrote it).
    fn commit_rows<'a>(
        &'a self,
        commits: &'a [KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>>;

    /// Commits `transaction` in one step: its writes, and its [`Commit`] on the lease row on
    /// condition that `owner` holds the lease (releasing it unless the commit keeps it), all
    /// or nothing. A retry with the same
    /// [`token`](Transaction::token) must not apply the writes twice.
    ///
    /// `Ok(Fenced)` and `Ok(Refused)` wrote nothing; `Err` is for the store failing, or for a
    /// store that cannot commit writes with the checkpoint at all (it says so in its error).
    #[cfg(feature = "dynamodb")]
    fn transact<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        transaction: &'a Transaction,
    ) -> BoxFuture<'a, Result<Transacted, LeaseError>>;

    /// Commits `transaction` in one step, the partition-key mode's: its writes and its keys'
    /// rows, each row on condition of its counter, all or nothing. A retry with the same
    /// [`token`](RowsTransaction::token) must not apply the writes twice.
    ///
    /// `Ok(Fenced)` (a row someone else wrote; it wins over a refused write) and `Ok(Refused)`
    /// wrote nothing; `Err` is for the store failing, or for a store that cannot commit writes
    /// with the rows at all (it says so in its error).
    #[cfg(feature = "dynamodb")]
    fn transact_rows<'a>(
        &'a self,
        transaction: &'a RowsTransaction,
    ) -> BoxFuture<'a, Result<RowsTransacted, LeaseError>>;

    /// How many requests this store has sent to its backend since it was made, or `None` when
    /// it does not count them. The processor's [metrics](crate::Processor::metrics) report the
    /// difference over an invocation, so the figure is what the backend billed, not an
    /// estimate.
    fn requests(&self) -> Option<u64>;
}

/// [`CheckpointStore::commit`], written again once after a failure (a throttle refuses one
/// request). The last write of an invocation also releases the lease: one that fails leaves
/// the lease taken for its whole TTL, and every delivery of the shard meanwhile (a held child's
/// too, running a closed parent's tail in parts) is turned away and moves nothing. A first write
/// that landed with its answer lost makes the second one refused (`Ok(false)`), as a fenced one
/// is: nothing is written twice, and the caller treats it as a write that did not land, which
/// it already had to for the error.
pub(crate) async fn commit_again_once(
    store: &dyn CheckpointStore,
    key: &LeaseKey,
    owner: &str,
    commit: &Commit,
) -> Result<bool, LeaseError> {
    match store.commit(key, owner, commit).await {
        Err(error) => {
            tracing::warn!(%error, stream = key.stream(), shard = key.shard(), "could not write the lease row; writing it again");
            store.commit(key, owner, commit).await
        }
        answer => answer,
    }
}
