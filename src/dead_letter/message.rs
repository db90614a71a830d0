//! The messages a dead letter becomes, and the record they give back.
//!
//! This is the one place that knows the format, so that SQS and the queue in memory (and the
//! simulations that use it) write and read exactly the same messages. Three things make it more
//! than a JSON dump:
//!
//! - **Sends are told apart.** A record too large for one message is split over several; when a
//!   part fails, the whole record is sent again, and the chunk boundaries of the second send need
//!   not match the first's. So every part names its send (`send_id`, unique per attempt), its
//!   `part` of `parts`, and the MD5 and length of the whole payload: a redrive joins the parts of
//!   one send only, and checks what it joined.
//! - **Every message is one SQS accepts.** SQS refuses bodies and string attributes holding
//!   characters outside `#x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF`, and messages
//!   over the queue's size (body and attributes together). JSON escapes controls itself; U+FFFE
//!   and U+FFFF are escaped here; attribute values escape every refused character. The handler's
//!   error is bounded (its start kept, the cut and its full length said): an error of any size
//!   cannot make every send fail.

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::primitives::{DateTime, DateTimeFormat};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};

use super::DeadLetter;
use crate::key::LeaseKey;
use crate::record::Record;

/// The format: parts name their send and the payload's digest.
pub(crate) const KIND: &str = "kinesis-checkpoint.dead-letter.v2";

/// The longest error a body carries (its JSON-escaped bytes), whatever the queue's size.
const BODY_ERROR_BYTES: usize = 8_192;
/// The longest text an attribute carries, before the note that it was cut.
const ATTRIBUTE_TEXT_BYTES: usize = 256;

/// One message to send: its body and its attributes, as SQS takes them.
///
/// ```
/// use kinesis_checkpoint::dead_letter::{Message, MessageAttribute};
///
/// let message = Message {
///     body: "{}".to_owned(),
///     attributes: vec![("reason".to_owned(), MessageAttribute::string("rejected"))],
/// };
/// // SQS counts the body and every attribute's name, type and value.
/// assert_eq!(message.size(), 2 + "reason".len() + "String".len() + "rejected".len());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The body: JSON.
    pub body: String,
    /// The message attributes, by name.
    pub attributes: Vec<(String, MessageAttribute)>,
}

impl Message {
    /// The size SQS holds against the queue's `MaximumMessageSize`: the body's bytes and each
    /// attribute's name, data type and value.
    ///
    /// ```
    /// # use kinesis_checkpoint::dead_letter::Message;
    /// assert_eq!(Message { body: "é".to_owned(), attributes: Vec::new() }.size(), 2);
    /// ```
    #[must_use]
    pub fn size(&self) -> usize {
        self.body.len()
            + self
                .attributes
                .iter()
                .map(|(name, value)| name.len() + value.data_type.len() + value.value.len())
                .sum::<usize>()
    }
}

/// A message attribute: its data type (`String` or `Number`) and value.
///
/// ```
/// use kinesis_checkpoint::dead_letter::MessageAttribute;
///
/// assert_eq!(MessageAttribute::number(3).value, "3");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageAttribute {
    /// `String` or `Number`.
    pub data_type: String,
    /// The value, as text.
    pub value: String,
}

impl MessageAttribute {
    /// A `String` attribute.
    ///
    /// ```
    /// # use kinesis_checkpoint::dead_letter::MessageAttribute;
    /// assert_eq!(MessageAttribute::string("x").data_type, "String");
    /// ```
    #[must_use]
    pub fn string(value: impl Into<String>) -> Self {
        Self {
            data_type: "String".to_owned(),
            value: value.into(),
        }
    }

    /// A `Number` attribute.
    ///
    /// ```
    /// # use kinesis_checkpoint::dead_letter::MessageAttribute;
    /// assert_eq!(MessageAttribute::number(7).data_type, "Number");
    /// ```
    #[must_use]
    pub fn number(value: u64) -> Self {
        Self {
            data_type: "Number".to_owned(),
            value: value.to_string(),
        }
    }
}

/// Whether SQS accepts `text` in a message body or a string attribute: only `#x9`, `#xA`,
/// `#xD`, `#x20-#xD7FF`, `#xE000-#xFFFD` and `#x10000-#x10FFFF`.
///
/// ```
/// use kinesis_checkpoint::dead_letter::is_sqs_text;
///
/// assert!(is_sqs_text("tab\there, and 𝄞"));
/// assert!(!is_sqs_text("nul\0"));
/// assert!(!is_sqs_text("\u{FFFE}"));
/// ```
#[must_use]
pub fn is_sqs_text(text: &str) -> bool {
    text.chars().all(sqs_char)
}

