//! What the gate asks of the stream: its shards, their parents, whether a closed shard has
//! records left, its retention, and (for gap recovery) a range of records.
//!
//! The [`Topology`] trait is the gate's one view of Kinesis, so tests and the local event
//! source stand in for the stream with a few methods; [`KinesisTopology`](super::KinesisTopology)
//! is the real one.

use std::str::FromStr;
use std::time::Duration;

use crate::gap::{CannotRead, RangeRead, ReadBudget, SkippedRange};
use crate::record::Record;
use crate::store::BoxFuture;

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
/// [`KinesisTopology`](super::KinesisTopology) asks Kinesis; tests and local sources implement it over their own
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
    /// in the [partition-key mode](crate::PartitionKeyMode), where no shard checkpoint says how far
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
