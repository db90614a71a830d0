//! How fast the JSON readers of the Rust ecosystem read the processor bench's event: the floor
//! under a fully duplicate batch from the event's bytes, whichever reader a function used.
//!
//! A processor that skips a redelivered batch must still find each record's shard and
//! sequence number in the event's JSON, so no reader can skip a record faster than it finds
//! the end of every value before the next record, the 1.4 KB base64 payload among them. The
//! processor bench (`benches/processor.rs`, `duplicate/runtime_reading`) measures that floor
//! for `serde_json` as `lambda_runtime` runs it. A function could take the body's bytes before
//! the runtime reads them (a `lambda_runtime::Runtime::layer` sees them) and read them with
//! another reader; this bench measures those readers on the same event:
//! - `*_ignored`: the whole event read into `serde::de::IgnoredAny`, nothing kept;
//! - `*_positions`: each record's `eventID` (its shard) and sequence number, borrowed from the
//!   bytes, all else skipped: the least a duplicate check reads. Each reader of them is first
//!   checked to read every record's;
//! - `sonic_rs_lazy_*`: `sonic-rs`'s lazy API, which parses only what it is asked for: each
//!   record's raw text found, and its position read from it, with every value skipped
//!   validated, or skipped unchecked by its brackets and quotes alone (`*_unchecked_*`, an
//!   `unsafe` API whose contract is valid JSON).
//!
//! `simd-json` parses in place (into the positions only): each iteration gets a copy of the
//! body made outside the timed part. `memchr_quotes` is no reader: it only counts the quote
//! characters, a bound on finding where the strings end, beside the readers. Built as
//! `cargo lambda` builds a function, for the architecture's generic CPU; BENCHMARKS.md gives
//! the figures built with `-C target-cpu=native` too.
//!
//! Run with `make bench-json-readers`; `docs/dev/README.md` says what it showed.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde::Deserialize;

const SIZES: [u64; 3] = [100, 1_000, 10_000];
const PAYLOAD_BYTES: usize = 1_024;

#[path = "../../support/kinesis_event.rs"]
mod kinesis_event;

/// The processor bench's event (`benches/processor.rs`, `body`): `count` records of one shard,
/// each a JSON order of exactly 1 KB.
fn body(count: u64) -> Vec<u8> {
    kinesis_event::orders(count, PAYLOAD_BYTES)
}

/// What a duplicate check reads of an event: each record's shard and sequence number.
#[derive(Deserialize)]
struct Positions<'a> {
    #[serde(rename = "Records", borrow)]
    records: Vec<Position<'a>>,
}

#[derive(Deserialize)]
struct Position<'a> {
    #[serde(rename = "eventID", borrow)]
    event_id: &'a str,
    #[serde(borrow)]
    kinesis: Sequence<'a>,
}

#[derive(Deserialize)]
struct Sequence<'a> {
    #[serde(rename = "sequenceNumber")]
    sequence_number: &'a str,
}

impl Positions<'_> {
    /// Something of every record's position, so that none of it is left unread.
    fn checksum(&self) -> usize {
        self.records
            .iter()
            .map(|record| record.event_id.len() + record.kinesis.sequence_number.len())
            .sum()
    }
}

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// Times `read` over `body`; a reader that keeps the positions is first checked, once and
/// outside the timed part, to read them all.
fn bench(
    group: &mut Group,
    name: &str,
    size: u64,
    body: &[u8],
    expected: usize,
    read: impl Fn(&[u8]) -> usize,
) {
    if name.ends_with("_positions") {
        assert_eq!(read(body), expected, "{name} read other positions");
    }
    group.bench_with_input(BenchmarkId::new(name, size), body, |b, body| {
        b.iter(|| read(black_box(body)));
    });
}

