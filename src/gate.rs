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
//! written to its row, so later cold starts need no Kinesis call for it. Finished shards are
//! remembered for the life of the process: a finished shard stays finished.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::gap::{CannotRead, RangeRead, ReadBudget, SkippedRange};
use crate::key::LeaseKey;
use crate::parent_scan::ParentScan;
use crate::record::Record;
use crate::sequence::SHARD_END;
use crate::store::memory::now_millis;
use crate::store::{BoxFuture, CheckpointStore, LeaseError, LeaseState};

/// What the gate knows of one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardInfo {
    /// The shard id.
    pub id: String,
    /// Its parents: one after a split, two after a merge, none for an original shard.
    pub parents: Vec<String>,
    /// Whether the shard is closed (has an ending sequence number): no record will be added.
    pub closed: bool,
}

impl ShardInfo {
    /// A shard with `parents`, open or `closed`.
    ///
    /// ```
    /// use kinesis_checkpoint::gate::ShardInfo;
    ///
    /// let child = ShardInfo::new("shardId-000000000001", ["shardId-000000000000"], false);
    /// assert_eq!(child.parents, ["shardId-000000000000"]);
    /// ```
    #[must_use]
    pub fn new<P: Into<String>>(
        id: impl Into<String>,
        parents: impl IntoIterator<Item = P>,
        closed: bool,
    ) -> Self {
        Self {
            id: id.into(),
            parents: parents.into_iter().map(Into::into).collect(),
            closed,
        }
    }
}

/// The error a topology reports.
pub type TopologyError = Box<dyn std::error::Error + Send + Sync>;

/// Where the gate learns the stream's shards and reads a parent.
///
/// # Examples
///
/// [`KinesisTopology`] asks Kinesis; tests and local sources implement it over their own
/// stream:
///
/// ```
/// use std::time::Duration;
///
/// use kinesis_checkpoint::BoxFuture;
/// use kinesis_checkpoint::gate::{ShardInfo, Topology, TopologyError};
///
/// /// A stream that never split.
/// struct OneShard;
///
/// impl Topology for OneShard {
///     fn shards<'a>(&'a self, _stream: &'a str) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
///         Box::pin(async { Ok(vec![ShardInfo::new("shardId-000000000000", Vec::<String>::new(), false)]) })
///     }
///
///     fn exhausted<'a>(
///         &'a self,
///         _stream: &'a str,
///         _shard: &'a str,
///         _after: Option<&'a str>,
///     ) -> BoxFuture<'a, Result<bool, TopologyError>> {
///         Box::pin(async { Ok(false) })
///     }
///
///     fn retention<'a>(&'a self, _stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>> {
///         Box::pin(async { Ok(Duration::from_secs(24 * 3600)) })
///     }
/// }
/// ```
pub trait Topology: Send + Sync + 'static {
    /// Every shard of `stream` still within its retention, open or closed.
    fn shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>>;

    /// Whether the closed `shard` has no record after `after` (the whole shard when `None`):
    /// reading from there returns no record before the shard's end.
    fn exhausted<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, TopologyError>>;

    /// How long the stream keeps records.
    fn retention<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>>;

    /// The records of `shard` in `range`, oldest first and still packed when aggregated, within
    /// `budget`: what the processor runs first when the mapping skipped records (see
    /// [`gap`](crate::gap)). Asked only once a gap is proven, never for a normal batch.
    ///
    /// The default cannot read records: it fails with [`CannotRead`], and the processor logs
    /// the gap as an error, counts it in the `Gap` metric and goes on.
    fn read_range<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        range: &'a SkippedRange,
        budget: ReadBudget,
    ) -> BoxFuture<'a, Result<RangeRead, TopologyError>> {
        let _ = (range, budget);
        Box::pin(async move { Err(Box::new(CannotRead::new(stream, shard)) as TopologyError) })
    }

    /// Every record of the closed `shard`, oldest first: what the gate checks a parent against
    /// in the [partition-key mode](crate::partition_key), where no shard checkpoint says how far
    /// it got.
    ///
    /// The default cannot read records: it fails, and the gate holds the child (rather than
    /// guess) until the parent's row says `SHARD_END` or the parent expires.
    fn records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Record>, TopologyError>> {
        Box::pin(async move {
            Err(format!(
                "this topology cannot read the records of shard {shard} of stream {stream}, which \
                 the partition-key mode's gate needs"
            )
            .into())
        })
    }
}

