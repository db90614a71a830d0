//! What goes wrong when an aggregate whose MD5 matches cannot be unpacked.
//!
//! Kept apart from the unpacking: the error is what a caller handles (it hands back the whole
//! record for the dead-letter queue), while the unpacking is how the format is read.

use crate::record::Record;

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
    pub(super) fn new(record: Record, kind: KplErrorKind) -> Self {
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
