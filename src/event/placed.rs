//! A large event of one shard, read in two steps: first what the stages before dispatch need
//! of each record, then its payload, a chunk at a time, as dispatch reaches it.
//!
//! Read whole before the claim, as a small event is, each record of a large batch is fetched
//! from memory three times: read into the record block, run from it, then freed with the rest
//! of the event at the end. Once the batch outgrows the caches, those passes cost more than
//! the handler: a third of a bare loop's time at 10,000 records of 1 KB (the `processor`
//! bench). Here the first pass reads only each record's shard, sequence number and arrival
//! time (a [`Placed`]); dispatch then takes a [`CHUNK`] of records out of the event, as they
//! are, runs them and frees them while they are in a core's L2, as a bare loop frees each
//! record after its call.

use std::time::SystemTime;

use aws_lambda_events::event::kinesis::{KinesisEventRecord, KinesisRecord};
use bytes::Bytes;

use crate::key::LeaseKey;
use crate::record::{Arrived, Record};
use crate::sequence::SequenceNumber;

/// How many records in-order dispatch reads out of a large event at a time: some 120 KB of a
/// batch of 1 KB records, read, run and freed while it is in a core's L2.
pub(crate) const CHUNK: usize = 64;

/// Above this many bytes of payloads, an event of one shard is read in two steps. A smaller one
/// is read whole: its passes stay inside the caches (1,000 records of 1 KB ran as fast either
/// way on a machine with 512 KB of L2 and 8 MB of L3), and each chunk's freed strings, a dozen
/// per record, have glibc consolidate its fast bins at the next chunk's block, which costs 8 %
/// at 100 records and 10 % at 1,000 (the `processor` bench).
pub(crate) const LARGE: usize = 2 * 1024 * 1024;

/// What the stages before dispatch (the claim, the gate, recovery, dedupe, the checkpoint and
/// the report) need of a record of a large event: its place in the event, its sequence number
/// and its arrival time. Its payload and partition key stay in the event until dispatch reads
/// them ([`Payloads::read`]). Held in the batch's entry itself: shared in one block, as read
/// records share theirs, the entries were smaller but each a reference count more, and the
/// processor executed 180 instructions more per record at 10,000 records (the `processor`
/// bench).
pub(crate) struct Placed {
    /// The record's index in the event's `Records`.
    pub(crate) index: usize,
    pub(crate) sequence: SequenceNumber,
    pub(crate) arrival: SystemTime,
}

/// The records of a large event of one shard, taken out of the event, whose payloads dispatch
/// has not read yet.
///
/// Dispatch reads them a [`chunk`](Self::chunk) at a time, in the event's order: each chunk's
/// records are taken out of the event as they are, and freed with the last of them, once the
/// chunk has run (unless the handler kept one). What is never read (records deduped, or after a
/// stop) is freed on the way or with this. A batch read whole before dispatch
/// ([`read_whole`](Self::read_whole)) is read where it lies into fields, and freed when this is
/// dropped.
pub(crate) struct Payloads {
    key: LeaseKey,
    rest: std::vec::IntoIter<KinesisEventRecord>,
    /// The event index of `rest`'s next record.
    next: usize,
    /// Whether reading takes each record out of the event: not for a batch read whole.
    chunked: bool,
}

impl Payloads {
    /// The records of an event of `key`'s shard, taken out of it, to be read a chunk at a time.
    pub(super) fn new(key: LeaseKey, records: Vec<KinesisEventRecord>) -> Self {
        Self {
            key,
            rest: records.into_iter(),
            next: 0,
            chunked: true,
        }
    }

    /// How many records dispatch reads at a time.
    pub(crate) fn chunk(&self) -> usize {
        if self.chunked { CHUNK } else { usize::MAX }
    }

    /// The records `placed` name, in order. Read in chunks, each chunk's records are taken out
    /// of the event and held as they are, one block for the chunk (see [`Record::in_event`]),
    /// and the event's records before each of them are freed, so each read must name records
    /// after every record read before it: the event is read once, forwards. Read whole, each
    /// record's fields are read out of the event where it lies into one block (see
    /// [`Record`]), for per-key dispatch and KPL aggregates.
    pub(crate) fn read(&mut self, placed: &[&Placed]) -> Vec<Record> {
        if !self.chunked {
            return self.read_fields(placed);
        }
        let mut records = Vec::with_capacity(placed.len());
        let mut sequences = Vec::with_capacity(placed.len());
        for placed in placed {
            let at = self.forwards(placed.index);
            self.next = placed.index + 1;
            let Some(record) = self.rest.nth(at) else {
                unreachable!("a placed record is in the event: {}", placed.index)
            };
            records.push(record);
            sequences.push(placed.sequence.clone());
        }
        Record::in_event(self.key.clone(), records, sequences)
            .unwrap_or_else(|| unreachable!("one sequence number per record read"))
    }

    /// How far `index` is past the next record of the event not read yet.
    fn forwards(&self, index: usize) -> usize {
        index.checked_sub(self.next).unwrap_or_else(|| {
            unreachable!(
                "record {} of the event is read after record {}: the event is read forwards",
                index, self.next
            )
        })
    }

    /// The records `placed` name, read where they lie into one block of fields.
    fn read_fields(&mut self, placed: &[&Placed]) -> Vec<Record> {
        let arrivals = placed.iter().map(|placed| {
            let at = self.forwards(placed.index);
            let Some(record) = self.rest.as_mut_slice().get_mut(at) else {
                unreachable!("a placed record is in the event: {}", placed.index)
            };
            let (partition_key, data) = take_payload(&mut record.kinesis);
            Ok::<_, std::convert::Infallible>(Arrived {
                key: self.key.clone(),
                sequence: placed.sequence.clone(),
                partition_key,
                data,
                arrival: placed.arrival,
            })
        });
        match Record::arrived_together(arrivals) {
            Ok(records) => records,
            Err(never) => unreachable!("reading a placed record cannot fail: {}", never.len()),
        }
    }

