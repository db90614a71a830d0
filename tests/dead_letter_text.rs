//! Dead letters whose error and metadata hold anything: errors from 0 bytes to over 256 KiB,
//! control characters, NUL, U+FFFE, U+FFFF, astral characters. Sent through the real SDK to
//! moto on 127.0.0.1 (a queue of 256 KiB messages), then redriven. moto checks neither the
//! characters SQS refuses nor a message's size in bytes (it counts the body's characters), so
//! the messages on the wire are checked against SQS's rules here, byte by byte.

#![allow(clippy::cast_possible_truncation, reason = "small counts")]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use common::moto::{Moto, unique};
use common::sqs::{Sent, Wire};
use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterReason, redrive};
use kinesis_checkpoint::dead_letter::{Message, MessageAttribute, MessageQueue};
use kinesis_checkpoint::{DeadLetterSink, LeaseKey, Outcome, Record, SqsDeadLetters};
use kinesis_checkpoint_testing::MemoryQueue;
use serde_json::Value;

/// Every kind of character SQS refuses or that needs escaping, and some it takes.
const AWKWARD: &str = "\0\u{1}\u{8}\u{b}\u{c}\u{1b}\u{1f}\u{7f}\u{fffe}\u{ffff}\u{fffd}\u{d7ff}\u{e000}𝄞😀\t\n\r\"\\é";

/// The characters SQS takes in bodies and string attributes, written out again here rather
/// than taken from the crate.
fn sqs_allows(c: char) -> bool {
    let c = u32::from(c);
    matches!(c, 0x9 | 0xA | 0xD | 0x20..=0xD7FF | 0xE000..=0xFFFD | 0x10000..=0x10_FFFF)
}

/// What an attribute value shows of `text`: refused characters as `\uXXXX`.
fn escaped(text: &str) -> String {
    text.chars()
        .map(|c| {
            if sqs_allows(c) {
                c.to_string()
            } else {
                format!("\\u{:04x}", u32::from(c))
            }
        })
        .collect()
}

/// An error of exactly `bytes` bytes that starts with every awkward character.
fn error_of(bytes: usize) -> String {
    let mut error = String::new();
    while error.len() < bytes {
        let c = AWKWARD
            .chars()
            .nth(error.chars().count() % AWKWARD.chars().count())
            .unwrap();
        if error.len() + c.len_utf8() > bytes {
            error.push('a');
        } else {
            error.push(c);
        }
    }
    error
}

/// 50 kB holding every byte value.
fn payload() -> Vec<u8> {
    (0..50_000u32).map(|i| (i % 256) as u8).collect()
}

fn record(n: u64) -> Record {
    Record::new(
        LeaseKey::new("orders", "shardId-000000000001"),
        format!("4965613927021873511896241617838653987429043548461{n:07}")
            .parse()
            .unwrap(),
        AWKWARD,
        payload(),
    )
}

