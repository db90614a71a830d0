//! What a batch costs in `DynamoDB` requests, counted by moto's request recorder: a constant,
//! whatever the batch size, up to the 10,000 records of Lambda's largest batch. This file has a
//! server of its own, so no other test's requests reach the recording.

mod common;

use std::sync::Arc;

use common::moto::{Moto, create_lease_table, unique};
use common::{batch, context, reported};
use kinesis_checkpoint::{DynamoLeaseStore, Outcome, Processor, Record};

/// Requests of one steady-state batch of `size` records: the shard's row already exists.
async fn requests_per_batch(moto: &Moto, size: u64) -> Vec<String> {
    let config = moto.sdk_config(1).await;
    let table = unique("cost");
    create_lease_table(&config, &table).await;
    let processor = Processor::new(
        Arc::new(DynamoLeaseStore::new(&config, &table)),
        |_: Record| async { Outcome::ack() },
    );
    let shard = "shardId-000000000000";
    // Warm up: the row exists and holds a checkpoint, as it does for every batch but the first.
    processor
        .process(batch("orders", shard, 0..1), &context("warm", 60_000))
        .await
        .unwrap();

    moto.start_recording();
    let response = processor
        .process(
            batch("orders", shard, 1..1 + size),
            &context("steady", 60_000),
        )
        .await
        .unwrap();
    let requests = moto.stop_recording();
    assert!(reported(&response).is_empty());
    requests
}

#[tokio::test]
async fn a_steady_state_batch_costs_two_dynamodb_requests_whatever_its_size() {
    let moto = Moto::start(true);
    let mut counts = Vec::new();
    for size in [1, 100, 1_000, 10_000] {
        let requests = requests_per_batch(&moto, size).await;
        assert!(
            requests
                .iter()
                .all(|target| target == "DynamoDB_20120810.UpdateItem"),
            "one UpdateItem to claim and read, one to checkpoint and release: {requests:?}"
        );
        println!(
            "batch of {size:>5} records: {} DynamoDB requests",
            requests.len()
        );
        counts.push(requests.len());
    }
    assert_eq!(counts, vec![2, 2, 2, 2]);
}

#[tokio::test]
async fn a_poison_record_costs_one_sqs_request_and_no_extra_dynamodb_request() {
    let moto = Moto::start(true);
    let config = moto.sdk_config(1).await;
    let table = unique("cost");
    create_lease_table(&config, &table).await;
    let queue = common::moto::create_queue(&config).await;
    let processor = Processor::new(
        Arc::new(DynamoLeaseStore::new(&config, &table)),
        |record: Record| async move {
            if record.sequence().as_str() == common::sequence(50) {
                Outcome::reject("poison")
            } else {
                Outcome::ack()
            }
        },
    )
    .dead_letters(Arc::new(kinesis_checkpoint::SqsDeadLetters::new(
        &config, &queue,
    )));
    let shard = "shardId-000000000000";
    processor
        .process(batch("orders", shard, 0..1), &context("warm", 60_000))
        .await
        .unwrap();

    moto.start_recording();
    let response = processor
        .process(batch("orders", shard, 1..101), &context("poisoned", 60_000))
        .await
        .unwrap();
    let requests = moto.stop_recording();

    assert!(reported(&response).is_empty());
    let dynamodb = requests
        .iter()
        .filter(|t| t.starts_with("DynamoDB_"))
        .count();
    let sqs = requests
        .iter()
        .filter(|t| t.starts_with("AmazonSQS."))
        .count();
    println!("a batch of 100 with one poison record: {dynamodb} DynamoDB, {sqs} SQS requests");
    assert_eq!((dynamodb, sqs), (2, 1), "{requests:?}");
}
