//! What the event source tells of a run: each delivery and what became of it, the records it
//! discarded, the run's counts, and why a run stopped early.
//!
//! These are the event source's public answers, apart from how it reaches them, so that a test
//! reading a [`RunReport`] needs nothing of the scheduling.

use super::function::InvocationError;

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
