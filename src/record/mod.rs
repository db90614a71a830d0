//! The record a handler sees: where it came from, where it stands in its shard, and its payload.
//!
//! A [`Record`] is built from Lambda's event (see [`event`](crate::event)), from a KPL aggregate's
//! sub-records (see [`kpl`](crate::kpl)), by local sources and by tests; it knows none of those
//! modules, so that each source depends on it and not the reverse. Its fields are held one of
//! two ways, which only this module sees: where Lambda's event holds them
//! ([`in_event`], one shard's plain records, the usual batch), or on their own
//! ([`fields`], every other source). Cloning one is cheap, and its `Debug` never shows the
//! payload.

mod fields;
mod in_event;

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use aws_lambda_events::event::kinesis::KinesisEventRecord;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::key::LeaseKey;
use crate::sequence::{Position, SequenceNumber};

pub(crate) use fields::Arrived;
use fields::{Fields, PartitionKey, Slot};
pub(crate) use in_event::EventHold;
use in_event::InEvent;

/// One Kinesis record, as the handler receives it.
///
/// Cloning is cheap (one shared reference), so a handler may keep a record past its call. The
/// records of one event (of a large one, each 64 read together) share their memory, payloads
/// included, freed with the last of them: to keep a payload for longer than the batch, keep
/// its [`bytes`](Self::bytes) (which hold that payload only), not the record.
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
    /// What holds the record's fields, shared by its clones: dispatch hands the handler a
    /// clone and keeps the record for its report and dead letter, and a clone of one `Arc`
    /// costs one count where a clone of each field cost five.
    held: Held,
    /// The record's place in what `held` holds.
    index: usize,
}

/// What holds a record's fields.
#[derive(Clone)]
enum Held {
    /// A block of fields: the records read together share one (see
    /// [`Record::arrived_together`]); a block per record was, with its allocation and its
    /// release, a fifth of what the processor adds to a bare loop (the `processor` bench).
    /// A record built alone has a block of its own.
    Fields(Arc<[Slot]>),
    /// Lambda's event itself, for one shard's plain records (see [`Record::in_event`]).
    InEvent(Arc<InEvent>),
}

/// A record's fields, wherever they are held.
enum At<'a> {
    Fields(&'a Fields),
    InEvent(&'a InEvent, usize),
}

/// Equal by what each says of itself, wherever each is held.
impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
            && self.sequence() == other.sequence()
            && self.sub_sequence() == other.sub_sequence()
            && self.partition_key() == other.partition_key()
            && self.routing_key() == other.routing_key()
            && self.explicit_hash_key() == other.explicit_hash_key()
            && self.data() == other.data()
            && self.arrival() == other.arrival()
    }
}

