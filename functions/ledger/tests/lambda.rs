//! End to end: the `ledger` function binary, run against the Lambda runtime API of
//! `cargo lambda watch --only-lambda-apis` on 127.0.0.1, with moto and kinesis-local behind it,
//! invoked over HTTP with the sample events of `events/` in the order an event source mapping
//! delivers them (again from each reported failure).
//!
//! The binary is the one `cargo test` built for this test (`CARGO_BIN_EXE_ledger`), with the
//! same features as every other test: letting `cargo lambda watch` build it would compile the
//! AWS SDK a second time.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, create_table, unique};
use common::watch::Watched;
use common::{redeliver_from, root};
use serde_json::Value;

/// The tables and queue a test made for the function.
struct Tables {
    leases: String,
    ledger: String,
    queue: String,
}

impl Tables {
    /// Creates a lease table, a ledger table and a dead-letter queue, named afresh, in moto.
    async fn create(config: &aws_config::SdkConfig) -> Self {
        let (leases, ledger) = (unique("leases"), unique("ledger"));
        create_lease_table(config, &leases).await;
        create_table(config, &ledger, "order_id").await;
        let queue = common::moto::create_queue(config).await;
        Self {
            leases,
            ledger,
            queue,
        }
    }

    /// Starts the function on them, against moto at `moto` and kinesis-local at `kinesis`.
    async fn start(&self, log: &str, moto: &str, kinesis: &str, extra: &[(&str, &str)]) -> Watched {
        let env: Vec<(String, String)> = [
            ("LEASE_TABLE", self.leases.as_str()),
            ("LEDGER_TABLE", self.ledger.as_str()),
            ("DEAD_LETTER_QUEUE_URL", self.queue.as_str()),
            ("AWS_ENDPOINT_URL_KINESIS", kinesis),
            ("AWS_ENDPOINT_URL", moto),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let log = log.to_owned();
        tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Watched::start(
                Path::new(env!("CARGO_BIN_EXE_ledger")),
                "_",
                root().join("target").join(log),
                &env,
            )
        })
        .await
        .unwrap()
    }
}

fn sample(name: &str) -> KinesisEvent {
    let path = root().join("events").join(name);
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
    let tables = Tables::create(&config).await;
    let (leases, ledger, queue) = (&tables.leases, &tables.ledger, &tables.queue);
    // The parent gate reads the topology of the stream `orders` from Kinesis: kinesis-local.
    let kinesis = common::kinesis::KinesisLocal::start();
    let kinesis_config = common::moto::sdk_config(&kinesis.endpoint, 1).await;
    common::kinesis::Stream::with_shards(&kinesis_config, "orders", 2).await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let local = tables
        .start(
            "e2e-ledger.log",
            &moto.endpoint,
            &kinesis.endpoint,
            &[
                ("STARTING_POSITION", "TRIM_HORIZON"),
                ("RUST_LOG", "info,kinesis_checkpoint=debug"),
            ],
        )
        .await;
    // Blocking calls are fine here: the function runs in another process.
    let invoke = |event: KinesisEvent| local.invoke(&event);

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
    let dead = dead_letters(&sqs, queue).await;
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
    let orders = ledger_totals(&client, ledger).await;
    let want = expected(&[batch, transient, poison.clone(), child.clone()]);
    assert_eq!(
        orders, want,
        "every order applied exactly once, the poison one never"
    );

    let rows = lease_rows(&client, leases).await;
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
    drop(local);
}

/// The whole function, driven by the local event source over a Kinesis endpoint
/// (kinesis-local) the way Lambda's mapping drives it: batches of 10 per shard, duplicate
/// deliveries, redelivery from each reported record, and a split whose children may come before
/// their parent is finished.
#[tokio::test(flavor = "multi_thread")]
async fn the_local_event_source_drives_the_function_binary_over_a_resharded_stream() {
    use kinesis_checkpoint::local::{EventSource, KinesisStream, Mapping, RuntimeApi};

    let moto = Moto::shared();
    let config = moto.sdk_config(3).await;
    let tables = Tables::create(&config).await;
    let (leases, ledger) = (&tables.leases, &tables.ledger);
    let kinesis = common::kinesis::KinesisLocal::start();
    let kinesis_config = common::moto::sdk_config(&kinesis.endpoint, 1).await;
    let stream = common::kinesis::Stream::create(&kinesis_config, "orders").await;
    let mut want = HashMap::new();
    for n in 0..60_i64 {
        if n == 30 {
            stream.split("shardId-000000000000").await;
        }
        let mut order = serde_json::json!({
            "order_id": format!("order-{n}"),
            "amount_cents": 100 + n,
        });
        if n % 17 == 5 {
            order["fail"] = "transient".into();
        }
        want.insert(format!("order-{n}"), (100 + n, 1));
        stream
            .client
            .put_record()
            .stream_name("orders")
            .partition_key(format!("customer-{}", n % 7))
            .data(aws_sdk_kinesis::primitives::Blob::new(order.to_string()))
            .send()
            .await
            .unwrap();
    }
    let local = tables
        .start(
            "e2e-ledger-local-source.log",
            &moto.endpoint,
            &kinesis.endpoint,
            &[],
        )
        .await;
    let endpoint = local.url().split("/2015-03-31").next().unwrap().to_owned();

    let source = KinesisStream::connect(&kinesis_config, "orders")
        .await
        .unwrap();
    let mapping = Mapping::default()
        .batch_size(10)
        .duplicate_deliveries(0.3)
        .children_before_parents(1.0)
        .function_timeout(Duration::from_mins(1))
        .seed(7);
    let run = EventSource::new(source, mapping)
        .run(std::sync::Arc::new(RuntimeApi::new(endpoint, "_")))
        .await
        .unwrap();

    assert!(run.discarded.is_empty());
    assert!(
        run.partial_failures >= 4,
        "each transient order was reported: {run:?}"
    );
    assert!(run.redeliveries > 0 && run.early_children > 0, "{run:?}");
    let client = aws_sdk_dynamodb::Client::new(&config);
    assert_eq!(
        ledger_totals(&client, ledger).await,
        want,
        "every order applied exactly once"
    );
    let rows = lease_rows(&client, leases).await;
    assert_eq!(
        s(&rows["orders:shardId-000000000000"], "checkpoint"),
        "SHARD_END",
        "the split parent is finished"
    );
    drop(local);
}
