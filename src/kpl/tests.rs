//! The unit tests of de-aggregation: aggregates built from the schema, not from fixtures (those
//! are in `tests/kpl.rs`), so that every field and defect can be set on its own.

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use md5::{Digest, Md5};
use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::key::LeaseKey;
use crate::record::Record;

const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

/// `message` framed as an aggregate: magic, protobuf, MD5.
fn frame(message: &wire::AggregatedRecord) -> Bytes {
    let body = message.encode_to_vec();
    [&MAGIC[..], &body, &Md5::digest(&body)].concat().into()
}

fn outer(data: Bytes) -> Record {
    Record::new(
        LeaseKey::new("orders", "shardId-000000000007"),
        SEQ.parse().unwrap(),
        "outer-key",
        data,
    )
    .with_arrival(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
}

fn sub(partition_key_index: u64, data: &'static [u8]) -> wire::Record {
    wire::Record {
        partition_key_index: Some(partition_key_index),
        explicit_hash_key_index: None,
        data: Some(Bytes::from_static(data)),
        tags: Vec::new(),
    }
}

fn aggregate(keys: &[&str], records: Vec<wire::Record>) -> wire::AggregatedRecord {
    wire::AggregatedRecord {
        partition_key_table: keys.iter().map(ToString::to_string).collect(),
        explicit_hash_key_table: Vec::new(),
        records,
    }
}

fn error_kind(message: &wire::AggregatedRecord) -> KplErrorKind {
    deaggregate(outer(frame(message)))
        .expect_err("a broken aggregate")
        .kind()
        .clone()
}

#[test]
fn sub_record_payloads_are_slices_of_the_aggregate_not_copies() {
    let data = frame(&aggregate(
        &["k"],
        vec![sub(0, b"first"), sub(0, b"second")],
    ));
    let span = data.as_ptr_range();
    let records = deaggregate(outer(data.clone())).unwrap().into_records();
    for record in &records {
        let payload = record.data().as_ptr_range();
        assert!(span.start <= payload.start && payload.end <= span.end);
    }
    assert_eq!(records[1].data(), b"second");
}

#[test]
fn sub_records_of_one_partition_key_share_its_string() {
    let data = frame(&aggregate(&["k"], vec![sub(0, b"a"), sub(0, b"b")]));
    let records = deaggregate(outer(data)).unwrap().into_records();
    assert!(std::ptr::eq(
        records[0].partition_key(),
        records[1].partition_key()
    ));
}

#[test]
fn a_missing_required_field_is_an_error_not_a_default() {
    let mut no_key = sub(0, b"x");
    no_key.partition_key_index = None;
    assert_eq!(
        error_kind(&aggregate(&["k"], vec![sub(0, b"ok"), no_key])),
        KplErrorKind::MissingField {
            sub_record: 1,
            field: "partition_key_index"
        }
    );
    let mut no_data = sub(0, b"x");
    no_data.data = None;
    assert_eq!(
        error_kind(&aggregate(&["k"], vec![no_data])),
        KplErrorKind::MissingField {
            sub_record: 0,
            field: "data"
        }
    );
}

#[test]
fn an_index_past_its_table_names_the_sub_record_the_index_and_the_table() {
    assert_eq!(
        error_kind(&aggregate(&["a", "b"], vec![sub(1, b"x"), sub(2, b"y")])),
        KplErrorKind::PartitionKeyIndex {
            sub_record: 1,
            index: 2,
            table_len: 2
        }
    );
    assert_eq!(
        error_kind(&aggregate(&["a"], vec![sub(u64::MAX, b"x")])),
        KplErrorKind::PartitionKeyIndex {
            sub_record: 0,
            index: u64::MAX,
            table_len: 1
        }
    );
    let mut hashed = sub(0, b"x");
    hashed.explicit_hash_key_index = Some(0);
    assert_eq!(
        error_kind(&aggregate(&["a"], vec![hashed])),
        KplErrorKind::ExplicitHashKeyIndex {
            sub_record: 0,
            index: 0,
            table_len: 0
        }
    );
}

#[test]
fn an_aggregate_without_sub_records_is_an_error_not_an_empty_batch() {
    assert_eq!(
        error_kind(&aggregate(&["lonely"], Vec::new())),
        KplErrorKind::NoRecords
    );
}

#[test]
fn the_error_names_stream_shard_sequence_and_what_is_wrong() {
    let message = deaggregate(outer(frame(&aggregate(&["a"], vec![sub(3, b"x")]))))
        .unwrap_err()
        .to_string();
    for part in [
        "stream 'orders'",
        "shard 'shardId-000000000007'",
        SEQ,
        "sub-record 0 names partition key 3 of a table of 1",
        "dead-letter",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

#[test]
fn exactly_the_magic_and_a_digest_is_too_short_to_be_an_aggregate() {
    let data = Bytes::from([&MAGIC[..], &Md5::digest(b"")].concat());
    assert!(!is_aggregate(&data));
    let record = outer(data);
    assert_eq!(
        deaggregate(record.clone()).unwrap(),
        Deaggregated::Plain(record)
    );
    assert!(!is_aggregate(&MAGIC));
    assert!(!is_aggregate(&[]));
}

#[test]
fn a_sub_record_is_not_de_aggregated_again() {
    let inner = frame(&aggregate(&["k"], vec![sub(0, b"x")]));
    let nested = frame(&wire::AggregatedRecord {
        partition_key_table: vec!["k".into()],
        explicit_hash_key_table: Vec::new(),
        records: vec![wire::Record {
            data: Some(inner.clone()),
            ..sub(0, b"")
        }],
    });
    let once = deaggregate(outer(nested)).unwrap().into_records();
    assert_eq!(once[0].data(), &inner[..]);
    let again = deaggregate(once[0].clone()).unwrap();
    assert_eq!(again, Deaggregated::Plain(once[0].clone()));
}

#[test]
fn tags_are_read_and_do_not_change_the_sub_record() {
    let mut tagged = sub(0, b"x");
    tagged.tags = vec![
        wire::Tag {
            key: Some("team".into()),
            value: Some("payments".into()),
        },
        wire::Tag {
            key: Some("bare".into()),
            value: None,
        },
    ];
    let records = deaggregate(outer(frame(&aggregate(&["k"], vec![tagged]))))
        .unwrap()
        .into_records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].data(), b"x");
}

/// A generated user record: partition key, optional explicit hash key, payload.
type UserRecord = (String, Option<String>, Vec<u8>);

/// Packs user records the way the KPL does: each distinct key once in its table.
fn pack(user_records: &[UserRecord]) -> wire::AggregatedRecord {
    fn index_of(table: &mut Vec<String>, key: &str) -> u64 {
        let index = table
            .iter()
            .position(|known| known == key)
            .unwrap_or_else(|| {
                table.push(key.to_owned());
                table.len() - 1
            });
        u64::try_from(index).unwrap()
    }
    let mut message = wire::AggregatedRecord::default();
    for (partition_key, hash_key, data) in user_records {
        let partition_key_index = index_of(&mut message.partition_key_table, partition_key);
        let explicit_hash_key_index = hash_key
            .as_deref()
            .map(|key| index_of(&mut message.explicit_hash_key_table, key));
        message.records.push(wire::Record {
            partition_key_index: Some(partition_key_index),
            explicit_hash_key_index,
            data: Some(Bytes::from(data.clone())),
            tags: Vec::new(),
        });
    }
    message
}

fn user_records() -> impl Strategy<Value = Vec<UserRecord>> {
    // Few distinct keys, so that tables are shared and indexes repeat.
    let partition_key = prop_oneof![Just(String::from("order-1")), "\\PC{0,12}"];
    let hash_key = proptest::option::of(prop_oneof![Just(String::from("0")), "[0-9]{1,39}"]);
    let data = proptest::collection::vec(any::<u8>(), 0..300);
    proptest::collection::vec((partition_key, hash_key, data), 1..40)
}

proptest! {
    #[test]
    fn a_random_aggregate_yields_exactly_its_user_records(user_records in user_records()) {
        let record = outer(frame(&pack(&user_records)));
        let Deaggregated::SubRecords(records) = deaggregate(record.clone()).unwrap() else {
            panic!("a packed aggregate passed through");
        };
        prop_assert_eq!(records.len(), user_records.len());
        for ((sub_record, record_out), (partition_key, hash_key, data)) in
            (0_u64..).zip(&records).zip(&user_records)
        {
            prop_assert_eq!(record_out.key(), record.key());
            prop_assert_eq!(record_out.sequence(), record.sequence());
            prop_assert_eq!(record_out.arrival(), record.arrival());
            prop_assert_eq!(record_out.sub_sequence(), Some(sub_record));
            prop_assert_eq!(record_out.partition_key(), partition_key.as_str());
            prop_assert_eq!(record_out.explicit_hash_key(), hash_key.as_deref());
            prop_assert_eq!(record_out.data(), data.as_slice());
        }
    }

    #[test]
    fn a_message_with_any_indexes_and_gaps_fails_at_its_first_broken_sub_record(
        message in loose_messages()
    ) {
        let result = deaggregate(outer(frame(&message)));
        match (result, first_defect(&message)) {
            (Ok(Deaggregated::SubRecords(records)), None) => {
                prop_assert_eq!(records.len(), message.records.len());
            }
            (Err(error), Some(defect)) => prop_assert_eq!(error.kind(), &defect),
            // Nothing at all between magic and digest is too short to be an aggregate.
            (Ok(Deaggregated::Plain(_)), Some(KplErrorKind::NoRecords))
                if message.encoded_len() == 0 => {}
            (result, defect) => prop_assert!(false, "{result:?} where {defect:?} was due"),
        }
    }
}

/// Messages that are valid protobuf but need not be valid aggregates: short tables, indexes
/// past them, missing fields, no records at all.
fn loose_messages() -> impl Strategy<Value = wire::AggregatedRecord> {
    let table = proptest::collection::vec("[a-z]{1,3}", 0..3);
    let index = proptest::option::weighted(0.9, 0_u64..4);
    let data = proptest::option::weighted(0.9, proptest::collection::vec(any::<u8>(), 0..8));
    let sub_record = (index.clone(), proptest::option::of(0_u64..4), data).prop_map(
        |(partition_key_index, explicit_hash_key_index, data)| wire::Record {
            partition_key_index,
            explicit_hash_key_index,
            data: data.map(Bytes::from),
            tags: Vec::new(),
        },
    );
    (
        table.clone(),
        table,
        proptest::collection::vec(sub_record, 0..6),
    )
        .prop_map(|(partition_key_table, explicit_hash_key_table, records)| {
            wire::AggregatedRecord {
                partition_key_table,
                explicit_hash_key_table,
                records,
            }
        })
}

/// What the format says is wrong with `message`, checking sub-records in order; `None`
/// when it is a valid aggregate.
fn first_defect(message: &wire::AggregatedRecord) -> Option<KplErrorKind> {
    if message.records.is_empty() {
        return Some(KplErrorKind::NoRecords);
    }
    let within = |index: u64, table: &[String]| usize::try_from(index).unwrap() < table.len();
    message
        .records
        .iter()
        .zip(0_u64..)
        .find_map(|(sub, sub_record)| {
            let missing = |field| Some(KplErrorKind::MissingField { sub_record, field });
            let Some(index) = sub.partition_key_index else {
                return missing("partition_key_index");
            };
            if !within(index, &message.partition_key_table) {
                return Some(KplErrorKind::PartitionKeyIndex {
                    sub_record,
                    index,
                    table_len: message.partition_key_table.len(),
                });
            }
            if sub.data.is_none() {
                return missing("data");
            }
            let index = sub.explicit_hash_key_index?;
            (!within(index, &message.explicit_hash_key_table)).then_some(
                KplErrorKind::ExplicitHashKeyIndex {
                    sub_record,
                    index,
                    table_len: message.explicit_hash_key_table.len(),
                },
            )
        })
}
