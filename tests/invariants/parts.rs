//! Skipped ranges read in parts: a topology that reads at most a few records per reading, as
//! the real one reads at most 10,000 (`MAX_RECOVERED_RECORDS`) in half the time left. So a
//! range the mapping skipped in a scenario of tens of records is read over several deliveries,
//! as a range of more than 10,000 records is.

use std::sync::Arc;
use std::time::Duration;

use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::Record;
use kinesis_checkpoint::gap::{RangeRead, ReadBudget, SkippedRange};
use kinesis_checkpoint::gate::{ShardInfo, Topology, TopologyError};
use kinesis_checkpoint_testing::local::MemoryStream;

/// The memory stream, reading at most `cap` records of a range at a time.
pub struct Capped {
    pub inner: Arc<MemoryStream>,
    pub cap: usize,
}

impl Topology for Capped {
    fn shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<ShardInfo>, TopologyError>> {
        Topology::shards(self.inner.as_ref(), stream)
    }

    fn exhausted<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, TopologyError>> {
        Topology::exhausted(self.inner.as_ref(), stream, shard, after)
    }

    fn retention<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<Duration, TopologyError>> {
        Topology::retention(self.inner.as_ref(), stream)
    }

    fn read_range<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        range: &'a SkippedRange,
        budget: ReadBudget,
    ) -> BoxFuture<'a, Result<RangeRead, TopologyError>> {
        let budget = ReadBudget::new(budget.max_records.min(self.cap), budget.deadline);
        Topology::read_range(self.inner.as_ref(), stream, shard, range, budget)
    }

    fn records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Record>, TopologyError>> {
        Topology::records(self.inner.as_ref(), stream, shard)
    }
}
