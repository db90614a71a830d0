//! The processor: the builder a Lambda function configures, and the service it runs.
//!
//! [`Processor`] gathers the store, the handler and the settings, and answers Lambda through
//! [`service`](Processor::service) or [`process`](Processor::process). What an invocation does
//! with a batch (claim, gate, dedupe, dispatch, dead letters, checkpoint, answer) is the
//! engine's, which reads the settings filled in here and never the builder itself.
//!
//! The mode is part of the builder's type ([`ShardMode`], [`PartitionKeyMode`]), so that a
//! setting exists only where it applies: [`lease_ttl`](Processor::lease_ttl),
//! [`clock_skew`](Processor::clock_skew) and [`max_done_above`](Processor::max_done_above) on the
//! shard mode, [`key_ttl`](Processor::key_ttl) on the partition-key mode; a setting the other
//! mode would ignore does not compile there. [`Mode`] is the same choice as a value, read from
//! configuration, for a function that branches at start-up.

mod mode;
#[cfg(feature = "dynamodb")]
mod transactional;

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::KinesisEventResponse;
use lambda_runtime::{Context, Diagnostic, LambdaEvent, Service};

use crate::clock::Clock;
use crate::dead_letter::DeadLetterSink;
use crate::engine::{self, Settings};
pub use crate::engine::{
    DEFAULT_CLOCK_SKEW, DEFAULT_DEADLINE_MARGIN, DEFAULT_KEY_TTL, DEFAULT_LEASE_TTL,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_DONE_ABOVE, Mode, UnknownMode,
};
use crate::event::{InvocationEvent, MalformedRecord};
use crate::gate::Gate;
use crate::handler::Handler;
use crate::metrics::{Meter, Metrics};
use crate::record::EventHold;
use crate::report::BatchReport;

pub use self::mode::{CheckpointMode, PartitionKeyMode, ShardMode};
#[cfg(feature = "dynamodb")]
pub use self::transactional::{Effect, Transactional, TransactionalHandler};

/// Runs a [`Handler`] over Lambda's Kinesis batches, effectively once per record.
///
/// `M` is the mode: [`ShardMode`] (the default, [`Processor::new`]) or [`PartitionKeyMode`]
/// ([`Processor::by_partition_key`]). Cloning is cheap: the store and the handler are shared.
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
pub struct Processor<H, M = ShardMode> {
    settings: Settings<H>,
    mode: PhantomData<M>,
}

impl<H, M> Processor<H, M> {
    /// A processor of mode `M` over settings whose `mode` already says `M`.
    const fn with(settings: Settings<H>) -> Self {
        Self {
            settings,
            mode: PhantomData,
        }
    }
}

impl<H, M> Clone for Processor<H, M> {
    fn clone(&self) -> Self {
        Self::with(self.settings.clone())
    }
}

impl<H, M> fmt::Debug for Processor<H, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings = &self.settings;
        let mut debug = f.debug_struct("Processor");
        debug
            .field("mode", &settings.mode)
            .field("dead_letters", &settings.dead_letters.is_some())
            .field("gate", &settings.gate)
            .field("max_attempts", &settings.max_attempts)
            .field("deadline_margin", &settings.deadline_margin)
            .field("max_in_flight", &settings.max_in_flight);
        // Only the settings of this mode: the others are never read.
        match settings.mode {
            Mode::Shard => debug
                .field("lease_ttl", &settings.lease_ttl)
                .field("clock_skew", &settings.clock_skew)
                .field("max_done_above", &settings.max_done_above),
            Mode::PartitionKey => debug.field("key_ttl", &settings.key_ttl),
        };
        debug
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
    /// A `DynamoDB` stream event with changes but no `shardId` or `eventSourceARN`: the mapping
    /// sets no `TumblingWindowInSeconds`, so no change can be matched to its shard's lease.
    #[cfg(feature = "dynamodb-streams")]
    #[error(
        "the DynamoDB stream event names no shard: set TumblingWindowInSeconds on the event source mapping (900 is fine); nothing was processed"
    )]
    NotAWindowEvent,
}

impl From<ProcessError> for Diagnostic {
    fn from(error: ProcessError) -> Self {
        Self {
            error_type: "KinesisCheckpoint.ProcessError".to_owned(),
            error_message: error.to_string(),
        }
    }
}

/// The settings both modes share, and the service.
impl<H: Handler, M: CheckpointMode> Processor<H, M> {
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
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # use kinesis_checkpoint_testing::MemoryDeadLetters;
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

