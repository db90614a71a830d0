//! The memory store's own tests.

use super::*;
use crate::sequence::SHARD_END;

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
