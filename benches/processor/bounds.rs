//! The bounds `benches/processor.rs` judges the processor against, from the `KinesisEvent`: the
//! least any processor that dedupes must add to the bare loop, in its one pass; and the same
//! work in the processor's three passes, over the whole batch or a chunk at a time, or in two
//! steps, as the processor reads a large event, or in two passes over the event where it lies.
//! None is the crate's own code.

use std::hint::black_box;
use std::sync::Arc;
use std::time::SystemTime;

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::streams::KinesisEventResponse;
use bytes::Bytes;
use kinesis_checkpoint::{LeaseKey, Outcome, SequenceNumber};

/// The records [`least_in_passes`] reads at a time when it reads the event in chunks: some
/// 120 KB of event, well inside one core's L2 on the machines of BENCHMARKS.md.
pub const CHUNK: usize = 64;

/// The stream and shard of a batch's first record, which every record must name: its ARN, whole,
/// and its event id's shard (the text before the colon).
struct FirstShard {
    arn: String,
    shard: String,
}

impl FirstShard {
    fn of(first: &KinesisEventRecord) -> Self {
        Self {
            arn: first.event_source_arn.clone().unwrap_or_default(),
            shard: shard_of(first).unwrap_or_default().to_owned(),
        }
    }

    /// Whether `record` names the first record's stream and shard.
    fn holds(&self, record: &KinesisEventRecord) -> bool {
        record.event_source_arn.as_deref() == Some(self.arn.as_str())
            && shard_of(record) == Some(self.shard.as_str())
    }
}

/// The shard a record's event id names.
fn shard_of(record: &KinesisEventRecord) -> Option<&str> {
    record
        .event_id
        .as_deref()
        .and_then(|id| id.split_once(':'))
        .map(|(shard, _)| shard)
}

/// The least any processor that dedupes a shard's batch must add to the bench's `bare_loop`, in
/// the same one pass: each record's stream and shard checked against the first's, its sequence
/// number read and compared with the checkpoint, and the last one done kept for the checkpoint
/// write. No lease, store, report, guard or deadline: a bound below every design, to judge the
/// targets by. Each record is read just before the bare loop would free it, so the reads add
/// instructions but no cache misses.
pub async fn least_processor<F, Fut>(
    event: KinesisEvent,
    checkpoint: &SequenceNumber,
    user_code: F,
) -> (KinesisEventResponse, Option<SequenceNumber>)
where
    F: Fn(Vec<u8>) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let mut response = KinesisEventResponse::default();
    let mut done = None;
    let mut records = event.records.into_iter().peekable();
    let Some(first) = records.peek().map(FirstShard::of) else {
        return (response, done);
    };
    for record in records {
        assert!(first.holds(&record), "one shard's batch");
        let sequence: SequenceNumber = record
            .kinesis
            .sequence_number
            .parse()
            .expect("a sequence number");
        if sequence <= *checkpoint {
            continue;
        }
        if !user_code(record.kinesis.data.0).await.is_ack() {
            response.add_failure(record.kinesis.sequence_number);
            break;
        }
        done = Some(sequence);
    }
    (response, done)
}

/// A record's place in [`least_in_passes`]' block: the fields the processor's record block
/// holds for each record (`record::Fields`), so that the block is as large.
struct Place {
    key: LeaseKey,
    sequence: SequenceNumber,
    sub_sequence: Option<u64>,
    partition_key: Box<str>,
    routing_key: Option<Arc<str>>,
    explicit_hash_key: Option<Arc<str>>,
    data: Bytes,
    arrival: SystemTime,
}

impl Place {
    /// The place of `record`, of `key`'s shard, its payload and partition key taken from it.
    fn of(key: &LeaseKey, sequence: SequenceNumber, record: &mut KinesisEventRecord) -> Self {
        let kinesis = &mut record.kinesis;
        Self {
            key: key.clone(),
            sequence,
            sub_sequence: None,
            partition_key: std::mem::take(&mut kinesis.partition_key).into_boxed_str(),
            routing_key: None,
            explicit_hash_key: None,
            data: Bytes::from(std::mem::take(&mut kinesis.data.0)),
            arrival: SystemTime::from(kinesis.approximate_arrival_timestamp.0),
        }
    }
}

/// [`least_processor`]'s work in the processor's passes, `chunk` records at a time: each
/// record of the chunk read into a block of [`Place`]s (its payload and partition key taken
/// from the event), then the chunk's records handed to the user code from the block, then the
/// chunk's block and the rest of its part of the event freed. With `chunk` at least the batch's
/// size, these are the processor's three passes over the whole batch, the event read in place;
/// with a small `chunk`, each chunk's records are moved out of the event (as the bare loop
/// moves each record) and its passes run while it is still in the cache. It measures what the
/// passes cost, and what reading the event in chunks would win back.
pub fn least_in_passes(
    event: KinesisEvent,
    checkpoint: &SequenceNumber,
    chunk: usize,
    user_code: fn(&[u8]) -> Outcome,
) -> (KinesisEventResponse, Option<SequenceNumber>) {
    let mut passes = Passes::new(checkpoint, user_code);
    let mut records = event.records;
    if chunk >= records.len() {
        passes.run(&mut records);
    } else {
        let mut rest = records.into_iter();
        let mut part = Vec::with_capacity(chunk);
        loop {
            part.extend(rest.by_ref().take(chunk));
            if part.is_empty() || !passes.run(&mut part) {
                break;
            }
            // The chunk's part of the event freed now, while it is in the cache.
            part.clear();
        }
    }
    (passes.response, passes.done)
}

