//! The processor: the builder a Lambda function configures, and the service it runs.
//!
//! [`Processor`] gathers the store, the handler and the settings, and answers Lambda through
//! [`service`](Processor::service) or [`process`](Processor::process). What an invocation does
//! with a batch (claim, gate, dedupe, dispatch, dead letters, checkpoint, answer) is the
//! engine's, which reads the settings filled in here and never the builder itself.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use lambda_runtime::{Context, Diagnostic, LambdaEvent, Service};

use crate::clock::Clock;
use crate::dead_letter::DeadLetterSink;
use crate::engine::{self, Mode, Settings};
pub use crate::engine::{
    DEFAULT_CLOCK_SKEW, DEFAULT_DEADLINE_MARGIN, DEFAULT_LEASE_TTL, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_DONE_ABOVE,
};
use crate::event::{LambdaKinesisEvent, MalformedRecord};
use crate::gate::Gate;
use crate::handler::Handler;
use crate::metrics::{Meter, Metrics};
pub use crate::report::{BatchReport, Disposition, RecordReport, ShardReport, StopReason};
use crate::store::CheckpointStore;

/// Runs a [`Handler`] over Lambda's Kinesis batches, effectively once per record.
///
/// Cloning is cheap: the store and the handler are shared.
///
/// # Examples
///
/// A whole Lambda function:
///
/// ```no_run
/// use std::sync::Arc;
///
/// use kinesis_checkpoint::{DynamoLeaseStore, Outcome, Processor, Record};
///
/// async fn handle(record: Record) -> Outcome {
///     tracing::info!(sequence = %record.sequence(), "processed");
///     Outcome::ack()
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), lambda_runtime::Error> {
///     let config = aws_config::load_from_env().await;
///     let leases = Arc::new(DynamoLeaseStore::new(&config, "orders-leases"));
///     lambda_runtime::run(Processor::new(leases, handle).service()).await
/// }
/// ```
pub struct Processor<H> {
    settings: Settings<H>,
}

impl<H> Clone for Processor<H> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
        }
    }
}

impl<H> fmt::Debug for Processor<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = &self.settings;
        f.debug_struct("Processor")
            .field("dead_letters", &settings.dead_letters.is_some())
            .field("gate", &settings.gate)
            .field("max_attempts", &settings.max_attempts)
            .field("lease_ttl", &settings.lease_ttl)
            .field("clock_skew", &settings.clock_skew)
            .field("deadline_margin", &settings.deadline_margin)
            .field("max_in_flight", &settings.max_in_flight)
            .field("max_done_above", &settings.max_done_above)
            .field("mode", &settings.mode)
            .field("metrics", &settings.meter.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a batch failed as a whole instead of reporting one record per shard.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// A record without a usable sequence number: no identifier can name it in a partial batch
    /// failure, so the whole batch fails from it and Lambda delivers it again (or bisects).
    /// The records before it were processed and checkpointed.
    #[error("{0}; the batch fails from this record so that Lambda delivers it again")]
    Unreportable(MalformedRecord),
}

impl From<ProcessError> for Diagnostic {
    fn from(error: ProcessError) -> Self {
        Self {
            error_type: "KinesisCheckpoint.ProcessError".to_owned(),
            error_message: error.to_string(),
        }
    }
}

impl<H: Handler> Processor<H> {
    /// A processor that keeps its leases and checkpoints in `store` and runs `handler` on each
    /// record.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    ///
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_record: Record| async {
    ///     Outcome::ack()
    /// });
    /// ```
    pub fn new(store: Arc<dyn CheckpointStore>, handler: H) -> Self {
        Self {
            settings: Settings::new(store, handler),
        }
    }

    /// Emits each invocation's [metrics](crate::metrics) as one `CloudWatch` embedded-metric
    /// line (off by default): records in, processed, duplicates, held, failed, reported,
    /// dead-lettered, the lease store's requests and the checkpoint write's latency.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// use kinesis_checkpoint::metrics::Metrics;
    ///
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .metrics(Metrics::new("Orders"));
    /// ```
    #[must_use]
    pub fn metrics(mut self, metrics: Metrics) -> Self {
        let settings = &mut self.settings;
        let store = match &settings.meter {
            // Set again: replace the settings, not wrap the wrapper.
            Some(meter) => meter.inner(),
            None => Arc::clone(&settings.store),
        };
        let (meter, metered) = Meter::new(metrics, store, Arc::clone(&settings.clock));
        settings.store = metered;
        settings.meter = Some(Arc::new(meter));
        self
    }

    /// Reads every time from `clock` (default [`SystemClock`](crate::clock::SystemClock)): the
    /// deadline, the lease's local view and its renewals, the handler's time limit, the failing
    /// record's stamps, dead letters' `at`, the metrics' timestamp and latency. A simulation
    /// passes a virtual clock (the one its store and event source run on) and replays exactly.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// use kinesis_checkpoint::clock::SystemClock;
    ///
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .clock(Arc::new(SystemClock));
    /// ```
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        let settings = &mut self.settings;
        settings.clock = clock;
        // The meter times writes on the clock too: wrap the store again with the new one.
        if let Some(meter) = settings.meter.take() {
            let (meter, metered) = Meter::new(
                meter.metrics().clone(),
                meter.inner(),
                Arc::clone(&settings.clock),
            );
            settings.store = metered;
            settings.meter = Some(Arc::new(meter));
        }
        self
    }

