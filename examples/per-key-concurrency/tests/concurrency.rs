//! Runs the per-key concurrency example's processor through the local event source, watching
//! which records are in flight together: several keys at once, never two records of one key.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use example_per_key_concurrency::{DEFAULT_MAX_IN_FLIGHT, max_in_flight, notify, processor};
use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Record};
use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};

const KEYS: u32 = 20;
const PER_KEY: u32 = 15;
const IN_FLIGHT: usize = 8;

/// What the test sees of the handler's calls.
#[derive(Default)]
struct Watch {
    /// The keys of the records running now.
    running: HashSet<String>,
    /// The most records running at once.
    peak: usize,
    /// Times a record started while another of its key was running.
    overlaps: usize,
    /// Each key's records done, by their number, in the order they were done.
    done: BTreeMap<String, Vec<u32>>,
    /// Whether the record that fails once has failed.
    failed_once: bool,
}

#[tokio::test]
async fn keys_run_side_by_side_and_each_key_runs_once_in_order_through_a_failure() {
    let stream = MemoryStream::new("orders", 1);
    for n in 0..KEYS * PER_KEY {
        stream.put(&format!("customer-{}", n % KEYS), format!("{}", n / KEYS));
    }
    let watch = Arc::new(Mutex::new(Watch::default()));
    let handler = {
        let watch = Arc::clone(&watch);
        move |record: Record| {
            let watch = Arc::clone(&watch);
            async move {
                let key = record.partition_key().to_owned();
                let n: u32 = std::str::from_utf8(record.data()).unwrap().parse().unwrap();
                {
                    let mut watch = watch.lock().unwrap();
                    if !watch.running.insert(key.clone()) {
                        watch.overlaps += 1;
                    }
                    watch.peak = watch.peak.max(watch.running.len());
                }
                // customer-3's fifth record fails once: its later records must wait for it.
                let fail = key == "customer-3" && n == 4 && !watch.lock().unwrap().failed_once;
                let outcome = if fail {
                    Outcome::retry("the downstream is busy")
                } else {
                    notify(record).await
                };
                let mut watch = watch.lock().unwrap();
                watch.running.remove(&key);
                if fail {
                    watch.failed_once = true;
                } else {
                    watch.done.entry(key).or_default().push(n);
                }
                outcome
            }
        }
    };
    let processor = processor(Arc::new(MemoryLeaseStore::new()), handler, IN_FLIGHT);
    let mapping = Mapping::default()
        .batch_size(100)
        .duplicate_deliveries(0.2)
        .seed(5);
    let run = EventSource::new(stream, mapping)
        .run(Arc::new(processor))
        .await
        .unwrap();

    let watch = watch.lock().unwrap();
    assert!(watch.failed_once && run.partial_failures > 0);
    assert!(
        watch.peak > 1 && watch.peak <= IN_FLIGHT,
        "peak {}",
        watch.peak
    );
    assert_eq!(watch.overlaps, 0, "never two records of one key at once");
    assert_eq!(watch.done.len(), KEYS as usize);
    let all: Vec<u32> = (0..PER_KEY).collect();
    for (key, done) in &watch.done {
        assert_eq!(*done, all, "{key}: once each, in order");
    }
}

#[test]
fn max_in_flight_defaults_and_refuses_what_is_not_a_number() {
    assert_eq!(max_in_flight(None), Ok(DEFAULT_MAX_IN_FLIGHT));
    assert_eq!(max_in_flight(Some("64")), Ok(64));
    assert!(max_in_flight(Some("many")).unwrap_err().contains("'many'"));
}
