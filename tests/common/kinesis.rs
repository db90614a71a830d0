//! kinesis-local, a Kinesis emulator that gets split, merge and shard ends right, started by the
//! tests on 127.0.0.1 and ended with them; and helpers to write to it and read it back as Lambda
//! would deliver it.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_config::SdkConfig;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{ShardIteratorType, StreamStatus};
use base64::Engine;
use serde_json::{Value, json};

/// A running kinesis-local.
pub struct KinesisLocal {
    /// `http://127.0.0.1:PORT`, its plain-HTTP port.
    pub endpoint: String,
    child: Child,
}

/// The emulator's script: `KINESIS_LOCAL_MAIN`, else where `make test` installs it.
fn main_js() -> PathBuf {
    if let Some(path) = std::env::var_os("KINESIS_LOCAL_MAIN") {
        return path.into();
    }
    super::root().join(".tools/node_modules/kinesis-local/main.js")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl KinesisLocal {
    pub fn start() -> Self {
        let main = main_js();
        let root = super::root();
        let (plain, tls) = (free_port(), free_port());
        let mut command = Command::new("node");
        command
            .arg("-r")
            .arg(root.join("tests/support/loopback.js"))
            .arg(&main)
            .env("KINESIS_MOCK_PLAIN_PORT", plain.to_string())
            .env("KINESIS_MOCK_TLS_PORT", tls.to_string())
            .env("KINESIS_MOCK_CERT_PATH", main.with_file_name("server.json"))
            .env("LOG_LEVEL", "WARN")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for operation in [
            "CREATE_STREAM",
            "DELETE_STREAM",
            "REGISTER_STREAM_CONSUMER",
            "START_STREAM_ENCRYPTION",
            "STOP_STREAM_ENCRYPTION",
            "DEREGISTER_STREAM_CONSUMER",
            "MERGE_SHARDS",
            "SPLIT_SHARD",
            "UPDATE_SHARD_COUNT",
            "UPDATE_STREAM_MODE",
        ] {
            command.env(format!("{operation}_DURATION"), "0ms");
        }
        let child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start kinesis-local ({}): {e}; run `make test`, which installs it",
                main.display()
            )
        });
        let deadline = Instant::now() + Duration::from_mins(1);
        while TcpStream::connect(("127.0.0.1", plain)).is_err() {
            assert!(
                Instant::now() < deadline,
                "kinesis-local did not listen on {plain}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            endpoint: format!("http://127.0.0.1:{plain}"),
            child,
        }
    }
}

impl Drop for KinesisLocal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stream on the emulator, and what the tests do with it.
pub struct Stream {
    pub client: Client,
    pub name: String,
}

impl Stream {
    /// Creates a stream of one shard and waits until it is active.
    pub async fn create(config: &SdkConfig, name: &str) -> Self {
        Self::with_shards(config, name, 1).await
    }

    /// Creates a stream of `shards` shards and waits until it is active.
    pub async fn with_shards(config: &SdkConfig, name: &str, shards: i32) -> Self {
        let client = Client::new(config);
        client
            .create_stream()
            .stream_name(name)
            .shard_count(shards)
            .send()
            .await
            .expect("create stream");
        let stream = Self {
            client,
            name: name.to_owned(),
        };
        stream.wait_active().await;
        stream
    }

    async fn wait_active(&self) {
        for _ in 0..200 {
            let summary = self
                .client
                .describe_stream_summary()
                .stream_name(&self.name)
                .send()
                .await
                .unwrap();
            if summary
                .stream_description_summary()
                .map(aws_sdk_kinesis::types::StreamDescriptionSummary::stream_status)
                == Some(&StreamStatus::Active)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("stream {} did not become active", self.name);
    }

    /// Writes `{"n": n, "key": key}` under partition key `key`.
    pub async fn put(&self, key: &str, n: u64) {
        self.client
            .put_record()
            .stream_name(&self.name)
            .partition_key(key)
            .data(Blob::new(json!({ "n": n, "key": key }).to_string()))
            .send()
            .await
            .expect("put record");
    }

    /// Writes `data` as it is (a KPL aggregate, say) under partition key `key`.
    #[allow(dead_code, reason = "not every test binary writes raw records")]
    pub async fn put_bytes(&self, key: &str, data: Vec<u8>) {
        self.client
            .put_record()
            .stream_name(&self.name)
            .partition_key(key)
            .data(Blob::new(data))
            .send()
            .await
            .expect("put record");
    }

    /// Splits `shard` in two halves of the hash key range.
    pub async fn split(&self, shard: &str) {
        self.client
            .split_shard()
            .stream_name(&self.name)
            .shard_to_split(shard)
            .new_starting_hash_key((1_u128 << 127).to_string())
            .send()
            .await
            .expect("split shard");
        self.wait_active().await;
    }

    /// Merges two adjacent shards.
    pub async fn merge(&self, shard: &str, adjacent: &str) {
        self.client
            .merge_shards()
            .stream_name(&self.name)
            .shard_to_merge(shard)
            .adjacent_shard_to_merge(adjacent)
            .send()
            .await
            .expect("merge shards");
        self.wait_active().await;
    }

    /// Every record of `shard`, as the event source mapping would deliver them in one batch.
    pub async fn batch(&self, shard: &str) -> KinesisEvent {
        let mut iterator = self
            .client
            .get_shard_iterator()
            .stream_name(&self.name)
            .shard_id(shard)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator;
        let mut records = Vec::new();
        while let Some(current) = iterator {
            let page = self
                .client
                .get_records()
                .shard_iterator(current)
                .send()
                .await
                .unwrap();
            if page.records().is_empty() {
                break;
            }
            for record in page.records() {
                records.push(lambda_record(&self.name, shard, record));
            }
            iterator = page.next_shard_iterator;
        }
        serde_json::from_value(json!({ "Records": records })).unwrap()
    }
}

fn lambda_record(stream: &str, shard: &str, record: &aws_sdk_kinesis::types::Record) -> Value {
    let sequence = record.sequence_number();
    json!({
        "kinesis": {
            "kinesisSchemaVersion": "1.0",
            "partitionKey": record.partition_key(),
            "sequenceNumber": sequence,
            "data": base64::engine::general_purpose::STANDARD.encode(record.data().as_ref()),
            "approximateArrivalTimestamp": 1_764_512_345.0,
        },
        "eventSource": "aws:kinesis",
        "eventVersion": "1.0",
        "eventID": format!("{shard}:{sequence}"),
        "eventName": "aws:kinesis:record",
        "awsRegion": "us-east-1",
        "eventSourceARN": format!("arn:aws:kinesis:us-east-1:000000000000:stream/{stream}"),
    })
}
