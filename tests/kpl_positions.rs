//! Positions inside KPL aggregates as the row keeps them, for both real stores: `checkpoint`
//! names a record done whole, the progress inside the next aggregate is kept beside it
//! (`aggregate_sequence`, `aggregate_sub`) and believed only above `checkpoint`, a parent is
//! exhausted only when nothing is left undone at its checkpoint. `five_methods.rs` runs the same through a
//! store with the seed crate's five methods only; `interop.rs` beside the seed crate itself.

mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::aggregates::{
    PARENT, Ran, STREAM, event_of, inside, noting, noting_times, process, split_after_an_aggregate,
    ten_sub_records, whole,
};
use common::faults::faulty;
use common::moto::{Moto, create_lease_table, unique};
use kinesis_checkpoint::gate::{Gate, StartingPosition};
use kinesis_checkpoint::internal::{Below, Commit, FailingChange};
use kinesis_checkpoint::report::StopReason;
use kinesis_checkpoint::store::{CheckpointStore, FailingRecord, LeaseState, LeaseStore};
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, MemoryLeaseStore, Position, Processor};
use kinesis_checkpoint_testing::local::MemoryStream;

const TTL: Duration = Duration::from_mins(1);

/// The parent's row after sub-record 4 of its aggregate was retried, `attempts` times.
async fn assert_stopped_inside_the_aggregate<S: LeaseStore + ?Sized>(
    store: &S,
    plain: &str,
    aggregate: &str,
    attempts: u32,
) {
    let parent = LeaseKey::new(STREAM, PARENT);
    let row = store.read(&parent).await.unwrap();
    assert_eq!(
        (
            row.checkpoint.as_deref(),
            row.aggregate_sequence.as_deref(),
            row.aggregate_sub,
        ),
        (Some(plain), Some(aggregate), Some(3)),
        "`checkpoint` names the plain record, done whole; the aggregate's progress is beside it"
    );
    let failing = row
        .failing
        .as_ref()
        .expect("the retried sub-record is remembered");
    assert_eq!(
        (
            failing.sequence.as_str(),
            failing.sub_sequence,
            failing.attempts
        ),
        (aggregate, Some(4), attempts)
    );
    assert!(
        failing.last_error.contains("the ledger is busy"),
        "{failing:?}"
    );
    assert_eq!((row.lease_owner.as_deref(), row.expires_at), (None, None));
}

/// Through the fault wrapper so that its forwarding is tested too: the parent's last record is
/// an aggregate, sub-record 4 is retried, a child's batch comes and waits for the parent.
async fn a_parent_ending_in_an_aggregate_holds_its_child_until_the_last_sub_record<
    S: LeaseStore + CheckpointStore,
>(
    store: Arc<S>,
) {
    let (stream, plain, aggregate, child) = split_after_an_aggregate();
    let ran = Ran::default();
    let gate = Gate::new(Arc::new(stream.clone()), StartingPosition::TrimHorizon);
    let faulty = Arc::new(faulty(store.clone()));
    // Sub-record 4 fails on the parent's first delivery.
    let processor = Processor::new(faulty, noting_times(&ran, Some(4), 1)).gate(gate);
    let parent = LeaseKey::new(STREAM, PARENT);

    let first = process(&processor, event_of(&stream, PARENT, None), "r1").await;
    assert_eq!(
        first.stopped.as_ref().map(|(s, _)| s.as_str()),
        Some(aggregate.as_str())
    );
    assert_eq!(first.checkpoint, Some(inside(&aggregate, 3)));
    let held = process(&processor, event_of(&stream, &child, None), "r2").await;
    assert!(
        matches!(held.stopped, Some((_, StopReason::Held(_)))),
        "the child runs only after sub-records 4 to 9: {:?}",
        held.stopped
    );
    assert_eq!(held.checkpoint, None, "the held child runs nothing");
    assert_stopped_inside_the_aggregate(store.as_ref(), &plain, &aggregate, 1).await;

    assert_eq!(
        LeaseStore::read(store.as_ref(), &parent)
            .await
            .unwrap()
            .checkpoint
            .as_deref(),
        Some(plain.as_str())
    );

    let again = process(
        &processor,
        event_of(&stream, PARENT, Some(&aggregate)),
        "r3",
    )
    .await;
    assert_eq!(again.stopped, None);
    assert_eq!(
        again.checkpoint,
        Some(whole(&aggregate)),
        "the aggregate is done whole"
    );
    let row = LeaseStore::read(store.as_ref(), &parent).await.unwrap();
    assert_eq!(
        (
            row.checkpoint.as_deref(),
            row.aggregate_sequence.as_deref(),
            row.aggregate_sub,
            row.failing
        ),
        (Some(aggregate.as_str()), None, None, None)
    );

    let runs = process(&processor, event_of(&stream, &child, None), "r4").await;
    assert_eq!(
        runs.stopped, None,
        "the parent is exhausted at its whole aggregate"
    );
    let row = LeaseStore::read(store.as_ref(), &parent).await.unwrap();
    assert_eq!(
        row.checkpoint.as_deref(),
        Some(kinesis_checkpoint::sequence::SHARD_END)
    );
    assert!(
        row.expires_at.is_some(),
        "the finished parent expires: {row:?}"
    );
    let child_row = LeaseStore::read(store.as_ref(), &LeaseKey::new(STREAM, child.as_str()))
        .await
        .unwrap();
    assert_eq!(
        child_row.parent_shards,
        [PARENT],
        "the child's row lists its parent"
    );

    let mut expected = vec![plain.clone()];
    expected.extend((0..10).map(|sub| format!("{aggregate}/{sub}")));
    expected.push(stream.records(&child)[0].sequence.clone());
    assert_eq!(
        *ran.lock().unwrap(),
        expected,
        "each once, the child's last"
    );
}

