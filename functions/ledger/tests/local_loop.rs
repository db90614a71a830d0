//! The README's "Local loop", run as written: its commands are read out of `README.md` and run
//! one by one with `bash` from the repository's root (`make local-up`, each `make invoke
//! EVENT=...`, `make local-show`, `make local-down`), and each answer is compared with the one
//! `events/README.md` promises for that event. After every invocation the lease table, the
//! ledger table and the dead-letter queue are read with the AWS SDK and checked, field by field,
//! against what the event must have done.
//!
//! Two variables are set around the commands, not in them: `LOCAL_STATE` (a state folder of the
//! test's own, so a developer's stack is never touched) and `LOCAL_FUNCTION_BIN` (the ledger
//! binary `cargo test` built, run against `cargo lambda watch --only-lambda-apis`, so the
//! function checked is the one under test and the AWS SDK is not compiled a second time).

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine;
use common::root;
use serde_json::Value;

/// The commands of the first `sh` block under `## The local loop` in `README.md`, without
/// their comments.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## The local loop")
        .nth(1)
        .expect("README.md has a section '## The local loop'");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section opens with a ```sh block");
    block
        .lines()
        .map(|line| line.split(" #").next().unwrap().trim().to_owned())
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

/// The answer `events/README.md` promises for each event, from its tables' first two columns:
/// ``| `batch.json` | `{"batchItemFailures":[]}` | ... |``, by the event's path under `events/`.
fn promised_answers() -> HashMap<String, Value> {
    let readme = std::fs::read_to_string(root().join("events/README.md")).unwrap();
    readme
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let file = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let answer = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
            let answer = serde_json::from_str(answer).ok()?;
            Some((file.to_owned(), answer))
        })
        .collect()
}

/// Runs `command` with `bash` in the repository's root, and returns its standard output; fails
/// the test when it fails or outlasts `timeout`.
fn run(command: &str, env: &[(&str, String)], timeout: Duration) -> String {
    let state = env.iter().find(|(k, _)| *k == "LOCAL_STATE").unwrap();
    let out = PathBuf::from(&state.1).with_extension("out");
    let file = std::fs::File::create(&out).unwrap();
    let mut child = Command::new("bash")
        .args(["-c", command])
        .current_dir(root())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        // Under `make test` these name the outer make's job server, which is not ours.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{command}` did not end within {timeout:?}: {}",
                std::fs::read_to_string(&out).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out).unwrap();
    assert!(status.success(), "`{command}` failed ({status}): {output}");
    output
}

/// Stops the stack however the test ends.
struct Stack {
    env: Vec<(&'static str, String)>,
}

impl Stack {
    fn state(&self) -> &Path {
        Path::new(&self.env[0].1)
    }

