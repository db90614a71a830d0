//! `kinesis-checkpoint status`: one line per shard of the lease table, with who holds it, where
//! its checkpoint is, what keeps failing, and, when the stream can be read, how far behind the
//! checkpoint is.
//!
//! The partition-key mode keeps a row per partition key (`stream:shard:key`): a shard's key
//! rows are counted on its line, with the keys that keep failing. Rows an earlier version kept
//! for its reading in parts (`stream:shard#...`) are not shown (no shard id holds a `:` or a
//! `#`, so the key says which is which).
//!
//! The lag is measured, not estimated: the records after the checkpoint are read from the
//! stream (up to [`MAX_COUNTED`]) and the oldest one's arrival time gives the age of the work
//! waiting, which is what `IteratorAge` would show for this shard.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_kinesis::Client as Kinesis;
use aws_sdk_kinesis::types::ShardIteratorType;
use kinesis_checkpoint::aws_error::cause;
use kinesis_checkpoint::sequence::SHARD_END;
use kinesis_checkpoint::store::LeaseState;
use kinesis_checkpoint::store::dynamo::Row;
use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position};
use serde::Serialize;

use crate::Error;
use crate::console::Progress;

/// Records counted after a checkpoint before the count stops (shown as `N+`).
pub const MAX_COUNTED: usize = 10_000;

/// Pages of `GetRecords` read per shard at most: Kinesis may answer empty pages before the
/// records, and a status must not read a whole stream.
const MAX_PAGES: usize = 20;

/// One shard as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ShardStatus {
    /// The row's key: `stream:shard`, or a bare shard id in a row of an earlier version.
    pub lease_key: String,
    /// The stream, when the key names it.
    pub stream: Option<String>,
    /// The shard id.
    pub shard: String,
    /// Who holds the lease.
    pub owner: Option<String>,
    /// When the lease lapses (epoch milliseconds).
    pub lease_expiry: Option<u64>,
    /// Whether the lease is held now.
    pub lease_live: bool,
    /// The checkpoint: the last sequence number done whole, `SHARD_END`, or none.
    pub checkpoint: Option<String>,
    /// The KPL aggregate in progress after the checkpoint (the row's `aggregate_sequence`
    /// while it lies above `checkpoint`).
    pub aggregate_sequence: Option<String>,
    /// The last sub-record of that aggregate done.
    pub checkpoint_sub: Option<u64>,
    /// Whether the shard is finished (`SHARD_END`): its children may run.
    pub finished: bool,
    /// The shard's parents.
    pub parents: Vec<String>,
    /// The record that keeps failing.
    pub failing: Option<Failing>,
    /// How far behind the checkpoint is, when the stream was read (not for a shard run in the
    /// partition-key mode: each key has its own checkpoint).
    pub behind: Option<Behind>,
    /// The rows of the shard's partition keys (the partition-key mode).
    pub partition_keys: usize,
    /// The partition keys whose record keeps failing, in key order.
    pub failing_keys: Vec<FailingKey>,
    /// Anything else the operator should know about this line.
    pub note: Option<String>,
}

/// The record a shard keeps failing on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failing {
    /// Its sequence number.
    pub sequence: String,
    /// Its sub-sequence in a KPL aggregate.
    pub sub_sequence: Option<u64>,
    /// Failed attempts so far.
    pub attempts: u32,
    /// The last error.
    pub last_error: String,
}

/// A partition key of a shard run in the partition-key mode whose record keeps failing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailingKey {
    /// The partition key.
    pub partition_key: String,
    /// Its failing record.
    pub failing: Failing,
}

/// What a row of the lease table is, by its key.
#[derive(Debug, PartialEq, Eq)]
enum RowKind<'a> {
    /// A shard's own row (or a bare shard id of an earlier version).
    Shard,
    /// A partition key's row, on the shard `stream:shard`.
    Key {
        shard: String,
        partition_key: &'a str,
    },
    /// A row an earlier version kept for a reading in parts (`stream:shard#...`).
    Obsolete,
}

impl<'a> RowKind<'a> {
    /// `stream:shard`, `stream:shard:key` or `stream:shard#...`: a shard id holds neither a `:`
    /// nor a `#`; a stream name holds neither, but a `DynamoDB` stream's ARN holds colons.
    fn of(lease_key: &'a str) -> Self {
        let Some(key) = LeaseKey::parse(lease_key) else {
            return Self::Shard;
        };
        let rest = key.shard();
        let lane = rest.find('#');
        let colon = rest.find(':');
        let partition_key = &lease_key[lease_key.len() - rest.len()..];
        match (lane, colon) {
            (Some(lane), colon) if colon.is_none_or(|colon| lane < colon) => Self::Obsolete,
            (_, Some(colon)) => Self::Key {
                shard: format!("{}:{}", key.stream(), &rest[..colon]),
                partition_key: &partition_key[colon + 1..],
            },
            _ => Self::Shard,
        }
    }
}

