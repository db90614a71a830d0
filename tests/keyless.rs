//! Records without a partition key. Kinesis may leave the key out (the SDK's
//! `Record::partition_key` is an `Option`), and Lambda's event then has no `partitionKey` or a
//! `null` one. Such a record has the empty key `""`, which no producer can write: it is read
//! and processed like any other, the records without a key keep their order among themselves
//! under per-key concurrency, and the partition-key mode and its parent gate keep a row for
//! them (`stream:shard:`). On the embedded store and the in-memory stream; the SDK's side
//! against a small Kinesis stub on 127.0.0.1, since no emulator writes a record without a key.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use common::{context, reported};
use kinesis_checkpoint::event::InvocationEvent;
use kinesis_checkpoint::gate::{Gate, KinesisTopology, StartingPosition, Topology};
use kinesis_checkpoint::internal::row_key;
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Outcome, Processor, Record};
use kinesis_checkpoint_testing::local::MemoryStream;
use serde_json::{Value, json};

const STREAM: &str = "orders";

/// One record as Lambda writes it, with `partition_key` as the JSON value of `partitionKey`
/// (`None`: the field is left out).
fn lambda_record(shard: &str, sequence: &str, partition_key: Option<Value>) -> Value {
    let mut record = json!({
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "sequenceNumber": sequence,
            "data": "e30=",
            "approximateArrivalTimestamp": 1_764_512_345.5,
        },
        "eventSource": "aws:kinesis",
        "eventID": format!("{shard}:{sequence}"),
        "eventSourceARN": format!("arn:aws:kinesis:us-east-1:123456789012:stream/{STREAM}"),
    });
    if let Some(partition_key) = partition_key {
        record["kinesis"]["partitionKey"] = partition_key;
    }
    record
}

/// The event `service()` would read from `records`: through `InvocationEvent`.
fn read_event(records: &[Value]) -> aws_lambda_events::event::kinesis::KinesisEvent {
    let json = json!({ "Records": records }).to_string();
    let InvocationEvent(event) = serde_json::from_str(&json).expect("the event is read");
    event
}

/// The partition keys the handler saw, in the order it saw them.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, String)>>>);

impl Seen {
    fn handler(&self) -> impl Fn(Record) -> std::future::Ready<Outcome> + Send + Sync + 'static {
        let seen = self.clone();
        move |record: Record| {
            seen.0.lock().unwrap().push((
                record.partition_key().to_owned(),
                record.sequence().as_str().to_owned(),
            ));
            std::future::ready(Outcome::ack())
        }
    }

    fn take(&self) -> Vec<(String, String)> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

fn sequence(n: u64) -> String {
    common::sequence(n)
}

#[tokio::test]
async fn a_missing_or_null_partition_key_reaches_the_handler_as_the_empty_key() {
    let shard = "shardId-000000000000";
    let event = read_event(&[
        lambda_record(shard, &sequence(1), None),
        lambda_record(shard, &sequence(2), Some(Value::Null)),
        lambda_record(shard, &sequence(3), Some(json!("customer-3"))),
    ]);
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler());

    let response = processor
        .process(event.clone(), &context("first", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty(), "{response:?}");
    assert_eq!(
        seen.take(),
        [
            (String::new(), sequence(1)),
            (String::new(), sequence(2)),
            ("customer-3".to_owned(), sequence(3)),
        ]
    );
    let state = store.read(&LeaseKey::new(STREAM, shard)).await.unwrap();
    assert_eq!(state.checkpoint, Some(sequence(3)));
    // Delivered again: skipped like any other record.
    let again = processor
        .process(event, &context("again", 60_000))
        .await
        .unwrap();
    assert!(reported(&again).is_empty());
    assert!(seen.take().is_empty(), "nothing runs twice");
}

#[tokio::test]
async fn records_without_a_partition_key_keep_their_order_among_themselves_under_per_key_concurrency()
 {
    let shard = "shardId-000000000000";
    let keys = [None, Some("a"), None, Some("b"), None, Some("a"), None];
    let records = keys
        .iter()
        .zip(1..)
        .map(|(key, n)| lambda_record(shard, &sequence(n), key.map(|k| json!(k))))
        .collect::<Vec<_>>();
    let event = read_event(&records);
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler()).concurrency(8);

    let response = processor
        .process(event, &context("keyed", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty(), "{response:?}");
    let ran = seen.take();
    assert_eq!(ran.len(), keys.len(), "every record ran once: {ran:?}");
    let keyless: Vec<&str> = ran
        .iter()
        .filter(|(key, _)| key.is_empty())
        .map(|(_, sequence)| sequence.as_str())
        .collect();
    assert_eq!(
        keyless,
        [sequence(1), sequence(3), sequence(5), sequence(7)],
        "in order, as one key"
    );
    let state = store.read(&LeaseKey::new(STREAM, shard)).await.unwrap();
    assert_eq!(state.checkpoint, Some(sequence(7)));
}

