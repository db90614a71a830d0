//! What an operator reads when an AWS call fails: one line that says what was being done (the
//! request, the table, stream or queue, the row or shard) and why, as the service's error code
//! and message, or the causes of a request that never got an answer. Not the SDK's nested
//! `ServiceError { .. }` debug dump. Against moto (`DynamoDB`, Kinesis, SQS) on 127.0.0.1.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::sync::{Arc, Mutex, PoisonError};

use common::moto::{Moto, create_lease_table, sdk_config, unique};
use common::{batch, context, reported};
use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterReason};
use kinesis_checkpoint::gate::{Gate, KinesisTopology, StartingPosition, Topology};
use kinesis_checkpoint::{
    DeadLetterSink, DynamoLeaseStore, LeaseKey, Outcome, Processor, Record, SqsDeadLetters,
};
use tracing_subscriber::fmt::MakeWriter;

/// The longest an error may be; the SDK's dump of the same failure is several times longer.
const SHORT: usize = 300;

/// Asserts that `message` is one line, short, free of debug output, and contains each of
/// `names`.
fn assert_readable(message: &str, names: &[&str]) {
    eprintln!("{message}");
    assert!(!message.contains('\n'), "one line: {message}");
    assert!(
        message.len() < SHORT,
        "under {SHORT} characters, got {}: {message}",
        message.len()
    );
    for debug in ["ServiceError", "ErrorMetadata", "{", "raw:"] {
        assert!(
            !message.contains(debug),
            "no debug dump ({debug}): {message}"
        );
    }
    for name in names {
        assert!(message.contains(name), "names {name:?}: {message}");
    }
}

#[tokio::test]
async fn a_missing_lease_table_fails_in_one_short_line_naming_table_row_and_code() {
    let moto = Moto::shared();
    let config = moto.sdk_config(1).await;
    let table = unique("no-such-table");
    let store = DynamoLeaseStore::new(&config, table.clone());
    let key = LeaseKey::new("orders", "shardId-000000000000");

    let error = store
        .read(&key)
        .await
        .expect_err("the table does not exist");

    let message = error.to_string();
    assert_readable(
        &message,
        &[
            "DynamoDB GetItem",
            &format!("table '{table}'"),
            "orders:shardId-000000000000",
            "ResourceNotFoundException",
        ],
    );
}

#[tokio::test]
async fn a_missing_stream_fails_in_one_short_line_naming_the_stream_and_the_code() {
    let moto = Moto::shared();
    let config = moto.sdk_config(1).await;
    let topology = KinesisTopology::new(&config);

    let error = topology
        .shards("no-such-stream")
        .await
        .expect_err("the stream does not exist");

    assert_readable(
        &error.to_string(),
        &["Kinesis ListShards on stream 'no-such-stream' failed: ResourceNotFoundException"],
    );
}

#[tokio::test]
async fn a_shard_that_cannot_be_read_fails_in_one_line_naming_shard_and_sequence() {
    let moto = Moto::shared();
    let config = moto.sdk_config(1).await;
    let topology = KinesisTopology::new(&config);
    let after = common::sequence(41);

    let error = topology
        .exhausted("no-such-stream", "shardId-000000000003", Some(&after))
        .await
        .expect_err("the stream does not exist");

    assert_readable(
        &error.to_string(),
        &[
            &format!(
                "Kinesis GetShardIterator of shard 'shardId-000000000003' after {after} on stream 'no-such-stream' failed"
            ),
            "ResourceNotFoundException",
        ],
    );
}

#[tokio::test]
async fn a_missing_dead_letter_queue_fails_in_one_short_line_naming_record_queue_and_code() {
    let moto = Moto::shared();
    let config = moto.sdk_config(1).await;
    let queue = format!("{}/123456789012/{}", moto.endpoint, unique("no-such-queue"));
    let sink = SqsDeadLetters::new(&config, queue.clone());
    let record = Record::new(
        LeaseKey::new("orders", "shardId-000000000000"),
        common::sequence(7).parse().unwrap(),
        "customer-7",
        "{}",
    );
    let letter = DeadLetter::new(record, 1, "not an order", DeadLetterReason::Rejected);

    let error = sink
        .send(&letter)
        .await
        .expect_err("the queue does not exist");

    assert_readable(
        &error.to_string(),
        &[&common::sequence(7), &queue, "NonExistentQueue"],
    );
}

#[tokio::test]
async fn a_request_that_gets_no_answer_fails_in_one_line_with_its_causes() {
    // A port nobody listens on: the connection is refused, no service answers.
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = sdk_config(&format!("http://127.0.0.1:{closed}"), 1).await;
    let store = DynamoLeaseStore::new(&config, "leases");
    let key = LeaseKey::new("orders", "shardId-000000000000");

    let error = store.read(&key).await.expect_err("nothing listens");

    let message = error.to_string();
    assert_readable(
        &message,
        &[
            "DynamoDB GetItem on table 'leases' for 'orders:shardId-000000000000' failed: dispatch failure",
        ],
    );
    assert!(
        message.to_ascii_lowercase().contains("connect"),
        "says that the connection failed: {message}"
    );
}

/// Everything a subscriber writes, kept for the assertions.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// The case: a gate that cannot list the stream's shards logs why, in one line that
/// names the stream and shard (the span) and the service's code, and holds the shard.
#[tokio::test]
async fn the_log_line_of_a_gate_that_cannot_list_the_shards_is_one_short_line() {
    let moto = Moto::shared();
    let config = moto.sdk_config(1).await;
    let table = unique("leases");
    create_lease_table(&config, &table).await;
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(logs.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let stream = unique("no-such-stream");
    let processor = Processor::new(
        Arc::new(DynamoLeaseStore::new(&config, table)),
        |_: Record| async { Outcome::ack() },
    )
    .gate(Gate::new(
        Arc::new(KinesisTopology::new(&config)),
        StartingPosition::TrimHorizon,
    ));
    let event = batch(&stream, "shardId-000000000001", 0..3);
    let first = event.records[0].kinesis.sequence_number.clone();

    let response = processor
        .process(event, &context("gate", 60_000))
        .await
        .unwrap();

    assert_eq!(reported(&response), vec![first], "the shard is held");
    let text = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    let line = text
        .lines()
        .find(|line| line.contains("ListShards"))
        .unwrap_or_else(|| panic!("the failure is logged: {text}"));
    assert!(
        line.len() < SHORT + 200,
        "short (the span names the batch, stream and shard), got {}: {line}",
        line.len()
    );
    for name in [
        stream.as_str(),
        "shardId-000000000001",
        "ResourceNotFoundException",
    ] {
        assert!(line.contains(name), "names {name}: {line}");
    }
    assert!(!line.contains("ServiceError"), "no debug dump: {line}");
}
