//! The processor's rules, one invocation at a time, on the embedded store (and a fault-injecting
//! wrapper of it): what runs, what is skipped, what is reported, what is checkpointed.

mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::faults::{Faulty, faulty};
use common::{batch, context, event, lambda_record, n_of, redeliver_from, reported, sequence};
use kinesis_checkpoint::report::{Disposition, StopReason};
use kinesis_checkpoint::store::LeaseStore;
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Outcome, ProcessError, Processor, Record};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use serde_json::json;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

/// The `n` of every record the handler acknowledged, in order, across invocations.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<u64>>>);

impl Seen {
    fn all(&self) -> Vec<u64> {
        self.0.lock().unwrap().clone()
    }

    /// A handler that acknowledges every record except those `fail` answers for.
    fn handler(
        &self,
        fail: impl Fn(u64) -> Option<Outcome> + Send + Sync + 'static,
    ) -> impl Fn(Record) -> std::future::Ready<Outcome> + Send + Sync + 'static {
        let seen = self.clone();
        move |record: Record| {
            let n = n_of(&record);
            std::future::ready(fail(n).unwrap_or_else(|| {
                seen.0.lock().unwrap().push(n);
                Outcome::ack()
            }))
        }
    }
}

fn key() -> LeaseKey {
    LeaseKey::new(STREAM, SHARD)
}

async fn checkpoint_of(store: &MemoryLeaseStore) -> Option<String> {
    store.read(&key()).await.unwrap().checkpoint
}

#[tokio::test]
async fn a_fresh_batch_runs_in_order_and_is_checkpointed_at_its_last_record() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));

    let response = processor
        .process(batch(STREAM, SHARD, 0..10), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    assert_eq!(seen.all(), (0..10).collect::<Vec<_>>());
    assert_eq!(checkpoint_of(&store).await, Some(sequence(9)));
    let row = store.read(&key()).await.unwrap();
    assert_eq!(
        row.lease_owner, None,
        "the lease is released with the checkpoint"
    );
}

#[tokio::test]
async fn a_batch_redelivered_after_full_success_runs_nothing_again() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));
    let event = batch(STREAM, SHARD, 0..5);

    processor
        .process(event.clone(), &context("r1", 60_000))
        .await
        .unwrap();
    let again = processor
        .process_batch(event, &context("r2", 60_000))
        .await
        .unwrap();

    assert_eq!(seen.all(), vec![0, 1, 2, 3, 4], "nothing processed twice");
    assert_eq!(again.shards[0].count(Disposition::Duplicate), 5);
    assert!(again.response().batch_item_failures.is_empty());
}

#[tokio::test]
async fn a_redelivery_after_partial_success_runs_only_what_was_not_done() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let attempts = Arc::new(Mutex::new(HashMap::<u64, u32>::new()));
    let counted = attempts.clone();
    // Record 3 fails on its first attempt only, as a downstream outage would.
    let processor = Processor::new(
        store.clone(),
        seen.handler(move |n| {
            let mut attempts = counted.lock().unwrap();
            let attempt = attempts.entry(n).or_default();
            *attempt += 1;
            (n == 3 && *attempt == 1).then(|| Outcome::retry("downstream unavailable"))
        }),
    );
    let event = batch(STREAM, SHARD, 0..6);

    let first = processor
        .process(event.clone(), &context("r1", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&first), vec![sequence(3)]);
    assert_eq!(checkpoint_of(&store).await, Some(sequence(2)));

    // Lambda delivers the whole batch again after a time-out, then from the reported record.
    processor
        .process(event.clone(), &context("r2", 60_000))
        .await
        .unwrap();
    let third = processor
        .process(redeliver_from(&event, &sequence(3)), &context("r3", 60_000))
        .await
        .unwrap();

    assert!(reported(&third).is_empty());
    assert_eq!(
        seen.all(),
        vec![0, 1, 2, 3, 4, 5],
        "each record exactly once, in order"
    );
    assert_eq!(attempts.lock().unwrap()[&3], 2);
    assert_eq!(
        attempts.lock().unwrap()[&0],
        1,
        "done records never run again"
    );
}