/// Where the event source mapping starts reading a shard it has no position for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartingPosition {
    /// From the oldest record: every record of a parent will be delivered.
    #[default]
    TrimHorizon,
    /// From the newest: older records of a parent may never be delivered.
    Latest,
    /// From a timestamp: older records of a parent may never be delivered.
    AtTimestamp,
}

/// A starting position that is not one of the mapping's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("starting position '{0}' is not TRIM_HORIZON, LATEST or AT_TIMESTAMP")]
pub struct UnknownStartingPosition(String);

impl FromStr for StartingPosition {
    type Err = UnknownStartingPosition;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "TRIM_HORIZON" => Ok(Self::TrimHorizon),
            "LATEST" => Ok(Self::Latest),
            "AT_TIMESTAMP" => Ok(Self::AtTimestamp),
            other => Err(UnknownStartingPosition(other.to_owned())),
        }
    }
}

/// Why a child shard waits.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Held {
    /// The parent still has records after its checkpoint.
    Unfinished {
        /// The parent shard.
        parent: String,
        /// Its checkpoint, if it has one.
        checkpoint: Option<String>,
    },
    /// The parent is still open.
    ParentOpen {
        /// The parent shard.
        parent: String,
    },
    /// The parent was never read here and has records, and the mapping starts at
    /// `TRIM_HORIZON`: they will be delivered.
    NeverRead {
        /// The parent shard.
        parent: String,
    },
    /// Kinesis or the lease store could not answer; the batch waits rather than guess.
    Unknown {
        /// What failed.
        error: String,
    },
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unfinished { parent, checkpoint } => write!(
                f,
                "parent {parent} has records after its checkpoint ({})",
                checkpoint.as_deref().unwrap_or("none")
            ),
            Self::ParentOpen { parent } => write!(f, "parent {parent} is still open"),
            Self::NeverRead { parent } => write!(
                f,
                "parent {parent} has records not yet delivered and the mapping starts at TRIM_HORIZON"
            ),
            Self::Unknown { error } => write!(f, "the parents could not be checked: {error}"),
        }
    }
}

/// What the gate found for a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `None` when the shard may run; why it waits otherwise.
    pub held: Option<Held>,
    /// The shard's parents, to be written to its row when it did not list them yet.
    pub learnt_parents: Vec<String>,
}

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
    topology: Arc<dyn Topology>,
    starting_position: StartingPosition,
    retention: Option<Duration>,
    shards: Mutex<HashMap<String, HashMap<String, ShardInfo>>>,
    finished: Mutex<HashSet<LeaseKey>>,
    /// What the partition-key mode learnt of closed parents not yet finished.
    scans: Mutex<HashMap<LeaseKey, ParentScan>>,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate")
            .field("starting_position", &self.starting_position)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

