//! The `kinesis-checkpoint` binary against real servers: moto for the lease tables,
//! kinesis-local where a stream is read. Each test runs the built binary as an operator would,
//! with the endpoints in its environment, and checks the table afterwards through the library.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use common::kinesis::{KinesisLocal, Stream};
use common::moto::{Moto, create_lease_table, create_table, unique};
use common::temp_file::TempFile;
use kinesis_checkpoint::internal::{Commit, FailingChange, KeyCommit};
use kinesis_checkpoint::sequence::SHARD_END;
use kinesis_checkpoint::store::{CheckpointStore, FailingRecord, LeaseStore};
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position};
use serde_json::Value;

const SHARD: &str = "shardId-000000000000";

/// Runs the binary with `args`, the endpoints `endpoints` (`AWS_ENDPOINT_URL*` variable, URL)
/// and `stdin` as its input.
fn run(endpoints: &[(&str, &str)], args: &[&str], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kinesis-checkpoint"));
    command
        .args(args)
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_MAX_ATTEMPTS", "2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, url) in endpoints {
        command.env(name, url);
    }
    let mut child = command.spawn().expect("the binary runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("stdin written");
    child.wait_with_output().expect("the binary ends")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `status --no-lag --json` of `table`, parsed: one object per shard line.
fn status_json(endpoints: &[(&str, &str)], table: &str) -> Vec<Value> {
    let output = run(
        endpoints,
        &["status", "--table", table, "--no-lag", "--json"],
        "",
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

async fn fresh_table(moto: &Moto) -> (aws_config::SdkConfig, String, DynamoLeaseStore) {
    let config = moto.sdk_config(1).await;
    let table = unique("cli");
    create_lease_table(&config, &table).await;
    let store = DynamoLeaseStore::new(&config, &table);
    (config, table, store)
}

/// Takes `key`'s lease for a minute as `owner` and checkpoints `sequence` under it, as an
/// invocation would; the lease stays held.
async fn hold_at(store: &DynamoLeaseStore, key: &LeaseKey, owner: &str, sequence: &str) {
    assert!(
        store
            .acquire(key, owner, Duration::from_mins(1))
            .await
            .unwrap()
    );
    assert!(store.checkpoint(key, owner, sequence).await.unwrap());
}

fn position(n: u64) -> Position {
    Position::record(common::sequence(n).parse().unwrap())
}

async fn put_row(config: &aws_config::SdkConfig, table: &str, item: Vec<(&str, AttributeValue)>) {
    let item: HashMap<String, AttributeValue> =
        item.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    aws_sdk_dynamodb::Client::new(config)
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .send()
        .await
        .expect("put item");
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

#[tokio::test]
async fn status_shows_each_shard_with_its_lease_checkpoint_parents_and_failing_record() {
    let moto = Moto::shared();
    let (config, table, store) = fresh_table(moto).await;
    let leased = LeaseKey::new("orders", SHARD);
    hold_at(&store, &leased, "ledger:req-1", &common::sequence(5)).await;
    let failing = LeaseKey::new("orders", "shardId-000000000002");
    assert!(
        store
            .acquire(&failing, "ledger:req-2", Duration::from_mins(1))
            .await
            .unwrap()
    );
    let commit = Commit {
        checkpoint: Some(position(8)),
        failing: FailingChange::Set(FailingRecord::first(
            &position(9),
            "ledger table throttled",
            1,
        )),
        parent_shards: vec![SHARD.to_owned()],
        ..Commit::default()
    };
    assert!(
        store
            .commit(&failing, "ledger:req-2", &commit)
            .await
            .unwrap()
    );
    let finished = LeaseKey::new("orders", "shardId-000000000001");
    assert!(store.finish(&finished, None, 0).await.unwrap());
    put_row(
        &config,
        &table,
        vec![
            ("lease_key", s("shardId-000000000007")),
            ("checkpoint", s(&common::sequence(3))),
        ],
    )
    .await;

    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];
    let shards = status_json(&endpoint, &table);
    let by_key: HashMap<&str, &Value> = shards
        .iter()
        .map(|s| (s["lease_key"].as_str().unwrap(), s))
        .collect();
    assert_eq!(by_key.len(), 4, "{shards:?}");
    let leased_now = by_key["orders:shardId-000000000000"];
    assert_eq!(leased_now["owner"], "ledger:req-1");
    assert_eq!(leased_now["lease_live"], true);
    assert_eq!(leased_now["checkpoint"], common::sequence(5));
    let stuck = by_key["orders:shardId-000000000002"];
    assert_eq!(stuck["owner"], Value::Null, "released");
    assert_eq!(stuck["failing"]["sequence"], common::sequence(9));
    assert_eq!(stuck["failing"]["attempts"], 1);
    assert_eq!(stuck["failing"]["last_error"], "ledger table throttled");
    assert_eq!(stuck["parents"], serde_json::json!([SHARD]));
    assert_eq!(by_key["orders:shardId-000000000001"]["finished"], true);
    let bare = by_key["shardId-000000000007"];
    assert_eq!(bare["stream"], Value::Null);
    assert!(bare["note"].as_str().unwrap().contains("import-legacy"));

    let human = run(&endpoint, &["status", "--table", &table, "--no-lag"], "");
    let human = text(&human.stdout);
    println!("{human}");
    assert!(human.starts_with("SHARD"));
    let line = |key: &str| {
        human
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        line("orders:shardId-000000000000 ").contains("live"),
        "{human}"
    );
    assert!(
        line("orders:shardId-000000000001 ").contains("SHARD_END (finished)"),
        "{human}"
    );
    assert!(
        line("orders:shardId-000000000002 ").contains("x1: ledger table throttled"),
        "{human}"
    );
}

/// The partition-key mode's rows (one per key) are not shards: the keys are counted on their
/// shard's line, with the ones failing; rows an earlier version kept for its readings in parts
/// (`#`) are not shown.
#[tokio::test]
async fn status_counts_a_shards_partition_keys_on_its_line_and_shows_no_obsolete_rows() {
    let moto = Moto::shared();
    let (_, table, store) = fresh_table(moto).await;
    let row = |name: String| LeaseKey::new("orders", name);
    let mut done = KeyCommit::new(row(format!("{SHARD}:customer:1")), 0);
    done.checkpoint = Some(position(4));
    let mut stuck = KeyCommit::new(row(format!("{SHARD}:customer:2")), 0);
    stuck.failing = FailingChange::Set(FailingRecord::first(
        &position(5),
        "ledger table throttled",
        0,
    ));
    let mut lane_row = KeyCommit::new(row(format!("{SHARD}#lane:{}", common::sequence(3))), 0);
    lane_row.checkpoint = Some(position(6));
    let other = KeyCommit::new(row("shardId-000000000001:supplier".to_owned()), 0);
    assert_eq!(
        store
            .commit_rows(&[done, stuck, lane_row, other])
            .await
            .unwrap(),
        [true, true, true, true]
    );

    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];
    let shards = status_json(&endpoint, &table);
    let keys: Vec<&str> = shards
        .iter()
        .map(|s| s["lease_key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            format!("orders:{SHARD}"),
            "orders:shardId-000000000001".to_owned()
        ],
        "one line per shard: {shards:?}"
    );
    let first = &shards[0];
    assert_eq!(first["shard"], SHARD);
    assert_eq!(first["partition_keys"], 2);
    assert_eq!(
        first["failing_keys"],
        serde_json::json!([{
            "partition_key": "customer:2",
            "failing": {
                "sequence": common::sequence(5),
                "sub_sequence": null,
                "attempts": 1,
                "last_error": "ledger table throttled"
            }
        }])
    );
    assert_eq!(shards[1]["partition_keys"], 1);
    assert_eq!(shards[1]["failing_keys"], serde_json::json!([]));

    let human = text(&run(&endpoint, &["status", "--table", &table, "--no-lag"], "").stdout);
    println!("{human}");
    assert_eq!(human.lines().count(), 3, "a header and two shards: {human}");
    let line = human
        .lines()
        .find(|l| l.starts_with(&format!("orders:{SHARD} ")))
        .unwrap_or_default();
    assert!(line.contains("per key (2 keys)"), "{human}");
    assert!(
        line.contains("key customer:2: ") && line.contains("x1: ledger table throttled"),
        "{human}"
    );
}

#[tokio::test]
async fn status_reads_the_stream_to_say_how_far_behind_each_checkpoint_is() {
    let moto = Moto::shared();
    let kinesis = KinesisLocal::start();
    let (_, table, store) = fresh_table(moto).await;
    let kinesis_config = common::moto::sdk_config(&kinesis.endpoint, 3).await;
    let name = unique("lag");
    let stream = Stream::with_shards(&kinesis_config, &name, 2).await;
    for n in 0..5 {
        stream.put("same-key", n).await;
    }
    let event = stream.batch(SHARD).await;
    let (busy, idle) = if event.records.len() == 5 {
        (SHARD, "shardId-000000000001")
    } else {
        ("shardId-000000000001", SHARD)
    };
    let event = stream.batch(busy).await;
    assert_eq!(
        event.records.len(),
        5,
        "one partition key lands in one shard"
    );
    let key = LeaseKey::new(name.as_str(), busy);
    let third = &event.records[2].kinesis.sequence_number;
    hold_at(&store, &key, "me", third).await;
    store.release(&key, "me").await.unwrap();

    let endpoints = [
        ("AWS_ENDPOINT_URL_DYNAMODB", moto.endpoint.as_str()),
        ("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint.as_str()),
    ];
    let output = run(
        &endpoints,
        &["status", "--table", &table, "--stream", &name, "--json"],
        "",
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let shards: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    println!("{}", serde_json::to_string_pretty(&shards).unwrap());
    let find = |shard: &str| {
        shards
            .iter()
            .find(|s| s["shard"] == shard)
            .unwrap_or_else(|| panic!("{shard} listed"))
    };
    assert_eq!(
        find(busy)["behind"]["records"],
        2,
        "two records after the checkpoint"
    );
    assert!(find(busy)["behind"]["oldest_age_ms"].is_u64());
    assert_eq!(find(idle)["behind"]["records"], 0);
    assert!(
        find(idle)["note"].as_str().unwrap().contains("no row"),
        "a shard without a row is listed"
    );
}

#[tokio::test]
async fn set_checkpoint_refuses_a_live_lease_and_takes_it_only_when_forced() {
    let moto = Moto::shared();
    let (_, table, store) = fresh_table(moto).await;
    let key = LeaseKey::new("orders", SHARD);
    hold_at(&store, &key, "ledger:busy", &common::sequence(1)).await;
    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];
    let to = common::sequence(4);
    let args = [
        "set-checkpoint",
        "--table",
        &table,
        "--stream",
        "orders",
        "--shard",
        SHARD,
        "--sequence",
        &to,
        "--yes",
    ];

    let refused = run(&endpoint, &args, "");
    assert!(!refused.status.success());
    let message = text(&refused.stderr);
    assert!(
        message.contains("leased by 'ledger:busy'") && message.contains("--force"),
        "{message}"
    );
    assert_eq!(
        store.row(&key).await.unwrap().checkpoint,
        Some(common::sequence(1))
    );

    let forced = run(&endpoint, &[&args[..], &["--force"]].concat(), "");
    assert!(forced.status.success(), "{}", text(&forced.stderr));
    let row = store.row(&key).await.unwrap();
    assert_eq!(row.checkpoint, Some(to));
    assert_eq!(row.lease_owner, None, "the lease was taken away");
    assert!(
        !store
            .checkpoint(&key, "ledger:busy", &common::sequence(2))
            .await
            .unwrap(),
        "the invocation that held it is fenced"
    );
}

#[tokio::test]
async fn moving_a_checkpoint_asks_first_and_reads_the_answer_from_stdin() {
    let moto = Moto::shared();
    let (_, table, store) = fresh_table(moto).await;
    let key = LeaseKey::new("orders", SHARD);
    assert!(
        store
            .acquire(&key, "old", Duration::from_millis(1))
            .await
            .unwrap()
    );
    let commit = Commit {
        checkpoint: Some(position(3)),
        failing: FailingChange::Set(FailingRecord::first(&position(4), "poison", 1)),
        ..Commit::default()
    };
    assert!(store.commit(&key, "old", &commit).await.unwrap());
    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];
    let finish = [
        "set-checkpoint",
        "--table",
        &table,
        "--stream",
        "orders",
        "--shard",
        SHARD,
        "--finished",
    ];

    let declined = run(&endpoint, &finish, "no\n");
    assert!(!declined.status.success());
    let shown = text(&declined.stdout);
    assert!(
        shown.contains("SHARD_END (finished)") && shown.contains("Type 'yes'"),
        "{shown}"
    );
    assert!(shown.contains("forgets the failing record"), "{shown}");
    assert!(text(&declined.stderr).contains("not confirmed"));
    assert_eq!(
        store.row(&key).await.unwrap().checkpoint,
        Some(common::sequence(3))
    );

    let no_answer = run(&endpoint, &finish, "");
    assert!(!no_answer.status.success(), "end of input is a no");

    let accepted = run(&endpoint, &finish, "yes\n");
    assert!(accepted.status.success(), "{}", text(&accepted.stderr));
    let row = store.row(&key).await.unwrap();
    assert_eq!(row.checkpoint.as_deref(), Some(SHARD_END));
    assert_eq!(row.failing, None);

    let reset = run(
        &endpoint,
        &[
            "reset", "--table", &table, "--stream", "orders", "--shard", SHARD, "--yes",
        ],
        "",
    );
    assert!(reset.status.success(), "{}", text(&reset.stderr));
    assert_eq!(store.row(&key).await.unwrap().checkpoint, None);
}

#[tokio::test]
async fn status_shows_the_progress_inside_an_aggregate_beside_the_checkpoint_done_whole() {
    let moto = Moto::shared();
    let (_config, table, store) = fresh_table(moto).await;
    let key = LeaseKey::new("orders", SHARD);
    assert!(
        store
            .acquire(&key, "ledger:req-1", Duration::from_mins(1))
            .await
            .unwrap()
    );
    let commit = Commit {
        checkpoint: Some(Position::sub_record(
            common::sequence(9).parse().unwrap(),
            3,
        )),
        below: kinesis_checkpoint::internal::Below::Record(common::sequence(8).parse().unwrap()),
        ..Commit::default()
    };
    assert!(store.commit(&key, "ledger:req-1", &commit).await.unwrap());

    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];
    let shards = status_json(&endpoint, &table);
    assert_eq!(shards[0]["checkpoint"], common::sequence(8), "done whole");
    assert_eq!(shards[0]["aggregate_sequence"], common::sequence(9));
    assert_eq!(shards[0]["checkpoint_sub"], 3);
    let table_out = run(&endpoint, &["status", "--table", &table, "--no-lag"], "");
    let said = text(&table_out.stdout);
    assert!(
        said.contains(&format!("{}/3", common::sequence(9))),
        "{said}"
    );
}

#[tokio::test]
async fn import_legacy_copies_bare_rows_under_the_stream_and_keeps_newer_checkpoints() {
    let moto = Moto::shared();
    let (config, table, store) = fresh_table(moto).await;
    put_row(
        &config,
        &table,
        vec![
            ("lease_key", s(SHARD)),
            ("checkpoint", s(&common::sequence(10))),
        ],
    )
    .await;
    put_row(
        &config,
        &table,
        vec![
            ("lease_key", s("shardId-000000000001")),
            ("checkpoint", s(&common::sequence(20))),
        ],
    )
    .await;
    let newer = LeaseKey::new("orders", "shardId-000000000001");
    hold_at(&store, &newer, "me", &common::sequence(25)).await;
    store.release(&newer, "me").await.unwrap();
    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];

    let output = run(
        &endpoint,
        &[
            "import-legacy",
            "--table",
            &table,
            "--stream",
            "orders",
            "--yes",
        ],
        "",
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let said = text(&output.stdout);
    println!("{said}");
    assert!(said.contains("imported 1 checkpoints; kept 1"), "{said}");
    let copied = store.row(&LeaseKey::new("orders", SHARD)).await.unwrap();
    assert_eq!(
        (
            copied.checkpoint,
            copied.aggregate_sequence,
            copied.aggregate_sub,
        ),
        (Some(common::sequence(10)), None, None)
    );
    assert_eq!(
        store.row(&newer).await.unwrap().checkpoint,
        Some(common::sequence(25))
    );

    let again = run(
        &[],
        &[
            "--endpoint-url",
            &moto.endpoint,
            "import-legacy",
            "--table",
            &table,
            "--stream",
            "orders",
            "--yes",
        ],
        "",
    );
    // Through --endpoint-url this time, with no endpoint in the environment.
    assert!(
        text(&again.stdout).contains("imported 0 checkpoints; kept 2"),
        "a second run changes nothing"
    );
}

/// A KCL 2.x lease item.
fn kcl_lease(key: &str, checkpoint: &str, sub: u64) -> Vec<(&'static str, AttributeValue)> {
    vec![
        ("leaseKey", s(key)),
        ("checkpoint", s(checkpoint)),
        ("checkpointSubSequenceNumber", n(sub)),
        ("leaseOwner", s("worker-1")),
        ("leaseCounter", n(42)),
        ("ownerSwitchesSinceCheckpoint", n(0)),
    ]
}

#[tokio::test]
async fn import_kcl_copies_checkpoints_sub_sequences_parents_and_finished_shards() {
    let moto = Moto::shared();
    let (config, table, store) = fresh_table(moto).await;
    let kcl = unique("kcl-app");
    create_table(&config, &kcl, "leaseKey").await;
    for (shard, checkpoint) in [
        ("shardId-000000000000", common::sequence(7)),
        ("shardId-000000000001", SHARD_END.to_owned()),
        ("shardId-000000000002", "TRIM_HORIZON".to_owned()),
        (
            "123456789012:payments:1700000000:shardId-000000000000",
            common::sequence(1),
        ),
    ] {
        put_row(&config, &kcl, kcl_lease(shard, &checkpoint, 0)).await;
    }
    let mut child = kcl_lease("shardId-000000000003", &common::sequence(9), 4);
    child.push((
        "parentShardId",
        AttributeValue::Ss(vec!["shardId-000000000001".to_owned()]),
    ));
    put_row(&config, &kcl, child).await;
    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];

    let refused = run(
        &endpoint,
        &[
            "import-kcl",
            "--kcl-table",
            &kcl,
            "--table",
            &table,
            "--offline",
            "--yes",
        ],
        "",
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("--stream"),
        "{}",
        text(&refused.stderr)
    );

    let output = run(
        &endpoint,
        &[
            "import-kcl",
            "--kcl-table",
            &kcl,
            "--table",
            &table,
            "--stream",
            "orders",
            "--offline",
            "--yes",
        ],
        "",
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    println!("{}", text(&output.stdout));
    let row = |shard: &str| {
        let store = &store;
        let shard = shard.to_owned();
        async move { store.row(&LeaseKey::new("orders", shard)).await.unwrap() }
    };
    let plain = row(SHARD).await;
    assert_eq!(
        (
            plain.checkpoint,
            plain.aggregate_sequence,
            plain.aggregate_sub
        ),
        (None, Some(common::sequence(7)), Some(0)),
        "offline, sub-sequence 0 stays inside the record: never a skip"
    );
    assert_eq!(
        row("shardId-000000000001").await.checkpoint.as_deref(),
        Some(SHARD_END)
    );
    assert_eq!(
        row("shardId-000000000002").await.checkpoint,
        None,
        "TRIM_HORIZON: nothing done"
    );
    let child = row("shardId-000000000003").await;
    assert_eq!(
        (child.aggregate_sub, child.parent_shards),
        (Some(4), vec!["shardId-000000000001".to_owned()])
    );
    assert_eq!(
        store
            .row(&LeaseKey::new("payments", SHARD))
            .await
            .unwrap()
            .checkpoint,
        None,
        "another stream of a multi-stream application is left alone"
    );
}

#[tokio::test]
async fn import_kcl_reads_the_stream_so_a_plain_record_is_neither_replayed_nor_skipped() {
    let moto = Moto::shared();
    let kinesis = KinesisLocal::start();
    let (config, table, store) = fresh_table(moto).await;
    let kinesis_config = common::moto::sdk_config(&kinesis.endpoint, 3).await;
    let name = unique("kcl-stream");
    let stream = Stream::create(&kinesis_config, &name).await;
    for n in 0..3 {
        stream.put("k", n).await;
    }
    let event = stream.batch(SHARD).await;
    let second = event.records[1].kinesis.sequence_number.clone();
    let kcl = unique("kcl-app");
    create_table(&config, &kcl, "leaseKey").await;
    put_row(&config, &kcl, kcl_lease(SHARD, &second, 0)).await;
    let endpoints = [
        ("AWS_ENDPOINT_URL_DYNAMODB", moto.endpoint.as_str()),
        ("AWS_ENDPOINT_URL_KINESIS", kinesis.endpoint.as_str()),
    ];

    let output = run(
        &endpoints,
        &[
            "import-kcl",
            "--kcl-table",
            &kcl,
            "--table",
            &table,
            "--stream",
            &name,
            "--yes",
        ],
        "",
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let row = store
        .row(&LeaseKey::new(name.as_str(), SHARD))
        .await
        .unwrap();
    assert_eq!(
        (row.checkpoint, row.aggregate_sequence),
        (Some(second), None),
        "a plain record is done whole: the next batch starts after it"
    );
}

fn doctor(template: &Path) -> (bool, String) {
    let output = run(
        &[],
        &["doctor", "--template", template.to_str().unwrap()],
        "",
    );
    (
        output.status.success(),
        text(&output.stdout) + &text(&output.stderr),
    )
}

/// The repository's template with `edits` (find, replace) applied where each first occurs: in
/// the Kinesis function's part, which comes first. Removed when the test ends.
fn broken_template(edits: &[(&str, &str)]) -> TempFile {
    broken_template_after("", edits)
}

/// Where the template's `DynamoDB` Streams part (the orders table, the second function's role,
/// the function and its mapping) begins.
const TABLE_PART: &str = "  OrdersTable:\n";

/// The repository's template with `edits` applied where each first occurs after `marker`.
fn broken_template_after(marker: &str, edits: &[(&str, &str)]) -> TempFile {
    let template = std::fs::read_to_string(common::root().join("template.yaml")).unwrap();
    let at = template.find(marker).expect("the template has the marker");
    let (head, tail) = template.split_at(at);
    let mut tail = tail.to_owned();
    for (find, replace) in edits {
        assert!(tail.contains(find), "the template has {find:?}");
        tail = tail.replacen(find, replace, 1);
    }
    TempFile::write(
        &format!("{}.yaml", unique("template")),
        head.to_owned() + &tail,
    )
}

#[test]
fn doctor_finds_nothing_wrong_with_the_repository_template() {
    let (ok, said) = doctor(&common::root().join("template.yaml"));
    assert!(ok, "{said}");
    assert!(said.contains("no problems found"), "{said}");
}

#[test]
fn doctor_says_what_to_change_in_a_mapping_that_would_lose_records() {
    let path = broken_template(&[
        ("              - ReportBatchItemFailures\n", ""),
        ("MaximumRetryAttempts: -1", "MaximumRetryAttempts: 3"),
        (
            "MaximumRecordAgeInSeconds: -1",
            "MaximumRecordAgeInSeconds: 3600",
        ),
        (
            "BisectBatchOnFunctionError: false",
            "BisectBatchOnFunctionError: true",
        ),
    ]);
    let (ok, said) = doctor(&path);
    println!("{said}");
    assert!(!ok, "errors fail the command");
    for expected in [
        "FunctionResponseTypes does not contain ReportBatchItemFailures",
        "fix: add `FunctionResponseTypes: [ReportBatchItemFailures]`",
        "MaximumRetryAttempts is 3",
        "fix: set `MaximumRetryAttempts: -1`",
        "MaximumRecordAgeInSeconds is 3600",
        "BisectBatchOnFunctionError is on",
        "3 errors, 1 warnings",
    ] {
        assert!(said.contains(expected), "{expected:?} in:\n{said}");
    }
}

#[test]
fn doctor_requires_the_partition_key_mode_for_a_parallelization_factor_above_one() {
    let parallel = broken_template(&[("ParallelizationFactor: 1", "ParallelizationFactor: 4")]);
    let (ok, said) = doctor(&parallel);
    assert!(!ok);
    assert!(
        said.contains("ParallelizationFactor is 4")
            && said.contains("CHECKPOINT_MODE: partition-key"),
        "{said}"
    );

    let fixed = broken_template(&[
        ("ParallelizationFactor: 1", "ParallelizationFactor: 4"),
        (
            "          CHECKPOINT_MODE: shard\n",
            "          CHECKPOINT_MODE: partition-key\n",
        ),
    ]);
    let (ok, said) = doctor(&fixed);
    assert!(ok, "{said}");
}

#[test]
fn doctor_refuses_a_tumbling_window_on_a_kinesis_mapping() {
    let windowed = broken_template(&[(
        "ParallelizationFactor: 1",
        "ParallelizationFactor: 1\n            TumblingWindowInSeconds: 60",
    )]);
    let (ok, said) = doctor(&windowed);
    assert!(!ok, "{said}");
    for expected in [
        "LedgerFunction event Orders",
        "TumblingWindowInSeconds is 60 on a Kinesis mapping",
        "fix: remove `TumblingWindowInSeconds`",
        "1 errors, 0 warnings",
    ] {
        assert!(said.contains(expected), "{expected:?} in:\n{said}");
    }
}

#[test]
fn doctor_names_each_permission_the_role_lacks() {
    let path = broken_template(&[
        (
            "                  - dynamodb:GetItem\n                  - dynamodb:UpdateItem\n",
            "                  - dynamodb:GetItem\n",
        ),
        ("Action: sqs:SendMessage", "Action: sqs:ReceiveMessage"),
        ("                  - kinesis:ListShards\n", ""),
    ]);
    let (ok, said) = doctor(&path);
    println!("{said}");
    assert!(!ok);
    for expected in [
        "does not allow dynamodb:UpdateItem on the lease table (LeaseTable)",
        "does not allow sqs:SendMessage on the dead-letter queue (DeadLetterQueue)",
        "does not allow kinesis:ListShards on the stream (OrdersStream)",
    ] {
        assert!(said.contains(expected), "{expected:?} in:\n{said}");
    }
    assert!(
        !said.contains("dynamodb:GetItem on"),
        "GetItem is still allowed"
    );
}

#[test]
fn doctor_answers_scripts_in_json_with_severity_problem_and_fix() {
    let path = broken_template(&[(
        "MaximumRecordAgeInSeconds: -1",
        "MaximumRecordAgeInSeconds: 60",
    )]);
    let output = run(
        &[],
        &["doctor", "--template", path.to_str().unwrap(), "--json"],
        "",
    );
    assert!(!output.status.success());
    let findings: Vec<Value> = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0]["severity"], "error");
    assert_eq!(findings[0]["subject"], "LedgerFunction event Orders");
    assert!(
        findings[0]["fix"]
            .as_str()
            .unwrap()
            .contains("MaximumRecordAgeInSeconds: -1")
    );
}