#[tokio::test]
async fn the_first_retry_stops_the_shard_and_is_the_only_record_reported() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(
        store.clone(),
        seen.handler(|n| (n == 2 || n == 4).then(|| Outcome::retry("busy"))),
    );

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..6), &context("r1", 60_000))
        .await
        .unwrap();

    assert_eq!(
        seen.all(),
        vec![0, 1],
        "nothing after the failed record runs"
    );
    let shard = &report.shards[0];
    assert_eq!(shard.count(Disposition::Processed), 2);
    assert_eq!(shard.count(Disposition::Reported), 1);
    assert_eq!(shard.count(Disposition::NotAttempted), 3);
    assert!(
        matches!(&shard.stopped, Some((s, StopReason::Retry(e))) if s.as_str() == sequence(2) && e == "busy")
    );
    assert_eq!(reported(&report.response()), vec![sequence(2)]);
}

#[tokio::test]
async fn a_rejected_record_without_a_dead_letter_sink_is_reported_never_dropped() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(
        store.clone(),
        seen.handler(|n| (n == 1).then(|| Outcome::reject("not an order"))),
    );
    let event = batch(STREAM, SHARD, 0..3);

    for request in ["r1", "r2"] {
        let response = processor
            .process(event.clone(), &context(request, 60_000))
            .await
            .unwrap();
        assert_eq!(reported(&response), vec![sequence(1)]);
    }
    assert_eq!(checkpoint_of(&store).await, Some(sequence(0)));
    assert_eq!(seen.all(), vec![0]);
}

#[tokio::test]
async fn a_lease_held_by_a_live_owner_processes_nothing_and_reports_the_first_record() {
    let store = Arc::new(MemoryLeaseStore::new());
    assert!(
        store
            .acquire(&key(), "ledger:other-request", Duration::from_mins(1))
            .await
            .unwrap()
    );
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));

    let report = processor
        .process_batch(batch(STREAM, SHARD, 5..9), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(seen.all().is_empty());
    assert_eq!(
        report.shards[0].stopped,
        Some((
            sequence(5).parse().unwrap(),
            StopReason::LeaseHeld {
                owner: Some("ledger:other-request".into())
            }
        ))
    );
    let row = store.read(&key()).await.unwrap();
    assert_eq!(
        row.lease_owner.as_deref(),
        Some("ledger:other-request"),
        "the holder keeps it"
    );
}

#[tokio::test]
async fn an_expired_lease_of_a_dead_invocation_is_taken_over() {
    let store = Arc::new(MemoryLeaseStore::new());
    assert!(
        store
            .acquire(&key(), "ledger:died", Duration::ZERO)
            .await
            .unwrap()
    );
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));

    let response = processor
        .process(batch(STREAM, SHARD, 0..3), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    assert_eq!(seen.all(), vec![0, 1, 2]);
}

/// An earlier invocation gets through records 0 and 1; then the batch of `records` runs and
/// finds its lease stolen by `thief` just before its checkpoint.
async fn fenced_after_two<H: kinesis_checkpoint::Handler>(
    processor: &Processor<H>,
    store: &Faulty<MemoryLeaseStore>,
    records: std::ops::Range<u64>,
) -> kinesis_checkpoint::BatchReport {
    processor
        .process(batch(STREAM, SHARD, 0..2), &context("r0", 60_000))
        .await
        .unwrap();
    store
        .layer()
        .steal_before_checkpoint
        .store(true, Ordering::SeqCst);
    processor
        .process_batch(batch(STREAM, SHARD, records), &context("r1", 60_000))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_fenced_checkpoint_reports_from_the_first_record_processed_here() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));

    let report = fenced_after_two(&processor, &store, 0..6).await;

    let shard = &report.shards[0];
    assert_eq!(
        shard.stopped,
        Some((sequence(2).parse().unwrap(), StopReason::CheckpointFenced))
    );
    assert_eq!(shard.checkpoint, None);
    assert_eq!(
        checkpoint_of(&memory).await,
        Some(sequence(1)),
        "the thief's row is untouched"
    );
    assert_eq!(
        memory.read(&key()).await.unwrap().lease_owner.as_deref(),
        Some("thief")
    );
}

