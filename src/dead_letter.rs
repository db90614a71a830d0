//! Dead letters: where a record that can never succeed goes, with its payload, so that its shard
//! can move on without losing it.
//!
//! Lambda's own answer to such a record is to block the shard until the record expires, or to
//! discard it after `MaximumRetryAttempts` and send only its sequence-number range to a
//! destination: the data is gone. The processor instead hands the record to a
//! [`DeadLetterSink`] and moves the checkpoint past it only once the sink has taken it. A sink
//! that fails leaves the record where it is: reported and retried.
//!
//! [`SqsDeadLetters`] (feature `sqs`) writes one message per record, readable by a person, and
//! [`redrive`] runs them back through a handler. [`MemoryDeadLetters`] keeps them in memory for
//! tests and the demo.

use std::error::Error as StdError;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use crate::lease::BoxFuture;
use crate::record::Record;

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
    /// # use kinesis_checkpoint::DeadLetterReason;
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
/// use kinesis_checkpoint::{DeadLetter, DeadLetterReason, LeaseKey, Record};
///
/// let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "42".parse()?, "k", "{}");
/// let letter = DeadLetter::new(record, 3, "downstream refused", DeadLetterReason::Exhausted);
/// assert_eq!(letter.attempts, 3);
/// # Ok::<(), kinesis_checkpoint::SequenceError>(())
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
    /// # use kinesis_checkpoint::{DeadLetter, DeadLetterReason, LeaseKey, Record};
    /// # let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "42".parse()?, "k", "{}");
    /// let letter = DeadLetter::new(record, 1, "not an order", DeadLetterReason::Rejected);
    /// assert_eq!(letter.reason, DeadLetterReason::Rejected);
    /// # Ok::<(), kinesis_checkpoint::SequenceError>(())
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
            at: SystemTime::now(),
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
/// use kinesis_checkpoint::{BoxFuture, DeadLetter, DeadLetterError, DeadLetterSink};
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

/// Dead letters in memory: for tests and the demo.
///
/// ```
/// use kinesis_checkpoint::MemoryDeadLetters;
///
/// let letters = MemoryDeadLetters::new();
/// assert!(letters.letters().is_empty());
/// ```
#[derive(Debug, Default)]
pub struct MemoryDeadLetters {
    letters: Mutex<Vec<DeadLetter>>,
}

impl MemoryDeadLetters {
    /// An empty sink.
    ///
    /// ```
    /// # use kinesis_checkpoint::MemoryDeadLetters;
    /// let letters = MemoryDeadLetters::new();
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Every letter received, in order.
    ///
    /// ```
    /// # use kinesis_checkpoint::MemoryDeadLetters;
    /// assert_eq!(MemoryDeadLetters::new().letters().len(), 0);
    /// ```
    #[must_use]
    pub fn letters(&self) -> Vec<DeadLetter> {
        self.letters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl DeadLetterSink for MemoryDeadLetters {
    fn send<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(async move {
            self.letters
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(letter.clone());
            Ok(())
        })
    }
}

#[cfg(feature = "sqs")]
pub use sqs::{RedriveError, RedriveReport, SqsDeadLetters, redrive};

#[cfg(feature = "sqs")]
mod sqs {
    use std::collections::{HashMap, HashSet};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use aws_sdk_sqs::Client;
    use aws_sdk_sqs::primitives::DateTime;
    use aws_sdk_sqs::primitives::DateTimeFormat;
    use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as BASE64;
    use serde::{Deserialize, Serialize};

    use super::{DeadLetter, DeadLetterError, DeadLetterSink};
    use crate::handler::{Handler, Outcome};
    use crate::lease::{BoxFuture, LeaseKey};
    use crate::record::Record;

    /// The largest message every SQS queue accepts (its default `MaximumMessageSize`).
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 262_144;

    /// The body of one dead-letter message: everything about the record, readable as it stands.
    /// A record too large for one message is split over `parts` messages, each with a slice of
    /// the base64 payload; [`redrive`] joins them again.
    #[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
    struct Body {
        kind: String,
        stream: String,
        shard: String,
        sequence_number: String,
        sub_sequence_number: Option<u64>,
        partition_key: String,
        explicit_hash_key: Option<String>,
        approximate_arrival: String,
        approximate_arrival_millis: u64,
        attempts: u32,
        reason: String,
        error: String,
        dead_lettered_at: String,
        part: usize,
        parts: usize,
        data_base64: String,
    }

    const KIND: &str = "kinesis-checkpoint.dead-letter.v1";

