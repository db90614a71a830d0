//! The records of one event of one shard, held where Lambda's event holds them.
//!
//! Lambda's usual batch is one shard's plain records. Read into [`Fields`](super::fields::Fields)
//! first, each record's partition key and payload were taken out of the event, its fields
//! written into a block allocated for the batch, and at the end the block, the fields and the
//! rest of the event freed apart: about 450 instructions per record on top of the least a
//! processor must do, and with the JSON handler a third of the time the processor adds to a
//! bare loop at 100 records (the `processor` bench). Here the event's
//! records are kept as they are, beside the one thing the engine needs read out of each of
//! them before dispatch, its sequence number, and a record is an index into them.

use std::sync::Arc;
use std::time::SystemTime;

use aws_lambda_events::event::kinesis::KinesisEventRecord;

use crate::key::LeaseKey;
use crate::sequence::SequenceNumber;

/// One event's records of one shard, as Lambda's event holds them, and each one's sequence
/// number, read once.
pub(crate) struct InEvent {
    key: LeaseKey,
    /// Declared, and so dropped, before `records`: freed after the event's small strings, the
    /// vector has glibc sort them all out of its fast bins again, about 700 instructions per
    /// record with the JSON handler at 100 records (the `memory` bench).
    sequences: Vec<SequenceNumber>,
    records: Vec<KinesisEventRecord>,
}

impl InEvent {
    /// `records`, all of `key`'s shard, each with the sequence number of the same index in
    /// `sequences`: `None` when the two are not as long as each other.
    pub(super) fn new(
        key: LeaseKey,
        records: Vec<KinesisEventRecord>,
        sequences: Vec<SequenceNumber>,
    ) -> Option<Self> {
        (records.len() == sequences.len()).then_some(Self {
            key,
            sequences,
            records,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    pub(super) fn key(&self) -> &LeaseKey {
        &self.key
    }

    pub(super) fn sequence(&self, index: usize) -> &SequenceNumber {
        &self.sequences[index]
    }

    /// The record's partition key; the empty key for one Lambda gave none (see
    /// [`Record::partition_key`](super::Record::partition_key)).
    pub(super) fn partition_key(&self, index: usize) -> &str {
        &self.records[index].kinesis.partition_key
    }

    pub(super) fn data(&self, index: usize) -> &[u8] {
        &self.records[index].kinesis.data.0
    }

    /// When Kinesis accepted the record, converted when asked: the engine asks for a batch's
    /// first and last record's only.
    pub(super) fn arrival(&self, index: usize) -> SystemTime {
        SystemTime::from(self.records[index].kinesis.approximate_arrival_timestamp.0)
    }
}

/// Keeps an event whose records are held where it holds them (see [`Record::in_event`](super::Record::in_event)) until
/// it is dropped; holds nothing for other records.
///
/// An event's records hold a dozen small strings each, which glibc keeps in its fast bins once
/// freed; a larger block freed after them (the batch's entries, its report) has glibc sort them
/// all out again, which cost twice as much as the rest of freeing the batch. Dropped after
/// the batch's report, a hold frees the event last, as a bare loop frees its own
/// (the `memory` bench).
#[derive(Default)]
pub(crate) struct EventHold {
    _event: Option<Arc<InEvent>>,
}

impl EventHold {
    pub(super) fn new(event: Arc<InEvent>) -> Self {
        Self {
            _event: Some(event),
        }
    }

    /// Whether it holds an event.
    #[cfg(test)]
    pub(super) fn holds(&self) -> bool {
        #[allow(
            clippy::used_underscore_binding,
            reason = "the field is only ever dropped, but for this check"
        )]
        self._event.is_some()
    }
}