#[test]
fn doctor_says_what_to_change_in_a_dynamodb_stream_mapping() {
    let path = broken_template_after(
        TABLE_PART,
        &[
            ("            TumblingWindowInSeconds: 900\n", ""),
            ("              - ReportBatchItemFailures\n", ""),
            ("ParallelizationFactor: 1", "ParallelizationFactor: 2"),
            ("MaximumRetryAttempts: -1", "MaximumRetryAttempts: 3"),
            (
                "            StartingPosition: TRIM_HORIZON",
                "            StartingPosition: LATEST",
            ),
            (
                "STARTING_POSITION: TRIM_HORIZON",
                "STARTING_POSITION: LATEST",
            ),
        ],
    );
    let (ok, said) = doctor(&path);
    println!("{said}");
    assert!(!ok, "errors fail the command");
    for expected in [
        "LedgerFromTableFunction event OrderChanges: TumblingWindowInSeconds is not set",
        "DynamoDB event names no shard",
        "fix: set `TumblingWindowInSeconds: 900`",
        "FunctionResponseTypes does not contain ReportBatchItemFailures",
        "ParallelizationFactor is 2",
        "it has no per-item mode",
        "fix: set `ParallelizationFactor: 1`",
        "MaximumRetryAttempts is 3",
        "cannot read it back: the records are lost",
        "StartingPosition is LATEST",
        "fix: set `StartingPosition: TRIM_HORIZON`",
        "5 errors, 0 warnings",
    ] {
        assert!(said.contains(expected), "{expected:?} in:\n{said}");
    }
    assert!(
        !said.contains("LedgerFunction event Orders"),
        "the Kinesis mapping is untouched: {said}"
    );
}

