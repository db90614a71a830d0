//! End to end: the `functions/ledger` binary under `cargo lambda watch` on 127.0.0.1, against
//! moto, invoked over HTTP with the sample events of `events/` in the order an event source
//! mapping delivers them (again from each reported failure).

mod common;

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use common::http;
use common::moto::{Moto, create_lease_table, create_table, python, unique};
use common::redeliver_from;
use serde_json::Value;

/// `cargo lambda watch` serving the ledger function; stopped, with the function, on drop.
struct Watch {
    child: Child,
    url: String,
}

impl Watch {
    fn start(env: &[(&str, &str)]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        // A file, not `--env-var`: that flag splits values at commas (as in `RUST_LOG`).
        let env_file = root.join(format!("target/e2e-ledger-{port}.env"));
        let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        let vars = vars.join("\n");
        std::fs::write(&env_file, vars).unwrap();
        let log = std::fs::File::create(root.join("target/e2e-ledger.log")).unwrap();
        let mut command = Command::new(cargo_lambda());
        command
            .args([
                "lambda",
                "watch",
                "--ignore-changes",
                "-A",
                "127.0.0.1",
                "-P",
                &port.to_string(),
            ])
            .arg("--env-file")
            .arg(&env_file)
            .current_dir(root.join("functions/ledger"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let mut child = command
            .spawn()
            .expect("cargo lambda starts; run `make test`, which installs it");
        let deadline = Instant::now() + Duration::from_mins(2);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            let exited = child.try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "cargo lambda watch did not listen ({exited:?}); see target/e2e-ledger.log"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}/2015-03-31/functions/ledger/invocations"),
        }
    }

    /// Invokes the function with `event` and returns its answer.
    fn invoke(&self, event: &KinesisEvent) -> Value {
        let body = serde_json::to_vec(event).unwrap();
        let (status, answer) =
            http::request("POST", &self.url, &body).expect("the invoke API answers");
        let answer: Value = serde_json::from_slice(&answer).unwrap_or_else(|_| {
            panic!(
                "a JSON answer, got {status}: {}",
                String::from_utf8_lossy(&answer)
            )
        });
        assert_eq!(status, 200, "{answer}");
        answer
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // The function it runs ends by itself once its runtime API is gone.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cargo-lambda` from `CARGO_LAMBDA`, the repository's `.venv`, or the `PATH`.
fn cargo_lambda() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_LAMBDA") {
        return path.into();
    }
    let venv = python().with_file_name("cargo-lambda");
    if venv.exists() {
        venv
    } else {
        "cargo-lambda".into()
    }
}