/// What [`least_in_passes`] carries from one chunk to the next.
struct Passes<'a> {
    response: KinesisEventResponse,
    done: Option<SequenceNumber>,
    checkpoint: &'a SequenceNumber,
    user_code: fn(&[u8]) -> Outcome,
    /// The first record's stream and shard, and its key.
    first: Option<(FirstShard, LeaseKey)>,
}

impl<'a> Passes<'a> {
    /// Nothing run yet, against `checkpoint`, with `user_code`.
    fn new(checkpoint: &'a SequenceNumber, user_code: fn(&[u8]) -> Outcome) -> Self {
        Self {
            response: KinesisEventResponse::default(),
            done: None,
            checkpoint,
            user_code,
            first: None,
        }
    }

    /// Reads `records` into a block, runs them from it and frees the block; false once a
    /// record is reported.
    fn run(&mut self, records: &mut [KinesisEventRecord]) -> bool {
        // An empty event has no first record to read a shard from, and nothing to run.
        let Some(head) = records.first() else {
            return true;
        };
        let (first, key) = self.first.get_or_insert_with(|| {
            let first = FirstShard::of(head);
            let key = LeaseKey::new("orders", &first.shard);
            (first, key)
        });
        let block: Vec<Place> = records
            .iter_mut()
            .map(|record| {
                assert!(first.holds(record), "one shard's batch");
                let sequence = record.kinesis.sequence_number.parse();
                Place::of(key, sequence.expect("a sequence number"), record)
            })
            .collect();
        self.dispatch(&block)
    }

    /// Runs the records of `block` in order; false once a record is reported.
    fn dispatch(&mut self, block: &[Place]) -> bool {
        for place in block {
            if place.sequence <= *self.checkpoint {
                continue;
            }
            black_box((
                &place.key,
                place.sub_sequence,
                &place.partition_key,
                place.arrival,
            ));
            black_box((&place.routing_key, &place.explicit_hash_key));
            if !(self.user_code)(&place.data).is_ack() {
                self.response.add_failure(place.sequence.to_string());
                return false;
            }
            self.done = Some(place.sequence.clone());
        }
        true
    }
}

/// The first pass of the bounds that read positions first: the first record's stream and
/// shard, and each record's sequence number, every record checked to name the same shard;
/// `None` for an empty event.
fn positions(records: &[KinesisEventRecord]) -> Option<(FirstShard, Vec<SequenceNumber>)> {
    let first = FirstShard::of(records.first()?);
    let sequences = records
        .iter()
        .map(|record| {
            assert!(first.holds(record), "one shard's batch");
            record
                .kinesis
                .sequence_number
                .parse()
                .expect("a sequence number")
        })
        .collect();
    Some((first, sequences))
}

/// [`least_processor`]'s work in two passes over the event where it lies: each record's shard
/// checked and its sequence number read over the whole batch first (what the stages before
/// dispatch need), then each payload handed to the user code where it lies in the event, then
/// the event freed whole, as the bare loop frees it. No block of records and nothing moved out
/// of the event: what the processor's passes would cost if its records were the event's own.
pub fn least_in_place(
    event: KinesisEvent,
    checkpoint: &SequenceNumber,
    user_code: fn(&[u8]) -> Outcome,
) -> (KinesisEventResponse, Option<SequenceNumber>) {
    let mut response = KinesisEventResponse::default();
    let mut done = None;
    // Moved out so that the event is freed here, inside the timed part, as the bare loop's is.
    let records = event.records;
    let Some((_, sequences)) = positions(&records) else {
        return (response, done);
    };
    for (record, sequence) in records.iter().zip(sequences) {
        if sequence <= *checkpoint {
            continue;
        }
        if !user_code(&record.kinesis.data.0).is_ack() {
            response.add_failure(sequence.to_string());
            break;
        }
        done = Some(sequence);
    }
    (response, done)
}

/// [`least_in_passes`] in chunks, after a first pass over the whole batch that reads only what
/// the stages before dispatch need (each record's shard checked, its sequence number read into
/// a vector): the processor's intake for a large event (`event/placed.rs`), which keeps the
/// claim, the gate and dedupe before dispatch and reads each chunk's payloads, and frees its
/// part of the event, only as it is dispatched.
pub fn least_in_two_phases(
    event: KinesisEvent,
    checkpoint: &SequenceNumber,
    chunk: usize,
    user_code: fn(&[u8]) -> Outcome,
) -> (KinesisEventResponse, Option<SequenceNumber>) {
    let mut passes = Passes::new(checkpoint, user_code);
    let records = event.records;
    let Some((first, sequences)) = positions(&records) else {
        return (passes.response, passes.done);
    };
    let key = LeaseKey::new("orders", &first.shard);
    let mut rest = records.into_iter();
    let mut part: Vec<KinesisEventRecord> = Vec::with_capacity(chunk);
    for sequences in sequences.chunks(chunk) {
        part.extend(rest.by_ref().take(chunk));
        let block: Vec<Place> = part
            .iter_mut()
            .zip(sequences)
            .map(|(record, sequence)| Place::of(&key, sequence.clone(), record))
            .collect();
        if !passes.dispatch(&block) {
            break;
        }
        // The chunk's block and part of the event freed now, while they are in the cache.
        drop(block);
        part.clear();
    }
    (passes.response, passes.done)
}
