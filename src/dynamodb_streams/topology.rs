//! [`DynamoDbStreamsTopology`]: the gate's view of a `DynamoDB` stream, through the `DynamoDB`
//! Streams API (`DescribeStream`, `GetShardIterator`, `GetRecords`).

use std::time::Duration;

use aws_sdk_dynamodbstreams::Client;
use aws_sdk_dynamodbstreams::error::ProvideErrorMetadata;
use aws_sdk_dynamodbstreams::types::ShardIteratorType;

use crate::gate::{ShardInfo, Topology, TopologyError};
use crate::lazy_client::LazyClient;
use crate::store::BoxFuture;

/// How long `DynamoDB` Streams keeps a change.
const RETENTION: Duration = Duration::from_hours(24);

/// The fewest digits of a stream's sequence number. The processor reads numbers without
/// leading zeros; `DynamoDB` Local pads its numbers to this length and takes no other spelling,
/// and `DynamoDB`'s own are never shorter.
const SHORTEST: usize = 21;

/// The most `GetRecords` pages read to prove a closed shard exhausted; past it the shard counts
/// as not exhausted and the child waits for the next batch.
const MAX_PAGES: usize = 100;

/// The topology as `DynamoDB` Streams reports it: each shard and its one parent
/// (`ParentShardId`) from `DescribeStream`, and `GetShardIterator` with `GetRecords` to prove a
/// closed parent has no change after its checkpoint. The stream is named by its ARN, as the
/// processor names it.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use kinesis_checkpoint::dynamodb_streams::DynamoDbStreamsTopology;
/// # use kinesis_checkpoint::gate::{Gate, StartingPosition};
/// # async fn run() {
/// let config = aws_config::load_from_env().await;
/// let gate = Gate::new(Arc::new(DynamoDbStreamsTopology::new(&config)), StartingPosition::TrimHorizon);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoDbStreamsTopology {
    /// Built on the first request: a shard whose row knows its parents never needs it.
    client: LazyClient<Client>,
}

impl DynamoDbStreamsTopology {
    /// Asks `DynamoDB` Streams in the account, region and endpoint of `config`.
    #[must_use]
    pub fn new(config: &aws_config::SdkConfig) -> Self {
        Self {
            client: LazyClient::new(config, Client::new),
        }
    }
}

fn failed(
    what: &str,
    stream: &str,
    error: &(impl ProvideErrorMetadata + std::error::Error + 'static),
) -> TopologyError {
    format!(
        "DynamoDB Streams {what} on stream '{stream}' failed: {}",
        crate::aws_error::cause(error)
    )
    .into()
}

impl Topology for DynamoDbStreamsTopology {
    fn shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
        Box::pin(async move {
            let mut shards = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let page = self
                    .client
                    .describe_stream()
                    .stream_arn(stream)
                    .set_exclusive_start_shard_id(after.take())
                    .send()
                    .await
                    .map_err(|e| failed("DescribeStream", stream, &e))?;
                let Some(description) = page.stream_description else {
                    return Ok(shards);
                };
                for shard in description.shards() {
                    let closed = shard
                        .sequence_number_range()
                        .is_some_and(|range| range.ending_sequence_number().is_some());
                    let id = shard.shard_id().unwrap_or_default();
                    shards.push(ShardInfo::new(id, shard.parent_shard_id(), closed));
                }
                after = description.last_evaluated_shard_id;
                if after.is_none() {
                    return Ok(shards);
                }
            }
        })
    }

    fn exhausted<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, TopologyError>> {
        Box::pin(async move {
            let request = self
                .client
                .get_shard_iterator()
                .stream_arn(stream)
                .shard_id(shard);
            let request = match after {
                Some(sequence) => request
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .sequence_number(format!("{sequence:0>SHORTEST$}")),
                None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            let what = || format!("GetShardIterator of shard '{shard}'");
            let mut iterator = request
                .send()
                .await
                .map_err(|e| failed(&what(), stream, &e))?
                .shard_iterator;
            for _ in 0..MAX_PAGES {
                // A closed shard's last page ends the iterators.
                let Some(current) = iterator else {
                    return Ok(true);
                };
                let page = self
                    .client
                    .get_records()
                    .shard_iterator(current)
                    .limit(1)
                    .send()
                    .await
                    .map_err(|e| failed(&format!("GetRecords of shard '{shard}'"), stream, &e))?;
                if !page.records().is_empty() {
                    return Ok(false);
                }
                iterator = page.next_shard_iterator;
            }
            Ok(false)
        })
    }

    fn retention<'a>(&'a self, _stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>> {
        Box::pin(async { Ok(RETENTION) })
    }
}
