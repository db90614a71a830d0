//! The README's "Local loop", run as written: its commands are read out of `README.md` and run
//! one by one with `bash` from the repository's root (`make local-up`, each `make invoke
//! EVENT=...`, `make local-show`, `make local-down`), and each answer is compared with the one
//! `events/README.md` promises for that event. The other Kinesis events it lists are invoked
//! after the README's, before `make local-down`. After every invocation the lease table, the
//! ledger table and the dead-letter queue are read with the AWS SDK and checked, field by field,
//! against what the event must have done.
//!
//! Two variables are set around the commands, not in them: `LOCAL_STATE` (a state folder of the
//! test's own, so a developer's stack is never touched) and `LOCAL_FUNCTION_BIN` (the ledger
//! binary `cargo test` built, run against `cargo lambda watch --only-lambda-apis`, so the
//! function checked is the one under test and the AWS SDK is not compiled a second time).

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "local_loop/model.rs"]
mod model;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_lambda_events::event::kinesis::KinesisEventRecord;
use common::root;
use model::{Model, sample, sequence};
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
/// ``| `batch.json` | `{"batchItemFailures":[]}` | ... |``, by the event's path under `events/`,
/// in the order the tables list them.
fn promised_answers() -> Vec<(String, Value)> {
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

/// The lines the function logged at WARN or ERROR while handling one event (metric lines and
/// INFO lines left out).
fn problems(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.starts_with(" WARN") || line.starts_with("ERROR"))
        .collect()
}

/// What the one log line of each foreign event must say, besides its stream, shard and
/// sequence number.
fn foreign_line(file: &str, record: &KinesisEventRecord) -> Option<(&'static str, Vec<String>)> {
    let sequence = sequence(record);
    match file {
        // The shard's span names stream and shard; the line names its record.
        "foreign/example-kinesis-event-encrypted.json" => Some((
            "dead-lettered the record",
            vec![
                "stream=\"simple-stream\" shard=\"shardId-000000000000\"".to_owned(),
                format!("sequence={sequence}"),
            ],
        )),
        "foreign/sam-kinesis-get-records.json" => Some((
            "eventSourceARN Some(\"arn:aws:kinesis:EXAMPLE\") is not 'arn:aws:kinesis:<region>:<account>:stream/<name>'",
            vec![format!(
                "stream unknown, shard shardId-000000000000, sequence number {sequence}"
            )],
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
                line.contains(cause) && names.iter().all(|name| line.contains(name.as_str())),
                "{path}: one line that says what happened ({cause}) and names {names:?}: {line}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_readme_local_loop_gives_every_answer_and_effect_events_readme_promises() {
    let commands = readme_commands();
    let answers = promised_answers();
    let state = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
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
    // The README's loop invokes the Kinesis events a reader needs; the others events/README.md
    // lists are invoked after them, in its order, before `make local-down`. The DynamoDB
    // events need a DynamoDB stream: `tests/dynamodb_streams.rs` checks their answers.
    let kinesis: Vec<&(String, Value)> = answers
        .iter()
        .filter(|(path, _)| !path.contains("dynamodb"))
        .collect();
    let readme_invokes: Vec<&str> = commands
        .iter()
        .filter_map(|command| command.strip_prefix("make invoke EVENT=events/"))
        .collect();
    let rest = kinesis
        .iter()
        .map(|(path, _)| path.as_str())
        .filter(|path| !readme_invokes.contains(path))
        .map(|path| format!("make invoke EVENT=events/{path}"));
    let (down, commands) = commands.split_last().unwrap();
    let commands: Vec<String> = commands
        .iter()
        .cloned()
        .chain(rest)
        .chain([down.clone()])
        .collect();
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
            let promised = kinesis
                .iter()
                .find_map(|(listed, answer)| (listed == path).then_some(answer))
                .unwrap_or_else(|| panic!("events/README.md promises no answer for {path}"));
            assert_eq!(&answer, promised, "the answer to {path}");
            model.invoked(path);
            model.check(path, &stack.read_env("stack.env")).await;
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
    let mut listed: Vec<&String> = kinesis.iter().map(|(path, _)| path).collect();
    listed.sort();
    let mut ran: Vec<&String> = invoked.iter().collect();
    ran.sort();
    assert_eq!(
        ran, listed,
        "every Kinesis event events/README.md lists is invoked once"
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