/// The event of a shard's records in the in-memory stream, each with the JSON value
/// `partition_key` gives for its key ("" is written as a missing `partitionKey`).
fn stream_event(
    stream: &MemoryStream,
    shard: &str,
) -> aws_lambda_events::event::kinesis::KinesisEvent {
    let records = stream
        .records(shard)
        .into_iter()
        .map(|record| {
            let key = (!record.partition_key.is_empty()).then(|| json!(record.partition_key));
            lambda_record(shard, &record.sequence, key)
        })
        .collect::<Vec<_>>();
    read_event(&records)
}

#[tokio::test]
async fn the_partition_key_mode_and_its_gate_keep_a_row_for_records_without_a_key() {
    let stream = MemoryStream::new(STREAM, 1);
    let parent = "shardId-000000000000";
    let last_keyless = [
        stream.put("", "{}"),
        stream.put("k", "{}"),
        stream.put("", "{}"),
    ][2]
    .clone();
    let (left, right) = stream.split(parent);
    stream.put("", "{}");
    let child = stream.shard_of("");
    assert!(child == left || child == right);
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::by_partition_key(store.clone(), seen.handler()).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));

    // The child first: its parent's records without a key are not done, so it waits.
    let early = processor
        .process(stream_event(&stream, &child), &context("early", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&early).len(), 1, "held: {early:?}");
    assert!(seen.take().is_empty());

    let response = processor
        .process(stream_event(&stream, parent), &context("parent", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty(), "{response:?}");
    assert_eq!(seen.take().len(), 3, "the parent's records ran");
    let row = store
        .read(&row_key(&LeaseKey::new(STREAM, parent), ""))
        .await
        .unwrap();
    assert_eq!(row.checkpoint, Some(last_keyless), "the key-less row");
    assert_eq!(
        row_key(&LeaseKey::new(STREAM, parent), "").to_string(),
        format!("{STREAM}:{parent}:")
    );

    // Now the parent is finished for every key, the empty one included: the child runs.
    let late = processor
        .process(stream_event(&stream, &child), &context("late", 60_000))
        .await
        .unwrap();
    assert!(reported(&late).is_empty(), "{late:?}");
    assert_eq!(seen.take().len(), 1, "the child's record ran");
}

/// Answers one connection's requests as Kinesis would for a closed shard holding one record
/// without a partition key: an iterator, then that record and no next iterator.
fn serve_keyless_shard(stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let (mut target, mut length) = (String::new(), 0);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            match name.to_ascii_lowercase().as_str() {
                "x-amz-target" => value.trim().clone_into(&mut target),
                "content-length" => length = value.trim().parse().unwrap(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let answer = match target.as_str() {
            "Kinesis_20131202.GetShardIterator" => json!({ "ShardIterator": "iterator-1" }),
            "Kinesis_20131202.GetRecords" => json!({
                "Records": [{
                    "SequenceNumber": sequence(5),
                    "Data": "e30=",
                    "ApproximateArrivalTimestamp": 1_764_512_345.5,
                }],
                "MillisBehindLatest": 0,
            }),
            other => panic!("the stub serves no {other}"),
        }
        .to_string();
        write!(
            writer,
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.1\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        )
        .unwrap();
    }
}

#[tokio::test]
async fn a_record_the_sdk_reads_without_a_partition_key_has_the_empty_key() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_keyless_shard(stream));
        }
    });
    let config = common::moto::sdk_config(&endpoint, 1).await;

    let records = KinesisTopology::new(&config)
        .records(STREAM, "shardId-000000000000")
        .await
        .expect("the shard is read");

    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].partition_key(), "");
    assert_eq!(records[0].sequence().as_str(), sequence(5));
    assert_eq!(records[0].data(), b"{}");
    assert_eq!(records[0].shard(), "shardId-000000000000");
}
