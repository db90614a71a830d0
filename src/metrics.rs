//! What one invocation did, as `CloudWatch` metrics in the embedded metric format (EMF).
//!
//! An operator needs to see from `CloudWatch` how many records a function took in, processed,
//! skipped as duplicates, held back at the parent gate, reported for a retry or dead-lettered,
//! and what the lease table cost, without shipping a metrics client in every function. Lambda
//! sends a function's standard output to `CloudWatch` Logs, and `CloudWatch` turns a log line in
//! the [embedded metric format] into metrics by itself: one JSON line per invocation is enough,
//! with no request and no extra latency.
//!
//! The counts come from the [`BatchReport`] of the invocation; the `DynamoDB` requests are the
//! ones the store really sent ([`CheckpointStore::requests`]), and the checkpoint latency is the
//! measured time of each final write.
//!
//! [embedded metric format]: https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::clock::{Clock, SystemClock};
use crate::report::{BatchReport, Disposition, RecordReport, StopReason};
use crate::store::metered::{self, Counters, Metered, Timed};
use crate::store::{CheckpointStore, Layered};

/// The `CloudWatch` namespace the metrics go to unless another is named.
pub const DEFAULT_NAMESPACE: &str = "KinesisCheckpoint";

/// Where the EMF lines go: standard output by default, which Lambda sends to `CloudWatch` Logs.
pub type MetricsSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How a processor publishes its metrics: the namespace, the function dimension and the sink.
///
/// # Examples
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// use kinesis_checkpoint::metrics::{InvocationMetrics, Metrics};
///
/// let lines = Arc::new(Mutex::new(Vec::new()));
/// let sink = Arc::clone(&lines);
/// let metrics = Metrics::new("Orders")
///     .function("ledger")
///     .sink(Arc::new(move |line: &str| sink.lock().unwrap().push(line.to_owned())));
/// metrics.emit(&InvocationMetrics::default());
/// let document: serde_json::Value = serde_json::from_str(&lines.lock().unwrap()[0])?;
/// assert_eq!(document["_aws"]["CloudWatchMetrics"][0]["Namespace"], "Orders");
/// assert_eq!(document["Function"], "ledger");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone)]
pub struct Metrics {
    namespace: String,
    function: Option<String>,
    sink: MetricsSink,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("namespace", &self.namespace)
            .field("function", &self.function)
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(DEFAULT_NAMESPACE)
    }
}

impl Metrics {
    /// Metrics in `namespace`, with the function named by Lambda's `AWS_LAMBDA_FUNCTION_NAME`
    /// as a dimension, written to standard output.
    ///
    /// ```
    /// # use kinesis_checkpoint::metrics::Metrics;
    /// let metrics = Metrics::new("Orders");
    /// ```
    #[must_use]
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            function: std::env::var("AWS_LAMBDA_FUNCTION_NAME").ok(),
            sink: Arc::new(|line: &str| println!("{line}")),
        }
    }

    /// Names the function dimension (instead of `AWS_LAMBDA_FUNCTION_NAME`).
    ///
    /// ```
    /// # use kinesis_checkpoint::metrics::Metrics;
    /// let metrics = Metrics::new("Orders").function("ledger");
    /// ```
    #[must_use]
    pub fn function(mut self, name: impl Into<String>) -> Self {
        self.function = Some(name.into());
        self
    }

    /// Sends each EMF line to `sink` instead of standard output.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::metrics::Metrics;
    /// let metrics = Metrics::new("Orders").sink(Arc::new(|line: &str| eprintln!("{line}")));
    /// ```
    #[must_use]
    pub fn sink(mut self, sink: MetricsSink) -> Self {
        self.sink = sink;
        self
    }

    /// Writes one EMF line for `metrics`.
    ///
    /// ```
    /// # use kinesis_checkpoint::metrics::{InvocationMetrics, Metrics};
    /// Metrics::new("Orders").emit(&InvocationMetrics::default());
    /// ```
    pub fn emit(&self, metrics: &InvocationMetrics) {
        self.emit_at(metrics, SystemClock.now_millis());
    }

    /// Writes one EMF line for `metrics`, stamped `now` (epoch milliseconds).
    fn emit_at(&self, metrics: &InvocationMetrics, now: u64) {
        let document = metrics.document(&self.namespace, self.function.as_deref(), now);
        (self.sink)(&document.to_string());
    }
}

