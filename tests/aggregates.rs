//! KPL aggregates through the processor: sub-records handed over one by one, checkpoints inside
//! an aggregate (`aggregate_sequence`, `aggregate_sub`), dead letters of single sub-records, and aggregates that
//! cannot be read. The aggregates are the fixtures `scripts/make_kpl_fixtures.py` made with the
//! real Python library `aws-kinesis-agg`.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use base64::Engine;
use common::moto::{Moto, create_lease_table, unique};
use common::{context, reported, sequence};
use kinesis_checkpoint::dead_letter::DeadLetterReason;
use kinesis_checkpoint::report::{Disposition, StopReason};
use kinesis_checkpoint::{
    DynamoLeaseStore, LeaseKey, MemoryLeaseStore, Outcome, Position, Processor, Record,
};
use kinesis_checkpoint_testing::MemoryDeadLetters;
use serde_json::{Value, json};

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

fn fixture(name: &str) -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/kpl/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A Lambda record at sequence `n` whose base64 data is `data`.
fn record(n: u64, key: &str, data: &str) -> Value {
    let mut record = common::lambda_record(STREAM, SHARD, n, key, &json!(null));
    record["kinesis"]["data"] = json!(data);
    record
}

/// The aggregate of fixture `name` as the record at sequence `n`.
fn aggregate(n: u64, name: &str) -> Value {
    let fixture = fixture(name);
    record(
        n,
        fixture["outer_partition_key"].as_str().unwrap(),
        fixture["data_base64"].as_str().unwrap(),
    )
}

fn plain(n: u64, text: &str) -> Value {
    record(
        n,
        "plain",
        &base64::engine::general_purpose::STANDARD.encode(text),
    )
}

/// What the handler was given: (sequence, sub-sequence, partition key, data), in order.
type Seen = Arc<Mutex<Vec<(String, Option<u64>, String, Vec<u8>)>>>;

/// A handler that records every record and answers `fail` for the sub-record it names, once.
fn handler(seen: &Seen, fail: Option<(u64, Outcome)>) -> impl kinesis_checkpoint::Handler {
    let seen = seen.clone();
    let fail = Arc::new(Mutex::new(fail));
    move |record: Record| {
        let mut fail = fail.lock().unwrap();
        let outcome = if fail
            .as_ref()
            .is_some_and(|(sub, _)| record.sub_sequence() == Some(*sub))
        {
            fail.take()
                .map_or_else(Outcome::ack, |(_, outcome)| outcome)
        } else {
            seen.lock().unwrap().push((
                record.sequence().to_string(),
                record.sub_sequence(),
                record.partition_key().to_owned(),
                record.data().to_vec(),
            ));
            Outcome::ack()
        };
        std::future::ready(outcome)
    }
}

#[tokio::test]
async fn a_failure_inside_an_aggregate_reports_it_and_the_redelivery_skips_what_was_done() {
    let store = Arc::new(MemoryLeaseStore::new());
    let seen = Seen::default();
    let processor = Processor::new(
        store.clone(),
        handler(&seen, Some((4, Outcome::retry("busy")))),
    );
    let event = common::event(&[aggregate(7, "ten_sub_records")]);

    let first = processor
        .process_batch(event.clone(), &context("r1", 60_000))
        .await
        .unwrap();
    assert_eq!(
        reported(&first.response()),
        vec![sequence(7)],
        "the aggregate's own sequence number"
    );
    let row = store.read(&LeaseKey::new(STREAM, SHARD)).await.unwrap();
    assert_eq!(
        row.position().unwrap(),
        Some(Position::sub_record(sequence(7).parse().unwrap(), 3))
    );

    let second = processor
        .process_batch(event, &context("r2", 60_000))
        .await
        .unwrap();
    assert!(reported(&second.response()).is_empty());
    assert_eq!(
        second.shards[0].count(Disposition::Duplicate),
        4,
        "sub-records 0 to 3 are done"
    );
    let subs: Vec<Option<u64>> = seen.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(
        subs,
        (0..10).map(Some).collect::<Vec<_>>(),
        "each sub-record once, in order"
    );
    let expected = fixture("ten_sub_records")["sub_records"][4]["partition_key"].clone();
    assert_eq!(json!(seen.lock().unwrap()[4].2), expected);
}

