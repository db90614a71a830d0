//! The writes every layered store must hand to its inner store unchanged, checked field by
//! field. Used by `tests/layers.rs`.
//!
//! A layer that rebuilds a write and forgets a field (the failing record, the records done
//! above the checkpoint, the parents, the reported record, keeping the lease) loses it silently: nothing
//! fails until a redelivery runs a record twice or skips one. One check, used by the crate's
//! own layers and by the test layers of its integration tests, so the two cannot drift apart
//! as the writes gain fields: every field of every write goes through the layer and is read
//! back from the memory store behind it.

use std::time::Duration;

use kinesis_checkpoint::internal::{
    Below, Claim, Commit, FailingChange, KeyCommit, ReportedChange,
};
use kinesis_checkpoint::sequence::{Position, SHARD_END};
use kinesis_checkpoint::store::{CheckpointStore, FailingRecord};
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore};

fn at(sequence: &str) -> Position {
    Position::record(sequence.parse().expect("a sequence number"))
}

/// Claims, commits, finishes, marks and writes rows through `store`, and checks that
/// `inner`, the memory store behind it, holds every field each write carried; with the
/// feature `dynamodb`, transactions too. Panics, naming the field, when one was lost.
pub async fn reach(store: &dyn CheckpointStore, inner: &MemoryLeaseStore) {
    claim_and_commit(store, inner).await;
    finish(store, inner).await;
    rows(store, inner).await;
    transaction(store, inner).await;
    rows_transaction(store, inner).await;
    assert_eq!(store.requests(), inner.requests());
}

/// The claim, a renew, a mark that keeps the lease, and the last write.
async fn claim_and_commit(store: &dyn CheckpointStore, inner: &MemoryLeaseStore) {
    const TTL: Duration = Duration::from_mins(1);
    let key = LeaseKey::new("orders", "shardId-000000000001");
    let attempting = at("100");
    let Claim::Acquired { state: claimed, .. } = store
        .acquire_and_read(&key, "a", TTL, Some(&attempting))
        .await
        .expect("claim")
    else {
        panic!("the lease was free");
    };
    assert_eq!(claimed.reported, Some(attempting.clone()), "attempting");
    assert_eq!(
        inner.read(&key).await.expect("read").reported,
        Some(attempting)
    );
    assert!(store.renew(&key, "a", TTL).await.expect("renew"));
    let mark = Commit {
        reported: ReportedChange::Set(at("150")),
        keep_lease: true,
        ..Commit::default()
    };
    assert!(store.commit(&key, "a", &mark).await.expect("mark"));
    let row = inner.read(&key).await.expect("read");
    assert_eq!(row.reported, Some(at("150")), "the mark's reported");
    assert_eq!(row.lease_owner.as_deref(), Some("a"), "keep_lease");

    let failing = FailingRecord::first(
        &Position::sub_record("300".parse().expect("n"), 2),
        "busy",
        7,
    );
    let commit = Commit {
        checkpoint: Some(Position::sub_record("300".parse().expect("n"), 1)),
        below: Below::Record("200".parse().expect("n")),
        failing: FailingChange::Set(failing.clone()),
        parent_shards: vec!["shardId-000000000000".to_owned()],
        // Ignored beside a list of parents; the stores' own tests write it alone.
        parentless: false,
        done_above: Some(vec![at("400"), at("500")]),
        reported: ReportedChange::Set(at("301")),
        keep_lease: false,
    };
    assert!(store.commit(&key, "a", &commit).await.expect("commit"));
    let row = inner.read(&key).await.expect("read");
    assert_eq!(row.checkpoint.as_deref(), Some("200"), "checkpoint");
    assert_eq!(
        (row.aggregate_sequence.as_deref(), row.aggregate_sub),
        (Some("300"), Some(1)),
        "the position inside the aggregate"
    );
    assert_eq!(row.failing, Some(failing.clone()), "failing");
    assert_eq!(row.parent_shards, commit.parent_shards, "parents");
    assert_eq!(row.done_above, vec![at("400"), at("500")], "done_above");
    assert_eq!(row.reported, Some(at("301")), "reported");
    assert_eq!(row.lease_owner, None, "released");
    assert_eq!(
        store.read(&key).await.expect("read"),
        row,
        "read through the layer"
    );
}