    /// Moves records that can never succeed to `sink`: at once when the handler rejects one, and
    /// after [`max_attempts`](Self::max_attempts) failures (retries, panics, time-outs) of the
    /// same record, counted across invocations in the shard's row. The checkpoint moves past a
    /// record only once the sink has taken it. Without a sink, every failed record is reported
    /// and retried, never dropped.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryDeadLetters, MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .dead_letters(Arc::new(MemoryDeadLetters::new()));
    /// ```
    #[must_use]
    pub fn dead_letters(mut self, sink: Arc<dyn DeadLetterSink>) -> Self {
        self.settings.dead_letters = Some(sink);
        self
    }

    /// Holds a child shard's batches back until its parents are finished (see
    /// [`Gate`]). Without a gate, batches of a child run as they come.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::gate::{Gate, ShardInfo, StartingPosition, Topology};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// fn processor(topology: Arc<dyn Topology>) -> Processor<impl kinesis_checkpoint::Handler> {
    ///     Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///         .gate(Gate::new(topology, StartingPosition::TrimHorizon))
    /// }
    /// ```
    #[must_use]
    pub fn gate(mut self, gate: Gate) -> Self {
        self.settings.gate = Some(Arc::new(gate));
        self
    }

    /// Whether KPL aggregates are unpacked into their user records (on by default). Each
    /// sub-record reaches the handler on its own, with its sub-sequence number, and the
    /// checkpoint can stop inside an aggregate (kept beside it, in `aggregate_sequence` and
    /// `aggregate_sub`), so a redelivery skips the sub-records already done; an aggregate whose
    /// last sub-record is done is checkpointed whole. Turn it off only for a consumer that wants the raw aggregates.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let raw = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .deaggregate(false);
    /// ```
    #[must_use]
    pub const fn deaggregate(mut self, on: bool) -> Self {
        self.settings.deaggregate = on;
        self
    }