#[tokio::test]
async fn a_rejected_sub_record_is_dead_lettered_alone_with_its_sub_sequence() {
    let letters = Arc::new(MemoryDeadLetters::new());
    let seen = Seen::default();
    let processor = Processor::new(
        Arc::new(MemoryLeaseStore::new()),
        handler(&seen, Some((4, Outcome::reject("bad order")))),
    )
    .dead_letters(letters.clone());

    let response = processor
        .process(
            common::event(&[aggregate(7, "ten_sub_records")]),
            &context("r1", 60_000),
        )
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    assert_eq!(seen.lock().unwrap().len(), 9);
    let letters = letters.letters();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0].record;
    assert_eq!(
        (letter.sequence().as_str(), letter.sub_sequence()),
        (sequence(7).as_str(), Some(4))
    );
    let order: Value = letter.json().unwrap();
    assert!(
        order.get("order_id").is_some(),
        "the sub-record's own payload: {order}"
    );
}

#[tokio::test]
async fn aggregates_and_plain_records_share_a_batch_in_order() {
    let seen = Seen::default();
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), handler(&seen, None));
    let event = common::event(&[
        plain(1, "before"),
        aggregate(2, "many_partition_keys"),
        plain(3, "after"),
    ]);

    let response = processor
        .process(event, &context("r1", 60_000))
        .await
        .unwrap();

    assert!(reported(&response).is_empty());
    let seen = seen.lock().unwrap();
    let expected = fixture("many_partition_keys")["sub_records"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(seen.len(), expected + 2);
    assert_eq!(seen[0].3, b"before");
    assert_eq!(seen.last().unwrap().3, b"after");
    assert!(
        seen[1..=expected]
            .iter()
            .enumerate()
            .all(|(i, s)| s.0 == sequence(2) && s.1 == Some(i as u64))
    );
}

#[tokio::test]
async fn an_aggregate_that_cannot_be_read_is_dead_lettered_whole_or_reported() {
    let raw = fixture("truncated_protobuf")["data_base64"]
        .as_str()
        .unwrap()
        .to_owned();
    let event = common::event(&[
        plain(1, "first"),
        aggregate(2, "truncated_protobuf"),
        plain(3, "third"),
    ]);

    // Without a sink: reported, never dropped.
    let seen = Seen::default();
    let strict = Processor::new(Arc::new(MemoryLeaseStore::new()), handler(&seen, None));
    let report = strict
        .process_batch(event.clone(), &context("r1", 60_000))
        .await
        .unwrap();
    let Some((at, StopReason::Rejected(error))) = &report.shards[0].stopped else {
        panic!("the unreadable aggregate stops the shard: {report:?}");
    };
    assert_eq!(at.as_str(), sequence(2));
    assert!(
        error.contains("KPL aggregate") && error.contains(&sequence(2)),
        "{error}"
    );

    // With a sink: moved aside whole, and the batch goes on.
    let letters = Arc::new(MemoryDeadLetters::new());
    let seen = Seen::default();
    let lenient = Processor::new(Arc::new(MemoryLeaseStore::new()), handler(&seen, None))
        .dead_letters(letters.clone());
    let response = lenient
        .process(event, &context("r2", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(seen.lock().unwrap().len(), 2);
    let letters = letters.letters();
    assert_eq!(letters[0].reason, DeadLetterReason::Rejected);
    assert_eq!(
        letters[0].record.data(),
        base64::engine::general_purpose::STANDARD
            .decode(raw)
            .unwrap()
    );
}

#[tokio::test]
async fn a_record_whose_digest_does_not_match_reaches_the_handler_as_it_came() {
    let seen = Seen::default();
    let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), handler(&seen, None));
    let corrupted = fixture("corrupted_md5")["data_base64"]
        .as_str()
        .unwrap()
        .to_owned();

    processor
        .process(
            common::event(&[aggregate(5, "corrupted_md5")]),
            &context("r1", 60_000),
        )
        .await
        .unwrap();

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].1, &seen[0].3),
        (
            None,
            &base64::engine::general_purpose::STANDARD
                .decode(corrupted)
                .unwrap()
        )
    );
}

