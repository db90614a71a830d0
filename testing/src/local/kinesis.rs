//! A Kinesis endpoint as the local event source's stream: the real service, or an emulator such
//! as `kinesis-local`, read with `ListShards`, `GetShardIterator` and `GetRecords` as the
//! event source mapping reads it.

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::ProvideErrorMetadata;
use aws_sdk_kinesis::types::ShardIteratorType;

use super::stream::{ShardRead, Shards, StreamError, StreamRecord};
use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::gate::{KinesisTopology, ShardInfo, Topology};

/// A stream on a Kinesis endpoint.
///
/// ```no_run
/// use kinesis_checkpoint_testing::local::KinesisStream;
///
/// # async fn run() -> Result<(), kinesis_checkpoint_testing::local::StreamError> {
/// let config = aws_config::load_from_env().await;
/// let stream = KinesisStream::connect(&config, "orders").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct KinesisStream {
    client: Client,
    topology: KinesisTopology,
    name: String,
    arn: String,
}

impl KinesisStream {
    /// Connects to `stream` on the endpoint, account and region of `config`.
    ///
    /// # Errors
    ///
    /// When the stream cannot be described (it does not exist, or the endpoint is unreachable).
    ///
    /// ```no_run
    /// # use kinesis_checkpoint_testing::local::KinesisStream;
    /// # async fn run() -> Result<(), kinesis_checkpoint_testing::local::StreamError> {
    /// let stream = KinesisStream::connect(&aws_config::load_from_env().await, "orders").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(
        config: &aws_config::SdkConfig,
        stream: impl Into<String>,
    ) -> Result<Self, StreamError> {
        let name = stream.into();
        let client = Client::new(config);
        let summary = client
            .describe_stream_summary()
            .stream_name(&name)
            .send()
            .await
            .map_err(|e| failed("DescribeStreamSummary", &name, &e))?;
        let arn = summary
            .stream_description_summary()
            .map(|s| s.stream_arn().to_owned())
            .unwrap_or_default();
        Ok(Self {
            client,
            topology: KinesisTopology::new(config),
            name,
            arn,
        })
    }
}

fn failed(
    what: &str,
    stream: &str,
    error: &(impl ProvideErrorMetadata + std::error::Error + 'static),
) -> StreamError {
    format!(
        "Kinesis {what} on stream '{stream}' failed: {}",
        kinesis_checkpoint::aws_error::cause(error)
    )
    .into()
}

impl Shards for KinesisStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn arn(&self) -> String {
        self.arn.clone()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ShardInfo>, StreamError>> {
        self.topology.shards(&self.name)
    }

    fn read<'a>(
        &'a self,
        shard: &'a str,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<ShardRead, StreamError>> {
        Box::pin(async move {
            let request = self
                .client
                .get_shard_iterator()
                .stream_name(&self.name)
                .shard_id(shard);
            let request = match after {
                Some(after) => request
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .starting_sequence_number(after),
                None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            let mut iterator = request
                .send()
                .await
                .map_err(|e| failed("GetShardIterator", &self.name, &e))?
                .shard_iterator
                .ok_or_else(|| format!("no shard iterator for {shard} of {}", self.name))?;
            let mut read = ShardRead::default();
            loop {
                let want = limit.saturating_sub(read.records.len()).clamp(1, 10_000);
                let page = self
                    .client
                    .get_records()
                    .shard_iterator(&iterator)
                    .limit(i32::try_from(want).unwrap_or(10_000))
                    .send()
                    .await
                    .map_err(|e| failed("GetRecords", &self.name, &e))?;
                let got = page.records().len();
                read.records.extend(page.records().iter().map(|r| {
                    StreamRecord {
                        sequence: r.sequence_number().to_owned(),
                        partition_key: r.partition_key().unwrap_or_default().to_owned(),
                        data: bytes::Bytes::copy_from_slice(r.data().as_ref()),
                        arrival_millis: r
                            .approximate_arrival_timestamp()
                            .and_then(|t| u64::try_from(t.to_millis().ok()?).ok())
                            .unwrap_or_default(),
                    }
                }));
                // A closed shard read to its end has no next iterator: that is its end, not
                // its `EndingSequenceNumber`, which emulators report wrongly.
                let Some(next) = page.next_shard_iterator else {
                    read.ended = true;
                    return Ok(read);
                };
                let caught_up = got == 0 && page.millis_behind_latest.unwrap_or(0) == 0;
                if caught_up || read.records.len() >= limit {
                    return Ok(read);
                }
                iterator = next;
            }
        })
    }

    fn now_millis(&self) -> u64 {
        kinesis_checkpoint::clock::Clock::now_millis(&kinesis_checkpoint::clock::SystemClock)
    }
}