/// What one invocation did, in numbers.
///
/// ```
/// use kinesis_checkpoint::metrics::InvocationMetrics;
///
/// let metrics = InvocationMetrics::default();
/// let document = metrics.document("Orders", Some("ledger"), 1_700_000_000_000);
/// assert_eq!(document["RecordsIn"], 0);
/// assert_eq!(document["_aws"]["Timestamp"], 1_700_000_000_000_u64);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct InvocationMetrics {
    /// The stream of the batch (Lambda sends one stream per invocation).
    pub stream: Option<String>,
    /// Records in the batch, KPL sub-records counted one by one.
    pub records_in: u64,
    /// Records the handler ran and the checkpoint covers.
    pub processed: u64,
    /// Records skipped as at or below the checkpoint: redeliveries.
    pub duplicates: u64,
    /// Records of shards held back until their parents are finished.
    pub held: u64,
    /// Records that failed in the handler (retry, panic, time-out, rejection without a sink)
    /// and were reported for redelivery.
    pub failed: u64,
    /// Batch item failures answered to Lambda (at most one per shard).
    pub reported: u64,
    /// Records moved to the dead-letter sink.
    pub dead_lettered: u64,
    /// Records processed whose checkpoint could not be written: they will run again.
    pub uncheckpointed: u64,
    /// Records the event source mapping skipped that were read from the stream and processed
    /// or dead-lettered here (see [`gap`](crate::gap)).
    pub recovered: u64,
    /// Ranges the mapping skipped (outside the contract), each named by an error line: read
    /// back and run, or, when nothing can read them, lost unless replayed by hand.
    pub gaps: u64,
    /// Batches an earlier invocation died running (its lease lapsed without a checkpoint),
    /// found by this one's claim.
    pub deaths: u64,
    /// Requests the lease store sent, when it counts them.
    pub dynamodb_requests: Option<u64>,
    /// The time of each final checkpoint-and-release write.
    pub checkpoint_latency: Vec<Duration>,
}

/// How many of `dispositions` were processed or dead-lettered here.
fn done(dispositions: impl IntoIterator<Item = Disposition>) -> u64 {
    count(
        dispositions
            .into_iter()
            .filter(|disposition| {
                matches!(
                    disposition,
                    Disposition::Processed | Disposition::DeadLettered
                )
            })
            .count(),
    )
}

/// How many of a gap's recovered records were done here.
fn recovered_done(records: &[RecordReport]) -> u64 {
    done(records.iter().map(|record| record.disposition))
}

impl InvocationMetrics {
    /// The counts of `report`; the store's requests and the latencies are added by the caller.
    ///
    /// ```
    /// # use kinesis_checkpoint::BatchReport;
    /// # use kinesis_checkpoint::metrics::InvocationMetrics;
    /// let metrics = InvocationMetrics::from_report(&BatchReport::default());
    /// assert_eq!(metrics.processed, 0);
    /// ```
    #[must_use]
    pub fn from_report(report: &BatchReport) -> Self {
        let mut metrics = Self {
            stream: report.shards.first().map(|s| s.key.stream().to_owned()),
            reported: count(report.response().batch_item_failures.len()),
            ..Self::default()
        };
        for shard in &report.shards {
            metrics.records_in += count(shard.records.len());
            metrics.processed += count(shard.count(Disposition::Processed));
            metrics.duplicates += count(shard.count(Disposition::Duplicate));
            metrics.dead_lettered += count(shard.count(Disposition::DeadLettered));
            metrics.uncheckpointed += count(shard.count(Disposition::Uncheckpointed));
            if let Some(gap) = &shard.gap {
                metrics.recovered += recovered_done(&gap.recovered);
                metrics.gaps += 1;
            }
            metrics.deaths += u64::from(shard.died_at.is_some());
            match shard.stopped.as_ref().map(|(_, reason)| reason) {
                Some(StopReason::Held(_)) => metrics.held += count(shard.records.len()),
                Some(
                    StopReason::Retry(_)
                    | StopReason::Rejected(_)
                    | StopReason::Panicked(_)
                    | StopReason::HandlerTimedOut
                    | StopReason::DeadLetterFailed(_),
                ) => metrics.failed += 1,
                _ => {}
            }
        }
        metrics.records_in += count(report.orphans.len());
        metrics
    }

