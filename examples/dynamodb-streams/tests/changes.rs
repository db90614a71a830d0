//! The example's handler through `process_dynamodb`, on window events built as Lambda sends
//! them, with the leases in memory.

use std::sync::{Arc, Mutex};

use example_dynamodb_streams::{Change, handle};
use kinesis_checkpoint::dynamodb_streams::WindowEvent;
use kinesis_checkpoint::{MemoryLeaseStore, Processor, Record, json};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use serde_json::{Value, json};

const ARN: &str =
    "arn:aws:dynamodb:us-east-1:123456789012:table/accounts/stream/2026-12-07T00:00:00.000";
const SHARD: &str = "shardId-00000001796604333303-f37b0ef0";

/// A change of account `id` to `balance` (none: a removal), at `sequence`.
fn change(sequence: u64, id: &str, balance: Option<i64>) -> Value {
    let mut dynamodb = json!({
        "Keys": {"id": {"S": id}},
        "SequenceNumber": format!("{}", 100_000_000_000_000_000_000_u128 + u128::from(sequence)),
        "StreamViewType": "NEW_IMAGE",
    });
    if let Some(balance) = balance {
        dynamodb["NewImage"] = json!({"id": {"S": id}, "balance": {"N": balance.to_string()}});
    }
    let event = if balance.is_some() {
        "MODIFY"
    } else {
        "REMOVE"
    };
    json!({"eventName": event, "eventSource": "aws:dynamodb", "dynamodb": dynamodb, "eventSourceARN": ARN})
}

fn window(changes: &[Value]) -> WindowEvent {
    serde_json::from_value(json!({
        "Records": changes, "shardId": SHARD, "eventSourceARN": ARN, "state": {},
        "window": {"start": "2026-12-07T00:00:00Z", "end": "2026-12-07T00:15:00Z"},
        "isFinalInvokeForWindow": false, "isWindowTerminatedEarly": false,
    }))
    .unwrap()
}

#[tokio::test]
async fn each_change_is_handled_once_and_a_negative_balance_is_dead_lettered_whole() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let handler = {
        let seen = Arc::clone(&seen);
        json(move |change: Change, record: Record| {
            seen.lock().unwrap().push(record.sequence().to_string());
            handle(change, record)
        })
    };
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor =
        Processor::new(Arc::new(MemoryLeaseStore::new()), handler).dead_letters(letters.clone());
    let changes = [
        change(1, "a", Some(100)),
        change(2, "b", Some(-5)),
        change(3, "a", Some(80)),
        change(4, "b", None),
    ];
    let context = lambda_runtime::Context::default();
    for _ in 0..2 {
        let answer = processor
            .process_dynamodb(window(&changes), &context)
            .await
            .unwrap();
        assert_eq!(
            serde_json::to_value(&answer).unwrap(),
            json!({"batchItemFailures": [], "state": {}})
        );
    }
    assert_eq!(
        seen.lock().unwrap().len(),
        4,
        "the second delivery handles nothing"
    );
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    let dead: Value = serde_json::from_slice(letters[0].record.data()).unwrap();
    assert_eq!(dead["dynamodb"]["NewImage"]["balance"]["N"], "-5");
    assert_eq!(dead["dynamodb"]["Keys"]["id"]["S"], "b");
}