/// The work waiting after a shard's checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Behind {
    /// Records after the checkpoint, counted up to [`MAX_COUNTED`].
    pub records: usize,
    /// Whether the count stopped at the limit (there are more).
    pub more: bool,
    /// The age of the oldest record waiting, in milliseconds.
    pub oldest_age_ms: Option<u64>,
}

impl ShardStatus {
    fn of(lease_key: &str, state: &LeaseState, now_ms: u64) -> Self {
        // An unreadable aggregate is shown as no aggregate; the checkpoint is shown as stored.
        let partial = state.partial_aggregate().ok().flatten();
        let (stream, shard) = match LeaseKey::parse(lease_key) {
            Some(key) => (Some(key.stream().to_owned()), key.shard().to_owned()),
            None => (None, lease_key.to_owned()),
        };
        Self {
            lease_key: lease_key.to_owned(),
            note: stream
                .is_none()
                .then(|| "bare shard id row of an earlier version: see import-legacy".to_owned()),
            stream,
            shard,
            owner: state.lease_owner.clone(),
            lease_expiry: state.lease_expiry,
            lease_live: state.lease_owner.is_some()
                && state.lease_expiry.is_some_and(|expiry| expiry >= now_ms),
            checkpoint: state.checkpoint.clone(),
            aggregate_sequence: partial.as_ref().map(|p| p.checkpoint().to_owned()),
            checkpoint_sub: partial.as_ref().and_then(Position::sub_sequence),
            finished: state.checkpoint.as_deref() == Some(SHARD_END),
            parents: state.parent_shards.clone(),
            failing: state.failing.as_ref().map(Failing::of),
            behind: None,
            partition_keys: 0,
            failing_keys: Vec::new(),
        }
    }
}

impl Failing {
    fn of(failing: &kinesis_checkpoint::store::FailingRecord) -> Self {
        Self {
            sequence: failing.sequence.clone(),
            sub_sequence: failing.sub_sequence,
            attempts: failing.attempts,
            last_error: failing.last_error.clone(),
        }
    }
}

/// The shards' statuses of `rows`: shard rows as they are, partition keys' rows counted on their
/// shard's line (a line of its own when the shard has no row), obsolete rows left out.
fn shard_statuses(rows: &[Row], now: u64) -> Vec<ShardStatus> {
    let mut shards: BTreeMap<String, ShardStatus> = BTreeMap::new();
    let mut keys: Vec<(String, &str, &LeaseState)> = Vec::new();
    for row in rows {
        match RowKind::of(&row.lease_key) {
            RowKind::Shard => {
                shards.insert(
                    row.lease_key.clone(),
                    ShardStatus::of(&row.lease_key, &row.state, now),
                );
            }
            RowKind::Key {
                shard,
                partition_key,
            } => keys.push((shard, partition_key, &row.state)),
            RowKind::Obsolete => {}
        }
    }
    keys.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    for (shard, partition_key, state) in keys {
        let status = shards.entry(shard.clone()).or_insert_with(|| {
            let mut status = ShardStatus::of(&shard, &LeaseState::default(), now);
            status.note = Some("partition-key mode: no row of the shard itself".to_owned());
            status
        });
        status.partition_keys += 1;
        if let Some(failing) = &state.failing {
            status.failing_keys.push(FailingKey {
                partition_key: partition_key.to_owned(),
                failing: Failing::of(failing),
            });
        }
    }
    shards.into_values().collect()
}

