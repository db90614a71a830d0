//! The parent gate against a real resharded stream: kinesis-local (split, merge, shard ends) for
//! Kinesis and moto for the lease table, both on 127.0.0.1. Child batches are delivered before
//! their parents are done, as Lambda may, and order per partition key is checked record by
//! record.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use common::context;
use common::kinesis::{KinesisLocal, Stream};
use common::moto::{Moto, create_lease_table, unique};
use kinesis_checkpoint::gate::{Gate, Held, KinesisTopology, StartingPosition};
use kinesis_checkpoint::internal::Commit;
use kinesis_checkpoint::processor::CheckpointMode;
use kinesis_checkpoint::report::StopReason;
use kinesis_checkpoint::sequence::SHARD_END;
use kinesis_checkpoint::store::{CheckpointStore, LeaseStore};
use kinesis_checkpoint::{DynamoLeaseStore, Handler, LeaseKey, Outcome, Processor, Record};
use serde_json::Value;

const PARENT: &str = "shardId-000000000000";
const LEFT: &str = "shardId-000000000001";
const RIGHT: &str = "shardId-000000000002";
const MERGED: &str = "shardId-000000000003";

fn kinesis() -> &'static KinesisLocal {
    static SERVER: OnceLock<KinesisLocal> = OnceLock::new();
    SERVER.get_or_init(KinesisLocal::start)
}

/// What the handler saw: (shard, partition key, n) in processing order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(String, String, u64)>>>);

impl Log {
    fn all(&self) -> Vec<(String, String, u64)> {
        self.0.lock().unwrap().clone()
    }

    /// A handler that logs every record, failing those `fail` names (by `n`) once.
    fn handler(&self, fail: Option<u64>) -> impl Handler {
        self.handler_failing(fail, 1)
    }

    /// [`Log::handler`], failing record `fail` its first `times` attempts.
    fn handler_failing(&self, fail: Option<u64>, times: u32) -> impl Handler {
        let log = self.clone();
        let failed = Arc::new(Mutex::new(0_u32));
        move |record: Record| {
            let payload: Value = record.json().unwrap();
            let n = payload["n"].as_u64().unwrap();
            let mut failures = failed.lock().unwrap();
            let outcome = if Some(n) == fail && *failures < times {
                *failures += 1;
                Outcome::retry("downstream unavailable")
            } else {
                log.0.lock().unwrap().push((
                    record.shard().to_owned(),
                    record.partition_key().to_owned(),
                    n,
                ));
                Outcome::ack()
            };
            std::future::ready(outcome)
        }
    }
}

/// A stream on kinesis-local, a lease table on moto, and a gated processor over both.
struct Setup {
    stream: Stream,
    store: DynamoLeaseStore,
}

async fn setup() -> Setup {
    let moto = Moto::shared().sdk_config(1).await;
    let table = unique("leases");
    create_lease_table(&moto, &table).await;
    let kinesis = common::moto::sdk_config(&kinesis().endpoint, 1).await;
    Setup {
        stream: Stream::create(&kinesis, &unique("orders")).await,
        store: DynamoLeaseStore::new(&moto, table),
    }
}

impl Setup {
    async fn processor(
        &self,
        log: &Log,
        fail: Option<u64>,
        start: StartingPosition,
    ) -> Processor<impl Handler> {
        self.processor_failing(log, fail, 1, start).await
    }

    /// [`Setup::processor`], failing record `fail` its first `times` attempts.
    async fn processor_failing(
        &self,
        log: &Log,
        fail: Option<u64>,
        times: u32,
        start: StartingPosition,
    ) -> Processor<impl Handler> {
        let kinesis = common::moto::sdk_config(&kinesis().endpoint, 1).await;
        Processor::new(
            Arc::new(self.store.clone()),
            log.handler_failing(fail, times),
        )
        .gate(Gate::new(Arc::new(KinesisTopology::new(&kinesis)), start))
    }

