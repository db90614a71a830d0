//! The record a handler sees: where it came from, where it stands in its shard, and its payload.
//!
//! A [`Record`] is built from Lambda's event (see [`event`](crate::event)), from a KPL aggregate's
//! sub-records (see [`kpl`](crate::kpl)), by local sources and by tests; it knows none of them,
//! so that each source depends on it and not the reverse. Cloning one is cheap, and its `Debug`
//! never shows the payload.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::key::LeaseKey;
use crate::sequence::{Position, SequenceNumber};

/// One Kinesis record, as the handler receives it.
///
/// Cloning is cheap (shared strings and a shared payload), so a handler may keep a record past
/// its call. The records of one event (of a large one, each 64 read together) share a block of
/// memory, payloads included, freed with the last of them: to keep a payload for longer than
/// the batch, keep its [`bytes`](Self::bytes) (a clone holds that payload only), not the record.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::{LeaseKey, Record};
///
/// let record = Record::new(
///     LeaseKey::new("orders", "shardId-000000000000"),
///     "49590338271490256608559692538361571095921575989136588898".parse()?,
///     "order-17",
///     r#"{"order_id":"17","amount_cents":250}"#,
/// );
/// assert_eq!(record.stream(), "orders");
/// assert_eq!(record.partition_key(), "order-17");
/// let order: serde_json::Value = record.json()?;
/// assert_eq!(order["amount_cents"], 250);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Record {
    /// The block holding the record's fields, shared by its clones: dispatch hands the
    /// handler a clone and keeps the record for its report and dead letter, and a clone of one
    /// `Arc` costs one count where a clone of each field cost five. The records read together
    /// share one block (see [`Record::arrived_together`]): a block per record was, with its
    /// allocation and its release, a fifth of what the processor added to a bare loop
    /// (BENCHMARKS.md, section 1). A record built alone has a block of its own.
    block: Arc<[Slot]>,
    /// The record's place in `block`, which holds its fields there.
    index: usize,
}

/// One place of a block: a record's fields, or `None` for a record of the event that could
/// not be read (no [`Record`] points at it).
type Slot = Option<Fields>;

/// Equal by their fields, wherever each is held.
impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.inner() == other.inner()
    }
}

impl Eq for Record {}

/// What [`Record::arrived_together`] takes of each record of Lambda's event, with the arrival
/// time the event gives: the clock is not read for every record of a batch, as
/// [`Record::new`] would.
pub(crate) struct Arrived {
    pub(crate) key: LeaseKey,
    pub(crate) sequence: SequenceNumber,
    pub(crate) partition_key: Box<str>,
    pub(crate) data: Bytes,
    pub(crate) arrival: SystemTime,
}

impl From<Arrived> for Fields {
    fn from(arrival: Arrived) -> Self {
        let Arrived {
            key,
            sequence,
            partition_key,
            data,
            arrival,
        } = arrival;
        Self {
            key,
            sequence,
            sub_sequence: None,
            partition_key: PartitionKey::Owned(partition_key),
            routing_key: None,
            explicit_hash_key: None,
            data,
            arrival,
        }
    }
}

#[derive(Clone, PartialEq, Eq)]
struct Fields {
    key: LeaseKey,
    sequence: SequenceNumber,
    sub_sequence: Option<u64>,
    partition_key: PartitionKey,
    /// The partition key Kinesis routed the record by, when it is not `partition_key`: the
    /// aggregate's own, for a KPL sub-record.
    routing_key: Option<Arc<str>>,
    explicit_hash_key: Option<Arc<str>>,
    data: Bytes,
    arrival: SystemTime,
}

/// A partition key: the event's own string, taken from it as it is (no block is allocated for
/// it), or one shared by many records (a KPL aggregate's key table, a caller's `Arc`).
#[derive(Clone)]
enum PartitionKey {
    Owned(Box<str>),
    Shared(Arc<str>),
}

impl PartitionKey {
    fn as_str(&self) -> &str {
        match self {
            Self::Owned(key) => key,
            Self::Shared(key) => key,
        }
    }
}

/// Equal by their text, however each is held.
impl PartialEq for PartitionKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for PartitionKey {}

