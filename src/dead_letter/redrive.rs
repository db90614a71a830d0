//! Running dead letters again: receive a queue's messages, join the parts of each send, check
//! the payload against its digest, hand the record to a handler, delete what is done.
//!
//! A record may be in the queue several times: a send whose part failed left its first parts
//! behind before the record was sent again whole, and an invocation that died between the send
//! and the checkpoint sent it twice. Parts are grouped by record *and* send, so parts of two
//! sends are never joined. Once one send of a record is complete and its payload matches its
//! digest, the parts of its other sends (same record, same digest) are leftovers and are
//! deleted, whatever the handler says (the complete send stays until the handler finishes it).
//! A send that stays incomplete with no complete twin is left in the queue and reported, with
//! the record it belongs to and what is missing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use aws_sdk_sqs::Client;

use super::message::{self, Body, LetterId, describe};
use super::queue::MessageQueue;
use super::sqs::SqsDeadLetters;
use crate::handler::{Handler, Outcome};

/// What a [`redrive`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveReport {
    /// Records the handler finished; their messages are deleted.
    pub redriven: usize,
    /// Records the handler did not finish; their messages stay in the queue.
    pub failed: usize,
    /// Records of which no send was received whole; their messages stay in the queue.
    pub incomplete: usize,
    /// Sends whose joined payload does not match the digest their parts name; left in the queue.
    pub corrupt: usize,
    /// Messages deleted as leftovers: parts of a send of a record that is complete in another
    /// send, and further complete copies of a record already redriven.
    pub leftovers: usize,
    /// Messages that are not dead letters of this toolkit; they stay in the queue.
    pub foreign: usize,
    /// One line per send left in the queue for a reason other than the handler's answer: which
    /// record (stream, shard, sequence) and why.
    pub left: Vec<String>,
}

/// A redrive that could not read or clean up the queue.
#[derive(Debug, thiserror::Error)]
#[error("redrive of {queue} failed: {detail}")]
pub struct RedriveError {
    queue: String,
    detail: String,
}

/// Runs the dead letters of the SQS queue at `queue_url` through `handler`, deleting each
/// message only once its record is done: [`redrive_queue`] over [`SqsDeadLetters`].
///
/// Messages are received (with a visibility timeout of `visibility`, long enough for the
/// handler to run them all), the parts of each send are joined and checked, and each record is
/// handed to the handler as it was first delivered, once per run. A record the handler does not
/// finish stays in the queue and reappears after the visibility timeout. Redriven records run
/// after newer records of their partition key: redrive when that order no longer matters (a
/// fixed bug, a restored downstream).
///
/// # Errors
///
/// Receiving or deleting failed; the messages not yet deleted stay in the queue.
///
/// ```no_run
/// use std::time::Duration;
///
/// use kinesis_checkpoint::{Outcome, Record};
/// use kinesis_checkpoint::dead_letter::redrive;
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
    let queue = SqsDeadLetters::from_client(client.clone(), queue_url);
    redrive_queue(&queue, handler, visibility).await
}

/// Runs the dead letters of `queue` through `handler`, as [`redrive`] does for SQS.
///
/// # Errors
///
/// Receiving or deleting failed; the messages not yet deleted stay in the queue.
///
/// ```
/// use std::time::Duration;
///
/// use kinesis_checkpoint_testing::MemoryQueue;
/// use kinesis_checkpoint::dead_letter::{redrive_queue, send_letter};
/// use kinesis_checkpoint::{LeaseKey, Outcome, Record};
/// use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterReason};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let queue = MemoryQueue::new(4_096);
/// let record = Record::new(LeaseKey::new("orders", "shardId-000000000000"), "42".parse()?, "k", vec![7; 10_000]);
/// send_letter(&queue, &DeadLetter::new(record, 1, "no customer", DeadLetterReason::Rejected)).await?;
/// let handler = |record: Record| async move {
///     assert_eq!(record.data(), &[7; 10_000][..]);
///     Outcome::ack()
/// };
/// let report = redrive_queue(&queue, &handler, Duration::from_secs(30)).await?;
/// assert_eq!(report.redriven, 1);
/// assert!(queue.is_empty());
/// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// # }).unwrap();
/// ```
pub async fn redrive_queue<Q: MessageQueue + ?Sized, H: Handler>(
    queue: &Q,
    handler: &H,
    visibility: Duration,
) -> Result<RedriveReport, RedriveError> {
    let mut run = Run {
        queue,
        handler,
        report: RedriveReport::default(),
        records: HashMap::new(),
    };
    // A message the handler did not finish comes back after the visibility timeout; seeing
    // only such messages again means the queue holds nothing new for this run.
    let mut seen = HashSet::new();
    loop {
        let messages: Vec<_> = queue
            .receive_messages(visibility)
            .await
            .map_err(|error| run.failed(&error))?
            .into_iter()
            .filter(|message| seen.insert(message.id.clone()))
            .collect();
        if messages.is_empty() {
            break;
        }
        for message in messages {
            let Some(body) = message::decode(&message.body) else {
                run.report.foreign += 1;
                continue;
            };
            run.arrived(body, message.receipt).await?;
        }
    }
    Ok(run.finish())
}

