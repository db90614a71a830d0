//! Dead letters split over several SQS messages, through the real SDK against moto on
//! 127.0.0.1: a send whose part fails, a record sent twice; redrive
//! joins the parts of one send only, checks them, runs a record sent twice once, and leaves (and
//! says) what it cannot join.

#![allow(
    clippy::cast_possible_truncation,
    reason = "part counts and byte values are small"
)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::moto::{Moto, create_queue};
use common::sqs::Wire;
use kinesis_checkpoint::dead_letter::{DeadLetter, DeadLetterReason, redrive};
use kinesis_checkpoint::{DeadLetterSink, LeaseKey, Outcome, Record, SqsDeadLetters};
use serde_json::{Value, json};

const SHARD: &str = "shardId-000000000007";
const SEQUENCE: &str = "49656139270218735118962416178386539874290435484610000042";

struct Setup {
    config: aws_config::SdkConfig,
    sqs: aws_sdk_sqs::Client,
    queue: String,
    wire: Wire,
}

async fn setup() -> Setup {
    let config = Moto::shared().sdk_config(1).await;
    let queue = create_queue(&config).await;
    Setup {
        sqs: aws_sdk_sqs::Client::new(&config),
        config,
        queue,
        wire: Wire::default(),
    }
}

impl Setup {
    /// The sink, through the wire, with 8 KiB messages so that a record takes a few.
    fn sink(&self) -> SqsDeadLetters {
        SqsDeadLetters::from_client(self.wire.client(&self.config), &self.queue)
            .max_message_bytes(8_192)
    }

