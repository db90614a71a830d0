//! The dead-letter family of the invariant scenarios: its settings, drawn from the seed apart
//! from the others; its queue (SQS's limits in memory, part sends failing by chance); handler
//! errors of any size and character; and the check after each scenario, a redrive compared byte
//! for byte with what was dead-lettered.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterError};
use kinesis_checkpoint::dead_letter::{
    Message, MessageQueue, Received, redrive_queue, send_letter,
};
use kinesis_checkpoint::{BoxFuture, DeadLetterSink, Outcome, Record};
use kinesis_checkpoint_testing::MemoryQueue;
use kinesis_checkpoint_testing::local::{MemoryStream, Rng};

use super::Shared;

/// The dead-letter family's settings.
#[derive(Debug, Clone)]
pub struct Letters {
    seed: u64,
    /// The queue's `MaximumMessageSize`.
    pub max_message_bytes: usize,
    /// The chance that one part send fails.
    pub part_failure: f64,
    /// The chance that a record is padded past the message size.
    big: f64,
    /// Whether handler errors are of any size and character.
    awkward_errors: bool,
}

impl Letters {
    /// A third of the scenarios, from a generator of its own: the other settings drawn from the
    /// seed stay as they were.
    pub fn draw(seed: u64) -> Option<Self> {
        let mut rng = Rng::new(seed ^ 0x1E77_E25D);
        rng.chance(0.33).then(|| Self {
            seed,
            max_message_bytes: MESSAGE_SIZES[rng.below(3) as usize],
            part_failure: [0.0, 0.1, 0.25][rng.below(3) as usize],
            big: [0.1, 0.5][rng.below(2) as usize],
            awkward_errors: rng.chance(0.6),
        })
    }

    /// Record `n`'s error size and padding. The padding is lowercase ASCII letters, which JSON
    /// writes as they are (see `Payload::to_json` in `tests/invariants.rs`).
    pub fn record(&self, n: u64) -> (Option<usize>, String) {
        let mut rng = Rng::new(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let error_bytes = self
            .awkward_errors
            .then(|| [0, 1, 255, 300, 5_000, 70_000, 300_000][rng.below(7) as usize]);
        let pad = if rng.chance(self.big) {
            let len = rng.within(1..3 * self.max_message_bytes as u64) as usize;
            let from = rng.below(PAD_OFFSETS) as usize;
            String::from_utf8(pad_letters()[from..from + len].to_vec()).expect("letters")
        } else {
            String::new()
        };
        (error_bytes, pad)
    }
}

/// The queues' `MaximumMessageSize`s the family draws from, smallest first.
const MESSAGE_SIZES: [usize; 3] = [4_096, 8_192, 16_384];

/// How many places a record's padding may start at in [`pad_letters`].
const PAD_OFFSETS: u64 = 16_384;

/// Random lowercase letters, drawn once, that every padding is cut from: drawing a letter per
/// byte of every record took a seventh of the scenarios' time in a debug build. Random, not a
/// block repeated, so that the parts of a split letter differ and a redrive that puts them in
/// the wrong order is caught. Long enough for the largest padding (three of the largest
/// messages) from the last offset.
fn pad_letters() -> &'static [u8] {
    static LETTERS: OnceLock<Vec<u8>> = OnceLock::new();
    LETTERS.get_or_init(|| {
        let mut rng = Rng::new(0x9AD_1E77E25);
        (0..PAD_OFFSETS as usize + 3 * MESSAGE_SIZES[2])
            .map(|_| b'a' + rng.below(26) as u8)
            .collect()
    })
}

/// An error of `bytes` bytes made of what SQS refuses or JSON escapes, and astral characters.
pub fn awkward_error(bytes: usize) -> String {
    const AWKWARD: &[char] = &[
        '\0', '\u{1}', '\u{b}', '\u{1b}', '\u{7f}', '\u{fffe}', '\u{ffff}', '\u{fffd}', '𝄞', '😀',
        '\t', '\n', '"', '\\', 'é',
    ];
    // The characters over and over, as many whole ones as fit, then `x`s. Built by repeating
    // one round, not char by char: the scenarios make errors of 300 KB.
    let round: String = AWKWARD.iter().collect();
    let mut error = round.repeat(bytes / round.len() + 1);
    let mut fit = bytes;
    while !error.is_char_boundary(fit) {
        fit -= 1;
    }
    error.truncate(fit);
    error.push_str(&"x".repeat(bytes - fit));
    error
}

/// The family's queue: SQS's limits in memory, and part sends that fail by chance.
pub struct FlakyQueue {
    pub queue: MemoryQueue,
    pub failure: f64,
    pub rng: Mutex<Rng>,
    pub refused: AtomicU64,
    /// Refusals that were not injected: SQS would refuse those parts too.
    pub refusals: Mutex<Vec<String>>,
    /// The scenario's trace, where a refusal is noted as it happens (a shard stuck on a dead
    /// letter that can never be sent ends the scenario by its time limit).
    pub trace: Arc<Mutex<Vec<String>>>,
}

impl MessageQueue for FlakyQueue {
    fn max_message_bytes(&self) -> usize {
        self.queue.max_message_bytes()
    }

    fn name(&self) -> String {
        "the flaky queue".to_owned()
    }

