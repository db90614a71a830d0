//! A record's fields held on their own, in a block shared by the records read together: what
//! a KPL sub-record, a local source, a test, and an event that is not read in place (records
//! of several shards, one that cannot be read, KPL aggregates, a large event's chunks) build.
//!
//! Lambda's usual event, one shard's plain records, is not copied into fields: its records are
//! read where they lie (see [`InEvent`](super::in_event::InEvent)).

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

use crate::key::LeaseKey;
use crate::sequence::SequenceNumber;

/// What [`Record::arrived_together`](super::Record::arrived_together) takes of each record of Lambda's event, with the arrival
/// time the event gives: the clock is not read for every record of a batch, as
/// [`Record::new`](super::Record::new) would.
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

/// A record's fields, each held by the record (or shared with the records of its aggregate).
#[derive(Clone)]
pub(super) struct Fields {
    pub(super) key: LeaseKey,
    pub(super) sequence: SequenceNumber,
    pub(super) sub_sequence: Option<u64>,
    pub(super) partition_key: PartitionKey,
    /// The partition key Kinesis routed the record by, when it is not `partition_key`: the
    /// aggregate's own, for a KPL sub-record.
    pub(super) routing_key: Option<Arc<str>>,
    pub(super) explicit_hash_key: Option<Arc<str>>,
    pub(super) data: Bytes,
    pub(super) arrival: SystemTime,
}

/// A partition key: the event's own string, taken from it as it is (no block is allocated for
/// it), or one shared by many records (a KPL aggregate's key table, a caller's `Arc`).
#[derive(Clone)]
pub(super) enum PartitionKey {
    Owned(Box<str>),
    Shared(Arc<str>),
}

impl PartitionKey {
    pub(super) fn as_str(&self) -> &str {
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

/// One place of a block: a record's fields, or `None` for a record of the event that could
/// not be read (no [`Record`](super::Record) points at it).
pub(super) type Slot = Option<Fields>;
