//! KPL de-aggregation against aggregates made by AWS's own aggregator, and against arbitrary
//! bytes.
//!
//! The fixtures in `tests/fixtures/kpl/` come from `aws-kinesis-agg` (see
//! `scripts/make_kpl_fixtures.py`), so these tests show that we read what real producers write,
//! not merely what our own encoder writes.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kinesis_checkpoint::kpl::{Deaggregated, KplErrorKind, MAGIC, deaggregate, is_aggregate};
use kinesis_checkpoint::{LeaseKey, Position, Record};
use md5::{Digest, Md5};
use proptest::prelude::*;
use serde_json::Value;

const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";
const SHARD: &str = "shardId-000000000002";

fn arrival() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kpl")
}

fn fixture(name: &str) -> Value {
    let path = fixture_dir().join(format!("{name}.json"));
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

fn decode(base64: &Value) -> Vec<u8> {
    STANDARD
        .decode(base64.as_str().expect("base64 text"))
        .expect("valid base64")
}

/// The fixture's payload as Lambda would deliver it: one record of stream `orders`.
fn delivered(fixture: &Value) -> Record {
    Record::new(
        LeaseKey::new("orders", SHARD),
        SEQ.parse().unwrap(),
        fixture["outer_partition_key"].as_str().unwrap(),
        decode(&fixture["data_base64"]),
    )
    .with_arrival(arrival())
}

fn sub_records(name: &str) -> Vec<Record> {
    match deaggregate(delivered(&fixture(name))) {
        Ok(Deaggregated::SubRecords(records)) => records,
        other => panic!("{name}: expected sub-records, got {other:?}"),
    }
}

/// Checks every sub-record against the fixture's expectation, in order.
fn assert_matches_fixture(name: &str) {
    let fixture = fixture(name);
    let expected = fixture["sub_records"].as_array().unwrap();
    let records = sub_records(name);
    assert_eq!(records.len(), expected.len(), "{name}");
    for ((index, record), expected) in (0_u64..).zip(&records).zip(expected) {
        let context = format!("{name}, sub-record {index}");
        assert_eq!(record.sub_sequence(), Some(index), "{context}");
        assert_eq!(
            record.partition_key(),
            expected["partition_key"].as_str().unwrap(),
            "{context}"
        );
        assert_eq!(
            record.explicit_hash_key(),
            expected["explicit_hash_key"].as_str(),
            "{context}"
        );
        assert_eq!(
            record.data(),
            decode(&expected["data_base64"]).as_slice(),
            "{context}"
        );
    }
}

#[test]
fn an_aggregate_under_one_partition_key_yields_its_sub_records() {
    assert_matches_fixture("one_partition_key");
}

#[test]
fn sub_records_find_their_own_key_in_a_shared_partition_key_table() {
    assert_matches_fixture("many_partition_keys");
}

#[test]
fn explicit_hash_keys_are_kept_and_absent_ones_stay_absent() {
    assert_matches_fixture("explicit_hash_keys");
}

#[test]
fn binary_payloads_empty_payloads_and_unicode_keys_come_through_intact() {
    assert_matches_fixture("binary_and_unicode");
}

#[test]
fn sub_records_keep_the_outer_stream_shard_sequence_and_arrival() {
    for record in sub_records("ten_sub_records") {
        assert_eq!(record.stream(), "orders");
        assert_eq!(record.shard(), SHARD);
        assert_eq!(record.sequence().as_str(), SEQ);
        assert_eq!(record.arrival(), arrival());
    }
}

#[test]
fn the_fifth_of_ten_sub_records_has_its_own_position_inside_the_aggregate() {
    assert_matches_fixture("ten_sub_records");
    let records = sub_records("ten_sub_records");
    let fifth = &records[4];
    assert_eq!(fifth.position().to_string(), format!("{SEQ}/4"));
    let order: Value = fifth.json().unwrap();
    assert_eq!(order["order_id"], "4");

    // A checkpoint at the fourth sub-record covers the first four and none after, and the
    // whole aggregate comes after all of them.
    let checkpoint = records[3].position();
    assert!(records[..4].iter().all(|r| r.position() <= checkpoint));
    assert!(records[4..].iter().all(|r| r.position() > checkpoint));
    let whole = Position::record(SEQ.parse().unwrap());
    assert!(records.iter().all(|r| r.position() < whole));
}

#[test]
fn a_corrupted_md5_passes_the_record_through_unchanged() {
    let fixture = fixture("corrupted_md5");
    let record = delivered(&fixture);
    assert!(record.data().starts_with(&MAGIC));
    assert!(!is_aggregate(record.data()));
    assert_eq!(
        deaggregate(record.clone()).unwrap(),
        Deaggregated::Plain(record)
    );
}

#[test]
fn a_plain_payload_passes_through_unchanged() {
    let record = delivered(&fixture("plain"));
    let result = deaggregate(record.clone()).unwrap();
    assert!(!result.is_aggregate());
    assert_eq!(result.into_records(), [record]);
}

#[test]
fn a_truncated_protobuf_with_a_valid_md5_is_an_error_that_returns_the_record_whole() {
    let record = delivered(&fixture("truncated_protobuf"));
    assert!(is_aggregate(record.data()));
    let error = deaggregate(record.clone()).expect_err("a truncated aggregate");
    assert!(
        matches!(error.kind(), KplErrorKind::Protobuf(_)),
        "{error:?}"
    );
    let message = error.to_string();
    for part in ["stream 'orders'", SHARD, SEQ, "truncated or invalid"] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    assert_eq!(error.record(), &record);
    assert_eq!(error.into_record(), record);
}

#[test]
fn every_fixture_is_read_as_it_declares() {
    let mut seen = 0;
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let fixture = fixture(&name);
        let record = delivered(&fixture);
        let result = deaggregate(record.clone());
        match fixture["expect"].as_str().unwrap() {
            "sub_records" => {
                assert!(is_aggregate(record.data()), "{name}");
                assert!(matches!(result, Ok(Deaggregated::SubRecords(_))), "{name}");
            }
            "pass_through" => {
                assert!(!is_aggregate(record.data()), "{name}");
                assert_eq!(result.unwrap(), Deaggregated::Plain(record), "{name}");
            }
            "error" => {
                assert!(is_aggregate(record.data()), "{name}");
                assert_eq!(result.unwrap_err().into_record(), record, "{name}");
            }
            other => panic!("{name}: unknown expectation {other:?}"),
        }
        seen += 1;
    }
    assert!(
        seen >= 8,
        "only {seen} fixtures in {}",
        fixture_dir().display()
    );
}

