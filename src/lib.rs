//! # kinesis-checkpoint
//!
//! Effectively-once processing of Amazon Kinesis records in AWS Lambda.
//!
//! Lambda's Kinesis event source mapping delivers a shard's records at least once: batches come
//! again after errors, time-outs and mapping updates, a partial failure makes Lambda redeliver
//! from the lowest reported record, and two invocations may hold the same records at once. This
//! crate keeps a lease and a checkpoint per shard in `DynamoDB` (one row, two requests per
//! batch), so that:
//!
//! - a redelivered record is skipped, not processed twice;
//! - a shard stops at its first failed record and reports only that one, keeping per-key order;
//! - a concurrent delivery of a shard processes nothing;
//! - a child shard waits until its parents are finished, after a split or a merge;
//! - a poison record goes to a dead-letter sink with its payload, and the shard moves on;
//! - KPL aggregates are unpacked, with checkpoints inside an aggregate;
//! - records of different partition keys can run concurrently, each key in order
//!   ([`Processor::concurrency`]), and `ParallelizationFactor` above 1 is served by a
//!   checkpoint per partition key ([`PartitionKeyMode`]);
//! - a malformed record is never skipped silently.
//!
//! # What a function uses
//!
//! Everything a Lambda function needs is at the crate root, in one `use`:
//!
//! | name | what it is |
//! |---|---|
//! | [`Processor`] | the builder a function configures, and the Lambda service it runs |
//! | [`ShardMode`] | the default mode, one lease and checkpoint per shard (`ParallelizationFactor` 1), with its settings |
//! | [`PartitionKeyMode`] | the mode for `ParallelizationFactor` 2 to 10: a checkpoint per partition key, with its settings |
//! | [`Mode`] | the mode as a value, read from configuration (`"shard"`, `"partition-key"`) to pick one at start-up |
//! | [`ProcessError`] | why a whole batch failed |
//! | [`Handler`] | the user's function, any `async fn(Record) -> Outcome` |
//! | [`Outcome`] | what the handler answers: ack, retry or reject |
//! | [`HandlerError`] | the error a retry or a rejection carries |
//! | [`json`], [`Json`] | a handler of a typed JSON payload |
//! | [`BoxFuture`] | the future a hand-written [`Handler`] returns |
//! | [`Record`] | the record a handler sees: where it came from, its position, its payload |
//! | [`PayloadError`] | a payload that is not the JSON asked for |
//! | [`LeaseKey`] | a shard's name (stream and shard), where a record came from |
//! | [`SequenceNumber`], [`Position`] | a record's sequence number, and its place with a KPL sub-sequence |
//! | [`BatchReport`] | what an invocation did with each record ([`report`] has the rest) |
//! | [`MemoryLeaseStore`] | leases and checkpoints in memory, for one process |
//! | [`DynamoLeaseStore`] | leases and checkpoints in a `DynamoDB` table (feature `dynamodb`) |
//! | [`DeadLetterSink`] | where poison records go |
//! | [`SqsDeadLetters`] | the SQS dead-letter sink (feature `sqs`) |
//! | [`Gate`], [`StartingPosition`] | a child shard waits until its parents are finished |
//! | [`KinesisTopology`] | the stream's shards, from Kinesis, for the gate (feature `kinesis`) |
//! | [`Metrics`] | each invocation as a `CloudWatch` embedded-metric line |
//!
//! # Modules
//!
//! | module | for whom |
//! |---|---|
//! | [`processor`] | the builder's defaults, the mode trait and [`UnknownMode`](processor::UnknownMode) |
//! | [`store`] | store implementers and wrappers: the seed's [`LeaseStore`](store::LeaseStore), the engine's [`CheckpointStore`](store::CheckpointStore), the adapter [`SeedStore`](store::SeedStore), [`Layered`](store::Layered) wrappers, `store::dynamo` |
//! | [`sequence`] | sequence numbers and the extended order checkpoints compare in; `SHARD_END` |
//! | [`event`] | Lambda's Kinesis event ([`InvocationEvent`](event::InvocationEvent) as `service` reads it, [`LambdaKinesisEvent`](event::LambdaKinesisEvent) whole), read into records; malformed records |
//! | [`kpl`] | KPL aggregates unpacked into their user records (always built) |
//! | [`report`] | what an invocation did with each record: dispositions and stop reasons |
//! | [`dead_letter`] | dead letters, their message format and redrive |
//! | [`gate`] | the parent gate and the stream's topology, for topology implementers |
//! | [`gap`] | records the mapping discarded, found and run before the batch |
//! | [`metrics`] | what an invocation did, as `CloudWatch` embedded-metric lines |
//! | `aws_error` | an AWS SDK error as one short line (features `dynamodb`, `kinesis`, `sqs`) |
//!
//! # Features
//!
//! `dynamodb`, `kinesis` and `sqs` (on by default) build the AWS pieces. The test doubles and
//! the local event source are in the crate `kinesis-checkpoint-testing`.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use kinesis_checkpoint::{DynamoLeaseStore, Outcome, Processor, Record};
//!
//! async fn handle(record: Record) -> Outcome {
//!     tracing::info!(sequence = %record.sequence(), "processed");
//!     Outcome::ack()
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let config = aws_config::load_from_env().await;
//!     let leases = Arc::new(DynamoLeaseStore::new(&config, "orders-leases"));
//!     lambda_runtime::run(Processor::new(leases, handle).service()).await
//! }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(
    feature = "dynamodb",
    feature = "kinesis",
    feature = "sqs",
    feature = "dynamodb-streams"
))]
pub mod aws_error;
pub mod clock;
pub mod dead_letter;
#[cfg(feature = "dynamodb-streams")]
pub mod dynamodb_streams;
#[cfg(feature = "dynamodb")]
pub mod effects;
mod engine;
pub mod event;
pub mod gap;
pub mod gate;
mod handler;
mod key;
pub mod kpl;
#[cfg(any(
    feature = "dynamodb",
    feature = "kinesis",
    feature = "sqs",
    feature = "dynamodb-streams"
))]
mod lazy_client;
pub mod metrics;
pub mod processor;
mod record;
pub mod report;
pub mod sequence;
pub mod store;