const fn sqs_char(c: char) -> bool {
    // A Rust `char` is never a surrogate, so D800-DFFF needs no test.
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// The body of one message: everything about the record, readable as it stands.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Body {
    pub kind: String,
    /// Which send of the record this part belongs to.
    pub send_id: String,
    pub stream: String,
    pub shard: String,
    pub sequence_number: String,
    pub sub_sequence_number: Option<u64>,
    pub partition_key: String,
    pub explicit_hash_key: Option<String>,
    pub approximate_arrival: String,
    pub approximate_arrival_millis: u64,
    pub attempts: u32,
    pub reason: String,
    /// The handler's error, cut to a bound when longer (`error_bytes` says how long it was).
    pub error: String,
    #[serde(default)]
    pub error_bytes: usize,
    #[serde(default)]
    pub error_cut: bool,
    pub dead_lettered_at: String,
    pub part: usize,
    pub parts: usize,
    /// The whole payload's length and MD5 (hex), the same in every part of every send.
    #[serde(default)]
    pub data_bytes: usize,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data_md5: String,
    pub data_base64: String,
}

/// Which record a message carries (part of): stream, shard, sequence and sub-sequence.
pub(crate) type LetterId = (String, String, String, Option<u64>);

impl Body {
    pub(crate) fn id(&self) -> LetterId {
        (
            self.stream.clone(),
            self.shard.clone(),
            self.sequence_number.clone(),
            self.sub_sequence_number,
        )
    }

    /// The record, as a log line names it.
    pub(crate) fn describe(&self) -> String {
        describe(&self.id())
    }
}

/// "record SEQ[/SUB] of stream S, shard H": one readable line.
pub(crate) fn describe((stream, shard, sequence, sub): &LetterId) -> String {
    let sub = sub.map(|sub| format!("/{sub}")).unwrap_or_default();
    format!("record {sequence}{sub} of stream {stream}, shard {shard}")
}

/// A body this toolkit wrote, or `None` for any other message.
pub(crate) fn decode(body: &str) -> Option<Body> {
    serde_json::from_str::<Body>(body)
        .ok()
        .filter(|body| body.kind == KIND)
}

/// The record's metadata alone is too large for one message.
#[derive(Debug, thiserror::Error)]
#[error(
    "{record} cannot be dead-lettered: its metadata alone takes {overhead} of the queue's {max} bytes per message (a partition key of {key_bytes} bytes); raise the queue's MaximumMessageSize and max_message_bytes"
)]
pub(crate) struct MetadataTooLarge {
    record: String,
    overhead: usize,
    max: usize,
    key_bytes: usize,
}

/// A send id no other send shares: the time, a per-process counter and a per-process random
/// key (std's hasher keys), so sandboxes started at the same instant differ too.
pub(crate) fn new_send_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = crate::clock::system_time()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(count);
    hasher.write_u128(nanos);
    // The low 64 bits of the time: they differ between any two sends of one record.
    format!(
        "{:016x}{:016x}",
        nanos & u128::from(u64::MAX),
        hasher.finish()
    )
}

/// The MD5 of `data`, in hex.
pub(crate) fn md5_hex(data: &[u8]) -> String {
    Md5::digest(data)
        .iter()
        .fold(String::with_capacity(32), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        })
}

