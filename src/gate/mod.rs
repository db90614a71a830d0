//! The parent gate: a child shard waits until its parents are finished.
//!
//! After a split or a merge, records of one partition key continue in a child shard. Kinesis
//! keeps per-key order only if every record of the parent is processed before any record of the
//! child, and AWS does not document that Lambda's event source mapping waits. So before a batch
//! of a shard runs, [`Gate`] checks each parent: its row says `SHARD_END`; or it is provably
//! exhausted (closed, its row records nothing left undone at its checkpoint, no partial KPL
//! aggregate and no failing record, and reading after its checkpoint finds no record and the
//! end of the shard), in which case the gate writes `SHARD_END` on it (on the same condition);
//! or it has expired from the stream.
//!
//! A parent without a row is ambiguous in Lambda, where a row appears only when a batch
//! arrives. A parent that holds no record at all is finished. Otherwise the child waits when the
//! mapping starts at `TRIM_HORIZON` (the parent's records will come) and passes when it starts at
//! `LATEST` or `AT_TIMESTAMP` (they may never come).
//!
//! The topology (which shards exist, their parents, whether they are closed) comes from a
//! [`Topology`]: [`KinesisTopology`] asks Kinesis (`ListShards`, `GetShardIterator`,
//! `GetRecords`, `DescribeStreamSummary`). It is cached for the life of the process and asked
//! again when a batch comes from a shard the cache does not know; a shard's parents are also
//! written to its row (or, for a shard without any, that it has none: `parentless`), so later
//! cold starts need no Kinesis call for it: an original shard's batch then costs the stream
//! nothing at all. Finished shards are remembered for the life of the process: a finished shard
//! stays finished.
//!
//! # Parent tail recovery
//!
//! With a finite `MaximumRetryAttempts` (or a record age), the mapping may give up on the last
//! batch of a closed parent. It never delivers that parent again, so nothing would ever move its
//! checkpoint to the shard's end, and its children would be held for ever (and discarded in
//! turn). So when a closed parent that is not finished holds a child, and the parent's row
//! proves trouble (a `reported` record, or a `contended` mark not known done, above its
//! checkpoint or passed by another writer: the batch the mapping may have given up on), the
//! child's invocation recovers the parent's tail itself:
//! it claims the parent's lease (another live owner: the child stays held, as before), reads the
//! parent's records after its checkpoint (from inside a partial aggregate, by the row's
//! aggregate progress) to the shard's end through [`Topology::read_range`], the reading gap
//! recovery uses, within the same `ReadBudget` and half the invocation's time left, runs them as
//! a batch of the parent (dedupe, attempts, dead letters, checkpoint), and asks the gate again,
//! which finds the parent exhausted and marks it `SHARD_END`. A tail not read or not run to its
//! end in this invocation leaves the parent's progress committed, a `contended` mark at the
//! first record not run, and the child held (reported, so Lambda retries it).
//!
//! Always safe: it runs under the parent's lease and checkpoint, so a later delivery of the
//! parent by the mapping finds those records done. It is not done for every held child: a child
//! delivered before its parents (the mapping is still working through the parent, its row shows
//! no trouble) would then read Kinesis in its own invocation and race the mapping for the
//! parent's records, for nothing. The invariant scenarios (`tests/invariants.rs`) pass either
//! way; in their first 500, children's invocations ran 534 records of parents' tails under this
//! rule, and 909 when every held child of a closed parent with a free lease recovered its tail:
//! the extra ones were read from Kinesis in a child's invocation while the mapping still meant
//! to deliver them. One exception: with a record age ([`Gate::maximum_record_age`]) under
//! `TRIM_HORIZON`, the mapping drops a parent's records older than the limit without a
//! delivery, which leaves no mark (a parent never read: no row at all); a held child then reads
//! the parent's tail (from its start, never read) and runs only the records already older than
//! the limit, which the mapping will never deliver. Every way the mapping can give up on a batch leaves a mark first (a failed or held batch reports; a claim marks its batch, so one the invocation died
//! on counts; a batch turned away or refused is marked `contended`), except those the gap
//! recovery does not cover either (see [`gap`](crate::gap)).
//!
//! The partition-key mode has its own rule (`by_key`): no shard row there proves trouble, and no
//! lease fences a parent key's lane, so a closed parent's tail is run by a held child only once
//! no invocation of the parent can run any of it, which only a record age
//! ([`Gate::maximum_record_age`]) bounds: the parent's youngest record older than the limit
//! plus the longest batching window (5 minutes) and the longest invocation (15 minutes). With
//! retries finite and no record age, such a tail holds its children until the parent expires.
//!
//! The files: `topology` (what the gate asks of the stream), `lineage` (what both rules know
//! and settle), `by_shard` (the shard mode's rule), `by_key` (the partition-key mode's),
//! `parent_scan` (what the latter learnt of a closed parent), `kinesis` and `kinesis_range`
//! ([`KinesisTopology`]).

