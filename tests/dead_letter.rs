//! Poison records through the real SDK against moto (`DynamoDB` and SQS) on 127.0.0.1: moved to
//! the queue with their payload, never lost; failing records counted across invocations; a queue
//! outage; handlers that time out or panic; redrive.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, unique};
use common::{batch, context, event, lambda_record, n_of, redeliver_from, reported, sequence};
use kinesis_checkpoint::dead_letter::redrive;
use kinesis_checkpoint::report::StopReason;
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Outcome, Processor, Record, SqsDeadLetters};
use serde_json::{Value, json};

const SHARD: &str = "shardId-000000000000";

/// A lease table and a queue on the shared server.
struct Setup {
    config: aws_config::SdkConfig,
    store: DynamoLeaseStore,
    sqs: aws_sdk_sqs::Client,
    queue: String,
}

async fn setup() -> Setup {
    let config = Moto::shared().sdk_config(1).await;
    let table = unique("leases");
    create_lease_table(&config, &table).await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let queue = common::moto::create_queue(&config).await;
    Setup {
        store: DynamoLeaseStore::new(&config, table),
        config,
        sqs,
        queue,
    }
}

impl Setup {
    fn sink(&self) -> Arc<SqsDeadLetters> {
        Arc::new(SqsDeadLetters::new(&self.config, &self.queue))
    }

    /// Every message in the queue (left in it), as (body, attributes).
    async fn messages(&self) -> Vec<(Value, HashMap<String, String>)> {
        let mut all = Vec::new();
        loop {
            let received = self
                .sqs
                .receive_message()
                .queue_url(&self.queue)
                .max_number_of_messages(10)
                .visibility_timeout(0)
                .message_attribute_names("All")
                .send()
                .await
                .unwrap();
            let messages = received.messages.unwrap_or_default();
            let fresh: Vec<_> = messages
                .into_iter()
                .filter(|m| {
                    !all.iter()
                        .any(|(id, _, _)| Some(id) == m.message_id.as_ref())
                })
                .collect();
            if fresh.is_empty() {
                break;
            }
            for message in fresh {
                let attributes = message
                    .message_attributes
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.string_value.unwrap_or_default()))
                    .collect();
                let body = serde_json::from_str(message.body.as_deref().unwrap()).unwrap();
                all.push((message.message_id.unwrap(), body, attributes));
            }
        }
        all.into_iter()
            .map(|(_, body, attributes)| (body, attributes))
            .collect()
    }

    async fn row(&self) -> kinesis_checkpoint::store::LeaseState {
        self.store
            .read(&LeaseKey::new("orders", SHARD))
            .await
            .unwrap()
    }
}

/// Records the handler finished, by `n`.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<u64>>>);

impl Seen {
    fn all(&self) -> Vec<u64> {
        self.0.lock().unwrap().clone()
    }
}

/// A handler that finishes every record but those `fail` has an answer for.
fn handler(
    seen: &Seen,
    fail: impl Fn(u64) -> Option<Outcome> + Send + Sync + 'static,
) -> impl Fn(Record) -> std::future::Ready<Outcome> + Send + Sync + 'static {
    let seen = seen.clone();
    move |record: Record| {
        let n = n_of(&record);
        std::future::ready(fail(n).unwrap_or_else(|| {
            seen.0.lock().unwrap().push(n);
            Outcome::ack()
        }))
    }
}

