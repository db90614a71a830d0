use super::call::Args;
use super::*;
use crate::store::memory::MemoryLeaseStore;

/// Doubles every lease's ttl.
struct Doubling;

impl Layer for Doubling {
    fn wrap<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        match call.lease_ttl() {
            Some(ttl) => next.run(call.with_lease_ttl(ttl * 2)),
            None => next.run(call),
        }
    }
}

#[tokio::test]
async fn a_layer_can_change_the_lease_ttl_and_only_that() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Layered::new(memory.clone(), Doubling);
    let key = LeaseKey::new("orders", "shardId-000000000000");
    let before = crate::clock::Clock::now_millis(&crate::clock::SystemClock);
    store
        .acquire_and_read(&key, "a", Duration::from_secs(100), None)
        .await
        .expect("claim");
    let expiry = memory
        .read(&key)
        .await
        .expect("read")
        .lease_expiry
        .expect("held");
    assert!(
        expiry >= before + 200_000,
        "the ttl doubled: {expiry} from {before}"
    );
    assert!(
        LeaseStore::renew(&store, &key, "a", Duration::from_secs(1))
            .await
            .expect("renew")
    );
    let expiry = memory
        .read(&key)
        .await
        .expect("read")
        .lease_expiry
        .expect("held");
    assert!(
        expiry < before + 10_000,
        "the seed's renew doubled too: {expiry}"
    );

    let call = Call {
        args: Args::Commit {
            key: &key,
            owner: "a",
            commit: &Commit::default(),
        },
    };
    assert_eq!(
        call.with_lease_ttl(Duration::from_secs(1)).lease_ttl(),
        None,
        "a commit takes no lease"
    );
}

#[tokio::test]
async fn a_layer_that_does_not_run_the_call_answers_for_the_store() {
    struct Down;
    impl Layer for Down {
        fn wrap<'a, T: fmt::Debug + Send + 'a>(
            &'a self,
            _call: Call<'a>,
            _next: Next<'a, T>,
        ) -> BoxFuture<'a, Result<T, LeaseError>> {
            Box::pin(async { Err("down".into()) })
        }
    }
    let memory = Arc::new(MemoryLeaseStore::new());
    let store = Layered::new(memory.clone(), Down);
    let key = LeaseKey::new("orders", "shardId-000000000000");
    assert!(
        store
            .acquire_and_read(&key, "a", Duration::from_secs(1), None)
            .await
            .is_err()
    );
    assert!(
        LeaseStore::acquire(&store, &key, "a", Duration::from_secs(1))
            .await
            .is_err()
    );
    assert_eq!(
        memory.read(&key).await.expect("read").lease_owner,
        None,
        "nothing reached it"
    );
}
