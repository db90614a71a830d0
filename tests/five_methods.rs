//! A lease store with the seed crate's five methods only (`acquire`, `renew`, `checkpoint`,
//! `read`, `release`), as a store written for the seed crate has, reaches the engine through
//! `SeedStore`, the one adapter: none of its operations loses a record or leaves a shard stuck,
//! and what its documentation says it cannot keep, it does not. The store is `MemoryLeaseStore`
//! seen through `SeedStore`, which is bound to the five methods (`S: LeaseStore`) and so cannot
//! reach the memory store's own `CheckpointStore`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::aggregates::{
    PARENT, Ran, STREAM, event_of, inside, noting, process, split_after_an_aggregate,
    ten_sub_records, whole,
};
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::internal::{
    Below, Claim, Commit, FailingChange, KeyCommit, ReportedChange,
};
use kinesis_checkpoint::report::StopReason;
use kinesis_checkpoint::store::{CheckpointStore, FailingRecord, LeaseStore, SeedStore};
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Processor};
use kinesis_checkpoint_testing::local::MemoryStream;

const TTL: Duration = Duration::from_mins(1);

#[tokio::test]
async fn with_the_five_seed_methods_a_batch_ending_in_an_aggregate_is_checkpointed_whole() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let stream = MemoryStream::new(STREAM, 1);
    let plain = stream.put("plain", "before");
    let (outer_key, aggregate_bytes) = ten_sub_records();
    let aggregate = stream.put(&outer_key, aggregate_bytes);
    let ran = Ran::default();
    let processor = Processor::new(Arc::new(SeedStore::new(memory.clone())), noting(&ran, None));
    let key = LeaseKey::new(STREAM, PARENT);

    let first = process(&processor, event_of(&stream, PARENT, None), "r1").await;
    assert_eq!(first.checkpoint, Some(whole(&aggregate)));
    let row = memory.read(&key).await.unwrap();
    assert_eq!(
        (row.checkpoint.as_deref(), row.lease_owner),
        (Some(aggregate.as_str()), None)
    );
    let again = process(&processor, event_of(&stream, PARENT, None), "r2").await;
    assert_eq!(
        again.count(kinesis_checkpoint::report::Disposition::Duplicate),
        11
    );
    assert_eq!(
        ran.lock().unwrap().len(),
        11,
        "{plain} and ten sub-records, once"
    );
}

#[tokio::test]
async fn with_the_five_seed_methods_a_batch_stopping_inside_an_aggregate_checkpoints_the_record_before_it()
 {
    let memory = Arc::new(MemoryLeaseStore::new());
    let stream = MemoryStream::new(STREAM, 1);
    let plain = stream.put("plain", "before");
    let (outer_key, aggregate_bytes) = ten_sub_records();
    let aggregate = stream.put(&outer_key, aggregate_bytes);
    let ran = Ran::default();
    let processor = Processor::new(
        Arc::new(SeedStore::new(memory.clone())),
        noting(&ran, Some(4)),
    );
    let key = LeaseKey::new(STREAM, PARENT);

    process(&processor, event_of(&stream, PARENT, None), "r1").await;
    let row = memory.read(&key).await.unwrap();
    assert_eq!(
        (
            row.checkpoint.as_deref(),
            row.aggregate_sequence,
            row.lease_owner
        ),
        (Some(plain.as_str()), None, None),
        "the record before the aggregate; the five methods cannot keep the aggregate's progress"
    );
    let again = process(&processor, event_of(&stream, PARENT, None), "r2").await;
    assert_eq!(again.stopped, None);
    assert_eq!(
        memory.read(&key).await.unwrap().checkpoint.as_deref(),
        Some(aggregate.as_str())
    );
    // The documented duplicate: sub-records 0 to 3 ran before the redelivery and again.
    let ran = ran.lock().unwrap();
    assert_eq!(ran.iter().filter(|r| **r == plain).count(), 1);
    assert_eq!(ran.len(), 1 + 4 + 10);
}

