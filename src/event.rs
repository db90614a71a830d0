//! Lambda's Kinesis event, and how the records a handler sees are read out of it.
//!
//! Lambda's event names the shard only inside `eventID` (`shardId-…:<sequence>`) and the stream
//! only inside `eventSourceARN`; the handler, the lease and every log line need both, so they are
//! parsed once here. A record that cannot be parsed becomes a [`MalformedRecord`] that says what
//! was wrong and where, never a record that silently disappears from the batch.
//!
//! This is the wire side of intake: the event's JSON (`lambda`), its quirks (`aws_lambda_events`'s
//! reading of arrival times), its failures, and how its records are read (`read`). What a
//! handler holds once the event is read, the [`Record`](crate::Record), has its own module,
//! which knows nothing of this one: records also come from KPL aggregates, local sources and
//! tests. One shard's plain records are held where the event holds them; a large event of one
//! shard is read in two steps, its payloads only as dispatch reaches them (`placed`).

mod lambda;
mod placed;
mod read;

use aws_lambda_events::event::kinesis::KinesisEvent;

use crate::sequence::{SequenceError, SequenceNumber};

pub(crate) use self::placed::{LARGE, Payloads, Placed};
pub(crate) use self::read::{Parsed, ReadEvent, parse_event};

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
    /// `eventSourceARN` is missing or not a Kinesis or `DynamoDB` stream ARN.
    #[error(
        "eventSourceARN {0:?} is not 'arn:aws:kinesis:<region>:<account>:stream/<name>' or 'arn:aws:dynamodb:<region>:<account>:table/<table>/stream/<label>'"
    )]
    SourceArn(Option<String>),
    /// `kinesis.sequenceNumber` is not a sequence number.
    #[error("kinesis.sequenceNumber is not a sequence number: {0}")]
    Sequence(SequenceError),
    /// A `DynamoDB` stream change that is not JSON or has no `dynamodb.SequenceNumber`.
    #[error("the DynamoDB stream change has no readable dynamodb.SequenceNumber: {0}")]
    Change(String),
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

/// The stream name inside a Kinesis stream ARN, also under enhanced fan-out
/// (`…:stream/NAME/consumer/CONSUMER:TIMESTAMP`); a `DynamoDB` stream's whole ARN.
///
/// ```
/// use kinesis_checkpoint::event::stream_name;
///
/// assert_eq!(stream_name("arn:aws:kinesis:eu-west-1:123456789012:stream/orders"), Some("orders"));
/// assert_eq!(
///     stream_name("arn:aws:kinesis:eu-west-1:123456789012:stream/orders/consumer/app:1700000000"),
///     Some("orders"),
/// );
/// let table = "arn:aws:dynamodb:eu-west-1:123456789012:table/orders/stream/2026-12-07T00:45:33.175";
/// assert_eq!(stream_name(table), Some(table));
/// assert_eq!(stream_name("arn:aws:sqs:eu-west-1:123456789012:orders"), None);
/// ```
#[must_use]
pub fn stream_name(arn: &str) -> Option<&str> {
    // Read once per batch (the first record's ARN; the others are compared with it whole).
    // Fields are cut at their colons byte by byte: `splitn`'s searcher cost ten times as much
    // on an ARN's short fields (the `processor` bench).
    let rest = arn.strip_prefix("arn:")?;
    let (_partition, rest) = at_colon(rest)?;
    if let Some(rest) = rest.strip_prefix("dynamodb:") {
        // A DynamoDB stream is named by its whole ARN: DynamoDB Streams' API asks for it.
        let (_region, rest) = at_colon(rest)?;
        let (_account, rest) = at_colon(rest)?;
        let (_table, label) = rest.strip_prefix("table/")?.split_once("/stream/")?;
        return (!label.is_empty()).then_some(arn);
    }
    let rest = rest.strip_prefix("kinesis:")?;
    let (_region, rest) = at_colon(rest)?;
    let (_account, rest) = at_colon(rest)?;
    let name = rest.strip_prefix("stream/")?;
    let name = name
        .split_at(name.bytes().position(|b| b == b'/').unwrap_or(name.len()))
        .0;
    (!name.is_empty()).then_some(name)
}

/// `text` cut at its first colon, the colon dropped.
fn at_colon(text: &str) -> Option<(&str, &str)> {
    let colon = text.bytes().position(|b| b == b':')?;
    Some((&text[..colon], &text[colon + 1..]))
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
    let (shard, sequence) = at_colon(event_id)?;
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

/// Lambda's Kinesis event as [`Processor::service`](crate::Processor::service) reads it: each
/// field the processor uses as [`LambdaKinesisEvent`] reads it, and the others checked and
/// dropped.
///
/// No part of the processor, and nothing a handler is given, reads `awsRegion`, `eventName`,
/// `eventSource`, `eventVersion`, `invokeIdentityArn` or `kinesis.kinesisSchemaVersion`.
/// Here they are refused as `aws_lambda_events` refuses them (anything but a string or `null`,
/// a field twice), with the same messages, but not copied out of the input: six allocations
/// fewer per record, 8 to 9 % of the instructions an invocation spends on a 1 KB record
/// (the `processor` bench). In the [`KinesisEvent`] they are `None`. The
/// stream ARN, event id, sequence number, partition key, payload, arrival time and encryption
/// type are read as [`LambdaKinesisEvent`] reads them. To keep every field, read the event as
/// [`LambdaKinesisEvent`] and give it to [`Processor::process`](crate::Processor::process).
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::event::{InvocationEvent, LambdaKinesisEvent};
///
/// let json = r#"{"Records":[{"eventID":"shardId-000000000000:1","awsRegion":"eu-west-1",
///     "kinesis":{"sequenceNumber":"1","partitionKey":"k","data":"aGk=",
///     "approximateArrivalTimestamp":1700000000.5}}]}"#;
/// let InvocationEvent(read) = serde_json::from_str(json)?;
/// let LambdaKinesisEvent(whole) = serde_json::from_str(json)?;
/// assert_eq!(read.records[0].kinesis, whole.records[0].kinesis);
/// assert_eq!(read.records[0].event_id, whole.records[0].event_id);
/// assert_eq!(read.records[0].aws_region, None);
/// assert_eq!(whole.records[0].aws_region.as_deref(), Some("eu-west-1"));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InvocationEvent(pub KinesisEvent);

#[cfg(test)]
mod tests {
    use super::*;

    const ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/orders";

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
        // Each of the five fields before the resource is cut at its colon, empty or not; the
        // resource keeps its own.
        assert_eq!(stream_name("arn:aws:kinesis:us-east-1:1"), None);
        assert_eq!(stream_name("arn::kinesis:::stream/x"), Some("x"));
        assert_eq!(stream_name("arn:aws:kinesis:r:1:stream/a:b"), Some("a:b"));
        assert_eq!(stream_name("arn:aws:sqs:r:1:stream/a"), None);
        assert_eq!(stream_name("arn:aws:kinesis:r:1:table/a/stream/b"), None);
        assert_eq!(shard_id(":123"), None);
        assert_eq!(shard_id("shardId-1:"), None);
    }
}