#[test]
fn doctor_refuses_a_dynamodb_stream_without_a_window_and_tells_a_short_one() {
    let path = broken_template_after(
        TABLE_PART,
        &[("TumblingWindowInSeconds: 900", "TumblingWindowInSeconds: 0")],
    );
    let (ok, said) = doctor(&path);
    assert!(!ok, "{said}");
    assert!(
        said.contains("TumblingWindowInSeconds is 0: without a tumbling window"),
        "{said}"
    );

    let path = broken_template_after(
        TABLE_PART,
        &[(
            "TumblingWindowInSeconds: 900",
            "TumblingWindowInSeconds: 60",
        )],
    );
    let (ok, said) = doctor(&path);
    assert!(ok, "a short window works: {said}");
    assert!(
        said.contains(
            "INFO    LedgerFromTableFunction event OrderChanges: TumblingWindowInSeconds is 60"
        ) && said.contains("no problems found"),
        "{said}"
    );
}

#[test]
fn doctor_names_the_stream_permissions_a_grant_on_the_table_does_not_give() {
    let path = broken_template_after(
        TABLE_PART,
        &[(
            "Resource: !GetAtt OrdersTable.StreamArn",
            "Resource: !GetAtt OrdersTable.Arn",
        )],
    );
    let (ok, said) = doctor(&path);
    println!("{said}");
    assert!(!ok);
    for action in [
        "DescribeStream",
        "GetShardIterator",
        "GetRecords",
        "ListStreams",
    ] {
        let expected = format!(
            "LedgerFromTableFunction's role does not allow dynamodb:{action} on the table's \
             stream (OrdersTable.StreamArn)"
        );
        assert!(said.contains(&expected), "{expected:?} in:\n{said}");
    }
    assert!(
        said.contains("fix: allow `dynamodb:GetRecords` on `!GetAtt OrdersTable.StreamArn`"),
        "{said}"
    );

    let path = broken_template_after(
        TABLE_PART,
        &[("                  - dynamodb:ListStreams\n", "")],
    );
    let (ok, said) = doctor(&path);
    assert!(!ok);
    assert!(
        said.contains("does not allow dynamodb:ListStreams") && said.contains("1 errors"),
        "{said}"
    );
}