    /// The batch of whichever child of the split holds the records written after it (their
    /// partition key decides which).
    async fn child_with_records(&self) -> KinesisEvent {
        let left = self.stream.batch(LEFT).await;
        if left.records.is_empty() {
            self.stream.batch(RIGHT).await
        } else {
            left
        }
    }

    async fn row(&self, shard: &str) -> kinesis_checkpoint::store::LeaseState {
        self.store
            .read(&LeaseKey::new(self.stream.name.as_str(), shard))
            .await
            .unwrap()
    }
}

/// Delivers `event` and returns why its shard stopped, if it did.
async fn deliver(
    processor: &Processor<impl Handler, impl CheckpointMode>,
    event: KinesisEvent,
    request: &str,
) -> Option<StopReason> {
    let report = processor
        .process_batch(event, &context(request, 60_000))
        .await
        .unwrap();
    report
        .shards
        .into_iter()
        .next()
        .and_then(|shard| shard.stopped.map(|(_, reason)| reason))
}

fn held_by(reason: Option<StopReason>) -> String {
    match reason {
        Some(StopReason::Held(
            Held::NeverRead { parent }
            | Held::Unfinished { parent, .. }
            | Held::ParentOpen { parent },
        )) => parent,
        other => panic!("expected a held batch, got {other:?}"),
    }
}

/// Every record of every key, in the order they were written, must be processed in that order.
fn assert_order_per_key(log: &[(String, String, u64)], written: usize) {
    assert_eq!(
        log.len(),
        written,
        "every record processed exactly once: {log:?}"
    );
    let mut last: HashMap<&str, u64> = HashMap::new();
    for (shard, key, n) in log {
        if let Some(previous) = last.insert(key, *n) {
            assert!(
                previous < *n,
                "key {key}: {n} (shard {shard}) processed after {previous}"
            );
        }
    }
}

#[tokio::test]
async fn children_wait_for_their_parents_across_a_split_and_a_merge_and_keys_stay_in_order() {
    let setup = setup().await;
    let stream = &setup.stream;
    let keys: Vec<String> = (0..6).map(|k| format!("customer-{k}")).collect();
    let mut n = 0;
    for _ in 0..2 {
        for key in &keys {
            stream.put(key, n).await;
            n += 1;
        }
    }
    stream.split(PARENT).await;
    for key in &keys {
        stream.put(key, n).await;
        n += 1;
    }
    stream.merge(LEFT, RIGHT).await;
    for key in &keys {
        stream.put(key, n).await;
        n += 1;
    }
    let log = Log::default();
    let processor = setup
        .processor(&log, None, StartingPosition::TrimHorizon)
        .await;
    let batch = |shard: &'static str| stream.batch(shard);
    assert!(!batch(LEFT).await.records.is_empty() && !batch(RIGHT).await.records.is_empty());

    // The grandchild and a child arrive before anything of the parent ran: both wait.
    assert_eq!(
        held_by(deliver(&processor, batch(MERGED).await, "m1").await),
        LEFT
    );
    assert_eq!(
        held_by(deliver(&processor, batch(LEFT).await, "l1").await),
        PARENT
    );
    assert!(log.all().is_empty());

    // The parent runs; the gate then proves it exhausted and the left child runs.
    assert_eq!(deliver(&processor, batch(PARENT).await, "p1").await, None);
    assert_eq!(deliver(&processor, batch(LEFT).await, "l2").await, None);
    assert_eq!(
        setup.row(PARENT).await.checkpoint.as_deref(),
        Some(SHARD_END)
    );
    // The merged child waits for both of its parents.
    assert_eq!(
        held_by(deliver(&processor, batch(MERGED).await, "m2").await),
        RIGHT
    );
    assert_eq!(deliver(&processor, batch(RIGHT).await, "r1").await, None);
    assert_eq!(deliver(&processor, batch(MERGED).await, "m3").await, None);

    assert_order_per_key(&log.all(), usize::try_from(n).unwrap());
    let parent = setup.row(PARENT).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expires = parent.expires_at.expect("a finished shard expires");
    // The stream keeps records 24 hours; the row outlives them by a day.
    assert!(
        (now + 47 * 3600..=now + 49 * 3600).contains(&expires),
        "expires_at {expires}, now {now}"
    );
    let mut merged_parents = setup.row(MERGED).await.parent_shards;
    merged_parents.sort();
    assert_eq!(
        merged_parents,
        [LEFT, RIGHT],
        "the parents are kept in the child's row"
    );
}

