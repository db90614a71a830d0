//! De-aggregation of records that the Kinesis Producer Library (KPL) packed together.
//!
//! To save on put requests and shard throughput, the KPL (and its ports, such as
//! `aws-kinesis-agg`) packs many user records into one Kinesis record. Lambda delivers that
//! aggregate as a single record, so a handler that expects one JSON order per record would see
//! protobuf instead. [`deaggregate`] unpacks it where the processor can still give every user
//! record its own place in the shard: the sub-records share the aggregate's sequence number
//! and are told apart by their sub-sequence number (their index in the aggregate), which is the
//! [`Position`](crate::Position) a checkpoint can stop inside.
//!
//! The format is `F3 89 9A C2` (the magic), a protobuf `AggregatedRecord`, then the 16-byte MD5
//! of the protobuf bytes. An ordinary payload may begin with the magic by chance, so, as in
//! AWS's own de-aggregators, only a matching MD5 makes a record an aggregate; anything else
//! passes through unchanged. Once the MD5 matches, the producer vouched for those exact bytes:
//! if they do not decode, they never will. The result is then a [`KplError`] that hands back
//! the whole record for the dead-letter queue, rather than protobuf given to the handler as if
//! it were a payload, or user records silently lost.
//!
//! The files: `wire.rs` holds the format's bytes (magic, schema, MD5), `error.rs` the
//! [`KplError`] of an aggregate that cannot be unpacked, and this one what an aggregate means
//! as records; `tests.rs` builds aggregates from the schema to test them.

use std::sync::Arc;

use prost::Message;

use crate::record::Record;

mod error;
#[cfg(test)]
mod tests;
mod wire;

pub use error::{KplError, KplErrorKind};
pub use wire::MAGIC;

/// What [`deaggregate`] made of a record.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::kpl::{Deaggregated, deaggregate};
/// use kinesis_checkpoint::{LeaseKey, Record};
///
/// let plain = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "7".parse()?, "k", "{}");
/// match deaggregate(plain)? {
///     Deaggregated::Plain(record) => assert_eq!(record.data(), b"{}"),
///     Deaggregated::SubRecords(_) => unreachable!("no magic, no aggregate"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Deaggregated {
    /// Not an aggregate (no magic, too short, or an MD5 that does not match): the record exactly
    /// as it came.
    Plain(Record),
    /// The aggregate's user records in order, sub-sequence 0, 1, …; never empty.
    SubRecords(Vec<Record>),
}

impl Deaggregated {
    /// The records to process: the plain record alone, or every sub-record.
    ///
    /// ```
    /// # use kinesis_checkpoint::kpl::deaggregate;
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "7".parse()?, "k", "{}");
    /// let records = deaggregate(record.clone())?.into_records();
    /// assert_eq!(records, [record]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn into_records(self) -> Vec<Record> {
        match self {
            Self::Plain(record) => vec![record],
            Self::SubRecords(records) => records,
        }
    }

    /// Whether the record was an aggregate.
    ///
    /// ```
    /// # use kinesis_checkpoint::kpl::deaggregate;
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "7".parse()?, "k", "{}");
    /// assert!(!deaggregate(record)?.is_aggregate());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn is_aggregate(&self) -> bool {
        matches!(self, Self::SubRecords(_))
    }
}

/// Iterates over [`Deaggregated::into_records`].
impl IntoIterator for Deaggregated {
    type Item = Record;
    type IntoIter = std::vec::IntoIter<Record>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_records().into_iter()
    }
}

/// Whether `data` is a KPL aggregate: the magic, a non-empty message, and an MD5 that matches.
///
/// It reads nothing else, so a `true` does not promise that [`deaggregate`] succeeds. The cost
/// is one MD5 over the payload.
///
/// ```
/// use kinesis_checkpoint::kpl::is_aggregate;
///
/// // Two sub-records, as `aws-kinesis-agg` packs them.
/// let aggregate = b"\xf3\x89\x9a\xc2\n\x07order-1\n\x07order-2\x1a\x0b\x08\x00\x1a\x07{\"n\":1}\
///     \x1a\x0b\x08\x01\x1a\x07{\"n\":2}\xcd\x88\xf1\xbf\x62\xbc\x27\x8c\x33\xbd\x84\x6c\xa6\x0d\x2a\xba";
/// assert!(is_aggregate(aggregate));
///
/// let mut corrupted = aggregate.to_vec();
/// corrupted[10] ^= 1;
/// assert!(!is_aggregate(&corrupted));
/// assert!(!is_aggregate(br#"{"order_id":"17"}"#));
/// ```
#[must_use]
pub fn is_aggregate(data: &[u8]) -> bool {
    wire::checked_message(data).is_some()
}

