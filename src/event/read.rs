//! Reading Lambda's event into the records the engine runs: one shard's plain records where
//! they lie, a large event's in two steps, anything else into fields of their own.
//!
//! Each way reads every record's shard and sequence number once, and none copies a payload.
//! Which way an event is read is decided by one pass over its payloads' lengths and first bytes
//! ([`parse_event`]).

use std::time::SystemTime;

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};

use crate::key::LeaseKey;
use crate::record::{Arrived, Record};
use crate::sequence::SequenceNumber;

use super::placed::{Payloads, Placed, take_payload};
use super::{MalformedReason, MalformedRecord, shard_id, stream_name};

/// One record of the event after parsing: a record to process, or what is known of one that
/// cannot be (boxed, as rare: a `Parsed` is as small as a record, and the parse's vector is as
/// long as the batch).
pub(crate) type Parsed = Result<Record, Box<MalformedRecord>>;

/// An event's records once read.
pub(crate) enum ReadEvent {
    /// Every record was read, and all name one stream and shard: every batch Lambda sends. The
    /// records need no grouping, so none of them is looked at again until it is dispatched.
    OneShard { key: LeaseKey, records: Vec<Record> },
    /// The same of a large event, whose payloads stay in it until dispatch reads them, a chunk
    /// at a time ([`Payloads`]): each record is known by its [`Placed`] until then.
    Placed {
        key: LeaseKey,
        placed: Vec<Placed>,
        payloads: Payloads,
    },
    /// Records of several shards, or some that could not be read: grouped one by one.
    Mixed(Vec<Parsed>),
}

impl ReadEvent {
    /// A hold on the event, when its records are held where it holds them.
    pub(crate) fn event_hold(&self) -> crate::record::EventHold {
        match self {
            Self::OneShard { records, .. } => {
                records.first().map(Record::event_hold).unwrap_or_default()
            }
            Self::Placed { .. } | Self::Mixed(_) => crate::record::EventHold::default(),
        }
    }

    /// Each record, or what is known of one that cannot be processed, in the event's order.
    #[cfg(test)]
    pub(crate) fn into_parsed(self) -> Vec<Parsed> {
        match self {
            Self::OneShard { records, .. } => records.into_iter().map(Ok).collect(),
            Self::Placed {
                placed,
                mut payloads,
                ..
            } => {
                let placed: Vec<&Placed> = placed.iter().collect();
                payloads.read(&placed).into_iter().map(Ok).collect()
            }
            Self::Mixed(parsed) => parsed,
        }
    }
}

/// Reads every record of `event`, in order, without copying a payload; and says whether any of
/// them is a KPL aggregate (by the first bytes of each payload).
///
/// One pass over the records ([`one_shard`]) reads each one's shard and sequence number and its
/// payload's length and first bytes, which pick one of three ways:
/// - one shard's plain records, the usual batch: each is held where it lies, the event's records
///   taken out of `event` as they are ([`read_in_place`]);
/// - more than `large` bytes of payloads of one shard: in two steps (see [`Payloads`]);
/// - anything else (records of several shards, one that cannot be read, KPL aggregates, whose
///   sub-records the engine unpacks from shared bytes): each record's fields read out of the
///   event ([`read_fields`]).
pub(crate) fn parse_event(event: &mut KinesisEvent, large: usize) -> (ReadEvent, bool) {
    let Some(shard) = one_shard(event) else {
        // Rare: the records are read again, one by one, whatever their payloads hold.
        let aggregates = event
            .records
            .iter()
            .any(|record| crate::kpl::is_aggregate(&record.kinesis.data.0));
        return (read_fields(event), aggregates);
    };
    let read = if shard.bytes > large {
        read_large(event, shard.key, shard.sequences)
    } else if shard.aggregates {
        read_fields(event)
    } else {
        read_in_place(event, shard.key, shard.sequences)
    };
    (read, shard.aggregates)
}