/// The gate's `finish`, after a commit.
async fn finish(store: &dyn CheckpointStore, inner: &MemoryLeaseStore) {
    const TTL: Duration = Duration::from_mins(1);
    let done = LeaseKey::new("orders", "shardId-000000000002");
    let Claim::Acquired { .. } = store
        .acquire_and_read(&done, "a", TTL, None)
        .await
        .expect("claim")
    else {
        panic!("the lease was free");
    };
    assert!(
        store
            .commit(
                &done,
                "a",
                &Commit {
                    checkpoint: Some(at("700")),
                    // Written alone: beside a list of parents it means nothing.
                    parentless: true,
                    ..Commit::default()
                }
            )
            .await
            .expect("commit")
    );
    assert!(
        inner.read(&done).await.expect("read").parentless,
        "parentless"
    );
    assert!(
        store
            .finish(&done, Some("700"), 1_900_000_000)
            .await
            .expect("finish")
    );
    let row = inner.read(&done).await.expect("read");
    assert_eq!(
        (row.checkpoint.as_deref(), row.expires_at),
        (Some(SHARD_END), Some(1_900_000_000)),
        "expires_at"
    );
}

/// The partition-key mode's rows.
async fn rows(store: &dyn CheckpointStore, inner: &MemoryLeaseStore) {
    let failing = FailingRecord::first(
        &Position::sub_record("300".parse().expect("n"), 2),
        "busy",
        7,
    );
    let rows = [
        LeaseKey::new("orders", "shardId-000000000003:k1"),
        LeaseKey::new("orders", "shardId-000000000003:k2"),
    ];
    let mut first = KeyCommit::new(rows[0].clone(), 0);
    first.checkpoint = Some(Position::sub_record("800".parse().expect("n"), 3));
    first.below = Below::Record("799".parse().expect("n"));
    first.failing = FailingChange::Set(failing.clone());
    first.expires_at = Some(1_900_000_001);
    let mut second = KeyCommit::new(rows[1].clone(), 5);
    second.checkpoint = Some(at("900"));
    assert_eq!(
        store.commit_rows(&[first, second]).await.expect("rows"),
        [true, false],
        "the counter of each row compared"
    );
    let read = store.read_rows(&rows).await.expect("rows");
    assert_eq!(
        read[0],
        inner.read(&rows[0]).await.expect("read"),
        "as the inner store has it"
    );
    assert_eq!(read[0].checkpoint.as_deref(), Some("799"));
    assert_eq!(read[0].aggregate_sequence.as_deref(), Some("800"));
    assert_eq!(read[0].failing, Some(failing), "a key's failing");
    assert_eq!(
        read[0].expires_at,
        Some(1_900_000_001),
        "a key's expires_at"
    );
    assert_eq!(
        read[1].checkpoint, None,
        "a row written meanwhile is not overwritten"
    );
}

