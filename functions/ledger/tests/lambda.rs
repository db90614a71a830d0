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
    use kinesis_checkpoint_testing::local::{EventSource, KinesisStream, Mapping, RuntimeApi};

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

/// A record that aborts the process on every delivery (as an out-of-memory kill would) is
/// found by the claims after it, pinned, and dead-lettered from its event after `MAX_ATTEMPTS`
/// deaths; the records after it are applied once, in order. In the plain mode the first crash
/// repeats the record run before the killer: nothing had marked it yet.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_that_kills_every_invocation_is_dead_lettered_and_the_records_after_it_applied_once_in_order()
 {
    let orders = crash_on_every_delivery("plain").await;
    assert_eq!(orders.get("A-1"), Some(&(200, 2)), "{orders:?}");
}

/// The transactional ledger commits each update with its mark, so the crash loses the record
/// run before the killer together with its mark: every record is applied exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_transactional_ledger_applies_every_record_once_around_a_record_that_kills_every_invocation()
 {
    let orders = crash_on_every_delivery("transactional").await;
    assert_eq!(orders.get("A-1"), Some(&(100, 1)), "{orders:?}");
}

/// Delivers A-1, B-1 (which aborts the process), C-1, C-1 to the ledger in `ledger_mode` until
/// it answers with no failure, checks the dead letter, the records after the killer and the
/// lease row, and returns the ledger's totals. The mapping's stand-in delivers the batch again
/// after every failed invocation, as `MaximumRetryAttempts: -1` does, and starts a new function
/// process after each crash, as Lambda starts a new sandbox.
async fn crash_on_every_delivery(ledger_mode: &'static str) -> HashMap<String, (i64, u64)> {
    let moto = Moto::shared();
    let config = moto.sdk_config(3).await;
    let tables = Tables::create(&config).await;
    let kinesis = common::kinesis::KinesisLocal::start();
    let kinesis_config = common::moto::sdk_config(&kinesis.endpoint, 1).await;
    common::kinesis::Stream::with_shards(&kinesis_config, "orders", 1).await;
    let env: Vec<(String, String)> = [
        ("LEASE_TABLE", tables.leases.as_str()),
        ("LEDGER_TABLE", tables.ledger.as_str()),
        ("DEAD_LETTER_QUEUE_URL", tables.queue.as_str()),
        ("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint.as_str()),
        ("AWS_ENDPOINT_URL", moto.endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("MAX_ATTEMPTS", "2"),
        ("LEASE_TTL_SECONDS", "2"),
        ("LEDGER_MODE", ledger_mode),
        ("RUST_LOG", "info"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    // A dead invocation's lease lapses after 2 s: the mapping's retries find the shard free.
    let mut local = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Watched::start_with(
            Path::new(env!("CARGO_BIN_EXE_ledger")),
            "_",
            root().join(format!("target/e2e-abort-{ledger_mode}.log")),
            &env,
            &["--timeout", "3"],
        )
    })
    .await
    .unwrap();
    let order = |n: u64, order_id: &str, extra: Value| {
        let mut data = serde_json::json!({ "order_id": order_id, "amount_cents": 100 * (n + 1) });
        if let (Some(data), Some(extra)) = (data.as_object_mut(), extra.as_object()) {
            data.extend(extra.clone());
        }
        common::lambda_record("orders", "shardId-000000000000", n, order_id, &data)
    };
    let batch = common::event(&[
        order(0, "A-1", Value::Null),
        order(1, "B-1", serde_json::json!({ "fail": "abort" })),
        order(2, "C-1", Value::Null),
        order(3, "C-1", Value::Null),
    ]);
    let killer = batch.records[1].kinesis.sequence_number.clone();

    let (deliveries, deaths) = deliver_until_done(&mut local, &batch).await;
    println!("the killer was dead-lettered after {deaths} deaths and {deliveries} deliveries");

    let sqs = aws_sdk_sqs::Client::new(&config);
    let dead = dead_letters(&sqs, &tables.queue).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["sequence_number"].as_str(), Some(killer.as_str()));
    assert_eq!(dead[0]["reason"], "exhausted");
    assert_eq!(dead[0]["attempts"], 2, "two deaths pinned on it");
    assert!(
        dead[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("died")),
        "{dead:?}"
    );
    // One unpinned death finds the batch, two pinned on the record, then the dead letter.
    assert_eq!(
        deaths, 3,
        "MAX_ATTEMPTS 2: one death finds the batch, two count"
    );

    let client = aws_sdk_dynamodb::Client::new(&config);
    let orders = ledger_totals(&client, &tables.ledger).await;
    assert_eq!(orders.get("B-1"), None, "the killer never applied");
    assert_eq!(
        orders.get("C-1"),
        Some(&(700, 2)),
        "both of C-1's records applied once"
    );
    let ledger = scan(&client, &tables.ledger).await;
    let c = ledger
        .iter()
        .find(|item| s(item, "order_id") == "C-1")
        .expect("C-1's line");
    assert_eq!(
        s(c, "last_sequence"),
        batch.records[3].kinesis.sequence_number,
        "in order: C-1's last record applied last"
    );
    let rows = lease_rows(&client, &tables.leases).await;
    let row = &rows["orders:shardId-000000000000"];
    assert_eq!(
        s(row, "checkpoint"),
        batch.records[3].kinesis.sequence_number
    );
    assert!(!row.contains_key("failing"), "{row:?}");
    drop(local);
    orders
}

/// Delivers `batch` as the mapping does with `MaximumRetryAttempts: -1`: again after every
/// failed invocation, from the first reported record after a partial failure, with a new
/// process after a crash. Returns the deliveries and the crashes until a full success.
async fn deliver_until_done(local: &mut Watched, batch: &KinesisEvent) -> (u32, u32) {
    let (mut event, mut deliveries, mut deaths) = (batch.clone(), 0, 0);
    loop {
        deliveries += 1;
        assert!(
            deliveries <= 20,
            "still not done after {deliveries} deliveries"
        );
        let answer = tokio::task::block_in_place(|| local.try_invoke(&event));
        match answer {
            None => {
                deaths += 1;
                assert!(
                    local.restart_if_dead(),
                    "a failed invocation is a crash here"
                );
            }
            Some(answer) => match failures(&answer).first() {
                None => break,
                Some(from) => event = redeliver_from(batch, from),
            },
        }
        // Held by a dead invocation's lease, or the function not up yet: the mapping waits.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (deliveries, deaths)
}
