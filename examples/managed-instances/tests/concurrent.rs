//! Runs the Managed Instances example's processor as `run_concurrent` does: clones of one
//! service, several invocations in flight at once in one process. A second delivery of a shard
//! that is running is turned away by the lease; another shard runs meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_lambda_events::event::streams::KinesisEventResponse;
use example_managed_instances::{handle, max_concurrency};
use kinesis_checkpoint::event::InvocationEvent;
use kinesis_checkpoint::{MemoryLeaseStore, ProcessError, Processor, Record};
use lambda_runtime::{Context, LambdaEvent, Service};
use serde_json::json;
use tokio::sync::{Notify, Semaphore};

const SHARD_0: &str = "shardId-000000000000";
const SHARD_1: &str = "shardId-000000000001";

/// A batch of three records of `shard`, the first with the partition key `first_key`.
fn event(shard: &str, first_key: &str) -> InvocationEvent {
    let records: Vec<_> = (1..=3)
        .map(|n| {
            let sequence = format!("4{n:055}");
            json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": if n == 1 { first_key } else { "fast" },
                    "sequenceNumber": sequence,
                    "data": "e30=",
                    "approximateArrivalTimestamp": 1_764_512_345.125
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("{shard}:{sequence}"),
                "eventName": "aws:kinesis:record",
                "invokeIdentityArn": "arn:aws:iam::123456789012:role/orders",
                "awsRegion": "us-east-1",
                "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
            })
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

/// One invocation of `service`, with its own request id, as the runtime makes it.
async fn invoke<S>(mut service: S, event: InvocationEvent, request_id: &str) -> Vec<String>
where
    S: Service<LambdaEvent<InvocationEvent>, Response = KinesisEventResponse, Error = ProcessError>,
{
    let mut context = Context::default();
    context.request_id = request_id.to_owned();
    let response = service
        .call(LambdaEvent::new(event, context))
        .await
        .unwrap();
    response
        .batch_item_failures
        .into_iter()
        .filter_map(|failure| failure.item_identifier)
        .collect()
}

/// The output of `future`, which must not wait for the held record.
async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), future)
        .await
        .expect("answered without waiting for the first invocation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_delivery_of_a_running_shard_is_turned_away_while_another_shard_runs() {
    // The record keyed "slow" waits for `release`, after telling `started`.
    let started = Arc::new(Notify::new());
    let release = Arc::new(Semaphore::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let (started, release, seen) = (started.clone(), release.clone(), seen.clone());
        move |record: Record| {
            let (started, release, seen) = (started.clone(), release.clone(), seen.clone());
            async move {
                if record.partition_key() == "slow" {
                    started.notify_one();
                    drop(release.acquire().await.unwrap());
                }
                seen.lock()
                    .unwrap()
                    .push(format!("{}/{}", record.shard(), record.sequence()));
                handle(record).await
            }
        }
    };
    let service = Processor::new(Arc::new(MemoryLeaseStore::new()), handler).service();

    let first = tokio::spawn(invoke(service.clone(), event(SHARD_0, "slow"), "first"));
    started.notified().await;
    // Both answer while the first is in flight: a wait here would be a wait for the first.
    let again = within(invoke(service.clone(), event(SHARD_0, "slow"), "again")).await;
    assert_eq!(
        again,
        [format!("4{:055}", 1)],
        "turned away: Lambda delivers it again later"
    );
    let other = within(invoke(service.clone(), event(SHARD_1, "fast"), "other")).await;
    assert!(
        other.is_empty(),
        "the other shard ran while the first was in flight"
    );
    assert!(!first.is_finished());

    release.add_permits(1);
    assert!(first.await.unwrap().is_empty());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 6, "each record of both shards once: {seen:?}");
    assert_eq!(seen.iter().filter(|r| r.starts_with(SHARD_0)).count(), 3);
}

#[test]
fn the_concurrency_is_lambdas_setting_and_one_without_it() {
    assert_eq!(max_concurrency(Some("8")), 8);
    assert_eq!(max_concurrency(None), 1);
    assert_eq!(max_concurrency(Some("0")), 1);
}
