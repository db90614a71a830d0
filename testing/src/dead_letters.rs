//! Dead letters kept in memory.
//!
//! [`MemoryDeadLetters`] keeps whole letters, for tests that look at what was dead-lettered.
//! [`MemoryQueue`] (also feature `sqs`) applies SQS's rules (the size of body and attributes
//! together, the characters SQS accepts, at most ten non-empty attributes, a visibility
//! timeout): a message it takes is one SQS would take, which is what lets a simulation without
//! SQS find a dead letter SQS refuses.

use std::sync::Arc;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::clock::Clock;
use kinesis_checkpoint::dead_letter::{
    DeadLetter, DeadLetterError, DeadLetterSink, Message, MessageQueue, Received, is_sqs_text,
    send_letter,
};

/// Dead letters in memory: for tests and the demo.
///
/// ```
/// use kinesis_checkpoint_testing::MemoryDeadLetters;
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
    /// # use kinesis_checkpoint_testing::MemoryDeadLetters;
    /// let letters = MemoryDeadLetters::new();
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Every letter received, in order.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::MemoryDeadLetters;
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

/// A message [`MemoryQueue`] refused, for the reason SQS would.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the queue refused the message: {0}")]
pub struct QueueRefused(String);

/// A queue in memory that takes only what SQS takes: for tests and simulations.
///
/// ```
/// use kinesis_checkpoint_testing::MemoryQueue;
/// use kinesis_checkpoint::dead_letter::{Message, MessageQueue};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let queue = MemoryQueue::new(262_144);
/// let bad = Message { body: "\u{FFFF}".to_owned(), attributes: Vec::new() };
/// assert!(queue.send_message(&bad).await.is_err(), "SQS refuses U+FFFF");
/// # });
/// ```
#[derive(Debug)]
pub struct MemoryQueue {
    max_message_bytes: usize,
    state: Mutex<State>,
    /// What visibility time-outs run on.
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    messages: Vec<Stored>,
}

#[derive(Debug)]
struct Stored {
    id: String,
    receipt: Option<String>,
    message: Message,
    /// Epoch milliseconds on the queue's clock.
    hidden_until: Option<u64>,
}

impl MemoryQueue {
    /// An empty queue whose `MaximumMessageSize` is `max_message_bytes`.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::MemoryQueue;
    /// assert!(MemoryQueue::new(262_144).is_empty());
    /// ```
    #[must_use]
    pub fn new(max_message_bytes: usize) -> Self {
        Self {
            max_message_bytes,
            state: Mutex::default(),
            clock: kinesis_checkpoint::clock::system(),
        }
    }

    /// Runs visibility time-outs on `clock` (default
    /// [`SystemClock`](kinesis_checkpoint::clock::SystemClock)).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint_testing::MemoryQueue;
    /// use kinesis_checkpoint::clock::SystemClock;
    ///
    /// assert!(MemoryQueue::new(262_144).clock(Arc::new(SystemClock)).is_empty());
    /// ```
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Every message in the queue (hidden ones too), in the order sent.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::MemoryQueue;
    /// assert!(MemoryQueue::new(262_144).messages().is_empty());
    /// ```
    #[must_use]
    pub fn messages(&self) -> Vec<Message> {
        self.lock()
            .messages
            .iter()
            .map(|m| m.message.clone())
            .collect()
    }

    /// How many messages the queue holds.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::MemoryQueue;
    /// assert_eq!(MemoryQueue::new(262_144).len(), 0);
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    /// Whether the queue holds no message.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::MemoryQueue;
    /// assert!(MemoryQueue::new(262_144).is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why SQS would refuse `message`, if it would.
    fn refusal(&self, message: &Message) -> Option<String> {
        let size = message.size();
        if size > self.max_message_bytes {
            return Some(format!(
                "{size} bytes, over the queue's {} (body and attributes)",
                self.max_message_bytes
            ));
        }
        if message.body.is_empty() {
            return Some("the body is empty".to_owned());
        }
        if !is_sqs_text(&message.body) {
            return Some("the body holds a character SQS does not allow".to_owned());
        }
        if message.attributes.len() > 10 {
            return Some(format!(
                "{} attributes, over SQS's 10",
                message.attributes.len()
            ));
        }
        message.attributes.iter().find_map(|(name, value)| {
            let valid_name = !name.is_empty()
                && name.len() <= 256
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !valid_name {
                Some(format!("the attribute name {name:?} is not allowed"))
            } else if value.value.is_empty() {
                Some(format!("the attribute {name} is empty"))
            } else if !is_sqs_text(&value.value) {
                Some(format!(
                    "the attribute {name} holds a character SQS does not allow"
                ))
            } else if value.data_type == "Number" && value.value.parse::<f64>().is_err() {
                Some(format!("the attribute {name} is not a number"))
            } else {
                None
            }
        })
    }
}

impl MessageQueue for MemoryQueue {
    fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    fn name(&self) -> String {
        "the queue in memory".to_owned()
    }

    fn send_message<'a>(
        &'a self,
        message: &'a Message,
    ) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(async move {
            if let Some(reason) = self.refusal(message) {
                return Err(QueueRefused(reason).into());
            }
            let mut state = self.lock();
            state.next += 1;
            let id = format!("m-{}", state.next);
            state.messages.push(Stored {
                id,
                receipt: None,
                message: message.clone(),
                hidden_until: None,
            });
            Ok(())
        })
    }

    fn receive_messages(
        &self,
        visibility: Duration,
    ) -> BoxFuture<'_, Result<Vec<Received>, DeadLetterError>> {
        Box::pin(async move {
            let now = self.clock.now_millis();
            let visibility = u64::try_from(visibility.as_millis()).unwrap_or(u64::MAX);
            let mut state = self.lock();
            let mut next = state.next;
            let received = state
                .messages
                .iter_mut()
                .filter(|stored| stored.hidden_until.is_none_or(|until| until <= now))
                .take(10)
                .map(|stored| {
                    next += 1;
                    let receipt = format!("{}-r{next}", stored.id);
                    stored.receipt = Some(receipt.clone());
                    stored.hidden_until = Some(now.saturating_add(visibility));
                    Received {
                        id: stored.id.clone(),
                        receipt,
                        body: stored.message.body.clone(),
                    }
                })
                .collect();
            state.next = next;
            Ok(received)
        })
    }

    fn delete_message<'a>(
        &'a self,
        receipt: &'a str,
    ) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(async move {
            // As in SQS, a receipt that no longer names a message deletes nothing, without error.
            self.lock()
                .messages
                .retain(|stored| stored.receipt.as_deref() != Some(receipt));
            Ok(())
        })
    }
}

impl DeadLetterSink for MemoryQueue {
    fn send<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(send_letter(self, letter))
    }
}