#[tokio::test]
async fn dynamodb_keeps_the_progress_inside_an_aggregate_beside_the_checkpoint() {
    let config = Moto::shared().sdk_config(1).await;
    let table = unique("leases");
    create_lease_table(&config, &table).await;
    let store = DynamoLeaseStore::new(&config, &table);
    let seen = Seen::default();
    let processor = Processor::new(
        Arc::new(store.clone()),
        handler(&seen, Some((4, Outcome::retry("busy")))),
    );
    let event = common::event(&[aggregate(7, "ten_sub_records")]);

    processor
        .process(event.clone(), &context("r1", 60_000))
        .await
        .unwrap();
    let row = store.read(&LeaseKey::new(STREAM, SHARD)).await.unwrap();
    // No record before the aggregate is known: `checkpoint` stays absent (it names records
    // done whole only), and the aggregate's progress is kept beside it.
    assert_eq!(
        (
            row.checkpoint.as_deref(),
            row.aggregate_sequence.as_deref(),
            row.aggregate_sub,
        ),
        (None, Some(sequence(7).as_str()), Some(3))
    );

    processor
        .process(event, &context("r2", 60_000))
        .await
        .unwrap();
    let row = store.read(&LeaseKey::new(STREAM, SHARD)).await.unwrap();
    assert_eq!(
        (row.checkpoint.as_deref(), row.aggregate_sequence.as_deref(),),
        (Some(sequence(7).as_str()), None),
        "the whole aggregate is done: checkpointed whole"
    );
    assert_eq!(seen.lock().unwrap().len(), 10);
}

#[tokio::test]
async fn under_per_key_concurrency_sub_records_run_per_key_and_are_remembered_by_sub_sequence() {
    let seen = Seen::default();
    let store = Arc::new(MemoryLeaseStore::new());
    // Sub-records 0..6 are keyed a, b, a, c, b, c: sub-record 1 (b) fails once, so 4 (b) waits.
    let processor = Processor::new(
        store.clone(),
        handler(&seen, Some((1, Outcome::retry("busy")))),
    )
    .concurrency(4);
    let event = common::event(&[
        plain(1, "before"),
        aggregate(2, "many_partition_keys"),
        plain(3, "after"),
    ]);

    let first = processor
        .process(event.clone(), &context("r1", 60_000))
        .await
        .unwrap();

    assert_eq!(
        reported(&first),
        vec![sequence(2)],
        "the aggregate of sub-record 1"
    );
    let key = LeaseKey::new(STREAM, SHARD);
    let row = store.read(&key).await.unwrap();
    let at = |sub: u64| Position::sub_record(sequence(2).parse().unwrap(), sub);
    assert_eq!(row.position().unwrap(), Some(at(0)));
    assert_eq!(
        row.done_above,
        vec![
            at(2),
            at(3),
            at(5),
            Position::record(sequence(3).parse().unwrap())
        ]
    );

    let again = processor
        .process_batch(
            common::redeliver_from(&event, &sequence(2)),
            &context("r2", 60_000),
        )
        .await
        .unwrap();
    assert!(again.response().batch_item_failures.is_empty());
    assert_eq!(
        again.shards[0].count(Disposition::Processed),
        2,
        "sub-records 1 and 4"
    );
    let mut subs: Vec<Option<u64>> = seen.lock().unwrap().iter().map(|s| s.1).collect();
    subs.sort_unstable();
    assert_eq!(
        subs,
        [
            None,
            None,
            Some(0),
            Some(1),
            Some(2),
            Some(3),
            Some(4),
            Some(5)
        ],
        "each once"
    );
    let row = store.read(&key).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(3)));
    assert!(row.done_above.is_empty());
}