/// A day: finished rows outlive the stream's retention by one, so a late redelivery of a
/// parent's records still finds them `SHARD_END`.
const GRACE: Duration = Duration::from_hours(24);

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
            topology,
            starting_position,
            retention: None,
            shards: Mutex::new(HashMap::new()),
            finished: Mutex::new(HashSet::new()),
            scans: Mutex::new(HashMap::new()),
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
        self.retention = Some(retention);
        self
    }

    /// Where the gate reads the stream: also what reads records the mapping skipped.
    pub(crate) fn topology(&self) -> &dyn Topology {
        self.topology.as_ref()
    }

    /// Whether the shard of `key`, whose row is `state`, may run now.
    pub(crate) async fn check(
        &self,
        store: &dyn CheckpointStore,
        key: &LeaseKey,
        state: &LeaseState,
    ) -> Verdict {
        let (parents, learnt_parents) = if state.parent_shards.is_empty() {
            match self.shard(key.stream(), key.shard(), false).await {
                Ok(Some(info)) => (info.parents.clone(), info.parents),
                Ok(None) => {
                    return Verdict {
                        held: Some(Held::Unknown {
                            error: format!("shard {} is not listed by the stream", key.shard()),
                        }),
                        learnt_parents: Vec::new(),
                    };
                }
                Err(error) => return held_unknown(&error),
            }
        } else {
            (state.parent_shards.clone(), Vec::new())
        };
        for parent in parents {
            match self
                .parent_finished(store, &LeaseKey::new(key.stream(), parent.as_str()))
                .await
            {
                Ok(None) => {}
                Ok(Some(held)) => {
                    return Verdict {
                        held: Some(held),
                        learnt_parents,
                    };
                }
                Err(error) => return held_unknown(&error),
            }
        }
        Verdict {
            held: None,
            learnt_parents,
        }
    }

    /// Whether the shard of `key` may run now in the partition-key mode: `None` when each parent
    /// is finished, why the child waits otherwise. The shard's parents come from the topology
    /// (cached per process); a parent is finished when its row says `SHARD_END`, when it has
    /// expired, or when it is closed and each of its records is at or below its key's
    /// checkpoint; the gate then marks it `SHARD_END`.
    pub(crate) async fn check_partition_keys(
        &self,
        store: &dyn CheckpointStore,
        key: &LeaseKey,
    ) -> Option<Held> {
        let parents = match self.shard(key.stream(), key.shard(), false).await {
            Ok(Some(info)) => info.parents,
            Ok(None) => {
                return Some(Held::Unknown {
                    error: format!("shard {} is not listed by the stream", key.shard()),
                });
            }
            Err(error) => return held_unknown(&error).held,
        };
        for parent in parents {
            let parent = LeaseKey::new(key.stream(), parent.as_str());
            match self.parent_keys_finished(store, &parent).await {
                Ok(None) => {}
                Ok(Some(held)) => return Some(held),
                Err(error) => return held_unknown(&error).held,
            }
        }
        None
    }

    async fn parent_keys_finished(
        &self,
        store: &dyn CheckpointStore,
        parent: &LeaseKey,
    ) -> Result<Option<Held>, LeaseError> {
        let (row, info) = match self.closed_parent(store, parent).await? {
            Ok(closed) => closed,
            Err(settled) => return Ok(settled),
        };
        // A consumer of the whole shard sharing the table (the seed crate's) may have
        // checkpointed the parent: its records up to there are done, whatever their key.
        let shard_checkpoint = row.position()?;
        let mut scan = self.take_scan(parent);
        let verdict = self
            .scan_parent(store, parent, shard_checkpoint.as_ref(), &mut scan)
            .await;
        let empty = scan.ends.is_empty();
        self.keep_scan(parent, scan);
        if let Some(held) = verdict? {
            return Ok(Some(held));
        }
        // An empty parent is finished only once its own parents are (see `parent_finished`).
        if empty
            && let Some(held) = self
                .ancestors_finished(store, parent, &info.parents, true)
                .await?
        {
            return Ok(Some(held));
        }
        self.finish(store, parent, row.checkpoint.as_deref())
            .await?;
        if self.is_finished(parent) {
            // Finished stays finished: what was learnt of it is no longer needed.
            self.take_scan(parent);
        }
        Ok(None)
    }

    /// Checks the closed `parent`'s keys against their rows, reading on in the parent only
    /// when every key known so far is done: `None` once every key of the whole parent is.
    async fn scan_parent(
        &self,
        store: &dyn CheckpointStore,
        parent: &LeaseKey,
        shard_checkpoint: Option<&crate::sequence::Position>,
        scan: &mut ParentScan,
    ) -> Result<Option<Held>, LeaseError> {
        let mut read = false;
        loop {
            let pending: Vec<String> = scan.pending().into_iter().map(str::to_owned).collect();
            if !pending.is_empty() {
                let rows: Vec<LeaseKey> = pending
                    .iter()
                    .map(|partition_key| crate::partition_key::row_key(parent, partition_key))
                    .collect();
                let states = store.read_rows(&rows).await?;
                let mut waiting = None;
                for (partition_key, state) in pending.iter().zip(&states) {
                    let end = &scan.ends[partition_key];
                    let done = state
                        .position()?
                        .iter()
                        .chain(shard_checkpoint)
                        .any(|checkpoint| end <= checkpoint);
                    // A key never read here may never come when the mapping does not start
                    // at the horizon; at the horizon it will.
                    let never_read = state.lease_counter == 0;
                    if done {
                        scan.done.insert(partition_key.clone());
                    } else if waiting.is_none()
                        && (!never_read || self.starting_position == StartingPosition::TrimHorizon)
                    {
                        waiting = Some(crate::parent_scan::describe(partition_key, end));
                    }
                }
                if let Some(waiting) = waiting {
                    return Ok(Some(Held::Unfinished {
                        parent: parent.shard().to_owned(),
                        checkpoint: Some(waiting),
                    }));
                }
            }
            if scan.complete {
                return Ok(None);
            }
            if read {
                // One part per check: the next held batch reads on.
                return Ok(Some(Held::Unfinished {
                    parent: parent.shard().to_owned(),
                    checkpoint: Some(format!(
                        "{} partition keys of the closed parent read so far, all done; reading on",
                        scan.ends.len()
                    )),
                }));
            }
            scan.read_on(self.topology.as_ref(), parent).await?;
            read = true;
        }
    }

    fn take_scan(&self, parent: &LeaseKey) -> ParentScan {
        self.scans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(parent)
            .unwrap_or_default()
    }

    fn keep_scan(&self, parent: &LeaseKey, scan: ParentScan) {
        self.scans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(parent.clone(), scan);
    }

    /// `None` when every one of `parents` (of the shard `of`) is finished; why it waits
    /// otherwise.
    /// `by_keys`: in the partition-key mode, where a shard has no row of its own.
    async fn ancestors_finished(
        &self,
        store: &dyn CheckpointStore,
        of: &LeaseKey,
        parents: &[String],
        by_keys: bool,
    ) -> Result<Option<Held>, LeaseError> {
        for grandparent in parents {
            let grandparent = LeaseKey::new(of.stream(), grandparent.as_str());
            let held = if by_keys {
                Box::pin(self.parent_keys_finished(store, &grandparent)).await?
            } else {
                Box::pin(self.parent_finished(store, &grandparent)).await?
            };
            if let Some(held) = held {
                return Ok(Some(held));
            }
        }
        Ok(None)
    }

    /// What both modes settle before looking at a parent's records: `Err(None)` when it is
    /// known finished (remembered, marked `SHARD_END`, or expired from the stream),
    /// `Err(Some(..))` while it is still open; otherwise its row and its view in the topology,
    /// for the mode's own check.
    async fn closed_parent(
        &self,
        store: &dyn CheckpointStore,
        parent: &LeaseKey,
    ) -> Result<Result<(LeaseState, ShardInfo), Option<Held>>, LeaseError> {
        if self.is_finished(parent) {
            return Ok(Err(None));
        }
        let row = store.read(parent).await?;
        if row.checkpoint.as_deref() == Some(SHARD_END) {
            self.remember_finished(parent);
            return Ok(Err(None));
        }
        let Some(info) = self.shard(parent.stream(), parent.shard(), true).await? else {
            tracing::info!(
                parent = parent.shard(),
                "the parent has expired from the stream: finished"
            );
            self.remember_finished(parent);
            return Ok(Err(None));
        };
        if !info.closed {
            return Ok(Err(Some(Held::ParentOpen {
                parent: parent.shard().to_owned(),
            })));
        }
        Ok(Ok((row, info)))
    }

    /// `None` when the parent is finished; why the child waits otherwise.
    async fn parent_finished(
        &self,
        store: &dyn CheckpointStore,
        parent: &LeaseKey,
    ) -> Result<Option<Held>, LeaseError> {
        let (row, info) = match self.closed_parent(store, parent).await? {
            Ok(closed) => closed,
            Err(settled) => return Ok(settled),
        };
        // A partial aggregate or a failing record at the checkpoint is not done, although the
        // stream may hold nothing after the checkpoint (the aggregate is the record at it, in
        // rows of the 0.1.0 form): the parent is not exhausted.
        if let Some(undone) = row.unfinished() {
            return Ok(Some(Held::Unfinished {
                parent: parent.shard().to_owned(),
                checkpoint: Some(format!(
                    "{}: {undone}",
                    row.checkpoint.as_deref().unwrap_or("none")
                )),
            }));
        }
        let after = row.checkpoint.as_deref();
        if self
            .topology
            .exhausted(parent.stream(), parent.shard(), after)
            .await?
        {
            // A parent never processed (no checkpoint: it had nothing to deliver) is finished
            // only once its own parents are: a merge of two empty children of a split must not
            // let its child run before the split's parent is done.
            if after.is_none()
                && let Some(held) = self
                    .ancestors_finished(store, parent, &info.parents, false)
                    .await?
            {
                return Ok(Some(held));
            }
            self.finish(store, parent, after).await?;
            return Ok(None);
        }
        let never_read =
            row.checkpoint.is_none() && row.lease_owner.is_none() && row.lease_counter == 0;
        if never_read {
            if self.starting_position == StartingPosition::TrimHorizon {
                return Ok(Some(Held::NeverRead {
                    parent: parent.shard().to_owned(),
                }));
            }
            tracing::warn!(
                parent = parent.shard(),
                "the parent was never read here and the mapping does not start at TRIM_HORIZON: not waiting for it"
            );
            return Ok(None);
        }
        Ok(Some(Held::Unfinished {
            parent: parent.shard().to_owned(),
            checkpoint: row.checkpoint,
        }))
    }

    /// Writes `SHARD_END` on an exhausted parent (unless its checkpoint moved meanwhile), with
    /// its expiry for `DynamoDB` TTL.
    async fn finish(
        &self,
        store: &dyn CheckpointStore,
        parent: &LeaseKey,
        expected: Option<&str>,
    ) -> Result<(), LeaseError> {
        let retention = match self.retention {
            Some(retention) => retention,
            None => self.topology.retention(parent.stream()).await?,
        };
        let expires_at = (now_millis() / 1_000).saturating_add((retention + GRACE).as_secs());
        if store.finish(parent, expected, expires_at).await? {
            tracing::info!(
                parent = parent.shard(),
                "the parent is exhausted: marked SHARD_END"
            );
            self.remember_finished(parent);
        }
        Ok(())
    }

    /// The topology's view of one shard: from the cache, or asked again when the cache does not
    /// know the shard (it may be new), or when `closing` matters and the cache saw it open (it
    /// may have closed since). Parents never change, and a closed shard stays closed.
    async fn shard(
        &self,
        stream: &str,
        shard: &str,
        closing: bool,
    ) -> Result<Option<ShardInfo>, TopologyError> {
        let cached = self
            .shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(stream)
            .and_then(|shards| shards.get(shard))
            .filter(|info| info.closed || !closing)
            .cloned();
        if cached.is_some() {
            return Ok(cached);
        }
        let shards = self.topology.shards(stream).await?;
        let found = shards.iter().find(|info| info.id == shard).cloned();
        self.shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                stream.to_owned(),
                shards
                    .into_iter()
                    .map(|info| (info.id.clone(), info))
                    .collect(),
            );
        Ok(found)
    }

    fn is_finished(&self, key: &LeaseKey) -> bool {
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(key)
    }

    fn remember_finished(&self, key: &LeaseKey) {
        self.finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone());
    }
}

