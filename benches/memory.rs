//! Peak memory while one 6 MB event is handled, against the event's size.
//!
//! Lambda caps an invocation's payload at 6 MB (6,291,456 bytes of JSON), so a function sized
//! for its largest batch must hold that event, its decoded records and whatever the toolkit
//! adds. Two shapes fill the payload: 10,000 small records, and 6 records of about 1 MB each
//! (base64 makes a 1 MB record 1.33 MB of JSON, so 6 of them fill the payload when their
//! decoded payloads are 768 KiB each; 6 payloads of a full MiB, 8.4 MB of JSON, are measured too,
//! although Lambda could not deliver them in one event).
//!
//! Each measurement runs in a child process (this binary again), which does what
//! `lambda_runtime` and the function do with one invocation: the body as received, deserialized
//! into a `KinesisEvent` (through `InvocationEvent` for the processor, as its service reads it;
//! the body is then dropped, as the runtime does), processed on
//! [`MemoryLeaseStore`], the answer serialized. Peak resident memory is the kernel's high-water
//! mark (`VmHWM` in `/proc/self/status`), reset (`/proc/self/clear_refs` = 5) after the runtime,
//! the processor and the allocator are warm; the figure is that peak minus the resident memory
//! just before the body arrived. It counts pages actually touched, heap and stack alike: what
//! Lambda bills and kills on. The same is measured for a bare loop over the event (the floor:
//! what deserializing the event costs any function).
//!
//! `make bench`, or `cargo bench --bench memory`.

use std::process::Command;
use std::sync::Arc;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use kinesis_checkpoint::event::InvocationEvent;
use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
use serde_json::Value;

#[path = "support/kinesis_event.rs"]
mod kinesis_event;

/// Lambda's payload limit for a synchronous invocation, which the event source mapping uses.
const LAMBDA_PAYLOAD_LIMIT: usize = 6 * 1024 * 1024;

struct Shape {
    name: &'static str,
    records: u64,
    /// The decoded payload of each record; `None`: as large as fits the payload limit.
    payload: Option<usize>,
}

const SHAPES: [Shape; 3] = [
    Shape {
        name: "10,000 small records",
        records: 10_000,
        payload: None,
    },
    Shape {
        name: "6 records of ~1 MB",
        records: 6,
        payload: None,
    },
    Shape {
        name: "6 records of 1 MiB (beyond the limit)",
        records: 6,
        payload: Some(1024 * 1024),
    },
];

fn record(n: u64, payload: usize) -> Value {
    let data: Vec<u8> = (0..=u8::MAX)
        .cycle()
        .skip(usize::try_from(n % 256).unwrap())
        .take(payload)
        .collect();
    kinesis_event::record(n, &format!("order-{}", n % 64), &data)
}

fn body(records: u64, payload: usize) -> Vec<u8> {
    let records: Vec<Value> = (0..records).map(|n| record(n, payload)).collect();
    serde_json::to_vec(&kinesis_event::event(&records)).unwrap()
}

/// The event JSON of `shape`: the largest payload per record that keeps it within Lambda's
/// limit, unless the shape says.
fn event_body(shape: &Shape) -> Vec<u8> {
    if let Some(payload) = shape.payload {
        return body(shape.records, payload);
    }
    let envelope = body(shape.records, 0).len();
    let per_record = (LAMBDA_PAYLOAD_LIMIT - envelope) / usize::try_from(shape.records).unwrap();
    // base64: 4 characters for every 3 bytes.
    let mut payload = per_record / 4 * 3;
    loop {
        let body = body(shape.records, payload);
        if body.len() <= LAMBDA_PAYLOAD_LIMIT {
            return body;
        }
        payload -= 3;
    }
}

