//! The test's model of the local stack: what the ledger, the lease table and the dead-letter
//! queue must hold after each sample event, as `events/README.md` describes it, and the checks
//! of every field against what the servers hold.

use std::collections::{BTreeMap, HashMap};

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine;
use serde_json::Value;

use super::common;
use super::common::root;

/// The sample event at `path`, relative to the repository's root.
pub fn sample(path: &str) -> KinesisEvent {
    serde_json::from_str(&std::fs::read_to_string(root().join(path)).unwrap()).unwrap()
}

fn payload(record: &KinesisEventRecord) -> Value {
    serde_json::from_slice(&record.kinesis.data.0).unwrap_or(Value::Null)
}

/// The record's sequence number.
pub fn sequence(record: &KinesisEventRecord) -> String {
    record.kinesis.sequence_number.clone()
}

fn shard(record: &KinesisEventRecord) -> String {
    record
        .event_id
        .as_deref()
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .to_owned()
}

/// What the ledger, the lease table and the queue must hold: the test's model, moved on by
/// each event as `events/README.md` says it acts.
#[derive(Default)]
pub struct Model {
    /// order id -> (total, applied, last sequence, currency).
    orders: BTreeMap<String, (i64, i64, String, String)>,
    /// `_attempts:<sequence>` -> attempts.
    attempts: BTreeMap<String, i64>,
    /// lease key -> checkpoint.
    checkpoints: BTreeMap<String, String>,
    /// lease key -> the `failing` record's sequence and attempts.
    failing: BTreeMap<String, (String, i64)>,
    /// lease key -> parents learnt.
    parents: BTreeMap<String, Vec<String>>,
    /// lease key -> lease counter seen last: every invocation of the shard writes it.
    counters: BTreeMap<String, i64>,
    /// The dead letters: the record and the error they must carry.
    dead: Vec<(KinesisEventRecord, String)>,
}

impl Model {
    fn apply(&mut self, record: &KinesisEventRecord) {
        let order = payload(record);
        let entry = self
            .orders
            .entry(order["order_id"].as_str().unwrap().to_owned())
            .or_default();
        entry.0 += order["amount_cents"].as_i64().unwrap();
        entry.1 += 1;
        entry.2 = sequence(record);
        order["currency"].as_str().unwrap().clone_into(&mut entry.3);
    }

    fn key(stream: &str, record: &KinesisEventRecord) -> String {
        format!("{stream}:{}", shard(record))
    }

