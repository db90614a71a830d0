//! How a batch reaches the function: the Lambda event it becomes, the invocation's context and
//! deadline, and a time-out or a panic turned into the failed invocation Lambda would see.
//!
//! Apart from the bookkeeping, which only sees each batch's answer, so that what counts as an
//! answer is decided in one place.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::streams::KinesisEventResponse;
use lambda_runtime::Context;

use super::delivery::RunReport;
use super::function::{Function, InvocationError};
use super::progress::{Batch, ShardProgress};
use super::stream::{Shards, StreamRecord};
use kinesis_checkpoint::clock::Clock;

/// Invokes every batch at once, each with `timeout` on `clock`, and waits for all the answers.
pub(super) async fn deliver<S: Shards>(
    stream: &S,
    (clock, timeout): (&dyn Clock, Duration),
    function: &Arc<dyn Function>,
    batches: Vec<Batch>,
    shards: &BTreeMap<String, ShardProgress>,
    report: &mut RunReport,
) -> Vec<(Batch, Result<KinesisEventResponse, InvocationError>)> {
    let mut tasks = tokio::task::JoinSet::new();
    for (position, batch) in batches.iter().enumerate() {
        let records = &shards[&batch.shard].records;
        let event = event(
            stream,
            &batch.shard,
            batch.indexes.iter().map(|&i| &records[i]),
        );
        report.records_delivered += batch.indexes.len() as u64;
        let mut context = Context::default();
        context.request_id.clone_from(&batch.request_id);
        context.deadline = clock
            .now_millis()
            .saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        context.invoked_function_arn =
            "arn:aws:lambda:us-east-1:123456789012:function:local".into();
        let function = Arc::clone(function);
        let expired = clock.sleep(timeout);
        tasks.spawn(async move {
            // Lambda stops the function at its timeout, wherever it is.
            let answer = tokio::select! {
                biased;
                answer = function.invoke(event, context) => answer,
                () = expired => Err(InvocationError::TimedOut(timeout)),
            };
            (position, answer)
        });
    }
    let mut answers: Vec<Option<Result<KinesisEventResponse, InvocationError>>> =
        vec![None; batches.len()];
    while let Some(joined) = tasks.join_next().await {
        let (position, answer) = joined.unwrap_or_else(|panic| {
            // The function's task panicked: to Lambda, a crashed invocation.
            (
                usize::MAX,
                Err(InvocationError::Function(panic.to_string())),
            )
        });
        if let Some(slot) = answers.get_mut(position) {
            *slot = Some(answer);
        }
    }
    batches
        .into_iter()
        .zip(answers)
        .map(|(batch, answer)| {
            let answer = answer.unwrap_or_else(|| {
                Err(InvocationError::Function("the invocation panicked".into()))
            });
            (batch, answer)
        })
        .collect()
}

/// The Lambda event for `records` of `shard`.
fn event<'r, S: Shards>(
    stream: &S,
    shard: &str,
    records: impl Iterator<Item = &'r StreamRecord>,
) -> KinesisEvent {
    let arn = stream.arn();
    let region = arn.split(':').nth(3).unwrap_or("us-east-1").to_owned();
    let mut event = KinesisEvent::default();
    event.records = records
        .map(|record| {
            let mut entry = KinesisEventRecord::default();
            entry.aws_region = Some(region.clone());
            entry.event_id = Some(format!("{shard}:{}", record.sequence));
            entry.event_name = Some("aws:kinesis:record".into());
            entry.event_source = Some("aws:kinesis".into());
            entry.event_source_arn = Some(arn.clone());
            entry.event_version = Some("1.0".into());
            entry.invoke_identity_arn =
                Some("arn:aws:iam::123456789012:role/local-event-source".into());
            entry
                .kinesis
                .partition_key
                .clone_from(&record.partition_key);
            entry.kinesis.sequence_number.clone_from(&record.sequence);
            entry.kinesis.data.0 = record.data.to_vec();
            entry.kinesis.kinesis_schema_version = Some("1.0".into());
            #[allow(clippy::cast_precision_loss)]
            let seconds = record.arrival_millis as f64 / 1000.0;
            if let Ok(timestamp) = serde_json::from_value(serde_json::Value::from(seconds)) {
                entry.kinesis.approximate_arrival_timestamp = timestamp;
            }
            entry
        })
        .collect();
    event
}
