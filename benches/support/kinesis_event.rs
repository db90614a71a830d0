//! The Lambda event every bench reads: records of one shard, `shardId-000000000000` of stream
//! `orders`, shaped as Lambda's Kinesis event source mapping delivers them, with Kinesis'
//! 56-digit sequence numbers. One place writes it, so that the benches that compare their
//! figures (the processor's and the JSON readers') read the same bytes.
//!
//! Included by path (`#[path = "support/kinesis_event.rs"]`): each bench is a crate of its own,
//! and `benches/json_readers` a workspace of its own.

use base64::Engine as _;
use serde_json::{Value, json};

/// The first digits every sequence number shares; each record's own 7 follow.
pub const SEQUENCE_PREFIX: &str = "4965613927021873511896241617838653987429043548461";

/// Record `n` of the shard, under `partition_key`, carrying `data`.
pub fn record(n: u64, partition_key: &str, data: &[u8]) -> Value {
    let sequence = format!("{SEQUENCE_PREFIX}{n:07}");
    json!({
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": partition_key,
            "sequenceNumber": sequence,
            "data": base64::engine::general_purpose::STANDARD.encode(data),
            "approximateArrivalTimestamp": 1_764_512_345.5,
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": format!("shardId-000000000000:{sequence}"),
        "eventName": "aws:kinesis:record",
        "invokeIdentityArn": "arn:aws:iam::123456789012:role/bench",
        "awsRegion": "us-east-1",
        "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
    })
}

/// The event holding `records`, in order.
pub fn event(records: &[Value]) -> Value {
    json!({ "Records": records })
}

/// The processor bench's event, as JSON bytes: `count` records, each a JSON order of exactly
/// `payload_bytes` (at least about 60) under one of 64 partition keys.
#[allow(
    dead_code,
    reason = "included by path into benches that build their own events too"
)]
pub fn orders(count: u64, payload_bytes: usize) -> Vec<u8> {
    let records: Vec<Value> = (0..count)
        .map(|n| {
            let head = format!(
                r#"{{"order_id":"order-{n}","amount_cents":{},"note":""#,
                n % 997
            );
            let note = "x".repeat(payload_bytes - head.len() - 2);
            let payload = format!(r#"{head}{note}"}}"#);
            assert_eq!(payload.len(), payload_bytes);
            record(n, &format!("order-{}", n % 64), payload.as_bytes())
        })
        .collect();
    serde_json::to_vec(&event(&records)).expect("serializable")
}