fn readers(c: &mut Criterion) {
    let mut group = c.benchmark_group("json_readers");
    for size in SIZES {
        let body = body(size);
        let expected = Positions::checksum(&serde_json::from_slice(&body).expect("an event"));
        group.throughput(Throughput::Elements(size));
        let group = &mut group;
        bench(group, "serde_json_ignored", size, &body, expected, |body| {
            let serde::de::IgnoredAny = serde_json::from_slice(body).expect("an event");
            0
        });
        bench(
            group,
            "serde_json_positions",
            size,
            &body,
            expected,
            |body| {
                let read: Positions = serde_json::from_slice(body).expect("an event");
                read.checksum()
            },
        );
        bench(group, "sonic_rs_ignored", size, &body, expected, |body| {
            let serde::de::IgnoredAny = sonic_rs::from_slice(body).expect("an event");
            0
        });
        bench(group, "sonic_rs_positions", size, &body, expected, |body| {
            let read: Positions = sonic_rs::from_slice(body).expect("an event");
            read.checksum()
        });
        // `sonic-rs`'s lazy reading, which parses nothing it is not asked for: the records'
        // array found and iterated, each record's raw text skipped past (`*_unchecked_ignored`),
        // and only its `eventID` and sequence number read from it (`PointerTree`), every
        // skipped value validated (`*_lazy_positions`) or skipped by its brackets and quotes
        // alone (`*_unchecked_positions`, an `unsafe` API: the JSON must be valid).
        let mut tree = sonic_rs::PointerTree::new();
        tree.add_path(["eventID"]);
        tree.add_path(["kinesis", "sequenceNumber"]);
        bench(
            group,
            "sonic_rs_lazy_unchecked_ignored",
            size,
            &body,
            expected,
            |body| lazy_records(body, true).count(),
        );
        bench(
            group,
            "sonic_rs_lazy_positions",
            size,
            &body,
            expected,
            |body| lazy_positions(body, &tree, false),
        );
        bench(
            group,
            "sonic_rs_lazy_unchecked_positions",
            size,
            &body,
            expected,
            |body| lazy_positions(body, &tree, true),
        );
        // `simd-json` reads in place, writing into the bytes it reads: each iteration is given
        // a fresh copy, made outside the timed part (as a function holding the body alone could
        // hand it over without one). Its working buffers are kept from one iteration to the
        // next, as a function would keep them from one invocation to the next: allocated anew
        // for each call, they took most of its time at 1,000 records and more.
        let mut buffers = simd_json::Buffers::new(body.len());
        let mut simd_json = |copy: &mut Vec<u8>| {
            let read: Positions =
                simd_json::serde::from_slice_with_buffers(copy, &mut buffers).expect("an event");
            read.checksum()
        };
        assert_eq!(simd_json(&mut body.clone()), expected);
        group.bench_with_input(
            BenchmarkId::new("simd_json_positions", size),
            &body,
            |b, body| b.iter_batched_ref(|| body.clone(), &mut simd_json, BatchSize::LargeInput),
        );
        bench(group, "memchr_quotes", size, &body, expected, |body| {
            memchr::memchr_iter(b'"', body).count()
        });
    }
    group.finish();
}

/// The records of the event, each as its raw text, found lazily by `sonic-rs`; `unchecked`
/// skips the values before and between them without validating them.
fn lazy_records(body: &[u8], unchecked: bool) -> sonic_rs::ArrayJsonIter<'_> {
    let records = if unchecked {
        // SAFETY: the bench's event is valid JSON (`serde_json` reads it in `readers`).
        unsafe { sonic_rs::get_unchecked(body, ["Records"]) }
    } else {
        sonic_rs::get(body, ["Records"])
    }
    .expect("the records");
    // Borrowed from `body` (read from bytes, the raw text is never copied).
    let std::borrow::Cow::Borrowed(records) = records.as_raw_cow() else {
        unreachable!("the records' text is borrowed from the bytes")
    };
    if unchecked {
        // SAFETY: as above.
        unsafe { sonic_rs::to_array_iter_unchecked(records) }
    } else {
        sonic_rs::to_array_iter(records)
    }
}

/// Each record's `eventID` and sequence number read lazily with `sonic-rs` (`tree` holds
/// their paths); `unchecked` skips the values between them without validating them.
fn lazy_positions(body: &[u8], tree: &sonic_rs::PointerTree, unchecked: bool) -> usize {
    let mut sum = 0;
    for record in lazy_records(body, unchecked) {
        let record = record.expect("a record");
        let fields = if unchecked {
            // SAFETY: as above.
            unsafe { sonic_rs::get_many_unchecked(record.as_raw_str(), tree) }
        } else {
            sonic_rs::get_many(record.as_raw_str(), tree)
        }
        .expect("the fields");
        for field in fields {
            let field = field.expect("a field");
            sum += sonic_rs::JsonValueTrait::as_str(&field)
                .expect("a string")
                .len();
        }
    }
    sum
}

criterion_group!(benches, readers);
criterion_main!(benches);
