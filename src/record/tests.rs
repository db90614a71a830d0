//! A record's accessors, builders and equality, whichever way its fields are held.

use aws_lambda_events::event::kinesis::KinesisEvent;

use super::*;

const SEQ: &str = "49590338271490256608559692538361571095921575989136588898";

#[test]
fn a_payload_that_is_not_the_expected_json_names_its_record() {
    let record = Record::new(
        LeaseKey::new("orders", "shardId-000000000000"),
        SEQ.parse().unwrap(),
        "k",
        "not json",
    );
    let message = record.json::<serde_json::Value>().unwrap_err().to_string();
    assert!(message.contains(SEQ) && message.contains("shardId-000000000000"));
}

/// The block of fields that holds `record`.
fn block(record: &Record) -> &Arc<[Slot]> {
    match &record.held {
        Held::Fields(block) => block,
        Held::InEvent(_) => panic!("{record:?} is held in an event, not a block of fields"),
    }
}

fn arrival(sequence: &str, data: &'static str) -> Arrived {
    Arrived {
        key: LeaseKey::new("orders", "shardId-000000000000"),
        sequence: sequence.parse().unwrap(),
        partition_key: "k".into(),
        data: Bytes::from_static(data.as_bytes()),
        arrival: SystemTime::UNIX_EPOCH,
    }
}

#[test]
fn the_records_of_one_event_share_a_block_and_keep_their_order_and_their_errors() {
    let read = Record::arrived_together(
        [Ok(arrival("1", "a")), Err("bad"), Ok(arrival("3", "c"))].into_iter(),
    )
    .expect_err("a record was not read");
    assert_eq!(read.len(), 3);
    let first = read[0].as_ref().unwrap();
    let third = read[2].as_ref().unwrap();
    assert_eq!((first.sequence().as_str(), first.data()), ("1", &b"a"[..]));
    assert_eq!((third.sequence().as_str(), third.data()), ("3", &b"c"[..]));
    assert_eq!(read[1].as_ref().unwrap_err(), &"bad");
    assert!(
        Arc::ptr_eq(block(first), block(third)),
        "one block for the event"
    );
    assert_eq!(block(first).len(), 3, "a place for the record not read too");
}

#[test]
fn a_record_of_a_shared_block_changed_by_a_builder_moves_to_its_own_and_leaves_the_others() {
    let read = Record::arrived_together(
        [Ok::<_, ()>(arrival("1", "a")), Ok(arrival("2", "b"))].into_iter(),
    )
    .expect("every record was read");
    let second = read[1].clone();
    let changed = second.clone().with_sub_sequence(4);
    assert_eq!(changed.position().to_string(), "2/4");
    assert_eq!(changed.data(), b"b");
    assert_eq!(block(&changed).len(), 1, "a block of its own");
    assert_eq!(second.sub_sequence(), None, "the shared block is unchanged");
    assert_eq!(read[0].sub_sequence(), None);
    assert_ne!(changed, second);
    // Equal by their fields, not by their blocks.
    let alone = Record::arrived_together([Ok::<_, ()>(arrival("2", "b"))].into_iter());
    assert_eq!(alone.unwrap()[0], second);
}

/// Two records of shard 7 of `orders`, as Lambda's event holds them: sequence numbers 1 and 2,
/// partition keys `k1` and `k2`, payloads `a` and `b`, arrived at 1,700,000,000 s (`aws_lambda_events` mis-reads a
/// fraction, see [`Record::arrival`]).
fn event_records() -> (LeaseKey, Vec<KinesisEventRecord>, Vec<SequenceNumber>) {
    let record = |n: u32, data: &str| {
        serde_json::json!({
            "eventID": format!("shardId-000000000007:{n}"),
            "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
            "kinesis": {
                "partitionKey": format!("k{n}"),
                "sequenceNumber": n.to_string(),
                "data": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, data),
                "approximateArrivalTimestamp": 1_700_000_000,
            },
        })
    };
    let event: KinesisEvent =
        serde_json::from_value(serde_json::json!({ "Records": [record(1, "a"), record(2, "b")] }))
            .unwrap();
    let sequences = vec!["1".parse().unwrap(), "2".parse().unwrap()];
    (
        LeaseKey::new("orders", "shardId-000000000007"),
        event.records,
        sequences,
    )
}

