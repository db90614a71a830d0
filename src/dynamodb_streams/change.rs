//! One `DynamoDB` stream change read as the Kinesis record the engine runs: the sequence number,
//! the item's keys as the partition key, the creation time as the arrival, and the change's
//! JSON, untouched, as the payload.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use aws_lambda_events::encodings::SecondTimestamp;
use aws_lambda_events::event::kinesis::{KinesisEventRecord, KinesisRecord};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::event::{MalformedReason, MalformedRecord};

/// What the engine needs of a change; the rest stays in its JSON.
#[derive(Deserialize)]
struct Change {
    dynamodb: StreamRecord,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StreamRecord {
    sequence_number: String,
    #[serde(default)]
    keys: BTreeMap<String, Value>,
    #[serde(default)]
    approximate_creation_date_time: Option<f64>,
}

/// `sequence` without leading zeros. `DynamoDB` Local pads its numbers to 21 digits; without the
/// padding, numbers of any length compare as numbers do.
pub(super) fn canonical(sequence: &str) -> &str {
    let digits = sequence.trim_start_matches('0');
    if digits.is_empty() && !sequence.is_empty() {
        "0"
    } else {
        digits
    }
}

/// The change `raw`, the `index`th of `shard` of the stream `arn`, as a Kinesis record.
pub(super) fn kinesis_record(
    raw: &RawValue,
    arn: &str,
    shard: &str,
    index: usize,
) -> Result<KinesisEventRecord, MalformedRecord> {
    let change: Change = serde_json::from_str(raw.get()).map_err(|error| MalformedRecord {
        index,
        stream: Some(arn.to_owned()),
        shard: Some(shard.to_owned()),
        sequence: None,
        reason: MalformedReason::Change(error.to_string()),
    })?;
    let StreamRecord {
        sequence_number,
        keys,
        approximate_creation_date_time,
    } = change.dynamodb;
    let created = approximate_creation_date_time
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.0)
        .map_or(Duration::ZERO, Duration::from_secs_f64);
    let mut kinesis = KinesisRecord::default();
    canonical(&sequence_number).clone_into(&mut kinesis.sequence_number);
    // Sorted by attribute name (a `BTreeMap`): one item, one partition key, whatever order the
    // stream wrote its keys in.
    kinesis.partition_key = serde_json::to_string(&keys).unwrap_or_default();
    *kinesis.data = raw.get().as_bytes().to_vec();
    kinesis.approximate_arrival_timestamp = SecondTimestamp((UNIX_EPOCH + created).into());
    let mut record = KinesisEventRecord::default();
    record.event_id = Some(format!("{shard}:{}", kinesis.sequence_number));
    record.event_source_arn = Some(arn.to_owned());
    record.kinesis = kinesis;
    Ok(record)
}

/// The change's `SequenceNumber` as written, when it has one.
pub(super) fn sequence_number(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<Change>(raw.get())
        .ok()
        .map(|change| change.dynamodb.sequence_number)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARN: &str =
        "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-12-07T00:45:33.175";
    const SHARD: &str = "shardId-00000001796604333303-f37b0ef0";

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_owned()).unwrap()
    }

    #[test]
    fn a_change_keeps_its_json_and_its_keys_sorted_by_name() {
        let json = r#"{"eventName":"INSERT","dynamodb":{"Keys":{"sk":{"S":"b"},"pk":{"S":"a"}},"SequenceNumber":"000000000000000000007","ApproximateCreationDateTime":1796604333.5}}"#;
        let record = kinesis_record(&raw(json), ARN, SHARD, 0).unwrap();
        assert_eq!(record.kinesis.data.as_slice(), json.as_bytes());
        assert_eq!(
            record.kinesis.partition_key,
            r#"{"pk":{"S":"a"},"sk":{"S":"b"}}"#
        );
        assert_eq!(
            record.kinesis.sequence_number, "7",
            "without DynamoDB Local's padding"
        );
        assert_eq!(
            record.event_id.as_deref(),
            Some("shardId-00000001796604333303-f37b0ef0:7")
        );
        assert_eq!(
            record
                .kinesis
                .approximate_arrival_timestamp
                .0
                .timestamp_millis(),
            1_796_604_333_500
        );
    }

    #[test]
    fn a_change_without_a_sequence_number_names_its_stream_shard_and_place() {
        let error = kinesis_record(&raw(r#"{"dynamodb":{}}"#), ARN, SHARD, 3).unwrap_err();
        let message = error.to_string();
        for part in ["record 3 of the batch", SHARD, ARN, ".SequenceNumber"] {
            assert!(message.contains(part), "{part} in {message}");
        }
    }
}
