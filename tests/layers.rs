//! The tests' store layers (`Faulty`, `Chaos`, `Skewed`) with their faults off hand every field
//! of every write to the store they wrap, unchanged: a test that runs through one runs on the
//! wrapped store's own behaviour, never on a degraded path. With their faults on they do what
//! they say.

mod common;
#[path = "invariants/skew.rs"]
mod skew;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::faults::{Chaos, ChaosLevels, faulty};
use kinesis_checkpoint::store::{CheckpointStore, SeedStore, every_field, row_key};
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Position};

#[tokio::test]
async fn the_fault_layer_with_its_faults_off_hands_every_field_on() {
    let memory = Arc::new(MemoryLeaseStore::new());
    every_field::reach(&faulty(memory.clone()), &memory).await;
}

#[tokio::test]
async fn the_chaos_layer_at_zero_levels_hands_every_field_on() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let chaos = Chaos::new(memory.clone(), ChaosLevels::default(), 7).around_store();
    every_field::reach(&chaos, &memory).await;
    assert_eq!(*chaos.layer().injected.lock().unwrap(), [0; 5]);
}

#[tokio::test]
async fn the_skew_layer_hands_every_field_on_and_shifts_only_the_lease_ttl() {
    let memory = Arc::new(MemoryLeaseStore::new());
    every_field::reach(&skew::skewed(memory.clone(), 0), &memory).await;

    let behind = skew::skewed(memory.clone(), -50_000);
    let key = LeaseKey::new("orders", "shardId-000000000009");
    behind
        .acquire_and_read(&key, "a", Duration::from_mins(1), None)
        .await
        .unwrap();
    let expiry = memory.read(&key).await.unwrap().lease_expiry.unwrap();
    let now = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    assert!(
        expiry <= now + 10_000,
        "a clock 50 s behind writes a lease of 10 s: {expiry} at {now}"
    );
}

/// Through the adapter the chaos layer meets the seed's five methods, as a store written for
/// the seed crate would: a throttled `acquire` fails the claim.
#[tokio::test]
async fn the_chaos_layer_reaches_the_five_methods_under_the_seed_store() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let levels = ChaosLevels {
        throttle: 1.0,
        ..ChaosLevels::default()
    };
    let chaos = Arc::new(Chaos::new(memory.clone(), levels, 7).around_store());
    let seed = SeedStore::new(chaos.clone());
    let key = LeaseKey::new("orders", "shardId-000000000000");
    assert!(
        seed.acquire_and_read(&key, "a", Duration::from_mins(1), None)
            .await
            .is_err()
    );
    assert_eq!(
        chaos.layer().injected.lock().unwrap()[0],
        1,
        "one call throttled"
    );
    assert_eq!(memory.read(&key).await.unwrap().lease_owner, None);
}

/// The chaos layer's aimed throttle refuses readings of rows alone, and answers the reading
/// after a refused one on the same rows, as a throttle refuses one request: the invariant
/// scenarios' family that reads each key's rows against refusals rests on both.
#[tokio::test]
async fn the_chaos_layers_aimed_throttle_refuses_only_readings_of_rows_and_answers_the_next_on_the_same_rows()
 {
    let memory = Arc::new(MemoryLeaseStore::new());
    let levels = ChaosLevels {
        rows_throttle: 1.0,
        ..ChaosLevels::default()
    };
    let chaos = Chaos::new(memory.clone(), levels, 7).around_store();
    let shard = LeaseKey::new("orders", "shardId-000000000000");
    let rows = [row_key(&shard, "a"), row_key(&shard, "b")];
    let claim =
        CheckpointStore::acquire_and_read(&chaos, &shard, "a", Duration::from_mins(1), None).await;
    assert!(claim.is_ok(), "a claim is not aimed at: {claim:?}");
    let refused = CheckpointStore::read_rows(&chaos, &rows).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("ProvisionedThroughputExceededException"),
        "{refused}"
    );
    let answered = CheckpointStore::read_rows(&chaos, &rows).await.unwrap();
    assert_eq!(answered.len(), 2, "the reading after it on the same rows");
    assert!(
        CheckpointStore::read_rows(&chaos, &rows).await.is_err(),
        "and the one after that refused again"
    );
    assert_eq!(
        *chaos.layer().injected.lock().unwrap(),
        [2, 0, 0, 0, 2],
        "two throttles, both aimed at readings of rows"
    );
}