    /// Redrives the queue, returning the report and every record the handler saw.
    async fn redrive(&self) -> (kinesis_checkpoint::dead_letter::RedriveReport, Vec<Record>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let keep = seen.clone();
        let report = redrive(
            &self.sqs,
            &self.queue,
            &move |record: Record| {
                keep.lock().unwrap().push(record);
                async { Outcome::ack() }
            },
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        let seen = seen.lock().unwrap().clone();
        (report, seen)
    }

    /// How many messages the queue holds.
    async fn depth(&self) -> usize {
        let attributes = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.queue)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap_or_default();
        let count = |name| {
            attributes
                .get(&name)
                .map_or(0, |n: &String| n.parse::<usize>().unwrap())
        };
        count(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
            + count(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
    }

    async fn send_raw(&self, body: &Value) {
        self.sqs
            .send_message()
            .queue_url(&self.queue)
            .message_body(body.to_string())
            .send()
            .await
            .unwrap();
    }
}

/// 20 kB of every byte value: a record of three messages of 8 KiB.
fn payload() -> Vec<u8> {
    (0..20_000u32).map(|i| (i * 7 % 256) as u8).collect()
}

fn record() -> Record {
    Record::new(
        LeaseKey::new("orders", SHARD),
        SEQUENCE.parse().unwrap(),
        "customer-17",
        payload(),
    )
    .with_sub_sequence(3)
}

fn letter(error: &str, attempts: u32) -> DeadLetter {
    DeadLetter::new(record(), attempts, error, DeadLetterReason::Exhausted)
}

/// The body fields of every message sent, as JSON.
fn sent_bodies(wire: &Wire) -> Vec<Value> {
    wire.messages()
        .iter()
        .map(|(body, _)| serde_json::from_str(body).unwrap())
        .collect()
}

fn assert_is_the_record(redriven: &Record) {
    assert_same_bytes(redriven.data(), &payload());
    assert_eq!(redriven.stream(), "orders");
    assert_eq!(redriven.shard(), SHARD);
    assert_eq!(redriven.sequence().as_str(), SEQUENCE);
    assert_eq!(redriven.sub_sequence(), Some(3));
    assert_eq!(redriven.partition_key(), "customer-17");
}

#[tokio::test]
async fn a_send_whose_second_part_failed_is_deleted_once_the_record_is_complete_in_its_resend() {
    let setup = setup().await;
    let sink = setup.sink();
    setup.wire.lose_part(2);
    let first = sink.send(&letter("timed out", 1)).await;
    assert!(
        first.is_err(),
        "part 2 of the first send was lost: {first:?}"
    );
    // The error is longer the second time: the chunk boundaries move.
    sink.send(&letter(&"the ledger refused the order; ".repeat(40), 2))
        .await
        .unwrap();
    let bodies = sent_bodies(&setup.wire);
    let parts = bodies[1]["parts"].as_u64().unwrap() as usize;
    assert!(parts >= 3, "{parts}");
    assert_eq!(
        bodies.len(),
        1 + parts,
        "part 1 of the first send, then a whole send"
    );
    assert_ne!(bodies[0]["send_id"], bodies[1]["send_id"]);
    assert_ne!(
        bodies[0]["data_base64"].as_str().unwrap().len(),
        bodies[1]["data_base64"].as_str().unwrap().len(),
        "the boundaries differ between the sends"
    );
    for body in &bodies {
        assert_eq!(body["data_bytes"], json!(20_000));
        assert_eq!(
            body["data_md5"],
            json!(format!("{:032x}", md5_of(&payload())))
        );
    }

    let (report, seen) = setup.redrive().await;

    assert_eq!(seen.len(), 1, "the record once: {report:?}");
    assert_is_the_record(&seen[0]);
    assert_eq!(
        (
            report.redriven,
            report.leftovers,
            report.incomplete,
            report.foreign
        ),
        (1, 1, 0, 0),
        "{report:?}"
    );
    assert!(report.left.is_empty(), "{report:?}");
    assert_eq!(setup.depth().await, 0, "the leftover part is deleted too");
}

#[tokio::test]
async fn a_part_refused_once_is_sent_again_in_the_same_send_and_the_record_redrives_whole() {
    let setup = setup().await;
    setup.wire.fail_next(2);
    setup.sink().send(&letter("timed out", 1)).await.unwrap();
    let bodies = sent_bodies(&setup.wire);
    let parts = bodies[0]["parts"].as_u64().unwrap() as usize;
    assert!(parts >= 3, "{parts}");
    assert_eq!(bodies.len(), parts, "each part taken once: {bodies:?}");
    let send_ids: std::collections::HashSet<&str> = bodies
        .iter()
        .map(|body| body["send_id"].as_str().unwrap())
        .collect();
    assert_eq!(send_ids.len(), 1, "one send");
    let numbers: Vec<u64> = bodies.iter().map(|b| b["part"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (1..=parts as u64).collect::<Vec<_>>());

    let (report, seen) = setup.redrive().await;

    assert_eq!(seen.len(), 1, "{report:?}");
    assert_is_the_record(&seen[0]);
    assert_eq!(
        (report.redriven, report.leftovers, report.incomplete),
        (1, 0, 0)
    );
    assert_eq!(setup.depth().await, 0);
}

#[tokio::test]
async fn an_incomplete_send_with_no_complete_twin_is_left_in_the_queue_and_named() {
    let setup = setup().await;
    setup.wire.lose_part(3);
    assert!(setup.sink().send(&letter("timed out", 1)).await.is_err());
    let parts = sent_bodies(&setup.wire)[0]["parts"].as_u64().unwrap();
    let want = format!("parts [1, 2] of {parts}");

    let (report, seen) = setup.redrive().await;

    assert!(seen.is_empty(), "half a record is never handed over");
    assert_eq!((report.redriven, report.incomplete), (0, 1), "{report:?}");
    assert_eq!(report.left.len(), 1);
    let line = &report.left[0];
    for part in ["orders", SHARD, SEQUENCE, "/3", &want, "left in the queue"] {
        assert!(line.contains(part), "{part:?} in {line:?}");
    }
    assert!(!line.contains('\n'), "one line: {line:?}");
    assert_eq!(setup.depth().await, 2, "left for a person to look at");
}

#[tokio::test]
async fn a_record_dead_lettered_twice_is_redriven_once_and_both_copies_are_deleted() {
    let setup = setup().await;
    let sink = setup.sink();
    // An invocation died between the send and its checkpoint: the next one sent it again.
    sink.send(&letter("busy", 3)).await.unwrap();
    sink.send(&letter("busy", 4)).await.unwrap();

    let (report, seen) = setup.redrive().await;

    assert_eq!(seen.len(), 1, "{report:?}");
    assert_is_the_record(&seen[0]);
    let parts = sent_bodies(&setup.wire)[0]["parts"].as_u64().unwrap() as usize;
    assert_eq!(
        (report.redriven, report.leftovers),
        (1, parts),
        "the second copy's parts are leftovers: {report:?}"
    );
    assert_eq!(setup.depth().await, 0);
}

#[tokio::test]
async fn a_part_whose_payload_does_not_match_the_digest_is_not_handed_over() {
    let setup = setup().await;
    setup.sink().send(&letter("x", 1)).await.unwrap();
    // Someone edits a message by hand: its slice of the payload changes, its digest does not.
    let received = setup
        .sqs
        .receive_message()
        .queue_url(&setup.queue)
        .max_number_of_messages(10)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap();
    let parts = sent_bodies(&setup.wire)[0]["parts"].as_u64().unwrap() as usize;
    assert_eq!(received.len(), parts);
    for message in &received {
        let mut body: Value = serde_json::from_str(message.body.as_deref().unwrap()).unwrap();
        if body["part"] == json!(2) {
            let data = body["data_base64"].as_str().unwrap().replacen('A', "B", 1);
            body["data_base64"] = json!(data);
        }
        setup.send_raw(&body).await;
        setup
            .sqs
            .delete_message()
            .queue_url(&setup.queue)
            .receipt_handle(message.receipt_handle.as_deref().unwrap())
            .send()
            .await
            .unwrap();
    }

    let (report, seen) = setup.redrive().await;

    assert!(seen.is_empty(), "{report:?}");
    assert_eq!(report.corrupt, 1, "{report:?}");
    assert!(
        report.left[0].contains("MD5") && report.left[0].contains(SEQUENCE),
        "{report:?}"
    );
    assert_eq!(setup.depth().await, parts);
}

/// Every byte, in order; a difference is told by where, not by dumping both.
fn assert_same_bytes(got: &[u8], want: &[u8]) {
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        got == want,
        "the redriven payload is not the record's: {} bytes for {}, first difference at byte {first:?}",
        got.len(),
        want.len()
    );
}

fn md5_of(data: &[u8]) -> u128 {
    // The digest the messages name, computed independently of the crate's code.
    let output = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(data)?;
            child.wait_with_output()
        })
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    u128::from_str_radix(&text[..32], 16).unwrap()
}
