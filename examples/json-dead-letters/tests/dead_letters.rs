//! Runs the typed JSON example's processor through the local event source: poison records go to
//! the dead-letter sink and the shard goes on, and redrive runs them again once fixed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use example_json_dead_letters::{MAX_ATTEMPTS, Order, handler, processor};
use kinesis_checkpoint::MemoryLeaseStore;
use kinesis_checkpoint::dead_letter::{DeadLetterReason, redrive_queue};
use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};
use kinesis_checkpoint_testing::{MemoryDeadLetters, MemoryQueue};

/// Order ids in the order a downstream received them.
type Calls = Arc<Mutex<Vec<String>>>;

/// A downstream that writes each call down and refuses the order `refused` every time.
fn downstream(calls: Calls, refused: &'static str) -> impl Fn(&Order) -> Result<(), String> {
    move |order: &Order| {
        calls.lock().unwrap().push(order.order_id.clone());
        if order.order_id == refused {
            Err(format!(
                "the payment service refuses order {refused} for now"
            ))
        } else {
            Ok(())
        }
    }
}

/// A stream of one shard with orders o-0 to o-19, each written as `payload(n)` says.
fn orders(payload: impl Fn(u32) -> String) -> MemoryStream {
    let stream = MemoryStream::new("orders", 1);
    for n in 0..20 {
        stream.put("customer-1", payload(n));
    }
    stream
}

fn order(n: u32) -> String {
    format!(r#"{{"order_id":"o-{n}","amount_cents":{}}}"#, 100 + n)
}

fn mapping() -> Mapping {
    Mapping::default()
        .batch_size(5)
        .duplicate_deliveries(0.3)
        .maximum_backoff(Duration::from_millis(1))
        .seed(3)
}

#[tokio::test]
async fn a_record_that_is_not_an_order_or_has_no_amount_is_dead_lettered_at_once() {
    let stream = orders(|n| match n {
        4 => "not json".to_owned(),
        9 => r#"{"order_id":"o-9","amount_cents":-5}"#.to_owned(),
        n => order(n),
    });
    let calls = Calls::default();
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = processor(
        Arc::new(MemoryLeaseStore::new()),
        handler(downstream(calls.clone(), "none")),
        letters.clone(),
    );
    let run = EventSource::new(stream, mapping())
        .run(Arc::new(processor))
        .await
        .unwrap();

    assert!(run.discarded.is_empty());
    let expected: Vec<String> = (0..20)
        .filter(|n| ![4, 9].contains(n))
        .map(|n| format!("o-{n}"))
        .collect();
    assert_eq!(
        *calls.lock().unwrap(),
        expected,
        "the rest once each, in order"
    );
    let letters = letters.letters();
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0].record.data(), b"not json");
    assert!(
        letters[1].error.contains("o-9 has no positive amount"),
        "{}",
        letters[1].error
    );
    assert!(
        letters
            .iter()
            .all(|l| l.reason == DeadLetterReason::Rejected && l.attempts == 1)
    );
}

#[tokio::test]
async fn an_order_the_downstream_keeps_refusing_is_dead_lettered_after_max_attempts() {
    let calls = Calls::default();
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = processor(
        Arc::new(MemoryLeaseStore::new()),
        handler(downstream(calls.clone(), "o-7")),
        letters.clone(),
    );
    EventSource::new(orders(order), mapping())
        .run(Arc::new(processor))
        .await
        .unwrap();

    let calls = calls.lock().unwrap();
    let tries = calls.iter().filter(|id| *id == "o-7").count();
    assert_eq!(tries, MAX_ATTEMPTS as usize);
    assert_eq!(calls.len(), 19 + tries, "every other order once");
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, DeadLetterReason::Exhausted);
    assert_eq!(letters[0].attempts, MAX_ATTEMPTS);
    assert_eq!(letters[0].record.data(), order(7).as_bytes());
}

#[tokio::test]
async fn redrive_runs_a_dead_letter_once_its_cause_is_fixed_and_empties_the_queue() {
    // The queue in memory applies SQS's limits, as the function's SqsDeadLetters meets them.
    let queue = Arc::new(MemoryQueue::new(262_144));
    let processor = processor(
        Arc::new(MemoryLeaseStore::new()),
        handler(downstream(Calls::default(), "o-7")),
        queue.clone(),
    );
    EventSource::new(orders(order), mapping())
        .run(Arc::new(processor))
        .await
        .unwrap();
    assert_eq!(queue.len(), 1, "o-7 is in the queue");

    let fixed = Calls::default();
    let report = redrive_queue(
        queue.as_ref(),
        &handler(downstream(fixed.clone(), "none")),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(report.redriven, 1);
    assert_eq!(*fixed.lock().unwrap(), ["o-7"]);
    assert!(queue.is_empty());
}