mod by_key;
mod by_shard;
#[cfg(feature = "kinesis")]
mod kinesis;
#[cfg(feature = "kinesis")]
mod kinesis_range;
mod lineage;
mod parent_end;
mod parent_scan;
mod topology;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use self::by_key::Scans;
pub(crate) use self::by_key::{KeyTail, KeyVerdict};
pub(crate) use self::by_shard::Verdict;
#[cfg(feature = "kinesis")]
pub use self::kinesis::KinesisTopology;
use self::lineage::Lineage;
pub use self::topology::{
    ShardInfo, StartingPosition, Topology, TopologyError, UnknownStartingPosition,
};
use crate::key::LeaseKey;
pub use crate::report::Held;
use crate::store::{CheckpointStore, LeaseState};

/// Lambda's longest invocation: 15 minutes.
const LONGEST_INVOCATION: Duration = Duration::from_mins(15);

/// An event source mapping's longest batching window (`MaximumBatchingWindowInSeconds`): 5
/// minutes.
const LONGEST_WINDOW: Duration = Duration::from_mins(5);

/// The parent gate: see the [module documentation](self).
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
///
/// use kinesis_checkpoint::gate::{Gate, KinesisTopology, StartingPosition};
/// use kinesis_checkpoint::{DynamoLeaseStore, Outcome, Processor, Record};
///
/// # async fn run() -> Result<(), lambda_runtime::Error> {
/// let config = aws_config::load_from_env().await;
/// let gate = Gate::new(Arc::new(KinesisTopology::new(&config)), StartingPosition::TrimHorizon);
/// let processor = Processor::new(
///     Arc::new(DynamoLeaseStore::new(&config, "orders-leases")),
///     |_: Record| async { Outcome::ack() },
/// )
/// .gate(gate);
/// # Ok(())
/// # }
/// ```
pub struct Gate {
    lineage: Lineage,
    scans: Scans,
    /// The mapping's `MaximumRecordAgeInSeconds`, when it has one.
    maximum_record_age: Option<Duration>,
    /// The mapping's `MaximumRetryAttempts`, when finite.
    maximum_retry_attempts: Option<u32>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("starting_position", &self.lineage.starting_position)
            .field("retention", &self.lineage.retention)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// A gate reading the topology from `topology`, for a mapping that starts at
    /// `starting_position`.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::gate::{Gate, StartingPosition, Topology};
    /// fn gate(topology: Arc<dyn Topology>) -> Gate {
    ///     Gate::new(topology, StartingPosition::Latest)
    /// }
    /// ```
    #[must_use]
    pub fn new(topology: Arc<dyn Topology>, starting_position: StartingPosition) -> Self {
        Self {
            lineage: Lineage::new(topology, starting_position),
            scans: Scans::default(),
            maximum_record_age: None,
            maximum_retry_attempts: None,
        }
    }

    /// The stream's retention, when it should not be read from the stream
    /// (`DescribeStreamSummary`): finished rows expire this long plus a day after they finish.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::gate::{Gate, StartingPosition, Topology};
    /// fn gate(topology: Arc<dyn Topology>) -> Gate {
    ///     Gate::new(topology, StartingPosition::TrimHorizon).retention(Duration::from_hours(7 * 24))
    /// }
    /// ```
    #[must_use]
    pub const fn retention(mut self, retention: Duration) -> Self {
        self.lineage.retention = Some(retention);
        self
    }