async fn dynamo() -> (DynamoLeaseStore, aws_sdk_dynamodb::Client, String) {
    let config = Moto::shared().sdk_config(1).await;
    let table = unique("leases");
    create_lease_table(&config, &table).await;
    (
        DynamoLeaseStore::new(&config, &table),
        aws_sdk_dynamodb::Client::new(&config),
        table,
    )
}

#[tokio::test]
async fn in_memory_a_parent_ending_in_an_aggregate_holds_its_child_until_the_last_sub_record() {
    Box::pin(
        a_parent_ending_in_an_aggregate_holds_its_child_until_the_last_sub_record(Arc::new(
            MemoryLeaseStore::new(),
        )),
    )
    .await;
}

#[tokio::test]
async fn in_dynamodb_a_parent_ending_in_an_aggregate_holds_its_child_until_the_last_sub_record() {
    let (store, _, _) = dynamo().await;
    Box::pin(
        a_parent_ending_in_an_aggregate_holds_its_child_until_the_last_sub_record(Arc::new(store)),
    )
    .await;
}

/// The rows `finish` must refuse and the one it must accept; `write` puts a row in the store.
fn rows_to_finish() -> Vec<(&'static str, LeaseState, bool)> {
    let (p, s, t) = ("4900000001", "4900000002", "4900000003");
    let failing_at = |position: &Position| FailingRecord::first(position, "busy", 1);
    let mut partial = LeaseState::default();
    partial.checkpoint = Some(p.to_owned());
    partial.aggregate_sequence = Some(s.to_owned());
    partial.aggregate_sub = Some(3);
    let mut failing = LeaseState::default();
    failing.checkpoint = Some(p.to_owned());
    failing.failing = Some(failing_at(&whole(s)));
    // A writer that knows nothing of aggregates (the seed crate) moved past both.
    let mut stale = partial.clone();
    stale.checkpoint = Some(t.to_owned());
    stale.failing = Some(failing_at(&inside(s, 4)));
    let mut stale_same_length_failing = LeaseState::default();
    stale_same_length_failing.checkpoint = Some(t.to_owned());
    stale_same_length_failing.failing = Some(failing_at(&whole(t)));
    vec![
        ("a partial aggregate above the checkpoint", partial, false),
        ("a failing record above the checkpoint", failing, false),
        (
            "a partial aggregate and a failing record a seed writer moved past",
            stale,
            true,
        ),
        (
            "a failing record at the checkpoint",
            stale_same_length_failing,
            true,
        ),
    ]
}

fn item(key: &str, state: &LeaseState) -> std::collections::HashMap<String, AttributeValue> {
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let n = |v: u64| AttributeValue::N(v.to_string());
    let mut item = std::collections::HashMap::from([
        ("lease_key".to_owned(), s(key)),
        ("lease_counter".to_owned(), n(3)),
    ]);
    if let Some(c) = &state.checkpoint {
        item.insert("checkpoint".to_owned(), s(c));
    }
    if let (Some(a), Some(sub)) = (&state.aggregate_sequence, state.aggregate_sub) {
        item.insert("aggregate_sequence".to_owned(), s(a));
        item.insert("aggregate_sub".to_owned(), n(sub));
    }
    if let Some(f) = &state.failing {
        let mut map = std::collections::HashMap::from([
            ("sequence".to_owned(), s(&f.sequence)),
            ("attempts".to_owned(), n(u64::from(f.attempts))),
            ("last_error".to_owned(), s(&f.last_error)),
        ]);
        if let Some(sub) = f.sub_sequence {
            map.insert("sub_sequence".to_owned(), n(sub));
        }
        item.insert("failing".to_owned(), AttributeValue::M(map));
    }
    item
}

#[tokio::test]
async fn dynamodb_finishes_a_shard_only_when_nothing_is_left_undone_at_its_checkpoint() {
    let (store, client, table) = dynamo().await;
    for (index, (what, state, finishable)) in rows_to_finish().into_iter().enumerate() {
        let key = LeaseKey::new(STREAM, format!("shardId-{index:012}"));
        client
            .put_item()
            .table_name(&table)
            .set_item(Some(item(&key.to_string(), &state)))
            .send()
            .await
            .unwrap();
        assert_finishes_only_when_nothing_is_undone(&store, &key, &state, finishable, what).await;
    }
}

