//! The local event source: it reads a stream and invokes a [`Function`] the way Lambda's Kinesis
//! event source mapping does, so that what a handler does under redelivery, partial failures,
//! resharding and duplicate deliveries can be seen on a laptop and in tests.
//!
//! What it reproduces, per [`Mapping`]:
//!
//! - batches of one shard, at most `BatchSize` records, in order within the shard; with a
//!   `ParallelizationFactor` above 1, up to that many batches of one shard at once, each with the
//!   records of its partition keys, so that one key's records stay in order;
//! - after a response that reports failures, the next batch starts at the lowest reported
//!   record (an unknown identifier fails the whole batch, as on Lambda); without
//!   `ReportBatchItemFailures` the response is ignored and the batch counts as done;
//! - after an error or a time-out, the whole batch again, or its first half with
//!   `BisectBatchOnFunctionError`;
//! - `MaximumRetryAttempts` and `MaximumRecordAgeInSeconds`: records are discarded as Lambda
//!   discards them, and listed in the run's report;
//! - duplicate deliveries (a done batch delivered again), concurrent deliveries (one batch to two
//!   invocations at once: the second one's answer is ignored, as Lambda ignores a stray one),
//!   and child shards delivered before their parents are finished;
//! - a shard closed by a split or a merge ends once read to its end; its children are read from
//!   their start.
//!
//! Deliveries happen in rounds: every shard (and lane) with records ready gets one batch, all
//! invoked at once; then the answers are applied and the stream's clock moves on by
//! [`Mapping::round_time`]. A run ends when every record has been delivered and answered for.
//!
//! This file is the loop: reading the stream, the rounds, and when a run ends or is stuck. What
//! each shard's lanes have left to deliver and what an answer does to them is in `progress.rs`,
//! how a batch reaches the function in `invoke.rs`, and what a run reports in `delivery.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::delivery::{Delivery, RunReport, SourceError};
use super::function::Function;
use super::invoke::deliver;
use super::mapping::Mapping;
use super::progress::{Lane, ShardProgress, apply, earliest_retry, next_batches};
use super::rng::Rng;
use super::stream::Shards;
use kinesis_checkpoint::clock::{self, Clock};
use kinesis_checkpoint::gate::{ShardInfo, StartingPosition};

/// Lambda's event source mapping, run locally over a stream.
///
/// ```
/// use std::sync::Arc;
/// use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
/// use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stream = MemoryStream::new("orders", 2);
/// for n in 0..50 {
///     stream.put(&format!("customer-{}", n % 7), format!(r#"{{"n":{n}}}"#));
/// }
/// // A handler that fails each record once: Lambda redelivers from the reported record.
/// let seen = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
/// let handler = {
///     let seen = seen.clone();
///     move |record: Record| {
///         let first_time = seen.lock().unwrap().insert(record.sequence().to_string());
///         async move { if first_time { Outcome::retry("not yet") } else { Outcome::ack() } }
///     }
/// };
/// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), handler);
/// let mapping = Mapping::default().batch_size(10).duplicate_deliveries(0.3).seed(1);
/// let report = EventSource::new(stream, mapping).run(Arc::new(processor)).await?;
/// assert!(report.discarded.is_empty());
/// assert_eq!(report.partial_failures, 50, "each record failed once");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct EventSource<S> {
    stream: Arc<S>,
    mapping: Mapping,
    /// What the source waits on: back-offs, the function's time-out, the deadline it gives.
    clock: Arc<dyn Clock>,
}

impl<S: Shards> EventSource<S> {
    /// An event source over `stream`, configured as `mapping`.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};
    /// let _source = EventSource::new(MemoryStream::new("orders", 1), Mapping::default());
    /// ```
    #[must_use]
    pub fn new(stream: S, mapping: Mapping) -> Self {
        Self {
            stream: Arc::new(stream),
            mapping,
            clock: clock::system(),
        }
    }

