//! `kinesis-checkpoint import-legacy` and `import-kcl`: bring checkpoints over from another
//! consumer so that the Lambda function resumes where it stopped, replaying and skipping
//! nothing.
//!
//! Both build a [`Plan`] first (shown to the operator, who confirms it), then write each
//! checkpoint only where the shard has none under its `stream:shard` key: progress the function
//! already made is newer than anything imported, and running an import twice changes nothing.
//!
//! - Legacy rows: earlier versions of the seed crate keyed a row by the bare shard id. The
//!   import copies them under the named stream, as `DynamoLeaseStore::legacy_stream` does one
//!   shard at a time, for the whole table at once. The bare rows stay (a container consumer of
//!   the old version may still read them); delete them once nothing does.
//! - KCL 2.x lease tables: `leaseKey` (a shard id, or `account:stream:creationEpoch:shardId` for
//!   a multi-stream application), `checkpoint` (a sequence number, `TRIM_HORIZON`, `LATEST`,
//!   `AT_TIMESTAMP` or `SHARD_END`), `checkpointSubSequenceNumber` and `parentShardId`.
//!   `SHARD_END` becomes the finished marker; the symbolic starting points mean nothing was
//!   processed and are not copied. KCL writes sub-sequence 0 for a plain record and for the
//!   first user record of a KPL aggregate alike; the import reads the record from the stream to
//!   tell them apart (a whole record, or a position inside the aggregate), and without the
//!   stream keeps the position inside, at worst running that one record once more.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use aws_sdk_dynamodb::Client as DynamoDb;
use aws_sdk_kinesis::Client as Kinesis;
use aws_sdk_kinesis::types::ShardIteratorType;
use kinesis_checkpoint::aws_error::cause;
use kinesis_checkpoint::sequence::SHARD_END;
use kinesis_checkpoint::store::dynamo::Row;
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position, Record};
use serde::Serialize;

use crate::Error;
use crate::console::{Progress, confirm};

/// One shard of an import: where its checkpoint comes from and what is written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Step {
    /// The key in the source table.
    pub source: String,
    /// The shard it is written for.
    pub key: LeaseKey,
    /// The checkpoint to write; `None` when there is nothing to copy.
    pub position: Option<Position>,
    /// The shard's parents, when the source knows them.
    pub parents: Vec<String>,
    /// What the operator should know about this step.
    pub note: Option<String>,
}

/// Every step of an import, in the order of the source's keys.
pub type Plan = Vec<Step>;

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Imported {
    /// Checkpoints written.
    pub copied: usize,
    /// Shards left alone because they already have a checkpoint.
    pub kept: usize,
    /// Source rows with nothing to copy.
    pub skipped: usize,
}

/// The plan of copying the bare-shard-id rows among `rows` under `stream`.
///
/// ```
/// use kinesis_checkpoint::store::LeaseState;
/// use kinesis_checkpoint::store::dynamo::Row;
///
/// let mut state = LeaseState::default();
/// state.checkpoint = Some("42".to_owned());
/// let rows = [Row::new("shardId-000000000000", state.clone()), Row::new("orders:shardId-000000000001", state)];
/// let plan = kinesis_checkpoint_cli::import::legacy_plan(&rows, "orders");
/// assert_eq!(plan.len(), 1, "only the bare row");
/// assert_eq!(plan[0].key.to_string(), "orders:shardId-000000000000");
/// ```
#[must_use]
pub fn legacy_plan(rows: &[Row], stream: &str) -> Plan {
    rows.iter()
        .filter(|row| row.key().is_none())
        .map(|row| {
            let key = LeaseKey::new(stream, row.lease_key.as_str());
            // The position as the toolkit reads it, a partial aggregate beside the checkpoint
            // included.
            let parsed = row.state.position().transpose();
            let (position, note) = match parsed {
                None => (None, Some("no checkpoint in the row".to_owned())),
                Some(Ok(position)) => (Some(position), None),
                Some(Err(error)) => (None, Some(format!("unreadable checkpoint: {error}"))),
            };
            Step {
                source: row.lease_key.clone(),
                key,
                position,
                parents: row.state.parent_shards.clone(),
                note,
            }
        })
        .collect()
}

