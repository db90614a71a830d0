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

use std::ops::Range;
use std::sync::Arc;

use md5::{Digest, Md5};
use prost::Message;

use crate::record::Record;

/// The four bytes every KPL aggregate starts with.
///
/// ```
/// use kinesis_checkpoint::kpl::MAGIC;
///
/// assert_eq!(MAGIC, [0xF3, 0x89, 0x9A, 0xC2]);
/// ```
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];

/// Length of the MD5 digest that ends an aggregate.
const DIGEST_LEN: usize = 16;

/// The protobuf schema of an aggregate (`messages.proto` of the KPL), written out for `prost`
/// so that no build script or `protoc` is needed.
mod wire {
    use bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct AggregatedRecord {
        #[prost(string, repeated, tag = "1")]
        pub partition_key_table: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub explicit_hash_key_table: Vec<String>,
        #[prost(message, repeated, tag = "3")]
        pub records: Vec<Record>,
    }

    /// A user record inside the aggregate. The `required` fields are `Option`s here: `prost`
    /// would decode a missing one as 0 or empty, and a sub-record silently given the first
    /// partition key, or an empty payload, is worse than an error.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Record {
        #[prost(uint64, optional, tag = "1")]
        pub partition_key_index: Option<u64>,
        #[prost(uint64, optional, tag = "2")]
        pub explicit_hash_key_index: Option<u64>,
        // `Bytes` so that decoding from the record's `Bytes` slices instead of copying.
        #[prost(bytes = "bytes", optional, tag = "3")]
        pub data: Option<Bytes>,
        // Decoded so that a malformed tag makes the aggregate invalid, as it is by the schema,
        // but not exposed: the crate's `Record` has no tags, and producers rarely set them.
        #[prost(message, repeated, tag = "4")]
        pub tags: Vec<Tag>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Tag {
        #[prost(string, optional, tag = "1")]
        pub key: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub value: Option<String>,
    }
}

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

/// An aggregate whose magic and MD5 are valid but whose content cannot be unpacked.
///
/// The MD5 shows that the producer wrote these very bytes, so retrying cannot help: the record
/// is poison. [`KplError::into_record`] gives it back whole, to dead-letter with its payload.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::kpl::{KplErrorKind, MAGIC, deaggregate};
/// use kinesis_checkpoint::{LeaseKey, Record};
/// use md5::{Digest, Md5};
///
/// // A protobuf message cut short: field 3 (`records`) announces 9 bytes and has 2.
/// let body = [0x1a, 0x09, 0x08, 0x00];
/// let data = [&MAGIC[..], &body, &Md5::digest(body)].concat();
/// let record = Record::new(LeaseKey::new("orders", "shardId-000000000003"), "42".parse()?, "k", data);
///
/// let error = deaggregate(record.clone()).unwrap_err();
/// assert!(matches!(error.kind(), KplErrorKind::Protobuf(_)));
/// assert!(error.to_string().contains("record 42 of stream 'orders', shard 'shardId-000000000003'"));
/// assert_eq!(error.into_record(), record);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "KPL aggregate {record} cannot be de-aggregated: {kind}; its MD5 matches, so the producer \
     wrote it this way and retrying will not help: dead-letter the record whole and check the \
     producer's aggregation"
)]
pub struct KplError {
    // Boxed: a `Record` is large enough that an unboxed one would make every `Result` of
    // `deaggregate` as big as the error.
    record: Box<Record>,
    kind: KplErrorKind,
}

impl KplError {
    fn new(record: Record, kind: KplErrorKind) -> Self {
        Self {
            record: Box::new(record),
            kind,
        }
    }