#[tokio::test]
async fn a_dead_letter_whose_checkpoint_is_fenced_is_reported_so_the_shard_never_stays_behind() {
    // Were the batch answered as a success, Lambda would move on while the row stays below the
    // dead-lettered record: a closed shard would never be found exhausted, and its children
    // would be held forever.
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    let letters = Arc::new(MemoryDeadLetters::new());
    let seen = Seen::default();
    let processor = Processor::new(
        store.clone(),
        seen.handler(|n| (n == 2).then(|| Outcome::reject("not an order"))),
    )
    .dead_letters(letters.clone());
    let report = fenced_after_two(&processor, &store, 2..3).await;
    let shard = &report.shards[0];
    assert_eq!(shard.count(Disposition::Uncheckpointed), 1);
    assert_eq!(reported(&report.response()), vec![sequence(2)]);
    assert_eq!(checkpoint_of(&memory).await, Some(sequence(1)));

    // The thief lets go; the redelivery dead-letters the record again and checkpoints it.
    memory.release(&key(), "thief").await.unwrap();
    let response = processor
        .process(batch(STREAM, SHARD, 2..3), &context("r2", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(checkpoint_of(&memory).await, Some(sequence(2)));
    assert_eq!(
        letters.letters().len(),
        2,
        "sent twice: at least once, never lost"
    );
}

#[tokio::test]
async fn a_lease_lost_during_a_long_batch_stops_dispatch_and_checkpoints_nothing() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    store.layer().steal_on_renew.store(true, Ordering::SeqCst);
    let seen = Seen::default();
    let handled = seen.clone();
    let processor = Processor::new(store.clone(), move |record: Record| {
        let seen = handled.clone();
        async move {
            // Slow enough that the lease is renewed (every 30 ms) while the batch runs.
            tokio::time::sleep(Duration::from_millis(20)).await;
            seen.0.lock().unwrap().push(n_of(&record));
            Outcome::ack()
        }
    })
    .lease_ttl(Duration::from_millis(90));

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..50), &context("r1", 60_000))
        .await
        .unwrap();

    let shard = &report.shards[0];
    let processed = seen.all();
    assert!(
        processed.len() < 50,
        "dispatch stopped once the lease was lost"
    );
    // Nothing could be checkpointed: the first record processed here is reported.
    assert_eq!(
        shard.stopped.as_ref().map(|(s, _)| s.to_string()),
        Some(sequence(0))
    );
    assert_eq!(checkpoint_of(&memory).await, None);
}

#[tokio::test]
async fn a_record_rejected_after_its_lease_was_lost_is_reported_not_dead_lettered() {
    // The handler ran past a renewal that found the lease taken: another owner may have run
    // the record since, and a dead letter sent now would be a second handling of it.
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    store.layer().steal_on_renew.store(true, Ordering::SeqCst);
    let letters = Arc::new(MemoryDeadLetters::new());
    let processor = Processor::new(store.clone(), |_record: Record| async {
        // Past the first renewal (every 30 ms with a lease of 90).
        tokio::time::sleep(Duration::from_millis(60)).await;
        Outcome::reject("not an order")
    })
    .lease_ttl(Duration::from_millis(90))
    .dead_letters(letters.clone());

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..1), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(
        letters.letters().is_empty(),
        "no dead letter without the lease"
    );
    assert_eq!(
        report.shards[0].stopped,
        Some((sequence(0).parse().unwrap(), StopReason::Fenced))
    );
    assert_eq!(reported(&report.response()), vec![sequence(0)]);
    assert_eq!(checkpoint_of(&memory).await, None);
}

#[tokio::test]
async fn a_long_batch_keeps_its_lease_so_a_concurrent_delivery_is_held_off() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let handled = seen.clone();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started = Mutex::new(Some(started_tx));
    let processor = Processor::new(store.clone(), move |record: Record| {
        let seen = handled.clone();
        if let Some(tx) = started.lock().unwrap().take() {
            tx.send(()).unwrap();
        }
        async move {
            tokio::time::sleep(Duration::from_millis(25)).await;
            seen.0.lock().unwrap().push(n_of(&record));
            Outcome::ack()
        }
    })
    .lease_ttl(Duration::from_millis(600));
    let first = tokio::spawn({
        let processor = processor.clone();
        async move {
            processor
                .process(batch(STREAM, SHARD, 0..60), &context("long", 60_000))
                .await
        }
    });
    started_rx.await.unwrap();
    // Past the lease's first lifetime, the first invocation is still at work on its renewed lease.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let second = Seen::default();
    let concurrent = Processor::new(store.clone(), second.handler(|_| None))
        .process_batch(batch(STREAM, SHARD, 0..60), &context("concurrent", 60_000))
        .await
        .unwrap();

    assert!(matches!(
        concurrent.shards[0].stopped,
        Some((_, StopReason::LeaseHeld { .. }))
    ));
    assert!(second.all().is_empty());
    let response = first.await.unwrap().unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(seen.all(), (0..60).collect::<Vec<_>>());
}