/// The plan of copying a KCL application's checkpoints from `kcl_table`. `stream` names the
/// stream of a single-stream application (whose keys are bare shard ids), or picks one stream
/// of a multi-stream one. With `kinesis`, a checkpoint at sub-sequence 0 is resolved against
/// the record in the stream.
///
/// # Errors
///
/// The KCL table could not be read, or its keys are bare shard ids and no stream is named.
///
/// ```no_run
/// # async fn run() -> Result<(), kinesis_checkpoint_cli::Error> {
/// let config = aws_config::load_from_env().await;
/// let dynamodb = aws_sdk_dynamodb::Client::new(&config);
/// let plan = kinesis_checkpoint_cli::import::kcl_plan(&dynamodb, "orders-kcl-app", Some("orders"), None).await?;
/// # Ok(())
/// # }
/// ```
pub async fn kcl_plan(
    dynamodb: &DynamoDb,
    kcl_table: &str,
    stream: Option<&str>,
    kinesis: Option<&Kinesis>,
) -> Result<Plan, Error> {
    let mut items = Vec::new();
    let mut start = None;
    let mut progress = Progress::new("KCL leases read");
    loop {
        let page = dynamodb
            .scan()
            .table_name(kcl_table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|error| {
                format!(
                    "DynamoDB Scan of the KCL lease table '{kcl_table}' failed: {}",
                    cause(&error)
                )
            })?;
        items.extend(page.items().iter().cloned());
        progress.set(items.len());
        start = page.last_evaluated_key;
        if start.as_ref().is_none_or(HashMap::is_empty) {
            break;
        }
    }
    progress.done();
    let mut plan = Vec::new();
    for item in &items {
        let string = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
        let Some(lease_key) = string("leaseKey") else {
            continue;
        };
        let (lease_stream, shard) = match lease_key.splitn(4, ':').collect::<Vec<_>>()[..] {
            [shard] => match stream {
                Some(stream) => (stream.to_owned(), shard.to_owned()),
                None => {
                    return Err(format!(
                        "the KCL table '{kcl_table}' is a single-stream application's (lease \
                         '{lease_key}' is a bare shard id): name its stream with --stream"
                    )
                    .into());
                }
            },
            [_account, name, _epoch, shard] => (name.to_owned(), shard.to_owned()),
            _ => {
                plan.push(skipped(
                    &lease_key,
                    stream.unwrap_or("?"),
                    &lease_key,
                    "a lease key of unknown form",
                ));
                continue;
            }
        };
        if stream.is_some_and(|s| s != lease_stream) {
            continue;
        }
        let key = LeaseKey::new(lease_stream.as_str(), shard.as_str());
        let parents = item
            .get("parentShardId")
            .and_then(|v| v.as_ss().ok())
            .cloned()
            .unwrap_or_default();
        let sub = item
            .get("checkpointSubSequenceNumber")
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<u64>().ok());
        let mut step = Step {
            source: lease_key.clone(),
            key,
            position: None,
            parents,
            note: None,
        };
        match string("checkpoint").as_deref() {
            None => step.note = Some("no checkpoint".to_owned()),
            Some(SHARD_END) => step.position = Some(Position::ShardEnd),
            Some(symbol @ ("TRIM_HORIZON" | "LATEST" | "AT_TIMESTAMP")) => {
                step.note = Some(format!(
                    "{symbol}: nothing processed yet; the mapping's starting position decides"
                ));
            }
            Some(sequence) => match sequence.parse() {
                Ok(sequence) => {
                    let (position, note) = resolve(kinesis, &step.key, sequence, sub).await;
                    step.position = Some(position);
                    step.note = note;
                }
                Err(error) => {
                    step.note = Some(format!("unreadable checkpoint '{sequence}': {error}"));
                }
            },
        }
        plan.push(step);
    }
    plan.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(plan)
}

fn skipped(source: &str, stream: &str, shard: &str, note: &str) -> Step {
    Step {
        source: source.to_owned(),
        key: LeaseKey::new(stream, shard),
        position: None,
        parents: Vec::new(),
        note: Some(note.to_owned()),
    }
}

/// The position of a KCL checkpoint `(sequence, sub)`: the whole record when it is a plain one
/// or the last user record of its aggregate, a position inside the aggregate otherwise.
async fn resolve(
    kinesis: Option<&Kinesis>,
    key: &LeaseKey,
    sequence: kinesis_checkpoint::SequenceNumber,
    sub: Option<u64>,
) -> (Position, Option<String>) {
    let Some(sub) = sub else {
        return (Position::record(sequence), None);
    };
    let Some(kinesis) = kinesis else {
        return (
            Position::sub_record(sequence, sub),
            Some("stream not read: if this is a plain record it runs once more".to_owned()),
        );
    };
    match user_records(kinesis, key, &sequence).await {
        Ok(Some(count)) if sub + 1 < count => (Position::sub_record(sequence, sub), None),
        Ok(_) => (Position::record(sequence), None),
        Err(error) => (
            Position::sub_record(sequence, sub),
            Some(format!(
                "{error}; if this is a plain record it runs once more"
            )),
        ),
    }
}