#[tokio::test]
async fn with_the_five_seed_methods_a_parent_ending_in_an_aggregate_lets_its_child_run() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let (stream, _plain, aggregate, child) = split_after_an_aggregate();
    let ran = Ran::default();
    let gate = Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon);
    let processor = Processor::new(
        Arc::new(SeedStore::new(memory.clone())),
        noting(&ran, Some(4)),
    )
    .gate(gate);

    process(&processor, event_of(&stream, PARENT, None), "r1").await;
    let held = process(&processor, event_of(&stream, &child, None), "r2").await;
    assert!(matches!(held.stopped, Some((_, StopReason::Held(_)))));
    process(
        &processor,
        event_of(&stream, PARENT, Some(&aggregate)),
        "r3",
    )
    .await;
    let runs = process(&processor, event_of(&stream, &child, None), "r4").await;
    assert_eq!(runs.stopped, None, "not held until the parent expires");
    let parent = memory.read(&LeaseKey::new(STREAM, PARENT)).await.unwrap();
    assert_eq!(
        (parent.checkpoint.as_deref(), parent.lease_owner),
        (Some(kinesis_checkpoint::sequence::SHARD_END), None)
    );
}

#[tokio::test]
async fn with_the_five_seed_methods_the_partition_key_mode_checkpoints_each_key_whole() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let stream = MemoryStream::new(STREAM, 1);
    let (outer_key, aggregate_bytes) = ten_sub_records();
    let aggregate = stream.put(&outer_key, aggregate_bytes);
    let ran = Ran::default();
    let processor =
        Processor::by_partition_key(Arc::new(SeedStore::new(memory.clone())), noting(&ran, None));

    process(&processor, event_of(&stream, PARENT, None), "r1").await;
    // Lambda keeps order per the key it routes by, the aggregate's own: its row names the
    // aggregate done whole, and no sub-record's own key has a row.
    let shard = LeaseKey::new(STREAM, PARENT);
    let row = |partition_key: &str| kinesis_checkpoint::internal::row_key(&shard, partition_key);
    let routed = memory.read(&row(&outer_key)).await.unwrap();
    assert_eq!(
        (
            routed.checkpoint.as_deref(),
            routed.aggregate_sequence,
            routed.lease_owner
        ),
        (Some(aggregate.as_str()), None, None),
        "the aggregate is its routing key's, done whole"
    );
    for own_key in (0..10).map(|sub| format!("order-{sub}")) {
        if own_key == outer_key {
            continue;
        }
        let own = memory.read(&row(&own_key)).await.unwrap();
        assert_eq!(own.checkpoint, None, "{own_key} has no row of its own");
    }
    let again = process(&processor, event_of(&stream, PARENT, None), "r2").await;
    assert_eq!(
        again.count(kinesis_checkpoint::report::Disposition::Duplicate),
        10
    );
    assert_eq!(ran.lock().unwrap().len(), 10);
}

/// The claim and the last write, built from the five methods.
#[tokio::test]
async fn the_claim_and_the_last_write_work_on_the_five_seed_methods() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = SeedStore::new(memory.clone());
    let key = LeaseKey::new(STREAM, PARENT);
    let (p, s) = ("4900000001", "4900000002");

    let Claim::Acquired { state, .. } = store.acquire_and_read(&key, "a", TTL, None).await.unwrap()
    else {
        panic!("free");
    };
    assert_eq!(state.lease_owner.as_deref(), Some("a"));
    let Claim::Held(held) = store.acquire_and_read(&key, "b", TTL, None).await.unwrap() else {
        panic!("a holds it");
    };
    assert_eq!(held.lease_owner.as_deref(), Some("a"));
    assert!(store.renew(&key, "a", TTL).await.unwrap());
    assert!(!store.renew(&key, "b", TTL).await.unwrap(), "b is fenced");

    assert!(
        !store
            .commit(&key, "b", &common::checkpoint_at(Some(&whole(s))))
            .await
            .unwrap(),
        "b is fenced"
    );
    assert!(
        store
            .commit(&key, "a", &common::checkpoint_at(Some(&whole(p))))
            .await
            .unwrap()
    );
    assert_eq!(
        memory.read(&key).await.unwrap().checkpoint.as_deref(),
        Some(p)
    );
    assert!(memory.acquire(&key, "a", TTL).await.unwrap());
    assert!(
        store
            .commit(&key, "a", &common::checkpoint_at(Some(&inside(s, 3))))
            .await
            .unwrap(),
        "a position inside an aggregate checks the lease only"
    );
    let row = memory.read(&key).await.unwrap();
    assert_eq!(
        (
            row.checkpoint.as_deref(),
            row.aggregate_sequence,
            row.lease_owner
        ),
        (Some(p), None, None)
    );

    let commit = Commit {
        checkpoint: Some(inside(s, 5)),
        below: Below::Record(p.parse().unwrap()),
        ..Commit::default()
    };
    assert!(memory.acquire(&key, "a", TTL).await.unwrap());
    assert!(store.commit(&key, "a", &commit).await.unwrap());
    let row = memory.read(&key).await.unwrap();
    assert_eq!(
        (row.checkpoint.as_deref(), row.lease_owner),
        (Some(p), None),
        "released"
    );
    assert!(
        !store.commit(&key, "a", &commit).await.unwrap(),
        "no longer a's"
    );

    assert!(memory.acquire(&key, "a", TTL).await.unwrap());
    assert!(
        store
            .commit(&key, "a", &common::checkpoint_at(Some(&whole(s))))
            .await
            .unwrap()
    );
    assert_eq!(
        memory.read(&key).await.unwrap().checkpoint.as_deref(),
        Some(s)
    );
}

