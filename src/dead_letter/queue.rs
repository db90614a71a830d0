//! The three queue operations dead letters need, apart from any one queue, so that SQS and a
//! queue in memory run the same chunking ([`send_letter`]) and the same joining
//! ([`redrive_queue`](super::redrive_queue)).
//!
//! `MemoryQueue` (`dead_letter::MemoryQueue`, feature `testing`) applies SQS's rules, so that a
//! simulation without SQS finds a dead letter SQS refuses.

use std::time::Duration;

use super::message::{self, Message};
use super::{DeadLetter, DeadLetterError};
use crate::store::BoxFuture;

/// A message received: its id, the receipt that deletes it, and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The queue's id of the message (the same each time it is received).
    pub id: String,
    /// The handle that deletes this receipt of it.
    pub receipt: String,
    /// The body.
    pub body: String,
}

/// A queue of messages: sending, receiving with a visibility timeout, deleting.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use kinesis_checkpoint_testing::MemoryQueue;
/// use kinesis_checkpoint::dead_letter::{Message, MessageQueue};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let queue = MemoryQueue::new(262_144);
/// let message = Message { body: "{}".to_owned(), attributes: Vec::new() };
/// queue.send_message(&message).await.unwrap();
/// let received = queue.receive_messages(Duration::from_secs(30)).await.unwrap();
/// queue.delete_message(&received[0].receipt).await.unwrap();
/// assert!(queue.is_empty());
/// # });
/// ```
pub trait MessageQueue: Send + Sync {
    /// The largest message the queue takes, in bytes (body and attributes), as [`Message::size`]
    /// counts them.
    fn max_message_bytes(&self) -> usize;

    /// The queue, as an error message names it.
    fn name(&self) -> String;

    /// Sends one message.
    fn send_message<'a>(
        &'a self,
        message: &'a Message,
    ) -> BoxFuture<'a, Result<(), DeadLetterError>>;

    /// Receives up to ten messages, each hidden from other receives for `visibility`.
    fn receive_messages(
        &self,
        visibility: Duration,
    ) -> BoxFuture<'_, Result<Vec<Received>, DeadLetterError>>;

    /// Deletes the message received with `receipt`.
    fn delete_message<'a>(&'a self, receipt: &'a str)
    -> BoxFuture<'a, Result<(), DeadLetterError>>;
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

/// How many times [`send_letter`] sends a part before it gives the send up: the first try and
/// two more.
///
/// A send that fails is sent again whole by the record's next attempt, at new chunk boundaries
/// and under a new send id, so what one send got into the queue never helps the next: a record of
/// `n` parts each of which fails with chance `p` would get through only with chance `(1 - p)^n`
/// per attempt, and a large poison record could hold its shard for many deliveries. Trying each
/// part again in place makes that `(1 - p^3)^n`. The AWS SDK has already retried a throttle or
/// a server error by then; what reaches here is a failure after its retries (or a refusal that
/// fails the same way three times, at no cost but two requests).
///
/// ```
/// assert_eq!(kinesis_checkpoint::dead_letter::PART_TRIES, 3);
/// ```
pub const PART_TRIES: usize = 3;

/// Sends `letter` to `queue` as one send: one message, or several parts when it is larger than
/// a message, all naming a send id of their own. A part that fails is sent again, up to
/// [`PART_TRIES`] times in all. `Ok` once every part was taken.
///
/// # Errors
///
/// A part was refused on every try (the parts sent before it stay in the queue, and a redrive
/// deletes them once another send of the record is complete), or the record's metadata alone
/// does not fit in a message.
///
/// ```
/// use kinesis_checkpoint_testing::MemoryQueue;
/// use kinesis_checkpoint::dead_letter::send_letter;
/// use kinesis_checkpoint::{LeaseKey, Record};
/// use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterReason};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "42".parse()?, "k", vec![7; 10_000]);
/// let queue = MemoryQueue::new(4_096);
/// send_letter(&queue, &DeadLetter::new(record, 1, "no such customer", DeadLetterReason::Rejected)).await?;
/// assert!(queue.len() > 3, "10 kB over messages of 4 KiB");
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// # }).unwrap();
/// ```
pub async fn send_letter<Q: MessageQueue + ?Sized>(
    queue: &Q,
    letter: &DeadLetter,
) -> Result<(), DeadLetterError> {
    let messages = message::encode(letter, queue.max_message_bytes(), &message::new_send_id())?;
    let parts = messages.len();
    for (index, message) in messages.iter().enumerate() {
        let mut tries = 1;
        while let Err(error) = queue.send_message(message).await {
            if tries == PART_TRIES {
                return Err(SendFailed {
                    record: letter.record.to_string(),
                    queue: queue.name(),
                    part: index + 1,
                    parts,
                    detail: error.to_string(),
                }
                .into());
            }
            tracing::warn!(record = %letter.record, part = index + 1, parts, %error, "a dead letter's part was refused; sending it again");
            tries += 1;
        }
    }
    Ok(())
}