    /// Waits on `clock` (default [`SystemClock`](kinesis_checkpoint::clock::SystemClock)): back-offs, the
    /// function's time-out and the deadline each invocation is given. On a virtual clock (the
    /// one the stream, the store and the processor run on), a run takes no real time for its
    /// waits and replays exactly.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};
    /// use kinesis_checkpoint::clock::SystemClock;
    ///
    /// let _source = EventSource::new(MemoryStream::new("orders", 1), Mapping::default())
    ///     .clock(Arc::new(SystemClock));
    /// ```
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Delivers the stream to `function` until every record has been answered for.
    ///
    /// # Errors
    ///
    /// [`SourceError`] when the stream cannot be read, or when a shard stays stuck for
    /// [`Mapping::maximum_deliveries`].
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = MemoryStream::new("orders", 1);
    /// stream.put("k", "a");
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// let report = EventSource::new(stream, Mapping::default()).run(Arc::new(processor)).await?;
    /// assert_eq!(report.records_delivered, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run(&self, function: Arc<dyn Function>) -> Result<RunReport, SourceError> {
        self.run_observed(function, |_| {}).await
    }

    /// As [`run`](Self::run), calling `observe` with every delivery once it is answered (for a
    /// progress display, or a test's log).
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = MemoryStream::new("orders", 1);
    /// stream.put("k", "a");
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// let mut shards = Vec::new();
    /// EventSource::new(stream, Mapping::default())
    ///     .run_observed(Arc::new(processor), |delivery| shards.push(delivery.shard.clone()))
    ///     .await?;
    /// assert_eq!(shards, ["shardId-000000000000"]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_observed(
        &self,
        function: Arc<dyn Function>,
        mut observe: impl FnMut(&Delivery),
    ) -> Result<RunReport, SourceError> {
        let mut rng = Rng::new(self.mapping.seed);
        let mut shards: BTreeMap<String, ShardProgress> = BTreeMap::new();
        let mut report = RunReport::default();
        let mut first_listing = true;
        loop {
            self.discover(&mut shards, &mut rng, first_listing).await?;
            first_listing = false;
            // One reading of the clock for both: a lane skipped as not yet due must be found
            // waiting, however long the machine took in between, or the run would end with
            // records undelivered.
            let now = self.clock.now_millis();
            let clock = self.stream.now_millis();
            let batches = next_batches(
                &self.mapping,
                &mut shards,
                clock,
                &mut rng,
                &mut report,
                now,
            );
            if batches.is_empty() {
                match earliest_retry(&shards, now) {
                    Some(when) => {
                        self.clock.sleep_until(when).await;
                        continue;
                    }
                    None => return Ok(report),
                }
            }
            let timeout = self.mapping.function_timeout;
            let answers = deliver(
                &*self.stream,
                (self.clock.as_ref(), timeout),
                &function,
                batches,
                &shards,
                &mut report,
            )
            .await;
            for (batch, answer) in answers {
                let delivery = apply(
                    &self.mapping,
                    &mut shards,
                    &batch,
                    answer,
                    &mut rng,
                    &mut report,
                    self.clock.now_millis(),
                );
                observe(&delivery);
            }
            self.stream.advance(self.mapping.round_time);
            if report.deliveries >= self.mapping.maximum_deliveries {
                return Err(self.stuck(&shards, report.deliveries));
            }
        }
    }

    /// Lists the shards, starts tracking new ones and reads what has been added to each.
    async fn discover(
        &self,
        shards: &mut BTreeMap<String, ShardProgress>,
        rng: &mut Rng,
        first_listing: bool,
    ) -> Result<(), SourceError> {
        let listed: Vec<ShardInfo> = self.stream.list().await.map_err(|e| self.failed(&*e))?;
        for info in listed {
            let mut progress = shards.remove(&info.id).unwrap_or_else(|| ShardProgress {
                early: !info.parents.is_empty() && rng.chance(self.mapping.children_before_parents),
                parents: info.parents.clone(),
                records: Vec::new(),
                ended: false,
                lanes: vec![
                    Lane::new(self.mapping.batch_size);
                    self.mapping.parallelization_factor
                ],
            });
            while !progress.ended {
                let after = progress.records.last().map(|r| r.sequence.as_str());
                let read = self
                    .stream
                    .read(&info.id, after, 10_000)
                    .await
                    .map_err(|e| self.failed(&*e))?;
                let more = read.records.len() == 10_000;
                progress.records.extend(read.records);
                progress.ended = read.ended;
                if !more {
                    break;
                }
            }
            // `LATEST` skips what the shards held when the mapping started; children found
            // later are read from their start.
            if first_listing && self.mapping.starting_position != StartingPosition::TrimHorizon {
                let end = progress.records.len();
                for lane in &mut progress.lanes {
                    lane.next = end;
                }
            }
            shards.insert(info.id, progress);
        }
        Ok(())
    }

    fn failed(&self, error: &(dyn std::error::Error + Send + Sync)) -> SourceError {
        SourceError::Stream {
            stream: self.stream.name().to_owned(),
            error: error.to_string(),
        }
    }

    fn stuck(&self, shards: &BTreeMap<String, ShardProgress>, deliveries: u64) -> SourceError {
        let worst = shards
            .iter()
            .flat_map(|(id, s)| s.lanes.iter().map(move |l| (id, s, l)))
            .max_by_key(|(_, _, lane)| lane.failures);
        let (shard, sequence, failures, last) = worst.map_or_else(
            || (String::new(), String::new(), 0, String::new()),
            |(id, s, lane)| {
                (
                    id.clone(),
                    s.records
                        .get(lane.next)
                        .map(|r| r.sequence.clone())
                        .unwrap_or_default(),
                    lane.failures,
                    lane.last_failure.clone(),
                )
            },
        );
        SourceError::Stuck {
            stream: self.stream.name().to_owned(),
            shard,
            sequence,
            deliveries,
            failures,
            last,
        }
    }
}
