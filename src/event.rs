//! Lambda's Kinesis event, and how the records a handler sees are read out of it.
//!
//! Lambda's event names the shard only inside `eventID` (`shardId-…:<sequence>`) and the stream
//! only inside `eventSourceARN`; the handler, the lease and every log line need both, so they are
//! parsed once here. A record that cannot be parsed becomes a [`MalformedRecord`] that says what
//! was wrong and where, never a record that silently disappears from the batch.
//!
//! This is the wire side of intake: the event's JSON, its quirks (`aws_lambda_events`'s reading
//! of arrival times) and its failures. What a handler holds once the event is read, the
//! [`Record`], has its own module, which knows nothing of the event: records also come from
//! KPL aggregates, local sources and tests. A large event of one shard is read in two steps,
//! its payloads only as dispatch reaches them (`placed`).

use std::time::SystemTime;

mod lambda;
mod placed;

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};

use crate::key::LeaseKey;
use crate::record::{Arrived, Record};
use crate::sequence::{SequenceError, SequenceNumber};

use self::placed::take_payload;
pub(crate) use self::placed::{LARGE, Payloads, Placed};

/// A record of Lambda's event that cannot be processed, with what is known of where it is.
///
/// The processor never drops one: it stops its shard there and reports the record, or, when not
/// even a sequence number can be read, fails the whole batch with this error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "record {index} of the batch (stream {}, shard {}, sequence number {}) cannot be processed: {reason}",
    or_unknown(.stream.as_deref()),
    or_unknown(.shard.as_deref()),
    or_unknown(.sequence.as_deref())
)]
pub struct MalformedRecord {
    /// The record's index in the event's `Records`.
    pub index: usize,
    /// The stream, when `eventSourceARN` could be read.
    pub stream: Option<String>,
    /// The shard, when `eventID` could be read.
    pub shard: Option<String>,
    /// The sequence number as the event gave it, when it gave one.
    pub sequence: Option<String>,
    /// What was wrong.
    pub reason: MalformedReason,
}

fn or_unknown(part: Option<&str>) -> &str {
    match part {
        Some(part) if !part.is_empty() => part,
        _ => "unknown",
    }
}

/// What made a record unreadable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MalformedReason {
    /// `eventID` is missing or not `shardId-…:<sequenceNumber>`.
    #[error("eventID {0:?} is not '<shardId>:<sequenceNumber>'")]
    EventId(Option<String>),
    /// `eventSourceARN` is missing or not a Kinesis stream ARN.
    #[error("eventSourceARN {0:?} is not 'arn:aws:kinesis:<region>:<account>:stream/<name>'")]
    SourceArn(Option<String>),
    /// `kinesis.sequenceNumber` is not a sequence number.
    #[error("kinesis.sequenceNumber is not a sequence number: {0}")]
    Sequence(SequenceError),
}

impl MalformedRecord {
    /// The sequence number to report for this record, when the event gave a valid one.
    ///
    /// ```
    /// # use kinesis_checkpoint::event::{MalformedReason, MalformedRecord};
    /// let record = MalformedRecord {
    ///     index: 0,
    ///     stream: Some("orders".into()),
    ///     shard: None,
    ///     sequence: Some("42".into()),
    ///     reason: MalformedReason::EventId(Some("nonsense".into())),
    /// };
    /// assert_eq!(record.reportable_sequence().map(|s| s.to_string()).as_deref(), Some("42"));
    /// ```
    #[must_use]
    pub fn reportable_sequence(&self) -> Option<SequenceNumber> {
        self.sequence
            .as_deref()
            .and_then(|digits| digits.parse().ok())
    }
}

