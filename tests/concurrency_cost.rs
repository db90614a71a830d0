//! Per-key concurrency and the partition-key mode against moto's `DynamoDB`: the rows they
//! write, and the requests a batch costs, counted by moto's request recorder. This file has a
//! server of its own, so no other test's requests reach the recording.

mod common;

use std::sync::Arc;

use aws_lambda_events::event::kinesis::KinesisEvent;
use common::moto::{Moto, create_lease_table, unique};
use common::{context, event, lambda_record, reported, sequence};
use kinesis_checkpoint::internal::KeyCommit;
use kinesis_checkpoint::internal::row_key;
use kinesis_checkpoint::store::CheckpointStore;
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Outcome, Position, Processor, Record};
use serde_json::json;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

fn shard() -> LeaseKey {
    LeaseKey::new(STREAM, SHARD)
}

/// Records `range`, record `n` under partition key `customer-{n % keys}`.
fn batch(range: std::ops::Range<u64>, keys: u64) -> KinesisEvent {
    let records: Vec<_> = range
        .map(|n| {
            lambda_record(
                STREAM,
                SHARD,
                n,
                &format!("customer-{}", n % keys),
                &json!({ "n": n }),
            )
        })
        .collect();
    event(&records)
}

fn position(n: u64) -> Position {
    Position::record(sequence(n).parse().unwrap())
}

async fn store(moto: &Moto) -> Arc<DynamoLeaseStore> {
    let config = moto.sdk_config(1).await;
    let table = unique("keyed");
    create_lease_table(&config, &table).await;
    Arc::new(DynamoLeaseStore::new(&config, &table))
}

fn count(requests: &[String], operation: &str) -> usize {
    requests
        .iter()
        .filter(|target| target.as_str() == format!("DynamoDB_20120810.{operation}"))
        .count()
}

#[tokio::test]
async fn per_key_concurrency_costs_two_requests_a_batch_and_remembers_what_is_done_above() {
    let moto = Moto::start(true);
    let store = store(&moto).await;
    // Record 1005 (customer-5) fails once: every other key goes on past it.
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let processor = Processor::new(store.clone(), move |record: Record| {
        let failed_once = failed_once.clone();
        async move {
            if record.sequence().as_str() == sequence(1_005)
                && !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                return Outcome::retry("downstream busy");
            }
            Outcome::ack()
        }
    })
    .concurrency(32);
    processor
        .process(batch(0..1, 100), &context("warm", 60_000))
        .await
        .unwrap();

    for (from, request) in [(1, "clean"), (1_001, "failing"), (1_005, "redelivered")] {
        moto.start_recording();
        let response = processor
            .process(batch(from..from + 1_000, 100), &context(request, 60_000))
            .await
            .unwrap();
        let requests = moto.stop_recording();
        println!(
            "shard mode, 32 in flight, 1,000 records over 100 keys ({request}): {} DynamoDB requests",
            requests.len()
        );
        assert_eq!(count(&requests, "UpdateItem"), 2, "{requests:?}");
        assert_eq!(requests.len(), 2, "{requests:?}");
        if request == "failing" {
            assert_eq!(reported(&response), vec![sequence(1_005)]);
            let row = store.read(&shard()).await.unwrap();
            assert_eq!(row.checkpoint, Some(sequence(1_004)));
            let above: Vec<Position> = (1_006..2_001)
                .filter(|n| n % 100 != 5)
                .map(position)
                .collect();
            assert_eq!(row.done_above, above, "held in the row as a string set");
            assert_eq!(row.failing.map(|f| f.sequence), Some(sequence(1_005)));
        }
    }
    let row = store.read(&shard()).await.unwrap();
    assert_eq!(row.checkpoint, Some(sequence(2_004)));
    assert!(row.done_above.is_empty(), "forgotten below the checkpoint");
    assert_eq!(row.failing, None);
}

#[tokio::test]
async fn the_partition_key_mode_costs_two_requests_per_hundred_keys_of_a_batch() {
    let moto = Moto::start(true);
    let store = store(&moto).await;
    let processor =
        Processor::by_partition_key(store.clone(), |_: Record| async { Outcome::ack() })
            .concurrency(32);

    let mut next = 0;
    for keys in [100, 100, 250] {
        moto.start_recording();
        let response = processor
            .process(batch(next..next + 1_000, keys), &context("batch", 60_000))
            .await
            .unwrap();
        let requests = moto.stop_recording();
        assert!(reported(&response).is_empty());
        let hundreds = keys.div_ceil(100);
        // The shard's own row is read with the keys' (a container consumer's lease and
        // checkpoint): one more key to read.
        let reads = (keys + 1).div_ceil(100);
        println!(
            "partition-key mode, 1,000 records over {keys} keys: {} DynamoDB requests ({} BatchGetItem, {} TransactWriteItems)",
            requests.len(),
            count(&requests, "BatchGetItem"),
            count(&requests, "TransactWriteItems"),
        );
        assert_eq!(
            count(&requests, "BatchGetItem"),
            usize::try_from(reads).unwrap()
        );
        assert_eq!(
            count(&requests, "TransactWriteItems"),
            usize::try_from(hundreds).unwrap()
        );
        assert_eq!(
            requests.len(),
            usize::try_from(reads + hundreds).unwrap(),
            "{requests:?}"
        );
        next += 1_000;
    }
    // Each key's row holds its last record; the shard has no lease row.
    let last = next - 1;
    let row = store
        .read(&row_key(&shard(), &format!("customer-{}", last % 250)))
        .await
        .unwrap();
    assert_eq!(row.checkpoint, Some(sequence(last)));
    assert!(row.expires_at.is_some());
    assert_eq!(row.lease_owner, None);
    assert_eq!(store.read(&shard()).await.unwrap().lease_counter, 0);

    // A redelivery of a batch done already reads the rows and writes nothing.
    moto.start_recording();
    let again = processor
        .process_batch(batch(next - 1_000..next, 250), &context("again", 60_000))
        .await
        .unwrap();
    let requests = moto.stop_recording();
    assert_eq!(
        again.shards[0].count(kinesis_checkpoint::report::Disposition::Duplicate),
        1_000
    );
    assert_eq!(count(&requests, "BatchGetItem"), 3, "{requests:?}");
    assert_eq!(requests.len(), 3, "{requests:?}");
}

#[tokio::test]
async fn a_key_row_written_meanwhile_is_refused_and_the_others_are_written() {
    let moto = Moto::start(true);
    let store = store(&moto).await;
    let rows = [row_key(&shard(), "a"), row_key(&shard(), "b")];
    let mut first = KeyCommit::new(rows[0].clone(), 0);
    first.checkpoint = Some(position(1));
    assert_eq!(store.commit_rows(&[first]).await.unwrap(), vec![true]);

    // Both commits expect fresh rows; `a` was written since.
    let commits: Vec<KeyCommit> = rows
        .iter()
        .map(|row| {
            let mut commit = KeyCommit::new(row.clone(), 0);
            commit.checkpoint = Some(position(2));
            commit
        })
        .collect();
    moto.start_recording();
    let written = store.commit_rows(&commits).await.unwrap();
    let requests = moto.stop_recording();

    assert_eq!(written, vec![false, true]);
    assert_eq!(
        count(&requests, "TransactWriteItems"),
        2,
        "cancelled, then sent without a"
    );
    let states = store.read_rows(&rows).await.unwrap();
    assert_eq!(
        states[0].checkpoint,
        Some(sequence(1)),
        "a is left as written"
    );
    assert_eq!(states[1].checkpoint, Some(sequence(2)));
}