#[tokio::test]
async fn no_record_starts_inside_the_deadline_margin() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None))
        .deadline_margin(Duration::from_secs(5));

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..3), &context("r1", 2_000))
        .await
        .unwrap();

    assert!(seen.all().is_empty());
    assert_eq!(
        report.shards[0].stopped,
        Some((sequence(0).parse().unwrap(), StopReason::Deadline))
    );
}

#[tokio::test]
async fn a_handler_running_into_the_deadline_is_stopped_and_its_record_reported() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::new(store.clone(), |record: Record| async move {
        if n_of(&record) == 1 {
            tokio::time::sleep(Duration::from_hours(1)).await;
        }
        Outcome::ack()
    })
    .deadline_margin(Duration::from_millis(200));

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..3), &context("r1", 700))
        .await
        .unwrap();

    assert_eq!(
        report.shards[0].stopped,
        Some((sequence(1).parse().unwrap(), StopReason::HandlerTimedOut))
    );
    assert_eq!(
        checkpoint_of(&store).await,
        Some(sequence(0)),
        "the work before it is kept"
    );
}

#[tokio::test]
async fn a_panicking_handler_fails_its_record_not_the_batch() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::new(store.clone(), |record: Record| async move {
        assert!(n_of(&record) != 2, "record two is cursed");
        Outcome::ack()
    });

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..4), &context("r1", 60_000))
        .await
        .unwrap();

    let Some((at, StopReason::Panicked(message))) = &report.shards[0].stopped else {
        panic!("the panic stops the shard: {report:?}");
    };
    assert_eq!(at.as_str(), sequence(2));
    assert!(message.contains("cursed"));
    assert_eq!(checkpoint_of(&store).await, Some(sequence(1)));
}

#[tokio::test]
async fn a_store_outage_at_the_claim_processes_nothing_and_reports_the_first_record() {
    let store = Arc::new(faulty(Arc::new(MemoryLeaseStore::new())));
    store.layer().claim_fails.store(true, Ordering::SeqCst);
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..3), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(seen.all().is_empty());
    let Some((at, StopReason::Store(error))) = &report.shards[0].stopped else {
        panic!("an outage stops the shard");
    };
    assert_eq!(at.as_str(), sequence(0));
    assert!(error.contains("ProvisionedThroughputExceeded"));
}

#[tokio::test]
async fn a_malformed_record_stops_its_shard_where_it_stands_and_is_reported() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));
    let mut broken = lambda_record(STREAM, SHARD, 2, "k", &json!({ "n": 2 }));
    broken["eventID"] = json!("not-an-event-id");
    let event = event(&[
        lambda_record(STREAM, SHARD, 0, "k", &json!({ "n": 0 })),
        lambda_record(STREAM, SHARD, 1, "k", &json!({ "n": 1 })),
        broken,
        lambda_record(STREAM, SHARD, 3, "k", &json!({ "n": 3 })),
    ]);

    let report = processor
        .process_batch(event, &context("r1", 60_000))
        .await
        .unwrap();

    assert_eq!(seen.all(), vec![0, 1]);
    let Some((at, StopReason::Malformed(reason))) = &report.shards[0].stopped else {
        panic!("the malformed record stops the shard: {report:?}");
    };
    assert_eq!(at.as_str(), sequence(2));
    assert!(
        reason.contains("eventID") && reason.contains(&sequence(2)),
        "{reason}"
    );
    assert_eq!(reported(&report.response()), vec![sequence(2)]);
    assert_eq!(checkpoint_of(&store).await, Some(sequence(1)));
}