/// How many user records the record at `sequence` holds: `None` for a plain record.
async fn user_records(
    kinesis: &Kinesis,
    key: &LeaseKey,
    sequence: &kinesis_checkpoint::SequenceNumber,
) -> Result<Option<u64>, Error> {
    let failed = |what: &str, detail: String| -> Error {
        format!(
            "could not read record {sequence} of stream '{}', shard '{}' (Kinesis {what}: {detail})",
            key.stream(),
            key.shard()
        )
        .into()
    };
    let iterator = kinesis
        .get_shard_iterator()
        .stream_name(key.stream())
        .shard_id(key.shard())
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .starting_sequence_number(sequence.as_str())
        .send()
        .await
        .map_err(|e| failed("GetShardIterator", cause(&e)))?
        .shard_iterator
        .ok_or_else(|| failed("GetShardIterator", "no iterator".to_owned()))?;
    let page = kinesis
        .get_records()
        .shard_iterator(iterator)
        .limit(1)
        .send()
        .await
        .map_err(|e| failed("GetRecords", cause(&e)))?;
    let Some(found) = page
        .records()
        .first()
        .filter(|r| r.sequence_number() == sequence.as_str())
    else {
        return Err(failed(
            "GetRecords",
            "the record has expired from the stream".to_owned(),
        ));
    };
    let data = found.data().as_ref();
    if !kinesis_checkpoint::kpl::is_aggregate(data) {
        return Ok(None);
    }
    let record = Record::new(
        key.clone(),
        sequence.clone(),
        found.partition_key().unwrap_or_default(),
        data.to_vec(),
    );
    Ok(kinesis_checkpoint::kpl::deaggregate(record)
        .ok()
        .map(|records| u64::try_from(records.into_records().len()).unwrap_or(u64::MAX)))
}

/// Shows `plan`, asks (unless `yes`), and writes each checkpoint where the shard has none.
///
/// # Errors
///
/// The operator said no, or a write failed (the error names the shard; the steps before it
/// are done and a second run skips them).
///
/// ```no_run
/// # use kinesis_checkpoint::DynamoLeaseStore;
/// # async fn run() -> Result<(), kinesis_checkpoint_cli::Error> {
/// let store = DynamoLeaseStore::new(&aws_config::load_from_env().await, "orders-leases");
/// let rows = store.rows(|_| ()).await?;
/// let plan = kinesis_checkpoint_cli::import::legacy_plan(&rows, "orders");
/// kinesis_checkpoint_cli::import::apply(&store, &plan, true, &mut std::io::empty(), &mut std::io::stdout()).await?;
/// # Ok(())
/// # }
/// ```
pub async fn apply(
    store: &DynamoLeaseStore,
    plan: &[Step],
    yes: bool,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> Result<Imported, Error> {
    let mut imported = Imported::default();
    for step in plan {
        let what = step.position.as_ref().map_or_else(
            || "nothing to copy".to_owned(),
            |p| match p.sub_sequence() {
                Some(sub) => format!("checkpoint {} sub-record {sub}", p.checkpoint()),
                None => format!("checkpoint {}", p.checkpoint()),
            },
        );
        let note = step
            .note
            .as_ref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        writeln!(out, "{} -> {}: {what}{note}", step.source, step.key)?;
    }
    let todo: Vec<&Step> = plan.iter().filter(|s| s.position.is_some()).collect();
    imported.skipped = plan.len() - todo.len();
    if todo.is_empty() {
        writeln!(out, "nothing to import")?;
        return Ok(imported);
    }
    if !yes
        && !confirm(
            &format!(
                "Write {} checkpoints into table {}?",
                todo.len(),
                store.table()
            ),
            input,
            out,
        )?
    {
        return Err(crate::checkpoint::MoveError::NotConfirmed.into());
    }
    let mut progress = Progress::new("checkpoints imported");
    for (index, step) in todo.iter().enumerate() {
        progress.of(index, todo.len());
        let position = step.position.as_ref().expect("filtered");
        if store
            .import_checkpoint(&step.key, position, &step.parents)
            .await?
        {
            imported.copied += 1;
        } else {
            writeln!(out, "{}: kept, it already has a checkpoint", step.key)?;
            imported.kept += 1;
        }
    }
    progress.done();
    writeln!(
        out,
        "imported {} checkpoints; kept {} newer ones; {} rows had nothing to copy",
        imported.copied, imported.kept, imported.skipped
    )?;
    Ok(imported)
}
