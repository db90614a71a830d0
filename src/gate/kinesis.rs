//! [`KinesisTopology`]: the gate's view of a real stream, through the Kinesis API
//! (`ListShards`, `GetShardIterator`, `GetRecords`, `DescribeStreamSummary`).

use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::ProvideErrorMetadata;
use aws_sdk_kinesis::types::ShardIteratorType;

use super::kinesis_range;
use super::topology::{ShardInfo, Topology, TopologyError};
use crate::gap::{RangeRead, ReadBudget, SkippedRange};
use crate::key::LeaseKey;
use crate::lazy_client::LazyClient;
use crate::record::Record;
use crate::store::BoxFuture;

/// The most `GetRecords` pages read to prove a closed shard exhausted; past it the shard
/// counts as not exhausted and the child waits for the next batch.
const MAX_PAGES: usize = 100;

/// The topology as Kinesis reports it: `ListShards` (every page), `GetShardIterator` and
/// `GetRecords` to prove a closed shard exhausted, `DescribeStreamSummary` for the
/// retention. The event source mapping's role already allows these calls.
///
/// ```no_run
/// # use kinesis_checkpoint::gate::KinesisTopology;
/// # async fn run() {
/// let config = aws_config::load_from_env().await;
/// let topology = KinesisTopology::new(&config);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct KinesisTopology {
    /// Built on the first request: a process whose shards' rows know their parents never
    /// builds it (see `lazy_client`).
    client: LazyClient<Client>,
    records_per_page: Option<i32>,
}

impl KinesisTopology {
    /// Asks Kinesis in the account, region and endpoint of `config`.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::gate::KinesisTopology;
    /// # async fn run() {
    /// let topology = KinesisTopology::new(&aws_config::load_from_env().await);
    /// # }
    /// ```
    #[must_use]
    pub fn new(config: &aws_config::SdkConfig) -> Self {
        Self {
            client: LazyClient::new(config, Client::new),
            records_per_page: None,
        }
    }

    /// At most `records` per `GetRecords` page when reading records the mapping skipped
    /// (by default Kinesis's own limit, 10,000): smaller pages keep each answer under the
    /// 10 MB a page may carry when records are large.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::gate::KinesisTopology;
    /// # async fn run() {
    /// let topology = KinesisTopology::new(&aws_config::load_from_env().await).records_per_page(1_000);
    /// # }
    /// ```
    #[must_use]
    pub const fn records_per_page(mut self, records: i32) -> Self {
        self.records_per_page = Some(records);
        self
    }
}

fn failed(
    what: &str,
    stream: &str,
    error: &(impl ProvideErrorMetadata + std::error::Error + 'static),
) -> TopologyError {
    format!(
        "Kinesis {what} on stream '{stream}' failed: {}",
        crate::aws_error::cause(error)
    )
    .into()
}

impl Topology for KinesisTopology {
    fn shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
        Box::pin(async move {
            let mut shards = Vec::new();
            let mut token: Option<String> = None;
            loop {
                // A page token carries the stream: naming both is refused.
                let request = match &token {
                    Some(token) => self.client.list_shards().next_token(token),
                    None => self.client.list_shards().stream_name(stream),
                };
                let page = request
                    .send()
                    .await
                    .map_err(|e| failed("ListShards", stream, &e))?;
                for shard in page.shards() {
                    let parents = shard
                        .parent_shard_id()
                        .into_iter()
                        .chain(shard.adjacent_parent_shard_id())
                        .map(str::to_owned)
                        .collect::<Vec<_>>();
                    let closed = shard
                        .sequence_number_range()
                        .is_some_and(|range| range.ending_sequence_number().is_some());
                    shards.push(ShardInfo::new(shard.shard_id(), parents, closed));
                }
                token = page.next_token().map(str::to_owned);
                if token.is_none() {
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
                .stream_name(stream)
                .shard_id(shard);
            let request = match after {
                Some(sequence) => request
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .starting_sequence_number(sequence),
                None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            let mut iterator = request
                .send()
                .await
                .map_err(|e| {
                    let from = after.map_or_else(
                        || "at the trim horizon".to_owned(),
                        |sequence| format!("after {sequence}"),
                    );
                    failed(
                        &format!("GetShardIterator of shard '{shard}' {from}"),
                        stream,
                        &e,
                    )
                })?
                .shard_iterator;
            for _ in 0..MAX_PAGES {
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

    fn records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Record>, TopologyError>> {
        Box::pin(async move {
            let key = LeaseKey::new(stream, shard);
            let mut iterator = self
                .client
                .get_shard_iterator()
                .stream_name(stream)
                .shard_id(shard)
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await
                .map_err(|e| failed(&format!("GetShardIterator of shard '{shard}'"), stream, &e))?
                .shard_iterator;
            let mut records = Vec::new();
            let mut empty_pages = 0;
            while let Some(current) = iterator {
                let page = self
                    .client
                    .get_records()
                    .shard_iterator(current)
                    .send()
                    .await
                    .map_err(|e| failed(&format!("GetRecords of shard '{shard}'"), stream, &e))?;
                for record in page.records() {
                    let sequence = record.sequence_number().parse().map_err(|e| {
                        format!("shard {shard} of stream {stream} holds a bad sequence number: {e}")
                    })?;
                    records.push(Record::new(
                        key.clone(),
                        sequence,
                        // No key (on-demand streams may omit it): the empty key, as in
                        // `Record::partition_key`.
                        record.partition_key().unwrap_or_default(),
                        record.data().as_ref().to_vec(),
                    ));
                }
                // A closed shard ends with a null iterator; empty pages before it are
                // bounded, as in `exhausted`.
                empty_pages = if page.records().is_empty() {
                    empty_pages + 1
                } else {
                    0
                };
                if empty_pages > MAX_PAGES {
                    return Err(format!(
                        "shard {shard} of stream {stream} did not end after {MAX_PAGES} empty pages"
                    )
                    .into());
                }
                iterator = page.next_shard_iterator;
            }
            Ok(records)
        })
    }

    fn read_range<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        range: &'a SkippedRange,
        budget: ReadBudget,
    ) -> BoxFuture<'a, Result<RangeRead, TopologyError>> {
        Box::pin(async move {
            let key = LeaseKey::new(stream, shard);
            kinesis_range::read_range(&self.client, &key, range, budget, self.records_per_page)
                .await
        })
    }

    fn retention<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>> {
        Box::pin(async move {
            let summary = self
                .client
                .describe_stream_summary()
                .stream_name(stream)
                .send()
                .await
                .map_err(|e| failed("DescribeStreamSummary", stream, &e))?;
            let hours = summary.stream_description_summary().map_or(
                24,
                aws_sdk_kinesis::types::StreamDescriptionSummary::retention_period_hours,
            );
            Ok(Duration::from_hours(u64::try_from(hours).unwrap_or(24)))
        })
    }
}