    /// Which record a message carries (part of): stream, shard, sequence and sub-sequence.
    type LetterId = (String, String, String, Option<u64>);
    /// The longest error carried as a message attribute; the body has it whole.
    const ATTRIBUTE_ERROR_CHARS: usize = 256;

    /// Dead letters as SQS messages.
    ///
    /// Each record becomes one message whose body is JSON: stream, shard, sequence and
    /// sub-sequence numbers, partition key, arrival time, attempts, reason, error, and the
    /// payload in base64. The same facts are message attributes, for filtering in the console.
    ///
    /// A record whose message would exceed the queue's size limit (256 KiB unless set with
    /// [`max_message_bytes`](Self::max_message_bytes)) is split over several messages, each
    /// naming its `part` of `parts`; nothing is dropped, and [`redrive`] reassembles them. The
    /// record counts as dead-lettered only when every part was sent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::sync::Arc;
    ///
    /// use kinesis_checkpoint::{DynamoLeaseStore, Outcome, Processor, Record, SqsDeadLetters};
    ///
    /// # async fn run() -> Result<(), lambda_runtime::Error> {
    /// let config = aws_config::load_from_env().await;
    /// let processor = Processor::new(
    ///     Arc::new(DynamoLeaseStore::new(&config, "orders-leases")),
    ///     |_: Record| async { Outcome::ack() },
    /// )
    /// .dead_letters(Arc::new(SqsDeadLetters::new(&config, std::env::var("DEAD_LETTER_QUEUE_URL")?)))
    /// .max_attempts(5);
    /// lambda_runtime::run(processor.service()).await
    /// # }
    /// ```
    #[derive(Debug, Clone)]
    pub struct SqsDeadLetters {
        client: Client,
        queue_url: String,
        max_message_bytes: usize,
    }

    impl SqsDeadLetters {
        /// Sends to the queue at `queue_url`, with the account, region and endpoint of `config`.
        ///
        /// ```no_run
        /// # use kinesis_checkpoint::SqsDeadLetters;
        /// # async fn run() {
        /// let config = aws_config::load_from_env().await;
        /// let sink = SqsDeadLetters::new(&config, "https://sqs.eu-west-1.amazonaws.com/123456789012/dead-letters");
        /// # }
        /// ```
        #[must_use]
        pub fn new(config: &aws_config::SdkConfig, queue_url: impl Into<String>) -> Self {
            Self::from_client(Client::new(config), queue_url)
        }

        /// Sends through an existing client.
        ///
        /// ```no_run
        /// # use kinesis_checkpoint::SqsDeadLetters;
        /// # async fn run() {
        /// let config = aws_config::load_from_env().await;
        /// let sink = SqsDeadLetters::from_client(aws_sdk_sqs::Client::new(&config), "https://…");
        /// # }
        /// ```
        #[must_use]
        pub fn from_client(client: Client, queue_url: impl Into<String>) -> Self {
            Self {
                client,
                queue_url: queue_url.into(),
                max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            }
        }

        /// The queue's `MaximumMessageSize`, when it is not the default 256 KiB: larger records
        /// are split over several messages.
        ///
        /// ```no_run
        /// # use kinesis_checkpoint::SqsDeadLetters;
        /// # async fn run() {
        /// # let config = aws_config::load_from_env().await;
        /// let sink = SqsDeadLetters::new(&config, "https://…").max_message_bytes(1_048_576);
        /// # }
        /// ```
        #[must_use]
        pub fn max_message_bytes(mut self, bytes: usize) -> Self {
            self.max_message_bytes = bytes.max(4_096);
            self
        }

