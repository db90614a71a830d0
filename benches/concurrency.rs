//! Per-key concurrency against sequential dispatch, for a handler that waits on I/O.
//!
//! The handler waits 5 ms per record (`tokio::time::sleep`, standing in for a database or an
//! API call); a batch holds 1,000 records over 100 partition keys. Sequential dispatch takes
//! 1,000 × 5 ms; per-key concurrency at 8, 32 and 128 records in flight should divide that by
//! about as much, up to the 100 keys (no key runs two records at once). Each iteration uses a
//! fresh embedded store, so every record runs.
//!
//! `make bench`, or `cargo bench --bench concurrency`. Sequential takes over 5 s an iteration,
//! so the group measures 10 samples.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
use serde_json::{Value, json};

#[path = "support/kinesis_event.rs"]
mod kinesis_event;

const RECORDS: u64 = 1_000;
const KEYS: u64 = 100;

/// 1,000 records of one shard, record `n` under partition key `customer-{n % 100}`.
fn event() -> KinesisEvent {
    let records: Vec<Value> = (0..RECORDS)
        .map(|n| {
            let data = json!({ "n": n }).to_string();
            kinesis_event::record(n, &format!("customer-{}", n % KEYS), data.as_bytes())
        })
        .collect();
    serde_json::from_value(kinesis_event::event(&records)).expect("a Lambda-shaped event")
}

async fn wait_5ms(_: Record) -> Outcome {
    tokio::time::sleep(Duration::from_millis(5)).await;
    Outcome::ack()
}

fn concurrency(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let event = event();
    let context = lambda_runtime::Context::default();
    let mut group = c.benchmark_group("1000 records over 100 keys, 5 ms each");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(RECORDS));
    for in_flight in [1, 8, 32, 128] {
        let name = if in_flight == 1 {
            "sequential".to_owned()
        } else {
            format!("{in_flight} in flight")
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), wait_5ms)
                    .concurrency(in_flight);
                let response = runtime
                    .block_on(processor.process(event.clone(), &context))
                    .expect("processed");
                assert!(response.batch_item_failures.is_empty());
            });
        });
    }
    group.finish();
}

criterion_group!(benches, concurrency);
criterion_main!(benches);
