//! Runs the basic example's handler as Lambda's mapping would, through the local event source:
//! redelivered and concurrent batches, and a record that can never succeed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use example_basic::handle;
use kinesis_checkpoint::{Handler, LeaseKey, MemoryLeaseStore, Outcome, Processor, Record};
use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream, SourceError};

/// The sequence numbers the handler saw, by shard, in the order it saw them.
type Seen = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

/// A processor of `handle` that also writes down each record it hands over.
fn processor(seen: &Seen) -> Processor<impl Handler> {
    let seen = Arc::clone(seen);
    Processor::new(Arc::new(MemoryLeaseStore::new()), move |record: Record| {
        let mut seen = seen.lock().unwrap();
        let shard = seen.entry(record.shard().to_owned()).or_default();
        shard.push(record.sequence().to_string());
        handle(record)
    })
}

#[tokio::test]
async fn each_record_is_handled_once_and_in_order_however_often_it_is_delivered() {
    let stream = MemoryStream::new("orders", 2);
    for n in 0..200 {
        stream.put(&format!("customer-{}", n % 10), format!("order {n}"));
    }
    let seen = Seen::default();
    let mapping = Mapping::default()
        .batch_size(25)
        .duplicate_deliveries(0.3)
        .concurrent_deliveries(0.2)
        .seed(11);
    let run = EventSource::new(stream.clone(), mapping)
        .run(Arc::new(processor(&seen)))
        .await
        .unwrap();

    assert!(
        run.redeliveries > 0 && run.strays > 0,
        "the mapping misbehaved"
    );
    let seen = seen.lock().unwrap();
    for shard in stream.shard_ids() {
        let written: Vec<String> = stream
            .records(&shard)
            .into_iter()
            .map(|r| r.sequence)
            .collect();
        assert_eq!(
            seen[&shard], written,
            "{shard}: every record once, in order"
        );
    }
}

#[tokio::test]
async fn an_empty_record_is_rejected() {
    let shard = LeaseKey::new("orders", "shardId-000000000000");
    let empty = Record::new(shard.clone(), "1".parse().unwrap(), "customer-1", "");
    let order = Record::new(shard, "2".parse().unwrap(), "customer-1", "order 1");
    assert!(matches!(handle(empty).await, Outcome::Reject(_)));
    assert!(handle(order).await.is_ack());
}

#[tokio::test]
async fn without_a_dead_letter_sink_an_empty_record_holds_its_shard_and_is_never_skipped() {
    let stream = MemoryStream::new("orders", 1);
    stream.put("customer-1", "order 1");
    let stuck_at = stream.put("customer-1", "");
    stream.put("customer-1", "order 2");
    let seen = Seen::default();
    let mapping = Mapping::default()
        .maximum_deliveries(20)
        .maximum_backoff(Duration::from_millis(1));
    let run = EventSource::new(stream, mapping)
        .run(Arc::new(processor(&seen)))
        .await;

    let Err(SourceError::Stuck { sequence, .. }) = run else {
        panic!("the shard should wait at the empty record, not {run:?}");
    };
    assert_eq!(sequence, stuck_at);
    let seen = seen.lock().unwrap();
    let handled = &seen["shardId-000000000000"];
    assert!(handled.len() > 2, "the empty record is retried");
    assert!(
        handled[1..].iter().all(|s| *s == stuck_at),
        "nothing after it runs"
    );
}