/// Unpacks a KPL aggregate into its user records, or passes any other record through.
///
/// Each sub-record keeps the aggregate's stream, shard, sequence number and arrival time, and
/// gets its index as sub-sequence number, its own partition key, its explicit hash key when it
/// has one, and its payload (a slice of the aggregate's, not a copy). A record that is already
/// a sub-record passes through: the KPL never nests aggregates.
///
/// # Errors
///
/// A [`KplError`] when the magic and MD5 are valid but the message does not decode, holds no
/// sub-records, or a sub-record lacks a required field or names a key outside its table. The
/// error names the stream, shard and sequence number and holds the record.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::kpl::{Deaggregated, deaggregate};
/// use kinesis_checkpoint::{LeaseKey, Record};
///
/// // Two sub-records, as `aws-kinesis-agg` packs them.
/// let aggregate = b"\xf3\x89\x9a\xc2\n\x07order-1\n\x07order-2\x1a\x0b\x08\x00\x1a\x07{\"n\":1}\
///     \x1a\x0b\x08\x01\x1a\x07{\"n\":2}\xcd\x88\xf1\xbf\x62\xbc\x27\x8c\x33\xbd\x84\x6c\xa6\x0d\x2a\xba";
/// let record = Record::new(
///     LeaseKey::new("orders", "shardId-000000000000"),
///     "49590338271490256608559692538361571095921575989136588898".parse()?,
///     "order-1",
///     &aggregate[..],
/// );
///
/// let Deaggregated::SubRecords(orders) = deaggregate(record)? else { unreachable!() };
/// assert_eq!(orders.len(), 2);
/// assert_eq!(orders[1].partition_key(), "order-2");
/// assert_eq!(orders[1].data(), br#"{"n":2}"#);
/// assert_eq!(
///     orders[1].position().to_string(),
///     "49590338271490256608559692538361571095921575989136588898/1"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn deaggregate(record: Record) -> Result<Deaggregated, KplError> {
    if record.sub_sequence().is_some() {
        return Ok(Deaggregated::Plain(record));
    }
    let Some(message) = wire::checked_message(record.data()) else {
        return Ok(Deaggregated::Plain(record));
    };
    let decoded = match wire::AggregatedRecord::decode(record.bytes().slice(message)) {
        Ok(decoded) => decoded,
        Err(error) => {
            return Err(KplError::new(
                record,
                KplErrorKind::Protobuf(error.to_string()),
            ));
        }
    };
    match sub_records(&record, decoded) {
        Ok(records) => Ok(Deaggregated::SubRecords(records)),
        Err(kind) => Err(KplError::new(record, kind)),
    }
}

fn sub_records(
    outer: &Record,
    aggregate: wire::AggregatedRecord,
) -> Result<Vec<Record>, KplErrorKind> {
    if aggregate.records.is_empty() {
        return Err(KplErrorKind::NoRecords);
    }
    // One shared string per key, however many sub-records name it.
    let partition_keys: Vec<Arc<str>> = aggregate
        .partition_key_table
        .into_iter()
        .map(Arc::from)
        .collect();
    let hash_keys: Vec<Arc<str>> = aggregate
        .explicit_hash_key_table
        .into_iter()
        .map(Arc::from)
        .collect();
    let routing_key: Arc<str> = Arc::from(outer.routing_key());
    aggregate
        .records
        .into_iter()
        .zip(0_u64..)
        .map(|(sub, sub_record)| {
            let missing = |field| KplErrorKind::MissingField { sub_record, field };
            let index = sub
                .partition_key_index
                .ok_or_else(|| missing("partition_key_index"))?;
            let partition_key =
                lookup(&partition_keys, index).ok_or(KplErrorKind::PartitionKeyIndex {
                    sub_record,
                    index,
                    table_len: partition_keys.len(),
                })?;
            let data = sub.data.ok_or_else(|| missing("data"))?;
            let record = Record::new(
                outer.key().clone(),
                outer.sequence().clone(),
                partition_key,
                data,
            )
            .with_sub_sequence(sub_record)
            .routed_by(&routing_key)
            .with_arrival(outer.arrival());
            let Some(index) = sub.explicit_hash_key_index else {
                return Ok(record);
            };
            let hash_key = lookup(&hash_keys, index).ok_or(KplErrorKind::ExplicitHashKeyIndex {
                sub_record,
                index,
                table_len: hash_keys.len(),
            })?;
            Ok(record.with_explicit_hash_key(hash_key))
        })
        .collect()
}

fn lookup(table: &[Arc<str>], index: u64) -> Option<Arc<str>> {
    usize::try_from(index)
        .ok()
        .and_then(|index| table.get(index))
        .cloned()
}
