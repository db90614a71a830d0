//! Runs the partition-key mode example's processor under a local mapping with
//! `ParallelizationFactor` 4: several batches of one shard at once, each key still once and in
//! order.
//!
//! The mapping redelivers batches, but does not deliver one batch to two invocations at once:
//! this mode has no lease, so such a delivery may run a record twice (the guide's limits).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use example_partition_key_mode::{handle, processor};
use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Record};
use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};

const KEYS: u32 = 24;
const PER_KEY: u32 = 12;

#[tokio::test]
async fn batches_of_one_shard_run_side_by_side_and_each_key_runs_once_in_order() {
    let stream = MemoryStream::new("orders", 2);
    for n in 0..KEYS * PER_KEY {
        stream.put(&format!("customer-{}", n % KEYS), format!("{}", n / KEYS));
    }
    // Each key's records done, by their number; and whether customer-5's third failed yet.
    let done: Arc<Mutex<BTreeMap<String, Vec<u32>>>> = Arc::default();
    let failed = Arc::new(Mutex::new(false));
    let handler = {
        let (done, failed) = (Arc::clone(&done), Arc::clone(&failed));
        move |record: Record| {
            let (done, failed) = (Arc::clone(&done), Arc::clone(&failed));
            async move {
                let key = record.partition_key().to_owned();
                let n: u32 = std::str::from_utf8(record.data()).unwrap().parse().unwrap();
                // customer-5's third record fails once: only that key waits for it.
                if key == "customer-5"
                    && n == 2
                    && !std::mem::replace(&mut *failed.lock().unwrap(), true)
                {
                    return Outcome::retry("the downstream is busy");
                }
                done.lock().unwrap().entry(key).or_default().push(n);
                handle(record).await
            }
        }
    };
    let processor = processor(Arc::new(MemoryLeaseStore::new()), handler);
    let mapping = Mapping::default()
        .parallelization_factor(4)
        .batch_size(10)
        .duplicate_deliveries(0.3)
        .seed(8);
    let mut lanes = BTreeSet::new();
    let run = EventSource::new(stream, mapping)
        .run_observed(Arc::new(processor), |delivery| {
            lanes.insert((delivery.shard.clone(), delivery.lane));
        })
        .await
        .unwrap();

    assert!(*failed.lock().unwrap() && run.partial_failures > 0);
    assert!(run.redeliveries > 0, "the mapping redelivered batches");
    assert!(lanes.len() > 2, "several lanes per shard: {lanes:?}");
    let done = done.lock().unwrap();
    assert_eq!(done.len(), KEYS as usize);
    let all: Vec<u32> = (0..PER_KEY).collect();
    for (key, numbers) in done.iter() {
        assert_eq!(*numbers, all, "{key}: once each, in order");
    }
}