#[tokio::test]
async fn cold_processors_read_the_lineage_from_the_rows_and_a_child_still_waits_for_its_parent() {
    let setup = setup().await;
    for n in 0..2 {
        setup.stream.put("customer", n).await;
    }
    setup.stream.split(PARENT).await;
    setup.stream.put("customer", 2).await;
    let child = setup.child_with_records().await;
    let child_shard = if setup.stream.batch(LEFT).await.records.is_empty() {
        RIGHT
    } else {
        LEFT
    };
    let log = Log::default();
    // Each delivery in a new process: a processor of its own, its gate knowing nothing.
    let cold = || setup.processor(&log, None, StartingPosition::TrimHorizon);

    assert_eq!(
        held_by(deliver(&cold().await, child.clone(), "c1").await),
        PARENT
    );
    let child_row = setup.row(child_shard).await;
    assert_eq!(child_row.known_parents(), Some(&[PARENT.to_owned()][..]));
    assert!(!child_row.parentless);
    // The row names the parent: the child still waits for it after a cold start.
    assert_eq!(
        held_by(deliver(&cold().await, child.clone(), "c2").await),
        PARENT
    );
    assert!(log.all().is_empty());

    assert_eq!(
        deliver(&cold().await, setup.stream.batch(PARENT).await, "p1").await,
        None
    );
    let parent_row = setup.row(PARENT).await;
    assert!(
        parent_row.parentless,
        "an original shard's row records that it has no parents: {parent_row:?}"
    );
    assert_eq!(deliver(&cold().await, child, "c3").await, None);
    assert_order_per_key(&log.all(), 3);
    assert_eq!(
        setup.row(PARENT).await.checkpoint.as_deref(),
        Some(SHARD_END)
    );
}

#[tokio::test]
async fn a_child_waits_while_its_parents_last_record_keeps_failing() {
    let setup = setup().await;
    for n in 0..3 {
        setup.stream.put("customer", n).await;
    }
    setup.stream.split(PARENT).await;
    for n in 3..5 {
        setup.stream.put("customer", n).await;
    }
    let log = Log::default();
    // Record 2 fails on the parent's first delivery: the child waits for the mapping's retry.
    let processor = setup
        .processor_failing(&log, Some(2), 1, StartingPosition::TrimHorizon)
        .await;
    let child = setup.child_with_records().await;

    assert!(matches!(
        deliver(&processor, setup.stream.batch(PARENT).await, "p1").await,
        Some(StopReason::Retry(_))
    ));
    let held = deliver(&processor, child.clone(), "c1").await;
    assert!(
        matches!(&held, Some(StopReason::Held(Held::Unfinished { parent, checkpoint: Some(_) })) if parent == PARENT),
        "{held:?}"
    );
    assert_eq!(
        deliver(&processor, setup.stream.batch(PARENT).await, "p2").await,
        None
    );
    assert_eq!(deliver(&processor, child, "c2").await, None);

    assert_order_per_key(&log.all(), 5);
}

#[tokio::test]
async fn a_parent_never_read_holds_the_child_at_trim_horizon_but_not_at_latest() {
    let setup = setup().await;
    setup.stream.put("customer", 0).await;
    setup.stream.split(PARENT).await;
    setup.stream.put("customer", 1).await;
    let child = setup.child_with_records().await;

    let log = Log::default();
    let trim = setup
        .processor(&log, None, StartingPosition::TrimHorizon)
        .await;
    assert!(matches!(
        deliver(&trim, child.clone(), "t1").await,
        Some(StopReason::Held(Held::NeverRead { .. }))
    ));
    assert!(log.all().is_empty());

    let latest = setup.processor(&log, None, StartingPosition::Latest).await;
    assert_eq!(
        deliver(&latest, child, "l1").await,
        None,
        "at LATEST the parent's records may never come"
    );
    assert_eq!(log.all().len(), 1);
}