#[test]
fn a_record_held_in_the_event_says_what_the_same_record_read_into_fields_says() {
    let (key, records, sequences) = event_records();
    let held = Record::in_event(key.clone(), records, sequences).unwrap();
    assert_eq!(held.len(), 2);
    let second = &held[1];
    assert!(matches!(second.held, Held::InEvent(_)));
    assert_eq!(second.key(), &key);
    assert_eq!(
        (second.stream(), second.shard()),
        ("orders", "shardId-000000000007")
    );
    assert_eq!(second.sequence().as_str(), "2");
    assert_eq!(second.position().to_string(), "2");
    assert_eq!(second.sub_sequence(), None);
    assert_eq!(second.partition_key(), "k2");
    assert_eq!(second.routing_key(), "k2");
    assert_eq!(second.explicit_hash_key(), None);
    assert_eq!(second.data(), b"b");
    assert_eq!(&second.bytes()[..], b"b");
    let arrival = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    assert_eq!(second.arrival(), arrival);
    let read = Record::new(key, "2".parse().unwrap(), "k2", "b").with_arrival(arrival);
    assert_eq!(second, &read, "equal to the same fields held on their own");
    assert_eq!(format!("{second:?}"), format!("{read:?}"));
    assert_eq!(second.to_string(), read.to_string());
    assert_ne!(&held[0], second);
}

#[test]
fn a_payload_held_in_the_event_is_copied_out_and_outlives_the_batch() {
    let (key, records, sequences) = event_records();
    let held = Record::in_event(key, records, sequences).unwrap();
    let payload = held[0].bytes();
    let event = match &held[0].held {
        Held::InEvent(event) => Arc::downgrade(event),
        Held::Fields(_) => panic!("read into fields"),
    };
    drop(held);
    assert!(
        event.upgrade().is_none(),
        "the event is freed with its last record"
    );
    assert_eq!(
        &payload[..],
        b"a",
        "the payload's bytes hold their own copy"
    );
}

#[test]
fn a_record_of_the_event_changed_by_a_builder_moves_to_its_own_fields_and_leaves_the_event() {
    let (key, records, sequences) = event_records();
    let held = Record::in_event(key, records, sequences).unwrap();
    let changed = held[1]
        .clone()
        .with_sub_sequence(4)
        .with_explicit_hash_key("170");
    assert_eq!(block(&changed).len(), 1, "a block of its own");
    assert_eq!(changed.position().to_string(), "2/4");
    assert_eq!(changed.explicit_hash_key(), Some("170"));
    assert_eq!((changed.partition_key(), changed.data()), ("k2", &b"b"[..]));
    assert_eq!(changed.arrival(), held[1].arrival());
    assert_eq!(
        held[1].sub_sequence(),
        None,
        "the event's record is unchanged"
    );
    assert!(matches!(held[1].held, Held::InEvent(_)));
}

#[test]
fn records_and_sequence_numbers_of_different_lengths_are_refused() {
    let (key, records, mut sequences) = event_records();
    sequences.pop();
    assert!(Record::in_event(key, records, sequences).is_none());
}

#[test]
fn a_hold_keeps_the_event_its_records_are_held_in_and_holds_nothing_of_other_records() {
    let (key, records, sequences) = event_records();
    let held = Record::in_event(key.clone(), records, sequences).unwrap();
    let event = match &held[0].held {
        Held::InEvent(event) => Arc::downgrade(event),
        Held::Fields(_) => panic!("read into fields"),
    };
    let keeper = held[1].event_hold();
    drop(held);
    assert!(
        event.upgrade().is_some(),
        "the event outlives its records while held"
    );
    drop(keeper);
    assert!(event.upgrade().is_none(), "and is freed with the hold");
    let alone = Record::new(key, "1".parse().unwrap(), "k", "x");
    assert!(!alone.event_hold().holds());
}
