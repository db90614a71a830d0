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
//! The partition-key mode has its own rule (`by_key`): no shard checkpoint says how far a
//! parent got, so a closed parent is finished once each of its records is at or below its key's
//! checkpoint.
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
mod parent_scan;
mod topology;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use self::by_key::KeyVerdict;
use self::by_key::Scans;
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

    /// Where the gate reads the stream: also what reads records the mapping skipped.
    pub(crate) fn topology(&self) -> &dyn Topology {
        self.lineage.topology.as_ref()
    }

    /// Whether the shard of `key`, whose row is `state`, may run now.
    pub(crate) async fn check(
        &self,
        store: &dyn CheckpointStore,
        key: &LeaseKey,
        state: &LeaseState,
    ) -> Verdict {
        by_shard::check(&self.lineage, store, key, state).await
    }

    /// Whether the shard of `key` may run now in the partition-key mode (see
    /// [`PartitionKeyMode`](crate::PartitionKeyMode)).
    pub(crate) async fn check_partition_keys(
        &self,
        store: &dyn CheckpointStore,
        key: &LeaseKey,
    ) -> KeyVerdict {
        by_key::check(&self.lineage, &self.scans, store, key).await
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