#[tokio::test]
async fn a_parent_without_records_is_finished() {
    let setup = setup().await;
    setup.stream.split(PARENT).await;
    setup.stream.put("customer", 0).await;
    let child = setup.child_with_records().await;
    let log = Log::default();
    let processor = setup
        .processor(&log, None, StartingPosition::TrimHorizon)
        .await;

    assert_eq!(deliver(&processor, child, "c1").await, None);
    assert_eq!(log.all().len(), 1);
    assert_eq!(
        setup.row(PARENT).await.checkpoint.as_deref(),
        Some(SHARD_END)
    );
}

#[tokio::test]
async fn a_parent_gone_from_the_stream_counts_as_finished() {
    let setup = setup().await;
    setup.stream.put("customer", 0).await;
    // The shard's row names a parent the stream no longer lists: it expired with its records.
    let key = LeaseKey::new(setup.stream.name.as_str(), PARENT);
    assert!(
        setup
            .store
            .acquire(&key, "earlier", Duration::from_secs(5))
            .await
            .unwrap()
    );
    let commit = Commit {
        parent_shards: vec!["shardId-000000000099".to_owned()],
        ..Commit::default()
    };
    assert!(setup.store.commit(&key, "earlier", &commit).await.unwrap());
    let log = Log::default();
    let processor = setup
        .processor(&log, None, StartingPosition::TrimHorizon)
        .await;

    assert_eq!(
        deliver(&processor, setup.stream.batch(PARENT).await, "r1").await,
        None
    );
    assert_eq!(log.all().len(), 1);
}

#[tokio::test]
async fn in_the_partition_key_mode_a_child_waits_until_every_key_of_its_parent_is_done() {
    let setup = setup().await;
    let stream = &setup.stream;
    let keys: Vec<String> = (0..4).map(|k| format!("customer-{k}")).collect();
    let mut n = 0;
    for _ in 0..2 {
        for key in &keys {
            stream.put(key, n).await;
            n += 1;
        }
    }
    stream.split(PARENT).await;
    for key in &keys {
        stream.put(key, n).await;
        n += 1;
    }
    let log = Log::default();
    let kinesis_config = common::moto::sdk_config(&kinesis().endpoint, 1).await;
    // Record 1 fails once: its key is not done after the parent's first batch.
    let processor =
        Processor::by_partition_key(Arc::new(setup.store.clone()), log.handler(Some(1)))
            .gate(Gate::new(
                Arc::new(KinesisTopology::new(&kinesis_config)),
                StartingPosition::TrimHorizon,
            ))
            .concurrency(4);

    assert_eq!(
        held_by(deliver(&processor, setup.child_with_records().await, "c1").await),
        PARENT
    );
    assert!(matches!(
        deliver(&processor, stream.batch(PARENT).await, "p1").await,
        Some(StopReason::Retry(_))
    ));
    assert_eq!(
        held_by(deliver(&processor, setup.child_with_records().await, "c2").await),
        PARENT,
        "one key of the parent is not done"
    );
    assert_eq!(
        deliver(&processor, stream.batch(PARENT).await, "p2").await,
        None
    );
    assert_eq!(
        deliver(&processor, stream.batch(LEFT).await, "l1").await,
        None
    );
    assert_eq!(
        deliver(&processor, stream.batch(RIGHT).await, "r1").await,
        None
    );

    assert_eq!(
        setup.row(PARENT).await.checkpoint.as_deref(),
        Some(SHARD_END),
        "the gate marked the parent finished"
    );
    assert_order_per_key(&log.all(), usize::try_from(n).unwrap());
}