/// What one pass over an event of one shard reads.
struct OneShard {
    key: LeaseKey,
    /// One per record, in order.
    sequences: Vec<SequenceNumber>,
    /// The payloads' length.
    bytes: usize,
    /// Whether a payload is a KPL aggregate.
    aggregates: bool,
}

/// The one pass over an event of one shard: the key every record names, each record's sequence
/// number, and the payloads' length and whether one is an aggregate (by its first bytes); `None`
/// as soon as a record names another shard than the first, or cannot be read.
///
/// Each number is read where it stays, in the vector (see [`SequenceNumber::read_into`]). The
/// payloads' lengths are read in the same pass: the event's records are walked once before
/// dispatch rather than twice (the `processor` bench).
fn one_shard(event: &KinesisEvent) -> Option<OneShard> {
    let mut keys = KeyCache::default();
    let mut sequences = Vec::with_capacity(event.records.len());
    let (mut bytes, mut aggregates) = (0, false);
    for record in &event.records {
        keys.key(
            record.event_source_arn.as_deref(),
            record.event_id.as_deref(),
        )?;
        if keys.several {
            return None;
        }
        let kinesis = &record.kinesis;
        sequences.push(SequenceNumber::ZERO);
        let sequence = sequences.last_mut()?;
        sequence.read_into(&kinesis.sequence_number).ok()?;
        let data = &kinesis.data.0;
        bytes += data.len();
        aggregates |= crate::kpl::is_aggregate(data);
    }
    Some(OneShard {
        key: keys.only()?,
        sequences,
        bytes,
        aggregates,
    })
}

/// The records of an event of one shard, each held where the event holds it (see
/// [`Record::in_event`]), the event's records taken out of `event`.
fn read_in_place(
    event: &mut KinesisEvent,
    key: LeaseKey,
    sequences: Vec<SequenceNumber>,
) -> ReadEvent {
    let records = Record::in_event(key.clone(), std::mem::take(&mut event.records), sequences)
        .unwrap_or_else(|| unreachable!("one pass read one sequence number per record"));
    ReadEvent::OneShard { key, records }
}

/// Reads every record of `event` into fields of its own, in order, taking the partition keys
/// and payloads out of it without copying them.
///
/// The rest of the event (a dozen strings per record) is left in place for the caller to drop
/// at the end of the batch. Freed here, those small blocks would fill glibc's fast bins, and
/// the batch's next large allocation would stop to consolidate all of them (the `memory` bench).
fn read_fields(event: &mut KinesisEvent) -> ReadEvent {
    let mut keys = KeyCache::default();
    let arrivals = Record::arrived_together(
        event
            .records
            .iter_mut()
            .enumerate()
            .map(|(index, record)| parse_record(index, record, &mut keys)),
    );
    match (arrivals, keys.only()) {
        (Ok(records), Some(key)) => ReadEvent::OneShard { key, records },
        (Ok(records), None) => ReadEvent::Mixed(records.into_iter().map(Ok).collect()),
        (Err(parsed), _) => ReadEvent::Mixed(parsed),
    }
}

/// The first step of reading a large event of one shard: each record known by its place in the
/// event, sequence number and arrival, the event's records taken out of `event`.
fn read_large(
    event: &mut KinesisEvent,
    key: LeaseKey,
    sequences: Vec<SequenceNumber>,
) -> ReadEvent {
    let placed = sequences
        .into_iter()
        .zip(&event.records)
        .enumerate()
        .map(|(index, (sequence, record))| Placed {
            index,
            sequence,
            arrival: SystemTime::from(record.kinesis.approximate_arrival_timestamp.0),
        })
        .collect();
    let payloads = Payloads::new(key.clone(), std::mem::take(&mut event.records));
    ReadEvent::Placed {
        key,
        placed,
        payloads,
    }
}

