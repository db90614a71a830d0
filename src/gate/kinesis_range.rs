//! Reading a skipped range from Kinesis: `GetShardIterator`, then `GetRecords` pages.
//!
//! What [`KinesisTopology::read_range`](super::KinesisTopology) does for
//! [gap recovery](crate::gap); beside the topology, since it is the topology that reads.

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::DisplayErrorContext;
use aws_sdk_kinesis::types::ShardIteratorType;

use super::topology::TopologyError;
use crate::gap::{RangeRead, ReadBudget, ReadFrom, SkippedRange};
use crate::key::LeaseKey;
use crate::record::Record;

fn failed(what: &str, key: &LeaseKey, error: &impl std::error::Error) -> TopologyError {
    format!(
        "Kinesis {what} on stream '{}', shard {} failed: {}",
        key.stream(),
        key.shard(),
        DisplayErrorContext(error)
    )
    .into()
}

/// `GetShardIterator` at the range's start, then `GetRecords` pages of at most `page` records
/// until the range's end, the shard's end, or the budget.
pub(crate) async fn read_range(
    client: &Client,
    key: &LeaseKey,
    range: &SkippedRange,
    budget: ReadBudget,
    page: Option<i32>,
) -> Result<RangeRead, TopologyError> {
    let request = client
        .get_shard_iterator()
        .stream_name(key.stream())
        .shard_id(key.shard());
    let request = match &range.from {
        ReadFrom::After(after) => request
            .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
            .starting_sequence_number(after.as_str()),
        ReadFrom::At(at) => request
            .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
            .starting_sequence_number(at.as_str()),
        ReadFrom::TrimHorizon => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
    };
    let mut iterator = request
        .send()
        .await
        .map_err(|e| failed("GetShardIterator", key, &e))?
        .shard_iterator;
    let mut records = Vec::new();
    while let Some(current) = iterator {
        if budget.expired() || records.len() >= budget.max_records {
            return Ok(RangeRead {
                records,
                complete: false,
            });
        }
        let left = budget.max_records - records.len();
        let limit = page.map_or(left, |page| left.min(usize::try_from(page).unwrap_or(1)));
        let output = client
            .get_records()
            .shard_iterator(current)
            .limit(i32::try_from(limit.clamp(1, 10_000)).unwrap_or(10_000))
            .send()
            .await
            .map_err(|e| failed("GetRecords", key, &e))?;
        for record in output.records() {
            let sequence = record.sequence_number().parse().map_err(|e| {
                format!(
                    "shard {} of stream {} holds a bad sequence number: {e}",
                    key.shard(),
                    key.stream()
                )
            })?;
            if !range.contains(&sequence) {
                // The batch's first record: the range is read.
                return Ok(RangeRead {
                    records,
                    complete: true,
                });
            }
            let mut found = Record::new(
                key.clone(),
                sequence,
                record.partition_key().unwrap_or_default(),
                record.data().as_ref().to_vec(),
            );
            if let Some(arrival) = record.approximate_arrival_timestamp()
                && let Ok(arrival) = std::time::SystemTime::try_from(*arrival)
            {
                found = found.with_arrival(arrival);
            }
            records.push(found);
        }
        iterator = output.next_shard_iterator;
    }
    // The shard ended before the batch's first record: nothing more can be in the range.
    Ok(RangeRead {
        records,
        complete: true,
    })
}
