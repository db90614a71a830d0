//! The local event source behaves as Lambda's Kinesis event source mapping: batch size and order,
//! redelivery from a reported record, whole-batch retries and bisection, retry and age limits
//! with discards, `ReportBatchItemFailures`, `ParallelizationFactor`, and child shards.

#![allow(
    clippy::similar_names,
    clippy::unnecessary_wraps,
    reason = "answers are Results because a function's answer is"
)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::{BoxFuture, MemoryLeaseStore, Outcome, Processor, Record};
use kinesis_checkpoint_testing::local::{
    Delivery, DeliveryOutcome, DiscardReason, EventSource, Function, InvocationError, Mapping,
    MemoryStream, Rng,
};
use serde_json::json;

type Answer = Result<KinesisEventResponse, InvocationError>;

/// A function whose answer is a plain function of the batch (and what it saw before).
struct Scripted<F>(Mutex<F>);

impl<F> Function for Scripted<F>
where
    F: FnMut(&KinesisEvent) -> Answer + Send + 'static,
{
    fn invoke(
        &self,
        event: KinesisEvent,
        _context: lambda_runtime::Context,
    ) -> BoxFuture<'_, Answer> {
        let answer = (self.0.lock().unwrap())(&event);
        Box::pin(async move { answer })
    }
}

fn scripted(f: impl FnMut(&KinesisEvent) -> Answer + Send + 'static) -> Arc<dyn Function> {
    Arc::new(Scripted(Mutex::new(f)))
}

fn done() -> Answer {
    Ok(KinesisEventResponse::default())
}

fn report(sequence: &str) -> Answer {
    Ok(
        serde_json::from_value(json!({"batchItemFailures": [{"itemIdentifier": sequence}]}))
            .unwrap(),
    )
}

fn sequences(event: &KinesisEvent) -> Vec<String> {
    event
        .records
        .iter()
        .map(|r| r.kinesis.sequence_number.clone())
        .collect()
}

/// A stream of `n` records over `keys` partition keys in `shards` shards.
fn stream(shards: usize, n: usize, keys: usize) -> MemoryStream {
    let stream = MemoryStream::new("orders", shards);
    for i in 0..n {
        stream.put(&format!("key-{}", i % keys), format!("{i}"));
    }
    stream
}

async fn run(
    stream: MemoryStream,
    mapping: Mapping,
    function: Arc<dyn Function>,
) -> (kinesis_checkpoint_testing::local::RunReport, Vec<Delivery>) {
    let mut deliveries = Vec::new();
    let report = EventSource::new(stream, mapping)
        .run_observed(function, |d| deliveries.push(d.clone()))
        .await
        .unwrap();
    (report, deliveries)
}

#[tokio::test]
async fn batches_hold_at_most_batch_size_records_of_one_shard_in_order() {
    let stream = stream(2, 35, 9);
    let (report, deliveries) = run(
        stream.clone(),
        Mapping::default().batch_size(10),
        scripted(|_| done()),
    )
    .await;
    let mut seen = Vec::new();
    for delivery in &deliveries {
        assert!(delivery.sequences.len() <= 10);
        let shard: Vec<String> = stream
            .records(&delivery.shard)
            .into_iter()
            .map(|r| r.sequence)
            .collect();
        assert!(delivery.sequences.iter().all(|s| shard.contains(s)));
        assert!(delivery.sequences.windows(2).all(|w| w[0] < w[1]));
        seen.extend(delivery.sequences.clone());
    }
    assert_eq!(seen.len(), 35, "each record delivered once");
    assert_eq!(report.records_delivered, 35);
}

#[tokio::test]
async fn a_reported_record_is_delivered_again_first_and_the_ones_before_it_are_not() {
    let stream = stream(1, 20, 3);
    let third = stream.records("shardId-000000000000")[3].sequence.clone();
    let mut failed_once = false;
    let (report, deliveries) = run(
        stream,
        Mapping::default().batch_size(10),
        scripted({
            let third = third.clone();
            move |event| {
                if !failed_once && sequences(event).contains(&third) {
                    failed_once = true;
                    return report(&third);
                }
                done()
            }
        }),
    )
    .await;
    assert_eq!(
        deliveries[0].outcome,
        DeliveryOutcome::PartialFailure {
            from: third.clone()
        }
    );
    assert_eq!(
        deliveries[1].sequences[0], third,
        "redelivered from the report"
    );
    assert_eq!(report.partial_failures, 1);
    assert_eq!(report.records_delivered, 27);
}