/// `finish`, `read_rows` and `commit_rows`, built from the five methods.
#[tokio::test]
async fn finish_and_the_rows_work_on_the_five_seed_methods() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = SeedStore::new(memory.clone());
    let key = LeaseKey::new(STREAM, PARENT);
    let (p, s) = ("4900000001", "4900000002");
    assert!(memory.acquire(&key, "a", TTL).await.unwrap());
    assert!(
        store
            .commit(&key, "a", &common::checkpoint_at(Some(&whole(s))))
            .await
            .unwrap()
    );

    // `finish` refuses a row with something left undone (written by a full store beside it).
    let mut undone = Commit {
        failing: FailingChange::Set(FailingRecord::first(&whole("4900000003"), "busy", 1)),
        ..Commit::default()
    };
    assert!(memory.acquire(&key, "full", TTL).await.unwrap());
    assert!(memory.commit(&key, "full", &undone).await.unwrap());
    assert!(!store.finish(&key, Some(s), 1).await.unwrap());
    undone.failing = FailingChange::Clear;
    assert!(memory.acquire(&key, "full", TTL).await.unwrap());
    assert!(memory.commit(&key, "full", &undone).await.unwrap());
    assert!(
        !store.finish(&key, Some(p), 1).await.unwrap(),
        "the checkpoint moved"
    );
    assert!(store.finish(&key, Some(s), 1).await.unwrap());
    let row = memory.read(&key).await.unwrap();
    assert_eq!(
        (row.checkpoint.as_deref(), row.lease_owner),
        (Some(kinesis_checkpoint::sequence::SHARD_END), None)
    );

    let rows = [
        LeaseKey::new(STREAM, "shardId-000000000009:k1"),
        LeaseKey::new(STREAM, "shardId-000000000009:k2"),
    ];
    let mut first = KeyCommit::new(rows[0].clone(), 0);
    first.checkpoint = Some(inside(s, 2));
    first.below = Below::Record(p.parse().unwrap());
    let mut second = KeyCommit::new(rows[1].clone(), 0);
    second.checkpoint = Some(whole(s));
    assert_eq!(
        store.commit_rows(&[first, second]).await.unwrap(),
        [true, true]
    );
    let read = store.read_rows(&rows).await.unwrap();
    assert_eq!(
        (read[0].checkpoint.as_deref(), read[1].checkpoint.as_deref()),
        (Some(p), Some(s))
    );
    assert_eq!(
        (
            read[0].lease_owner.as_deref(),
            read[1].lease_owner.as_deref()
        ),
        (None, None)
    );
    assert_eq!(store.requests(), None);
}

