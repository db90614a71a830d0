//! The `DynamoDB` Streams flavour of the scenarios: each batch the local mapping delivers is sent
//! as the tumbling-window event a `DynamoDB` mapping would send (each record a change of an item
//! keyed by its partition key, its payload in the new image, the stream named by its ARN), read
//! by `WindowEvent::into_kinesis`, and run by the shard engine. The handler and the dead-letter
//! sink get each change back as the record it was written as, so every check stays the same.

use std::sync::Arc;

use aws_lambda_events::event::kinesis::KinesisEvent;
use base64::Engine;
use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterError, DeadLetterSink};
use kinesis_checkpoint::dynamodb_streams::WindowEvent;
use kinesis_checkpoint::{BoxFuture, LeaseKey, Record};
use serde_json::{Value, json};

/// The stream's ARN: the lease rows are keyed by it.
pub(crate) const ARN: &str =
    "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-12-07T00:00:00.000";

/// `event` as the `DynamoDB` mapping would deliver it, read back as the engine reads it.
pub(crate) fn through_window(event: &KinesisEvent) -> KinesisEvent {
    let shard = event
        .records
        .first()
        .and_then(|record| record.event_id.as_deref()?.split_once(':'))
        .map(|(shard, _)| shard.to_owned())
        .unwrap_or_default();
    let changes: Vec<Value> = event
        .records
        .iter()
        .map(|record| {
            let kinesis = &record.kinesis;
            // Whole seconds, as DynamoDB writes them.
            let seconds = kinesis.approximate_arrival_timestamp.0.timestamp();
            json!({
                "eventID": format!("{:032x}", kinesis.sequence_number.len()),
                "eventName": "INSERT",
                "eventSource": "aws:dynamodb",
                "dynamodb": {
                    "ApproximateCreationDateTime": seconds,
                    "Keys": {"pk": {"S": kinesis.partition_key}},
                    "NewImage": {
                        "pk": {"S": kinesis.partition_key},
                        "payload": {"B": base64::engine::general_purpose::STANDARD.encode(kinesis.data.as_slice())},
                    },
                    "SequenceNumber": kinesis.sequence_number,
                    "StreamViewType": "NEW_IMAGE",
                },
                "eventSourceARN": ARN,
            })
        })
        .collect();
    let window: WindowEvent = serde_json::from_value(json!({
        "Records": changes,
        "shardId": shard,
        "eventSourceARN": ARN,
        "window": {"start": "2026-12-07T00:00:00Z", "end": "2026-12-07T00:15:00Z"},
        "state": {},
        "isFinalInvokeForWindow": false,
        "isWindowTerminatedEarly": false,
    }))
    .expect("a window event");
    window.into_kinesis().expect("changes the processor reads")
}

/// The change `record` carries, as the record it was written as (stream `orders`).
pub(crate) fn original(record: &Record) -> Record {
    let change: Value = serde_json::from_slice(record.data()).expect("a change's JSON");
    let image = &change["dynamodb"]["NewImage"];
    let data = base64::engine::general_purpose::STANDARD
        .decode(image["payload"]["B"].as_str().expect("a payload"))
        .expect("base64");
    let partition_key = image["pk"]["S"].as_str().expect("a key").to_owned();
    assert_eq!(
        record.partition_key(),
        serde_json::to_string(&change["dynamodb"]["Keys"]).unwrap(),
        "the partition key is the item's keys"
    );
    assert_eq!(record.stream(), ARN, "the stream is named by its ARN");
    Record::new(
        LeaseKey::new("orders", record.shard()),
        record.sequence().clone(),
        partition_key,
        data,
    )
}

/// A sink that hands `inner` each dead letter's change as the record it was written as.
pub(crate) struct Unwrapping(pub(crate) Arc<dyn DeadLetterSink>);

impl DeadLetterSink for Unwrapping {
    fn send<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(async move {
            let mut unwrapped = DeadLetter::new(
                original(&letter.record),
                letter.attempts,
                letter.error.clone(),
                letter.reason,
            );
            unwrapped.at = letter.at;
            self.0.send(&unwrapped).await
        })
    }
}