#[test]
fn doctor_refuses_the_partition_key_mode_and_a_kinesis_event_source_for_a_table_stream() {
    let path = broken_template_after(
        TABLE_PART,
        &[
            ("CHECKPOINT_MODE: shard", "CHECKPOINT_MODE: partition-key"),
            ("EVENT_SOURCE: dynamodb-streams", "EVENT_SOURCE: kinesis"),
        ],
    );
    let (ok, said) = doctor(&path);
    println!("{said}");
    assert!(!ok);
    for expected in [
        "CHECKPOINT_MODE is 'partition-key', which the toolkit does not offer for a DynamoDB stream",
        "EVENT_SOURCE is 'kinesis' but this mapping reads a DynamoDB stream",
        "fix: set the function's environment variable `EVENT_SOURCE: dynamodb-streams`",
        "2 errors, 0 warnings",
    ] {
        assert!(said.contains(expected), "{expected:?} in:\n{said}");
    }
}

/// A function deployed in moto, with the environment `variables` and a role with the inline
/// policy `policy` (and the managed policy `attached`, if any), and a Kinesis mapping that
/// `mapping` configures.
async fn deploy(
    config: &aws_config::SdkConfig,
    stream_arn: &str,
    policy: &Value,
    attached: Option<&Value>,
    variables: &[(&str, &str)],
    mapping: impl FnOnce(
        aws_sdk_lambda::operation::create_event_source_mapping::builders::CreateEventSourceMappingFluentBuilder,
    ) -> aws_sdk_lambda::operation::create_event_source_mapping::builders::CreateEventSourceMappingFluentBuilder,
) -> String {
    let iam = aws_sdk_iam::Client::new(config);
    let role = unique("role");
    let created = iam
        .create_role()
        .role_name(&role)
        .assume_role_policy_document(
            serde_json::json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
                "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    iam.put_role_policy()
        .role_name(&role)
        .policy_name("toolkit")
        .policy_document(policy.to_string())
        .send()
        .await
        .unwrap();
    if let Some(attached) = attached {
        let managed = iam
            .create_policy()
            .policy_name(unique("managed"))
            .policy_document(attached.to_string())
            .send()
            .await
            .unwrap();
        iam.attach_role_policy()
            .role_name(&role)
            .policy_arn(managed.policy().unwrap().arn().unwrap())
            .send()
            .await
            .unwrap();
    }
    let lambda = aws_sdk_lambda::Client::new(config);
    let function = unique("fn");
    // An empty zip archive: moto stores the code, it never runs it here.
    let mut zip = b"PK\x05\x06".to_vec();
    zip.extend([0; 18]);
    let mut environment = aws_sdk_lambda::types::Environment::builder();
    for (name, value) in variables {
        environment = environment.variables(*name, *value);
    }
    lambda
        .create_function()
        .function_name(&function)
        .runtime(aws_sdk_lambda::types::Runtime::Providedal2023)
        .handler("bootstrap")
        .role(created.role().unwrap().arn())
        .code(
            aws_sdk_lambda::types::FunctionCode::builder()
                .zip_file(aws_sdk_lambda::primitives::Blob::new(zip))
                .build(),
        )
        .environment(environment.build())
        .send()
        .await
        .unwrap();
    mapping(
        lambda
            .create_event_source_mapping()
            .function_name(&function)
            .event_source_arn(stream_arn)
            .starting_position(aws_sdk_lambda::types::EventSourcePosition::TrimHorizon),
    )
    .send()
    .await
    .unwrap();
    function
}

#[tokio::test]
async fn doctor_reads_a_deployed_function_its_mapping_and_its_role_from_the_apis() {
    let moto = Moto::shared();
    let config = moto.sdk_config(1).await;
    let stream = unique("doctor-stream");
    let kinesis = aws_sdk_kinesis::Client::new(&config);
    kinesis
        .create_stream()
        .stream_name(&stream)
        .shard_count(1)
        .send()
        .await
        .unwrap();
    let stream_arn = kinesis
        .describe_stream_summary()
        .stream_name(&stream)
        .send()
        .await
        .unwrap()
        .stream_description_summary()
        .unwrap()
        .stream_arn()
        .to_owned();
    let table_and_queue = serde_json::json!([
        {"Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:UpdateItem"],
         "Resource": "arn:aws:dynamodb:*:*:table/leases*"},
        {"Effect": "Allow", "Action": "sqs:SendMessage",
         "Resource": "arn:aws:sqs:us-east-1:123456789012:dead-letters"},
    ]);
    let variables = [
        ("LEASE_TABLE", "leases"),
        (
            "DEAD_LETTER_QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/123456789012/dead-letters",
        ),
    ];
    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];

    // Deployed as the template's pitfalls would leave it: no item failures, limited retries,
    // two batches per shard in the shard mode, and no right to read the stream.
    let policy = serde_json::json!({"Version": "2012-10-17", "Statement": table_and_queue});
    let careless = deploy(&config, &stream_arn, &policy, None, &variables, |mapping| {
        mapping.maximum_retry_attempts(2).parallelization_factor(2)
    })
    .await;
    let output = run(&endpoint, &["doctor", "--function", &careless], "");
    let said = text(&output.stdout) + &text(&output.stderr);
    assert!(!output.status.success(), "{said}");
    for expected in [
        "ReportBatchItemFailures",
        "MaximumRetryAttempts is 2",
        "ParallelizationFactor is 2",
        "does not allow kinesis:GetRecords",
    ] {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
    for granted in ["dynamodb:UpdateItem", "sqs:SendMessage"] {
        assert!(!said.contains(granted), "{granted} is granted: {said}");
    }

    // The same function done right, the stream's permissions in a managed policy attached to
    // the role: nothing to change.
    let stream_policy = serde_json::json!({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "kinesis:*", "Resource": "arn:aws:kinesis:*:*:stream/doctor-*"}]});
    let careful = deploy(
        &config,
        &stream_arn,
        &policy,
        Some(&stream_policy),
        &variables,
        |mapping| {
            mapping
                .function_response_types(
                    aws_sdk_lambda::types::FunctionResponseType::ReportBatchItemFailures,
                )
                .maximum_retry_attempts(-1)
                .maximum_record_age_in_seconds(-1)
        },
    )
    .await;
    let output = run(&endpoint, &["doctor", "--function", &careful], "");
    let said = text(&output.stdout) + &text(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(said.contains("no problems found"), "{said}");

    let output = run(&endpoint, &["doctor", "--function", "no-such-function"], "");
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("cannot read the function no-such-function"),
        "{}",
        text(&output.stderr)
    );
}

