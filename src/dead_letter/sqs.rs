//! The SQS queue: [`SqsDeadLetters`] sends the messages of the format module through the AWS
//! SDK, and receives and deletes them for a redrive.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName};

use super::message::Message;
use super::queue::{MessageQueue, Received, send_letter};
use super::{DeadLetter, DeadLetterError, DeadLetterSink};
use crate::lazy_client::LazyClient;
use crate::store::BoxFuture;

/// The largest message every SQS queue accepts (256 KiB, the `MaximumMessageSize` of queues made
/// before SQS raised its limit to 1 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 262_144;

/// Dead letters as SQS messages.
///
/// Each record becomes one message whose body is JSON: stream, shard, sequence and
/// sub-sequence numbers, partition key, arrival time, attempts, reason, error (its first 8 KiB
/// when longer, saying so and how long it was), and the payload in base64 with its length and
/// MD5. The same facts are message attributes, for filtering in the console (the error's first
/// 256 bytes; characters SQS refuses written as `\uXXXX`).
///
/// A record whose message would exceed the queue's size limit (256 KiB unless set with
/// [`max_message_bytes`](Self::max_message_bytes)) is split over several messages, each
/// naming its send, and its `part` of `parts`; nothing is dropped, and [`redrive`](super::redrive)
/// joins the parts of one send again. The record counts as dead-lettered only when every part of
/// one send was sent.
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
    /// Built on the first message: most processes never send one.
    client: LazyClient<Client>,
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
        Self::with(LazyClient::new(config, Client::new), queue_url)
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
        Self::with(LazyClient::ready(client), queue_url)
    }

    fn with(client: LazyClient<Client>, queue_url: impl Into<String>) -> Self {
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
}

fn attribute(data_type: &str, value: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type(data_type)
        .string_value(value)
        .build()
        .expect("data type is set")
}

impl MessageQueue for SqsDeadLetters {
    fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    fn name(&self) -> String {
        self.queue_url.clone()
    }

    fn send_message<'a>(
        &'a self,
        message: &'a Message,
    ) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(async move {
            let attributes: HashMap<String, MessageAttributeValue> = message
                .attributes
                .iter()
                .map(|(name, value)| (name.clone(), attribute(&value.data_type, &value.value)))
                .collect();
            self.client
                .send_message()
                .queue_url(&self.queue_url)
                .message_body(&message.body)
                .set_message_attributes(Some(attributes))
                .send()
                .await
                .map_err(|error| crate::aws_error::cause(&error))?;
            Ok(())
        })
    }

    fn receive_messages(
        &self,
        visibility: Duration,
    ) -> BoxFuture<'_, Result<Vec<Received>, DeadLetterError>> {
        Box::pin(async move {
            let received = self
                .client
                .receive_message()
                .queue_url(&self.queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .visibility_timeout(i32::try_from(visibility.as_secs()).unwrap_or(i32::MAX))
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
                .map_err(|error| crate::aws_error::cause(&error))?;
            Ok(received
                .messages
                .unwrap_or_default()
                .into_iter()
                .map(|message| Received {
                    id: message.message_id.unwrap_or_default(),
                    receipt: message.receipt_handle.unwrap_or_default(),
                    body: message.body.unwrap_or_default(),
                })
                .collect())
        })
    }

    fn delete_message<'a>(
        &'a self,
        receipt: &'a str,
    ) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(async move {
            self.client
                .delete_message()
                .queue_url(&self.queue_url)
                .receipt_handle(receipt)
                .send()
                .await
                .map_err(|error| crate::aws_error::cause(&error))?;
            Ok(())
        })
    }
}

impl DeadLetterSink for SqsDeadLetters {
    fn send<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(send_letter(self, letter))
    }
}
