//! What the processor adds to a handler, measured beside the floor in the same run.
//!
//! The floor is what a function without the toolkit does with the same event: a bare loop over
//! its records that hands each payload to the same user code. The processor does that plus
//! everything this crate exists for (parse stream, shard and sequence number, claim the lease
//! and read the checkpoint, dedupe, dispatch with panic and deadline guards, checkpoint and
//! release), here on [`MemoryLeaseStore`] so that only CPU is measured.
//!
//! Records of 1 KB, in batches of 100, 1,000 and 10,000, from two starting points; the copy of
//! the input is made outside the timed part:
//!
//! - `batch_*`: the deserialized `KinesisEvent` (what `lambda_runtime` hands a bare function),
//!   given to [`Processor::process`]: the toolkit's cost after the event is read;
//! - `bytes_*`: the event's JSON bytes, deserialized as `lambda_runtime` does
//!   (`serde_path_to_error` over `serde_json`), into `KinesisEvent` for the bare loop and into
//!   `InvocationEvent` (what [`Processor::service`] reads) for the processor: the whole hot
//!   path of an invocation, from the bytes to the answer.
//!
//! The processor runs as a function runs it: one processor and store for every batch, as a
//! Lambda function builds them once and keeps them across invocations, each batch the shard's
//! next, its sequence numbers above the last batch's ([`Batches`]). Beside it,
//! `batch_*/processor_new_store` gives each batch a processor and a store of its own, built and
//! freed in the timed part.
//!
//! Two handlers:
//!
//! - `json`: the user code reads each payload as a typed order (`serde_json`), as a real
//!   consumer does; the ratio target (at most 1.2 times the floor) applies here.
//! - `empty`: the user code only looks at the payload's length, so the ratio is as harsh as it
//!   can be; the difference per record is the toolkit's own cost, whatever the handler.
//!
//! Beside them, from the `KinesisEvent` only, five bounds, none of them the crate's own code
//! (see [`bounds`]): `least_processor`, the least any processor that dedupes must add to the
//! bare loop, in its one pass; the same work in the processor's passes (read into a block,
//! dispatched from it, freed), over the whole batch (`least_in_passes`) and 64 records at a
//! time (`least_in_chunks`); and in two steps, each record's shard and sequence number read over
//! the whole batch first, then the passes 64 records at a time (`least_in_two_phases`, the
//! intake the processor uses for a large event); and in two passes over the event where it
//! lies, with no block (`least_in_place`). So a miss says how much is the processor's
//! structure and how much the work it cannot leave out.
//!
//! And `duplicate/processor` (from the `KinesisEvent`) and `duplicate/processor_from_bytes`
//! (from the bytes): a batch already checkpointed, every record skipped (a redelivery). Beside
//! them, `duplicate/runtime_reading`: the event's bytes read as `lambda_runtime` reads them for
//! a payload type that reads nothing (see [`runtime_reading`]), the floor from the bytes.
//!
//! `make bench` runs it and `scripts/bench_summary.py` prints the ratios, the cost per record
//! and, for each target of BENCHMARKS.md, met or missed, from criterion's estimates. With
//! `PROCESSOR_BENCH_COUNT` set, the binary runs one benchmark's body a fixed number of times
//! instead (see [`count`]), for `scripts/bench_instructions.py` to count its instructions
//! under callgrind: a figure the machine's load does not move.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group};
use kinesis_checkpoint::event::InvocationEvent;
use kinesis_checkpoint::report::Disposition;
use kinesis_checkpoint::{Handler, MemoryLeaseStore, Outcome, Processor, Record, SequenceNumber};
use tokio::runtime::Runtime;

#[path = "processor/bounds.rs"]
mod bounds;
#[path = "support/kinesis_event.rs"]
mod kinesis_event;

use bounds::{CHUNK, least_in_passes, least_in_place, least_in_two_phases, least_processor};
use kinesis_event::SEQUENCE_PREFIX;

const SIZES: [u64; 3] = [100, 1_000, 10_000];
const PAYLOAD_BYTES: usize = 1_024;

/// The JSON bytes of an event of `count` records of one shard, each a JSON order of exactly
/// 1 KB, with Kinesis' 56-digit sequence numbers.
fn body(count: u64) -> Vec<u8> {
    kinesis_event::orders(count, PAYLOAD_BYTES)
}

/// Reads `body` as `lambda_runtime` reads an invocation's payload.
fn deserialize<T: serde::de::DeserializeOwned>(body: &[u8]) -> T {
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
        .expect("a Lambda-shaped event")
}