/// The messages of one send of `letter` to a queue taking `max_bytes` per message.
pub(crate) fn encode(
    letter: &DeadLetter,
    max_bytes: usize,
    send_id: &str,
) -> Result<Vec<Message>, MetadataTooLarge> {
    let record = &letter.record;
    let payload = BASE64.encode(record.data());
    let (error, error_cut) = bounded(
        &letter.error,
        (max_bytes / 8).min(BODY_ERROR_BYTES),
        json_cost,
    );
    let mut body = Body {
        kind: KIND.to_owned(),
        send_id: send_id.to_owned(),
        stream: record.stream().to_owned(),
        shard: record.shard().to_owned(),
        sequence_number: record.sequence().to_string(),
        sub_sequence_number: record.sub_sequence(),
        partition_key: record.partition_key().to_owned(),
        explicit_hash_key: record.explicit_hash_key().map(str::to_owned),
        approximate_arrival: rfc3339(record.arrival()),
        approximate_arrival_millis: millis_since_epoch(record.arrival()),
        attempts: letter.attempts,
        reason: letter.reason.as_str().to_owned(),
        error,
        error_bytes: letter.error.len(),
        error_cut,
        dead_lettered_at: rfc3339(letter.at),
        // The widest part numbers there can be, so that the size measured is an upper bound.
        part: u32::MAX as usize,
        parts: u32::MAX as usize,
        data_bytes: record.data().len(),
        data_md5: md5_hex(record.data()),
        data_base64: String::new(),
    };
    let attributes = attributes(letter);
    let part_attribute = |part: usize, parts: usize| {
        (
            "part".to_owned(),
            MessageAttribute::string(format!("{part}/{parts}")),
        )
    };
    let mut sized = Message {
        body: body_text(&body),
        attributes: attributes.clone(),
    };
    sized.attributes.push(part_attribute(body.part, body.parts));
    let overhead = sized.size();
    // Each part's slice is a whole number of base64 quanta, so that it decodes on its own.
    let room = max_bytes.saturating_sub(overhead) / 4 * 4;
    if room == 0 {
        return Err(MetadataTooLarge {
            record: record.to_string(),
            overhead,
            max: max_bytes,
            key_bytes: record.partition_key().len(),
        });
    }
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
    Ok(chunks
        .into_iter()
        .enumerate()
        .map(|(index, chunk)| {
            body.part = index + 1;
            chunk.clone_into(&mut body.data_base64);
            let mut attributes = attributes.clone();
            attributes.push(part_attribute(body.part, body.parts));
            Message {
                body: body_text(&body),
                attributes,
            }
        })
        .collect())
}

/// The JSON of `body`, with the two characters JSON leaves raw and SQS refuses escaped (JSON's
/// structure is ASCII, so they can only be inside strings, where `\uFFFE` means the same).
fn body_text(body: &Body) -> String {
    let text = serde_json::to_string_pretty(body).unwrap_or_default();
    if text.contains(['\u{FFFE}', '\u{FFFF}']) {
        text.replace('\u{FFFE}', "\\ufffe")
            .replace('\u{FFFF}', "\\uffff")
    } else {
        text
    }
}

/// What `c` costs in a JSON string, as `serde_json` and [`body_text`] write it.
const fn json_cost(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        '\0'..='\u{1f}' | '\u{FFFE}' | '\u{FFFF}' => 6,
        _ => c.len_utf8(),
    }
}

/// What `c` costs in an attribute, as [`attribute_text`] writes it.
const fn attribute_cost(c: char) -> usize {
    if sqs_char(c) { c.len_utf8() } else { 6 }
}

/// `text` cut so that it costs at most `budget`, and whether it was cut; a cut one says so and
/// how long the whole was.
fn bounded(text: &str, budget: usize, cost: fn(char) -> usize) -> (String, bool) {
    let mut spent = 0;
    let mut end = text.len();
    for (at, c) in text.char_indices() {
        spent += cost(c);
        if spent > budget {
            end = at;
            break;
        }
    }
    if end == text.len() {
        return (text.to_owned(), false);
    }
    (
        format!(
            "{}… [cut: {} bytes in all, the first {end} kept]",
            &text[..end],
            text.len()
        ),
        true,
    )
}

/// `text` as an attribute value: bounded, every character SQS refuses written as `\uXXXX`, and
/// never empty (SQS refuses an empty value).
fn attribute_text(text: &str) -> String {
    let (text, _) = bounded(text, ATTRIBUTE_TEXT_BYTES, attribute_cost);
    if text.is_empty() {
        return "(empty)".to_owned();
    }
    let mut clean = String::with_capacity(text.len());
    for c in text.chars() {
        if sqs_char(c) {
            clean.push(c);
        } else {
            let _ = write!(clean, "\\u{:04x}", u32::from(c));
        }
    }
    clean
}

fn attributes(letter: &DeadLetter) -> Vec<(String, MessageAttribute)> {
    let record = &letter.record;
    let text = |name: &str, value: &str| {
        (
            name.to_owned(),
            MessageAttribute::string(attribute_text(value)),
        )
    };
    let mut attributes = vec![
        text("stream", record.stream()),
        text("shard", record.shard()),
        text("sequence_number", record.sequence().as_str()),
        text("partition_key", record.partition_key()),
        (
            "attempts".to_owned(),
            MessageAttribute::number(u64::from(letter.attempts)),
        ),
        text("reason", letter.reason.as_str()),
    ];
    if !letter.error.is_empty() {
        attributes.push(text("error", &letter.error));
    }
    if let Some(sub) = record.sub_sequence() {
        attributes.push((
            "sub_sequence_number".to_owned(),
            MessageAttribute::number(sub),
        ));
    }
    attributes
}