        /// The messages (body and attributes) that carry `letter`.
        fn messages(
            &self,
            letter: &DeadLetter,
        ) -> Vec<(String, HashMap<String, MessageAttributeValue>)> {
            let record = &letter.record;
            let payload = BASE64.encode(record.data());
            let arrival = millis_since_epoch(record.arrival());
            let mut body = Body {
                kind: KIND.to_owned(),
                stream: record.stream().to_owned(),
                shard: record.shard().to_owned(),
                sequence_number: record.sequence().to_string(),
                sub_sequence_number: record.sub_sequence(),
                partition_key: record.partition_key().to_owned(),
                explicit_hash_key: record.explicit_hash_key().map(str::to_owned),
                approximate_arrival: rfc3339(record.arrival()),
                approximate_arrival_millis: arrival,
                attempts: letter.attempts,
                reason: letter.reason.as_str().to_owned(),
                error: letter.error.clone(),
                dead_lettered_at: rfc3339(letter.at),
                part: 1,
                parts: 1,
                data_base64: String::new(),
            };
            let attributes = attributes(letter);
            // What a message costs without its payload: the attributes, the envelope, and room
            // for the part numbers to grow.
            let overhead = serde_json::to_string_pretty(&body).map_or(0, |s| s.len())
                + attributes
                    .iter()
                    .map(|(name, value)| {
                        name.len()
                            + value.data_type().len()
                            + value.string_value().map_or(0, str::len)
                    })
                    .sum::<usize>()
                + 64;
            let room = self.max_message_bytes.saturating_sub(overhead).max(1_024);
            // Base64 is ASCII: any byte offset is a character boundary.
            let chunks: Vec<&str> = if payload.is_empty() {
                vec![""]
            } else {
                payload
                    .as_bytes()
                    .chunks(room)
                    .map(|chunk| std::str::from_utf8(chunk).unwrap_or_default())
                    .collect()
            };
            body.parts = chunks.len();
            chunks
                .into_iter()
                .enumerate()
                .map(|(index, chunk)| {
                    body.part = index + 1;
                    chunk.clone_into(&mut body.data_base64);
                    let mut attributes = attributes.clone();
                    attributes.insert(
                        "part".to_owned(),
                        string_attribute(&format!("{}/{}", body.part, body.parts)),
                    );
                    (
                        serde_json::to_string_pretty(&body).unwrap_or_default(),
                        attributes,
                    )
                })
                .collect()
        }
    }

    fn string_attribute(value: &str) -> MessageAttributeValue {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(value)
            .build()
            .expect("data type is set")
    }

    fn number_attribute(value: u64) -> MessageAttributeValue {
        MessageAttributeValue::builder()
            .data_type("Number")
            .string_value(value.to_string())
            .build()
            .expect("data type is set")
    }

    fn attributes(letter: &DeadLetter) -> HashMap<String, MessageAttributeValue> {
        let record = &letter.record;
        let mut attributes = HashMap::from([
            ("stream".to_owned(), string_attribute(record.stream())),
            ("shard".to_owned(), string_attribute(record.shard())),
            (
                "sequence_number".to_owned(),
                string_attribute(record.sequence().as_str()),
            ),
            (
                "partition_key".to_owned(),
                string_attribute(if record.partition_key().is_empty() {
                    "(empty)"
                } else {
                    record.partition_key()
                }),
            ),
            (
                "attempts".to_owned(),
                number_attribute(u64::from(letter.attempts)),
            ),
            (
                "reason".to_owned(),
                string_attribute(letter.reason.as_str()),
            ),
        ]);
        let error: String = letter.error.chars().take(ATTRIBUTE_ERROR_CHARS).collect();
        if !error.is_empty() {
            attributes.insert("error".to_owned(), string_attribute(&error));
        }
        if let Some(sub) = record.sub_sequence() {
            attributes.insert("sub_sequence_number".to_owned(), number_attribute(sub));
        }
        attributes
    }

    fn millis_since_epoch(time: SystemTime) -> u64 {
        time.duration_since(UNIX_EPOCH).map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
    }

    fn rfc3339(time: SystemTime) -> String {
        DateTime::from(time)
            .fmt(DateTimeFormat::DateTime)
            .unwrap_or_default()
    }

    /// A dead letter the queue refused.
    #[derive(Debug, thiserror::Error)]
    #[error("could not dead-letter {record} to {queue} (part {part} of {parts}): {detail}")]
    struct SendFailed {
        record: String,
        queue: String,
        part: usize,
        parts: usize,
        detail: String,
    }

