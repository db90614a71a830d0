//! `DynamoDB` Streams: the shard engine, with the shard read from a tumbling window's event.
//!
//! Lambda's `DynamoDB` event names no shard (`eventID` is an opaque id per record), so a plain
//! event cannot be matched to a shard's lease row. With `TumblingWindowInSeconds` set on the
//! mapping, every event is a time-window event that carries `shardId`: each change becomes a
//! [`Record`](crate::Record) of that shard, and the shard mode runs as it runs for Kinesis
//! (lease, dedupe, stop at the first failure, attempts, deaths, dead letters, effects, the
//! parent gate through [`DynamoDbStreamsTopology`]).
//!
//! | item | what it is |
//! |---|---|
//! | [`WindowEvent`] | the event Lambda sends a function whose mapping sets a tumbling window |
//! | [`WindowResponse`] | its answer: the failed records and the window's `state` Lambda requires |
//! | [`DynamoDbStreamsTopology`] | shards and parents from `DescribeStream`, for the gate |
//! | `Processor::dynamodb_service` | the Lambda service for window events (shard mode only) |
//!
//! A change reaches the handler as a record whose payload is the stream record's JSON exactly
//! as Lambda sent it (`eventName`, `dynamodb.Keys`, `NewImage`, `OldImage`, ...), whose
//! partition key is the item's keys as JSON with the attribute names sorted, and whose stream
//! is the stream's ARN. A dead letter carries the whole change.

mod change;
mod topology;

use std::collections::HashMap;

use aws_lambda_events::event::kinesis::KinesisEvent;
use lambda_runtime::{Context, LambdaEvent, Service};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub use self::topology::DynamoDbStreamsTopology;
use crate::Handler;
use crate::processor::{ProcessError, Processor, ShardMode};

/// A tumbling window's event for a `DynamoDB` stream: the changes of one shard, the shard's id
/// and the window.
///
/// Only what the processor needs is read; each record stays as Lambda sent it.
///
/// ```
/// use kinesis_checkpoint::dynamodb_streams::WindowEvent;
///
/// let event: WindowEvent = serde_json::from_str(r#"{
///     "Records": [],
///     "shardId": "shardId-00000001796604333303-f37b0ef0",
///     "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2026-12-07T00:45:33.175",
///     "window": {"start": "2026-12-07T00:45:00Z", "end": "2026-12-07T01:00:00Z"},
///     "state": {},
///     "isFinalInvokeForWindow": true,
///     "isWindowTerminatedEarly": false
/// }"#)?;
/// assert!(event.is_final_invoke_for_window && event.records.is_empty());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct WindowEvent {
    /// The changes, each as Lambda sent it.
    #[serde(rename = "Records", default)]
    pub records: Vec<Box<RawValue>>,
    /// The shard the changes come from; absent in an event without a tumbling window.
    #[serde(default)]
    pub shard_id: Option<String>,
    /// The stream's ARN.
    #[serde(rename = "eventSourceARN", default)]
    pub event_source_arn: Option<String>,
    /// Whether this is the window's last invocation (it usually holds no change).
    #[serde(default)]
    pub is_final_invoke_for_window: bool,
}

/// The answer to a [`WindowEvent`]: the first record not done, as for Kinesis, and the
/// window's `state`, without which Lambda fails the invocation. The state stays empty: the
/// lease table, not the window, keeps what is done.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct WindowResponse {
    /// The records to deliver again, from the first not done.
    pub batch_item_failures: Vec<ItemFailure>,
    /// The window's state: always empty.
    pub state: HashMap<String, String>,
}

/// One record Lambda must deliver again, by its sequence number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemFailure {
    /// The record's `SequenceNumber`.
    pub item_identifier: String,
}

impl<H: Handler> Processor<H, ShardMode> {
    /// The Lambda service for a `DynamoDB` stream whose mapping sets `TumblingWindowInSeconds`.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # async fn run() -> Result<(), lambda_runtime::Error> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// lambda_runtime::run(processor.dynamodb_service()).await
    /// # }
    /// ```
    #[must_use]
    pub fn dynamodb_service(
        self,
    ) -> impl Service<
        LambdaEvent<WindowEvent>,
        Response = WindowResponse,
        Error = ProcessError,
        Future = impl Future<Output = Result<WindowResponse, ProcessError>> + Send,
    > + Clone {
        lambda_runtime::service_fn(move |event: LambdaEvent<WindowEvent>| {
            let processor = self.clone();
            async move {
                processor
                    .process_dynamodb(event.payload, &event.context)
                    .await
            }
        })
    }

    /// Processes one window event's changes and answers Lambda.
    ///
    /// # Errors
    ///
    /// [`ProcessError::NotAWindowEvent`] when the event names no shard or stream (the mapping
    /// sets no tumbling window, or it is no `DynamoDB` stream event); [`ProcessError::Unreportable`] when a change
    /// has no readable sequence number. Either way Lambda delivers the batch again.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::dynamodb_streams::WindowEvent;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// let json = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/events/dynamodb-window.json"));
    /// let event: WindowEvent = serde_json::from_str(json)?;
    /// let response = processor.process_dynamodb(event, &lambda_runtime::Context::default()).await?;
    /// assert!(response.batch_item_failures.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn process_dynamodb(
        &self,
        event: WindowEvent,
        context: &Context,
    ) -> Result<WindowResponse, ProcessError> {
        if event.records.is_empty() && event.shard_id.is_some() {
            // A window's last invocation usually holds no change: nothing to do but answer.
            return Ok(WindowResponse::default());
        }
        // The engine reads numbers without padding; Lambda gets back the text it sent.
        let spelled: HashMap<String, String> = event
            .records
            .iter()
            .filter_map(|raw| change::sequence_number(raw))
            .filter(|sequence| change::canonical(sequence) != sequence)
            .map(|sequence| (change::canonical(&sequence).to_owned(), sequence))
            .collect();
        let kinesis = event.into_kinesis()?;
        let response = self.process(kinesis, context).await?;
        Ok(WindowResponse {
            batch_item_failures: response
                .batch_item_failures
                .into_iter()
                .filter_map(|failure| failure.item_identifier)
                .map(|sequence| ItemFailure {
                    item_identifier: spelled.get(&sequence).cloned().unwrap_or(sequence),
                })
                .collect(),
            state: HashMap::new(),
        })
    }
}

impl WindowEvent {
    /// The changes as the Kinesis event the engine reads, each record named by the stream's
    /// ARN and the event's shard: for [`Processor::process_batch`], which says what became of
    /// every record.
    ///
    /// # Errors
    ///
    /// As [`Processor::process_dynamodb`].
    ///
    /// ```
    /// # use kinesis_checkpoint::dynamodb_streams::WindowEvent;
    /// let json = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/events/dynamodb-window.json"));
    /// let event: WindowEvent = serde_json::from_str(json)?;
    /// let kinesis = event.into_kinesis()?;
    /// assert_eq!(kinesis.records[0].kinesis.partition_key, r#"{"order_id":{"S":"A-1"}}"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_kinesis(self) -> Result<KinesisEvent, ProcessError> {
        let (Some(shard), Some(arn)) = (self.shard_id, self.event_source_arn) else {
            return Err(ProcessError::NotAWindowEvent);
        };
        let mut kinesis = KinesisEvent::default();
        kinesis.records = self
            .records
            .iter()
            .enumerate()
            .map(|(index, raw)| change::kinesis_record(raw, &arn, &shard, index))
            .collect::<Result<_, _>>()
            .map_err(ProcessError::Unreportable)?;
        Ok(kinesis)
    }
}
