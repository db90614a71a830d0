//! Dead letters: where a record that can never succeed goes, with its payload, so that its shard
//! can move on without losing it.
//!
//! Lambda's own answer to such a record is to block the shard until the record expires, or to
//! discard it after `MaximumRetryAttempts` and send only its sequence-number range to a
//! destination: the data is gone. The processor instead hands the record to a
//! [`DeadLetterSink`] and moves the checkpoint past it only once the sink has taken it. A sink
//! that fails leaves the record where it is: reported and retried.
//!
//! [`SqsDeadLetters`] (feature `sqs`) writes one message per record, readable by a person (split
//! over several when the record is larger than a message), and [`redrive`] runs them back through
//! a handler. The message format (`message`) and the queue operations ([`MessageQueue`]) are
//! apart from SQS, so that `MemoryQueue`, which applies SQS's limits in memory, runs the same
//! chunking and joining in simulations; `MemoryDeadLetters` keeps whole letters in memory for
//! tests and the demo (both test doubles, feature `testing`).
//!
//! The folder: `mod.rs` the sink trait and the letter; `message.rs` the messages a letter
//! becomes, and back; `queue.rs` the queue trait and the queue in memory; `sqs.rs` the SQS queue;
//! `redrive.rs` running the queue's letters again.

use std::error::Error as StdError;
use std::time::SystemTime;

use crate::record::Record;
use crate::store::BoxFuture;

/// Why a record was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The handler rejected it: it can never succeed.
    Rejected,
    /// It failed on every one of the allowed attempts.
    Exhausted,
}

impl DeadLetterReason {
    /// The reason as the dead letter's `reason` field spells it.
    ///
    /// ```
    /// # use kinesis_checkpoint::dead_letter::DeadLetterReason;
    /// assert_eq!(DeadLetterReason::Exhausted.as_str(), "exhausted");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Rejected => "rejected",
            Self::Exhausted => "exhausted",
        }
    }
}

/// A record moved aside, with what is known of its failure.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::{LeaseKey, Record};
/// use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterReason};
///
/// let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "42".parse()?, "k", "{}");
/// let letter = DeadLetter::new(record, 3, "downstream refused", DeadLetterReason::Exhausted);
/// assert_eq!(letter.attempts, 3);
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The record, payload included.
    pub record: Record,
    /// How many attempts failed.
    pub attempts: u32,
    /// The last attempt's error.
    pub error: String,
    /// Why it was moved aside.
    pub reason: DeadLetterReason,
    /// When it was moved aside.
    pub at: SystemTime,
}

impl DeadLetter {
    /// A dead letter for `record`, written now.
    ///
    /// ```
    /// # use kinesis_checkpoint::{LeaseKey, Record};
    /// # use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterReason};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "42".parse()?, "k", "{}");
    /// let letter = DeadLetter::new(record, 1, "not an order", DeadLetterReason::Rejected);
    /// assert_eq!(letter.reason, DeadLetterReason::Rejected);
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn new(
        record: Record,
        attempts: u32,
        error: impl Into<String>,
        reason: DeadLetterReason,
    ) -> Self {
        Self {
            record,
            attempts,
            error: error.into(),
            reason,
            at: crate::clock::system_time(),
        }
    }
}

/// The error a dead-letter sink reports: the record is then reported to Lambda and retried.
pub type DeadLetterError = Box<dyn StdError + Send + Sync>;

/// Takes records that can never succeed.
///
/// `send` must return `Ok` only once the record is durably stored: the checkpoint moves past it
/// then, and Lambda will not deliver it again.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::{BoxFuture, DeadLetterSink};
/// use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterError};
///
/// /// Writes dead letters to the log (not durable: an example only).
/// struct Log;
///
/// impl DeadLetterSink for Log {
///     fn send<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>> {
///         Box::pin(async move {
///             tracing::error!(record = %letter.record, error = letter.error, "dead letter");
///             Ok(())
///         })
///     }
/// }
/// ```
pub trait DeadLetterSink: Send + Sync + 'static {
    /// Stores `letter` durably.
    fn send<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>>;
}

#[cfg(feature = "sqs")]
mod message;
#[cfg(feature = "sqs")]
mod queue;
#[cfg(feature = "sqs")]
mod redrive;
#[cfg(feature = "sqs")]
mod sqs;

#[cfg(feature = "sqs")]
pub use message::{Message, MessageAttribute, is_sqs_text};
#[cfg(feature = "sqs")]
pub use queue::{MessageQueue, PART_TRIES, Received, send_letter};
#[cfg(feature = "sqs")]
pub use redrive::{RedriveError, RedriveReport, redrive, redrive_queue};
#[cfg(feature = "sqs")]
pub use sqs::{DEFAULT_MAX_MESSAGE_BYTES, SqsDeadLetters};