/// The record the parts of one send carry (sorted by part, all of them), checked against the
/// length and digest the parts name; the error says which record and what is wrong.
pub(crate) fn rebuild(parts: &[&Body]) -> Result<Record, String> {
    let first = parts.first().ok_or("no part")?;
    let what = first.describe();
    let payload: String = parts.iter().map(|body| body.data_base64.as_str()).collect();
    let data = BASE64
        .decode(payload)
        .map_err(|error| format!("{what}: its joined payload is not base64 ({error})"))?;
    if first.kind == KIND {
        let digest = md5_hex(&data);
        if data.len() != first.data_bytes || digest != first.data_md5 {
            return Err(format!(
                "{what}: send {} joins to {} bytes with MD5 {digest}, but its parts name {} bytes with MD5 {}",
                first.send_id,
                data.len(),
                first.data_bytes,
                first.data_md5
            ));
        }
    }
    let sequence = first
        .sequence_number
        .parse()
        .map_err(|error| format!("{what}: {error}"))?;
    let mut record = Record::new(
        LeaseKey::new(first.stream.as_str(), first.shard.as_str()),
        sequence,
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
    Ok(record)
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

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;
    use crate::dead_letter::DeadLetterReason;

    fn letter(data: Vec<u8>, key: &str, error: &str) -> DeadLetter {
        let record = Record::new(
            LeaseKey::new("orders", "shardId-000000000002"),
            "49656139270218735118962416178386539874290435484610000009"
                .parse()
                .unwrap(),
            key,
            data,
        );
        DeadLetter::new(record, 2, error, DeadLetterReason::Exhausted)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn every_part_fits_the_limit_and_the_parts_of_one_send_join_to_the_payload(
            max in 4_096_usize..24_096,
            data in vec(any::<u8>(), 0..60_000),
            error in vec(any::<char>(), 0..20_000).prop_map(String::from_iter),
            key in vec(any::<char>(), 0..256).prop_map(String::from_iter),
        ) {
            let letter = letter(data.clone(), &key, &error);
            let messages = encode(&letter, max, "s1").unwrap();
            let bodies: Vec<Body> = messages
                .iter()
                .map(|message| {
                    assert!(message.size() <= max, "{} > {max}", message.size());
                    assert!(is_sqs_text(&message.body));
                    for (_, value) in &message.attributes {
                        assert!(!value.value.is_empty() && is_sqs_text(&value.value));
                    }
                    decode(&message.body).expect("ours")
                })
                .collect();
            prop_assert_eq!(bodies.len(), bodies[0].parts);
            let record = rebuild(&bodies.iter().collect::<Vec<_>>()).unwrap();
            prop_assert_eq!(record.data(), &data[..]);
            prop_assert_eq!(record.partition_key(), key);
            prop_assert_eq!(bodies[0].error_bytes, error.len());
            let kept = bodies[0].error.split("… [cut: ").next().unwrap();
            prop_assert!(error.starts_with(kept));
            prop_assert_eq!(bodies[0].error_cut, kept.len() < error.len());
        }
    }

    #[test]
    fn parts_of_two_sends_do_not_join_to_a_record() {
        let data: Vec<u8> = (0..30_000u32).map(|i| (i % 251) as u8).collect();
        let first = encode(&letter(data.clone(), "k", "short"), 8_192, "a").unwrap();
        let second = encode(&letter(data, "k", &"longer ".repeat(100)), 8_192, "b").unwrap();
        let mut mixed: Vec<Body> = vec![decode(&first[0].body).unwrap()];
        mixed.extend(second[1..].iter().map(|m| decode(&m.body).unwrap()));
        let error = rebuild(&mixed.iter().collect::<Vec<_>>()).unwrap_err();
        assert!(error.contains("MD5") || error.contains("base64"), "{error}");
        assert!(error.contains("shardId-000000000002"), "{error}");
    }

    #[test]
    fn metadata_too_large_for_a_message_is_a_clear_error() {
        let key = "k".repeat(5_000);
        let error = encode(&letter(vec![1], &key, ""), 4_096, "a").unwrap_err();
        let message = error.to_string();
        assert!(message.contains("49656139270218735118962416178386539874290435484610000009"));
        assert!(
            message.contains("a partition key of 5000 bytes"),
            "{message}"
        );
    }
}