#[tokio::test]
async fn an_error_retries_the_whole_batch_and_bisection_halves_it() {
    for bisect in [false, true] {
        let stream = stream(1, 8, 2);
        let mut errors = 0;
        let (report, deliveries) = run(
            stream,
            Mapping::default()
                .batch_size(8)
                .bisect_batch_on_function_error(bisect),
            scripted(move |_| {
                errors += 1;
                if errors <= 2 {
                    Err(InvocationError::Function("boom".into()))
                } else {
                    done()
                }
            }),
        )
        .await;
        let sizes: Vec<usize> = deliveries.iter().map(|d| d.sequences.len()).collect();
        if bisect {
            assert_eq!(sizes[..3], [8, 4, 2], "each error halves the batch");
            assert_eq!(report.bisections, 2);
        } else {
            assert_eq!(sizes, [8, 8, 8], "the whole batch again");
        }
        assert_eq!(report.function_errors, 2);
        assert!(report.discarded.is_empty());
    }
}

#[tokio::test]
async fn exhausted_retries_discard_the_batch_and_the_source_moves_on() {
    let stream = stream(1, 6, 2);
    let poison = stream.records("shardId-000000000000")[2].sequence.clone();
    let (report, deliveries) = run(
        stream,
        Mapping::default()
            .batch_size(3)
            .maximum_retry_attempts(Some(2)),
        scripted({
            let poison = poison.clone();
            move |event| {
                if sequences(event).contains(&poison) {
                    Err(InvocationError::Function("poison".into()))
                } else {
                    done()
                }
            }
        }),
    )
    .await;
    // One attempt and two retries, then the batch of three is gone.
    assert_eq!(report.function_errors, 3);
    assert_eq!(report.discarded.len(), 3);
    assert!(
        report
            .discarded
            .iter()
            .all(|d| d.reason == DiscardReason::RetriesExhausted)
    );
    assert_eq!(
        deliveries.last().unwrap().outcome,
        DeliveryOutcome::Done,
        "the records after the batch are delivered"
    );
}

#[tokio::test]
async fn records_older_than_the_maximum_age_are_discarded_when_due() {
    let stream = stream(1, 4, 1);
    let first = stream.records("shardId-000000000000")[0].sequence.clone();
    let (report, _) = run(
        stream,
        Mapping::default()
            .batch_size(1)
            .maximum_record_age(Some(Duration::from_secs(1)))
            .round_time(Duration::from_millis(400))
            .maximum_backoff(Duration::from_millis(1)),
        scripted(move |event| {
            if sequences(event).contains(&first) {
                report(&first)
            } else {
                done()
            }
        }),
    )
    .await;
    let too_old: Vec<_> = report
        .discarded
        .iter()
        .filter(|d| d.reason == DiscardReason::TooOld)
        .collect();
    assert!(!too_old.is_empty(), "the record failing forever aged out");
    assert!(report.partial_failures >= 2);
}

#[tokio::test]
async fn without_report_batch_item_failures_a_reported_record_is_not_delivered_again() {
    let stream = stream(1, 5, 1);
    let second = stream.records("shardId-000000000000")[1].sequence.clone();
    let (report, deliveries) = run(
        stream,
        Mapping::default().report_batch_item_failures(false),
        scripted(move |_| report(&second)),
    )
    .await;
    assert_eq!(
        deliveries.len(),
        1,
        "the report is ignored: the batch counts as done"
    );
    assert_eq!(report.partial_failures, 0);
}

#[tokio::test]
async fn an_identifier_outside_the_batch_fails_the_whole_batch() {
    let stream = stream(1, 3, 1);
    let mut answered = 0;
    let (report, deliveries) = run(
        stream,
        Mapping::default(),
        scripted(move |_| {
            answered += 1;
            if answered == 1 {
                report("12345")
            } else {
                done()
            }
        }),
    )
    .await;
    assert!(matches!(deliveries[0].outcome, DeliveryOutcome::Failed(_)));
    assert_eq!(deliveries[1].sequences.len(), 3, "the whole batch again");
    assert_eq!(report.function_errors, 1);
}

#[tokio::test]
async fn a_parallelization_factor_splits_a_shard_into_lanes_that_keep_each_key_in_order() {
    let stream = stream(1, 200, 13);
    let keys: HashMap<String, String> = stream
        .records("shardId-000000000000")
        .into_iter()
        .map(|r| (r.sequence, r.partition_key))
        .collect();
    let (_, deliveries) = run(
        stream,
        Mapping::default().batch_size(10).parallelization_factor(4),
        scripted(|_| done()),
    )
    .await;
    let mut lane_of_key: HashMap<&str, usize> = HashMap::new();
    let mut lanes = HashSet::new();
    let mut order: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for delivery in &deliveries {
        lanes.insert(delivery.lane);
        for sequence in &delivery.sequences {
            let key = keys[sequence].as_str();
            assert_eq!(
                *lane_of_key.entry(key).or_insert(delivery.lane),
                delivery.lane,
                "a key stays in its lane"
            );
            order.entry(key).or_default().push(sequence);
        }
    }
    assert!(lanes.len() > 1, "several lanes of one shard");
    for sequences in order.values() {
        assert!(sequences.windows(2).all(|w| w[0] < w[1]));
    }
}