/// Reads the row `state` was written as, then finishes it: written (and cleared of any
/// position inside an aggregate) exactly when `finishable`, untouched otherwise.
async fn assert_finishes_only_when_nothing_is_undone(
    store: &impl CheckpointStore,
    key: &LeaseKey,
    state: &LeaseState,
    finishable: bool,
    what: &str,
) {
    assert_eq!(
        store.read(key).await.unwrap().unfinished().is_none(),
        finishable,
        "{what}"
    );
    let written = store
        .finish(key, state.checkpoint.as_deref(), 1_900_000_000)
        .await
        .unwrap();
    assert_eq!(written, finishable, "{what}");
    let row = store.read(key).await.unwrap();
    if finishable {
        assert_eq!(
            row.checkpoint.as_deref(),
            Some(kinesis_checkpoint::sequence::SHARD_END),
            "{what}"
        );
        assert_eq!(row.expires_at, Some(1_900_000_000), "{what}");
        assert_eq!(row.aggregate_sequence, None, "{what}");
    } else {
        assert_eq!(row.checkpoint, state.checkpoint, "{what}: untouched");
        assert_eq!(row.expires_at, None, "{what}");
    }
}

/// Writes `state`'s checkpoint form and failing record into the memory store through its own
/// writes: a commit (the toolkit's), then a bare `checkpoint` (a seed writer's).
async fn write_memory(store: &MemoryLeaseStore, key: &LeaseKey, state: &LeaseState) {
    assert!(store.acquire(key, "writer", TTL).await.unwrap());
    let mut commit = Commit {
        failing: state
            .failing
            .clone()
            .map_or(FailingChange::Keep, FailingChange::Set),
        ..Commit::default()
    };
    let checkpoint = state.checkpoint.as_deref().unwrap();
    if let (Some(aggregate), Some(sub)) = (&state.aggregate_sequence, state.aggregate_sub) {
        commit.checkpoint = Some(inside(aggregate, sub));
        commit.below = Below::Record(checkpoint.parse().unwrap());
    } else {
        commit.checkpoint = Some(whole(checkpoint));
    }
    assert!(store.commit(key, "writer", &commit).await.unwrap());
    assert!(store.acquire(key, "seed", TTL).await.unwrap());
    assert!(store.checkpoint(key, "seed", checkpoint).await.unwrap());
    store.release(key, "seed").await.unwrap();
}

#[tokio::test]
async fn memory_finishes_a_shard_only_when_nothing_is_left_undone_at_its_checkpoint() {
    let store = MemoryLeaseStore::new();
    for (index, (what, state, finishable)) in rows_to_finish().into_iter().enumerate() {
        let key = LeaseKey::new(STREAM, format!("shardId-{index:012}"));
        write_memory(&store, &key, &state).await;
        let row = store.read(&key).await.unwrap();
        assert_eq!(
            (row.checkpoint.as_deref(), row.aggregate_sub),
            (state.checkpoint.as_deref(), state.aggregate_sub),
            "{what}: written as meant"
        );
        assert_finishes_only_when_nothing_is_undone(&store, &key, &state, finishable, what).await;
    }
}

/// Item 2 of issue 14: a writer that knows nothing of aggregates takes the shard over while the
/// toolkit is inside one.
#[tokio::test]
async fn a_seed_style_writer_sees_only_whole_records_and_leaves_no_stale_position_believed() {
    let memory = Arc::new(MemoryLeaseStore::new());
    let stream = MemoryStream::new(STREAM, 1);
    let plain = stream.put("plain", "before");
    let (outer_key, aggregate_bytes) = ten_sub_records();
    let aggregate = stream.put(&outer_key, aggregate_bytes);
    let next = stream.put("plain", "after");
    let ran = Ran::default();
    let processor = Processor::new(memory.clone(), noting(&ran, Some(4)));
    let key = LeaseKey::new(STREAM, PARENT);

    process(&processor, event_of(&stream, PARENT, None), "r1").await;

    // A seed consumer takes over: it resumes after `checkpoint`, so that must not be the
    // aggregate it would skip.
    let seed: &dyn LeaseStore = memory.as_ref();
    assert!(seed.acquire(&key, "seed", TTL).await.unwrap());
    let resume_after = seed.read(&key).await.unwrap().checkpoint;
    assert_eq!(
        resume_after.as_deref(),
        Some(plain.as_str()),
        "the seed reader runs the aggregate"
    );
    assert!(seed.checkpoint(&key, "seed", &next).await.unwrap());
    seed.release(&key, "seed").await.unwrap();

    // The toolkit takes the shard back, with Lambda's own position still at the aggregate.
    let back = process(
        &processor,
        event_of(&stream, PARENT, Some(&aggregate)),
        "r2",
    )
    .await;
    assert_eq!(back.stopped, None);
    assert_eq!(
        memory.read(&key).await.unwrap().position().unwrap(),
        Some(whole(&next))
    );
    let mut expected = vec![plain];
    expected.extend((0..4).map(|sub| format!("{aggregate}/{sub}")));
    assert_eq!(
        *ran.lock().unwrap(),
        expected,
        "nothing the seed consumer did runs again here"
    );
}