/// What `SeedStore`'s documentation says five methods cannot keep, it does not keep: the
/// failing record, `done_above`, the parents, `expires_at`, the reported record,
/// progress inside an aggregate, the counters of `commit_rows`, and the request count. The same
/// writes on the memory store's own `CheckpointStore` keep every one, so each assertion here is
/// about the adapter.
#[tokio::test]
async fn the_seed_store_keeps_only_what_five_methods_can_and_says_what_it_drops() {
    let full = MemoryLeaseStore::new();
    let memory = Arc::new(MemoryLeaseStore::new());
    let seed = SeedStore::new(memory.clone());
    let stores: [(&dyn CheckpointStore, bool); 2] = [(&full, true), (&seed, false)];
    let key = LeaseKey::new(STREAM, PARENT);
    let (p, s) = ("4900000001", "4900000002");
    let attempting = whole(p);

    for (store, keeps) in stores {
        let Claim::Acquired { state: claimed, .. } = store
            .acquire_and_read(&key, "a", TTL, Some(&attempting))
            .await
            .unwrap()
        else {
            panic!("free");
        };
        assert_eq!(
            claimed.reported.is_some(),
            keeps,
            "the claim's `attempting`"
        );

        let commit = Commit {
            checkpoint: Some(inside(s, 4)),
            below: Below::Record(p.parse().unwrap()),
            failing: FailingChange::Set(FailingRecord::first(&inside(s, 5), "busy", 7)),
            parent_shards: vec!["shardId-000000000000".to_owned()],
            done_above: Some(vec![inside(s, 7)]),
            reported: ReportedChange::Set(inside(s, 5)),
            ..Commit::default()
        };
        assert!(store.commit(&key, "a", &commit).await.unwrap());
        let row = store.read(&key).await.unwrap();
        assert_eq!(
            row.checkpoint.as_deref(),
            Some(p),
            "the record done whole is kept"
        );
        assert_eq!(row.lease_owner, None, "and the lease released");
        assert_eq!(row.failing.is_some(), keeps, "failing: {row:?}");
        assert_eq!(row.parent_shards.is_empty(), !keeps, "parents: {row:?}");
        assert_eq!(row.done_above.is_empty(), !keeps, "done_above: {row:?}");
        assert_eq!(
            row.reported == Some(inside(s, 5)),
            keeps,
            "reported: {row:?}"
        );
        assert_eq!(
            row.aggregate_sequence.as_deref() == Some(s),
            keeps,
            "progress inside the aggregate: {row:?}"
        );

        // Done whole and nothing failing: finishable by both.
        let done = Commit {
            checkpoint: Some(whole(s)),
            failing: FailingChange::Clear,
            ..Commit::default()
        };
        let Claim::Acquired { .. } = store.acquire_and_read(&key, "a", TTL, None).await.unwrap()
        else {
            panic!("released");
        };
        assert!(store.commit(&key, "a", &done).await.unwrap());
        assert!(store.finish(&key, Some(s), 1_900_000_000).await.unwrap());
        let row = store.read(&key).await.unwrap();
        assert_eq!(
            row.checkpoint.as_deref(),
            Some(kinesis_checkpoint::sequence::SHARD_END)
        );
        assert_eq!(row.expires_at.is_some(), keeps, "expires_at: {row:?}");

        // A partition key's row written meanwhile by another invocation (its counter moved).
        let row_key = LeaseKey::new(STREAM, "shardId-000000000009:k1");
        let mut meanwhile = KeyCommit::new(row_key.clone(), 0);
        meanwhile.checkpoint = Some(whole(p));
        assert_eq!(store.commit_rows(&[meanwhile]).await.unwrap(), [true]);
        let mut stale = KeyCommit::new(row_key.clone(), 0);
        stale.checkpoint = Some(whole(s));
        stale.failing = FailingChange::Set(FailingRecord::first(&whole(s), "busy", 7));
        stale.expires_at = Some(1_900_000_000);
        assert_eq!(
            store.commit_rows(&[stale]).await.unwrap(),
            [!keeps],
            "only the full store compares counters"
        );
        let mut fresh = KeyCommit::new(
            row_key.clone(),
            store.read(&row_key).await.unwrap().lease_counter,
        );
        fresh.failing = FailingChange::Set(FailingRecord::first(&whole(s), "busy", 7));
        fresh.expires_at = Some(1_900_000_000);
        assert_eq!(store.commit_rows(&[fresh]).await.unwrap(), [true]);
        let row = &store.read_rows(&[row_key]).await.unwrap()[0];
        assert_eq!(row.failing.is_some(), keeps, "a key's failing: {row:?}");
        assert_eq!(
            row.expires_at.is_some(),
            keeps,
            "a key's expires_at: {row:?}"
        );

        assert_eq!(store.requests(), None, "neither is a billed backend");
    }
}

/// The memory store's own lease and checkpoint semantics.
mod memory_store {
    use std::time::Duration;

