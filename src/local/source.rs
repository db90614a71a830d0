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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_lambda_events::event::streams::KinesisEventResponse;
use lambda_runtime::Context;
use tokio::time::Instant;

use super::function::{Function, InvocationError};
use super::mapping::Mapping;
use super::rng::Rng;
use super::stream::{Shards, StreamRecord};
use crate::gate::{ShardInfo, StartingPosition};

/// Why the event source discarded a record, as Lambda would have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardReason {
    /// Its batch failed more often than `MaximumRetryAttempts` allows.
    RetriesExhausted,
    /// It was older than `MaximumRecordAgeInSeconds` when it was due.
    TooOld,
}

/// A record the event source gave up on. Lambda would send its metadata (not its payload) to
/// the mapping's on-failure destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discarded {
    /// Its shard.
    pub shard: String,
    /// Its sequence number.
    pub sequence: String,
    /// Why.
    pub reason: DiscardReason,
}

/// What became of one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// The function answered without failures (or they were ignored).
    Done,
    /// The function reported failures; the next batch starts at `from`.
    PartialFailure {
        /// The lowest reported record.
        from: String,
    },
    /// The invocation failed or timed out: the batch is retried (or bisected).
    Failed(InvocationError),
    /// A concurrent duplicate: its answer is ignored.
    Stray,
}

/// One invocation the event source made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The request id the function saw (`local-N`).
    pub request_id: String,
    /// The shard delivered.
    pub shard: String,
    /// The lane of the shard (0 unless `ParallelizationFactor` is above 1).
    pub lane: usize,
    /// The sequence numbers of the batch, in order.
    pub sequences: Vec<String>,
    /// What became of it.
    pub outcome: DeliveryOutcome,
}

/// What a run did, in counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Invocations made, strays included.
    pub deliveries: u64,
    /// Records delivered, counted once per delivery.
    pub records_delivered: u64,
    /// Concurrent duplicate invocations whose answers were ignored.
    pub strays: u64,
    /// Done batches delivered again on purpose (at-least-once delivery).
    pub redeliveries: u64,
    /// Answers that reported failures.
    pub partial_failures: u64,
    /// Invocations that failed (errors and time-outs).
    pub function_errors: u64,
    /// The request ids of invocations stopped at their time-out.
    pub timed_out: Vec<String>,
    /// Batches split in two after an error.
    pub bisections: u64,
    /// Child shards delivered before their parents were finished.
    pub early_children: u64,
    /// Records given up on.
    pub discarded: Vec<Discarded>,
}

/// Why a run stopped before the stream was drained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The stream could not be read.
    #[error("could not read stream {stream}: {error}")]
    Stream {
        /// The stream.
        stream: String,
        /// What the stream said.
        error: String,
    },
    /// `Mapping::maximum_deliveries` was reached while a shard kept failing.
    #[error(
        "gave up after {deliveries} deliveries: stream {stream}, shard {shard} is stuck at sequence number {sequence} ({failures} failed attempts; last: {last})"
    )]
    Stuck {
        /// The stream.
        stream: String,
        /// The stuck shard.
        shard: String,
        /// The record it is stuck at.
        sequence: String,
        /// Deliveries made.
        deliveries: u64,
        /// Failed attempts at that record.
        failures: u32,
        /// The last failure.
        last: String,
    },
}

/// Lambda's event source mapping, run locally over a stream.
///
/// ```
/// use std::sync::Arc;
/// use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
/// use kinesis_checkpoint::local::{EventSource, Mapping, MemoryStream};
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
}

/// One shard as the event source tracks it.
#[derive(Debug)]
struct ShardProgress {
    parents: Vec<String>,
    /// Every record read so far, in order.
    records: Vec<StreamRecord>,
    /// The shard is closed and `records` holds all of it.
    ended: bool,
    lanes: Vec<Lane>,
    /// Delivered without waiting for its parents.
    early: bool,
}

