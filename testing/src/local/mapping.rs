//! The settings of a local event source mapping: the ones Lambda's Kinesis mapping has
//! (`BatchSize`, `ParallelizationFactor`, `BisectBatchOnFunctionError`, `MaximumRetryAttempts`,
//! `MaximumRecordAgeInSeconds`, `FunctionResponseTypes`, `StartingPosition`), and the chances of
//! the misbehaviour Lambda is allowed (duplicate and concurrent deliveries, a child shard
//! delivered before its parents are finished), which a local run injects on purpose.

use std::time::Duration;

use kinesis_checkpoint::gate::StartingPosition;

/// How a local event source delivers a stream, as an event source mapping is configured.
///
/// The defaults are Lambda's, except the retry and age limits, which default to the toolkit's
/// advice (unlimited: a failing record is retried until it succeeds or is dead-lettered), and
/// the function time-out, which is short for tests.
///
/// ```
/// use std::time::Duration;
/// use kinesis_checkpoint_testing::local::Mapping;
///
/// let mapping = Mapping::default()
///     .batch_size(10)
///     .maximum_retry_attempts(Some(2))
///     .duplicate_deliveries(0.1)
///     .seed(7);
/// assert_eq!(mapping.batch_size, 10);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Mapping {
    /// `BatchSize`: at most this many records per invocation (1 to 10,000).
    pub batch_size: usize,
    /// `ParallelizationFactor`: batches of one shard in flight at once (1 to 10), split by
    /// partition key so that one key's records stay in order.
    pub parallelization_factor: usize,
    /// `BisectBatchOnFunctionError`: a batch whose invocation fails is split in two.
    pub bisect_batch_on_function_error: bool,
    /// `MaximumRetryAttempts`: `None` is -1, retry until the records expire.
    pub maximum_retry_attempts: Option<u32>,
    /// `MaximumRecordAgeInSeconds`: `None` is -1, never discard a record for its age.
    pub maximum_record_age: Option<Duration>,
    /// `FunctionResponseTypes: [ReportBatchItemFailures]`: without it, a response's
    /// `batchItemFailures` are ignored and the batch counts as done.
    pub report_batch_item_failures: bool,
    /// `StartingPosition`: where the shards present at the start are read from.
    pub starting_position: StartingPosition,
    /// How long an invocation may run before Lambda stops it (the function's time-out).
    pub function_timeout: Duration,
    /// Chance that a batch, once done, is delivered again (at-least-once delivery).
    pub duplicate_deliveries: f64,
    /// Chance that a batch is delivered to two invocations at once.
    pub concurrent_deliveries: f64,
    /// Chance that a child shard is delivered before its parents are finished.
    pub children_before_parents: f64,
    /// Simulated time that passes on the stream's clock per round of deliveries.
    pub round_time: Duration,
    /// The longest wait before a failed batch is retried (the wait doubles from 1 ms).
    pub maximum_backoff: Duration,
    /// A run stops with an error after this many deliveries, so a stuck record cannot spin
    /// forever.
    pub maximum_deliveries: u64,
    /// The seed of every chance above.
    pub seed: u64,
}

impl Default for Mapping {
    fn default() -> Self {
        Self {
            batch_size: 100,
            parallelization_factor: 1,
            bisect_batch_on_function_error: false,
            maximum_retry_attempts: None,
            maximum_record_age: None,
            report_batch_item_failures: true,
            starting_position: StartingPosition::TrimHorizon,
            function_timeout: Duration::from_secs(10),
            duplicate_deliveries: 0.0,
            concurrent_deliveries: 0.0,
            children_before_parents: 0.0,
            round_time: Duration::from_millis(100),
            maximum_backoff: Duration::from_millis(50),
            maximum_deliveries: 1_000_000,
            seed: 0,
        }
    }
}

impl Mapping {
    /// Sets `BatchSize` (at least 1).
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert_eq!(Mapping::default().batch_size(0).batch_size, 1);
    /// ```
    #[must_use]
    pub fn batch_size(mut self, records: usize) -> Self {
        self.batch_size = records.clamp(1, 10_000);
        self
    }

    /// The lane of a shard that records of `partition_key` take under this mapping's
    /// `ParallelizationFactor` (0 with a factor of 1): a stable hash, as the mapping keeps a key
    /// on one lane. AWS does not say how Lambda hashes; this is the local mapping's.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// let mapping = Mapping::default().parallelization_factor(4);
    /// assert!(mapping.lane_of("customer-7") < 4);
    /// assert_eq!(Mapping::default().lane_of("customer-7"), 0);
    /// ```
    #[must_use]
    pub fn lane_of(&self, partition_key: &str) -> usize {
        lane_of(partition_key, self.parallelization_factor)
    }