fn held_unknown(error: &dyn fmt::Display) -> Verdict {
    Verdict {
        held: Some(Held::Unknown {
            error: error.to_string(),
        }),
        learnt_parents: Vec::new(),
    }
}

#[cfg(feature = "kinesis")]
pub use kinesis::KinesisTopology;

#[cfg(feature = "kinesis")]
mod kinesis {
    use std::time::Duration;

    use aws_sdk_kinesis::Client;
    use aws_sdk_kinesis::error::ProvideErrorMetadata;
    use aws_sdk_kinesis::types::ShardIteratorType;

    use super::{ShardInfo, Topology, TopologyError};
    use crate::gap::{RangeRead, ReadBudget, SkippedRange};
    use crate::key::LeaseKey;
    use crate::record::Record;
    use crate::store::BoxFuture;

    /// The most `GetRecords` pages read to prove a closed shard exhausted; past it the shard
    /// counts as not exhausted and the child waits for the next batch.
    const MAX_PAGES: usize = 100;

    /// The topology as Kinesis reports it: `ListShards` (every page), `GetShardIterator` and
    /// `GetRecords` to prove a closed shard exhausted, `DescribeStreamSummary` for the
    /// retention. The event source mapping's role already allows these calls.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::gate::KinesisTopology;
    /// # async fn run() {
    /// let config = aws_config::load_from_env().await;
    /// let topology = KinesisTopology::new(&config);
    /// # }
    /// ```
    #[derive(Debug, Clone)]
    pub struct KinesisTopology {
        client: Client,
        records_per_page: Option<i32>,
    }

