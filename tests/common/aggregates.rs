//! KPL aggregates on a stream held in memory, as Lambda delivers them: what the tests of
//! positions inside aggregates (`kpl_positions`, `five_methods`, `interop`) share.

use std::sync::{Arc, Mutex};

use base64::Engine;
use kinesis_checkpoint::processor::CheckpointMode;
use kinesis_checkpoint::{Outcome, Position, Processor, Record};
use kinesis_checkpoint_testing::local::MemoryStream;
use serde_json::{Value, json};

use super::context;

/// The stream every event here names.
pub const STREAM: &str = "orders";
/// The stream's first shard, the parent of a split.
pub const PARENT: &str = "shardId-000000000000";

/// The ten sub-records of the fixture `aws-kinesis-agg` made: the KPL aggregate's bytes.
pub fn ten_sub_records() -> (String, Vec<u8>) {
    let path = super::root().join("tests/fixtures/kpl/ten_sub_records.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let data = base64::engine::general_purpose::STANDARD
        .decode(fixture["data_base64"].as_str().unwrap())
        .unwrap();
    (
        fixture["outer_partition_key"].as_str().unwrap().to_owned(),
        data,
    )
}

/// The Lambda event of `shard`'s records of `stream`, from the one at `from` on.
pub fn event_of(stream: &MemoryStream, shard: &str, from: Option<&str>) -> Value {
    let records: Vec<Value> = stream
        .records(shard)
        .into_iter()
        .filter(|r| {
            from.is_none_or(|from| r.sequence.len() > from.len() || r.sequence.as_str() >= from)
        })
        .map(|r| {
            json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": r.partition_key,
                    "sequenceNumber": r.sequence,
                    "data": base64::engine::general_purpose::STANDARD.encode(&r.data),
                    "approximateArrivalTimestamp": 1_764_512_345.5,
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("{shard}:{}", r.sequence),
                "eventName": "aws:kinesis:record",
                "invokeIdentityArn": "arn:aws:iam::123456789012:role/test",
                "awsRegion": "us-east-1",
                "eventSourceARN": format!("arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}"),
            })
        })
        .collect();
    json!({ "Records": records })
}

/// What the handler ran: `sequence` or `sequence/sub`, in order.
pub type Ran = Arc<Mutex<Vec<String>>>;

/// A handler that notes each record it runs and asks, once, for a retry of sub-record `fail`.
pub fn noting(ran: &Ran, fail: Option<u64>) -> impl kinesis_checkpoint::Handler {
    noting_times(ran, fail, 1)
}

/// [`noting`], asking for a retry of sub-record `fail` its first `times` attempts.
pub fn noting_times(ran: &Ran, fail: Option<u64>, times: u32) -> impl kinesis_checkpoint::Handler {
    let ran = ran.clone();
    let failed = Arc::new(Mutex::new(0_u32));
    move |record: Record| {
        let mut failed = failed.lock().unwrap();
        let outcome = if fail.is_some() && record.sub_sequence() == fail && *failed < times {
            *failed += 1;
            Outcome::retry("the ledger is busy")
        } else {
            ran.lock().unwrap().push(record.position().to_string());
            Outcome::ack()
        };
        std::future::ready(outcome)
    }
}

/// A stream whose one shard holds a plain record then a KPL aggregate of ten sub-records, and
/// was then split; a record was written to a child. Returns the stream, the plain record's and
/// the aggregate's sequence numbers, and the child with its record.
pub fn split_after_an_aggregate() -> (MemoryStream, String, String, String) {
    let stream = MemoryStream::new(STREAM, 1);
    let plain = stream.put("plain", "before");
    let (outer_key, aggregate) = ten_sub_records();
    let aggregate_sequence = stream.put(&outer_key, aggregate);
    let _children = stream.split(PARENT);
    let child = stream.shard_of("after");
    stream.put("after", "in the child");
    (stream, plain, aggregate_sequence, child)
}

pub async fn process(
    processor: &Processor<impl kinesis_checkpoint::Handler, impl CheckpointMode>,
    event: Value,
    request: &str,
) -> kinesis_checkpoint::report::ShardReport {
    let event = serde_json::from_value(event).unwrap();
    let report = processor
        .process_batch(event, &context(request, 60_000))
        .await
        .unwrap();
    report.shards.into_iter().next().unwrap()
}

pub fn whole(sequence: &str) -> Position {
    Position::record(sequence.parse().unwrap())
}

pub fn inside(sequence: &str, sub: u64) -> Position {
    Position::sub_record(sequence.parse().unwrap(), sub)
}