    /// Sets `ParallelizationFactor` (1 to 10).
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert_eq!(Mapping::default().parallelization_factor(20).parallelization_factor, 10);
    /// ```
    #[must_use]
    pub fn parallelization_factor(mut self, factor: usize) -> Self {
        self.parallelization_factor = factor.clamp(1, 10);
        self
    }

    /// Sets `BisectBatchOnFunctionError`.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert!(Mapping::default().bisect_batch_on_function_error(true).bisect_batch_on_function_error);
    /// ```
    #[must_use]
    pub const fn bisect_batch_on_function_error(mut self, bisect: bool) -> Self {
        self.bisect_batch_on_function_error = bisect;
        self
    }

    /// Sets `MaximumRetryAttempts` (`None` for -1).
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert_eq!(Mapping::default().maximum_retry_attempts(Some(0)).maximum_retry_attempts, Some(0));
    /// ```
    #[must_use]
    pub const fn maximum_retry_attempts(mut self, attempts: Option<u32>) -> Self {
        self.maximum_retry_attempts = attempts;
        self
    }

    /// Sets `MaximumRecordAgeInSeconds` (`None` for -1).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// let mapping = Mapping::default().maximum_record_age(Some(Duration::from_secs(60)));
    /// assert_eq!(mapping.maximum_record_age, Some(Duration::from_secs(60)));
    /// ```
    #[must_use]
    pub const fn maximum_record_age(mut self, age: Option<Duration>) -> Self {
        self.maximum_record_age = age;
        self
    }

    /// Turns `ReportBatchItemFailures` on or off.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert!(!Mapping::default().report_batch_item_failures(false).report_batch_item_failures);
    /// ```
    #[must_use]
    pub const fn report_batch_item_failures(mut self, on: bool) -> Self {
        self.report_batch_item_failures = on;
        self
    }

    /// Sets `StartingPosition`.
    ///
    /// ```
    /// # use kinesis_checkpoint::gate::StartingPosition;
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// let mapping = Mapping::default().starting_position(StartingPosition::Latest);
    /// assert_eq!(mapping.starting_position, StartingPosition::Latest);
    /// ```
    #[must_use]
    pub const fn starting_position(mut self, position: StartingPosition) -> Self {
        self.starting_position = position;
        self
    }

    /// Sets the function's time-out.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// let mapping = Mapping::default().function_timeout(Duration::from_secs(3));
    /// assert_eq!(mapping.function_timeout, Duration::from_secs(3));
    /// ```
    #[must_use]
    pub const fn function_timeout(mut self, timeout: Duration) -> Self {
        self.function_timeout = timeout;
        self
    }

    /// Sets the chance that a done batch is delivered again.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert_eq!(Mapping::default().duplicate_deliveries(0.5).duplicate_deliveries, 0.5);
    /// ```
    #[must_use]
    pub const fn duplicate_deliveries(mut self, chance: f64) -> Self {
        self.duplicate_deliveries = chance;
        self
    }

    /// Sets the chance that a batch goes to two invocations at once.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert_eq!(Mapping::default().concurrent_deliveries(0.5).concurrent_deliveries, 0.5);
    /// ```
    #[must_use]
    pub const fn concurrent_deliveries(mut self, chance: f64) -> Self {
        self.concurrent_deliveries = chance;
        self
    }

    /// Sets the chance that a child shard is delivered before its parents are finished.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert_eq!(Mapping::default().children_before_parents(1.0).children_before_parents, 1.0);
    /// ```
    #[must_use]
    pub const fn children_before_parents(mut self, chance: f64) -> Self {
        self.children_before_parents = chance;
        self
    }

    /// Sets the simulated time per round of deliveries.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// let mapping = Mapping::default().round_time(Duration::from_secs(1));
    /// assert_eq!(mapping.round_time, Duration::from_secs(1));
    /// ```
    #[must_use]
    pub const fn round_time(mut self, time: Duration) -> Self {
        self.round_time = time;
        self
    }

    /// Sets the longest wait before a failed batch is retried.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// let mapping = Mapping::default().maximum_backoff(Duration::from_millis(5));
    /// assert_eq!(mapping.maximum_backoff, Duration::from_millis(5));
    /// ```
    #[must_use]
    pub const fn maximum_backoff(mut self, backoff: Duration) -> Self {
        self.maximum_backoff = backoff;
        self
    }

    /// Sets how many deliveries a run may make before it gives up.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert_eq!(Mapping::default().maximum_deliveries(10).maximum_deliveries, 10);
    /// ```
    #[must_use]
    pub const fn maximum_deliveries(mut self, deliveries: u64) -> Self {
        self.maximum_deliveries = deliveries;
        self
    }

    /// Sets the seed of the run's chances.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Mapping;
    /// assert_eq!(Mapping::default().seed(3).seed, 3);
    /// ```
    #[must_use]
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// The lane a partition key belongs to: a stable hash, so a key always takes the same lane.
pub(super) fn lane_of(partition_key: &str, lanes: usize) -> usize {
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