    impl DeadLetterSink for SqsDeadLetters {
        fn send<'a>(
            &'a self,
            letter: &'a DeadLetter,
        ) -> BoxFuture<'a, Result<(), DeadLetterError>> {
            Box::pin(async move {
                let messages = self.messages(letter);
                let parts = messages.len();
                for (index, (body, attributes)) in messages.into_iter().enumerate() {
                    self.client
                        .send_message()
                        .queue_url(&self.queue_url)
                        .message_body(body)
                        .set_message_attributes(Some(attributes))
                        .send()
                        .await
                        .map_err(|error| SendFailed {
                            record: letter.record.to_string(),
                            queue: self.queue_url.clone(),
                            part: index + 1,
                            parts,
                            detail: crate::aws_error::cause(&error),
                        })?;
                }
                Ok(())
            })
        }
    }

    /// What a [`redrive`] did.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct RedriveReport {
        /// Records the handler finished; their messages are deleted.
        pub redriven: usize,
        /// Records the handler did not finish; their messages stay in the queue.
        pub failed: usize,
        /// Records of which not every part was received; their messages stay in the queue.
        pub incomplete: usize,
        /// Messages that are not dead letters of this toolkit; they stay in the queue.
        pub foreign: usize,
    }

    /// A redrive that could not read or clean up the queue.
    #[derive(Debug, thiserror::Error)]
    #[error("redrive of {queue} failed: {detail}")]
    pub struct RedriveError {
        queue: String,
        detail: String,
    }

    /// Runs the dead letters of the queue at `queue_url` through `handler`, deleting each
    /// message only once its record is done.
    ///
    /// Messages are received (with a visibility timeout of `visibility`, long enough for the
    /// handler to run them all), split records are joined, and each record is handed to the
    /// handler as it was first delivered. A record the handler does not finish stays in the queue
    /// and reappears after the visibility timeout. Redriven records run after newer records of
    /// their partition key: redrive when that order no longer matters (a fixed bug, a restored
    /// downstream).
    ///
    /// # Errors
    ///
    /// Receiving or deleting failed; the messages not yet deleted stay in the queue.
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// use kinesis_checkpoint::{Outcome, Record, redrive};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = aws_config::load_from_env().await;
    /// let client = aws_sdk_sqs::Client::new(&config);
    /// let handler = |_: Record| async { Outcome::ack() };
    /// let report = redrive(&client, "https://…", &handler, Duration::from_secs(300)).await?;
    /// println!("{} redriven, {} left in the queue", report.redriven, report.failed);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn redrive<H: Handler>(
        client: &Client,
        queue_url: &str,
        handler: &H,
        visibility: Duration,
    ) -> Result<RedriveReport, RedriveError> {
        let failed = |detail: String| RedriveError {
            queue: queue_url.to_owned(),
            detail,
        };
        let mut report = RedriveReport::default();
        let mut pending: HashMap<LetterId, Vec<(Body, String)>> = HashMap::new();
        // A message the handler did not finish comes back after the visibility timeout; seeing
        // only such messages again means the queue holds nothing new for this run.
        let mut seen = HashSet::new();
        loop {
            let received = client
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .visibility_timeout(i32::try_from(visibility.as_secs()).unwrap_or(i32::MAX))
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
                .map_err(|error| failed(crate::aws_error::cause(&error)))?;
            let messages: Vec<_> = received
                .messages
                .unwrap_or_default()
                .into_iter()
                .filter(|message| seen.insert(message.message_id.clone().unwrap_or_default()))
                .collect();
            if messages.is_empty() {
                break;
            }
            for message in messages {
                let receipt = message.receipt_handle.unwrap_or_default();
                let body = message
                    .body
                    .as_deref()
                    .and_then(|body| serde_json::from_str::<Body>(body).ok())
                    .filter(|body| body.kind == KIND);
                let Some(body) = body else {
                    report.foreign += 1;
                    continue;
                };
                let id = (
                    body.stream.clone(),
                    body.shard.clone(),
                    body.sequence_number.clone(),
                    body.sub_sequence_number,
                );
                let parts = pending.entry(id.clone()).or_default();
                parts.push((body, receipt));
                if parts.len() < parts[0].0.parts {
                    continue;
                }
                let mut parts = pending.remove(&id).unwrap_or_default();
                parts.sort_by_key(|(body, _)| body.part);
                let Some(record) = rebuild(&parts) else {
                    report.foreign += parts.len();
                    continue;
                };
                if matches!(handler.handle(record).await, Outcome::Ack) {
                    for (_, receipt) in &parts {
                        client
                            .delete_message()
                            .queue_url(queue_url)
                            .receipt_handle(receipt)
                            .send()
                            .await
                            .map_err(|error| failed(crate::aws_error::cause(&error)))?;
                    }
                    report.redriven += 1;
                } else {
                    report.failed += 1;
                }
            }
        }
        report.incomplete = pending.len();
        Ok(report)
    }

    /// The record the parts of one dead letter carry.
    fn rebuild(parts: &[(Body, String)]) -> Option<Record> {
        let first = &parts.first()?.0;
        let payload: String = parts
            .iter()
            .map(|(body, _)| body.data_base64.as_str())
            .collect();
        let data = BASE64.decode(payload).ok()?;
        let mut record = Record::new(
            LeaseKey::new(first.stream.as_str(), first.shard.as_str()),
            first.sequence_number.parse().ok()?,
            first.partition_key.as_str(),
            data,
        )
        .with_arrival(UNIX_EPOCH + Duration::from_millis(first.approximate_arrival_millis));
        if let Some(sub) = first.sub_sequence_number {
            record = record.with_sub_sequence(sub);
        }
        if let Some(hash_key) = &first.explicit_hash_key {
            record = record.with_explicit_hash_key(hash_key.as_str());
        }
        Some(record)
    }
}
