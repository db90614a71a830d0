//! KPL de-aggregation throughput, in payload bytes and in sub-records per second.
//!
//! A Lambda invocation may receive up to 10,000 records of up to 1 MB each, so de-aggregation
//! must cost little next to the handler. The two shapes are the KPL's common ones: many small
//! user records (100 of 100 bytes) and fewer large ones (10 of 10 KB).
//!
//! `make bench`, or `cargo bench --bench kpl -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use kinesis_checkpoint::kpl::{MAGIC, deaggregate};
use kinesis_checkpoint::{LeaseKey, Record};
use md5::{Digest, Md5};
use prost::Message;

// The crate keeps its protobuf schema private; these are the fields a producer writes, enough
// to build the aggregates measured here.
#[derive(Clone, PartialEq, prost::Message)]
struct AggregatedRecord {
    #[prost(string, repeated, tag = "1")]
    partition_key_table: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    records: Vec<SubRecord>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SubRecord {
    #[prost(uint64, required, tag = "1")]
    partition_key_index: u64,
    #[prost(bytes = "vec", required, tag = "3")]
    data: Vec<u8>,
}

/// An aggregate of `count` user records of `size` bytes, over ten partition keys.
fn aggregate(count: usize, size: usize) -> Record {
    let message = AggregatedRecord {
        partition_key_table: (0..10).map(|key| format!("customer-{key:04}")).collect(),
        records: (0..count)
            .map(|index| SubRecord {
                partition_key_index: (index % 10) as u64,
                data: (0..=u8::MAX).cycle().skip(index).take(size).collect(),
            })
            .collect(),
    }
    .encode_to_vec();
    let data = [&MAGIC[..], &message, Md5::digest(&message).as_slice()].concat();
    Record::new(
        LeaseKey::new("orders", "shardId-000000000000"),
        "49590338271490256608559692538361571095921575989136588898"
            .parse()
            .unwrap(),
        "customer-0000",
        Bytes::from(data),
    )
}

const SHAPES: [(usize, usize, &str); 2] = [
    (100, 100, "100 sub-records of 100 B"),
    (10, 10_000, "10 sub-records of 10 KB"),
];

fn measure<M: criterion::measurement::Measurement>(
    group: &mut BenchmarkGroup<'_, M>,
    name: &str,
    record: &Record,
) {
    group.bench_function(name, |b| {
        // Cloning a record shares its payload; the clone is part of what a caller pays.
        b.iter(|| deaggregate(black_box(record.clone())).expect("a valid aggregate"));
    });
}

fn bytes_per_second(c: &mut Criterion) {
    let mut group = c.benchmark_group("deaggregate_bytes");
    for (count, size, name) in SHAPES {
        let record = aggregate(count, size);
        group.throughput(Throughput::Bytes(record.data().len() as u64));
        measure(&mut group, name, &record);
    }
    group.finish();
}

fn sub_records_per_second(c: &mut Criterion) {
    let mut group = c.benchmark_group("deaggregate_sub_records");
    for (count, size, name) in SHAPES {
        let record = aggregate(count, size);
        group.throughput(Throughput::Elements(count as u64));
        measure(&mut group, name, &record);
    }
    group.finish();
}

criterion_group!(benches, bytes_per_second, sub_records_per_second);
criterion_main!(benches);