    impl KinesisTopology {
        /// Asks Kinesis in the account, region and endpoint of `config`.
        ///
        /// ```no_run
        /// # use kinesis_checkpoint::gate::KinesisTopology;
        /// # async fn run() {
        /// let topology = KinesisTopology::new(&aws_config::load_from_env().await);
        /// # }
        /// ```
        #[must_use]
        pub fn new(config: &aws_config::SdkConfig) -> Self {
            Self {
                client: Client::new(config),
                records_per_page: None,
            }
        }

        /// At most `records` per `GetRecords` page when reading records the mapping skipped
        /// (by default Kinesis's own limit, 10,000): smaller pages keep each answer under the
        /// 10 MB a page may carry when records are large.
        ///
        /// ```no_run
        /// # use kinesis_checkpoint::gate::KinesisTopology;
        /// # async fn run() {
        /// let topology = KinesisTopology::new(&aws_config::load_from_env().await).records_per_page(1_000);
        /// # }
        /// ```
        #[must_use]
        pub const fn records_per_page(mut self, records: i32) -> Self {
            self.records_per_page = Some(records);
            self
        }
    }

    fn failed(
        what: &str,
        stream: &str,
        error: &(impl ProvideErrorMetadata + std::error::Error + 'static),
    ) -> TopologyError {
        format!(
            "Kinesis {what} on stream '{stream}' failed: {}",
            crate::aws_error::cause(error)
        )
        .into()
    }

    impl Topology for KinesisTopology {
        fn shards<'a>(
            &'a self,
            stream: &'a str,
        ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
            Box::pin(async move {
                let mut shards = Vec::new();
                let mut token: Option<String> = None;
                loop {
                    // A page token carries the stream: naming both is refused.
                    let request = match &token {
                        Some(token) => self.client.list_shards().next_token(token),
                        None => self.client.list_shards().stream_name(stream),
                    };
                    let page = request
                        .send()
                        .await
                        .map_err(|e| failed("ListShards", stream, &e))?;
                    for shard in page.shards() {
                        let parents = shard
                            .parent_shard_id()
                            .into_iter()
                            .chain(shard.adjacent_parent_shard_id())
                            .map(str::to_owned)
                            .collect::<Vec<_>>();
                        let closed = shard
                            .sequence_number_range()
                            .is_some_and(|range| range.ending_sequence_number().is_some());
                        shards.push(ShardInfo::new(shard.shard_id(), parents, closed));
                    }
                    token = page.next_token().map(str::to_owned);
                    if token.is_none() {
                        return Ok(shards);
                    }
                }
            })
        }

        fn exhausted<'a>(
            &'a self,
            stream: &'a str,
            shard: &'a str,
            after: Option<&'a str>,
        ) -> BoxFuture<'a, Result<bool, TopologyError>> {
            Box::pin(async move {
                let request = self
                    .client
                    .get_shard_iterator()
                    .stream_name(stream)
                    .shard_id(shard);
                let request = match after {
                    Some(sequence) => request
                        .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                        .starting_sequence_number(sequence),
                    None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
                };
                let mut iterator = request
                    .send()
                    .await
                    .map_err(|e| {
                        let from = after.map_or_else(
                            || "at the trim horizon".to_owned(),
                            |sequence| format!("after {sequence}"),
                        );
                        failed(
                            &format!("GetShardIterator of shard '{shard}' {from}"),
                            stream,
                            &e,
                        )
                    })?
                    .shard_iterator;
                for _ in 0..MAX_PAGES {
                    let Some(current) = iterator else {
                        return Ok(true);
                    };
                    let page = self
                        .client
                        .get_records()
                        .shard_iterator(current)
                        .limit(1)
                        .send()
                        .await
                        .map_err(|e| {
                            failed(&format!("GetRecords of shard '{shard}'"), stream, &e)
                        })?;
                    if !page.records().is_empty() {
                        return Ok(false);
                    }
                    iterator = page.next_shard_iterator;
                }
                Ok(false)
            })
        }

        fn records<'a>(
            &'a self,
            stream: &'a str,
            shard: &'a str,
        ) -> BoxFuture<'a, Result<Vec<Record>, TopologyError>> {
            Box::pin(async move {
                let key = LeaseKey::new(stream, shard);
                let mut iterator = self
                    .client
                    .get_shard_iterator()
                    .stream_name(stream)
                    .shard_id(shard)
                    .shard_iterator_type(ShardIteratorType::TrimHorizon)
                    .send()
                    .await
                    .map_err(|e| {
                        failed(&format!("GetShardIterator of shard '{shard}'"), stream, &e)
                    })?
                    .shard_iterator;
                let mut records = Vec::new();
                let mut empty_pages = 0;
                while let Some(current) = iterator {
                    let page = self
                        .client
                        .get_records()
                        .shard_iterator(current)
                        .send()
                        .await
                        .map_err(|e| {
                            failed(&format!("GetRecords of shard '{shard}'"), stream, &e)
                        })?;
                    for record in page.records() {
                        let sequence = record.sequence_number().parse().map_err(|e| {
                            format!(
                                "shard {shard} of stream {stream} holds a bad sequence number: {e}"
                            )
                        })?;
                        records.push(Record::new(
                            key.clone(),
                            sequence,
                            // No key (on-demand streams may omit it): the empty key, as in
                            // `Record::partition_key`.
                            record.partition_key().unwrap_or_default(),
                            record.data().as_ref().to_vec(),
                        ));
                    }
                    // A closed shard ends with a null iterator; empty pages before it are
                    // bounded, as in `exhausted`.
                    empty_pages = if page.records().is_empty() {
                        empty_pages + 1
                    } else {
                        0
                    };
                    if empty_pages > MAX_PAGES {
                        return Err(format!(
                            "shard {shard} of stream {stream} did not end after {MAX_PAGES} empty pages"
                        )
                        .into());
                    }
                    iterator = page.next_shard_iterator;
                }
                Ok(records)
            })
        }

        fn read_range<'a>(
            &'a self,
            stream: &'a str,
            shard: &'a str,
            range: &'a SkippedRange,
            budget: ReadBudget,
        ) -> BoxFuture<'a, Result<RangeRead, TopologyError>> {
            Box::pin(async move {
                let key = LeaseKey::new(stream, shard);
                crate::gap::read_kinesis(&self.client, &key, range, budget, self.records_per_page)
                    .await
            })
        }

        fn retention<'a>(
            &'a self,
            stream: &'a str,
        ) -> BoxFuture<'a, Result<Duration, TopologyError>> {
            Box::pin(async move {
                let summary = self
                    .client
                    .describe_stream_summary()
                    .stream_name(stream)
                    .send()
                    .await
                    .map_err(|e| failed("DescribeStreamSummary", stream, &e))?;
                let hours = summary.stream_description_summary().map_or(
                    24,
                    aws_sdk_kinesis::types::StreamDescriptionSummary::retention_period_hours,
                );
                Ok(Duration::from_hours(u64::try_from(hours).unwrap_or(24)))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::store::MemoryLeaseStore;

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
        assert_eq!(first.learnt_parents, ["shardId-000000000000"]);
        let known = LeaseState {
            parent_shards: first.learnt_parents,
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
