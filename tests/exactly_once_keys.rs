//! Exactly once under deaths in the partition-key mode: the same batch (over seven partition
//! keys) through a transactional handler and through a plain one, the invocation killed at
//! every point (before and after each store call: the read of the keys' rows and each write of
//! them, with or without the records' writes; and after each of a set of records' handler),
//! then delivered again until it is done, as Lambda does after a failed invocation. On virtual
//! time.
//!
//! The count that matters is "applied again after a death": a record whose effect landed
//! twice. It is 0 for the transactional handler, whose writes land only with the checkpoint,
//! and above 0 for the plain handler in the same run, which applies its effect and may die
//! before the checkpoint. Neither loses a record.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::deaths::{Death, Deaths, Reaper, count_up};
use common::{batch, n_of};
use kinesis_checkpoint::clock::Clock;
use kinesis_checkpoint::effects::{ItemId, Writes};
use kinesis_checkpoint::internal::{Layered, Operation};
use kinesis_checkpoint::processor::Effect;
use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
use kinesis_checkpoint_testing::TokioClock;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";
/// Three transactions over seven keys' rows: 93, 93 and 64 records.
const RECORDS: u64 = 250;
const TABLE: &str = "orders";

/// The store calls a death can strike before or after.
const COUNTED: &[Operation] = &[
    Operation::ReadRows,
    Operation::CommitRows,
    Operation::TransactRows,
];

/// How many times each record's effect landed, by record.
type Applied = Vec<u64>;

/// One scenario: the batch delivered until done, the first delivery dying at `death`.
async fn scenario(death: Death, transactional: bool) -> Applied {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_800_000_000_000));
    let memory = Arc::new(MemoryLeaseStore::with_clock(Arc::clone(&clock)));
    let reaper = Arc::new(Reaper::default());
    let store = Arc::new(Layered::new(
        Arc::clone(&memory) as Arc<dyn kinesis_checkpoint::store::CheckpointStore>,
        Deaths {
            reaper: Arc::clone(&reaper),
            counted: COUNTED,
        },
    ));
    let plain_effects: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let event = batch(STREAM, SHARD, 0..RECORDS);
    *reaper.plan.lock().unwrap() = Some(death);
    let run = |request: String| {
        let clock = Arc::clone(&clock);
        let store = Arc::clone(&store);
        let reaper = Arc::clone(&reaper);
        let effects = Arc::clone(&plain_effects);
        let event = event.clone();
        async move {
            let mut context = lambda_runtime::Context::default();
            context.request_id = request;
            context.deadline = clock.now_millis() + 60_000;
            let on_record = move |n: u64, reaper: Arc<Reaper>| async move {
                if reaper.planned(Death::AfterRecord(n)) {
                    reaper.die().await;
                }
            };
            if transactional {
                let reaper = Arc::clone(&reaper);
                let processor =
                    Processor::transactional_by_partition_key(store, move |record: Record| {
                        let n = n_of(&record);
                        let reaper = Arc::clone(&reaper);
                        async move {
                            on_record(n, reaper).await;
                            Effect::Commit(Writes::from(count_up(TABLE, n)))
                        }
                    })
                    .clock(clock);
                processor
                    .process(event, &context)
                    .await
                    .map(|r| r.batch_item_failures.len())
            } else {
                let reaper = Arc::clone(&reaper);
                let processor = Processor::by_partition_key(store, move |record: Record| {
                    let n = n_of(&record);
                    let reaper = Arc::clone(&reaper);
                    let effects = Arc::clone(&effects);
                    async move {
                        *effects.lock().unwrap().entry(n).or_default() += 1;
                        on_record(n, reaper).await;
                        Outcome::ack()
                    }
                })
                .clock(clock);
                processor
                    .process(event, &context)
                    .await
                    .map(|r| r.batch_item_failures.len())
            }
        }
    };
    for attempt in 0..6 {
        let finished = tokio::select! {
            answer = run(format!("delivery-{attempt}")) => Some(answer.unwrap()),
            () = reaper.died.notified() => None,
        };
        if finished == Some(0) {
            break;
        }
        // Lambda retries after the failed invocation (no lease to lapse in this mode).
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(attempt < 5, "{death}: the batch never finished");
    }
    (0..RECORDS)
        .map(|n| {
            if transactional {
                let key =
                    HashMap::from([("id".to_owned(), AttributeValue::S(format!("order-{n}")))]);
                memory.writes_of(&ItemId::new(TABLE, &key))
            } else {
                plain_effects.lock().unwrap().get(&n).copied().unwrap_or(0)
            }
        })
        .collect()
}

fn deaths() -> Vec<Death> {
    let mut deaths = Vec::new();
    // The read of the rows, then the commit's calls: one plain write, or three transactions.
    for index in 0..5 {
        deaths.push(Death::BeforeCall(index));
        deaths.push(Death::AfterCall(index));
    }
    for n in [0, 1, 50, 92, 93, 94, 185, 186, 249] {
        deaths.push(Death::AfterRecord(n));
    }
    deaths
}

#[tokio::test(start_paused = true)]
async fn in_the_key_mode_a_transactional_handler_applies_nothing_twice_where_a_plain_one_does() {
    let mut again = [0_u64; 2];
    for death in deaths() {
        for (side, transactional) in [(0, true), (1, false)] {
            let applied = scenario(death, transactional).await;
            let lost: Vec<usize> = (0..applied.len()).filter(|n| applied[*n] == 0).collect();
            assert!(
                lost.is_empty(),
                "{death}, transactional {transactional}: lost {lost:?}"
            );
            let twice = u64::try_from(applied.iter().filter(|count| **count > 1).count()).unwrap();
            println!("{death:>20}: transactional {transactional:<5} applied again: {twice}");
            again[side] += twice;
        }
    }
    println!(
        "records applied again after a death: transactional {}, plain {}",
        again[0], again[1]
    );
    assert_eq!(
        again[0], 0,
        "the transactional handler applies nothing twice"
    );
    assert!(
        again[1] > 0,
        "the plain handler does, under the same deaths"
    );
}

#[tokio::test]
async fn the_death_test_s_batch_takes_three_transactions_over_seven_keys() {
    let store = Arc::new(MemoryLeaseStore::new());
    let processor = Processor::transactional_by_partition_key(store.clone(), |record: Record| {
        std::future::ready(Effect::Commit(Writes::from(count_up(TABLE, n_of(&record)))))
    });
    let response = processor
        .process(
            batch(STREAM, SHARD, 0..RECORDS),
            &common::context("a", 60_000),
        )
        .await
        .unwrap();
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(
        store.transactions(),
        3,
        "93 + 93 + 64 writes beside 7 rows each"
    );
}