    use kinesis_checkpoint::internal::{Claim, Commit};
    use kinesis_checkpoint::sequence::SHARD_END;
    use kinesis_checkpoint::store::{CheckpointStore, LeaseStore};
    use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Position};

    const TTL: Duration = Duration::from_mins(1);

    /// The last write that moves the checkpoint to `position` and changes nothing else.
    fn checkpoint_at(position: Option<&Position>) -> Commit {
        Commit {
            checkpoint: position.cloned(),
            ..Commit::default()
        }
    }

    fn orders(shard: &str) -> LeaseKey {
        LeaseKey::new("orders", shard)
    }

    #[tokio::test]
    async fn a_live_lease_is_exclusive_and_an_expired_one_is_stealable() {
        let store = MemoryLeaseStore::new();
        let shard = orders("shardId-000000000000");
        assert!(store.acquire(&shard, "a", TTL).await.unwrap());
        assert!(!store.acquire(&shard, "b", TTL).await.unwrap());
        assert!(
            store.acquire(&shard, "a", TTL).await.unwrap(),
            "the owner may take its own lease again"
        );

        let store = MemoryLeaseStore::new();
        assert!(store.acquire(&shard, "a", Duration::ZERO).await.unwrap());
        assert!(store.acquire(&shard, "b", TTL).await.unwrap(), "a lapsed");
        assert!(!store.renew(&shard, "a", TTL).await.unwrap(), "a is fenced");
        assert!(!store.checkpoint(&shard, "a", "5").await.unwrap());
        assert_eq!(store.read(&shard).await.unwrap().checkpoint, None);
    }

    #[tokio::test]
    async fn a_checkpoint_outlives_the_release_of_its_lease() {
        let store = MemoryLeaseStore::new();
        let shard = orders("shardId-000000000000");
        assert!(store.acquire(&shard, "a", TTL).await.unwrap());
        assert!(store.checkpoint(&shard, "a", "41").await.unwrap());
        store.release(&shard, "a").await.unwrap();
        let state = store.read(&shard).await.unwrap();
        assert_eq!(state.checkpoint.as_deref(), Some("41"));
        assert_eq!(state.lease_owner, None);
        assert!(
            store.acquire(&shard, "b", TTL).await.unwrap(),
            "released means free"
        );
    }

    #[tokio::test]
    async fn one_shard_id_on_two_streams_is_two_leases_with_two_checkpoints() {
        let store = MemoryLeaseStore::new();
        let orders = LeaseKey::new("orders", "shardId-000000000000");
        let refunds = LeaseKey::new("refunds", "shardId-000000000000");
        assert!(store.acquire(&orders, "a", TTL).await.unwrap());
        assert!(store.acquire(&refunds, "b", TTL).await.unwrap());
        assert!(store.checkpoint(&orders, "a", "41").await.unwrap());
        assert!(store.checkpoint(&refunds, "b", SHARD_END).await.unwrap());
        assert_eq!(
            store.read(&orders).await.unwrap().checkpoint.as_deref(),
            Some("41")
        );
        assert_eq!(
            store.read(&refunds).await.unwrap().checkpoint.as_deref(),
            Some(SHARD_END)
        );
    }

    #[tokio::test]
    async fn every_write_bumps_the_fencing_counter() {
        let store = MemoryLeaseStore::new();
        let shard = orders("shardId-000000000000");
        let position = Position::sub_record("9".parse().unwrap(), 2);
        let Claim::Acquired { state: first, .. } = store
            .acquire_and_read(&shard, "a", TTL, None)
            .await
            .unwrap()
        else {
            panic!("the lease was free");
        };
        assert!(store.renew(&shard, "a", TTL).await.unwrap());
        assert!(
            store
                .commit(&shard, "a", &checkpoint_at(Some(&position)))
                .await
                .unwrap()
        );
        let last = store.read(&shard).await.unwrap();
        assert_eq!(last.lease_counter, first.lease_counter + 3);
        assert_eq!(last.position().unwrap(), Some(position));
    }

    #[tokio::test]
    async fn a_fenced_owner_can_neither_checkpoint_nor_release_the_new_owners_lease() {
        let store = MemoryLeaseStore::new();
        let shard = orders("shardId-000000000000");
        assert!(store.acquire(&shard, "a", Duration::ZERO).await.unwrap());
        let Claim::Acquired { .. } = store
            .acquire_and_read(&shard, "b", TTL, None)
            .await
            .unwrap()
        else {
            panic!("a's lease lapsed");
        };
        let position = Position::record("100".parse().unwrap());
        assert!(
            !store
                .commit(&shard, "a", &checkpoint_at(Some(&position)))
                .await
                .unwrap()
        );
        store.release(&shard, "a").await.unwrap();
        let state = store.read(&shard).await.unwrap();
        assert_eq!(state.lease_owner.as_deref(), Some("b"));
        assert_eq!(state.checkpoint, None);
        let Claim::Held(held) = store
            .acquire_and_read(&shard, "c", TTL, None)
            .await
            .unwrap()
        else {
            panic!("b holds it");
        };
        assert_eq!(held.lease_owner.as_deref(), Some("b"));
    }
}