#[tokio::test]
async fn a_poison_record_mid_batch_is_queued_with_its_payload_and_the_rest_run_once() {
    let setup = setup().await;
    let seen = Seen::default();
    let processor = Processor::new(
        Arc::new(setup.store.clone()),
        handler(&seen, |n| {
            (n == 3).then(|| Outcome::reject("order 3 has no customer"))
        }),
    )
    .dead_letters(setup.sink());
    let event = batch("orders", SHARD, 0..6);

    let response = processor
        .process(event.clone(), &context("r1", 60_000))
        .await
        .unwrap();
    let again = processor
        .process(event, &context("r2", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty() && reported(&again).is_empty());
    assert_eq!(
        seen.all(),
        vec![0, 1, 2, 4, 5],
        "before and after it, each record once"
    );
    let row = setup.row().await;
    assert_eq!(
        row.checkpoint,
        Some(sequence(5)),
        "the checkpoint is past the poison record"
    );
    assert_eq!(row.failing, None);
    let messages = setup.messages().await;
    assert_eq!(messages.len(), 1, "dead-lettered once: {messages:?}");
    let (body, attributes) = &messages[0];
    assert_eq!(body["sequence_number"], json!(sequence(3)));
    assert_eq!(body["stream"], json!("orders"));
    assert_eq!(body["shard"], json!(SHARD));
    assert_eq!(body["partition_key"], json!("key-3"));
    assert_eq!(body["reason"], json!("rejected"));
    assert_eq!(body["attempts"], json!(1));
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("order 3 has no customer")
    );
    assert!(
        body["approximate_arrival"]
            .as_str()
            .unwrap()
            .starts_with("2025-11-30T")
    );
    let payload = base64_decode(body["data_base64"].as_str().unwrap());
    assert_eq!(
        serde_json::from_slice::<Value>(&payload).unwrap(),
        json!({ "n": 3 })
    );
    assert_eq!(attributes["sequence_number"], sequence(3));
    assert_eq!(attributes["shard"], SHARD);
    assert_eq!(attributes["attempts"], "1");
}

#[tokio::test]
async fn a_rejected_records_dead_letter_says_the_handler_rejected_it_and_nothing_about_a_missing_sink()
 {
    let setup = setup().await;
    let processor = Processor::new(Arc::new(setup.store.clone()), |record: Record| async move {
        if n_of(&record) == 1 {
            Outcome::reject("order 1 has no customer")
        } else {
            Outcome::ack()
        }
    })
    .dead_letters(setup.sink());

    processor
        .process(batch("orders", SHARD, 0..3), &context("r1", 60_000))
        .await
        .unwrap();

    let messages = setup.messages().await;
    assert_eq!(messages.len(), 1);
    let (body, attributes) = &messages[0];
    let said = "the handler rejected the record: order 1 has no customer";
    assert_eq!(body["error"], json!(said));
    assert_eq!(attributes["error"], said);
    assert_eq!(body["reason"], json!("rejected"));
}

#[tokio::test]
async fn failures_are_counted_across_cold_starts_until_the_record_is_dead_lettered() {
    let setup = setup().await;
    let seen = Seen::default();
    let event = batch("orders", SHARD, 0..4);
    let mut delivery = event.clone();
    for attempt in 1..=3 {
        // A new processor each time: a cold start remembers nothing but the row.
        let processor = Processor::new(
            Arc::new(setup.store.clone()),
            handler(&seen, |n| {
                (n == 1).then(|| Outcome::retry("ledger service unavailable"))
            }),
        )
        .dead_letters(setup.sink())
        .max_attempts(3);
        let response = processor
            .process(delivery.clone(), &context(&format!("r{attempt}"), 60_000))
            .await
            .unwrap();
        let row = setup.row().await;
        if attempt < 3 {
            assert_eq!(reported(&response), vec![sequence(1)]);
            let failing = row.failing.expect("the failure is remembered");
            assert_eq!(
                (failing.sequence.as_str(), failing.attempts),
                (sequence(1).as_str(), attempt)
            );
            assert!(failing.last_error.contains("ledger service unavailable"));
            assert!(setup.messages().await.is_empty(), "not yet dead-lettered");
            delivery = redeliver_from(&event, &sequence(1));
        } else {
            assert!(reported(&response).is_empty());
            assert_eq!(row.failing, None, "forgotten once dead-lettered");
            assert_eq!(row.checkpoint, Some(sequence(3)));
        }
    }
    assert_eq!(seen.all(), vec![0, 2, 3]);
    let messages = setup.messages().await;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].0["reason"], json!("exhausted"));
    assert_eq!(messages[0].0["attempts"], json!(3));
}