/// One lane of a shard: all of it, or with a `ParallelizationFactor` above 1, the records of
/// some partition keys.
#[derive(Debug, Clone)]
struct Lane {
    /// Every record of this lane before this index of the shard's records is done with.
    next: usize,
    /// Failed attempts at `next` since it last moved.
    failures: u32,
    /// The batch size now (halved by bisection).
    limit: usize,
    backoff: Duration,
    not_before: Option<Instant>,
    last_failure: String,
}

/// A batch on its way to the function.
struct Batch {
    shard: String,
    lane: usize,
    /// Indexes into the shard's records.
    indexes: Vec<usize>,
    request_id: String,
    stray: bool,
}

impl<S: Shards> EventSource<S> {
    /// An event source over `stream`, configured as `mapping`.
    ///
    /// ```
    /// # use kinesis_checkpoint::local::{EventSource, Mapping, MemoryStream};
    /// let _source = EventSource::new(MemoryStream::new("orders", 1), Mapping::default());
    /// ```
    #[must_use]
    pub fn new(stream: S, mapping: Mapping) -> Self {
        Self {
            stream: Arc::new(stream),
            mapping,
        }
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
    /// # use kinesis_checkpoint::local::{EventSource, Mapping, MemoryStream};
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
    /// # use kinesis_checkpoint::local::{EventSource, Mapping, MemoryStream};
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
            let now = Instant::now();
            let batches = self.next_batches(&mut shards, &mut rng, &mut report, now);
            if batches.is_empty() {
                match earliest_retry(&shards, now) {
                    Some(when) => {
                        tokio::time::sleep_until(when).await;
                        continue;
                    }
                    None => return Ok(report),
                }
            }
            let answers = self.deliver(&function, batches, &shards, &mut report).await;
            for (batch, answer) in answers {
                let delivery = self.apply(&mut shards, &batch, answer, &mut rng, &mut report);
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

    /// One batch per lane that has records due at `now`, and a stray copy of some.
    fn next_batches(
        &self,
        shards: &mut BTreeMap<String, ShardProgress>,
        rng: &mut Rng,
        report: &mut RunReport,
        now: Instant,
    ) -> Vec<Batch> {
        let clock = self.stream.now_millis();
        // A parent the stream no longer lists has expired: nothing of it will come.
        let known: Vec<String> = shards.keys().cloned().collect();
        // A shard is finished once read and done with, and its own parents finished: an empty
        // child of a split is not finished before the split's parent. Parents sort before their
        // children (shard ids grow), so one pass in id order sees them first.
        let mut finished: Vec<String> = Vec::new();
        for (id, shard) in shards.iter() {
            let parents_finished = shard
                .parents
                .iter()
                .all(|p| finished.contains(p) || !known.contains(p));
            if parents_finished && shard.is_finished(self.mapping.parallelization_factor) {
                finished.push(id.clone());
            }
        }
        let mut batches = Vec::new();
        for (id, shard) in shards.iter_mut() {
            let parents_done = shard
                .parents
                .iter()
                .all(|p| finished.contains(p) || !known.contains(p));
            if !(parents_done || shard.early) {
                continue;
            }
            for lane_index in 0..shard.lanes.len() {
                if shard.lanes[lane_index]
                    .not_before
                    .is_some_and(|when| when > now)
                {
                    continue;
                }
                let indexes = self.take_batch(id, shard, lane_index, clock, &mut report.discarded);
                if indexes.is_empty() {
                    continue;
                }
                if !parents_done && shard.lanes[lane_index].failures == 0 {
                    report.early_children += 1;
                }
                let stray = rng.chance(self.mapping.concurrent_deliveries);
                for copy in [false, true] {
                    if copy && !stray {
                        continue;
                    }
                    report.deliveries += 1;
                    batches.push(Batch {
                        shard: id.clone(),
                        lane: lane_index,
                        indexes: indexes.clone(),
                        request_id: format!("local-{}", report.deliveries),
                        stray: copy,
                    });
                }
            }
        }
        batches
    }

    /// The next records of one lane, discarding those too old to deliver.
    fn take_batch(
        &self,
        shard_id: &str,
        shard: &mut ShardProgress,
        lane_index: usize,
        clock: u64,
        discarded: &mut Vec<Discarded>,
    ) -> Vec<usize> {
        let lanes = self.mapping.parallelization_factor;
        let lane = &mut shard.lanes[lane_index];
        let mut indexes = Vec::new();
        let mut i = lane.next;
        while i < shard.records.len() && indexes.len() < lane.limit {
            let record = &shard.records[i];
            if lane_of(&record.partition_key, lanes) == lane_index {
                let too_old = self.mapping.maximum_record_age.is_some_and(|age| {
                    clock.saturating_sub(record.arrival_millis)
                        > u64::try_from(age.as_millis()).unwrap_or(u64::MAX)
                });
                if too_old && indexes.is_empty() {
                    discarded.push(Discarded {
                        shard: shard_id.to_owned(),
                        sequence: record.sequence.clone(),
                        reason: DiscardReason::TooOld,
                    });
                    lane.next = i + 1;
                    lane.failures = 0;
                } else if too_old {
                    break;
                } else {
                    indexes.push(i);
                }
            } else if indexes.is_empty() {
                lane.next = i + 1;
            }
            i += 1;
        }
        indexes
    }

    /// Invokes every batch at once and waits for all the answers.
    async fn deliver(
        &self,
        function: &Arc<dyn Function>,
        batches: Vec<Batch>,
        shards: &BTreeMap<String, ShardProgress>,
        report: &mut RunReport,
    ) -> Vec<(Batch, Result<KinesisEventResponse, InvocationError>)> {
        let timeout = self.mapping.function_timeout;
        let mut tasks = tokio::task::JoinSet::new();
        for (position, batch) in batches.iter().enumerate() {
            let records = &shards[&batch.shard].records;
            let event = self.event(&batch.shard, batch.indexes.iter().map(|&i| &records[i]));
            report.records_delivered += batch.indexes.len() as u64;
            let mut context = Context::default();
            context.request_id.clone_from(&batch.request_id);
            context.deadline = deadline_millis(timeout);
            context.invoked_function_arn =
                "arn:aws:lambda:us-east-1:123456789012:function:local".into();
            let function = Arc::clone(function);
            tasks.spawn(async move {
                let answer =
                    match tokio::time::timeout(timeout, function.invoke(event, context)).await {
                        Ok(answer) => answer,
                        Err(_) => Err(InvocationError::TimedOut(timeout)),
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

    /// Applies one answer to its lane, as the mapping would.
    #[allow(
        clippy::too_many_lines,
        reason = "one decision table, clearer in one place"
    )]
    fn apply(
        &self,
        shards: &mut BTreeMap<String, ShardProgress>,
        batch: &Batch,
        answer: Result<KinesisEventResponse, InvocationError>,
        rng: &mut Rng,
        report: &mut RunReport,
    ) -> Delivery {
        let shard = shards.get_mut(&batch.shard).expect("a tracked shard");
        let sequences: Vec<String> = batch
            .indexes
            .iter()
            .map(|&i| shard.records[i].sequence.clone())
            .collect();
        let mut delivery = Delivery {
            request_id: batch.request_id.clone(),
            shard: batch.shard.clone(),
            lane: batch.lane,
            sequences,
            outcome: DeliveryOutcome::Done,
        };
        if let Err(InvocationError::TimedOut(_)) = &answer {
            report.timed_out.push(batch.request_id.clone());
        }
        if batch.stray {
            report.strays += 1;
            if answer.is_err() {
                report.function_errors += 1;
            }
            delivery.outcome = DeliveryOutcome::Stray;
            return delivery;
        }
        let lane = &mut shard.lanes[batch.lane];
        let last = *batch.indexes.last().expect("a batch is never empty");
        let failed_at = match answer {
            Ok(response) if self.mapping.report_batch_item_failures => {
                let reported: Vec<String> = response
                    .batch_item_failures
                    .iter()
                    .map(|f| f.item_identifier.clone().unwrap_or_default())
                    .collect();
                if reported.is_empty() {
                    None
                } else if let Some(at) = delivery
                    .sequences
                    .iter()
                    .position(|s| reported.contains(s))
                    .filter(|_| reported.iter().all(|r| delivery.sequences.contains(r)))
                {
                    report.partial_failures += 1;
                    delivery.outcome = DeliveryOutcome::PartialFailure {
                        from: delivery.sequences[at].clone(),
                    };
                    Some((at, format!("record {} reported", delivery.sequences[at])))
                } else {
                    // An identifier that is not in the batch fails the whole batch.
                    report.function_errors += 1;
                    let error = format!("unknown batchItemFailures identifiers {reported:?}");
                    delivery.outcome =
                        DeliveryOutcome::Failed(InvocationError::Function(error.clone()));
                    Some((0, error))
                }
            }
            Ok(_) => None,
            Err(error) => {
                report.function_errors += 1;
                let text = error.to_string();
                delivery.outcome = DeliveryOutcome::Failed(error);
                if self.mapping.bisect_batch_on_function_error && batch.indexes.len() > 1 {
                    lane.limit = batch.indexes.len() / 2;
                    report.bisections += 1;
                }
                Some((0, text))
            }
        };
        match failed_at {
            None => {
                if rng.chance(self.mapping.duplicate_deliveries) {
                    report.redeliveries += 1;
                } else {
                    lane.next = last + 1;
                    lane.limit = self.mapping.batch_size;
                }
                lane.succeeded();
            }
            Some((at, error)) => {
                if at > 0 {
                    lane.next = batch.indexes[at];
                    lane.failures = 0;
                }
                lane.failures += 1;
                lane.last_failure = error;
                let exhausted = self
                    .mapping
                    .maximum_retry_attempts
                    .is_some_and(|retries| lane.failures > retries);
                if exhausted {
                    for &i in batch.indexes.iter().filter(|&&i| i >= lane.next) {
                        report.discarded.push(Discarded {
                            shard: batch.shard.clone(),
                            sequence: shard.records[i].sequence.clone(),
                            reason: DiscardReason::RetriesExhausted,
                        });
                    }
                    lane.next = last + 1;
                    lane.limit = self.mapping.batch_size;
                    lane.succeeded();
                } else {
                    lane.back_off(self.mapping.maximum_backoff);
                }
            }
        }
        delivery
    }

    /// The Lambda event for `records` of `shard`.
    fn event<'r>(
        &self,
        shard: &str,
        records: impl Iterator<Item = &'r StreamRecord>,
    ) -> KinesisEvent {
        let arn = self.stream.arn();
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

impl ShardProgress {
    /// Read to its end and every record of every lane done with.
    fn is_finished(&self, lanes: usize) -> bool {
        self.ended
            && self.lanes.iter().enumerate().all(|(index, lane)| {
                self.records[lane.next.min(self.records.len())..]
                    .iter()
                    .all(|r| lane_of(&r.partition_key, lanes) != index)
            })
    }
}

impl Lane {
    const fn new(batch_size: usize) -> Self {
        Self {
            next: 0,
            failures: 0,
            limit: batch_size,
            backoff: Duration::from_millis(1),
            not_before: None,
            last_failure: String::new(),
        }
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.backoff = Duration::from_millis(1);
        self.not_before = None;
    }

    fn back_off(&mut self, maximum: Duration) {
        self.not_before = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(maximum);
    }
}

/// The earliest moment a lane waiting after a failure may be retried, `now` being the moment the
/// batches were chosen. A wait over by then belongs to a lane with nothing left to deliver (it
/// would have had a batch): not a reason to go on.
fn earliest_retry(shards: &BTreeMap<String, ShardProgress>, now: Instant) -> Option<Instant> {
    shards
        .values()
        .flat_map(|s| s.lanes.iter())
        .filter_map(|l| l.not_before)
        .filter(|&when| when > now)
        .min()
}

/// The lane a partition key belongs to: a stable hash, so a key always takes the same lane.
fn lane_of(partition_key: &str, lanes: usize) -> usize {
    if lanes <= 1 {
        return 0;
    }
    // FNV-1a: stable across runs and platforms, unlike the standard library's hasher.
    let hash = partition_key
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    usize::try_from(hash % lanes as u64).unwrap_or(0)
}

/// The deadline of an invocation starting now, in milliseconds since the epoch.
fn deadline_millis(timeout: Duration) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from((now + timeout).as_millis()).unwrap_or(u64::MAX)
}