    /// How many failed attempts a record gets before it is dead-lettered (at least 1; default
    /// 3). Only with a [`dead_letters`](Self::dead_letters) sink.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryDeadLetters, MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .dead_letters(Arc::new(MemoryDeadLetters::new()))
    ///     .max_attempts(5);
    /// ```
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.max_attempts = attempts.max(1);
        self
    }

    /// How long each lease is taken or renewed for (capped by the time left before the
    /// deadline). Renewal runs every third of it while the batch runs.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .lease_ttl(Duration::from_secs(10));
    /// ```
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.settings.lease_ttl = ttl.max(Duration::from_millis(3));
        self
    }

    /// How far another sandbox's clock may run ahead of this one's (default
    /// [`DEFAULT_CLOCK_SKEW`]). The stored lease expiry is this sandbox's clock plus the TTL and
    /// a concurrent delivery elsewhere judges it by its own clock, so this invocation stops
    /// relying on its lease that much before the expiry it wrote. The margin never exceeds a
    /// third of the lease's TTL; keep the TTL well above the skew.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .clock_skew(Duration::from_millis(2_500));
    /// ```
    #[must_use]
    pub const fn clock_skew(mut self, skew: Duration) -> Self {
        self.settings.clock_skew = skew;
        self
    }

    /// How long before the deadline no new record is started and a running handler is
    /// stopped, so the checkpoint can be written before Lambda times out.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .deadline_margin(Duration::from_millis(500));
    /// ```
    #[must_use]
    pub const fn deadline_margin(mut self, margin: Duration) -> Self {
        self.settings.deadline_margin = margin;
        self
    }

    /// Runs records of different partition keys concurrently, up to `max_in_flight` at once,
    /// and the records of one key strictly in order (see [`keyed`](crate::keyed)). 1, the
    /// default, runs the whole shard in order, one record at a time.
    ///
    /// When a record of a key fails, no later record of that key runs; other keys go on. The
    /// checkpoint is the highest position below which every record is done, the records done
    /// above it are remembered in the row (at most [`max_done_above`](Self::max_done_above)) so
    /// that a redelivery skips them, and the record reported is the lowest one not done.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .concurrency(32);
    /// ```
    #[must_use]
    pub fn concurrency(mut self, max_in_flight: usize) -> Self {
        self.settings.max_in_flight = max_in_flight.max(1);
        self
    }

    /// How many records done above the checkpoint the row may remember (default
    /// [`DEFAULT_MAX_DONE_ABOVE`]), under per-key [`concurrency`](Self::concurrency). At the
    /// bound, no new record starts above the lowest one not done: the rest of the batch is not
    /// attempted and comes back with the redelivery, so nothing runs twice and the row stays
    /// small (a `DynamoDB` item holds 400 KB; a position takes about 60 bytes).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .concurrency(32)
    ///     .max_done_above(500);
    /// ```
    #[must_use]
    pub fn max_done_above(mut self, positions: usize) -> Self {
        self.settings.max_done_above = positions.max(1);
        self
    }

    /// How checkpoints are kept: [`Mode::Shard`] (the default) for an event source mapping with
    /// `ParallelizationFactor` 1, [`Mode::PartitionKey`] for 2 to 10 (see
    /// [`partition_key`](crate::partition_key)).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Mode, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .mode(Mode::PartitionKey)
    ///     .concurrency(16);
    /// ```
    #[must_use]
    pub const fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// How long a partition key's row outlives its last write in [`Mode::PartitionKey`]
    /// (default [`DEFAULT_KEY_TTL`](crate::partition_key::DEFAULT_KEY_TTL), 8 days): set it to the stream's retention and a day.
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Mode, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .mode(Mode::PartitionKey)
    ///     .key_ttl(Duration::from_hours(25));
    /// ```
    #[must_use]
    pub const fn key_ttl(mut self, ttl: Duration) -> Self {
        self.settings.key_ttl = ttl;
        self
    }

    /// The processor as a Lambda service, for `lambda_runtime::run`.
    ///
    /// It is `Clone`, as `lambda_runtime::run_concurrent` (feature `concurrency-tokio`, for
    /// Lambda Managed Instances) needs to run several invocations at once in one process: each
    /// invocation claims its shard as its own owner (the function name and its request id), so
    /// two of one shard exclude each other through the lease while other shards proceed.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # async fn run() -> Result<(), lambda_runtime::Error> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// lambda_runtime::run(processor.service()).await
    /// # }
    /// ```
    #[must_use]
    pub fn service(
        self,
    ) -> impl Service<
        LambdaEvent<LambdaKinesisEvent>,
        Response = KinesisEventResponse,
        Error = ProcessError,
        Future = impl Future<Output = Result<KinesisEventResponse, ProcessError>> + Send,
    > + Clone {
        // The event is read as `LambdaKinesisEvent`: exact arrival times, and no timestamp
        // that fails or panics the batch.
        lambda_runtime::service_fn(move |event: LambdaEvent<LambdaKinesisEvent>| {
            let processor = self.clone();
            async move { processor.process(event.payload.0, &event.context).await }
        })
    }

    /// Processes one batch and answers Lambda.
    ///
    /// # Errors
    ///
    /// [`ProcessError::Unreportable`] when a record has no usable sequence number; the records
    /// before it were processed and checkpointed.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// let event = serde_json::from_str(include_str!("../events/batch.json"))?;
    /// let response = processor.process(event, &lambda_runtime::Context::default()).await?;
    /// assert!(response.batch_item_failures.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn process(
        &self,
        event: KinesisEvent,
        context: &Context,
    ) -> Result<KinesisEventResponse, ProcessError> {
        self.process_batch(event, context)
            .await
            .map(|report| report.response())
    }

    /// Processes one batch and says what became of every record: what
    /// [`process`](Self::process) answers Lambda, with the detail.
    ///
    /// # Errors
    ///
    /// As [`process`](Self::process).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{Disposition, MemoryLeaseStore, Outcome, Processor, Record};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// let event: aws_lambda_events::event::kinesis::KinesisEvent =
    ///     serde_json::from_str(include_str!("../events/batch.json"))?;
    /// let context = lambda_runtime::Context::default();
    /// let first = processor.process_batch(event.clone(), &context).await?;
    /// let again = processor.process_batch(event, &context).await?;
    /// assert_eq!(again.shards[0].count(Disposition::Duplicate), first.shards[0].count(Disposition::Processed));
    /// # Ok(())
    /// # }
    /// ```
    #[tracing::instrument(name = "batch", skip_all, fields(request = context.request_id, records = event.records.len()))]
    pub async fn process_batch(
        &self,
        event: KinesisEvent,
        context: &Context,
    ) -> Result<BatchReport, ProcessError> {
        let (report, unreportable) = engine::run(&self.settings, event, context).await;
        match unreportable {
            Some(malformed) => {
                tracing::error!(%malformed, "failing the whole batch");
                Err(ProcessError::Unreportable(malformed))
            }
            None => Ok(report),
        }
    }
}