    /// The EMF document: the `_aws` metadata naming the metrics, the dimensions (`Stream`, and
    /// `Function` when known) and the values; `timestamp_millis` is epoch milliseconds.
    ///
    /// ```
    /// # use kinesis_checkpoint::metrics::InvocationMetrics;
    /// let mut metrics = InvocationMetrics::default();
    /// metrics.stream = Some("orders".to_owned());
    /// metrics.dynamodb_requests = Some(2);
    /// let document = metrics.document("Orders", None, 0);
    /// assert_eq!(document["Stream"], "orders");
    /// assert_eq!(document["DynamoDBRequests"], 2);
    /// assert_eq!(document["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0][0], "Stream");
    /// ```
    #[must_use]
    pub fn document(
        &self,
        namespace: &str,
        function: Option<&str>,
        timestamp_millis: u64,
    ) -> Value {
        let mut values = Map::new();
        let mut names = Vec::new();
        let mut put = |name: &str, unit: &str, value: Value| {
            names.push(json!({ "Name": name, "Unit": unit }));
            values.insert(name.to_owned(), value);
        };
        put("RecordsIn", "Count", self.records_in.into());
        put("Processed", "Count", self.processed.into());
        put("Duplicates", "Count", self.duplicates.into());
        put("Held", "Count", self.held.into());
        put("Failed", "Count", self.failed.into());
        put("Reported", "Count", self.reported.into());
        put("DeadLettered", "Count", self.dead_lettered.into());
        put("Uncheckpointed", "Count", self.uncheckpointed.into());
        put("Recovered", "Count", self.recovered.into());
        put("Gap", "Count", self.gaps.into());
        put("Deaths", "Count", self.deaths.into());
        if let Some(requests) = self.dynamodb_requests {
            put("DynamoDBRequests", "Count", requests.into());
        }
        if !self.checkpoint_latency.is_empty() {
            let latencies = self
                .checkpoint_latency
                .iter()
                .map(|latency| Value::from(latency.as_secs_f64() * 1_000.0))
                .collect();
            put("CheckpointLatency", "Milliseconds", Value::Array(latencies));
        }
        let mut dimensions = vec!["Stream"];
        values.insert(
            "Stream".to_owned(),
            self.stream.as_deref().unwrap_or("unknown").into(),
        );
        if let Some(function) = function {
            dimensions.push("Function");
            values.insert("Function".to_owned(), function.into());
        }
        values.insert(
            "_aws".to_owned(),
            json!({
                "Timestamp": timestamp_millis,
                "CloudWatchMetrics": [{
                    "Namespace": namespace,
                    "Dimensions": [dimensions],
                    "Metrics": names,
                }],
            }),
        );
        Value::Object(values)
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The processor's side of the metrics: the store wrapped in the [`Timed`] layer, and the
/// store's request count when the invocation began.
///
/// The invocation runs inside [`scope`](Self::scope), where the checkpoint latencies and the
/// requests of [`DynamoLeaseStore`](crate::DynamoLeaseStore) are counted into its own counters
/// (see `store::metered`). A store that counts its requests only in total
/// ([`CheckpointStore::requests`]) is measured by the difference between [`begin`](Self::begin)
/// and [`end`](Self::end), which includes the requests of invocations that overlap.
pub(crate) struct Meter {
    metrics: Metrics,
    store: Arc<Metered>,
    clock: Arc<dyn Clock>,
}

/// The store's request count at the start of an invocation, and the invocation's counters.
pub(crate) struct Started {
    before: Option<u64>,
    counters: Arc<Counters>,
}

impl Meter {
    /// Wraps `store`, timing its writes and stamping the metrics on `clock`; the processor must
    /// use the returned store from now on.
    pub(crate) fn new(
        metrics: Metrics,
        store: Arc<dyn CheckpointStore>,
        clock: Arc<dyn Clock>,
    ) -> (Self, Arc<dyn CheckpointStore>) {
        let timed = Timed {
            clock: Arc::clone(&clock),
        };
        let metered: Arc<Metered> = Arc::new(Layered::new(store, timed));
        let meter = Self {
            metrics,
            store: Arc::clone(&metered),
            clock,
        };
        (meter, metered)
    }

    /// The metrics this meter emits.
    pub(crate) const fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store the meter wraps.
    pub(crate) fn inner(&self) -> Arc<dyn CheckpointStore> {
        Arc::clone(self.store.inner())
    }

    pub(crate) fn begin(&self) -> Started {
        Started {
            before: self.store.inner().requests(),
            counters: Arc::default(),
        }
    }

    /// Runs `work`, the invocation begun with `started`, counting into its own counters.
    pub(crate) async fn scope<F: Future>(&self, started: &Started, work: F) -> F::Output {
        metered::scope(Arc::clone(&started.counters), work).await
    }

    /// Emits the invocation's metrics.
    pub(crate) fn end(&self, started: &Started, report: &BatchReport) {
        let mut metrics = InvocationMetrics::from_report(report);
        let counted = started.counters.requests();
        // Nothing counted: a store that counts only in total, or no request at all.
        metrics.dynamodb_requests = if counted > 0 {
            Some(counted)
        } else {
            started
                .before
                .zip(self.store.inner().requests())
                .map(|(before, after)| after.saturating_sub(before))
        };
        metrics.checkpoint_latency = started.counters.take_latencies();
        self.metrics.emit_at(&metrics, self.clock.now_millis());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LeaseKey;
    use crate::report::{Held, RecordReport, ShardReport};
    use crate::sequence::Position;
    use crate::sequence::SequenceNumber;

    fn seq(n: u64) -> SequenceNumber {
        n.to_string().parse().expect("a sequence number")
    }

    fn shard(
        shard: &str,
        dispositions: &[Disposition],
        stopped: Option<StopReason>,
    ) -> ShardReport {
        ShardReport {
            key: LeaseKey::new("orders", shard),
            records: dispositions
                .iter()
                .zip(1..)
                .map(|(disposition, n)| RecordReport {
                    position: Position::record(seq(n)),
                    disposition: *disposition,
                })
                .collect(),
            stopped: stopped.map(|reason| (seq(1), reason)),
            checkpoint: None,
            gap: None,
            died_at: None,
        }
    }

    #[test]
    fn a_held_shard_counts_all_its_records_as_held_and_a_fenced_one_as_uncheckpointed() {
        use Disposition::{NotAttempted, Processed, Reported, Uncheckpointed};
        let held = Held::ParentOpen {
            parent: "shardId-000000000000".to_owned(),
        };
        let report = BatchReport {
            shards: vec![
                shard(
                    "shardId-000000000001",
                    &[Reported, NotAttempted, NotAttempted],
                    Some(StopReason::Held(held)),
                ),
                shard(
                    "shardId-000000000002",
                    &[Uncheckpointed, Uncheckpointed],
                    Some(StopReason::CheckpointFenced),
                ),
                shard("shardId-000000000003", &[Processed], None),
            ],
            orphans: Vec::new(),
        };
        let metrics = InvocationMetrics::from_report(&report);
        assert_eq!(
            (
                metrics.records_in,
                metrics.held,
                metrics.uncheckpointed,
                metrics.processed,
                metrics.failed,
                metrics.reported
            ),
            (6, 3, 2, 1, 0, 2)
        );
        assert_eq!(metrics.stream.as_deref(), Some("orders"));
    }
}