/// The status of every shard in the table (of `stream` only, when named), with the lag read
/// from Kinesis when `kinesis` is given. With a stream named, its shards that have no row yet
/// are listed too.
///
/// # Errors
///
/// The table could not be read. A stream that cannot be read leaves the lag out and says why
/// in each line's note.
///
/// ```no_run
/// # async fn run() -> Result<(), kinesis_checkpoint_cli::Error> {
/// let config = aws_config::load_from_env().await;
/// let store = kinesis_checkpoint::DynamoLeaseStore::new(&config, "orders-leases");
/// let kinesis = aws_sdk_kinesis::Client::new(&config);
/// let shards = kinesis_checkpoint_cli::status::collect(&store, Some(&kinesis), Some("orders")).await?;
/// print!("{}", kinesis_checkpoint_cli::status::table(&shards));
/// # Ok(())
/// # }
/// ```
pub async fn collect(
    store: &DynamoLeaseStore,
    kinesis: Option<&Kinesis>,
    stream: Option<&str>,
) -> Result<Vec<ShardStatus>, Error> {
    let now = now_ms();
    let mut progress = Progress::new("rows read");
    let rows: Vec<Row> = store.rows(|read| progress.set(read)).await?;
    progress.done();
    let mut shards: Vec<ShardStatus> = shard_statuses(&rows, now)
        .into_iter()
        .filter(|status| stream.is_none_or(|s| status.stream.as_deref() == Some(s)))
        .collect();
    let Some(kinesis) = kinesis else {
        return Ok(shards);
    };
    let streams: BTreeSet<String> = shards
        .iter()
        .filter_map(|s| s.stream.clone())
        .chain(stream.map(str::to_owned))
        .collect();
    let mut unreachable = BTreeMap::new();
    for name in &streams {
        match list_shards(kinesis, name).await {
            Ok(ids) if stream == Some(name.as_str()) => {
                for id in ids {
                    if !shards
                        .iter()
                        .any(|s| s.shard == id && s.stream.as_deref() == Some(name))
                    {
                        let mut status = ShardStatus::of(
                            &LeaseKey::new(name.as_str(), id).to_string(),
                            &LeaseState::default(),
                            now,
                        );
                        status.note = Some("no row yet: no batch of this shard has run".to_owned());
                        shards.push(status);
                    }
                }
            }
            Ok(_) => {}
            Err(error) => {
                unreachable.insert(name.clone(), error.to_string());
            }
        }
    }
    shards.sort_by(|a, b| a.lease_key.cmp(&b.lease_key));
    let mut progress = Progress::new("shards measured");
    let total = shards.len();
    for (index, status) in shards.iter_mut().enumerate() {
        progress.of(index, total);
        let Some(name) = status.stream.clone() else {
            continue;
        };
        if let Some(error) = unreachable.get(&name) {
            status.note = Some(format!("lag unknown: {error}"));
            continue;
        }
        if status.finished || status.partition_keys > 0 {
            continue;
        }
        match behind(kinesis, &name, status, now).await {
            Ok(behind) => status.behind = Some(behind),
            Err(error) => status.note = Some(format!("lag unknown: {error}")),
        }
    }
    progress.done();
    Ok(shards)
}

async fn list_shards(kinesis: &Kinesis, stream: &str) -> Result<Vec<String>, Error> {
    let mut ids = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let request = match &token {
            Some(token) => kinesis.list_shards().next_token(token),
            None => kinesis.list_shards().stream_name(stream),
        };
        let page = request.send().await.map_err(|error| {
            format!(
                "Kinesis ListShards on stream '{stream}' failed: {}",
                cause(&error)
            )
        })?;
        ids.extend(page.shards().iter().map(|s| s.shard_id().to_owned()));
        token = page.next_token;
        if token.is_none() {
            return Ok(ids);
        }
    }
}

