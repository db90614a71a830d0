//! The stream a local event source reads: the [`Shards`] trait it reads through, the records it
//! hands out, and [`MemoryStream`], a stream held in memory that splits and merges like Kinesis.
//!
//! A memory stream keeps its own clock, so record ages (`MaximumRecordAgeInSeconds`) are
//! measured in simulated time and a test does not have to wait for records to grow old: a
//! stepped one by default, or the [`Clock`] it is given (a virtual one, shared with the store,
//! the processor and the event source).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use md5::{Digest, Md5};

use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::LeaseKey;
use kinesis_checkpoint::Record;
use kinesis_checkpoint::clock::Clock;
use kinesis_checkpoint::gap::{RangeRead, ReadBudget, SkippedRange};
use kinesis_checkpoint::gate::{ShardInfo, Topology, TopologyError};

/// One record of a stream, as the event source reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    /// Its sequence number, unique in the stream and increasing within a shard.
    pub sequence: String,
    /// The partition key it was written with.
    pub partition_key: String,
    /// Its payload.
    pub data: Bytes,
    /// When the stream received it, in milliseconds since the epoch of the stream's clock.
    pub arrival_millis: u64,
}

/// What one read of a shard returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardRead {
    /// The records after the position read from, oldest first.
    pub records: Vec<StreamRecord>,
    /// The shard is closed and every record has been read: it will never have another.
    pub ended: bool,
}

/// The error a stream reports when it cannot be read.
pub type StreamError = Box<dyn std::error::Error + Send + Sync>;

/// A stream the local event source reads: [`MemoryStream`], or a Kinesis endpoint
/// (`KinesisStream`, feature `kinesis`).
///
/// ```
/// use kinesis_checkpoint_testing::local::{MemoryStream, Shards};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_checkpoint_testing::local::StreamError> {
/// let stream = MemoryStream::new("orders", 1);
/// stream.put("customer-1", "hello");
/// let read = stream.read("shardId-000000000000", None, 10).await?;
/// assert_eq!(read.records[0].data, "hello");
/// assert!(!read.ended, "an open shard can still grow");
/// # Ok(())
/// # }
/// ```
pub trait Shards: Send + Sync + 'static {
    /// The stream's name.
    fn name(&self) -> &str;

    /// The stream's ARN, as events carry it.
    fn arn(&self) -> String;

    /// Every shard, open or closed, with its parents.
    fn list(&self) -> BoxFuture<'_, Result<Vec<ShardInfo>, StreamError>>;

    /// Up to `limit` records of `shard` after the record `after` (from the shard's start when
    /// `None`).
    fn read<'a>(
        &'a self,
        shard: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ShardRead, StreamError>>;

    /// The stream's clock, in milliseconds since the epoch: record ages are measured by it.
    fn now_millis(&self) -> u64;

    /// Moves a simulated clock on by `by`; a real stream's clock runs by itself.
    fn advance(&self, by: Duration) {
        let _ = by;
    }
}

/// The stream's clock starts here (2026-01-01T00:00:00Z), so arrival timestamps look real.
const EPOCH_MILLIS: u64 = 1_767_225_600_000;

/// A Kinesis stream in memory: records routed to shards by the MD5 of their partition key, as
/// Kinesis routes them; shards split and merged with the same parent links; sequence numbers of
/// 56 digits, increasing across the stream. Cloning shares the stream.
///
/// It is also a [`Topology`], so the processor's gate can read it, and recover the records a
/// mapping discarded (see [`gap`](kinesis_checkpoint::gap)).
///
/// ```
/// use kinesis_checkpoint_testing::local::MemoryStream;
///
/// let stream = MemoryStream::new("orders", 2);
/// stream.put("customer-1", r#"{"order_id":"o-1"}"#);
/// let (left, right) = stream.split("shardId-000000000000");
/// let merged = stream.merge(&left, &right);
/// assert_eq!(stream.shard_ids().len(), 5);
/// assert_eq!(stream.parents(&merged), [left, right]);
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStream {
    name: Arc<str>,
    state: Arc<Mutex<State>>,
    /// Arrival stamps and record ages by this clock; by the stepped `clock_millis` without one.
    clock: Option<Arc<dyn Clock>>,
}

#[derive(Debug)]
struct State {
    shards: Vec<Shard>,
    next_sequence: u128,
    clock_millis: u64,
}