/// A transaction: its commit with every field and the release, its write, its token.
async fn transaction(store: &dyn CheckpointStore, inner: &MemoryLeaseStore) {
    use aws_sdk_dynamodb::types::{AttributeValue, Update};
    use kinesis_checkpoint::effects::{ItemId, Write};
    use kinesis_checkpoint::internal::{Transacted, Transaction};

    const TTL: Duration = Duration::from_mins(1);
    let key = LeaseKey::new("orders", "shardId-000000000004");
    let Claim::Acquired { .. } = store
        .acquire_and_read(&key, "a", TTL, None)
        .await
        .expect("claim")
    else {
        panic!("the lease was free");
    };
    let failing = FailingRecord::first(&at("1002"), "busy", 7);
    let commit = Commit {
        checkpoint: Some(Position::sub_record("1001".parse().expect("n"), 4)),
        below: Below::Record("1000".parse().expect("n")),
        failing: FailingChange::Set(failing.clone()),
        parent_shards: vec!["shardId-000000000000".to_owned()],
        parentless: false,
        done_above: Some(vec![at("1005")]),
        reported: ReportedChange::Set(at("1002")),
        keep_lease: false,
    };
    let item =
        std::collections::HashMap::from([("id".to_owned(), AttributeValue::S("i-1".to_owned()))]);
    let write = Write::update(
        Update::builder()
            .table_name("items")
            .set_key(Some(item.clone()))
            .update_expression("ADD n :one")
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .build()
            .expect("an update"),
    );
    let transaction = Transaction::new(commit.clone(), vec![write], "kc-every-field".to_owned());
    for _ in 0..2 {
        assert_eq!(
            store
                .transact(&key, "a", &transaction)
                .await
                .expect("transact"),
            Transacted::Committed,
            "committed, then answered again for its token"
        );
    }
    let row = inner.read(&key).await.expect("read");
    assert_eq!(row.checkpoint.as_deref(), Some("1000"), "checkpoint");
    assert_eq!(
        (row.aggregate_sequence.as_deref(), row.aggregate_sub),
        (Some("1001"), Some(4)),
        "the position inside the aggregate"
    );
    assert_eq!(row.failing, Some(failing), "failing");
    assert_eq!(row.parent_shards, commit.parent_shards, "parents");
    assert_eq!(row.done_above, vec![at("1005")], "done_above");
    assert_eq!(row.reported, Some(at("1002")), "reported");
    assert_eq!(row.lease_owner, None, "released");
    let id = ItemId::new("items", &item);
    assert_eq!(inner.writes_of(&id), 1, "the write, once for its token");
}

/// A partition-key transaction: a key's row with every field, a write, the token; a stale
/// counter fenced with nothing landed.
async fn rows_transaction(store: &dyn CheckpointStore, inner: &MemoryLeaseStore) {
    use aws_sdk_dynamodb::types::{AttributeValue, Update};
    use kinesis_checkpoint::effects::{ItemId, Write};
    use kinesis_checkpoint::internal::{RowsTransacted, RowsTransaction};

    let row = LeaseKey::new("orders", "shardId-000000000005:k1");
    let failing = FailingRecord::first(&at("1102"), "busy", 7);
    let mut commit = KeyCommit::new(row.clone(), 0);
    commit.checkpoint = Some(Position::sub_record("1101".parse().expect("n"), 2));
    commit.below = Below::Record("1100".parse().expect("n"));
    commit.failing = FailingChange::Set(failing.clone());
    commit.expires_at = Some(1_900_000_002);
    let item =
        std::collections::HashMap::from([("id".to_owned(), AttributeValue::S("i-2".to_owned()))]);
    let write = Write::update(
        Update::builder()
            .table_name("items")
            .set_key(Some(item.clone()))
            .update_expression("ADD n :one")
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .build()
            .expect("an update"),
    );
    let transaction =
        RowsTransaction::new(vec![commit], vec![write], "kc-every-field-rows".to_owned());
    for _ in 0..2 {
        assert_eq!(
            store
                .transact_rows(&transaction)
                .await
                .expect("transact rows"),
            RowsTransacted::Committed,
            "committed, then answered again for its token"
        );
    }
    let read = inner.read(&row).await.expect("read");
    assert_eq!(read.checkpoint.as_deref(), Some("1100"), "checkpoint");
    assert_eq!(
        (read.aggregate_sequence.as_deref(), read.aggregate_sub),
        (Some("1101"), Some(2)),
        "the position inside the aggregate"
    );
    assert_eq!(read.failing, Some(failing), "failing");
    assert_eq!(read.expires_at, Some(1_900_000_002), "expires_at");
    let id = ItemId::new("items", &item);
    assert_eq!(inner.writes_of(&id), 1, "the write, once for its token");
    let mut stale = transaction.clone();
    "kc-every-field-rows-2".clone_into(&mut stale.token);
    assert_eq!(
        store.transact_rows(&stale).await.expect("transact rows"),
        RowsTransacted::Fenced(vec![0]),
        "the row's counter moved"
    );
    assert_eq!(inner.writes_of(&id), 1, "nothing of a fenced transaction");
}