fn record_of(data: Vec<u8>) -> Record {
    Record::new(
        LeaseKey::new("orders", SHARD),
        SEQ.parse().unwrap(),
        "k",
        data,
    )
}

/// `message` between the magic and its correct MD5: an aggregate, as far as the checksum goes.
fn checksummed(message: &[u8]) -> Vec<u8> {
    [&MAGIC[..], message, Md5::digest(message).as_slice()].concat()
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_and_pass_through(
        data in proptest::collection::vec(any::<u8>(), 0..512)
    ) {
        let record = record_of(data);
        let aggregate = is_aggregate(record.data());
        match deaggregate(record.clone()) {
            Ok(Deaggregated::Plain(back)) => prop_assert_eq!(back, record),
            Ok(Deaggregated::SubRecords(records)) => {
                prop_assert!(aggregate && !records.is_empty());
            }
            Err(error) => {
                prop_assert!(aggregate);
                prop_assert_eq!(error.into_record(), record);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_with_the_magic_and_a_correct_md5_never_panic(
        message in proptest::collection::vec(any::<u8>(), 0..512)
    ) {
        let record = record_of(checksummed(&message));
        match deaggregate(record.clone()) {
            // Only an empty message is too short to be an aggregate.
            Ok(Deaggregated::Plain(back)) => {
                prop_assert!(message.is_empty());
                prop_assert_eq!(back, record);
            }
            Ok(Deaggregated::SubRecords(records)) => {
                prop_assert!(!records.is_empty());
                for (index, sub) in (0_u64..).zip(&records) {
                    prop_assert_eq!(sub.sub_sequence(), Some(index));
                    prop_assert_eq!(sub.sequence(), record.sequence());
                }
            }
            Err(error) => {
                prop_assert!(!error.to_string().is_empty());
                prop_assert_eq!(error.into_record(), record);
            }
        }
    }

    #[test]
    fn protobuf_shaped_bytes_with_a_correct_md5_never_panic(
        // Tags of fields 1 to 4 with every wire type, and lengths and indexes near the edges,
        // reach far more of the decoder than uniform bytes do.
        pieces in proptest::collection::vec(
            prop_oneof![
                (1_u8..=4, 0_u8..=5).prop_map(|(field, wire)| vec![(field << 3) | wire]),
                Just(vec![0x00]),
                Just(vec![0x7f]),
                Just(vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
                proptest::collection::vec(any::<u8>(), 0..8),
            ],
            1..40,
        )
    ) {
        let record = record_of(checksummed(&pieces.concat()));
        match deaggregate(record.clone()) {
            Ok(result) => prop_assert!(result.into_records().iter().all(|r| r.key() == record.key())),
            Err(error) => prop_assert_eq!(error.into_record(), record),
        }
    }
}