/// Every record of a batch names the same stream and shard: read the key out of the first
/// record's `eventSourceARN` and `eventID`, and for each later one only check that it names the
/// same (its ARN compared whole, its event id's start compared with the shard), rather than
/// reading the stream's name out of every ARN and comparing the key's two parts again.
#[derive(Default)]
struct KeyCache {
    /// The last `eventSourceARN` read and the key it and its record's event id named.
    last: Option<(String, LeaseKey)>,
    /// Whether a key other than the last was read before it: the batch names several.
    several: bool,
}

impl KeyCache {
    /// The only key read, when every key read was the same one.
    fn only(self) -> Option<LeaseKey> {
        self.last.filter(|_| !self.several).map(|(_, key)| key)
    }

    /// The key of a record of `arn` whose event id is `event_id`; `None` when either cannot be
    /// read (what [`stream_name`] and [`shard_id`] refuse).
    fn key(&mut self, arn: Option<&str>, event_id: Option<&str>) -> Option<&LeaseKey> {
        let (arn, event_id) = (arn?, event_id?);
        let same = self.last.as_ref().is_some_and(|(last_arn, key)| {
            // A shard id holds no colon, so an event id that starts with the last shard's id
            // followed by its colon (and something after it) is one `shard_id` reads as that
            // shard.
            let shard = key.shard();
            event_id.len() > shard.len() + 1
                && event_id.as_bytes()[shard.len()] == b':'
                && event_id.starts_with(shard)
                && last_arn == arn
        });
        if !same {
            let key = LeaseKey::new(stream_name(arn)?, shard_id(event_id)?);
            // The same key read again after another ARN's text (the same stream named another
            // way) is still one key.
            self.several |= self.last.as_ref().is_some_and(|(_, last)| *last != key);
            self.last = Some((arn.to_owned(), key));
        }
        self.last.as_ref().map(|(_, key)| key)
    }
}

fn parse_record(
    index: usize,
    record: &mut KinesisEventRecord,
    keys: &mut KeyCache,
) -> Result<Arrived, Box<MalformedRecord>> {
    let arn = record.event_source_arn.as_deref();
    let event_id = record.event_id.as_deref();
    let key = keys.key(arn, event_id).cloned();
    // Read again only for a record that cannot be processed, to say what it names.
    let stream = || arn.and_then(stream_name);
    let shard = || event_id.and_then(shard_id);
    let kinesis = &mut record.kinesis;
    let malformed = |reason| {
        Box::new(MalformedRecord {
            index,
            stream: stream().map(str::to_owned),
            shard: shard().map(str::to_owned),
            sequence: Some(kinesis.sequence_number.clone()).filter(|s| !s.is_empty()),
            reason,
        })
    };
    let sequence = match kinesis.sequence_number.parse::<SequenceNumber>() {
        Ok(sequence) => sequence,
        Err(err) => return Err(malformed(MalformedReason::Sequence(err))),
    };
    let Some(key) = key else {
        let reason = if stream().is_none() {
            MalformedReason::SourceArn(record.event_source_arn.clone())
        } else {
            MalformedReason::EventId(record.event_id.clone())
        };
        return Err(malformed(reason));
    };
    let (partition_key, data) = take_payload(kinesis);
    Ok(Arrived {
        key,
        sequence,
        partition_key,
        data,
        arrival: SystemTime::from(kinesis.approximate_arrival_timestamp.0),
    })
}

#[cfg(test)]
mod tests {
    use super::super::LARGE;
    use super::*;
    use crate::sequence::SequenceError;

    const ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/orders";
    const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

    /// Each record of `event` as read, however the event was read.
    fn read(event: &mut KinesisEvent) -> Vec<Parsed> {
        parse_event(event, LARGE).0.into_parsed()
    }

    /// Two sub-records, as `aws-kinesis-agg` packs them (the example of `kpl::is_aggregate`).
    const AGGREGATE: &[u8] = b"\xf3\x89\x9a\xc2\n\x07order-1\n\x07order-2\x1a\x0b\x08\x00\x1a\x07{\"n\":1}\
        \x1a\x0b\x08\x01\x1a\x07{\"n\":2}\xcd\x88\xf1\xbf\x62\xbc\x27\x8c\x33\xbd\x84\x6c\xa6\x0d\x2a\xba";