#[derive(Debug)]
struct Shard {
    id: String,
    parents: Vec<String>,
    /// The hash keys routed here: `first..=last`.
    first: u128,
    last: u128,
    closed: bool,
    records: Vec<StreamRecord>,
}

impl MemoryStream {
    /// A stream of `shards` open shards dividing the hash key space evenly.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// assert_eq!(MemoryStream::new("orders", 3).shard_ids().len(), 3);
    /// ```
    #[must_use]
    pub fn new(name: impl Into<Arc<str>>, shards: usize) -> Self {
        let count = u128::try_from(shards.max(1)).unwrap_or(1);
        let width = u128::MAX / count;
        let shards = (0..count)
            .map(|i| Shard {
                id: shard_id(i),
                parents: Vec::new(),
                first: i * width,
                last: if i + 1 == count {
                    u128::MAX
                } else {
                    (i + 1) * width - 1
                },
                closed: false,
                records: Vec::new(),
            })
            .collect::<Vec<_>>();
        let state = State {
            shards,
            next_sequence: 1,
            clock_millis: EPOCH_MILLIS,
        };
        Self {
            name: name.into(),
            state: Arc::new(Mutex::new(state)),
            clock: None,
        }
    }

    /// Stamps records and measures their age by `clock` instead of the stream's stepped clock
    /// (which starts at 2026-01-01 and moves a millisecond per record and a round per delivery).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use kinesis_checkpoint::clock::{Clock, SystemClock};
    /// use kinesis_checkpoint_testing::local::{MemoryStream, Shards};
    ///
    /// let stream = MemoryStream::new("orders", 1).clock(Arc::new(SystemClock));
    /// assert!(stream.now_millis() >= SystemClock.now_millis() - 1_000);
    /// ```
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes a record: it lands in the open shard whose hash key range holds the MD5 of
    /// `partition_key`. Returns its sequence number.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// let stream = MemoryStream::new("orders", 1);
    /// let first = stream.put("k", "a");
    /// let second = stream.put("k", "b");
    /// assert!(first.len() == 56 && first < second);
    /// ```
    pub fn put(&self, partition_key: &str, data: impl Into<Bytes>) -> String {
        let hash = hash_key(partition_key);
        let mut state = self.lock();
        let sequence = format!("49{:054}", state.next_sequence);
        state.next_sequence += 1;
        // On a clock, records written in one millisecond share an arrival time, as on Kinesis.
        let arrival_millis = if let Some(clock) = &self.clock {
            clock.now_millis()
        } else {
            state.clock_millis += 1;
            state.clock_millis
        };
        let shard = state
            .shards
            .iter_mut()
            .find(|s| !s.closed && (s.first..=s.last).contains(&hash))
            .expect("the open shards cover the whole hash key space");
        shard.records.push(StreamRecord {
            sequence: sequence.clone(),
            partition_key: partition_key.to_owned(),
            data: data.into(),
            arrival_millis,
        });
        sequence
    }

    /// The shard a record written with `partition_key` lands in now.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// let stream = MemoryStream::new("orders", 1);
    /// assert_eq!(stream.shard_of("k"), "shardId-000000000000");
    /// ```
    #[must_use]
    pub fn shard_of(&self, partition_key: &str) -> String {
        let hash = hash_key(partition_key);
        self.lock()
            .shards
            .iter()
            .find(|s| !s.closed && (s.first..=s.last).contains(&hash))
            .map(|s| s.id.clone())
            .expect("the open shards cover the whole hash key space")
    }