    /// The clock a finished parent's expiry (for `DynamoDB` TTL) is counted on (default
    /// [`SystemClock`](crate::clock::SystemClock)): a simulation gives the gate its processor's.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::gate::{Gate, StartingPosition, Topology};
    /// use kinesis_checkpoint::clock::SystemClock;
    ///
    /// fn gate(topology: Arc<dyn Topology>) -> Gate {
    ///     Gate::new(topology, StartingPosition::TrimHorizon).clock(Arc::new(SystemClock))
    /// }
    /// ```
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn crate::clock::Clock>) -> Self {
        self.lineage.clock = clock;
        self
    }

    /// The mapping's `MaximumRecordAgeInSeconds`, for gap recovery: a mapping drops records
    /// older than that without reporting them anywhere the row could see, so a batch whose
    /// first record is nearly that old (three quarters of it or more) may be the first after
    /// such a drop. When the row cannot prove a gap, the records between the checkpoint and
    /// the batch (from the shard's start, for a shard never checkpointed under a
    /// `TRIM_HORIZON` mapping) are read through the topology and run first; an empty read
    /// costs the requests and nothing else. Without it (the default, and Lambda's `-1`), only
    /// the gaps the row proves are read. In the partition-key mode it also bounds when no
    /// invocation of a closed parent can run any of its records (its youngest record older than
    /// the limit plus 20 minutes): a held child then runs the parent's tail the mapping gave up
    /// on (see [Parent tail recovery](self#parent-tail-recovery)).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::gate::{Gate, StartingPosition, Topology};
    /// fn gate(topology: Arc<dyn Topology>) -> Gate {
    ///     Gate::new(topology, StartingPosition::TrimHorizon)
    ///         .maximum_record_age(Duration::from_secs(3_600))
    /// }
    /// ```
    #[must_use]
    pub const fn maximum_record_age(mut self, age: Duration) -> Self {
        self.maximum_record_age = Some(age);
        self
    }

    /// The mapping's `MaximumRetryAttempts`, when finite: the mapping then gives up on a batch
    /// its invocations fail (or die on) that many times more. Only the partition-key mode uses
    /// it: before running a batch it marks the batch's keys at its first record
    /// ([`Processor::by_partition_key`](crate::Processor::by_partition_key): one more write per
    /// 100 keys), so that a batch every invocation dies on (out of memory, killed at its
    /// time-out) before writing anything is still found by the lane's next batch. The shard
    /// mode needs nothing: its claim remembers the batch. Without it (the default, and
    /// Lambda's `-1`) and without a [record age](Self::maximum_record_age), the mapping never
    /// gives up on a batch, and nothing is written early.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::gate::{Gate, StartingPosition, Topology};
    /// fn gate(topology: Arc<dyn Topology>) -> Gate {
    ///     Gate::new(topology, StartingPosition::TrimHorizon).maximum_retry_attempts(2)
    /// }
    /// ```
    #[must_use]
    pub const fn maximum_retry_attempts(mut self, attempts: u32) -> Self {
        self.maximum_retry_attempts = Some(attempts);
        self
    }

    /// Whether the mapping may give up on a batch: finite retry attempts, or a record age.
    pub(crate) const fn discards(&self) -> bool {
        self.maximum_retry_attempts.is_some() || self.maximum_record_age.is_some()
    }

    /// The mapping's record age limit, and whether a shard never checkpointed is read from
    /// its start (`TRIM_HORIZON`).
    pub(crate) fn record_age(&self) -> Option<(Duration, bool)> {
        self.maximum_record_age.map(|age| {
            let from_start = self.lineage.starting_position == StartingPosition::TrimHorizon;
            (age, from_start)
        })
    }

    /// Where the gate reads the stream: also what reads records the mapping skipped.
    pub(crate) fn topology(&self) -> &dyn Topology {
        self.lineage.topology.as_ref()
    }

    /// The range a held child's invocation reads of a closed parent whose row is `row`: after
    /// its checkpoint to its end (see [Parent tail recovery](self#parent-tail-recovery)).
    pub(crate) fn tail_range(&self, row: &LeaseState) -> Option<crate::gap::SkippedRange> {
        by_shard::tail_range(&self.lineage, row)
    }

    /// Whether the shard of `key`, whose row is `state`, may run now.
    pub(crate) async fn check(
        &self,
        store: &dyn CheckpointStore,
        key: &LeaseKey,
        state: &LeaseState,
    ) -> Verdict {
        let aged = self.record_age().is_some_and(|(_, from_start)| from_start);
        by_shard::check(&self.lineage, store, key, state, aged).await
    }

    /// Whether the shard of `key` may run now in the partition-key mode (see
    /// [`partition_key`](crate::PartitionKeyMode)), and the closed parent's tail its invocation
    /// may run, when no invocation of the parent can run any of it: only with a [record
    /// age](Self::maximum_record_age) (see `by_key`).
    pub(crate) async fn check_partition_keys(
        &self,
        store: &dyn CheckpointStore,
        key: &LeaseKey,
    ) -> KeyVerdict {
        let tails = self
            .maximum_record_age
            .map(|age| crate::store::memory::millis(age + LONGEST_INVOCATION + LONGEST_WINDOW));
        by_key::check(&self.lineage, &self.scans, store, key, tails).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::sequence::SHARD_END;
    use crate::store::BoxFuture;
    use crate::store::memory::MemoryLeaseStore;

    /// A stream split once: shard 0 (closed, exhausted) and its child 1. Counts the calls.
    #[derive(Default)]
    struct Split {
        listings: AtomicUsize,
        reads: AtomicUsize,
    }

    impl Topology for Split {
        fn shards<'a>(
            &'a self,
            _stream: &'a str,
        ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
            self.listings.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                Ok(vec![
                    ShardInfo::new("shardId-000000000000", Vec::<String>::new(), true),
                    ShardInfo::new("shardId-000000000001", ["shardId-000000000000"], false),
                ])
            })
        }

        fn exhausted<'a>(
            &'a self,
            _stream: &'a str,
            _shard: &'a str,
            _after: Option<&'a str>,
        ) -> BoxFuture<'a, Result<bool, TopologyError>> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(true) })
        }

        fn retention<'a>(
            &'a self,
            _stream: &'a str,
        ) -> BoxFuture<'a, Result<Duration, TopologyError>> {
            Box::pin(async { Ok(Duration::from_hours(24)) })
        }
    }

    #[tokio::test]
    async fn a_finished_parent_is_remembered_and_the_topology_asked_once() {
        let topology = Arc::new(Split::default());
        let gate = Gate::new(topology.clone(), StartingPosition::TrimHorizon);
        let store = MemoryLeaseStore::new();
        let child = LeaseKey::new("orders", "shardId-000000000001");

        let first = gate.check(&store, &child, &LeaseState::default()).await;
        assert_eq!(first.held, None);
        let learnt = first.learnt_parents.expect("asked the stream");
        assert_eq!(learnt, ["shardId-000000000000"]);
        let known = LeaseState {
            parent_shards: learnt,
            ..LeaseState::default()
        };
        for _ in 0..3 {
            assert_eq!(gate.check(&store, &child, &known).await.held, None);
        }

        assert_eq!(
            topology.listings.load(Ordering::SeqCst),
            1,
            "the topology is cached"
        );
        assert_eq!(
            topology.reads.load(Ordering::SeqCst),
            1,
            "a finished shard stays finished"
        );
        let parent = store
            .read(&LeaseKey::new("orders", "shardId-000000000000"))
            .await
            .unwrap();
        assert_eq!(parent.checkpoint.as_deref(), Some(SHARD_END));
        assert!(parent.expires_at.is_some());
    }

    #[tokio::test]
    async fn an_original_shard_learns_it_has_no_parents_once_and_its_row_then_asks_nothing() {
        let topology = Arc::new(Split::default());
        let gate = Gate::new(topology.clone(), StartingPosition::TrimHorizon);
        let store = MemoryLeaseStore::new();
        let original = LeaseKey::new("orders", "shardId-000000000000");

        let first = gate.check(&store, &original, &LeaseState::default()).await;
        assert_eq!(first.held, None);
        assert_eq!(
            first.learnt_parents,
            Some(Vec::new()),
            "none, learnt: to be recorded"
        );
        assert_eq!(topology.listings.load(Ordering::SeqCst), 1);

        // A cold process (nothing cached) reading a row that records it.
        let cold_topology = Arc::new(Split::default());
        let cold = Gate::new(cold_topology.clone(), StartingPosition::TrimHorizon);
        let recorded = LeaseState {
            parentless: true,
            ..LeaseState::default()
        };
        let verdict = cold.check(&store, &original, &recorded).await;
        assert_eq!(verdict.held, None);
        assert_eq!(verdict.learnt_parents, None, "nothing new to write");
        assert_eq!(
            cold_topology.listings.load(Ordering::SeqCst),
            0,
            "the row answers"
        );
        assert_eq!(cold_topology.reads.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_shard_the_stream_does_not_list_waits_rather_than_guessing() {
        let gate = Gate::new(Arc::new(Split::default()), StartingPosition::TrimHorizon);
        let stranger = LeaseKey::new("orders", "shardId-000000000042");
        let verdict = gate
            .check(&MemoryLeaseStore::new(), &stranger, &LeaseState::default())
            .await;
        assert!(
            matches!(verdict.held, Some(Held::Unknown { error }) if error.contains("shardId-000000000042"))
        );
    }

    #[test]
    fn starting_positions_read_as_the_mapping_spells_them() {
        assert_eq!("LATEST".parse(), Ok(StartingPosition::Latest));
        assert_eq!("AT_TIMESTAMP".parse(), Ok(StartingPosition::AtTimestamp));
        assert_eq!("TRIM_HORIZON".parse(), Ok(StartingPosition::TrimHorizon));
        assert!("latest".parse::<StartingPosition>().is_err());
    }
}