/// moto's Lambda creates mappings on `DynamoDB` streams too (it checks the ARN against its
/// streams) and returns `TumblingWindowInSeconds`: the doctor reads one as it reads a Kinesis
/// mapping.
#[tokio::test]
async fn doctor_reads_a_deployed_dynamodb_stream_mapping_from_the_apis() {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
        StreamSpecification, StreamViewType,
    };
    let moto = Moto::shared();
    let config = moto.sdk_config(1).await;
    let table = unique("doctor-orders");
    let created = aws_sdk_dynamodb::Client::new(&config)
        .create_table()
        .table_name(&table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("order_id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("order_id")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewImage)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let stream_arn = created
        .table_description()
        .and_then(|table| table.latest_stream_arn())
        .expect("a stream")
        .to_owned();
    let table_and_queue = serde_json::json!([
        {"Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:UpdateItem"],
         "Resource": "arn:aws:dynamodb:*:*:table/leases*"},
        {"Effect": "Allow", "Action": "sqs:SendMessage",
         "Resource": "arn:aws:sqs:us-east-1:123456789012:dead-letters"},
    ]);
    let variables = [
        ("EVENT_SOURCE", "dynamodb-streams"),
        ("LEASE_TABLE", "leases"),
        (
            "DEAD_LETTER_QUEUE_URL",
            "https://sqs.us-east-1.amazonaws.com/123456789012/dead-letters",
        ),
    ];
    let endpoint = [("AWS_ENDPOINT_URL", moto.endpoint.as_str())];

    // No window, no item failures, two batches per shard, and the table granted, not its stream.
    let on_the_table = serde_json::json!({"Version": "2012-10-17", "Statement": [
        table_and_queue[0], table_and_queue[1],
        {"Effect": "Allow", "Action": "dynamodb:*",
         "Resource": format!("arn:aws:dynamodb:us-east-1:123456789012:table/{table}")}]});
    let careless = deploy(
        &config,
        &stream_arn,
        &on_the_table,
        None,
        &variables,
        |mapping| mapping.parallelization_factor(2),
    )
    .await;
    let output = run(&endpoint, &["doctor", "--function", &careless], "");
    let said = text(&output.stdout) + &text(&output.stderr);
    println!("{said}");
    assert!(!output.status.success(), "{said}");
    for expected in [
        "TumblingWindowInSeconds is not set",
        "ReportBatchItemFailures",
        "ParallelizationFactor is 2",
        "does not allow dynamodb:GetRecords on the table's stream",
        "does not allow dynamodb:DescribeStream on the table's stream",
    ] {
        assert!(said.contains(expected), "{expected:?} in {said}");
    }
    assert!(
        !said.contains("kinesis:"),
        "no Kinesis permission asked of a table stream's function: {said}"
    );

    // Done right: the window, the contract's limits, the stream's actions on the table's streams.
    let policy = serde_json::json!({"Version": "2012-10-17", "Statement": [
        table_and_queue[0], table_and_queue[1],
        {"Effect": "Allow",
         "Action": ["dynamodb:DescribeStream", "dynamodb:GetShardIterator",
                    "dynamodb:GetRecords", "dynamodb:ListStreams"],
         "Resource": "arn:aws:dynamodb:*:*:table/doctor-orders*/stream/*"}]});
    let careful = deploy(&config, &stream_arn, &policy, None, &variables, |mapping| {
        mapping
            .tumbling_window_in_seconds(900)
            .function_response_types(
                aws_sdk_lambda::types::FunctionResponseType::ReportBatchItemFailures,
            )
            .maximum_retry_attempts(-1)
            .maximum_record_age_in_seconds(-1)
            .bisect_batch_on_function_error(false)
            .parallelization_factor(1)
    })
    .await;
    let output = run(&endpoint, &["doctor", "--function", &careful], "");
    let said = text(&output.stdout) + &text(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(said.contains("no problems found"), "{said}");
}