    /// Splits the open `shard` in the middle of its hash key range: it closes, and two children
    /// take its range. Returns the children, lower range first.
    ///
    /// # Panics
    ///
    /// When `shard` is unknown or closed, as Kinesis refuses it.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// let stream = MemoryStream::new("orders", 1);
    /// let (left, _right) = stream.split("shardId-000000000000");
    /// assert_eq!(stream.parents(&left), ["shardId-000000000000"]);
    /// ```
    #[allow(
        clippy::must_use_candidate,
        reason = "resharding is done for its effect"
    )]
    pub fn split(&self, shard: &str) -> (String, String) {
        let mut state = self.lock();
        let next = state.shards.len();
        let parent = state
            .shards
            .iter_mut()
            .find(|s| s.id == shard && !s.closed)
            .unwrap_or_else(|| panic!("{shard} is not an open shard"));
        parent.closed = true;
        let (first, last) = (parent.first, parent.last);
        let middle = first + (last - first) / 2;
        let parents = vec![shard.to_owned()];
        let left = Shard {
            id: shard_id(next as u128),
            parents: parents.clone(),
            first,
            last: middle,
            closed: false,
            records: Vec::new(),
        };
        let right = Shard {
            id: shard_id(next as u128 + 1),
            parents,
            first: middle + 1,
            last,
            closed: false,
            records: Vec::new(),
        };
        let ids = (left.id.clone(), right.id.clone());
        state.shards.push(left);
        state.shards.push(right);
        ids
    }

    /// Merges two open shards with adjacent hash key ranges: both close, and one child takes
    /// their ranges. Returns the child.
    ///
    /// # Panics
    ///
    /// When either shard is unknown or closed, or their ranges are not adjacent.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// let stream = MemoryStream::new("orders", 2);
    /// let child = stream.merge("shardId-000000000000", "shardId-000000000001");
    /// assert_eq!(stream.parents(&child).len(), 2);
    /// ```
    #[allow(
        clippy::must_use_candidate,
        reason = "resharding is done for its effect"
    )]
    pub fn merge(&self, shard: &str, adjacent: &str) -> String {
        let mut state = self.lock();
        let range = |state: &State, id: &str| {
            state
                .shards
                .iter()
                .find(|s| s.id == id && !s.closed)
                .map_or_else(
                    || panic!("{id} is not an open shard"),
                    |s| (s.first, s.last),
                )
        };
        let (a, b) = (range(&state, shard), range(&state, adjacent));
        assert!(
            a.1.checked_add(1) == Some(b.0) || b.1.checked_add(1) == Some(a.0),
            "{shard} and {adjacent} are not adjacent"
        );
        for s in &mut state.shards {
            if s.id == shard || s.id == adjacent {
                s.closed = true;
            }
        }
        let child = Shard {
            id: shard_id(state.shards.len() as u128),
            parents: vec![shard.to_owned(), adjacent.to_owned()],
            first: a.0.min(b.0),
            last: a.1.max(b.1),
            closed: false,
            records: Vec::new(),
        };
        let id = child.id.clone();
        state.shards.push(child);
        id
    }

    /// Every shard id, in creation order.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// assert_eq!(MemoryStream::new("orders", 1).shard_ids(), ["shardId-000000000000"]);
    /// ```
    #[must_use]
    pub fn shard_ids(&self) -> Vec<String> {
        self.lock().shards.iter().map(|s| s.id.clone()).collect()
    }

    /// The parents of `shard` (none for an original shard or an unknown one).
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// assert!(MemoryStream::new("orders", 1).parents("shardId-000000000000").is_empty());
    /// ```
    #[must_use]
    pub fn parents(&self, shard: &str) -> Vec<String> {
        self.of_shard(shard, |s| s.parents.clone())
    }

    /// Every record of `shard`, oldest first.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// let stream = MemoryStream::new("orders", 1);
    /// stream.put("k", "a");
    /// assert_eq!(stream.records("shardId-000000000000").len(), 1);
    /// ```
    #[must_use]
    pub fn records(&self, shard: &str) -> Vec<StreamRecord> {
        self.of_shard(shard, |s| s.records.clone())
    }

    /// `read` of the shard `id`; the default of `T` for an unknown shard.
    fn of_shard<T: Default>(&self, id: &str, read: impl FnOnce(&Shard) -> T) -> T {
        self.lock()
            .shards
            .iter()
            .find(|s| s.id == id)
            .map(read)
            .unwrap_or_default()
    }

    /// How many records the stream holds, in all shards.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// let stream = MemoryStream::new("orders", 2);
    /// stream.put("a", "1");
    /// stream.put("b", "2");
    /// assert_eq!(stream.len(), 2);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().shards.iter().map(|s| s.records.len()).sum()
    }

    /// Whether the stream holds no record.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::MemoryStream;
    /// assert!(MemoryStream::new("orders", 1).is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shards for MemoryStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn arn(&self) -> String {
        format!(
            "arn:aws:kinesis:us-east-1:123456789012:stream/{}",
            self.name
        )
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ShardInfo>, StreamError>> {
        let shards = self
            .lock()
            .shards
            .iter()
            .map(|s| ShardInfo::new(s.id.clone(), s.parents.clone(), s.closed))
            .collect();
        Box::pin(async move { Ok(shards) })
    }

    fn read<'a>(
        &'a self,
        shard: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ShardRead, StreamError>> {
        let result = self
            .lock()
            .shards
            .iter()
            .find(|s| s.id == shard)
            .map(|s| {
                // Sequence numbers have one length, so text order is numeric order.
                let start = after.map_or(0, |after| {
                    s.records.partition_point(|r| r.sequence.as_str() <= after)
                });
                let end = start.saturating_add(limit).min(s.records.len());
                ShardRead {
                    records: s.records[start..end].to_vec(),
                    ended: s.closed && end == s.records.len(),
                }
            })
            .ok_or_else(|| format!("{shard} is not a shard of {}", self.name).into());
        Box::pin(async move { result })
    }

    fn now_millis(&self) -> u64 {
        self.clock
            .as_ref()
            .map_or_else(|| self.lock().clock_millis, |clock| clock.now_millis())
    }

    fn advance(&self, by: Duration) {
        if self.clock.is_some() {
            // The clock runs by itself.
            return;
        }
        let mut state = self.lock();
        state.clock_millis += u64::try_from(by.as_millis()).unwrap_or(u64::MAX / 2);
    }
}