    /// Above this many bytes of payloads (2 MiB by default), an event of one shard is read in
    /// two steps: each record's position first, then its payload 64 records at a time as
    /// in-order dispatch reaches them, each chunk's part of the event freed once read, so that
    /// a batch larger than the CPU's caches is fetched from memory about once rather than three
    /// times (the `processor` bench). Smaller events are read whole. Only
    /// speed depends on it: every record is treated alike either way, and 0 reads every event
    /// of one shard in chunks.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .read_in_chunks_above(1024 * 1024);
    /// ```
    #[must_use]
    pub const fn read_in_chunks_above(mut self, bytes: usize) -> Self {
        self.settings.read_in_chunks_above = bytes;
        self
    }

    /// How many failed attempts a record gets before it is dead-lettered (at least 1; default
    /// 3). Only with a [`dead_letters`](Self::dead_letters) sink.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # use kinesis_checkpoint_testing::MemoryDeadLetters;
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() })
    ///     .dead_letters(Arc::new(MemoryDeadLetters::new()))
    ///     .max_attempts(5);
    /// ```
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.max_attempts = attempts.max(1);
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
    /// and the records of one key strictly in order. 1, the
    /// default, runs the whole shard in order, one record at a time.
    ///
    /// When a record of a key fails, no later record of that key runs; other keys go on. The
    /// checkpoint is the highest position below which every record is done, the records done
    /// above it are remembered in the row (in the shard mode at most
    /// [`max_done_above`](Processor::max_done_above)) so
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
        LambdaEvent<InvocationEvent>,
        Response = KinesisEventResponse,
        Error = ProcessError,
        Future = impl Future<Output = Result<KinesisEventResponse, ProcessError>> + Send,
    > + Clone {
        // The event is read as `InvocationEvent`: exact arrival times, no timestamp that fails
        // or panics the batch, and no copy of a field the processor never reads.
        lambda_runtime::service_fn(move |event: LambdaEvent<InvocationEvent>| {
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
    /// # // Absolute: rustdoc merges the doctests into one crate in a directory of its own, where
    /// # // a relative path does not resolve, and it then compiles each doctest alone (minutes).
    /// let json = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/events/batch.json"));
    /// let event = serde_json::from_str(json)?;
    /// let response = processor.process(event, &lambda_runtime::Context::default()).await?;
    /// assert!(response.batch_item_failures.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn process(
        &self,
        mut event: KinesisEvent,
        context: &Context,
    ) -> Result<KinesisEventResponse, ProcessError> {
        let (report, hold) = self.run_batch(&mut event, context).await;
        let response = report.map(|report| report.response());
        // The report (the records, their payloads and the block that holds them) is freed
        // before what is left of the event (a dozen small strings per record), whether the
        // event still holds them or the records read in place do (`hold`). Freed after those
        // strings, the report would make glibc sort them all out of its fast bins once more:
        // a fifth of what the processor adds per record at 100 records (the `memory` bench).
        drop(event);
        drop(hold);
        response
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
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
    /// # use kinesis_checkpoint::report::Disposition;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), |_: Record| async { Outcome::ack() });
    /// let json = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/events/batch.json"));
    /// let event: aws_lambda_events::event::kinesis::KinesisEvent = serde_json::from_str(json)?;
    /// let context = lambda_runtime::Context::default();
    /// let first = processor.process_batch(event.clone(), &context).await?;
    /// let again = processor.process_batch(event, &context).await?;
    /// assert_eq!(again.shards[0].count(Disposition::Duplicate), first.shards[0].count(Disposition::Processed));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn process_batch(
        &self,
        mut event: KinesisEvent,
        context: &Context,
    ) -> Result<BatchReport, ProcessError> {
        // The report holds the batch's records, and with them the event: no order to keep.
        self.run_batch(&mut event, context).await.0
    }

    /// Runs `event`, leaving in it what was not taken out of it (all but the payloads and
    /// partition keys, or nothing when its records are read in place), for the caller to free
    /// when it chooses, with the hold on the records read in place.
    #[tracing::instrument(name = "batch", skip_all, fields(request = context.request_id, records = event.records.len()))]
    async fn run_batch(
        &self,
        event: &mut KinesisEvent,
        context: &Context,
    ) -> (Result<BatchReport, ProcessError>, EventHold) {
        let (report, unreportable, hold) = engine::run(&self.settings, event, context).await;
        let report = match unreportable {
            Some(malformed) => {
                tracing::error!(%malformed, "failing the whole batch");
                Err(ProcessError::Unreportable(malformed))
            }
            None => Ok(report),
        };
        (report, hold)
    }
}