/// Reads the records after the shard's checkpoint: how many, and how old the first is.
async fn behind(
    kinesis: &Kinesis,
    stream: &str,
    status: &ShardStatus,
    now: u64,
) -> Result<Behind, Error> {
    let request = kinesis
        .get_shard_iterator()
        .stream_name(stream)
        .shard_id(&status.shard);
    // A checkpoint inside an aggregate leaves part of that record to do: count from it.
    let request = match (&status.aggregate_sequence, &status.checkpoint) {
        (Some(sequence), _) => request
            .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
            .starting_sequence_number(sequence),
        (None, Some(sequence)) => request
            .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
            .starting_sequence_number(sequence),
        (None, None) => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
    };
    let failed = |what: &str, detail: String| -> Error {
        format!(
            "Kinesis {what} on stream '{stream}', shard '{}' failed: {detail}",
            status.shard
        )
        .into()
    };
    let mut iterator = request
        .send()
        .await
        .map_err(|e| failed("GetShardIterator", cause(&e)))?
        .shard_iterator;
    let mut behind = Behind {
        records: 0,
        more: false,
        oldest_age_ms: None,
    };
    for _ in 0..MAX_PAGES {
        let Some(current) = iterator.take() else {
            break;
        };
        let page = kinesis
            .get_records()
            .shard_iterator(current)
            .limit(i32::try_from(MAX_COUNTED - behind.records).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(|e| failed("GetRecords", cause(&e)))?;
        if behind.oldest_age_ms.is_none()
            && let Some(first) = page.records().first()
            && let Some(arrival) = first.approximate_arrival_timestamp()
        {
            let arrival_ms = u64::try_from(arrival.to_millis().unwrap_or_default()).unwrap_or(0);
            behind.oldest_age_ms = Some(now.saturating_sub(arrival_ms));
        }
        behind.records += page.records().len();
        if behind.records >= MAX_COUNTED {
            behind.more = true;
            break;
        }
        // Kinesis may answer empty pages mid-shard; it says so by a lag above zero.
        let caught_up =
            page.records().is_empty() && page.millis_behind_latest().is_none_or(|lag| lag == 0);
        iterator = page.next_shard_iterator;
        if caught_up {
            break;
        }
    }
    Ok(behind)
}

/// The statuses as a table for people: one line per shard.
///
/// ```
/// let table = kinesis_checkpoint_cli::status::table(&[]);
/// assert!(table.starts_with("SHARD"));
/// ```
#[must_use]
pub fn table(shards: &[ShardStatus]) -> String {
    let now = now_ms();
    let header = [
        "SHARD",
        "OWNER",
        "LEASE",
        "CHECKPOINT",
        "PARENTS",
        "FAILING",
        "BEHIND",
        "NOTE",
    ];
    let mut lines: Vec<[String; 8]> = vec![header.map(str::to_owned)];
    for shard in shards {
        let lease = match (shard.owner.is_some(), shard.lease_expiry) {
            (false, _) => "free".to_owned(),
            (true, Some(expiry)) if expiry >= now => {
                format!("live {}s", (expiry - now).div_ceil(1_000))
            }
            (true, _) => "expired".to_owned(),
        };
        let checkpoint = match (
            &shard.checkpoint,
            &shard.aggregate_sequence,
            shard.checkpoint_sub,
        ) {
            (Some(c), _, _) if shard.finished => format!("{c} (finished)"),
            (_, Some(aggregate), Some(sub)) => format!("{aggregate}/{sub}"),
            (None, _, _) if shard.partition_keys > 0 => {
                format!("per key ({} keys)", shard.partition_keys)
            }
            (None, _, _) => "-".to_owned(),
            (Some(c), _, _) => c.clone(),
        };
        let failing = match (&shard.failing, shard.failing_keys.as_slice()) {
            (Some(failing), _) => failing_cell(failing),
            (None, [first, rest @ ..]) => {
                let more = if rest.is_empty() {
                    String::new()
                } else {
                    format!(" (+{} keys)", rest.len())
                };
                format!(
                    "key {}: {}{more}",
                    first.partition_key,
                    failing_cell(&first.failing)
                )
            }
            (None, []) => "-".to_owned(),
        };
        let behind = shard.behind.as_ref().map_or("-".to_owned(), |b| {
            let mut text = format!("{}{} records", b.records, if b.more { "+" } else { "" });
            if let Some(age) = b.oldest_age_ms {
                let _ = write!(text, ", oldest {}s", age / 1_000);
            }
            text
        });
        lines.push([
            shard.lease_key.clone(),
            shard.owner.clone().unwrap_or_else(|| "-".to_owned()),
            lease,
            checkpoint,
            if shard.parents.is_empty() {
                "-".to_owned()
            } else {
                shard.parents.join(",")
            },
            failing,
            behind,
            shard.note.clone().unwrap_or_default(),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|column| {
            lines
                .iter()
                .map(|line| line[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &lines {
        let mut text = String::new();
        for (column, cell) in line.iter().enumerate() {
            let _ = write!(text, "{cell:<width$}  ", width = widths[column]);
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

fn failing_cell(failing: &Failing) -> String {
    let sub = failing
        .sub_sequence
        .map(|s| format!("/{s}"))
        .unwrap_or_default();
    format!(
        "{}{sub} x{}: {}",
        failing.sequence,
        failing.attempts,
        one_line(&failing.last_error, 60)
    )
}

fn one_line(text: &str, max: usize) -> String {
    let flat = text.replace(['\n', '\r'], " ");
    match flat.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &flat[..end]),
        None => flat,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::RowKind;

    #[test]
    fn a_rows_key_says_whether_it_is_a_shards_a_partition_keys_or_a_lanes() {
        assert_eq!(RowKind::of("orders:shardId-000000000000"), RowKind::Shard);
        assert_eq!(RowKind::of("shardId-000000000000"), RowKind::Shard);
        assert_eq!(
            RowKind::of("orders:shardId-000000000000:customer:42"),
            RowKind::Key {
                shard: "orders:shardId-000000000000".to_owned(),
                partition_key: "customer:42",
            }
        );
        assert_eq!(
            RowKind::of("orders:shardId-000000000000:a#b"),
            RowKind::Key {
                shard: "orders:shardId-000000000000".to_owned(),
                partition_key: "a#b",
            }
        );
        assert_eq!(
            RowKind::of("orders:shardId-000000000000#lane:4959/2"),
            RowKind::Obsolete
        );
        assert_eq!(
            RowKind::of("orders:shardId-000000000000#scan"),
            RowKind::Obsolete
        );
    }
}