    fn send_message<'a>(
        &'a self,
        message: &'a Message,
    ) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        if self.rng.lock().unwrap().chance(self.failure) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Box::pin(async { Err("injected: the part send was lost".into()) });
        }
        Box::pin(async move {
            let sent = self.queue.send_message(message).await;
            if let Err(error) = &sent {
                let body: serde_json::Value =
                    serde_json::from_str(&message.body).unwrap_or_default();
                let line = format!(
                    "the queue refused part {} of a dead letter of record {} ({} bytes): {error}",
                    body["part"],
                    body["sequence_number"],
                    message.size()
                );
                self.trace.lock().unwrap().push(line.clone());
                self.refusals.lock().unwrap().push(line);
            }
            sent
        })
    }

    fn receive_messages(
        &self,
        visibility: Duration,
    ) -> BoxFuture<'_, Result<Vec<Received>, DeadLetterError>> {
        self.queue.receive_messages(visibility)
    }

    fn delete_message<'a>(
        &'a self,
        receipt: &'a str,
    ) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        self.queue.delete_message(receipt)
    }
}

impl DeadLetterSink for FlakyQueue {
    fn send<'a>(&'a self, letter: &'a DeadLetter) -> BoxFuture<'a, Result<(), DeadLetterError>> {
        Box::pin(send_letter(self, letter))
    }
}

/// What the dead-letter family counted.
#[derive(Debug, Default)]
pub struct LetterCounts {
    scenarios: u64,
    dead_lettered: u64,
    parts_refused: u64,
    redriven: u64,
    leftovers: u64,
    left: u64,
}

impl LetterCounts {
    pub fn add(&mut self, other: &Self) {
        self.scenarios += other.scenarios;
        self.dead_lettered += other.dead_lettered;
        self.parts_refused += other.parts_refused;
        self.redriven += other.redriven;
        self.leftovers += other.leftovers;
        self.left += other.left;
    }
}

impl std::fmt::Display for LetterCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dead-letter family: {} scenarios, {} records dead-lettered, {} part sends failed (injected), {} redriven byte for byte, {} leftover parts deleted, {} messages of partial sends of processed records left",
            self.scenarios,
            self.dead_lettered,
            self.parts_refused,
            self.redriven,
            self.leftovers,
            self.left
        )
    }
}

/// Redrives the family's queue: every record dead-lettered comes back once, byte for byte (as
/// the sink took it, and as the stream holds it), nothing else does, and what stays in the
/// queue is only partial sends of records that were processed.
pub async fn check_letters(
    stream: &MemoryStream,
    shared: &Shared,
    queue: &FlakyQueue,
) -> Result<LetterCounts, String> {
    let (letters, handled) = {
        let journal = shared.journal.lock().unwrap();
        let handled: HashSet<String> = journal.handlings.keys().cloned().collect();
        (journal.letters.clone(), handled)
    };
    let originals: HashMap<String, Vec<u8>> = stream
        .shard_ids()
        .iter()
        .flat_map(|shard| stream.records(shard))
        .map(|record| (record.sequence.clone(), record.data.to_vec()))
        .collect();
    let refusals = queue.refusals.lock().unwrap().clone();
    if let Some(first) = refusals.first() {
        return Err(format!("{first} ({} refusals in all)", refusals.len()));
    }
    let redriven = Arc::new(Mutex::new(Vec::new()));
    let keep = redriven.clone();
    let handler = move |record: Record| {
        keep.lock().unwrap().push(record);
        std::future::ready(Outcome::ack())
    };
    let report = redrive_queue(&queue.queue, &handler, Duration::from_mins(10))
        .await
        .map_err(|error| format!("the redrive failed: {error}"))?;
    if report.corrupt > 0 {
        return Err(format!(
            "the redrive found corrupt sends: {:?}",
            report.left
        ));
    }
    let mut seen = HashSet::new();
    for record in redriven.lock().unwrap().iter() {
        let position = record.position().to_string();
        let Some((data, key)) = letters.get(&position) else {
            return Err(format!(
                "the redrive gave back record {position}, which was never dead-lettered"
            ));
        };
        if !seen.insert(position.clone()) {
            return Err(format!("the redrive gave back record {position} twice"));
        }
        let first = record.data().iter().zip(data).position(|(a, b)| a != b);
        if record.data() != &data[..] || originals.get(&position).is_some_and(|o| o != data) {
            return Err(format!(
                "the redrive gave back record {position} as {} bytes that are not the {} dead-lettered (first difference at byte {first:?})",
                record.data().len(),
                data.len()
            ));
        }
        if record.partition_key() != key {
            return Err(format!(
                "the redrive gave back record {position} with partition key {:?}, not {key:?}",
                record.partition_key()
            ));
        }
    }
    if let Some(missing) = letters.keys().find(|position| !seen.contains(*position)) {
        return Err(format!(
            "record {missing} was dead-lettered, but the redrive did not give it back: {report:?}"
        ));
    }
    let left = queue.queue.messages();
    for message in &left {
        let body: serde_json::Value = serde_json::from_str(&message.body)
            .map_err(|error| format!("a message in the queue is not JSON: {error}"))?;
        let sequence = body["sequence_number"].as_str().unwrap_or_default();
        let position = match body["sub_sequence_number"].as_u64() {
            Some(sub) => format!("{sequence}/{sub}"),
            None => sequence.to_owned(),
        };
        if letters.contains_key(&position) || !handled.contains(&position) {
            return Err(format!(
                "part {} of record {position} stayed in the queue after the redrive, though the record was {}: {report:?}",
                body["part"],
                if letters.contains_key(&position) {
                    "dead-lettered"
                } else {
                    "never handled"
                }
            ));
        }
    }
    Ok(LetterCounts {
        scenarios: 1,
        dead_lettered: letters.len() as u64,
        parts_refused: queue.refused.load(Ordering::Relaxed),
        redriven: seen.len() as u64,
        leftovers: report.leftovers as u64,
        left: left.len() as u64,
    })
}
