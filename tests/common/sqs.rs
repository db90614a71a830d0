//! What SQS is sent, seen on the way out of the real SDK: an interceptor that records every
//! `SendMessage` and fails the ones chosen, as a network or a throttling queue would. moto
//! checks neither the characters SQS refuses nor a message's size in bytes, so tests assert on
//! what was sent too.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_sqs::config::interceptors::BeforeSerializationInterceptorContextRef;
use aws_sdk_sqs::config::{ConfigBag, Intercept};
use aws_sdk_sqs::operation::send_message::SendMessageInput;

/// A message as sent: its body, and each attribute's name, data type and value.
pub type Sent = (String, Vec<(String, String, String)>);

/// Records each `SendMessage` and fails those whose number (from 1) is in `fail`.
#[derive(Debug, Clone, Default)]
pub struct Wire {
    pub sent: Arc<Mutex<Vec<SendMessageInput>>>,
    pub fail: Arc<Mutex<HashSet<usize>>>,
    count: Arc<AtomicUsize>,
}

impl Wire {
    /// An SQS client through this wire.
    pub fn client(&self, config: &aws_config::SdkConfig) -> aws_sdk_sqs::Client {
        let config = aws_sdk_sqs::config::Builder::from(config)
            .interceptor(self.clone())
            .build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    /// Fails the `n`th `SendMessage` from now (1 = the next).
    pub fn fail_next(&self, n: usize) {
        let at = self.count.load(Ordering::SeqCst) + n;
        self.fail.lock().unwrap().insert(at);
    }

    /// Fails the `n`th `SendMessage` from now and every try of it the sink makes after it
    /// ([`PART_TRIES`](kinesis_checkpoint::dead_letter::PART_TRIES) in all): the part is lost
    /// for good, and its send fails.
    pub fn lose_part(&self, n: usize) {
        let at = self.count.load(Ordering::SeqCst) + n;
        let tries = kinesis_checkpoint::dead_letter::PART_TRIES;
        self.fail.lock().unwrap().extend(at..at + tries);
    }

    /// Every message sent so far: body and (name, value) attributes.
    pub fn messages(&self) -> Vec<Sent> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|input| {
                let attributes = input
                    .message_attributes()
                    .into_iter()
                    .flatten()
                    .map(|(name, value)| {
                        (
                            name.clone(),
                            value.data_type().to_owned(),
                            value.string_value().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect();
                (
                    input.message_body().unwrap_or_default().to_owned(),
                    attributes,
                )
            })
            .collect()
    }
}

impl Intercept for Wire {
    fn name(&self) -> &'static str {
        "Wire"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        if let Some(input) = context.input().downcast_ref::<SendMessageInput>() {
            let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
            if self.fail.lock().unwrap().contains(&n) {
                return Err(format!("injected: SendMessage {n} lost on the network").into());
            }
            self.sent.lock().unwrap().push(input.clone());
        }
        Ok(())
    }
}