/// `VmRSS` and `VmHWM` of this process, in bytes.
fn resident() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> usize {
        let line = status
            .lines()
            .find(|line| line.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in /proc/self/status"));
        let kb: usize = line
            .split_whitespace()
            .nth(1)
            .and_then(|kb| kb.parse().ok())
            .unwrap();
        kb * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The user code: touches every byte of the payload, as a real consumer reads it, without
/// keeping or copying it.
fn checksum(data: &[u8]) -> Outcome {
    std::hint::black_box(data.iter().fold(0u8, |sum, byte| sum.wrapping_add(*byte)));
    Outcome::ack()
}

fn bare_loop(event: KinesisEvent) -> KinesisEventResponse {
    let mut response = KinesisEventResponse::default();
    for record in event.records {
        if !checksum(&record.kinesis.data).is_ack() {
            response.add_failure(record.kinesis.sequence_number);
            break;
        }
    }
    response
}

/// In the child: handle the event in `path` the way `lambda_runtime` and the function do, and
/// print the peak above the resident memory before the body arrived.
fn child(path: &str, with_processor: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let processor = Processor::new(
        Arc::new(MemoryLeaseStore::new()),
        |record: Record| async move { checksum(record.data()) },
    );
    let context = lambda_runtime::Context::default();
    let handle = |body: Vec<u8>| -> usize {
        // Each reads the body as its runtime does: the processor's service as
        // `InvocationEvent`, a bare function as `KinesisEvent`.
        let response = if with_processor {
            let InvocationEvent(event) = serde_json::from_slice(&body).expect("a Kinesis event");
            drop(body);
            rt.block_on(processor.process(event, &context)).unwrap()
        } else {
            let event: KinesisEvent = serde_json::from_slice(&body).expect("a Kinesis event");
            drop(body);
            bare_loop(event)
        };
        assert!(response.batch_item_failures.is_empty());
        serde_json::to_vec(&response).unwrap().len()
    };
    // Warm up: the runtime, the processor's first batch, the allocator's arenas.
    handle(body(3, 16));

    std::fs::write("/proc/self/clear_refs", "5").expect("the peak can be reset (Linux >= 4.0)");
    let (before, _) = resident();
    // The body arrives, as the runtime reads it: one buffer of its exact size.
    let body = std::fs::read(path).unwrap();
    handle(body);
    let (_, peak) = resident();
    println!("{}", peak.saturating_sub(before));
}

fn measure(path: &std::path::Path, with_processor: bool) -> usize {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--child",
            path.to_str().unwrap(),
            if with_processor { "processor" } else { "bare" },
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[allow(clippy::cast_precision_loss)]
fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1_000_000.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|arg| arg == "--child") {
        child(&args[at + 1], args[at + 2] == "processor");
        return;
    }
    // `cargo bench` passes `--bench`; under `cargo test` (`make test`) one run of the first
    // shape checks that the measurement still works.
    let benchmarking = args.iter().any(|arg| arg == "--bench");
    let (shapes, runs) = if benchmarking {
        (&SHAPES[..], 3)
    } else {
        (&SHAPES[..1], 1)
    };
    println!(
        "{:<40} {:>9} {:>11} {:>9} {:>11} {:>9}",
        "event", "size MB", "bare MB", "x size", "processor", "x size"
    );
    for shape in shapes {
        let body = event_body(shape);
        let path =
            std::env::temp_dir().join(format!("kc-memory-bench-{}.json", std::process::id()));
        std::fs::write(&path, &body).unwrap();
        // The median of three runs of each, alternated, so a noisy neighbour moves both.
        let mut bare = Vec::new();
        let mut processor = Vec::new();
        for _ in 0..runs {
            bare.push(measure(&path, false));
            processor.push(measure(&path, true));
        }
        std::fs::remove_file(&path).unwrap();
        bare.sort_unstable();
        processor.sort_unstable();
        let (bare, processor) = (bare[runs / 2], processor[runs / 2]);
        #[allow(clippy::cast_precision_loss)]
        let times = |peak: usize| peak as f64 / body.len() as f64;
        println!(
            "{:<40} {:>9.2} {:>11.2} {:>9.2} {:>11.2} {:>9.2}",
            shape.name,
            mb(body.len()),
            mb(bare),
            times(bare),
            mb(processor),
            times(processor),
        );
    }
}