pub use dead_letter::DeadLetterSink;
#[cfg(feature = "sqs")]
pub use dead_letter::SqsDeadLetters;
#[cfg(feature = "kinesis")]
pub use gate::KinesisTopology;
pub use gate::{Gate, StartingPosition};
pub use handler::{Handler, HandlerError, Json, Outcome, json};
pub use key::LeaseKey;
pub use metrics::Metrics;
pub use processor::{Mode, PartitionKeyMode, ProcessError, Processor, ShardMode};
pub use record::{PayloadError, Record};
pub use report::BatchReport;
pub use sequence::{Position, SequenceNumber};
#[cfg(feature = "dynamodb")]
pub use store::dynamo::DynamoLeaseStore;
pub use store::lease::BoxFuture;
pub use store::memory::MemoryLeaseStore;

/// Not part of the public API, and under no semver promise: the engine's store interface
/// (the writes a [`CheckpointStore`](store::CheckpointStore) takes, and the layers that wrap
/// one), for this workspace's tests, the test doubles' crate and the command line.
#[doc(hidden)]
pub mod internal {
    pub use crate::key::row_key;
    pub use crate::store::checkpoints::{Claim, Commit, FailingChange, KeyCommit, ReportedChange};
    #[cfg(feature = "dynamodb")]
    pub use crate::store::checkpoints::{RowsTransacted, RowsTransaction, Transacted, Transaction};
    pub use crate::store::layer::{Call, Layer, Layered, Next, Operation};
    pub use crate::store::lease::MAX_ERROR_CHARS;
    pub use crate::store::row::Below;
    pub use crate::store::seed::NoTransactions;
}

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The guide's chapters (`docs/src/`), compiled as doctests so that no snippet in them rots. A
/// snippet that needs the test doubles' crate is marked `ignore` until this crate can use it.
#[cfg(doctest)]
mod guide_doctests {
    #[doc = include_str!("../docs/src/introduction.md")]
    struct Introduction;
    #[doc = include_str!("../docs/src/getting-started.md")]
    struct GettingStarted;
    #[doc = include_str!("../docs/src/invocation.md")]
    struct Invocation;
    #[doc = include_str!("../docs/src/table.md")]
    struct Table;
    #[doc = include_str!("../docs/src/modes.md")]
    struct Modes;
    #[doc = include_str!("../docs/src/resharding.md")]
    struct Resharding;
    #[doc = include_str!("../docs/src/dead-letters.md")]
    struct DeadLetters;
    #[doc = include_str!("../docs/src/exactly-once.md")]
    struct ExactlyOnce;
    #[doc = include_str!("../docs/src/kpl.md")]
    struct Kpl;
    #[doc = include_str!("../docs/src/mapping.md")]
    struct Mapping;
    #[doc = include_str!("../docs/src/dynamodb-streams.md")]
    struct DynamodbStreams;
    #[doc = include_str!("../docs/src/testing.md")]
    struct Testing;
    #[doc = include_str!("../docs/src/operating.md")]
    struct Operating;
    #[doc = include_str!("../docs/src/reference.md")]
    struct Reference;
    #[doc = include_str!("../docs/src/guarantees.md")]
    struct Guarantees;
    #[doc = include_str!("../docs/src/faq.md")]
    struct Faq;
}