#[tokio::test]
async fn a_child_shard_waits_for_its_parent_unless_delivered_early() {
    for early in [0.0, 1.0] {
        let stream = MemoryStream::new("orders", 1);
        for i in 0..20 {
            stream.put(&format!("key-{i}"), "parent");
        }
        let (left, right) = stream.split("shardId-000000000000");
        for i in 0..20 {
            stream.put(&format!("key-{i}"), "child");
        }
        let (report, deliveries) = run(
            stream,
            Mapping::default()
                .batch_size(5)
                .children_before_parents(early),
            scripted(|_| done()),
        )
        .await;
        let last_parent = deliveries
            .iter()
            .rposition(|d| d.shard == "shardId-000000000000")
            .unwrap();
        let first_child = deliveries
            .iter()
            .position(|d| d.shard == left || d.shard == right)
            .unwrap();
        if early > 0.0 {
            assert!(
                first_child < last_parent,
                "a child came before its parent ended"
            );
            assert!(report.early_children > 0);
        } else {
            assert!(first_child > last_parent, "children after the parent");
            assert_eq!(report.early_children, 0);
        }
    }
}

/// Issue 10: with `ParallelizationFactor` 1 to 10 and the partition-key mode, random failures
/// leave every record handled exactly once and each key in order.
#[tokio::test]
async fn the_partition_key_mode_handles_every_record_once_in_key_order_at_every_factor() {
    for factor in 1..=10 {
        let stream = MemoryStream::new("orders", 2);
        for i in 0..150 {
            if i == 100 {
                stream.split("shardId-000000000001");
            }
            stream.put(&format!("key-{}", i % 17), format!("{i}"));
        }
        let handled: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let rng = Arc::new(Mutex::new(Rng::new(factor as u64)));
        let handler = {
            let handled = handled.clone();
            move |record: Record| {
                let fails = rng.lock().unwrap().chance(0.1);
                if !fails {
                    let n = std::str::from_utf8(record.data()).unwrap().parse().unwrap();
                    handled
                        .lock()
                        .unwrap()
                        .push((record.partition_key().to_owned(), n));
                }
                async move {
                    if fails {
                        Outcome::retry("random failure")
                    } else {
                        Outcome::ack()
                    }
                }
            }
        };
        let processor = Processor::by_partition_key(Arc::new(MemoryLeaseStore::new()), handler)
            .concurrency(4)
            .gate(Gate::new(
                Arc::new(stream.clone()),
                StartingPosition::TrimHorizon,
            ));
        let mapping = Mapping::default()
            .batch_size(20)
            .parallelization_factor(factor)
            .duplicate_deliveries(0.2)
            .children_before_parents(0.5)
            .maximum_deliveries(5_000)
            .seed(factor as u64);
        let report = EventSource::new(stream, mapping)
            .run(Arc::new(processor))
            .await
            .unwrap_or_else(|e| panic!("factor {factor}: {e}"));
        assert!(report.discarded.is_empty());
        let handled = handled.lock().unwrap();
        let mut per_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for (key, n) in handled.iter() {
            per_key.entry(key).or_default().push(*n);
        }
        assert_eq!(
            handled.len(),
            150,
            "factor {factor}: each record exactly once"
        );
        for (key, ns) in per_key {
            assert!(
                ns.windows(2).all(|w| w[0] < w[1]),
                "factor {factor}: {key} in order: {ns:?}"
            );
        }
    }
}

/// Found by the invariant scenarios: the children of a split that received no record, merged
/// again, counted as finished parents although their own parent was not, so the merged child ran
/// before the split's parent was done.
#[tokio::test]
async fn a_merge_of_empty_children_waits_for_the_shard_they_split_from() {
    let stream = MemoryStream::new("orders", 1);
    for i in 0..30 {
        stream.put("key", format!("{i}"));
    }
    let (left, right) = stream.split("shardId-000000000000");
    let merged = stream.merge(&left, &right);
    for i in 30..40 {
        stream.put("key", format!("{i}"));
    }
    assert_eq!(stream.records(&merged).len(), 10);
    let handled: Arc<Mutex<Vec<u32>>> = Arc::default();
    let handler = {
        let handled = handled.clone();
        move |record: Record| {
            let n = std::str::from_utf8(record.data()).unwrap().parse().unwrap();
            handled.lock().unwrap().push(n);
            async { Outcome::ack() }
        }
    };
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), handler).gate(Gate::new(
        Arc::new(stream.clone()),
        StartingPosition::TrimHorizon,
    ));
    let mapping = Mapping::default()
        .batch_size(5)
        .children_before_parents(1.0)
        .seed(3);
    let report = EventSource::new(stream, mapping)
        .run(Arc::new(processor))
        .await
        .unwrap();
    assert!(report.early_children > 0, "the merged child came early");
    assert_eq!(*handled.lock().unwrap(), (0..40).collect::<Vec<_>>());
}