#[tokio::test]
async fn errors_of_any_size_and_character_leave_messages_sqs_accepts_and_the_payload_whole() {
    let config = Moto::shared().sdk_config(1).await;
    let sqs = aws_sdk_sqs::Client::new(&config);
    let queue = sqs
        .create_queue()
        .queue_name(unique("dead-letters"))
        .attributes(QueueAttributeName::MaximumMessageSize, "262144")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let wire = Wire::default();
    let sink = SqsDeadLetters::from_client(wire.client(&config), &queue);
    let sizes = [
        0, 1, 17, 255, 256, 257, 1_000, 8_191, 8_192, 8_193, 262_144, 300_000,
    ];

    for (n, &bytes) in sizes.iter().enumerate() {
        let error = error_of(bytes);
        assert_eq!(error.len(), bytes);
        let before = wire.messages().len();
        let letter = DeadLetter::new(
            record(n as u64),
            2,
            error.clone(),
            DeadLetterReason::Rejected,
        );
        sink.send(&letter)
            .await
            .unwrap_or_else(|e| panic!("an error of {bytes} bytes: {e}"));

        for message in &wire.messages()[before..] {
            check_message(bytes, &error, message);
        }
    }

    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    let report = redrive(
        &sqs,
        &queue,
        &move |record: Record| {
            keep.lock().unwrap().push(record);
            async { Outcome::ack() }
        },
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by(|a, b| a.sequence().cmp(b.sequence()));
    assert_eq!(report.redriven, sizes.len(), "{report:?}");
    for (n, redriven) in seen.iter().enumerate() {
        let want = record(n as u64);
        assert_eq!(redriven.sequence(), want.sequence());
        assert!(
            redriven.data() == want.data(),
            "the payload, byte for byte: {} bytes for {}",
            redriven.data().len(),
            want.data().len()
        );
        assert_eq!(
            redriven.partition_key(),
            AWKWARD,
            "the key, character for character"
        );
    }
}

/// Checks one message sent for a letter whose error was `error` (`bytes` long) against SQS's
/// rules and the format's promises.
fn check_message(bytes: usize, error: &str, (body, attributes): &Sent) {
    assert!(
        body.chars().all(sqs_allows),
        "{bytes}: the body holds a character SQS refuses"
    );
    let size = body.len()
        + attributes
            .iter()
            .map(|(name, kind, value)| name.len() + kind.len() + value.len())
            .sum::<usize>();
    assert!(size <= 262_144, "{bytes}: {size} bytes");
    assert!(attributes.len() <= 10);
    for (name, _, value) in attributes {
        assert!(!value.is_empty(), "{bytes}: {name} is empty");
        assert!(
            value.chars().all(sqs_allows),
            "{bytes}: {name} holds a character SQS refuses: {value:?}"
        );
    }
    let attribute = |name: &str| {
        attributes
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, v)| v.clone())
    };
    assert_eq!(attribute("partition_key"), Some(escaped(AWKWARD)));
    assert_eq!(attribute("attempts").as_deref(), Some("2"));
    assert_eq!(attribute("reason").as_deref(), Some("rejected"));
    match attribute("error") {
        None => assert_eq!(bytes, 0, "only an empty error has no attribute"),
        Some(shown) => match shown.split_once("… [cut: ") {
            None => {
                assert!(bytes <= 256, "{bytes}: an error over 256 bytes is cut");
                assert_eq!(shown, escaped(error));
            }
            Some((kept, note)) => {
                assert!(bytes > 17, "{bytes}: short errors are whole");
                assert!(escaped(error).starts_with(kept), "its start: {shown:?}");
                assert_eq!(
                    note,
                    format!("{bytes} bytes in all, the first {} kept]", kept_bytes(kept))
                );
                assert!(shown.len() < 400, "{bytes}: bounded: {}", shown.len());
            }
        },
    }

    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        body["partition_key"].as_str(),
        Some(AWKWARD),
        "whole in the body"
    );
    assert_eq!(body["error_bytes"].as_u64(), Some(bytes as u64));
    let written = body["error"].as_str().unwrap();
    if bytes <= 1_000 {
        assert_eq!(written, error, "{bytes}: whole");
        assert_eq!(body["error_cut"].as_bool(), Some(false));
    } else {
        assert_eq!(body["error_cut"].as_bool(), Some(true), "{bytes}");
        let (kept, note) = written.split_once("… [cut: ").unwrap();
        assert!(
            error.starts_with(kept) && kept.len() > 1_000,
            "{bytes}: its start kept"
        );
        assert_eq!(
            note,
            format!("{bytes} bytes in all, the first {} kept]", kept.len())
        );
    }
}

/// The bytes of `kept` once its escapes are read back: what the attribute's note counts.
fn kept_bytes(kept: &str) -> usize {
    let mut bytes = 0;
    let mut rest = kept;
    while let Some(c) = rest.chars().next() {
        if let Some(hex) = rest.strip_prefix("\\u").and_then(|r| r.get(..4))
            && let Ok(code) = u32::from_str_radix(hex, 16)
        {
            bytes += char::from_u32(code).map_or(0, char::len_utf8);
            rest = &rest[6..];
            continue;
        }
        bytes += c.len_utf8();
        rest = &rest[c.len_utf8()..];
    }
    bytes
}

#[tokio::test]
async fn the_memory_queue_refuses_what_sqs_refuses() {
    let queue = MemoryQueue::new(1_024);
    let (long, wide) = ("x".repeat(1_020), "é".repeat(506));
    let message = |body: &str, value: &str| Message {
        body: body.to_owned(),
        attributes: vec![("error".to_owned(), MessageAttribute::string(value))],
    };
    for (body, value, why) in [
        ("{}", "nul \0", "a NUL in an attribute"),
        ("{}", "\u{1b}[31m", "an escape in an attribute"),
        ("\u{fffe}", "x", "U+FFFE in the body"),
        ("{\u{ffff}}", "x", "U+FFFF in the body"),
        ("{}", "", "an empty attribute"),
        (long.as_str(), "x", "1,020 + 5 + 6 + 1 bytes, over 1,024"),
        ("", "x", "an empty body"),
    ] {
        assert!(
            queue.send_message(&message(body, value)).await.is_err(),
            "{why}"
        );
    }
    for (body, value) in [
        ("{\t\n\r}", "𝄞 \u{fffd} \u{e000} \u{d7ff}"),
        (wide.as_str(), "x"),
    ] {
        queue.send_message(&message(body, value)).await.unwrap();
    }
    assert_eq!(queue.len(), 2);
}