    /// The aggregate as it arrived.
    ///
    /// ```
    /// # use kinesis_checkpoint::kpl::{MAGIC, deaggregate};
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # use md5::{Digest, Md5};
    /// # let body = [0x1a, 0x09, 0x08, 0x00];
    /// # let data = [&MAGIC[..], &body, &Md5::digest(body)].concat();
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000003"), "42".parse()?, "k", data);
    /// let error = deaggregate(record).unwrap_err();
    /// assert_eq!(error.record().sequence().as_str(), "42");
    /// assert_eq!(error.record().sub_sequence(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// The aggregate as it arrived, to dead-letter whole.
    ///
    /// ```
    /// # use kinesis_checkpoint::kpl::{MAGIC, deaggregate};
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # use md5::{Digest, Md5};
    /// # let body = [0x1a, 0x09, 0x08, 0x00];
    /// # let data = [&MAGIC[..], &body, &Md5::digest(body)].concat();
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000003"), "42".parse()?, "k", data);
    /// let error = deaggregate(record.clone()).unwrap_err();
    /// assert_eq!(error.into_record(), record);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn into_record(self) -> Record {
        *self.record
    }

    /// What is wrong with the aggregate.
    ///
    /// ```
    /// # use kinesis_checkpoint::kpl::{KplErrorKind, MAGIC, deaggregate};
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # use md5::{Digest, Md5};
    /// // A partition key table and no records.
    /// let body = [0x0a, 0x01, b'k'];
    /// let data = [&MAGIC[..], &body, &Md5::digest(body)].concat();
    /// let record = Record::new(LeaseKey::new("orders", "shardId-000000000003"), "42".parse()?, "k", data);
    /// assert_eq!(deaggregate(record).unwrap_err().kind(), &KplErrorKind::NoRecords);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub const fn kind(&self) -> &KplErrorKind {
        &self.kind
    }
}

