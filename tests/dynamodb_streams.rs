//! `DynamoDB` Streams end to end on `DynamoDB` Local: a table's changes read through the real SDK
//! and delivered as Lambda's tumbling-window events, to a processor whose leases, checkpoints
//! and effects live in the same server, and whose gate asks `DynamoDB` Streams for the parents.

mod common;
#[path = "common/dynamodb_local.rs"]
mod dynamodb_local;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::{AttributeValue, Update};
use common::moto::{create_lease_table, create_table, sdk_config, unique};
use dynamodb_local::{DynamoDbLocal, changes, enable_stream, shards, window_event};
use kinesis_checkpoint::dynamodb_streams::{DynamoDbStreamsTopology, WindowEvent, WindowResponse};
use kinesis_checkpoint::effects::{Write, Writes};
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::processor::Effect;
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::{DynamoLeaseStore, Outcome, Processor, Record};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use serde_json::Value;

/// One order change as the handler reads it from the change's JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Change {
    event: String,
    order: String,
    amount_cents: Option<i64>,
    fail: bool,
}

fn change(record: &Record) -> Change {
    let change: Value = serde_json::from_slice(record.data()).expect("the change's JSON");
    let image = &change["dynamodb"]["NewImage"];
    Change {
        event: change["eventName"].as_str().unwrap_or_default().to_owned(),
        order: change["dynamodb"]["Keys"]["order_id"]["S"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        amount_cents: image["amount_cents"]["N"]
            .as_str()
            .map(|n| n.parse().unwrap()),
        fail: image["fail"]["S"].is_string(),
    }
}

/// A `DynamoDB` Local with an orders table whose stream shows new images, and a lease table.
struct Setup {
    local: DynamoDbLocal,
    config: aws_config::SdkConfig,
    orders: String,
    leases: String,
    arn: String,
    streams: aws_sdk_dynamodbstreams::Client,
}

impl Setup {
    async fn new() -> Self {
        let local = DynamoDbLocal::start();
        let config = sdk_config(&local.endpoint, 3).await;
        let client = aws_sdk_dynamodb::Client::new(&config);
        let orders = unique("orders");
        let leases = unique("leases");
        create_table(&config, &orders, "order_id").await;
        create_lease_table(&config, &leases).await;
        let arn = enable_stream(&client, &orders).await;
        let streams = aws_sdk_dynamodbstreams::Client::new(&config);
        Self {
            local,
            config,
            orders,
            leases,
            arn,
            streams,
        }
    }

    async fn put(&self, order_id: &str, amount_cents: i64, fail: bool) {
        let mut put = aws_sdk_dynamodb::Client::new(&self.config)
            .put_item()
            .table_name(&self.orders)
            .item("order_id", AttributeValue::S(order_id.to_owned()))
            .item("amount_cents", AttributeValue::N(amount_cents.to_string()));
        if fail {
            put = put.item("fail", AttributeValue::S("always".to_owned()));
        }
        put.send().await.unwrap();
    }

    /// The window event of `shard`'s changes, as Lambda would deliver it.
    async fn event(&self, shard: &str) -> WindowEvent {
        let changes = changes(&self.streams, &self.arn, shard).await;
        serde_json::from_value(window_event(&self.arn, shard, &changes)).unwrap()
    }

    fn gate(&self) -> Gate {
        Gate::new(
            Arc::new(DynamoDbStreamsTopology::new(&self.config)),
            StartingPosition::TrimHorizon,
        )
    }

    fn leases(&self) -> Arc<DynamoLeaseStore> {
        Arc::new(DynamoLeaseStore::new(&self.config, self.leases.clone()))
    }
}

/// An invocation with a minute to run.
fn context(request: &str) -> lambda_runtime::Context {
    common::context(request, 60_000)
}

/// A handler that notes every order change it sees, in order, and fails a marked one.
fn noting(seen: Arc<Mutex<Vec<Change>>>) -> impl Fn(Record) -> std::future::Ready<Outcome> + Clone {
    move |record: Record| {
        let order = change(&record);
        let fail = order.fail;
        seen.lock().unwrap().push(order);
        std::future::ready(if fail {
            Outcome::retry("the order is marked to fail")
        } else {
            Outcome::ack()
        })
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shards_changes_are_handled_once_in_order_and_a_redelivery_handles_nothing() {
    let setup = Setup::new().await;
    setup.put("A-1", 100, false).await;
    setup.put("A-1", 250, false).await;
    setup.put("B-1", 300, false).await;
    let shard = shards(&setup.streams, &setup.arn).await.remove(0).0;
    let seen: Arc<Mutex<Vec<Change>>> = Arc::default();
    let processor = Processor::new(setup.leases(), noting(seen.clone())).gate(setup.gate());

    let answer = processor
        .process_dynamodb(setup.event(&shard).await, &context("first"))
        .await
        .unwrap();
    assert_eq!(answer, WindowResponse::default(), "no failure, and a state");
    let json = serde_json::to_value(&answer).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"batchItemFailures": [], "state": {}})
    );
    let amounts: Vec<(String, Option<i64>)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|o| (o.order.clone(), o.amount_cents))
        .collect();
    assert_eq!(
        amounts,
        [
            ("A-1".to_owned(), Some(100)),
            ("A-1".to_owned(), Some(250)),
            ("B-1".to_owned(), Some(300))
        ]
    );
    assert_eq!(seen.lock().unwrap()[0].event, "INSERT");
    assert_eq!(seen.lock().unwrap()[1].event, "MODIFY");

    let again = setup.event(&shard).await.into_kinesis().unwrap();
    let report = processor
        .process_batch(again, &context("again"))
        .await
        .unwrap();
    assert_eq!(report.shards[0].count(Disposition::Duplicate), 3);
    assert_eq!(seen.lock().unwrap().len(), 3, "nothing handled twice");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_child_shard_waits_until_its_parent_is_done_as_describe_stream_tells() {
    let setup = Setup::new().await;
    setup.put("A-1", 100, false).await;
    setup.put("A-1", 200, false).await;
    setup.local.rollover();
    setup.put("A-1", 300, false).await;
    let lineage = shards(&setup.streams, &setup.arn).await;
    let (parent, _, closed) = lineage[0].clone();
    assert!(closed, "the rollover closed the first shard: {lineage:?}");
    let child = lineage
        .iter()
        .find(|(_, of, _)| of.as_deref() == Some(parent.as_str()))
        .expect("a child of the first shard")
        .0
        .clone();
    let seen: Arc<Mutex<Vec<Change>>> = Arc::default();
    let processor = Processor::new(setup.leases(), noting(seen.clone())).gate(setup.gate());

    // The child first: held, its first change reported, nothing handled.
    let early = processor
        .process_dynamodb(setup.event(&child).await, &context("child-early"))
        .await
        .unwrap();
    assert_eq!(early.batch_item_failures.len(), 1, "{early:?}");
    assert!(
        seen.lock().unwrap().is_empty(),
        "the child waits for its parent"
    );

    let done = processor
        .process_dynamodb(setup.event(&parent).await, &context("parent"))
        .await
        .unwrap();
    assert!(done.batch_item_failures.is_empty(), "{done:?}");
    let late = processor
        .process_dynamodb(setup.event(&child).await, &context("child"))
        .await
        .unwrap();
    assert!(late.batch_item_failures.is_empty(), "{late:?}");
    let amounts: Vec<Option<i64>> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|o| o.amount_cents)
        .collect();
    assert_eq!(
        amounts,
        [Some(100), Some(200), Some(300)],
        "the item's order, across the rollover"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_change_that_keeps_failing_is_dead_lettered_with_its_keys_image_and_event_name() {
    let setup = Setup::new().await;
    setup.put("A-1", 100, false).await;
    setup.put("B-1", 5, true).await;
    setup.put("C-1", 700, false).await;
    let shard = shards(&setup.streams, &setup.arn).await.remove(0).0;
    let seen: Arc<Mutex<Vec<Change>>> = Arc::default();
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::new(setup.leases(), noting(seen.clone()))
        .gate(setup.gate())
        .max_attempts(2)
        .dead_letters(letters.clone());

    let mut failures = Vec::new();
    for delivery in 0..3 {
        let answer = processor
            .process_dynamodb(setup.event(&shard).await, &context(&format!("d{delivery}")))
            .await
            .unwrap();
        failures.push(answer.batch_item_failures.len());
    }
    assert_eq!(failures, [1, 0, 0], "retried once, then dead-lettered");
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    let change: Value = serde_json::from_slice(letters[0].record.data()).unwrap();
    assert_eq!(change["eventName"], "INSERT");
    assert_eq!(change["dynamodb"]["Keys"]["order_id"]["S"], "B-1");
    assert_eq!(change["dynamodb"]["NewImage"]["amount_cents"]["N"], "5");
    assert_eq!(letters[0].record.stream(), setup.arn);
    let ids: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|o| o.order.clone())
        .collect();
    assert_eq!(
        ids,
        ["A-1", "B-1", "B-1", "C-1"],
        "C-1 once, after B-1 went aside"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transactional_handler_applies_each_change_once_with_the_checkpoint() {
    let setup = Setup::new().await;
    let totals = unique("totals");
    create_table(&setup.config, &totals, "order_id").await;
    for (order_id, amount) in [("A-1", 100), ("B-1", 40), ("A-1", 250), ("B-1", 60)] {
        setup.put(order_id, amount, false).await;
    }
    let shard = shards(&setup.streams, &setup.arn).await.remove(0).0;
    let table = totals.clone();
    let processor = Processor::transactional(setup.leases(), move |record: Record| {
        let order = change(&record);
        let write = Write::update(
            Update::builder()
                .table_name(&table)
                .key("order_id", AttributeValue::S(order.order))
                .update_expression("ADD #total :amount, changes :one")
                .expression_attribute_names("#total", "total")
                .expression_attribute_values(
                    ":amount",
                    AttributeValue::N(order.amount_cents.unwrap_or(0).to_string()),
                )
                .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
                .build()
                .unwrap(),
        );
        std::future::ready(Effect::Commit(Writes::from(write)))
    })
    .gate(setup.gate());
    for delivery in ["first", "duplicate"] {
        let event = setup.event(&shard).await.into_kinesis().unwrap();
        let report = processor
            .process_batch(event, &context(delivery))
            .await
            .unwrap();
        assert!(
            report.shards[0].stopped.is_none(),
            "{:?}",
            report.shards[0].stopped
        );
    }
    let items = aws_sdk_dynamodb::Client::new(&setup.config)
        .scan()
        .table_name(&totals)
        .send()
        .await
        .unwrap();
    let totals: BTreeMap<String, (String, String)> = items
        .items()
        .iter()
        .map(|item| {
            let n = |name: &str| item[name].as_n().unwrap().clone();
            (
                item["order_id"].as_s().unwrap().clone(),
                (n("total"), n("changes")),
            )
        })
        .collect();
    let want: BTreeMap<String, (String, String)> = HashMap::from([
        ("A-1".to_owned(), ("350".to_owned(), "2".to_owned())),
        ("B-1".to_owned(), ("100".to_owned(), "2".to_owned())),
    ])
    .into_iter()
    .collect();
    assert_eq!(totals, want, "each change applied once");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_without_a_shard_is_refused_and_a_final_invoke_without_changes_is_answered() {
    let setup = Setup::new().await;
    let processor = Processor::new(setup.leases(), |_: Record| async { Outcome::ack() });
    let plain: WindowEvent = serde_json::from_str(include_str!("../events/dynamodb-window.json"))
        .map(|mut event: Value| {
            event.as_object_mut().unwrap().remove("shardId");
            event
        })
        .and_then(serde_json::from_value)
        .unwrap();
    let error = processor
        .process_dynamodb(plain, &context("plain"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("TumblingWindowInSeconds"),
        "{error}"
    );

    let last: WindowEvent = serde_json::from_value(window_event(
        &setup.arn,
        "shardId-00000001796604333303-f37b0ef0",
        &[],
    ))
    .unwrap();
    let answer = processor
        .process_dynamodb(last, &context("last"))
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&answer).unwrap(),
        serde_json::json!({"batchItemFailures": [], "state": {}})
    );
}
