//! Hands the KPL example's processor an aggregate that AWS's own aggregator made
//! (`aws-kinesis-agg`, the fixture of `scripts/make_kpl_fixtures.py`): ten orders, one Kinesis
//! record. The handler sees ten user records, and a batch stopped inside the aggregate resumes
//! at the user record that failed.

use std::sync::{Arc, Mutex};

use aws_lambda_events::event::kinesis::KinesisEvent;
use example_kpl_aggregates::{Order, apply};
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::{Handler, MemoryLeaseStore, Outcome, Processor, Record, json};
use serde_json::{Value, json};

const PLAIN: &str = "49656139270218735118962416178386539874290435484613640194";
const AGGREGATE: &str = "49656139270218735118962416178386539874290435484613640195";
/// `{"order_id": "plain", "amount_cents": 10}`, in base64.
const PLAIN_ORDER: &str = "eyJvcmRlcl9pZCI6ICJwbGFpbiIsICJhbW91bnRfY2VudHMiOiAxMH0=";

/// What the handler saw of one user record.
#[derive(Debug, PartialEq)]
struct Seen {
    order_id: String,
    partition_key: String,
    routing_key: String,
    sequence: String,
    sub_sequence: Option<u64>,
}

/// A Lambda event of shard 0: a plain order, then the aggregate of ten.
fn event() -> KinesisEvent {
    let fixture: Value = serde_json::from_str(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ten_sub_records.json"
    )))
    .unwrap();
    let aggregate = fixture["data_base64"].as_str().unwrap();
    let records = [
        ("plain", PLAIN, PLAIN_ORDER),
        ("order-0", AGGREGATE, aggregate),
    ]
    .map(|(key, sequence, data)| {
        json!({
            "kinesis": {
                "kinesisSchemaVersion": "1.0",
                "partitionKey": key,
                "sequenceNumber": sequence,
                "data": data,
                "approximateArrivalTimestamp": 1_764_512_345.125
            },
            "eventSource": "aws:kinesis",
            "eventVersion": "1.0",
            "eventID": format!("shardId-000000000000:{sequence}"),
            "eventName": "aws:kinesis:record",
            "invokeIdentityArn": "arn:aws:iam::123456789012:role/orders",
            "awsRegion": "us-east-1",
            "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
        })
    });
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

/// `apply`, writing down each order it is handed; the order `fail_once` fails on its first try.
fn watched(seen: &Arc<Mutex<Vec<Seen>>>, fail_once: &'static str) -> impl Handler {
    let seen = Arc::clone(seen);
    let failed = Arc::new(Mutex::new(false));
    json(move |order: Order, record: Record| {
        let (seen, failed) = (Arc::clone(&seen), Arc::clone(&failed));
        async move {
            if order.order_id == fail_once && !std::mem::replace(&mut *failed.lock().unwrap(), true)
            {
                return Outcome::retry("the downstream is busy");
            }
            seen.lock().unwrap().push(Seen {
                order_id: order.order_id.clone(),
                partition_key: record.partition_key().to_owned(),
                routing_key: record.routing_key().to_owned(),
                sequence: record.sequence().to_string(),
                sub_sequence: record.sub_sequence(),
            });
            apply(order, record).await
        }
    })
}

#[tokio::test]
async fn the_handler_sees_each_user_record_of_an_aggregate_with_its_sub_sequence_number() {
    let seen = Arc::default();
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), watched(&seen, "none"));
    let report = processor
        .process_batch(event(), &lambda_runtime::Context::default())
        .await
        .unwrap();

    assert_eq!(report.shards[0].count(Disposition::Processed), 11);
    let plain = Seen {
        order_id: "plain".into(),
        partition_key: "plain".into(),
        routing_key: "plain".into(),
        sequence: PLAIN.into(),
        sub_sequence: None,
    };
    let packed = (0..10).map(|n| Seen {
        order_id: n.to_string(),
        partition_key: format!("order-{n}"),
        routing_key: "order-0".into(),
        sequence: AGGREGATE.into(),
        sub_sequence: Some(n),
    });
    let expected: Vec<Seen> = std::iter::once(plain).chain(packed).collect();
    assert_eq!(*seen.lock().unwrap(), expected);
}

#[tokio::test]
async fn a_batch_stopped_inside_an_aggregate_resumes_at_the_user_record_that_failed() {
    let seen = Arc::<Mutex<Vec<Seen>>>::default();
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), watched(&seen, "4"));
    let context = lambda_runtime::Context::default();

    // Order 4 fails: Lambda is told the aggregate's sequence number, and delivers it again.
    let first = processor.process(event(), &context).await.unwrap();
    let reported: Vec<_> = first
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    assert_eq!(reported, [Some(AGGREGATE.to_owned())]);

    let again = processor.process_batch(event(), &context).await.unwrap();
    let shard = &again.shards[0];
    assert_eq!(
        shard.count(Disposition::Duplicate),
        5,
        "the plain order and orders 0 to 3"
    );
    assert_eq!(shard.count(Disposition::Processed), 6, "orders 4 to 9");
    let orders: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.order_id.clone())
        .collect();
    let once_each: Vec<String> = std::iter::once("plain".to_owned())
        .chain((0..10).map(|n| n.to_string()))
        .collect();
    assert_eq!(orders, once_each);
}