    /// A record whose payload is [`AGGREGATE`].
    fn packed_record(event_id: &str, arn: &str, sequence: &str) -> serde_json::Value {
        let mut packed = lambda_record(event_id, arn, sequence);
        packed["kinesis"]["data"] =
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, AGGREGATE).into();
        packed
    }

    fn event(records: &serde_json::Value) -> KinesisEvent {
        serde_json::from_value(serde_json::json!({ "Records": records })).expect("event shape")
    }

    fn lambda_record(event_id: &str, arn: &str, sequence: &str) -> serde_json::Value {
        serde_json::json!({
            "eventID": event_id,
            "eventSourceARN": arn,
            "eventSource": "aws:kinesis",
            "eventName": "aws:kinesis:record",
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": "order-1",
                "sequenceNumber": sequence,
                "data": "eyJvcmRlcl9pZCI6IjEifQ==",
                "approximateArrivalTimestamp": 1_700_000_000.25
            }
        })
    }

    #[test]
    fn a_lambda_record_yields_stream_shard_sequence_key_and_payload() {
        let parsed = read(&mut event(&serde_json::json!([lambda_record(
            &format!("shardId-000000000004:{SEQ}"),
            ARN,
            SEQ
        )])));
        let record = parsed.into_iter().next().unwrap().expect("well formed");
        assert_eq!(record.stream(), "orders");
        assert_eq!(record.shard(), "shardId-000000000004");
        assert_eq!(record.sequence().as_str(), SEQ);
        assert_eq!(record.partition_key(), "order-1");
        assert_eq!(record.data(), br#"{"order_id":"1"}"#);
        let seconds = record
            .arrival()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(seconds, 1_700_000_000);
    }

    #[test]
    fn one_shards_plain_records_are_held_in_the_event_and_an_aggregate_among_them_reads_into_fields()
     {
        let id = format!("shardId-000000000004:{SEQ}");
        let later = "49590338271490256608559692538361571095921575989136588899";
        let mut plain = event(&serde_json::json!([
            lambda_record(&id, ARN, SEQ),
            lambda_record(&id, ARN, later),
        ]));
        let (read, aggregates) = parse_event(&mut plain, LARGE);
        assert!(!aggregates);
        let ReadEvent::OneShard { records, .. } = &read else {
            panic!("one shard's batch")
        };
        assert!(records.iter().all(Record::is_held_in_event));
        assert_eq!(records[1].sequence().as_str(), later);
        assert_eq!(records[1].data(), br#"{"order_id":"1"}"#);
        assert!(
            plain.records.is_empty(),
            "taken out of the event, not copied"
        );
        // An aggregate's sub-records are slices of shared bytes: read into fields.
        let packed = packed_record(&id, ARN, later);
        let mut with_aggregate = event(&serde_json::json!([lambda_record(&id, ARN, SEQ), packed]));
        let (read, aggregates) = parse_event(&mut with_aggregate, LARGE);
        assert!(aggregates);
        let ReadEvent::OneShard { records, .. } = &read else {
            panic!("one shard's batch")
        };
        assert!(!records.iter().any(Record::is_held_in_event));
        assert_eq!(records[1].data(), AGGREGATE);
        assert_eq!(
            with_aggregate.records.len(),
            2,
            "the rest left in the event"
        );
    }

    #[test]
    fn the_one_pass_says_whether_a_payload_is_an_aggregate_however_the_event_is_then_read() {
        let id = |shard: u32| format!("shardId-00000000000{shard}:{SEQ}");
        let later = "49590338271490256608559692538361571095921575989136588899";
        let records = serde_json::json!([
            lambda_record(&id(4), ARN, SEQ),
            packed_record(&id(4), ARN, later),
        ]);
        // Over the large size (here 10 bytes of payloads), even with an aggregate: in two steps,
        // each record known by its place, sequence number and arrival.
        let mut large = event(&records);
        let arrival = SystemTime::from(large.records[1].kinesis.approximate_arrival_timestamp.0);
        let (read, aggregates) = parse_event(&mut large, 10);
        assert!(aggregates);
        let ReadEvent::Placed { key, placed, .. } = &read else {
            panic!("a large event is read in two steps")
        };
        assert_eq!(*key, LeaseKey::new("orders", "shardId-000000000004"));
        let places: Vec<_> = placed
            .iter()
            .map(|place| (place.index, place.sequence.as_str(), place.arrival))
            .collect();
        assert_eq!(places, [(0, SEQ, arrival), (1, later, arrival)]);
        assert!(large.records.is_empty(), "taken out of the event");
        let read: Vec<_> = read.into_parsed().into_iter().map(Result::unwrap).collect();
        assert_eq!(read[1].data(), AGGREGATE);
        // Records of two shards: read one by one, and the aggregate still seen.
        let mut mixed = event(&serde_json::json!([
            lambda_record(&id(5), ARN, SEQ),
            packed_record(&id(4), ARN, later),
        ]));
        let (read, aggregates) = parse_event(&mut mixed, LARGE);
        assert!(aggregates && matches!(read, ReadEvent::Mixed(_)));
        let mut plain_mixed = event(&serde_json::json!([
            lambda_record(&id(5), ARN, SEQ),
            lambda_record(&id(4), ARN, later),
        ]));
        assert!(!parse_event(&mut plain_mixed, LARGE).1);
    }

    #[test]
    fn records_of_one_shard_share_one_key() {
        let id = format!("shardId-000000000004:{SEQ}");
        let parsed = read(&mut event(&serde_json::json!([
            lambda_record(&id, ARN, SEQ),
            lambda_record(
                &id,
                ARN,
                "49590338271490256608559692538361571095921575989136588899"
            ),
        ])));
        let keys: Vec<_> = parsed.iter().map(|r| r.as_ref().unwrap().key()).collect();
        assert!(std::ptr::eq(keys[0].stream(), keys[1].stream()));
    }

    #[test]
    fn a_batch_of_one_shard_reads_as_that_shard_and_any_other_as_records_to_group() {
        let id = |shard: u32| format!("shardId-00000000000{shard}:{SEQ}");
        let later = "49590338271490256608559692538361571095921575989136588899";
        let consumer = format!("{ARN}/consumer/app:1700000000");
        // One shard, named by its stream's ARN and by a consumer's: one key, in order.
        let (read, _) = parse_event(
            &mut event(&serde_json::json!([
                lambda_record(&id(4), ARN, SEQ),
                lambda_record(&id(4), &consumer, later),
            ])),
            LARGE,
        );
        let ReadEvent::OneShard { key, records } = read else {
            panic!("one shard's batch")
        };
        assert_eq!(key, LeaseKey::new("orders", "shardId-000000000004"));
        let sequences: Vec<_> = records.iter().map(|r| r.sequence().as_str()).collect();
        assert_eq!(sequences, [SEQ, later]);
        assert!(records.iter().all(|record| *record.key() == key));
        // Two shards, even back to the first, or a record not read: grouped record by record,
        // each in its place.
        let mixed = [
            serde_json::json!([
                lambda_record(&id(4), ARN, SEQ),
                lambda_record(&id(5), ARN, SEQ),
                lambda_record(&id(4), ARN, later),
            ]),
            serde_json::json!([
                lambda_record(&id(4), ARN, SEQ),
                lambda_record(&id(4), ARN, "007"),
            ]),
            serde_json::json!([lambda_record("no-colon-here", ARN, SEQ)]),
        ];
        for records in &mixed {
            let (read, _) = parse_event(&mut event(records), LARGE);
            let ReadEvent::Mixed(parsed) = read else {
                panic!("not one shard's batch: {records}")
            };
            assert_eq!(parsed.len(), records.as_array().unwrap().len());
        }
        // No record at all: nothing to group.
        let (read, _) = parse_event(&mut event(&serde_json::json!([])), LARGE);
        assert!(matches!(read, ReadEvent::Mixed(parsed) if parsed.is_empty()));
    }

    #[test]
    fn each_record_is_read_with_its_own_shard_when_the_event_id_changes() {
        let arn = ARN;
        let parsed = read(&mut event(&serde_json::json!([
            lambda_record(&format!("shardId-000000000004:{SEQ}"), arn, SEQ),
            // The last shard's id as a prefix of a longer one, then with nothing after its colon.
            lambda_record(&format!("shardId-0000000000041:{SEQ}"), arn, SEQ),
            lambda_record("shardId-0000000000041:", arn, SEQ),
            lambda_record(&format!("shardId-000000000005:{SEQ}"), arn, SEQ),
            lambda_record(&format!("shardId-000000000005:{SEQ}"), arn, SEQ),
        ])));
        let shards: Vec<_> = parsed
            .iter()
            .map(|r| r.as_ref().map(Record::shard).ok())
            .collect();
        assert_eq!(
            shards,
            [
                Some("shardId-000000000004"),
                Some("shardId-0000000000041"),
                None,
                Some("shardId-000000000005"),
                Some("shardId-000000000005"),
            ]
        );
    }

    #[test]
    fn each_record_is_read_with_its_own_stream_when_the_arn_changes() {
        let id = format!("shardId-000000000004:{SEQ}");
        let other = "arn:aws:kinesis:us-east-1:123456789012:stream/refunds";
        let parsed = read(&mut event(&serde_json::json!([
            lambda_record(&id, ARN, SEQ),
            lambda_record(&id, other, SEQ),
            lambda_record(&id, "arn:aws:sqs:x:y:z", SEQ),
            lambda_record(&id, ARN, SEQ),
        ])));
        let streams: Vec<_> = parsed
            .iter()
            .map(|r| r.as_ref().map(Record::stream).ok())
            .collect();
        assert_eq!(
            streams,
            [Some("orders"), Some("refunds"), None, Some("orders")]
        );
    }

    #[test]
    fn an_unreadable_record_names_what_is_known_and_what_is_wrong() {
        let parsed = read(&mut event(&serde_json::json!([
            lambda_record("no-colon-here", ARN, SEQ),
            lambda_record(
                &format!("shardId-000000000001:{SEQ}"),
                "arn:aws:sqs:x:y:z",
                SEQ
            ),
            lambda_record(&format!("shardId-000000000001:{SEQ}"), ARN, "00"),
            lambda_record(&format!("shardId-000000000001:{SEQ}"), ARN, ""),
        ])));
        let errors: Vec<MalformedRecord> = parsed
            .into_iter()
            .map(|r| *r.expect_err("malformed"))
            .collect();
        assert!(matches!(errors[0].reason, MalformedReason::EventId(_)));
        assert_eq!(errors[0].stream.as_deref(), Some("orders"));
        assert_eq!(errors[0].reportable_sequence().unwrap().as_str(), SEQ);
        assert!(matches!(errors[1].reason, MalformedReason::SourceArn(_)));
        assert_eq!(errors[1].shard.as_deref(), Some("shardId-000000000001"));
        assert!(matches!(
            errors[2].reason,
            MalformedReason::Sequence(SequenceError::LeadingZero(_))
        ));
        assert_eq!(errors[2].reportable_sequence(), None);
        assert_eq!(errors[3].sequence, None);
        let message = errors[0].to_string();
        assert!(message.contains("stream orders"), "{message}");
        assert!(message.contains(SEQ), "{message}");
        assert!(message.contains("eventID"), "{message}");
        let message = errors[3].to_string();
        assert!(message.contains("shard shardId-000000000001"), "{message}");
        assert!(message.contains("sequence number unknown"), "{message}");
    }
}