    /// [`read`](Self::read) for a batch read whole before dispatch (per-key dispatch, the
    /// partition-key mode, a transactional handler, KPL aggregates to unpack): the event is
    /// kept, and freed when this is dropped.
    pub(crate) fn read_whole(&mut self, placed: &[&Placed]) -> Vec<Record> {
        self.chunked = false;
        self.read(placed)
    }
}

/// A record's partition key and payload, taken from the event rather than copied or wrapped:
/// no block is allocated for either (a `Bytes` made from a vector with spare capacity
/// allocates a shared header; `LambdaKinesisEvent` and `InvocationEvent` decode a payload into a vector of its
/// exact length, but `aws_lambda_events`' decoder leaves two or three bytes spare, which
/// shrinking gives back in place).
pub(super) fn take_payload(kinesis: &mut KinesisRecord) -> (Box<str>, Bytes) {
    (
        std::mem::take(&mut kinesis.partition_key).into_boxed_str(),
        Bytes::from(std::mem::take(&mut kinesis.data.0).into_boxed_slice()),
    )
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use aws_lambda_events::event::kinesis::KinesisEvent;

    use super::*;
    use crate::event::{ReadEvent, parse_event};

    const ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/orders";

    /// An event of `count` records of `bytes` each, record `n` of shard `shards[n]` (the
    /// last shard for records past the list).
    fn event(count: usize, bytes: usize, shards: &[u32]) -> KinesisEvent {
        let records: Vec<_> = (0..count)
            .map(|n| {
                let shard = shards.get(n).or(shards.last()).copied().unwrap_or_default();
                let sequence = format!("4959033827149025660855969253836157109592157598913658{n:04}");
                let data = vec![b'a' + u8::try_from(n % 26).unwrap(); bytes];
                serde_json::json!({
                    "eventID": format!("shardId-00000000000{shard}:{sequence}"),
                    "eventSourceARN": ARN,
                    "kinesis": {
                        "partitionKey": format!("key-{n}"),
                        "sequenceNumber": sequence,
                        "data": base64::engine::general_purpose::STANDARD.encode(data),
                        "approximateArrivalTimestamp": 1_700_000_000.0 + f64::from(u32::try_from(n).unwrap()),
                    }
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({ "Records": records })).expect("event shape")
    }

    #[test]
    fn a_large_event_of_one_shard_is_placed_and_read_forwards_a_chunk_at_a_time() {
        let mut large = event(3, 800 * 1024, &[4]);
        let (read, aggregates) = parse_event(&mut large, LARGE);
        assert!(!aggregates);
        assert!(
            large.records.is_empty(),
            "the records are taken out of the event"
        );
        let ReadEvent::Placed {
            key,
            placed,
            mut payloads,
        } = read
        else {
            panic!("a large event of one shard is placed")
        };
        assert_eq!(key, LeaseKey::new("orders", "shardId-000000000004"));
        assert_eq!(
            placed.iter().map(|placed| placed.index).collect::<Vec<_>>(),
            [0, 1, 2]
        );
        assert_eq!(payloads.chunk(), CHUNK);
        // Record 0 is passed by (a duplicate): read past, never returned.
        let read = payloads.read(&[&placed[1]]);
        let [one] = &read[..] else {
            panic!("one record")
        };
        assert_eq!(one.sequence(), &placed[1].sequence);
        assert_eq!(one.partition_key(), "key-1");
        assert_eq!(one.data(), vec![b'b'; 800 * 1024]);
        assert_eq!(one.arrival(), placed[1].arrival);
        assert_eq!(*one.key(), key);
        assert!(one.is_held_in_event(), "taken out of the event as it is");
        let read = payloads.read(&[&placed[2]]);
        assert_eq!(read[0].data(), vec![b'c'; 800 * 1024]);
        assert_eq!(read[0].partition_key(), "key-2");
    }

    #[test]
    fn a_large_event_read_whole_is_read_where_it_lies_in_any_order() {
        let mut large = event(3, 800 * 1024, &[4]);
        let ReadEvent::Placed {
            placed,
            mut payloads,
            ..
        } = parse_event(&mut large, LARGE).0
        else {
            panic!("a large event of one shard is placed")
        };
        let read = payloads.read_whole(&[&placed[2], &placed[0]]);
        assert_eq!(payloads.chunk(), usize::MAX);
        assert_eq!(read[0].data()[0], b'c');
        assert_eq!(read[1].data()[0], b'a');
        assert!(
            !read.iter().any(Record::is_held_in_event),
            "read into fields"
        );
        assert_eq!(read[1].partition_key(), "key-0");
    }

    #[test]
    fn a_small_event_or_a_large_one_of_two_shards_is_read_whole() {
        let (small, _) = parse_event(&mut event(3, 1024, &[4]), LARGE);
        assert!(matches!(small, ReadEvent::OneShard { .. }));
        let (two, _) = parse_event(&mut event(3, 800 * 1024, &[4, 5]), LARGE);
        let ReadEvent::Mixed(parsed) = two else {
            panic!("two shards are grouped record by record")
        };
        assert_eq!(parsed.len(), 3);
        assert!(
            parsed
                .iter()
                .all(|record| record.as_ref().is_ok_and(|r| r.data().len() == 800 * 1024))
        );
    }
}
