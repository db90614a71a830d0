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
//! - records of different partition keys can run concurrently, each key in order ([`keyed`]),
//!   and `ParallelizationFactor` above 1 is served by a checkpoint per partition key
//!   ([`partition_key`]);
//! - a malformed record is never skipped silently.
//!
//! The pieces, one module each:
//!
//! | module | concept |
//! |---|---|
//! | [`sequence`] | sequence numbers and the extended order checkpoints compare in |
//! | [`record`] | the record a handler sees: where it came from, its position, its payload |
//! | [`event`] | Lambda's Kinesis event ([`LambdaKinesisEvent`]), read into records; [`MalformedRecord`] |
//! | [`kpl`] | KPL aggregates unpacked into their user records: [`deaggregate`] (always built) |
//! | [`handler`] | the user's function and what it answers ([`Outcome`]) |
//! | [`key`] | [`LeaseKey`], the name a row lives under |
//! | [`store`] | the seed's [`LeaseStore`], the engine's [`CheckpointStore`], the adapter [`SeedStore`], [`Layered`] wrappers, [`MemoryLeaseStore`], [`DynamoLeaseStore`] (feature `dynamodb`) |
//! | `aws_error` | an AWS SDK error as one short line: the service's code and message (features `dynamodb`, `kinesis`, `sqs`) |
//! | [`dead_letter`] | where poison records go: [`DeadLetterSink`], `SqsDeadLetters` (feature `sqs`) |
//! | [`gate`] | a child shard waits until its parents are finished; the stream's topology |
//! | [`gap`] | records the mapping discarded, found and run before the batch |
//! | [`keyed`] | per-key concurrency within one invocation |
//! | [`partition_key`] | the mode for `ParallelizationFactor` above 1: a checkpoint per partition key |
//! | [`processor`] | the builder a function configures, and the Lambda service |
//! | [`report`] | what an invocation did with each record: [`BatchReport`], [`ShardReport`], [`Disposition`], [`StopReason`] |
//! | `local` | a local event source that behaves like Lambda's mapping, over a stream in memory or on a Kinesis endpoint (feature `local`) |
//! | [`metrics`] | what an invocation did, as `CloudWatch` embedded-metric lines |
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use kinesis_checkpoint::prelude::*;
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

#[cfg(any(feature = "dynamodb", feature = "kinesis", feature = "sqs"))]
pub mod aws_error;
pub mod clock;
pub mod dead_letter;
mod engine;
pub mod event;
pub mod gap;
pub mod gate;
pub mod handler;
pub mod key;
pub mod kpl;
#[cfg(feature = "local")]
pub mod local;
pub mod metrics;
pub mod processor;
pub mod record;
pub mod report;
pub mod sequence;
pub mod store;

pub use engine::{keyed, partition_key};

pub use dead_letter::{
    DeadLetter, DeadLetterError, DeadLetterReason, DeadLetterSink, MemoryDeadLetters,
};
#[cfg(feature = "sqs")]
pub use dead_letter::{RedriveError, RedriveReport, SqsDeadLetters, redrive};
pub use event::{LambdaKinesisEvent, MalformedReason, MalformedRecord};
pub use handler::{Handler, HandlerError, Json, Outcome, json};
pub use key::LeaseKey;
pub use kpl::{Deaggregated, KplError, KplErrorKind, deaggregate};
pub use partition_key::Mode;
pub use processor::{ProcessError, Processor};
pub use record::{PayloadError, Record};
pub use report::{BatchReport, Disposition, RecordReport, ShardReport, StopReason};
pub use sequence::{Position, SHARD_END, SequenceError, SequenceNumber};
#[cfg(feature = "dynamodb")]
pub use store::dynamo::{DynamoLeaseStore, UnattributedLegacyRow};
pub use store::{
    Below, BoxFuture, CheckpointStore, Claim, Commit, FailingChange, FailingRecord, KeyCommit,
    Layered, LeaseError, LeaseState, LeaseStore, MemoryLeaseStore, ReportedChange, SeedStore,
};

/// The names a Lambda function needs, in one `use`.
///
/// ```
/// use kinesis_checkpoint::prelude::*;
///
/// let _ = Outcome::ack();
/// ```
pub mod prelude {
    #[cfg(feature = "dynamodb")]
    pub use crate::DynamoLeaseStore;
    #[cfg(feature = "sqs")]
    pub use crate::SqsDeadLetters;
    pub use crate::{
        CheckpointStore, Handler, LeaseStore, MemoryLeaseStore, Outcome, Processor, Record,
        SeedStore, json,
    };
}

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