#[tokio::test]
async fn a_record_that_succeeds_at_last_is_forgotten_and_never_queued() {
    let setup = setup().await;
    let seen = Seen::default();
    let failures = Arc::new(Mutex::new(0));
    let counter = failures.clone();
    let processor = Processor::new(
        Arc::new(setup.store.clone()),
        handler(&seen, move |n| {
            let mut failures = counter.lock().unwrap();
            (n == 0 && *failures < 2).then(|| {
                *failures += 1;
                Outcome::retry("busy")
            })
        }),
    )
    .dead_letters(setup.sink())
    .max_attempts(3);
    let event = batch("orders", SHARD, 0..2);

    for request in ["r1", "r2"] {
        processor
            .process(event.clone(), &context(request, 60_000))
            .await
            .unwrap();
        assert_eq!(
            setup.row().await.failing.map(|f| f.attempts),
            Some(if request == "r1" { 1 } else { 2 })
        );
    }
    let response = processor
        .process(event, &context("r3", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    assert_eq!(setup.row().await.failing, None);
    assert!(setup.messages().await.is_empty());
    assert_eq!(seen.all(), vec![0, 1]);
}

#[tokio::test]
async fn a_queue_outage_loses_nothing_and_skips_nothing() {
    let setup = setup().await;
    let seen = Seen::default();
    let poison = |n| (n == 2).then(|| Outcome::reject("malformed order"));
    // The queue does not exist (yet): every send fails.
    let missing = format!("{}-missing", setup.queue);
    let broken = Processor::new(Arc::new(setup.store.clone()), handler(&seen, poison))
        .dead_letters(Arc::new(SqsDeadLetters::new(&setup.config, &missing)));
    let event = batch("orders", SHARD, 0..5);

    let report = broken
        .process_batch(event.clone(), &context("r1", 60_000))
        .await
        .unwrap();

    let Some((at, StopReason::DeadLetterFailed(error))) = &report.shards[0].stopped else {
        panic!("the failed send stops the shard: {report:?}");
    };
    assert_eq!(at.as_str(), sequence(2));
    assert!(
        error.contains(&sequence(2)) && error.contains("missing"),
        "{error}"
    );
    assert_eq!(
        setup.row().await.checkpoint,
        Some(sequence(1)),
        "not past the record"
    );

    // The queue is back: the redelivery dead-letters it and goes on.
    let healthy = Processor::new(Arc::new(setup.store.clone()), handler(&seen, poison))
        .dead_letters(setup.sink());
    let response = healthy
        .process(redeliver_from(&event, &sequence(2)), &context("r2", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(seen.all(), vec![0, 1, 3, 4]);
    let messages = setup.messages().await;
    assert_eq!(messages.len(), 1);
    assert_eq!(
        messages[0].0["attempts"],
        json!(2),
        "the failed attempt was counted"
    );
}

#[tokio::test]
async fn a_handler_slower_than_the_deadline_is_stopped_each_time_then_dead_lettered() {
    let setup = setup().await;
    let processor = Processor::new(Arc::new(setup.store.clone()), |record: Record| async move {
        if n_of(&record) == 1 {
            tokio::time::sleep(Duration::from_hours(1)).await;
        }
        Outcome::ack()
    })
    .deadline_margin(Duration::from_millis(100))
    .dead_letters(setup.sink())
    .max_attempts(2);
    let event = batch("orders", SHARD, 0..2);

    let first = processor
        .process_batch(event.clone(), &context("r1", 600))
        .await
        .unwrap();
    assert!(matches!(
        first.shards[0].stopped,
        Some((_, StopReason::HandlerTimedOut))
    ));
    let second = processor
        .process(redeliver_from(&event, &sequence(1)), &context("r2", 600))
        .await
        .unwrap();

    assert!(reported(&second).is_empty());
    assert_eq!(setup.row().await.checkpoint, Some(sequence(1)));
    let messages = setup.messages().await;
    assert_eq!(messages.len(), 1);
    assert!(
        messages[0].0["error"]
            .as_str()
            .unwrap()
            .contains("deadline")
    );
}

#[tokio::test]
async fn a_panic_is_a_failure_of_its_record_and_is_dead_lettered_with_the_message() {
    let setup = setup().await;
    let processor = Processor::new(Arc::new(setup.store.clone()), |record: Record| async move {
        assert!(n_of(&record) != 1, "amount overflows");
        Outcome::ack()
    })
    .dead_letters(setup.sink())
    .max_attempts(1);

    let response = processor
        .process(batch("orders", SHARD, 0..3), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    let messages = setup.messages().await;
    assert_eq!(messages.len(), 1);
    assert!(
        messages[0].0["error"]
            .as_str()
            .unwrap()
            .contains("amount overflows")
    );
}

#[tokio::test]
async fn a_record_larger_than_a_message_is_split_and_redriven_whole() {
    let setup = setup().await;
    let big = "x".repeat(700_000);
    let records = [
        lambda_record("orders", SHARD, 0, "big", &json!({ "n": 0, "blob": big })),
        lambda_record("orders", SHARD, 1, "small", &json!({ "n": 1 })),
    ];
    let processor = Processor::new(Arc::new(setup.store.clone()), |record: Record| async move {
        if n_of(&record) == 0 {
            Outcome::reject("too big to apply")
        } else {
            Outcome::ack()
        }
    })
    .dead_letters(setup.sink());

    let response = processor
        .process(event(&records), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    let messages = setup.messages().await;
    assert!(
        messages.len() >= 4,
        "700 KB in base64 needs 4 messages of 256 KiB: {}",
        messages.len()
    );
    assert!(
        messages
            .iter()
            .all(|(body, _)| body["parts"] == json!(messages.len()))
    );

    let redriven = Arc::new(Mutex::new(Vec::new()));
    let keep = redriven.clone();
    let report = redrive(
        &setup.sqs,
        &setup.queue,
        &move |record: Record| {
            keep.lock().unwrap().push(record);
            async { Outcome::ack() }
        },
        Duration::from_secs(30),
    )
    .await
    .unwrap();

    assert_eq!(report.redriven, 1);
    let redriven = redriven.lock().unwrap().clone();
    let record = &redriven[0];
    assert_eq!(record.sequence().as_str(), sequence(0));
    assert_eq!(record.partition_key(), "big");
    let payload: Value = record.json().unwrap();
    assert_eq!(
        payload["blob"].as_str().unwrap().len(),
        700_000,
        "every byte came back"
    );
    assert!(setup.messages().await.is_empty(), "deleted once redriven");
}

#[tokio::test]
async fn redrive_deletes_only_what_the_handler_finished() {
    let setup = setup().await;
    let processor = Processor::new(Arc::new(setup.store.clone()), |record: Record| async move {
        if n_of(&record).is_multiple_of(2) {
            Outcome::reject("even orders are broken")
        } else {
            Outcome::ack()
        }
    })
    .dead_letters(setup.sink());
    processor
        .process(batch("orders", SHARD, 0..6), &context("r1", 60_000))
        .await
        .unwrap();
    assert_eq!(setup.messages().await.len(), 3);

    // The fix handles 0 and 2; 4 still fails and must stay queued.
    let report = redrive(
        &setup.sqs,
        &setup.queue,
        &|record: Record| async move {
            if n_of(&record) == 4 {
                Outcome::retry("still broken")
            } else {
                Outcome::ack()
            }
        },
        Duration::from_secs(1),
    )
    .await
    .unwrap();

    assert_eq!((report.redriven, report.failed), (2, 1));
    // The message the handler did not finish reappears once its visibility timeout passes.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let left = setup.messages().await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0["sequence_number"], json!(sequence(4)));
}

#[tokio::test]
async fn the_failing_record_is_written_in_the_checkpoint_write_not_a_request_of_its_own() {
    let setup = setup().await;
    let processor = Processor::new(Arc::new(setup.store.clone()), |record: Record| async move {
        if n_of(&record) == 2 {
            Outcome::retry("busy")
        } else {
            Outcome::ack()
        }
    });
    processor
        .process(batch("orders", SHARD, 0..4), &context("r1", 60_000))
        .await
        .unwrap();

    let raw = aws_sdk_dynamodb::Client::new(&setup.config)
        .get_item()
        .table_name(setup.store.table())
        .key("lease_key", AttributeValue::S(format!("orders:{SHARD}")))
        .send()
        .await
        .unwrap()
        .item
        .unwrap();
    let failing = raw["failing"].as_m().unwrap();
    assert_eq!(failing["sequence"].as_s().unwrap(), &sequence(2));
    assert_eq!(failing["attempts"].as_n().unwrap(), "1");
    assert!(failing.contains_key("first_failure") && failing.contains_key("last_failure"));
    // acquire-and-read, then checkpoint-failing-and-release: two writes in all.
    assert_eq!(raw["lease_counter"].as_n().unwrap(), "2");
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}
