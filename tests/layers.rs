//! The tests' store layers (`Faulty`, `Chaos`, `Skewed`) with their faults off hand every field
//! of every write to the store they wrap, unchanged: a test that runs through one runs on the
//! wrapped store's own behaviour, never on a degraded path. With their faults on they do what
//! they say.

mod common;
#[path = "common/every_field.rs"]
mod every_field;
#[path = "invariants/skew.rs"]
mod skew;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::faults::{Chaos, ChaosLevels, faulty};
use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::internal::{Call, Layer, Layered, Next};
use kinesis_checkpoint::store::{CheckpointStore, LeaseError, SeedStore};
use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore};

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
    assert_eq!(*chaos.layer().injected.lock().unwrap(), [0; 4]);
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

/// Passes every call on, noting what it saw.
#[derive(Default)]
struct Noting(std::sync::Mutex<Vec<String>>);

impl Layer for Noting {
    fn wrap<'a, T: std::fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("{:?} {:?}", call.operation(), call.keys()));
        next.run(call)
    }
}

#[tokio::test]
async fn a_layered_store_hands_every_field_of_every_write_to_the_inner_store() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Layered::new(memory.clone(), Noting::default());
    every_field::reach(&store, &memory).await;
    let seen = store.layer().0.lock().expect("notes").clone();
    for operation in [
        "AcquireAndRead",
        "Renew",
        "Commit",
        "Read",
        "Finish",
        "CommitRows",
        "ReadRows",
    ] {
        assert!(
            seen.iter().any(|line| line.starts_with(operation)),
            "{operation} went through the layer: {seen:?}"
        );
    }
}