/// The parts of one send received so far, by part number, with their receipts.
#[derive(Default)]
struct Send {
    parts: BTreeMap<usize, (Body, String)>,
    /// Receipts of copies of a part already held (SQS may deliver a message twice).
    copies: Vec<String>,
}

impl Send {
    fn receipts(&self) -> impl Iterator<Item = &String> {
        self.parts
            .values()
            .map(|(_, receipt)| receipt)
            .chain(&self.copies)
    }
}

/// What a run knows of one record.
#[derive(Default)]
struct Letter {
    /// Incomplete sends, by send id.
    sends: HashMap<String, Send>,
    /// The digest of a complete, checked send of the record, once one was received.
    complete: Option<String>,
}

struct Run<'a, Q: ?Sized, H> {
    queue: &'a Q,
    handler: &'a H,
    report: RedriveReport,
    records: HashMap<LetterId, Letter>,
}

impl<Q: MessageQueue + ?Sized, H: Handler> Run<'_, Q, H> {
    fn failed(&self, error: &impl std::fmt::Display) -> RedriveError {
        RedriveError {
            queue: self.queue.name(),
            detail: error.to_string(),
        }
    }

    async fn delete(&self, receipt: &str) -> Result<(), RedriveError> {
        self.queue
            .delete_message(receipt)
            .await
            .map_err(|error| self.failed(&error))
    }

    /// Takes one part: a leftover is deleted at once; a send it completes is run.
    async fn arrived(&mut self, body: Body, receipt: String) -> Result<(), RedriveError> {
        let id = body.id();
        let letter = self.records.entry(id.clone()).or_default();
        if letter.complete.as_deref() == Some(body.data_md5.as_str()) {
            self.report.leftovers += 1;
            return self.delete(&receipt).await;
        }
        let send_id = body.send_id.clone();
        let send = letter.sends.entry(send_id.clone()).or_default();
        if send.parts.contains_key(&body.part) {
            send.copies.push(receipt);
            return Ok(());
        }
        let parts = body.parts;
        send.parts.insert(body.part, (body, receipt));
        if send.parts.len() < parts {
            return Ok(());
        }
        let send = letter.sends.remove(&send_id).unwrap_or_default();
        self.complete(&id, send).await
    }

    /// Runs a complete send: checks it, hands its record to the handler, deletes it when done,
    /// and deletes the other sends of the same record as leftovers.
    async fn complete(&mut self, id: &LetterId, send: Send) -> Result<(), RedriveError> {
        let bodies: Vec<&Body> = send.parts.values().map(|(body, _)| body).collect();
        let record = match message::rebuild(&bodies) {
            Ok(record) => record,
            Err(reason) => {
                tracing::error!(%reason, "a dead letter's parts do not join; left in the queue");
                self.report.corrupt += 1;
                self.report.left.push(reason);
                return Ok(());
            }
        };
        let digest = message::md5_hex(record.data());
        let letter = self.records.entry(id.clone()).or_default();
        let first = letter.complete.is_none();
        letter.complete = Some(digest.clone());
        let twins: Vec<Send> = letter
            .sends
            .extract_if(|_, other| {
                other
                    .parts
                    .values()
                    .any(|(body, _)| body.kind == message::KIND && body.data_md5 == digest)
            })
            .map(|(_, send)| send)
            .collect();
        let done = if first {
            let done = matches!(self.handler.handle(record).await, Outcome::Ack);
            if done {
                self.report.redriven += 1;
            } else {
                self.report.failed += 1;
            }
            done
        } else {
            // A second complete copy of a record this run already ran: a leftover.
            self.report.leftovers += send.parts.len();
            true
        };
        if done {
            for receipt in send.receipts() {
                self.delete(receipt).await?;
            }
        }
        for twin in twins {
            for receipt in twin.receipts() {
                self.report.leftovers += 1;
                self.delete(receipt).await?;
            }
        }
        Ok(())
    }

    /// Reports what stays incomplete.
    fn finish(mut self) -> RedriveReport {
        let mut ids: Vec<LetterId> = self.records.keys().cloned().collect();
        ids.sort();
        for id in ids {
            let Some(letter) = self.records.get(&id) else {
                continue;
            };
            if letter.sends.is_empty() {
                continue;
            }
            if letter.complete.is_none() {
                self.report.incomplete += 1;
            }
            let mut sends: Vec<(&String, &Send)> = letter.sends.iter().collect();
            sends.sort_by_key(|(send_id, _)| *send_id);
            for (send_id, send) in sends {
                let of = send.parts.values().next().map_or(0, |(body, _)| body.parts);
                let have: Vec<usize> = send.parts.keys().copied().collect();
                let why = if letter.complete.is_some() {
                    "but names another payload (MD5) than the record's complete send"
                } else {
                    "and no send of the record is complete"
                };
                let reason = format!(
                    "{}: send {send_id} has parts {have:?} of {of} {why}; its {} messages are left in the queue",
                    describe(&id),
                    have.len() + send.copies.len()
                );
                tracing::warn!(%reason, "an incomplete dead letter is left in the queue");
                self.report.left.push(reason);
            }
        }
        self.report
    }
}