    /// Moves the model on by `file`, as events/README.md describes it.
    pub fn invoked(&mut self, file: &str) {
        let event = sample(&format!("events/{file}"));
        let records = &event.records;
        let orders = |records: &[KinesisEventRecord], model: &mut Self| {
            for record in records {
                model.apply(record);
            }
        };
        let last = |records: &[KinesisEventRecord]| sequence(records.last().unwrap());
        let key = Self::key("orders", &records[0]);
        match file {
            "batch.json" | "transient-redelivered.json" | "child-shard.json" => {
                if file == "transient-redelivered.json" {
                    // The ledger counts its second attempt, which succeeds.
                    *self
                        .attempts
                        .get_mut(&format!("_attempts:{}", sequence(&records[0])))
                        .unwrap() += 1;
                }
                orders(records, self);
                self.checkpoints.insert(key.clone(), last(records));
                self.failing.remove(&key);
                if file == "child-shard.json" {
                    self.checkpoints
                        .insert("orders:shardId-000000000000".into(), "SHARD_END".into());
                    self.parents
                        .insert(key, vec!["shardId-000000000000".to_owned()]);
                }
            }
            "transient.json" => {
                orders(&records[..2], self);
                self.checkpoints.insert(key.clone(), sequence(&records[1]));
                self.attempts
                    .insert(format!("_attempts:{}", sequence(&records[2])), 1);
                self.failing.insert(key, (sequence(&records[2]), 1));
            }
            "poison.json" => {
                orders(&records[..1], self);
                orders(&records[2..], self);
                self.checkpoints.insert(key, last(records));
                let id = payload(&records[1])["order_id"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                self.dead.push((
                    records[1].clone(),
                    format!("the handler rejected the record: order {id} is marked poison"),
                ));
            }
            "foreign/example-kinesis-event-encrypted.json" => {
                // "Hello World" is not an order: rejected, dead-lettered, the batch goes on.
                let key = Self::key("simple-stream", &records[0]);
                self.checkpoints.insert(key, last(records));
                for record in records {
                    self.dead.push((
                        record.clone(),
                        format!(
                            "the handler rejected the record: record {} of stream 'simple-stream', shard 'shardId-000000000000' is not the JSON the handler expects: expected value at line 1 column 1",
                            sequence(record)
                        ),
                    ));
                }
            }
            // Duplicates of a batch done; and an event whose stream cannot be named, which
            // touches no table.
            "redelivered.json"
            | "foreign/example-kinesis-event.json"
            | "foreign/sam-kinesis-get-records.json" => {}
            other => panic!("the test does not know what {other} does; add it to the model"),
        }
    }

    /// Every table and the queue, checked against the model.
    pub async fn check(&mut self, after: &str, env: &HashMap<String, String>) {
        let dynamodb = aws_sdk_dynamodb::Client::new(
            &common::moto::sdk_config(&env["AWS_ENDPOINT_URL_DYNAMODB"], 1).await,
        );
        self.check_ledger(after, &scan(&dynamodb, &env["LEDGER_TABLE"]).await);
        self.check_leases(after, &scan(&dynamodb, &env["LEASE_TABLE"]).await);
        self.check_queue(after, env).await;
    }

    fn check_ledger(&self, after: &str, items: &[HashMap<String, AttributeValue>]) {
        let mut orders = BTreeMap::new();
        let mut attempts = BTreeMap::new();
        for item in items {
            let id = s(item, "order_id");
            if id.starts_with("_attempts:") {
                assert_eq!(item.len(), 2, "{after}: {item:?}");
                attempts.insert(id, n(item, "attempts"));
            } else {
                assert_eq!(item.len(), 5, "{after}: {item:?}");
                orders.insert(
                    id,
                    (
                        n(item, "total_cents"),
                        n(item, "applied"),
                        s(item, "last_sequence"),
                        s(item, "currency"),
                    ),
                );
            }
        }
        assert_eq!(orders, self.orders, "the ledger after {after}");
        assert_eq!(attempts, self.attempts, "the attempt counts after {after}");
    }

    fn check_leases(&mut self, after: &str, rows: &[HashMap<String, AttributeValue>]) {
        let mut keys = Vec::new();
        for row in rows {
            let key = s(row, "lease_key");
            keys.push(key.clone());
            assert!(
                !row.contains_key("lease_owner") && !row.contains_key("lease_expiry"),
                "after {after}, every invocation released {key}: {row:?}"
            );
            let counter = n(row, "lease_counter");
            let seen = self.counters.entry(key.clone()).or_insert(0);
            assert!(counter >= *seen, "{key}'s counter went back after {after}");
            *seen = counter;
            let checkpoint = row.get("checkpoint").map(|_| s(row, "checkpoint"));
            assert_eq!(
                checkpoint.as_ref(),
                self.checkpoints.get(&key),
                "{key}'s checkpoint after {after}"
            );
            let failing = row.get("failing").map(|failing| {
                let map = failing.as_m().unwrap();
                let error = map["last_error"].as_s().unwrap();
                assert!(
                    error.contains("simulated transient failure, attempt 1"),
                    "{error}"
                );
                let first: i64 = map["first_failure"].as_n().unwrap().parse().unwrap();
                let last: i64 = map["last_failure"].as_n().unwrap().parse().unwrap();
                assert!(first > 1_700_000_000_000 && first <= last, "{map:?}");
                assert_eq!(map.len(), 5, "{map:?}");
                (
                    map["sequence"].as_s().unwrap().clone(),
                    map["attempts"].as_n().unwrap().parse().unwrap(),
                )
            });
            assert_eq!(
                failing.as_ref(),
                self.failing.get(&key),
                "{key}'s failing record after {after}"
            );
            // The record reported to Lambda and not done since: in this loop, only ever the
            // failing one (gap recovery reads it; see the README's "Records the mapping
            // discards").
            let reported = row.get("reported").map(|_| s(row, "reported"));
            assert_eq!(
                reported.as_ref(),
                failing.as_ref().map(|(sequence, _)| sequence),
                "{key}'s reported record after {after}"
            );
            let parents = row.get("parent_shards").map(|p| p.as_ss().unwrap().clone());
            assert_eq!(
                parents.as_ref(),
                self.parents.get(&key),
                "{key}'s parents after {after}"
            );
            // TTL only on a finished shard: the stream's retention (24 h) and a day of grace.
            let finished = checkpoint.as_deref() == Some("SHARD_END");
            assert_eq!(row.contains_key("expires_at"), finished, "{key}: {row:?}");
            if finished {
                let now = i64::try_from(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs(),
                )
                .unwrap();
                let ttl = n(row, "expires_at") - now;
                assert!((2 * 86_400 - 600..=2 * 86_400).contains(&ttl), "{ttl}");
            }
            let known = [
                "lease_key",
                "lease_counter",
                "checkpoint",
                "failing",
                "reported",
                "parent_shards",
                "parentless",
                "expires_at",
            ];
            // "No parents" is recorded only where no parents are.
            assert!(
                !(row.contains_key("parentless") && row.contains_key("parent_shards")),
                "{key}: {row:?}"
            );
            assert!(
                row.keys().all(|k| known.contains(&k.as_str())),
                "{key}: {row:?}"
            );
        }
        keys.sort();
        let mut want: Vec<String> = self.checkpoints.keys().cloned().collect();
        // A shard claimed but never checkpointed (the foreign stream before its first batch
        // ends) would show here; none is expected.
        want.sort();
        assert_eq!(keys, want, "the lease rows after {after}");
    }

    async fn check_queue(&self, after: &str, env: &HashMap<String, String>) {
        let sqs = aws_sdk_sqs::Client::new(
            &common::moto::sdk_config(&env["AWS_ENDPOINT_URL_SQS"], 1).await,
        );
        let messages = sqs
            .receive_message()
            .queue_url(&env["DEAD_LETTER_QUEUE_URL"])
            .max_number_of_messages(10)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        let mut letters: Vec<Value> = messages
            .iter()
            .map(|m| serde_json::from_str(m.body.as_deref().unwrap()).unwrap())
            .collect();
        letters.sort_by_key(|l| l["sequence_number"].as_str().unwrap().to_owned());
        assert_eq!(letters.len(), self.dead.len(), "dead letters after {after}");
        let mut dead = self.dead.clone();
        dead.sort_by_key(|(record, _)| sequence(record));
        for (letter, (record, error)) in letters.iter().zip(&dead) {
            check_letter(letter, record, error);
        }
    }
}

/// Every field of a dead letter.
fn check_letter(letter: &Value, record: &KinesisEventRecord, error: &str) {
    let arn = record.event_source_arn.as_deref().unwrap();
    let stream = arn.rsplit('/').next().unwrap();
    let object = letter.as_object().unwrap();
    let expected = [
        ("kind", Value::from("kinesis-checkpoint.dead-letter.v2")),
        ("stream", stream.into()),
        ("shard", shard(record).into()),
        ("sequence_number", sequence(record).into()),
        ("sub_sequence_number", Value::Null),
        ("partition_key", record.kinesis.partition_key.clone().into()),
        ("explicit_hash_key", Value::Null),
        ("attempts", 1.into()),
        ("reason", "rejected".into()),
        ("error", error.into()),
        ("error_bytes", error.len().into()),
        ("error_cut", false.into()),
        ("part", 1.into()),
        ("parts", 1.into()),
        ("data_bytes", record.kinesis.data.0.len().into()),
        (
            "data_base64",
            base64::engine::general_purpose::STANDARD
                .encode(&record.kinesis.data.0)
                .into(),
        ),
    ];
    for (field, want) in &expected {
        assert_eq!(&letter[field], want, "{field} of {letter}");
    }
    // Arrival to the millisecond, as the event wrote it (float seconds).
    assert_eq!(
        letter["approximate_arrival_millis"].as_i64(),
        Some(arrival_millis(record)),
        "{letter}"
    );
    assert!(
        letter["approximate_arrival"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    assert!(
        letter["dead_lettered_at"]
            .as_str()
            .unwrap()
            .starts_with("20")
    );
    // The send this part belongs to, and the payload's digest, that redrive checks.
    for field in ["send_id", "data_md5"] {
        let hex = letter[field].as_str().unwrap();
        assert!(
            hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
            "{field} of {letter}"
        );
    }
    assert_eq!(object.len(), expected.len() + 5, "{letter}");
}

/// The record's `approximateArrivalTimestamp` in epoch milliseconds, read from the event files
/// themselves: `aws_lambda_events` does not keep its fraction.
fn arrival_millis(record: &KinesisEventRecord) -> i64 {
    let id = record.event_id.as_deref().unwrap();
    for path in ["events", "events/foreign"] {
        for entry in std::fs::read_dir(root().join(path)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let event: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            // A fixture of one DynamoDB record holds no `Records` list and no Kinesis record.
            let Some(records) = event["Records"].as_array() else {
                continue;
            };
            for raw in records {
                if raw["eventID"] == id {
                    let seconds = raw["kinesis"]["approximateArrivalTimestamp"]
                        .as_f64()
                        .unwrap();
                    #[allow(clippy::cast_possible_truncation)]
                    return (seconds * 1_000.0).round() as i64;
                }
            }
        }
    }
    panic!("no event file holds {id}")
}

async fn scan(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Vec<HashMap<String, AttributeValue>> {
    let output = client.scan().table_name(table).send().await.unwrap();
    output.items.unwrap_or_default()
}

fn s(item: &HashMap<String, AttributeValue>, name: &str) -> String {
    item[name].as_s().unwrap().clone()
}

fn n(item: &HashMap<String, AttributeValue>, name: &str) -> i64 {
    item[name].as_n().unwrap().parse().unwrap()
}