/// Why a checksummed aggregate cannot be unpacked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KplErrorKind {
    /// The bytes between the magic and the digest are not an `AggregatedRecord` protobuf
    /// message: truncated, or not protobuf at all.
    #[error("its protobuf message is truncated or invalid ({0})")]
    Protobuf(String),
    /// The message holds no sub-records, so there is nothing to hand the handler and nothing
    /// to checkpoint inside.
    #[error("it holds no sub-records")]
    NoRecords,
    /// A sub-record lacks a field the format requires.
    #[error("sub-record {sub_record} has no {field}")]
    MissingField {
        /// The sub-record's index in the aggregate (its sub-sequence number).
        sub_record: u64,
        /// The missing field: `partition_key_index` or `data`.
        field: &'static str,
    },
    /// A sub-record names a partition key past the end of the aggregate's table.
    #[error(
        "sub-record {sub_record} names partition key {index} of a table of {table_len} partition keys"
    )]
    PartitionKeyIndex {
        /// The sub-record's index in the aggregate (its sub-sequence number).
        sub_record: u64,
        /// The index it names.
        index: u64,
        /// How many partition keys the table holds.
        table_len: usize,
    },
    /// A sub-record names an explicit hash key past the end of the aggregate's table.
    #[error(
        "sub-record {sub_record} names explicit hash key {index} of a table of {table_len} explicit hash keys"
    )]
    ExplicitHashKeyIndex {
        /// The sub-record's index in the aggregate (its sub-sequence number).
        sub_record: u64,
        /// The index it names.
        index: u64,
        /// How many explicit hash keys the table holds.
        table_len: usize,
    },
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
    checked_message(data).is_some()
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
    let Some(message) = checked_message(record.data()) else {
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

/// Where the protobuf message lies in `data`, when `data` is an aggregate.
fn checked_message(data: &[u8]) -> Option<Range<usize>> {
    let rest = data.strip_prefix(&MAGIC)?;
    // As in `aws-kinesis-agg`, an empty message is not an aggregate: magic and digest alone
    // are too short to be one.
    let message_len = rest.len().checked_sub(DIGEST_LEN).filter(|&len| len > 0)?;
    let (message, digest) = rest.split_at(message_len);
    (Md5::digest(message).as_slice() == digest).then_some(MAGIC.len()..MAGIC.len() + message_len)
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
            .routed_as(outer)
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::key::LeaseKey;

    const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

    /// `message` framed as an aggregate: magic, protobuf, MD5.
    fn frame(message: &wire::AggregatedRecord) -> Bytes {
        let body = message.encode_to_vec();
        [&MAGIC[..], &body, &Md5::digest(&body)].concat().into()
    }

    fn outer(data: Bytes) -> Record {
        Record::new(
            LeaseKey::new("orders", "shardId-000000000007"),
            SEQ.parse().unwrap(),
            "outer-key",
            data,
        )
        .with_arrival(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
    }

    fn sub(partition_key_index: u64, data: &'static [u8]) -> wire::Record {
        wire::Record {
            partition_key_index: Some(partition_key_index),
            explicit_hash_key_index: None,
            data: Some(Bytes::from_static(data)),
            tags: Vec::new(),
        }
    }

    fn aggregate(keys: &[&str], records: Vec<wire::Record>) -> wire::AggregatedRecord {
        wire::AggregatedRecord {
            partition_key_table: keys.iter().map(ToString::to_string).collect(),
            explicit_hash_key_table: Vec::new(),
            records,
        }
    }

    fn error_kind(message: &wire::AggregatedRecord) -> KplErrorKind {
        deaggregate(outer(frame(message)))
            .expect_err("a broken aggregate")
            .kind()
            .clone()
    }

    #[test]
    fn sub_record_payloads_are_slices_of_the_aggregate_not_copies() {
        let data = frame(&aggregate(
            &["k"],
            vec![sub(0, b"first"), sub(0, b"second")],
        ));
        let span = data.as_ptr_range();
        let records = deaggregate(outer(data.clone())).unwrap().into_records();
        for record in &records {
            let payload = record.data().as_ptr_range();
            assert!(span.start <= payload.start && payload.end <= span.end);
        }
        assert_eq!(records[1].data(), b"second");
    }

    #[test]
    fn sub_records_of_one_partition_key_share_its_string() {
        let data = frame(&aggregate(&["k"], vec![sub(0, b"a"), sub(0, b"b")]));
        let records = deaggregate(outer(data)).unwrap().into_records();
        assert!(std::ptr::eq(
            records[0].partition_key(),
            records[1].partition_key()
        ));
    }

    #[test]
    fn a_missing_required_field_is_an_error_not_a_default() {
        let mut no_key = sub(0, b"x");
        no_key.partition_key_index = None;
        assert_eq!(
            error_kind(&aggregate(&["k"], vec![sub(0, b"ok"), no_key])),
            KplErrorKind::MissingField {
                sub_record: 1,
                field: "partition_key_index"
            }
        );
        let mut no_data = sub(0, b"x");
        no_data.data = None;
        assert_eq!(
            error_kind(&aggregate(&["k"], vec![no_data])),
            KplErrorKind::MissingField {
                sub_record: 0,
                field: "data"
            }
        );
    }

    #[test]
    fn an_index_past_its_table_names_the_sub_record_the_index_and_the_table() {
        assert_eq!(
            error_kind(&aggregate(&["a", "b"], vec![sub(1, b"x"), sub(2, b"y")])),
            KplErrorKind::PartitionKeyIndex {
                sub_record: 1,
                index: 2,
                table_len: 2
            }
        );
        assert_eq!(
            error_kind(&aggregate(&["a"], vec![sub(u64::MAX, b"x")])),
            KplErrorKind::PartitionKeyIndex {
                sub_record: 0,
                index: u64::MAX,
                table_len: 1
            }
        );
        let mut hashed = sub(0, b"x");
        hashed.explicit_hash_key_index = Some(0);
        assert_eq!(
            error_kind(&aggregate(&["a"], vec![hashed])),
            KplErrorKind::ExplicitHashKeyIndex {
                sub_record: 0,
                index: 0,
                table_len: 0
            }
        );
    }

    #[test]
    fn an_aggregate_without_sub_records_is_an_error_not_an_empty_batch() {
        assert_eq!(
            error_kind(&aggregate(&["lonely"], Vec::new())),
            KplErrorKind::NoRecords
        );
    }

    #[test]
    fn the_error_names_stream_shard_sequence_and_what_is_wrong() {
        let message = deaggregate(outer(frame(&aggregate(&["a"], vec![sub(3, b"x")]))))
            .unwrap_err()
            .to_string();
        for part in [
            "stream 'orders'",
            "shard 'shardId-000000000007'",
            SEQ,
            "sub-record 0 names partition key 3 of a table of 1",
            "dead-letter",
        ] {
            assert!(message.contains(part), "{part:?} missing from: {message}");
        }
    }

    #[test]
    fn exactly_the_magic_and_a_digest_is_too_short_to_be_an_aggregate() {
        let data = Bytes::from([&MAGIC[..], &Md5::digest(b"")].concat());
        assert!(!is_aggregate(&data));
        let record = outer(data);
        assert_eq!(
            deaggregate(record.clone()).unwrap(),
            Deaggregated::Plain(record)
        );
        assert!(!is_aggregate(&MAGIC));
        assert!(!is_aggregate(&[]));
    }

    #[test]
    fn a_sub_record_is_not_de_aggregated_again() {
        let inner = frame(&aggregate(&["k"], vec![sub(0, b"x")]));
        let nested = frame(&wire::AggregatedRecord {
            partition_key_table: vec!["k".into()],
            explicit_hash_key_table: Vec::new(),
            records: vec![wire::Record {
                data: Some(inner.clone()),
                ..sub(0, b"")
            }],
        });
        let once = deaggregate(outer(nested)).unwrap().into_records();
        assert_eq!(once[0].data(), &inner[..]);
        let again = deaggregate(once[0].clone()).unwrap();
        assert_eq!(again, Deaggregated::Plain(once[0].clone()));
    }

    #[test]
    fn tags_are_read_and_do_not_change_the_sub_record() {
        let mut tagged = sub(0, b"x");
        tagged.tags = vec![
            wire::Tag {
                key: Some("team".into()),
                value: Some("payments".into()),
            },
            wire::Tag {
                key: Some("bare".into()),
                value: None,
            },
        ];
        let records = deaggregate(outer(frame(&aggregate(&["k"], vec![tagged]))))
            .unwrap()
            .into_records();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].data(), b"x");
    }

    /// A generated user record: partition key, optional explicit hash key, payload.
    type UserRecord = (String, Option<String>, Vec<u8>);

    /// Packs user records the way the KPL does: each distinct key once in its table.
    fn pack(user_records: &[UserRecord]) -> wire::AggregatedRecord {
        fn index_of(table: &mut Vec<String>, key: &str) -> u64 {
            let index = table
                .iter()
                .position(|known| known == key)
                .unwrap_or_else(|| {
                    table.push(key.to_owned());
                    table.len() - 1
                });
            u64::try_from(index).unwrap()
        }
        let mut message = wire::AggregatedRecord::default();
        for (partition_key, hash_key, data) in user_records {
            let partition_key_index = index_of(&mut message.partition_key_table, partition_key);
            let explicit_hash_key_index = hash_key
                .as_deref()
                .map(|key| index_of(&mut message.explicit_hash_key_table, key));
            message.records.push(wire::Record {
                partition_key_index: Some(partition_key_index),
                explicit_hash_key_index,
                data: Some(Bytes::from(data.clone())),
                tags: Vec::new(),
            });
        }
        message
    }

    fn user_records() -> impl Strategy<Value = Vec<UserRecord>> {
        // Few distinct keys, so that tables are shared and indexes repeat.
        let partition_key = prop_oneof![Just(String::from("order-1")), "\\PC{0,12}"];
        let hash_key = proptest::option::of(prop_oneof![Just(String::from("0")), "[0-9]{1,39}"]);
        let data = proptest::collection::vec(any::<u8>(), 0..300);
        proptest::collection::vec((partition_key, hash_key, data), 1..40)
    }

    proptest! {
        #[test]
        fn a_random_aggregate_yields_exactly_its_user_records(user_records in user_records()) {
            let record = outer(frame(&pack(&user_records)));
            let Deaggregated::SubRecords(records) = deaggregate(record.clone()).unwrap() else {
                panic!("a packed aggregate passed through");
            };
            prop_assert_eq!(records.len(), user_records.len());
            for ((sub_record, record_out), (partition_key, hash_key, data)) in
                (0_u64..).zip(&records).zip(&user_records)
            {
                prop_assert_eq!(record_out.key(), record.key());
                prop_assert_eq!(record_out.sequence(), record.sequence());
                prop_assert_eq!(record_out.arrival(), record.arrival());
                prop_assert_eq!(record_out.sub_sequence(), Some(sub_record));
                prop_assert_eq!(record_out.partition_key(), partition_key.as_str());
                prop_assert_eq!(record_out.explicit_hash_key(), hash_key.as_deref());
                prop_assert_eq!(record_out.data(), data.as_slice());
            }
        }

        #[test]
        fn a_message_with_any_indexes_and_gaps_fails_at_its_first_broken_sub_record(
            message in loose_messages()
        ) {
            let result = deaggregate(outer(frame(&message)));
            match (result, first_defect(&message)) {
                (Ok(Deaggregated::SubRecords(records)), None) => {
                    prop_assert_eq!(records.len(), message.records.len());
                }
                (Err(error), Some(defect)) => prop_assert_eq!(error.kind(), &defect),
                // Nothing at all between magic and digest is too short to be an aggregate.
                (Ok(Deaggregated::Plain(_)), Some(KplErrorKind::NoRecords))
                    if message.encoded_len() == 0 => {}
                (result, defect) => prop_assert!(false, "{result:?} where {defect:?} was due"),
            }
        }
    }

    /// Messages that are valid protobuf but need not be valid aggregates: short tables, indexes
    /// past them, missing fields, no records at all.
    fn loose_messages() -> impl Strategy<Value = wire::AggregatedRecord> {
        let table = proptest::collection::vec("[a-z]{1,3}", 0..3);
        let index = proptest::option::weighted(0.9, 0_u64..4);
        let data = proptest::option::weighted(0.9, proptest::collection::vec(any::<u8>(), 0..8));
        let sub_record = (index.clone(), proptest::option::of(0_u64..4), data).prop_map(
            |(partition_key_index, explicit_hash_key_index, data)| wire::Record {
                partition_key_index,
                explicit_hash_key_index,
                data: data.map(Bytes::from),
                tags: Vec::new(),
            },
        );
        (
            table.clone(),
            table,
            proptest::collection::vec(sub_record, 0..6),
        )
            .prop_map(|(partition_key_table, explicit_hash_key_table, records)| {
                wire::AggregatedRecord {
                    partition_key_table,
                    explicit_hash_key_table,
                    records,
                }
            })
    }

    /// What the format says is wrong with `message`, checking sub-records in order; `None`
    /// when it is a valid aggregate.
    fn first_defect(message: &wire::AggregatedRecord) -> Option<KplErrorKind> {
        if message.records.is_empty() {
            return Some(KplErrorKind::NoRecords);
        }
        let within = |index: u64, table: &[String]| usize::try_from(index).unwrap() < table.len();
        message
            .records
            .iter()
            .zip(0_u64..)
            .find_map(|(sub, sub_record)| {
                let missing = |field| Some(KplErrorKind::MissingField { sub_record, field });
                let Some(index) = sub.partition_key_index else {
                    return missing("partition_key_index");
                };
                if !within(index, &message.partition_key_table) {
                    return Some(KplErrorKind::PartitionKeyIndex {
                        sub_record,
                        index,
                        table_len: message.partition_key_table.len(),
                    });
                }
                if sub.data.is_none() {
                    return missing("data");
                }
                let index = sub.explicit_hash_key_index?;
                (!within(index, &message.explicit_hash_key_table)).then_some(
                    KplErrorKind::ExplicitHashKeyIndex {
                        sub_record,
                        index,
                        table_len: message.explicit_hash_key_table.len(),
                    },
                )
            })
    }
}