#[tokio::test]
async fn a_record_without_a_sequence_number_fails_the_batch_after_checkpointing_what_precedes_it() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(store.clone(), seen.handler(|_| None));
    let mut broken = lambda_record(STREAM, SHARD, 1, "k", &json!({ "n": 1 }));
    broken["kinesis"]["sequenceNumber"] = json!("");
    let event = event(&[
        lambda_record(STREAM, SHARD, 0, "k", &json!({ "n": 0 })),
        broken,
        lambda_record(STREAM, SHARD, 2, "k", &json!({ "n": 2 })),
    ]);

    let error = processor
        .process(event, &context("r1", 60_000))
        .await
        .unwrap_err();

    assert!(matches!(error, ProcessError::Unreportable(_)));
    let message = error.to_string();
    assert!(
        message.contains("shard shardId-000000000000") && message.contains("empty"),
        "{message}"
    );
    assert_eq!(
        seen.all(),
        vec![0],
        "nothing after the unreadable record runs"
    );
    assert_eq!(checkpoint_of(&store).await, Some(sequence(0)));
}

#[tokio::test]
async fn one_shard_id_on_two_streams_keeps_two_checkpoints_and_two_reports() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(
        store.clone(),
        seen.handler(|n| (n == 11).then(|| Outcome::retry("no"))),
    );
    let event = event(&[
        lambda_record("orders", SHARD, 10, "k", &json!({ "n": 10 })),
        lambda_record("refunds", SHARD, 10, "k", &json!({ "n": 110 })),
        lambda_record("orders", SHARD, 11, "k", &json!({ "n": 11 })),
        lambda_record("refunds", SHARD, 11, "k", &json!({ "n": 111 })),
    ]);

    let response = processor
        .process(event, &context("r1", 60_000))
        .await
        .unwrap();

    assert_eq!(
        reported(&response),
        vec![sequence(11)],
        "orders stopped at 11; refunds did not"
    );
    assert_eq!(seen.all(), vec![10, 110, 111]);
    let orders = store.read(&LeaseKey::new("orders", SHARD)).await.unwrap();
    let refunds = store.read(&LeaseKey::new("refunds", SHARD)).await.unwrap();
    assert_eq!(orders.checkpoint, Some(sequence(10)));
    assert_eq!(refunds.checkpoint, Some(sequence(11)));
}

#[tokio::test]
async fn the_sample_events_answer_in_lambdas_wire_format() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::new(store, |record: Record| async move {
        let order: serde_json::Value = record.json().unwrap();
        if order.get("fail").is_some() {
            Outcome::retry("asked to fail")
        } else {
            Outcome::ack()
        }
    });
    let transient = serde_json::from_str(include_str!("../events/transient.json")).unwrap();

    let response = processor
        .process(transient, &context("r1", 60_000))
        .await
        .unwrap();

    let wire = serde_json::to_string(&response).unwrap();
    assert_eq!(
        wire,
        r#"{"batchItemFailures":[{"itemIdentifier":"49656139270218735118962416178386539874290435484613640206"}]}"#
    );
}

/// The final write through the fault wrapper, which every test here runs on, carries what the
/// processor gives it: a wrapper that ran the trait's default `commit` instead of the store's
/// would drop the failing record and the records done above the checkpoint.
#[tokio::test]
async fn through_the_fault_wrapper_the_final_write_keeps_the_failing_record_and_the_records_done_above()
 {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Arc::new(faulty(memory.clone()));
    let seen = Seen::default();
    // Keys are `key-{n % 7}`: record 2 fails, 9 (its key's next) waits, 3 to 8 run above it.
    let processor = Processor::new(
        store,
        seen.handler(|n| (n == 2).then(|| Outcome::retry("the ledger is busy"))),
    )
    .concurrency(4);

    let report = processor
        .process_batch(batch(STREAM, SHARD, 0..10), &context("r1", 60_000))
        .await
        .unwrap();

    assert_eq!(reported(&report.response()), [sequence(2)]);
    let row = memory.read(&key()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(1)));
    let failing = row.failing.expect("the failing record is kept");
    assert_eq!(
        (failing.sequence, failing.sub_sequence, failing.attempts),
        (sequence(2), None, 1)
    );
    assert!(failing.last_error.contains("the ledger is busy"));
    let done_above: Vec<String> = row.done_above.iter().map(ToString::to_string).collect();
    assert_eq!(done_above, (3..9).map(sequence).collect::<Vec<_>>());
    assert_eq!((row.lease_owner, row.lease_expiry), (None, None));
}