fn sample(name: &str) -> KinesisEvent {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn failures(answer: &Value) -> Vec<String> {
    answer["batchItemFailures"]
        .as_array()
        .expect("a partial batch response")
        .iter()
        .map(|f| {
            f["itemIdentifier"]
                .as_str()
                .expect("never a null identifier")
                .to_owned()
        })
        .collect()
}

/// What the ledger must hold once every record of `events` but the poison ones is applied once.
fn expected(events: &[KinesisEvent]) -> HashMap<String, (i64, u64)> {
    let mut totals = HashMap::new();
    for record in events.iter().flat_map(|e| &e.records) {
        let order: Value = serde_json::from_slice(&record.kinesis.data.0).unwrap();
        if order["fail"] == "poison" {
            continue;
        }
        let entry = totals
            .entry(order["order_id"].as_str().unwrap().to_owned())
            .or_insert((0, 0));
        entry.0 += order["amount_cents"].as_i64().unwrap();
        entry.1 += 1;
    }
    totals
}

async fn scan(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Vec<HashMap<String, AttributeValue>> {
    client
        .scan()
        .table_name(table)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default()
}

fn s(item: &HashMap<String, AttributeValue>, name: &str) -> String {
    item[name].as_s().unwrap().clone()
}

fn n(item: &HashMap<String, AttributeValue>, name: &str) -> i64 {
    item[name].as_n().unwrap().parse().unwrap()
}

/// Every order of the ledger: its total and how many records were applied.
async fn ledger_totals(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> HashMap<String, (i64, u64)> {
    scan(client, table)
        .await
        .iter()
        .filter(|item| !s(item, "order_id").starts_with("_attempts:"))
        .map(|item| {
            (
                s(item, "order_id"),
                (
                    n(item, "total_cents"),
                    n(item, "applied").try_into().unwrap(),
                ),
            )
        })
        .collect()
}

/// Every row of the lease table, by `lease_key`.
async fn lease_rows(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> HashMap<String, HashMap<String, AttributeValue>> {
    scan(client, table)
        .await
        .into_iter()
        .map(|row| (s(&row, "lease_key"), row))
        .collect()
}

/// The bodies of the messages in the dead-letter queue.
async fn dead_letters(sqs: &aws_sdk_sqs::Client, queue: &str) -> Vec<Value> {
    sqs.receive_message()
        .queue_url(queue)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default()
        .iter()
        .map(|message| serde_json::from_str(message.body.as_deref().unwrap()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_function_applies_every_order_once_under_lambda_delivery() {
    let moto = Moto::shared();
    let config = moto.sdk_config(3).await;
    let (leases, ledger) = (unique("leases"), unique("ledger"));
    create_lease_table(&config, &leases).await;
    create_table(&config, &ledger, "order_id").await;
    // The parent gate reads the topology of the stream `orders` from Kinesis: kinesis-local.
    let kinesis = common::kinesis::KinesisLocal::start();
    let kinesis_config = common::moto::sdk_config(&kinesis.endpoint, 1).await;
    common::kinesis::Stream::with_shards(&kinesis_config, "orders", 2).await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let queue = sqs
        .create_queue()
        .queue_name(unique("dead-letters"))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let watch = tokio::task::spawn_blocking({
        let (leases, ledger, endpoint) = (leases.clone(), ledger.clone(), moto.endpoint.clone());
        let (queue, kinesis) = (queue.clone(), kinesis.endpoint.clone());
        move || {
            Watch::start(&[
                ("LEASE_TABLE", &leases),
                ("LEDGER_TABLE", &ledger),
                ("DEAD_LETTER_QUEUE_URL", &queue),
                ("AWS_ENDPOINT_URL_KINESIS", &kinesis),
                ("STARTING_POSITION", "TRIM_HORIZON"),
                ("AWS_ENDPOINT_URL", &endpoint),
                ("AWS_REGION", "us-east-1"),
                ("AWS_ACCESS_KEY_ID", "test"),
                ("AWS_SECRET_ACCESS_KEY", "test"),
                ("AWS_EC2_METADATA_DISABLED", "true"),
                ("RUST_LOG", "info,kinesis_checkpoint=debug"),
            ])
        }
    })
    .await
    .unwrap();
    // Blocking calls are fine here: the function runs in another process.
    let invoke = |event: KinesisEvent| watch.invoke(&event);

    // A normal batch, then the same batch again, as after a time-out.
    let batch = sample("batch.json");
    assert_eq!(failures(&invoke(batch.clone())), Vec::<String>::new());
    assert_eq!(
        failures(&invoke(sample("redelivered.json"))),
        Vec::<String>::new()
    );

    // A transient failure: reported, then redelivered from it, then done.
    let transient = sample("transient.json");
    let failed = failures(&invoke(transient.clone()));
    assert_eq!(
        failed,
        vec![transient.records[2].kinesis.sequence_number.clone()]
    );
    assert_eq!(
        failures(&invoke(redeliver_from(&transient, &failed[0]))),
        Vec::<String>::new()
    );

    // A poison record goes to the dead-letter queue with its payload; the batch goes on.
    let poison = sample("poison.json");
    assert_eq!(failures(&invoke(poison.clone())), Vec::<String>::new());
    let dead = dead_letters(&sqs, &queue).await;
    assert_eq!(dead.len(), 1);
    let letter = &dead[0];
    assert_eq!(
        letter["sequence_number"].as_str(),
        Some(poison.records[1].kinesis.sequence_number.as_str())
    );
    assert_eq!(letter["reason"], "rejected");

    // Another shard has a row of its own.
    let child = sample("child-shard.json");
    assert_eq!(failures(&invoke(child.clone())), Vec::<String>::new());

    let client = aws_sdk_dynamodb::Client::new(&config);
    let orders = ledger_totals(&client, &ledger).await;
    let want = expected(&[batch, transient, poison.clone(), child.clone()]);
    assert_eq!(
        orders, want,
        "every order applied exactly once, the poison one never"
    );

    let rows = lease_rows(&client, &leases).await;
    let shard0 = &rows["orders:shardId-000000000000"];
    assert_eq!(
        s(shard0, "checkpoint"),
        poison.records[3].kinesis.sequence_number
    );
    assert!(
        !shard0.contains_key("failing"),
        "the dead letter is forgotten"
    );
    assert!(
        !shard0.contains_key("lease_owner"),
        "every invocation released its lease"
    );
    let shard1 = &rows["orders:shardId-000000000001"];
    assert_eq!(
        s(shard1, "checkpoint"),
        child.records[2].kinesis.sequence_number
    );
    drop(watch);
}
