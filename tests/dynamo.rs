//! `DynamoLeaseStore` and the processor through the real AWS SDK against moto on 127.0.0.1:
//! conditional writes and fencing, the seed's legacy rows, redelivery, concurrent deliveries,
//! and two streams in one table.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::moto::{Moto, create_lease_table, unique};
use common::{batch, context, n_of, redeliver_from, reported, sequence};
use kinesis_checkpoint::internal::{Claim, Commit};
use kinesis_checkpoint::report::StopReason;
use kinesis_checkpoint::store::dynamo::UnattributedLegacyRow;
use kinesis_checkpoint::store::{CheckpointStore, LeaseStore};
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Outcome, Position, Processor, Record};

const TTL: Duration = Duration::from_mins(1);
const SHARD: &str = "shardId-000000000000";

/// A fresh table on the shared server, and a store and a raw client on it.
async fn table() -> (DynamoLeaseStore, aws_sdk_dynamodb::Client, String) {
    let config = Moto::shared().sdk_config(1).await;
    let name = unique("leases");
    create_lease_table(&config, &name).await;
    (
        DynamoLeaseStore::new(&config, &name),
        aws_sdk_dynamodb::Client::new(&config),
        name,
    )
}

async fn raw_row(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    key: &str,
) -> std::collections::HashMap<String, AttributeValue> {
    client
        .get_item()
        .table_name(table)
        .key("lease_key", AttributeValue::S(key.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .unwrap_or_default()
}

/// Every record the handler acknowledged, by `n`.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<u64>>>);

impl Seen {
    fn processor(
        &self,
        store: DynamoLeaseStore,
        fail: Option<u64>,
    ) -> Processor<impl kinesis_checkpoint::Handler> {
        let seen = self.clone();
        let failed_once = Arc::new(Mutex::new(false));
        Processor::new(Arc::new(store), move |record: Record| {
            let n = n_of(&record);
            let seen = seen.clone();
            let failed_once = failed_once.clone();
            async move {
                let mut failed = failed_once.lock().unwrap();
                if Some(n) == fail && !*failed {
                    *failed = true;
                    return Outcome::retry("downstream timed out");
                }
                seen.0.lock().unwrap().push(n);
                Outcome::ack()
            }
        })
    }

    fn all(&self) -> Vec<u64> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn a_live_lease_is_exclusive_an_expired_one_is_stealable_and_the_loser_is_fenced() {
    let (store, client, table) = table().await;
    let key = LeaseKey::new("orders", SHARD);

    assert!(
        store
            .acquire(&key, "a", Duration::from_millis(1))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(
        store.acquire(&key, "b", TTL).await.unwrap(),
        "a's lease expired"
    );
    assert!(!store.acquire(&key, "a", TTL).await.unwrap(), "b's is live");
    assert!(!store.renew(&key, "a", TTL).await.unwrap(), "a is fenced");
    assert!(!store.checkpoint(&key, "a", &sequence(5)).await.unwrap());
    assert!(store.renew(&key, "b", TTL).await.unwrap());
    assert!(store.checkpoint(&key, "b", &sequence(6)).await.unwrap());
    store.release(&key, "a").await.unwrap();
    assert_eq!(
        store.read(&key).await.unwrap().lease_owner.as_deref(),
        Some("b"),
        "a cannot release b's lease"
    );
    store.release(&key, "b").await.unwrap();

    let row = raw_row(&client, &table, "orders:shardId-000000000000").await;
    assert_eq!(row["checkpoint"].as_s().unwrap(), &sequence(6));
    assert!(!row.contains_key("lease_owner") && !row.contains_key("lease_expiry"));
    // acquire, acquire, renew, checkpoint, release: every applied write bumped the counter.
    assert_eq!(row["lease_counter"].as_n().unwrap(), "5");
}

#[tokio::test]
async fn acquire_and_read_returns_the_row_or_names_the_holder() {
    let (store, _client, _table) = table().await;
    let key = LeaseKey::new("orders", SHARD);
    let position = Position::sub_record(sequence(40).parse().unwrap(), 3);

    let Claim::Acquired { state: fresh, .. } =
        store.acquire_and_read(&key, "a", TTL, None).await.unwrap()
    else {
        panic!("the row did not exist");
    };
    assert_eq!(
        (fresh.checkpoint.as_deref(), fresh.lease_owner.as_deref()),
        (None, Some("a"))
    );
    assert!(
        store
            .checkpoint_position(&key, "a", &position)
            .await
            .unwrap()
    );

    let Claim::Held(held) = store.acquire_and_read(&key, "b", TTL, None).await.unwrap() else {
        panic!("a holds the lease");
    };
    assert_eq!(held.lease_owner.as_deref(), Some("a"));
    assert_eq!(held.position().unwrap(), Some(position.clone()));

    let next = Position::record(sequence(41).parse().unwrap());
    assert!(
        !store
            .commit(&key, "b", &common::checkpoint_at(Some(&next)))
            .await
            .unwrap(),
        "b is not the owner"
    );
    assert!(
        store
            .commit(&key, "a", &common::checkpoint_at(Some(&next)))
            .await
            .unwrap()
    );
    let Claim::Acquired { state: after, .. } =
        store.acquire_and_read(&key, "b", TTL, None).await.unwrap()
    else {
        panic!("a released the lease");
    };
    assert_eq!(
        after.position().unwrap(),
        Some(next),
        "a whole-record checkpoint clears the aggregate's progress"
    );
    assert!(after.lease_counter > held.lease_counter);
}

#[tokio::test]
async fn the_claim_marks_the_batch_it_attempts_and_a_claim_of_a_lapsed_lease_returns_its_mark() {
    let (store, client, table) = table().await;
    let key = LeaseKey::new("orders", SHARD);
    let first = Position::record(sequence(7).parse().unwrap());
    let later = Position::record(sequence(9).parse().unwrap());

    let Claim::Acquired {
        state: claimed,
        lapsed_mark,
    } = store
        .acquire_and_read(&key, "a", Duration::from_millis(1), Some(&first))
        .await
        .unwrap()
    else {
        panic!("the row did not exist");
    };
    assert_eq!(
        claimed.reported,
        Some(first.clone()),
        "the row after the claim"
    );
    assert_eq!(claimed.lease_owner.as_deref(), Some("a"));
    assert_eq!(claimed.lease_counter, 1);
    assert_eq!(lapsed_mark, None, "the lease was free");
    let raw = raw_row(&client, &table, &key.to_string()).await;
    assert_eq!(raw["reported"], AttributeValue::S(sequence(7)));

    // a dies: its lease lapses without a release, and the next claim finds its mark.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let Claim::Acquired {
        state: again,
        lapsed_mark,
    } = store
        .acquire_and_read(&key, "b", TTL, Some(&later))
        .await
        .unwrap()
    else {
        panic!("a's lease lapsed");
    };
    assert_eq!(lapsed_mark, Some(first.clone()), "where a died");
    assert_eq!(again.reported, Some(first), "the older mark is kept");
    assert_eq!(again.lease_owner.as_deref(), Some("b"));
    assert_eq!(again.lease_counter, 2, "as the row now holds it");
    assert_eq!(store.read(&key).await.unwrap(), again);

    // Released, the lease is free: a claim after a release finds no death.
    assert!(store.commit(&key, "b", &Commit::default()).await.unwrap());
    let Claim::Acquired { lapsed_mark, .. } = store
        .acquire_and_read(&key, "c", TTL, Some(&later))
        .await
        .unwrap()
    else {
        panic!("b released the lease");
    };
    assert_eq!(lapsed_mark, None);
}

/// A row an earlier version wrote keeps attributes nothing reads any more: it still reads, and
/// the next last write drops them.
#[tokio::test]
async fn attributes_of_earlier_versions_are_ignored_and_dropped_by_the_next_write() {
    let (store, client, table) = table().await;
    let key = LeaseKey::new("orders", SHARD);
    client
        .put_item()
        .table_name(&table)
        .item("lease_key", AttributeValue::S(key.to_string()))
        .item("checkpoint", AttributeValue::S(sequence(3)))
        .item("lease_counter", AttributeValue::N("4".to_owned()))
        .item("contended", AttributeValue::S(sequence(5)))
        .item("contended_done", AttributeValue::S(sequence(2)))
        .item(
            "open_marks",
            AttributeValue::Ss(vec![format!("{}@1", sequence(4))]),
        )
        .send()
        .await
        .unwrap();
    let Claim::Acquired { state, .. } = store.acquire_and_read(&key, "a", TTL, None).await.unwrap()
    else {
        panic!("the row is free");
    };
    assert_eq!(
        state.position().unwrap(),
        Some(Position::record(sequence(3).parse().unwrap())),
        "the checkpoint names a record done whole"
    );
    let next = Position::record(sequence(6).parse().unwrap());
    assert!(
        store
            .commit(&key, "a", &common::checkpoint_at(Some(&next)))
            .await
            .unwrap()
    );
    let raw = raw_row(&client, &table, &key.to_string()).await;
    for gone in ["contended", "contended_done", "open_marks"] {
        assert!(!raw.contains_key(gone), "{gone} is dropped: {raw:?}");
    }
    assert_eq!(raw["checkpoint"], AttributeValue::S(sequence(6)));
}

#[tokio::test]
async fn a_table_of_bare_shard_rows_is_read_only_for_the_named_stream() {
    let (store, client, table) = table().await;
    client
        .put_item()
        .table_name(&table)
        .item("lease_key", AttributeValue::S(SHARD.to_owned()))
        .item("checkpoint", AttributeValue::S(sequence(4)))
        .send()
        .await
        .unwrap();

    // 1. Named stream: the bare row's checkpoint is used and copied under the stream's key.
    let seen = Seen::default();
    let orders = seen.processor(store.clone().legacy_stream("orders"), None);
    let response = orders
        .process(batch("orders", SHARD, 0..8), &context("r1", 60_000))
        .await
        .unwrap();
    assert!(reported(&response).is_empty());
    assert_eq!(
        seen.all(),
        vec![5, 6, 7],
        "records at or below the bare row's checkpoint are done"
    );
    let copied = raw_row(&client, &table, "orders:shardId-000000000000").await;
    assert_eq!(copied["checkpoint"].as_s().unwrap(), &sequence(7));

    // 2. Another stream ignores the bare row.
    let seen = Seen::default();
    let refunds = seen.processor(store.clone().legacy_stream("orders"), None);
    refunds
        .process(batch("refunds", SHARD, 0..3), &context("r2", 60_000))
        .await
        .unwrap();
    assert_eq!(seen.all(), vec![0, 1, 2]);

    // 3. No stream named: the bare row is refused with an error an operator can act on.
    let error = store
        .read(&LeaseKey::new("payments", SHARD))
        .await
        .unwrap_err();
    let legacy = error
        .downcast_ref::<UnattributedLegacyRow>()
        .expect("the typed refusal");
    let message = legacy.to_string();
    assert!(
        message.contains(&table) && message.contains(SHARD) && message.contains("'payments'"),
        "{message}"
    );
    let seen = Seen::default();
    let payments = seen.processor(store.clone(), None);
    let report = payments
        .process_batch(batch("payments", SHARD, 0..3), &context("r3", 60_000))
        .await
        .unwrap();
    assert!(seen.all().is_empty(), "nothing runs on an unattributed row");
    assert!(
        matches!(&report.shards[0].stopped, Some((_, StopReason::Store(e))) if e.contains("legacy_stream"))
    );
    let row = raw_row(&client, &table, "payments:shardId-000000000000").await;
    assert!(
        !row.contains_key("lease_owner"),
        "the refused claim released its lease"
    );
}

#[tokio::test]
async fn redelivery_after_full_and_after_partial_success_processes_nothing_twice() {
    let (store, client, table) = table().await;
    let seen = Seen::default();
    let processor = seen.processor(store, Some(6));
    let first = batch("orders", SHARD, 0..5);
    let second = batch("orders", SHARD, 5..10);

    processor
        .process(first.clone(), &context("r1", 60_000))
        .await
        .unwrap();
    let again = processor
        .process(first, &context("r2", 60_000))
        .await
        .unwrap();
    assert!(reported(&again).is_empty());

    let partial = processor
        .process(second.clone(), &context("r3", 60_000))
        .await
        .unwrap();
    assert_eq!(reported(&partial), vec![sequence(6)]);
    processor
        .process(second.clone(), &context("r4", 60_000))
        .await
        .unwrap();
    let rest = processor
        .process(
            redeliver_from(&second, &sequence(6)),
            &context("r5", 60_000),
        )
        .await
        .unwrap();

    assert!(reported(&rest).is_empty());
    assert_eq!(
        seen.all(),
        (0..10).collect::<Vec<_>>(),
        "every record once, in order"
    );
    let row = raw_row(&client, &table, "orders:shardId-000000000000").await;
    assert_eq!(row["checkpoint"].as_s().unwrap(), &sequence(9));
}

#[tokio::test]
async fn of_two_deliveries_of_one_shard_at_once_only_one_processes() {
    let (store, _client, _table) = table().await;
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let gate = Arc::new(Mutex::new((Some(inside_tx), Some(go_rx))));
    let first_seen = Seen::default();
    let recorder = first_seen.clone();
    // The first delivery holds the lease while its handler waits for the second to finish: the
    // interleaving is forced, not left to luck.
    let first = Processor::new(Arc::new(store.clone()), move |record: Record| {
        let (inside, go) = {
            let mut gate = gate.lock().unwrap();
            (gate.0.take(), gate.1.take())
        };
        let recorder = recorder.clone();
        async move {
            if let (Some(inside), Some(go)) = (inside, go) {
                inside.send(()).unwrap();
                go.await.unwrap();
            }
            recorder.0.lock().unwrap().push(n_of(&record));
            Outcome::ack()
        }
    });
    let running = tokio::spawn(async move {
        first
            .process(batch("orders", SHARD, 0..4), &context("first", 60_000))
            .await
    });
    inside_rx.await.unwrap();

    let second_seen = Seen::default();
    let second = second_seen
        .processor(store.clone(), None)
        .process_batch(batch("orders", SHARD, 0..4), &context("second", 60_000))
        .await
        .unwrap();
    go_tx.send(()).unwrap();
    let first_response = running.await.unwrap().unwrap();

    assert!(second_seen.all().is_empty());
    assert_eq!(reported(&second.response()), vec![sequence(0)]);
    assert!(matches!(
        &second.shards[0].stopped,
        Some((_, StopReason::LeaseHeld { owner: Some(owner) })) if owner == "first"
    ));
    assert!(reported(&first_response).is_empty());
    assert_eq!(first_seen.all(), vec![0, 1, 2, 3]);
}

#[tokio::test]
async fn two_streams_with_the_same_shard_ids_share_a_table_without_sharing_progress() {
    let (store, client, table) = table().await;
    let seen = Seen::default();
    let processor = seen.processor(store, None);

    processor
        .process(batch("orders", SHARD, 0..3), &context("r1", 60_000))
        .await
        .unwrap();
    processor
        .process(batch("refunds", SHARD, 0..6), &context("r2", 60_000))
        .await
        .unwrap();
    processor
        .process(batch("orders", SHARD, 0..3), &context("r3", 60_000))
        .await
        .unwrap();

    assert_eq!(seen.all(), vec![0, 1, 2, 0, 1, 2, 3, 4, 5]);
    let orders = raw_row(&client, &table, "orders:shardId-000000000000").await;
    let refunds = raw_row(&client, &table, "refunds:shardId-000000000000").await;
    assert_eq!(orders["checkpoint"].as_s().unwrap(), &sequence(2));
    assert_eq!(refunds["checkpoint"].as_s().unwrap(), &sequence(5));
}

#[tokio::test]
async fn a_store_that_cannot_be_reached_reports_the_first_record_with_table_and_key() {
    // Nothing listens on this port: every request fails at once.
    let config = common::moto::sdk_config("http://127.0.0.1:9", 1).await;
    let store = DynamoLeaseStore::new(&config, "leases");
    let seen = Seen::default();

    let report = seen
        .processor(store, None)
        .process_batch(batch("orders", SHARD, 0..3), &context("r1", 60_000))
        .await
        .unwrap();

    assert!(seen.all().is_empty());
    let Some((at, StopReason::Store(error))) = &report.shards[0].stopped else {
        panic!("the claim failed: {report:?}");
    };
    assert_eq!(at.as_str(), sequence(0));
    assert!(
        error.contains("'leases'") && error.contains("orders:shardId-000000000000"),
        "{error}"
    );
}