    /// A `KEY=VALUE` file of the state folder.
    fn read_env(&self, name: &str) -> HashMap<String, String> {
        std::fs::read_to_string(self.state().join(name))
            .unwrap()
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The function's log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.state().join("function.log")).unwrap_or_default()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let state = self.state().to_path_buf();
        let _ = Command::new(common::moto::python())
            .arg(root().join("scripts/local-stack"))
            .arg("down")
            .env("LOCAL_STATE", &state)
            .stdout(Stdio::null())
            .status();
    }
}

fn sample(path: &str) -> KinesisEvent {
    serde_json::from_str(&std::fs::read_to_string(root().join(path)).unwrap()).unwrap()
}

fn payload(record: &KinesisEventRecord) -> Value {
    serde_json::from_slice(&record.kinesis.data.0).unwrap_or(Value::Null)
}

fn sequence(record: &KinesisEventRecord) -> String {
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
struct Model {
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
    fn invoked(&mut self, file: &str) {
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
    async fn check(&mut self, after: &str, stack: &Stack) {
        let env = stack.read_env("stack.env");
        let dynamodb = aws_sdk_dynamodb::Client::new(
            &common::moto::sdk_config(&env["AWS_ENDPOINT_URL_DYNAMODB"], 1).await,
        );
        self.check_ledger(after, &scan(&dynamodb, &env["LEDGER_TABLE"]).await);
        self.check_leases(after, &scan(&dynamodb, &env["LEASE_TABLE"]).await);
        self.check_queue(after, &env).await;
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
                "parent_shards",
                "expires_at",
            ];
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
        ("kind", Value::from("kinesis-checkpoint.dead-letter.v1")),
        ("stream", stream.into()),
        ("shard", shard(record).into()),
        ("sequence_number", sequence(record).into()),
        ("sub_sequence_number", Value::Null),
        ("partition_key", record.kinesis.partition_key.clone().into()),
        ("explicit_hash_key", Value::Null),
        ("attempts", 1.into()),
        ("reason", "rejected".into()),
        ("error", error.into()),
        ("part", 1.into()),
        ("parts", 1.into()),
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
    assert_eq!(object.len(), expected.len() + 3, "{letter}");
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
            for raw in event["Records"].as_array().unwrap() {
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

/// The lines the function logged at WARN or ERROR while handling one event (metric lines and
/// INFO lines left out).
fn problems(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.starts_with(" WARN") || line.starts_with("ERROR"))
        .collect()
}

/// What the one log line of each foreign event must say, besides its stream, shard and
/// sequence number.
fn foreign_line(file: &str, record: &KinesisEventRecord) -> Option<(&'static str, String)> {
    let sequence = sequence(record);
    match file {
        "foreign/example-kinesis-event-encrypted.json" => Some((
            "dead-lettered the record",
            format!("stream=\"simple-stream\" shard=\"shardId-000000000000\" sequence={sequence}"),
        )),
        "foreign/sam-kinesis-get-records.json" => Some((
            "eventSourceARN Some(\"arn:aws:kinesis:EXAMPLE\") is not 'arn:aws:kinesis:<region>:<account>:stream/<name>'",
            format!("stream unknown, shard shardId-000000000000, sequence number {sequence}"),
        )),
        _ => None,
    }
}

/// The function's log lines for the event at `path` (`log`, written while it ran): for a foreign
/// event, one line per record that says what happened and names stream, shard and sequence.
fn check_log_lines(path: &str, log: &str) {
    let lines = problems(log);
    let event = sample(&format!("events/{path}"));
    let expected: Vec<_> = event
        .records
        .iter()
        .filter_map(|record| foreign_line(path, record))
        .collect();
    if path == "foreign/example-kinesis-event.json" {
        let skipped: Vec<&str> = log
            .lines()
            .filter(|line| line.contains("skipped records at or below the checkpoint"))
            .collect();
        assert!(
            skipped.len() == 1
                && skipped[0].contains("stream=\"simple-stream\" shard=\"shardId-000000000000\"")
                && skipped[0].ends_with("skipped=2"),
            "{path}: one line says both records were skipped: {skipped:#?}"
        );
    }
    if path.starts_with("foreign/") {
        assert_eq!(lines.len(), expected.len(), "{path}: {lines:#?}");
        for (line, (cause, names)) in lines.iter().zip(&expected) {
            assert!(
                line.contains(cause) && line.contains(names.as_str()),
                "{path}: one line that says what happened ({cause}) and names {names}: {line}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_local_loop_gives_every_answer_and_effect_events_readme_promises() {
    let commands = readme_commands();
    let answers = promised_answers();
    let state = root()
        .join("target")
        .join(format!("local-loop-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let stack = Stack {
        env: vec![
            ("LOCAL_STATE", state.display().to_string()),
            (
                "LOCAL_FUNCTION_BIN",
                env!("CARGO_BIN_EXE_ledger").to_owned(),
            ),
        ],
    };
    assert!(
        commands.first().map(String::as_str) == Some("make local-up")
            && commands.last().map(String::as_str) == Some("make local-down"),
        "the local loop starts with `make local-up` and ends with `make local-down`: {commands:?}"
    );
    let mut model = Model::default();
    let mut invoked = Vec::new();
    let mut pids: Vec<String> = Vec::new();
    for command in &commands {
        if let Some(path) = command.strip_prefix("make invoke EVENT=events/") {
            let before = stack.log().len();
            let output = run(command, &stack.env, Duration::from_secs(30));
            let answer: Value = output
                .lines()
                .rev()
                .find_map(|line| serde_json::from_str(line).ok())
                .unwrap_or_else(|| panic!("`{command}` printed no answer: {output}"));
            let promised = answers
                .get(path)
                .unwrap_or_else(|| panic!("events/README.md promises no answer for {path}"));
            assert_eq!(&answer, promised, "the answer to {path}");
            model.invoked(path);
            model.check(path, &stack).await;
            // The function logs before it answers, line by line.
            check_log_lines(path, &stack.log()[before..]);
            invoked.push(path.to_owned());
        } else {
            run(command, &stack.env, Duration::from_mins(2));
            if command == "make local-up" {
                pids = ["moto", "kinesis", "runtime-api", "function"]
                    .iter()
                    .map(|name| {
                        let pid = std::fs::read_to_string(state.join(format!("{name}.pid")))
                            .unwrap_or_else(|_| panic!("`make local-up` wrote {name}.pid"));
                        pid.trim().to_owned()
                    })
                    .collect();
            }
        }
    }
    let mut listed: Vec<&String> = answers.keys().collect();
    listed.sort();
    let mut ran: Vec<&String> = invoked.iter().collect();
    ran.sort();
    assert_eq!(
        ran, listed,
        "the README invokes every event events/README.md lists, once"
    );
    assert_eq!(pids.len(), 4);
    for pid in &pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "`make local-down` stopped process {pid}"
        );
    }
    assert!(
        !state.join("function.pid").exists() && !state.join("moto.pid").exists(),
        "`make local-down` removed its PID files"
    );
    // Kept when the test fails: the logs say why.
    let _ = std::fs::remove_dir_all(&state);
    let _ = std::fs::remove_file(state.with_extension("out"));
}