#[derive(serde::Deserialize)]
struct Order {
    #[serde(rename = "order_id")]
    id: String,
    amount_cents: i64,
    note: String,
}

/// The user code both sides run: read the payload as an order.
fn apply_order(data: &[u8]) -> Outcome {
    match serde_json::from_slice::<Order>(data) {
        Ok(order) => {
            black_box((&order.id, order.amount_cents, order.note.len()));
            Outcome::ack()
        }
        Err(error) => Outcome::reject(error),
    }
}

/// The user code that does nothing: only the toolkit's own cost remains.
fn look_at_length(data: &[u8]) -> Outcome {
    black_box(data.len());
    Outcome::ack()
}

/// A function without the toolkit: every record to the user code, stopping at the first that
/// is not done and reporting it.
async fn bare_loop<F, Fut>(event: KinesisEvent, user_code: F) -> KinesisEventResponse
where
    F: Fn(Vec<u8>) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let mut response = KinesisEventResponse::default();
    for record in event.records {
        if !user_code(record.kinesis.data.0).await.is_ack() {
            response.add_failure(record.kinesis.sequence_number);
            break;
        }
    }
    response
}

/// A context as Lambda gives it: a request id and a deadline 15 minutes away, so the processor
/// runs its deadline checks as in production.
fn context() -> lambda_runtime::Context {
    let mut context = lambda_runtime::Context::default();
    "bench".clone_into(&mut context.request_id);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    context.deadline = u64::try_from((now + Duration::from_mins(15)).as_millis()).unwrap();
    context
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// A processor on a store of its own, to which every batch is new until it runs one.
///
/// One function, so one handler type for every benchmark and for the count mode: each
/// handler's type has its own copy of the engine's machine code, and the copies were laid out
/// apart (a macro here made one per call site). So criterion and `scripts/bench_times.py` time
/// the same code.
fn fresh_processor(code: fn(&[u8]) -> Outcome) -> Processor<impl Handler> {
    Processor::new(
        Arc::new(MemoryLeaseStore::new()),
        move |record: Record| async move { code(record.data()) },
    )
}

/// Where in a sequence number [`Batches`] writes its round: the last 14 digits of
/// [`SEQUENCE_PREFIX`], above each record's own 7.
const ROUND_DIGITS: std::ops::Range<usize> = 35..49;

/// One event (and its bytes) again and again, as a shard's successive batches: each copy's
/// sequence numbers, in its records and in its event ids, carry the copy's round in
/// [`ROUND_DIGITS`], so each batch is above the last and a kept processor runs every record,
/// as a function runs each new batch of a shard. The digits are written over the copy's own,
/// so its blocks are laid out as a plain copy's, and before the timed part.
struct Batches {
    event: KinesisEvent,
    body: Vec<u8>,
    /// Where each sequence number starts in `body`.
    in_body: Vec<usize>,
    round: std::cell::Cell<u64>,
}

impl Batches {
    fn new(event: &KinesisEvent, body: &[u8]) -> Self {
        let text = std::str::from_utf8(body).expect("JSON is text");
        let in_body = text
            .match_indices(SEQUENCE_PREFIX)
            .map(|(at, _)| at)
            .collect();
        Self {
            event: event.clone(),
            body: body.to_vec(),
            in_body,
            round: std::cell::Cell::new(0),
        }
    }

    /// The next round's digits.
    fn next_round(&self) -> String {
        self.round.set(self.round.get() + 1);
        format!("{:014}", self.round.get())
    }

    /// The next batch, from the `KinesisEvent`.
    fn next_event(&self) -> KinesisEvent {
        let digits = self.next_round();
        let mut event = self.event.clone();
        for record in &mut event.records {
            record
                .kinesis
                .sequence_number
                .replace_range(ROUND_DIGITS, &digits);
            let id = record.event_id.as_mut().expect("an event id");
            let at = id
                .find(SEQUENCE_PREFIX)
                .expect("a sequence number in the event id");
            id.replace_range(at + ROUND_DIGITS.start..at + ROUND_DIGITS.end, &digits);
        }
        event
    }

    /// The next batch, as bytes.
    fn next_body(&self) -> Vec<u8> {
        let digits = self.next_round();
        let mut body = self.body.clone();
        for at in &self.in_body {
            body[at + ROUND_DIGITS.start..at + ROUND_DIGITS.end].copy_from_slice(digits.as_bytes());
        }
        body
    }
}

/// The user code of a handler named `name`.
fn user_code(name: &str) -> fn(&[u8]) -> Outcome {
    if name == "json" {
        apply_order
    } else {
        look_at_length
    }
}

fn processor_against_bare_loop(c: &mut Criterion) {
    let rt = runtime();
    for name in ["json", "empty"] {
        let code = user_code(name);
        let mut group = c.benchmark_group(format!("batch_{name}"));
        group.sample_size(20);
        for size in SIZES {
            let body = body(size);
            let event: KinesisEvent = deserialize(&body);
            let context = context();
            group.throughput(Throughput::Elements(size));
            group.bench_function(BenchmarkId::new("bare_loop", size), |b| {
                b.iter_batched(
                    || event.clone(),
                    |event| {
                        let response =
                            rt.block_on(bare_loop(event, |data| async move { code(&data) }));
                        assert!(response.batch_item_failures.is_empty());
                    },
                    BatchSize::LargeInput,
                );
            });
            let below: SequenceNumber = "1".parse().expect("a sequence number");
            group.bench_function(BenchmarkId::new("least_processor", size), |b| {
                b.iter_batched(
                    || event.clone(),
                    |event| {
                        let (response, done) =
                            rt.block_on(least_processor(event, &below, |data| async move {
                                code(&data)
                            }));
                        assert!(response.batch_item_failures.is_empty() && done.is_some());
                    },
                    BatchSize::LargeInput,
                );
            });
            for (name, chunk) in [("least_in_passes", usize::MAX), ("least_in_chunks", CHUNK)] {
                group.bench_function(BenchmarkId::new(name, size), |b| {
                    b.iter_batched(
                        || event.clone(),
                        |event| {
                            let (response, done) = least_in_passes(event, &below, chunk, code);
                            assert!(response.batch_item_failures.is_empty() && done.is_some());
                        },
                        BatchSize::LargeInput,
                    );
                });
            }
            group.bench_function(BenchmarkId::new("least_in_place", size), |b| {
                b.iter_batched(
                    || event.clone(),
                    |event| {
                        let (response, done) = least_in_place(event, &below, code);
                        assert!(response.batch_item_failures.is_empty() && done.is_some());
                    },
                    BatchSize::LargeInput,
                );
            });
            group.bench_function(BenchmarkId::new("least_in_two_phases", size), |b| {
                b.iter_batched(
                    || event.clone(),
                    |event| {
                        let (response, done) = least_in_two_phases(event, &below, CHUNK, code);
                        assert!(response.batch_item_failures.is_empty() && done.is_some());
                    },
                    BatchSize::LargeInput,
                );
            });
            let (processor, batches) = (fresh_processor(code), Batches::new(&event, &body));
            steady_state(&rt, &processor, &batches);
            group.bench_function(BenchmarkId::new("processor", size), |b| {
                b.iter_batched(
                    || batches.next_event(),
                    |event| {
                        let response = rt.block_on(processor.process(event, &context));
                        assert!(response.unwrap().batch_item_failures.is_empty());
                    },
                    BatchSize::LargeInput,
                );
            });
            group.bench_function(BenchmarkId::new("processor_new_store", size), |b| {
                b.iter_batched(
                    || event.clone(),
                    |event| {
                        let response = rt.block_on(fresh_processor(code).process(event, &context));
                        assert!(response.unwrap().batch_item_failures.is_empty());
                    },
                    BatchSize::LargeInput,
                );
            });
        }
        group.finish();
    }
}

/// Checks that `batches` run on a kept `processor` as a shard's successive batches do: each
/// one's every record processed, none skipped as done by the one before; next events and next
/// bodies (read as [`Processor::service`] reads them) in turn, so both ways of renumbering are
/// checked.
fn steady_state<H: Handler>(rt: &Runtime, processor: &Processor<H>, batches: &Batches) {
    let from_body = || {
        let InvocationEvent(event) = deserialize(&batches.next_body());
        event
    };
    // Each way twice, alternated: a batch not raised above the one before it is skipped whole,
    // whichever way made either.
    for event in [
        batches.next_event(),
        from_body(),
        batches.next_event(),
        from_body(),
    ] {
        let records = event.records.len();
        let report = rt
            .block_on(processor.process_batch(event, &context()))
            .expect("a batch runs");
        assert_eq!(
            report.shards[0].count(Disposition::Processed),
            records,
            "each batch is new to the processor"
        );
    }
}

/// The same, from the event's bytes: what an invocation of either function does.
fn from_bytes(c: &mut Criterion) {
    let rt = runtime();
    for name in ["json", "empty"] {
        let code = user_code(name);
        let mut group = c.benchmark_group(format!("bytes_{name}"));
        group.sample_size(20);
        for size in SIZES {
            let body = body(size);
            let context = context();
            group.throughput(Throughput::Elements(size));
            let (processor, batches) = (
                fresh_processor(code),
                Batches::new(&deserialize(&body), &body),
            );
            steady_state(&rt, &processor, &batches);
            group.bench_function(BenchmarkId::new("bare_loop", size), |b| {
                b.iter_batched(
                    || body.clone(),
                    |body| {
                        let event: KinesisEvent = deserialize(&body);
                        let response =
                            rt.block_on(bare_loop(event, |data| async move { code(&data) }));
                        assert!(response.batch_item_failures.is_empty());
                    },
                    BatchSize::LargeInput,
                );
            });
            group.bench_function(BenchmarkId::new("processor", size), |b| {
                b.iter_batched(
                    || batches.next_body(),
                    |body| {
                        let InvocationEvent(event) = deserialize(&body);
                        let response = rt.block_on(processor.process(event, &context));
                        assert!(response.unwrap().batch_item_failures.is_empty());
                    },
                    BatchSize::LargeInput,
                );
            });
        }
        group.finish();
    }
}

fn duplicate_batch(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("duplicate");
    group.sample_size(20);
    for size in SIZES {
        let body = body(size);
        let event: KinesisEvent = deserialize(&body);
        let context = context();
        let processor = fresh_processor(apply_order);
        let report = rt
            .block_on(processor.process_batch(event.clone(), &context))
            .unwrap();
        assert!(
            report.shards[0].checkpoint.is_some(),
            "the batch is checkpointed"
        );
        group.throughput(Throughput::Elements(size));
        group.bench_function(BenchmarkId::new("processor", size), |b| {
            b.iter_batched(
                || event.clone(),
                |event| {
                    let response = rt.block_on(processor.process(event, &context));
                    assert!(response.unwrap().batch_item_failures.is_empty());
                },
                BatchSize::LargeInput,
            );
        });
        group.bench_function(BenchmarkId::new("processor_from_bytes", size), |b| {
            b.iter_batched(
                || body.clone(),
                |body| {
                    let InvocationEvent(event) = deserialize(&body);
                    let response = rt.block_on(processor.process(event, &context));
                    assert!(response.unwrap().batch_item_failures.is_empty());
                },
                BatchSize::LargeInput,
            );
        });
        group.bench_function(BenchmarkId::new("runtime_reading", size), |b| {
            b.iter_batched(
                || body.clone(),
                |body| runtime_reading(&body),
                BatchSize::LargeInput,
            );
        });
    }
    group.finish();
}

/// What `lambda_runtime` takes to read an event for a function whose payload type reads
/// nothing of it: `serde_json` only finding the end of each value (`IgnoredAny`), through
/// `serde_path_to_error`, as the runtime reads every event. The least a function run by
/// `lambda_runtime::run` pays per record before its handler starts, whatever it reads: the
/// floor of the duplicate batch from the bytes, printed beside its verdict (not judged).
fn runtime_reading(body: &[u8]) {
    let serde::de::IgnoredAny = deserialize(body);
}

criterion_group!(
    benches,
    processor_against_bare_loop,
    from_bytes,
    duplicate_batch
);

/// One benchmark's body run a fixed number of times outside criterion, for an instruction
/// count (`scripts/bench_instructions.py` runs it under `valgrind --tool=callgrind`, counting
/// only inside [`counted`]): unlike a time, the count is the same whatever else the machine
/// runs. `spec` names the benchmark as criterion does, with the iterations:
/// `<group>/<function>/<size>/<iterations>`, e.g. `batch_json/processor/1000/3`.
///
/// Each iteration is also timed, around [`counted`] (so that no clock is read inside the
/// count), and the fastest, the tenth-fastest percentile and the median iteration are printed
/// on stderr: `scripts/bench_times.py` compares builds by them.
fn count(spec: &str) {
    let parts: Vec<&str> = spec.split('/').collect();
    let [group, function, size, iterations] = parts[..] else {
        panic!("PROCESSOR_BENCH_COUNT is <group>/<function>/<size>/<iterations>, not {spec}");
    };
    let size: u64 = size.parse().expect("a size");
    let iterations: u32 = iterations.parse().expect("a count of iterations");
    let rt = runtime();
    let context = context();
    let body = body(size);
    let event: KinesisEvent = deserialize(&body);
    let (start, name) = group.split_once('_').unwrap_or((group, "json"));
    let code = user_code(name);
    let duplicate = fresh_processor(apply_order);
    let (processor, batches) = (fresh_processor(code), Batches::new(&event, &body));
    steady_state(&rt, &processor, &batches);
    let below: SequenceNumber = "1".parse().expect("a sequence number");
    if start == "duplicate" {
        rt.block_on(duplicate.process_batch(event.clone(), &context))
            .unwrap();
    }
    // At least 256 KB, so that glibc maps it apart from the heap whatever the iterations: its
    // size moved where the batch's blocks fell, and with them the time.
    let mut times: Vec<u128> =
        Vec::with_capacity(usize::try_from(iterations).unwrap_or_default().max(16_384));
    // Where the batch's blocks fall moves its time as much as a change of the code does (the
    // same instructions took 55 or 65 us per batch of 100 JSON records by the size of one block
    // allocated earlier), so `scripts/bench_times.py` moves them with a block of this many
    // bytes, held from the copy of the input to the end of each iteration.
    let heap_pad: usize = std::env::var("PROCESSOR_BENCH_HEAP_PAD")
        .ok()
        .and_then(|pad| pad.parse().ok())
        .unwrap_or_default();
    for _ in 0..iterations {
        // The copy of the input is made outside the count, as criterion makes it outside the
        // timed part.
        let (event, body) = match (start, function) {
            ("batch", "processor") => (batches.next_event(), Vec::new()),
            ("bytes", "processor") => (event.clone(), batches.next_body()),
            // Only the bytes: no event to free inside the count.
            ("duplicate", "runtime_reading") => (KinesisEvent::default(), body.clone()),
            _ => (event.clone(), body.clone()),
        };
        let pad = black_box(vec![0_u8; heap_pad]);
        let started = std::time::Instant::now();
        counted(|| match (start, function) {
            ("batch", "bare_loop") => {
                rt.block_on(bare_loop(event, |data| async move { code(&data) }));
            }
            ("batch", "least_processor") => {
                rt.block_on(least_processor(
                    event,
                    &below,
                    |data| async move { code(&data) },
                ));
            }
            ("batch", "least_in_passes") => {
                least_in_passes(event, &below, usize::MAX, code);
            }
            ("batch", "least_in_chunks") => {
                least_in_passes(event, &below, CHUNK, code);
            }
            ("batch", "least_in_place") => {
                least_in_place(event, &below, code);
            }
            ("batch", "least_in_two_phases") => {
                least_in_two_phases(event, &below, CHUNK, code);
            }
            ("batch", "processor") => {
                rt.block_on(processor.process(event, &context)).unwrap();
            }
            ("batch", "processor_new_store") => {
                rt.block_on(fresh_processor(code).process(event, &context))
                    .unwrap();
            }
            ("bytes", "bare_loop") => {
                let event: KinesisEvent = deserialize(&body);
                rt.block_on(bare_loop(event, |data| async move { code(&data) }));
            }
            ("bytes", "processor") => {
                let InvocationEvent(event) = deserialize(&body);
                rt.block_on(processor.process(event, &context)).unwrap();
            }
            ("duplicate", "processor") => {
                rt.block_on(duplicate.process(event, &context)).unwrap();
            }
            ("duplicate", "runtime_reading") => runtime_reading(&body),
            ("duplicate", "processor_from_bytes") => {
                let InvocationEvent(event) = deserialize(&body);
                rt.block_on(duplicate.process(event, &context)).unwrap();
            }
            _ => panic!("no benchmark {group}/{function}"),
        });
        times.push(started.elapsed().as_nanos());
        drop(pad);
    }
    times.sort_unstable();
    if let (Some(fastest), Some(tenth), Some(median)) = (
        times.first(),
        times.get(times.len() / 10),
        times.get(times.len() / 2),
    ) {
        eprintln!("iteration ns: fastest {fastest} tenth {tenth} median {median}");
    }
}

/// What an instruction count covers: callgrind is told to count only inside this function.
#[inline(never)]
fn counted(run: impl FnOnce()) {
    run();
}

fn main() {
    if let Ok(spec) = std::env::var("PROCESSOR_BENCH_COUNT") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