impl Eq for Record {}

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
            held: Held::Fields(Arc::clone(&block)),
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

    /// The records of one event of `key`'s shard, where the event holds them: `records`, each
    /// with the sequence number of the same index in `sequences`; `None`, and the records
    /// dropped, when the two are not as long as each other. The caller has checked that every
    /// record is of `key`'s shard. No field is copied, and the records are freed together,
    /// with the last of them.
    pub(crate) fn in_event(
        key: LeaseKey,
        records: Vec<KinesisEventRecord>,
        sequences: Vec<SequenceNumber>,
    ) -> Option<Vec<Self>> {
        let event = Arc::new(InEvent::new(key, records, sequences)?);
        Some(
            (0..event.len())
                .map(|index| Self {
                    held: Held::InEvent(Arc::clone(&event)),
                    index,
                })
                .collect(),
        )
    }

    /// A hold on the event this record is held in, if it is one of [`in_event`](Self::in_event)'s.
    pub(crate) fn event_hold(&self) -> EventHold {
        match &self.held {
            Held::InEvent(event) => EventHold::new(Arc::clone(event)),
            Held::Fields(_) => EventHold::default(),
        }
    }

    /// Whether the record is held where Lambda's event holds it.
    #[cfg(test)]
    pub(crate) fn is_held_in_event(&self) -> bool {
        matches!(self.held, Held::InEvent(_))
    }

    fn with_fields(fields: Fields) -> Self {
        Self {
            held: Held::Fields(Arc::from([Some(fields)])),
            index: 0,
        }
    }

    /// The record's fields, wherever they are held.
    fn at(&self) -> At<'_> {
        match &self.held {
            Held::Fields(block) => {
                At::Fields(block[self.index].as_ref().unwrap_or_else(|| {
                    unreachable!("a record points only at a slot that holds one")
                }))
            }
            Held::InEvent(event) => At::InEvent(event, self.index),
        }
    }

    /// The record's fields on their own, copied out of the event for a record held there.
    fn to_fields(&self) -> Fields {
        match self.at() {
            At::Fields(fields) => fields.clone(),
            At::InEvent(event, index) => Fields::from(Arrived {
                key: event.key().clone(),
                sequence: event.sequence(index).clone(),
                partition_key: event.partition_key(index).into(),
                data: Bytes::copy_from_slice(event.data(index)),
                arrival: event.arrival(index),
            }),
        }
    }

    /// The fields to change, for the builders: a record built alone is not shared yet, so
    /// nothing is copied; one of a shared block, or of an event, is moved to a block of its own
    /// first.
    fn fields(&mut self) -> &mut Fields {
        let own = match &mut self.held {
            Held::Fields(block) => Arc::get_mut(block).is_some(),
            Held::InEvent(_) => false,
        };
        if !own {
            *self = Self::with_fields(self.to_fields());
        }
        match &mut self.held {
            Held::Fields(block) => Arc::get_mut(block).and_then(|block| block[self.index].as_mut()),
            Held::InEvent(_) => None,
        }
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
        match self.at() {
            At::Fields(fields) => &fields.key,
            At::InEvent(event, _) => event.key(),
        }
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
        self.key().stream()
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
        self.key().shard()
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
        match self.at() {
            At::Fields(fields) => &fields.sequence,
            At::InEvent(event, index) => event.sequence(index),
        }
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
        match self.at() {
            At::Fields(fields) => fields.sub_sequence,
            // An event's own record, not a KPL sub-record.
            At::InEvent(..) => None,
        }
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
            sequence: self.sequence().clone(),
            sub_sequence: self.sub_sequence(),
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
        match self.at() {
            At::Fields(fields) => fields.partition_key.as_str(),
            At::InEvent(event, index) => event.partition_key(index),
        }
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
        match self.at() {
            At::Fields(fields) => fields
                .routing_key
                .as_deref()
                .unwrap_or(fields.partition_key.as_str()),
            At::InEvent(event, index) => event.partition_key(index),
        }
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
        match self.at() {
            At::Fields(fields) => fields.explicit_hash_key.as_deref(),
            At::InEvent(..) => None,
        }
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
        match self.at() {
            At::Fields(fields) => &fields.data,
            At::InEvent(event, index) => event.data(index),
        }
    }

    /// The payload as bytes of its own, to keep or forward past the batch: they hold this
    /// payload only, never the rest of the batch. A record read from Lambda's usual event (one
    /// shard's plain records) is held where the event holds it, so its payload is copied here,
    /// once per call; any other record's is shared, with no copy. To read the payload, use
    /// [`data`](Self::data), which never copies.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "1".parse()?, "k", "x");
    /// let payload: bytes::Bytes = record.bytes();
    /// drop(record);
    /// assert_eq!(&payload[..], b"x");
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn bytes(&self) -> Bytes {
        match self.at() {
            At::Fields(fields) => fields.data.clone(),
            At::InEvent(event, index) => Bytes::copy_from_slice(event.data(index)),
        }
    }

    /// When Kinesis accepted the record (`approximateArrivalTimestamp`), to the microsecond
    /// through [`Processor::service`](crate::Processor::service) (see
    /// [`InvocationEvent`]) or from a [`LambdaKinesisEvent`]. From a [`KinesisEvent`]
    /// deserialized directly, only whole seconds are reliable: `aws_lambda_events` mis-reads
    /// the fraction.
    ///
    /// [`InvocationEvent`]: crate::event::InvocationEvent
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
        match self.at() {
            At::Fields(fields) => fields.arrival,
            At::InEvent(event, index) => event.arrival(index),
        }
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
        serde_json::from_slice(self.data()).map_err(|source| PayloadError {
            key: self.key().clone(),
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
            .field("key", self.key())
            .field("sequence", self.sequence())
            .field("sub_sequence", &self.sub_sequence())
            .field("partition_key", &self.partition_key())
            .field("routing_key", &self.routing_key())
            .field("explicit_hash_key", &self.explicit_hash_key())
            .field("data", &format_args!("<{} bytes>", self.data().len()))
            .field("arrival", &self.arrival())
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
mod tests;
