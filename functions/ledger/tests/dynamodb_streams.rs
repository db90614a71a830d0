//! End to end from a `DynamoDB` table's stream: the `ledger` binary with
//! `EVENT_SOURCE=dynamodb-streams`, run under `cargo lambda watch` against `DynamoDB` Local (the
//! orders table and its stream, the lease table and the ledger table), invoked over HTTP with
//! the tumbling-window events Lambda would send for the stream's shards.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/dynamodb_local.rs"]
mod dynamodb_local;

use std::collections::HashMap;
use std::path::Path;

use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, create_table, sdk_config, unique};
use common::root;
use common::watch::Watched;
use dynamodb_local::{DynamoDbLocal, changes, enable_stream, shards, window_event};

/// The tables of one test in `DynamoDB` Local: the orders table with its stream, the lease
/// table and the ledger table, each with a name of its own.
struct Tables {
    config: aws_config::SdkConfig,
    client: aws_sdk_dynamodb::Client,
    orders: String,
    leases: String,
    ledger: String,
    /// The orders table's stream.
    arn: String,
}

impl Tables {
    async fn create(local: &DynamoDbLocal) -> Self {
        let config = sdk_config(&local.endpoint, 3).await;
        let client = aws_sdk_dynamodb::Client::new(&config);
        let (orders, leases, ledger) = (unique("orders"), unique("leases"), unique("ledger"));
        create_table(&config, &orders, "order_id").await;
        create_lease_table(&config, &leases).await;
        create_table(&config, &ledger, "order_id").await;
        let arn = enable_stream(&client, &orders).await;
        Self {
            config,
            client,
            orders,
            leases,
            ledger,
            arn,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn orders_written_to_a_table_reach_the_ledger_once_each_in_order_across_a_rollover() {
    let local = DynamoDbLocal::start();
    let Tables {
        config,
        client,
        orders,
        leases,
        ledger,
        arn,
    } = Tables::create(&local).await;
    let put = |order: &'static str, cents: i64| {
        client
            .put_item()
            .table_name(&orders)
            .item("order_id", AttributeValue::S(order.to_owned()))
            .item("amount_cents", AttributeValue::N(cents.to_string()))
            .send()
    };
    put("A-1", 100).await.unwrap();
    put("B-1", 40).await.unwrap();
    local.rollover();
    put("A-1", 250).await.unwrap();
    client
        .delete_item()
        .table_name(&orders)
        .key("order_id", AttributeValue::S("B-1".to_owned()))
        .send()
        .await
        .unwrap();

    let env = [
        ("EVENT_SOURCE", "dynamodb-streams"),
        ("LEASE_TABLE", leases.as_str()),
        ("LEDGER_TABLE", ledger.as_str()),
        ("AWS_ENDPOINT_URL", local.endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("RUST_LOG", "info"),
    ];
    let function = tokio::task::block_in_place(|| {
        Watched::start(
            Path::new(env!("CARGO_BIN_EXE_ledger")),
            "_",
            root().join("target/e2e-dynamodb.log"),
            &env,
        )
    });
    let streams = aws_sdk_dynamodbstreams::Client::new(&config);
    let lineage = shards(&streams, &arn).await;
    let (parent, child) = (lineage[0].0.clone(), lineage[1].0.clone());
    assert_eq!(
        lineage[1].1.as_deref(),
        Some(parent.as_str()),
        "{lineage:?}"
    );
    let event = |shard: String| {
        let streams = streams.clone();
        let arn = arn.clone();
        async move { window_event(&arn, &shard, &changes(&streams, &arn, &shard).await) }
    };

    // The child first: it waits for its parent; then the parent, the child, and the parent
    // again (a duplicate delivery).
    let mut answers = Vec::new();
    for shard in [&child, &parent, &child, &parent] {
        let event = event(shard.clone()).await;
        answers.push(tokio::task::block_in_place(|| function.invoke(&event)));
    }
    assert_eq!(
        answers[0]["batchItemFailures"].as_array().map(Vec::len),
        Some(1),
        "{answers:?}"
    );
    for answer in &answers[1..] {
        assert_eq!(
            answer,
            &serde_json::json!({"batchItemFailures": [], "state": {}})
        );
    }
    let totals = totals(&client, &ledger).await;
    assert_eq!(
        totals,
        HashMap::from([
            ("A-1".to_owned(), ("350".to_owned(), "2".to_owned())),
            ("B-1".to_owned(), ("40".to_owned(), "1".to_owned())),
        ]),
        "each insert applied once, the removal nothing"
    );
    drop(function);
}

/// Every order of the ledger: its total and how many records were applied.
async fn totals(
    client: &aws_sdk_dynamodb::Client,
    ledger: &str,
) -> HashMap<String, (String, String)> {
    let items = client.scan().table_name(ledger).send().await.unwrap();
    items
        .items()
        .iter()
        .filter(|item| !item["order_id"].as_s().unwrap().starts_with("_attempts:"))
        .map(|item| {
            let n = |name: &str| item[name].as_n().unwrap().clone();
            (
                item["order_id"].as_s().unwrap().clone(),
                (n("total_cents"), n("applied")),
            )
        })
        .collect()
}

/// The sample events of `events/`, with their stream and shard made the ones of a stream that
/// exists (so the gate's `DescribeStream` answers), each answered as `events/README.md` says.
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_dynamodb_events_get_the_answers_their_readme_gives() {
    let local = DynamoDbLocal::start();
    let Tables {
        config,
        client,
        leases,
        ledger,
        arn,
        ..
    } = Tables::create(&local).await;
    let streams = aws_sdk_dynamodbstreams::Client::new(&config);
    let shard = shards(&streams, &arn).await.remove(0).0;
    let moto = Moto::shared();
    let queue = common::moto::create_queue(&moto.sdk_config(3).await).await;
    let env = [
        ("EVENT_SOURCE", "dynamodb-streams"),
        ("LEASE_TABLE", leases.as_str()),
        ("LEDGER_TABLE", ledger.as_str()),
        ("DEAD_LETTER_QUEUE_URL", queue.as_str()),
        ("AWS_ENDPOINT_URL_DYNAMODB", local.endpoint.as_str()),
        ("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", local.endpoint.as_str()),
        ("AWS_ENDPOINT_URL", moto.endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let function = tokio::task::block_in_place(|| {
        Watched::start(
            Path::new(env!("CARGO_BIN_EXE_ledger")),
            "_",
            root().join("target/e2e-dynamodb-samples.log"),
            &env,
        )
    });
    let sample = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(root().join("events").join(name)).unwrap();
        let sample: serde_json::Value = serde_json::from_str(&text).unwrap();
        let (their_arn, their_shard) =
            (sample["eventSourceARN"].clone(), sample["shardId"].clone());
        let text = text.replace(their_arn.as_str().unwrap_or("-"), &arn);
        serde_json::from_str(&text.replace(their_shard.as_str().unwrap_or("-"), &shard)).unwrap()
    };
    let answer = |name: &str| {
        let event = sample(name);
        tokio::task::block_in_place(|| function.try_invoke(&event))
    };
    let fine = serde_json::json!({"batchItemFailures": [], "state": {}});
    for name in ["dynamodb-window.json", "dynamodb-window-redelivered.json"] {
        assert_eq!(answer(name), Some(fine.clone()), "{name}");
    }
    let reported = serde_json::json!({"batchItemFailures": [{"itemIdentifier": "800000000031415928042"}], "state": {}});
    assert_eq!(answer("dynamodb-transient.json"), Some(reported));
    for name in [
        "dynamodb-transient-redelivered.json",
        "dynamodb-poison.json",
        "dynamodb-final.json",
    ] {
        assert_eq!(answer(name), Some(fine.clone()), "{name}");
    }
    for name in [
        "foreign/example-dynamodb-event.json",
        "foreign/example-dynamodb-event-null-items.json",
        "foreign/example-dynamodb-event-record-with-optional-fields.json",
    ] {
        assert_eq!(answer(name), None, "{name}: refused, no window");
    }
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk_config(3).await);
    let letters = sqs
        .receive_message()
        .queue_url(&queue)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(
        letters.len(),
        1,
        "the poison change, dead-lettered: {letters:?}"
    );
    let body: serde_json::Value =
        serde_json::from_str(letters[0].body.as_deref().unwrap()).unwrap();
    assert_eq!(body["sequence_number"], "800000000031415929275", "{body}");
    let totals = totals(&client, &ledger).await;
    assert_eq!(totals["A-1"].1, "2", "{totals:?}");
    drop(function);
}