impl Record {
    /// A record of `key`'s shard, arrived now. Used by tests and local sources; the processor
    /// builds records from Lambda's event.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "hi");
    /// assert_eq!(record.data(), b"hi");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn new(
        key: LeaseKey,
        sequence: SequenceNumber,
        partition_key: impl Into<Arc<str>>,
        data: impl Into<Bytes>,
    ) -> Self {
        Self::with_fields(Fields {
            key,
            sequence,
            sub_sequence: None,
            partition_key: PartitionKey::Shared(partition_key.into()),
            routing_key: None,
            explicit_hash_key: None,
            data: data.into(),
            arrival: crate::clock::system_time(),
        })
    }

    /// The records of one event, read in order, in one block: `Ok` with them when `arrivals`
    /// yields every record's fields; otherwise `Err` with each record, or why it could not be
    /// read, in its place. Given the event's records one by one (an iterator whose length is
    /// known, as a mapped slice's is), the block is allocated once at its size and filled in
    /// place, with no vector of fields copied into it.
    pub(crate) fn arrived_together<E>(
        arrivals: impl Iterator<Item = Result<Arrived, E>>,
    ) -> Result<Vec<Self>, Vec<Result<Self, E>>> {
        let mut unread = Vec::new();
        let block: Arc<[Slot]> = arrivals
            .map(|arrival| arrival.map(Fields::from).map_err(|e| unread.push(e)).ok())
            .collect();
        let record = |index| Self {
            block: Arc::clone(&block),
            index,
        };
        if unread.is_empty() {
            return Ok((0..block.len()).map(record).collect());
        }
        let mut unread = unread.into_iter();
        Err((0..block.len())
            .map(|index| match block[index] {
                Some(_) => Ok(record(index)),
                None => Err(unread
                    .next()
                    .unwrap_or_else(|| unreachable!("one error per record not read"))),
            })
            .collect())
    }

    fn with_fields(fields: Fields) -> Self {
        Self {
            block: Arc::from([Some(fields)]),
            index: 0,
        }
    }

    /// The record's fields.
    fn inner(&self) -> &Fields {
        self.block[self.index]
            .as_ref()
            .unwrap_or_else(|| unreachable!("a record points only at a slot that holds one"))
    }

    /// The fields to change, for the builders: a record built alone is not shared yet, so
    /// nothing is copied; one of a shared block is moved to a block of its own first.
    fn fields(&mut self) -> &mut Fields {
        if Arc::get_mut(&mut self.block).is_none() {
            *self = Self::with_fields(self.inner().clone());
        }
        Arc::get_mut(&mut self.block)
            .and_then(|block| block[self.index].as_mut())
            .unwrap_or_else(|| unreachable!("the block was just made the record's own"))
    }

    /// The same record as sub-record `sub_sequence` of a KPL aggregate.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// let record = Record::new(LeaseKey::new("s", "shardId-000000000000"), "5".parse()?, "k", "x")
    ///     .with_sub_sequence(3);
    /// assert_eq!(record.position().to_string(), "5/3");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn with_sub_sequence(mut self, sub_sequence: u64) -> Self {
        self.fields().sub_sequence = Some(sub_sequence);
        self
    }

    /// The same record with an explicit hash key, as a KPL sub-record may carry.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// let record = Record::new(LeaseKey::new("s", "shardId-000000000000"), "5".parse()?, "k", "x")
    ///     .with_explicit_hash_key("170141183460469231731687303715884105728");
    /// assert!(record.explicit_hash_key().is_some());
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn with_explicit_hash_key(mut self, hash_key: impl Into<Arc<str>>) -> Self {
        self.fields().explicit_hash_key = Some(hash_key.into());
        self
    }

    /// The same record with another arrival time.
    ///
    /// ```
    /// # use std::time::{Duration, UNIX_EPOCH};
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// let then = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    /// let record = Record::new(LeaseKey::new("s", "shardId-000000000000"), "5".parse()?, "k", "x")
    ///     .with_arrival(then);
    /// assert_eq!(record.arrival(), then);
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn with_arrival(mut self, arrival: SystemTime) -> Self {
        self.fields().arrival = arrival;
        self
    }

    /// The stream and shard the record came from: the key of the shard's lease.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// let record = Record::new(key.clone(), "1".parse()?, "k", "x");
    /// assert_eq!(record.key(), &key);
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn key(&self) -> &LeaseKey {
        &self.inner().key
    }

    /// The stream's name (from `eventSourceARN`).
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.stream(), "orders");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn stream(&self) -> &str {
        self.inner().key.stream()
    }

    /// The shard id (from `eventID`).
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.shard(), "shardId-000000000000");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn shard(&self) -> &str {
        self.inner().key.shard()
    }

    /// The record's sequence number (an aggregate's, for a KPL sub-record).
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.sequence().as_str(), "1");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn sequence(&self) -> &SequenceNumber {
        &self.inner().sequence
    }

    /// The index of the sub-record within its KPL aggregate; `None` for a plain record.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.sub_sequence(), None);
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn sub_sequence(&self) -> Option<u64> {
        self.inner().sub_sequence
    }

    /// Where the record stands in its shard's extended order.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Position, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.position(), Position::record("1".parse()?));
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn position(&self) -> Position {
        Position::Record {
            sequence: self.inner().sequence.clone(),
            sub_sequence: self.inner().sub_sequence,
        }
    }

    /// The partition key the producer chose; records of one key are in order.
    ///
    /// A record that comes without a partition key has the empty key `""`: Kinesis may leave
    /// it out (the SDK's `Record::partition_key` is an `Option`, for on-demand streams), and
    /// Lambda's event then has no `partitionKey`, or a `null` one. No producer can write the
    /// empty key (`PutRecord` requires 1 to 256 characters), so it never mixes with a real
    /// one. Per-key logic treats it as one more key: under [`Processor::concurrency`] the
    /// records without a key run in order among themselves, in the
    /// [partition-key mode](crate::PartitionKeyMode) they share the row `stream:shard:` (the key
    /// after the last `:` is empty), and the parent gate reads that row for them.
    ///
    /// [`Processor::concurrency`]: crate::Processor::concurrency
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.partition_key(), "k");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn partition_key(&self) -> &str {
        self.inner().partition_key.as_str()
    }

    /// The partition key Kinesis routed the record by: its own, or for a KPL sub-record the
    /// aggregate's. Lambda keeps order per this key when `ParallelizationFactor` is above 1
    /// (it never sees inside an aggregate), so the partition-key mode checkpoints by it.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.routing_key(), "k");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn routing_key(&self) -> &str {
        self.inner()
            .routing_key
            .as_deref()
            .unwrap_or(self.inner().partition_key.as_str())
    }

    /// The same record as a sub-record of an aggregate routed by `routing_key` (the
    /// aggregate's [`routing_key`](Self::routing_key), one `Arc` for all its sub-records).
    pub(crate) fn routed_by(mut self, routing_key: &Arc<str>) -> Self {
        self.fields().routing_key = Some(Arc::clone(routing_key));
        self
    }

    /// The explicit hash key of a KPL sub-record, when the producer set one.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.explicit_hash_key(), None);
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn explicit_hash_key(&self) -> Option<&str> {
        self.inner().explicit_hash_key.as_deref()
    }

    /// The payload, decoded from the event's base64.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert_eq!(record.data(), b"x");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn data(&self) -> &[u8] {
        &self.inner().data
    }

    /// The payload as shared bytes, for keeping or forwarding without a copy.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// let payload = record.bytes().clone();
    /// assert_eq!(&payload[..], b"x");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn bytes(&self) -> &Bytes {
        &self.inner().data
    }

    /// When Kinesis accepted the record (`approximateArrivalTimestamp`), to the microsecond
    /// through [`Processor::service`](crate::Processor::service) (see
    /// [`LambdaKinesisEvent`]). From a [`KinesisEvent`] deserialized directly, only whole
    /// seconds are reliable: `aws_lambda_events` mis-reads the fraction.
    ///
    /// [`LambdaKinesisEvent`]: crate::event::LambdaKinesisEvent
    /// [`KinesisEvent`]: aws_lambda_events::event::kinesis::KinesisEvent
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// assert!(record.arrival() <= std::time::SystemTime::now());
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn arrival(&self) -> SystemTime {
        self.inner().arrival
    }

    /// The payload read as JSON.
    ///
    /// # Errors
    ///
    /// A payload that is not JSON of type `T`; the error names the stream, shard and sequence
    /// number.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "[1,2]");
    /// let numbers: Vec<u32> = record.json()?;
    /// assert_eq!(numbers, [1, 2]);
    /// assert!(record.json::<String>().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, PayloadError> {
        serde_json::from_slice(&self.inner().data).map_err(|source| PayloadError {
            key: self.inner().key.clone(),
            position: self.position(),
            source,
        })
    }
}