/// The one record of the parent in the test below.
const SEQUENCE: &str = "49000000000000000000000000000000000000000000000000000001";

/// A throttled claim spares the calls its own invocation makes next on the row, the read and
/// the mark of the batch turned away, and no other invocation's: a child reading its parent's
/// row in between used both up, the parent's mark met two throttles, and its batch, given up
/// on by the mapping, was lost (seed 8730157 of the invariant scenarios). Each invocation
/// runs as a task of its own, as the local event source runs them.
#[tokio::test]
async fn the_chaos_layer_spares_the_refused_claimants_read_and_mark_not_another_invocations_reads()
{
    let memory = Arc::new(MemoryLeaseStore::new());
    let levels = ChaosLevels {
        throttle: 1.0,
        ..ChaosLevels::default()
    };
    let chaos = Arc::new(Chaos::new(memory.clone(), levels, 7).around_store());
    let parent = LeaseKey::new("orders", "shardId-000000000002");
    let claimed = Arc::new(tokio::sync::Notify::new());
    let read = Arc::new(tokio::sync::Notify::new());
    let claimant = tokio::spawn({
        let (chaos, parent, claimed, read) =
            (chaos.clone(), parent.clone(), claimed.clone(), read.clone());
        async move {
            let claim = chaos
                .acquire_and_read(&parent, "parent", Duration::from_mins(1), None)
                .await;
            claimed.notify_one();
            read.notified().await;
            let state = CheckpointStore::read(chaos.as_ref(), &parent).await;
            let position = Position::record(SEQUENCE.parse().unwrap());
            let mark = chaos.mark_contended(&parent, &position).await;
            (claim.is_err(), state.is_ok(), mark.is_ok())
        }
    });
    let child = tokio::spawn({
        let (chaos, parent) = (chaos.clone(), parent.clone());
        async move {
            claimed.notified().await;
            let first = CheckpointStore::read(chaos.as_ref(), &parent).await;
            let second = CheckpointStore::read(chaos.as_ref(), &parent).await;
            read.notify_one();
            (first.is_err(), second.is_err())
        }
    });
    assert_eq!(
        child.await.unwrap(),
        (true, true),
        "the child's readings of the parent's row are throttled, sparing nothing"
    );
    assert_eq!(
        claimant.await.unwrap(),
        (true, true, true),
        "the claim refused, then the claimant's read and mark answered"
    );
    assert_eq!(
        *chaos.layer().injected.lock().unwrap(),
        [3, 0, 0, 0, 0],
        "the claim and the child's two readings throttled"
    );
    assert_eq!(
        memory
            .read(&parent)
            .await
            .unwrap()
            .contended
            .map(|mark| mark.to_string()),
        Some(SEQUENCE.to_owned()),
        "the batch turned away is remembered"
    );
}

#[tokio::test]
async fn the_fault_layer_steals_the_lease_before_the_last_write_through_the_real_store() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = faulty(memory.clone());
    let key = LeaseKey::new("orders", "shardId-000000000000");
    store
        .acquire_and_read(&key, "a", Duration::from_mins(1), None)
        .await
        .unwrap();
    store
        .layer()
        .steal_before_checkpoint
        .store(true, Ordering::SeqCst);
    assert!(
        !store
            .commit(&key, "a", &common::checkpoint_at(None))
            .await
            .unwrap(),
        "fenced by the thief"
    );
    assert_eq!(
        memory.read(&key).await.unwrap().lease_owner.as_deref(),
        Some("thief")
    );
}