/// The stream name inside a stream ARN, also under enhanced fan-out
/// (`…:stream/NAME/consumer/CONSUMER:TIMESTAMP`).
///
/// ```
/// use kinesis_checkpoint::event::stream_name;
///
/// assert_eq!(stream_name("arn:aws:kinesis:eu-west-1:123456789012:stream/orders"), Some("orders"));
/// assert_eq!(
///     stream_name("arn:aws:kinesis:eu-west-1:123456789012:stream/orders/consumer/app:1700000000"),
///     Some("orders"),
/// );
/// assert_eq!(stream_name("arn:aws:sqs:eu-west-1:123456789012:orders"), None);
/// ```
#[must_use]
pub fn stream_name(arn: &str) -> Option<&str> {
    let mut parts = arn.splitn(6, ':');
    let (Some("arn"), Some(_partition), Some("kinesis"), Some(_region), Some(_account)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    let name = parts.next()?.strip_prefix("stream/")?;
    let name = name.split('/').next().unwrap_or_default();
    (!name.is_empty()).then_some(name)
}

/// The shard id inside an `eventID` (`shardId-000000000000:<sequence>`). A shard id holds no
/// colon, so the first colon ends it.
///
/// ```
/// use kinesis_checkpoint::event::shard_id;
///
/// assert_eq!(shard_id("shardId-000000000002:4959"), Some("shardId-000000000002"));
/// assert_eq!(shard_id("shardId-000000000002"), None);
/// ```
#[must_use]
pub fn shard_id(event_id: &str) -> Option<&str> {
    let (shard, sequence) = event_id.split_once(':')?;
    (!shard.is_empty() && !sequence.is_empty()).then_some(shard)
}

/// Lambda's Kinesis event as [`Processor::service`](crate::Processor::service) reads it:
/// a [`KinesisEvent`] whose arrival times are exact, and which no timestamp can fail or panic.
///
/// `aws_lambda_events` reads `approximateArrivalTimestamp` through the decimal text of a float:
/// `.5` becomes 5 ms, six decimals (as emulators write) fail the whole event with "invalid
/// timestamp", and fourteen or more overflow a multiplication (a panic in a debug build). This
/// type reads each timestamp itself, to the microsecond, and every other field as
/// `aws_lambda_events` does (the same types, defaults and errors), in one pass over the bytes:
/// no intermediate `serde_json::Value`. Each payload is decoded from its base64 where it lies,
/// by a vectorised decoder (23 % fewer instructions per 1 KB record), which takes and refuses
/// the same texts as `aws_lambda_events`' with the same messages. An error names the field
/// (`Records[3].kinesis.data: …`) when read through `serde_path_to_error`, as the runtime does.
/// The event, its records and their `kinesis` must be JSON objects, as Lambda writes them:
/// `aws_lambda_events` would also take an array's items as the fields in order.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
///
/// use kinesis_checkpoint::event::LambdaKinesisEvent;
///
/// let json = r#"{"Records":[{"eventID":"shardId-000000000000:1","kinesis":{
///     "sequenceNumber":"1","partitionKey":"k","data":"",
///     "approximateArrivalTimestamp":1700000000.123456}}]}"#;
/// let LambdaKinesisEvent(event) = serde_json::from_str(json)?;
/// let arrival = SystemTime::from(event.records[0].kinesis.approximate_arrival_timestamp.0);
/// assert_eq!(arrival, UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LambdaKinesisEvent(pub KinesisEvent);

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

/// Reads every record of `event`, in order, taking the payloads out of it without copying them;
/// and says whether any of them is a KPL aggregate.
///
/// The rest of the event (a dozen strings per record) is left in place for the caller to drop
/// at the end of the batch. Freed here, those small blocks would fill glibc's fast bins, and
/// the batch's next large allocation would stop to consolidate all of them (see BENCHMARKS.md).
/// Aggregates are looked for here, where each payload was just decoded, rather than in a pass
/// of their own over every record's payload once the batch is grouped. A large event of one
/// shard is read in two steps instead (see [`Payloads`]).
pub(crate) fn parse_event(event: &mut KinesisEvent, large: usize) -> (ReadEvent, bool) {
    if let Some(read) = read_large(event, large) {
        return read;
    }
    let mut keys = KeyCache::default();
    let mut aggregates = false;
    let arrivals =
        Record::arrived_together(event.records.iter_mut().enumerate().map(|(index, record)| {
            let parsed = parse_record(index, record, &mut keys);
            if let Ok(arrival) = &parsed {
                aggregates |= crate::kpl::is_aggregate(&arrival.data);
            }
            parsed
        }));
    let read = match (arrivals, keys.only()) {
        (Ok(records), Some(key)) => ReadEvent::OneShard { key, records },
        (Ok(records), None) => ReadEvent::Mixed(records.into_iter().map(Ok).collect()),
        (Err(parsed), _) => ReadEvent::Mixed(parsed),
    };
    (read, aggregates)
}

/// The first step of reading a large event of one shard whose every record can be read: `None`
/// for a small event, or as soon as a record names another shard than the first or cannot be
/// read (the event is left as it was, for [`parse_event`] to read whole).
/// Otherwise the batch and whether any record is a KPL aggregate (by the first bytes of each
/// payload), the event's records taken out of `event`.
fn read_large(event: &mut KinesisEvent, large: usize) -> Option<(ReadEvent, bool)> {
    // Only each record's payload length is read here: a pass over a small event costs little,
    // and a large one's first pass reads the same records right after.
    let bytes: usize = event.records.iter().map(|r| r.kinesis.data.0.len()).sum();
    if bytes <= large {
        return None;
    }
    let mut keys = KeyCache::default();
    let mut aggregates = false;
    let mut placed = Vec::with_capacity(event.records.len());
    for (index, record) in event.records.iter().enumerate() {
        keys.key(
            record.event_source_arn.as_deref(),
            record.event_id.as_deref(),
        )?;
        if keys.several {
            return None;
        }
        let kinesis = &record.kinesis;
        aggregates |= crate::kpl::is_aggregate(&kinesis.data.0);
        placed.push(Placed {
            index,
            sequence: kinesis.sequence_number.parse().ok()?,
            arrival: SystemTime::from(kinesis.approximate_arrival_timestamp.0),
        });
    }
    let key = keys.only()?;
    let payloads = Payloads::new(key.clone(), std::mem::take(&mut event.records));
    let read = ReadEvent::Placed {
        key,
        placed,
        payloads,
    };
    Some((read, aggregates))
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
    use super::*;

    const ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/orders";
    const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

    /// Each record of `event` as read, however the event was read.
    fn read(event: &mut KinesisEvent) -> Vec<Parsed> {
        parse_event(event, LARGE).0.into_parsed()
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

    #[test]
    fn stream_names_come_from_stream_and_consumer_arns_only() {
        assert_eq!(stream_name(ARN), Some("orders"));
        assert_eq!(
            stream_name("arn:aws-cn:kinesis:cn-north-1:1:stream/a-b_c.d/consumer/x:17"),
            Some("a-b_c.d")
        );
        assert_eq!(stream_name("arn:aws:kinesis:us-east-1:1:stream/"), None);
        assert_eq!(
            stream_name("arn:aws:kinesis:us-east-1:1:table/orders"),
            None
        );
        assert_eq!(stream_name("orders"), None);
        assert_eq!(shard_id(":123"), None);
        assert_eq!(shard_id("shardId-1:"), None);
    }
}