/// A payload that could not be read as the handler's JSON type: a poison record, since reading
/// it again will fail again.
#[derive(Debug, thiserror::Error)]
#[error("record {position} of stream '{}', shard '{}' is not the JSON the handler expects: {source}", key.stream(), key.shard())]
pub struct PayloadError {
    key: LeaseKey,
    position: Position,
    #[source]
    source: serde_json::Error,
}

/// Everything but the payload, which is shown by its length only: records are logged (in spans,
/// errors and dead letters), and a payload may hold personal or secret data that must never reach
/// a log.
///
/// ```
/// # use kinesis_checkpoint::{LeaseKey, Record};
/// let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "7".parse()?, "k", "card 4111");
/// let debug = format!("{record:?}");
/// assert!(debug.contains("9 bytes") && !debug.contains("4111"));
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("key", &self.inner().key)
            .field("sequence", &self.inner().sequence)
            .field("sub_sequence", &self.inner().sub_sequence)
            .field("partition_key", &self.partition_key())
            .field("routing_key", &self.inner().routing_key)
            .field("explicit_hash_key", &self.inner().explicit_hash_key)
            .field("data", &format_args!("<{} bytes>", self.inner().data.len()))
            .field("arrival", &self.inner().arrival)
            .finish()
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "record {} of stream '{}', shard '{}'",
            self.position(),
            self.stream(),
            self.shard()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

    #[test]
    fn a_payload_that_is_not_the_expected_json_names_its_record() {
        let record = Record::new(
            LeaseKey::new("orders", "shardId-000000000000"),
            SEQ.parse().unwrap(),
            "k",
            "not json",
        );
        let message = record.json::<serde_json::Value>().unwrap_err().to_string();
        assert!(message.contains(SEQ) && message.contains("shardId-000000000000"));
    }

    fn arrival(sequence: &str, data: &'static str) -> Arrived {
        Arrived {
            key: LeaseKey::new("orders", "shardId-000000000000"),
            sequence: sequence.parse().unwrap(),
            partition_key: "k".into(),
            data: Bytes::from_static(data.as_bytes()),
            arrival: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn the_records_of_one_event_share_a_block_and_keep_their_order_and_their_errors() {
        let read = Record::arrived_together(
            [Ok(arrival("1", "a")), Err("bad"), Ok(arrival("3", "c"))].into_iter(),
        )
        .expect_err("a record was not read");
        assert_eq!(read.len(), 3);
        let first = read[0].as_ref().unwrap();
        let third = read[2].as_ref().unwrap();
        assert_eq!((first.sequence().as_str(), first.data()), ("1", &b"a"[..]));
        assert_eq!((third.sequence().as_str(), third.data()), ("3", &b"c"[..]));
        assert_eq!(read[1].as_ref().unwrap_err(), &"bad");
        assert!(
            Arc::ptr_eq(&first.block, &third.block),
            "one block for the event"
        );
        assert_eq!(first.block.len(), 3, "a place for the record not read too");
    }

    #[test]
    fn a_record_of_a_shared_block_changed_by_a_builder_moves_to_its_own_and_leaves_the_others() {
        let read = Record::arrived_together(
            [Ok::<_, ()>(arrival("1", "a")), Ok(arrival("2", "b"))].into_iter(),
        )
        .expect("every record was read");
        let second = read[1].clone();
        let changed = second.clone().with_sub_sequence(4);
        assert_eq!(changed.position().to_string(), "2/4");
        assert_eq!(changed.data(), b"b");
        assert_eq!(changed.block.len(), 1, "a block of its own");
        assert_eq!(second.sub_sequence(), None, "the shared block is unchanged");
        assert_eq!(read[0].sub_sequence(), None);
        assert_ne!(changed, second);
        // Equal by their fields, not by their blocks.
        let alone = Record::arrived_together([Ok::<_, ()>(arrival("2", "b"))].into_iter());
        assert_eq!(alone.unwrap()[0], second);
    }
}
