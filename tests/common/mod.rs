//! What the integration tests share: Lambda-shaped events, and real local servers (moto) started
//! on 127.0.0.1 by the tests themselves.
#![allow(dead_code, clippy::missing_panics_doc)]

pub mod aggregates;
pub mod deaths;
pub mod faults;
pub mod http;
pub mod kinesis;
pub mod moto;
pub mod sqs;
pub mod temp_file;
pub mod watch;
pub mod writes;

use std::path::PathBuf;

use aws_lambda_events::event::kinesis::KinesisEvent;
use base64::Engine;
use serde_json::{Value, json};

/// The repository's root, whichever workspace member's tests include this module.
pub fn root() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !dir.join("tests/support/moto_server.py").exists() {
        assert!(
            dir.pop(),
            "tests/support not found above {}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
    dir
}

/// A sequence number of Kinesis' shape: 56 digits, counting up from `n`.
pub fn sequence(n: u64) -> String {
    format!("4965613927021873511896241617838653987429043548461{n:07}")
}

/// One record as Lambda writes it into the event.
pub fn lambda_record(
    stream: &str,
    shard: &str,
    n: u64,
    partition_key: &str,
    data: &Value,
) -> Value {
    let sequence = sequence(n);
    let payload = base64::engine::general_purpose::STANDARD.encode(data.to_string());
    json!({
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": partition_key,
            "sequenceNumber": sequence,
            "data": payload,
            "approximateArrivalTimestamp": 1_764_512_345.5,
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": format!("{shard}:{sequence}"),
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": "arn:aws:iam::123456789012:role/test",
        "awsRegion": "us-east-1",
        "eventSourceARN": format!("arn:aws:kinesis:us-east-1:123456789012:stream/{stream}"),
    })
}

/// An event of records `range` of one shard, each payload `{"n": n}`.
pub fn batch(stream: &str, shard: &str, range: std::ops::Range<u64>) -> KinesisEvent {
    let records: Vec<Value> = range
        .map(|n| {
            lambda_record(
                stream,
                shard,
                n,
                &format!("key-{}", n % 7),
                &json!({ "n": n }),
            )
        })
        .collect();
    event(&records)
}

/// An event of the given records.
pub fn event(records: &[Value]) -> KinesisEvent {
    serde_json::from_value(json!({ "Records": records })).expect("a Lambda-shaped event")
}

/// The records of `event` from the one whose sequence number is `from` on: what the event source
/// mapping delivers again after that record was reported.
pub fn redeliver_from(event: &KinesisEvent, from: &str) -> KinesisEvent {
    let mut again = event.clone();
    let start = again
        .records
        .iter()
        .position(|r| r.kinesis.sequence_number == from)
        .expect("the reported record is in the batch");
    again.records.drain(..start);
    again
}

/// The `n` of a record made by [`batch`].
pub fn n_of(record: &kinesis_checkpoint::Record) -> u64 {
    record.json::<Value>().expect("json")["n"]
        .as_u64()
        .expect("n")
}

/// A Lambda context with a request id and `millis` left before the deadline.
pub fn context(request_id: &str, millis: u64) -> lambda_runtime::Context {
    let mut context = lambda_runtime::Context::default();
    request_id.clone_into(&mut context.request_id);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    context.deadline = u64::try_from(now).unwrap() + millis;
    context
}

/// The reported identifiers of a response, checking the wire form on the way: camelCase, never
/// a null or empty identifier.
pub fn reported(response: &aws_lambda_events::event::streams::KinesisEventResponse) -> Vec<String> {
    let wire = serde_json::to_value(response).expect("serializable");
    let failures = wire["batchItemFailures"]
        .as_array()
        .expect("batchItemFailures");
    failures
        .iter()
        .map(|failure| {
            let id = failure["itemIdentifier"]
                .as_str()
                .expect("a string identifier, never null");
            assert!(!id.is_empty(), "an empty identifier fails the whole batch");
            id.to_owned()
        })
        .collect()
}

/// The last write of an invocation that moves the checkpoint to `position` (if any), releases
/// the lease, and changes nothing else in the row.
pub fn checkpoint_at(
    position: Option<&kinesis_checkpoint::Position>,
) -> kinesis_checkpoint::internal::Commit {
    kinesis_checkpoint::internal::Commit {
        checkpoint: position.cloned(),
        ..Default::default()
    }
}
