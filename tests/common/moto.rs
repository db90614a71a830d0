//! moto, the AWS server emulator, started by the tests on 127.0.0.1 and ended with them.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_dynamodb::config::{Credentials, Region};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
};

use super::http;

/// A running moto server.
pub struct Moto {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The file moto's recorder appends requests to.
    recording: PathBuf,
    child: Child,
}

/// The interpreter that has moto: `KC_PYTHON`, else the repository's `.venv`, else `python3`.
pub fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("KC_PYTHON") {
        return python.into();
    }
    let venv = super::root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

impl Moto {
    /// Starts a server of its own: serving one request at a time when `threaded` is false.
    pub fn start(threaded: bool) -> Self {
        let script = super::root().join("tests/support/moto_server.py");
        let recording = std::env::temp_dir().join(format!(
            "kc-moto-recording-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        let mut child = Command::new(python())
            .arg(&script)
            .env("MOTO_THREADED", if threaded { "1" } else { "0" })
            .env("MOTO_RECORDER_FILEPATH", &recording)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start moto with {}: {e}; run `make test`, which installs it",
                    python().display()
                )
            });
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("moto prints its port");
        let port: u16 = line.trim().parse().unwrap_or_else(|_| {
            panic!(
                "moto did not start (printed {line:?}); is moto[server] installed for {}?",
                python().display()
            )
        });
        Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            recording,
            child,
        }
    }

    /// The server this test binary shares.
    pub fn shared() -> &'static Self {
        static MOTO: OnceLock<Moto> = OnceLock::new();
        MOTO.get_or_init(|| Self::start(true))
    }

    /// An SDK configuration for this server, with fake credentials and `attempts` tries per
    /// request.
    pub async fn sdk_config(&self, attempts: u32) -> SdkConfig {
        sdk_config(&self.endpoint, attempts).await
    }

    /// Empties the recorder and starts it.
    pub fn start_recording(&self) {
        self.control("POST", "/moto-api/recorder/reset-recording");
        self.control("POST", "/moto-api/recorder/start-recording");
    }

    /// Stops the recorder and returns the `X-Amz-Target` of every request it saw, in order.
    pub fn stop_recording(&self) -> Vec<String> {
        self.control("POST", "/moto-api/recorder/stop-recording");
        let text = std::fs::read_to_string(&self.recording).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .map(|entry| {
                let headers = entry["headers"].as_object().cloned().unwrap_or_default();
                headers
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case("x-amz-target"))
                    .and_then(|(_, value)| value.as_str())
                    .unwrap_or("(no target)")
                    .to_owned()
            })
            .collect()
    }

    /// Stops the recorder and returns, for every request it saw, its `X-Amz-Target` and its
    /// body as text.
    pub fn stop_recording_bodies(&self) -> Vec<(String, String)> {
        use base64::Engine as _;
        self.control("POST", "/moto-api/recorder/stop-recording");
        let text = std::fs::read_to_string(&self.recording).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .map(|entry| {
                let headers = entry["headers"].as_object().cloned().unwrap_or_default();
                let target = headers
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case("x-amz-target"))
                    .and_then(|(_, value)| value.as_str())
                    .unwrap_or("(no target)")
                    .to_owned();
                let body = entry["body"].as_str().unwrap_or_default();
                let body = if entry["body_encoded"].as_bool() == Some(true) {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(body)
                        .unwrap_or_default();
                    String::from_utf8_lossy(&bytes).into_owned()
                } else {
                    body.to_owned()
                };
                (target, body)
            })
            .collect()
    }

    fn control(&self, method: &str, path: &str) {
        let (status, body) = http::request(method, &format!("{}{path}", self.endpoint), b"")
            .expect("moto's control API answers");
        assert!(
            status < 300,
            "{path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.recording);
    }
}

/// An SDK configuration for a local endpoint, with fake credentials and `attempts` tries per
/// request.
pub async fn sdk_config(endpoint: &str, attempts: u32) -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(attempts))
        .load()
        .await
}

/// A fresh name, so that tests sharing a server never share a table.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", rand_suffix())
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{nanos:x}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Creates a lease table with the schema of `template.yaml`: a string `lease_key`.
pub async fn create_lease_table(config: &SdkConfig, name: &str) {
    create_table(config, name, "lease_key").await;
}

/// Creates an on-demand table with a string partition key `key`.
pub async fn create_table(config: &SdkConfig, name: &str, key: &str) {
    aws_sdk_dynamodb::Client::new(config)
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key)
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .expect("create table");
}

/// Creates a fresh SQS queue and returns its URL.
pub async fn create_queue(config: &SdkConfig) -> String {
    aws_sdk_sqs::Client::new(config)
        .create_queue()
        .queue_name(unique("dead-letters"))
        .send()
        .await
        .expect("create queue")
        .queue_url
        .expect("a queue URL")
}