impl Topology for MemoryStream {
    fn shards<'a>(
        &'a self,
        _stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
        Box::pin(async move { self.list().await })
    }

    fn exhausted<'a>(
        &'a self,
        _stream: &'a str,
        shard: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, TopologyError>> {
        Box::pin(async move {
            let read = self.read(shard, after, 1).await?;
            Ok(read.ended && read.records.is_empty())
        })
    }

    fn retention<'a>(&'a self, _stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>> {
        Box::pin(async { Ok(Duration::from_hours(24)) })
    }

    fn read_range<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        range: &'a SkippedRange,
        budget: ReadBudget,
    ) -> BoxFuture<'a, Result<RangeRead, TopologyError>> {
        let key = LeaseKey::new(stream, shard);
        let read = self.of_shard(shard, |s| {
            let mut records = Vec::new();
            for r in &s.records {
                let Ok(sequence) = r.sequence.parse() else {
                    continue;
                };
                if sequence >= range.before {
                    break;
                }
                if !range.contains(&sequence) {
                    continue;
                }
                if records.len() == budget.max_records {
                    return Some((records, false));
                }
                let arrival = UNIX_EPOCH + Duration::from_millis(r.arrival_millis);
                records.push(
                    Record::new(
                        key.clone(),
                        sequence,
                        r.partition_key.clone(),
                        r.data.clone(),
                    )
                    .with_arrival(arrival),
                );
            }
            Some((records, true))
        });
        let read = read.map_or_else(
            || Err(format!("{shard} is not a shard of {}", self.name).into()),
            |(records, complete)| Ok(RangeRead { records, complete }),
        );
        Box::pin(async move { read })
    }

    fn records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Record>, TopologyError>> {
        let key = LeaseKey::new(stream, shard);
        let records = self
            .records(shard)
            .into_iter()
            .map(|r| {
                let sequence = r.sequence.parse().map_err(|e| {
                    format!("shard {shard} of stream {stream} holds a bad sequence number: {e}")
                })?;
                Ok(Record::new(key.clone(), sequence, r.partition_key, r.data))
            })
            .collect::<Result<Vec<_>, TopologyError>>();
        Box::pin(async move { records })
    }
}

/// Kinesis's shard ids: `shardId-` and twelve digits.
fn shard_id(n: u128) -> String {
    format!("shardId-{n:012}")
}

/// The hash key Kinesis routes a partition key by: its MD5 as a 128-bit number.
fn hash_key(partition_key: &str) -> u128 {
    u128::from_be_bytes(Md5::digest(partition_key.as_bytes()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shards_divide_the_whole_hash_key_space_without_overlap() {
        let stream = MemoryStream::new("orders", 3);
        let state = stream.lock();
        assert_eq!(state.shards[0].first, 0);
        assert_eq!(state.shards[2].last, u128::MAX);
        for pair in state.shards.windows(2) {
            assert_eq!(pair[0].last + 1, pair[1].first);
        }
    }
}
