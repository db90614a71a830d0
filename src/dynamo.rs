//! [`DynamoLeaseStore`]: leases and checkpoints in a `DynamoDB` table, shared by every
//! invocation of a function and by container consumers that use the seed crate's schema.
//!
//! Every mutation is one conditional `UpdateItem` that bumps `lease_counter`, so two owners can
//! never both believe they hold a shard, and a fenced owner's late write is refused. The
//! toolkit's two combined operations are one request each: taking the lease returns the row
//! (`ReturnValues = ALL_NEW`, and `ALL_OLD` on a failed condition, which names the holder), and
//! the final checkpoint releases the lease in the same write. A steady-state batch therefore
//! costs two requests whatever its size.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, ReturnValue, ReturnValuesOnConditionCheckFailure,
    TransactWriteItem, Update,
};

use crate::lease::{
    Below, BoxFuture, Claim, Commit, FailingChange, FailingRecord, KeyCommit, LeaseError, LeaseKey,
    LeaseState, LeaseStore, ReportedChange, RowForm, checkpoint_and_release_by_commit,
};
use crate::memory::{millis, now_millis};
use crate::sequence::Position;

mod admin;

pub use admin::{Moved, Row};

/// The table's partition key: `stream:shard`.
const KEY: &str = "lease_key";
const OWNER: &str = "lease_owner";
const EXPIRY: &str = "lease_expiry";
const COUNTER: &str = "lease_counter";
const CHECKPOINT: &str = "checkpoint";
const CHECKPOINT_SUB: &str = "checkpoint_sub";
const AGGREGATE_SEQUENCE: &str = "aggregate_sequence";
const AGGREGATE_SUB: &str = "aggregate_sub";
const PARENTS: &str = "parent_shards";
const FAILING: &str = "failing";
const EXPIRES_AT: &str = "expires_at";
const DONE_ABOVE: &str = "done_above";
const REPORTED: &str = "reported";
const CONTENDED: &str = "contended";

/// Taking a lease succeeds when it is free, already ours, or expired.
const TAKEABLE: &str =
    "attribute_not_exists(lease_owner) OR lease_owner = :me OR lease_expiry < :now";
/// Every other write needs the lease to be ours.
const OURS: &str = "lease_owner = :me";

/// A `DynamoDB`-backed lease store.
///
/// The table needs a string partition key named `lease_key`; create it with on-demand billing
/// and TTL on `expires_at` (the `template.yaml` of this repository does). One row holds one
/// shard of one stream, under `stream:shard`, so one table serves every stream.
///
/// # Rows from earlier versions
///
/// Earlier versions of the seed crate keyed a row by the bare shard id. Such a row does not say
/// which stream it belongs to, so it is read only for the stream named by
/// [`legacy_stream`](Self::legacy_stream): when a shard of that stream has no checkpoint under its
/// own key, the bare row's checkpoint is used and copied under the new key. Other streams ignore
/// bare rows. With no stream named, a shard whose bare row holds a checkpoint is refused with
/// [`UnattributedLegacyRow`], which names the table, the shard and the stream, until the operator
/// names the stream or deletes the row.
///
/// # Examples
///
/// ```no_run
/// use std::sync::Arc;
///
/// use kinesis_checkpoint::{DynamoLeaseStore, Outcome, Processor, Record};
///
/// # async fn run() -> Result<(), lambda_runtime::Error> {
/// let config = aws_config::load_from_env().await;
/// let leases = Arc::new(DynamoLeaseStore::new(&config, "orders-leases"));
/// let processor = Processor::new(leases, |_: Record| async { Outcome::ack() });
/// lambda_runtime::run(processor.service()).await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoLeaseStore {
    client: Client,
    table: String,
    legacy_stream: Option<String>,
    /// Requests sent, shared by clones: what [`LeaseStore::requests`] reports.
    sent: Arc<AtomicU64>,
}

/// A shard whose only progress is in a row keyed by its bare shard id, in a table that names no
/// stream for those rows.
///
/// Recover it from a [`LeaseError`] with `downcast_ref`:
///
/// ```
/// # use kinesis_checkpoint::{LeaseError, UnattributedLegacyRow};
/// fn is_legacy(error: &LeaseError) -> bool {
///     error.downcast_ref::<UnattributedLegacyRow>().is_some()
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "lease table '{table}' holds a checkpoint for shard '{shard}' under the bare shard id, the key \
     earlier versions wrote without the stream, so it may belong to another stream than \
     '{stream}'; name the stream those rows belong to with `DynamoLeaseStore::legacy_stream`, or \
     delete the row to start the shard without it"
)]
pub struct UnattributedLegacyRow {
    table: String,
    shard: String,
    stream: String,
}

/// A `DynamoDB` request that failed for another reason than its condition.
#[derive(Debug, thiserror::Error)]
#[error("DynamoDB {operation} on table '{table}' for '{key}' failed: {detail}")]
struct RequestFailed {
    operation: &'static str,
    table: String,
    key: String,
    detail: String,
}

impl DynamoLeaseStore {
    /// Uses `table` in the account, region and endpoint of `config` (`AWS_ENDPOINT_URL` points
    /// it at a local server).
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::DynamoLeaseStore;
    /// # async fn run() {
    /// let config = aws_config::load_from_env().await;
    /// let store = DynamoLeaseStore::new(&config, "orders-leases");
    /// # }
    /// ```
    #[must_use]
    pub fn new(config: &SdkConfig, table: impl Into<String>) -> Self {
        Self::from_client(Client::new(config), table)
    }

    /// Uses `table` through an existing client, for example one with its own retry settings.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::DynamoLeaseStore;
    /// # async fn run() {
    /// let config = aws_config::load_from_env().await;
    /// let client = aws_sdk_dynamodb::Client::new(&config);
    /// let store = DynamoLeaseStore::from_client(client, "orders-leases");
    /// # }
    /// ```
    #[must_use]
    pub fn from_client(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            legacy_stream: None,
            sent: Arc::default(),
        }
    }

    /// Names the stream the table's rows keyed by a bare shard id belong to: the rows an earlier
    /// version of the seed crate wrote, before a row was kept per stream and shard.
    ///
    /// A shard of `stream` with no checkpoint under its own key resumes from its bare row, and
    /// the first read copies that checkpoint under the new key. Other streams ignore bare rows.
    /// A table that served several streams before the upgrade holds, in each bare row, whichever
    /// stream checkpointed last: delete those rows instead.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::DynamoLeaseStore;
    /// # async fn run() {
    /// let config = aws_config::load_from_env().await;
    /// // The table was written by an earlier version for the `orders` stream only.
    /// let store = DynamoLeaseStore::new(&config, "orders-leases").legacy_stream("orders");
    /// # }
    /// ```
    #[must_use]
    pub fn legacy_stream(mut self, stream: impl Into<String>) -> Self {
        self.legacy_stream = Some(stream.into());
        self
    }

    /// The table this store writes.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::DynamoLeaseStore;
    /// # async fn run() {
    /// # let config = aws_config::load_from_env().await;
    /// assert_eq!(DynamoLeaseStore::new(&config, "leases").table(), "leases");
    /// # }
    /// ```
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Counts one request about to be sent, for [`LeaseStore::requests`].
    fn count_request(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        crate::metrics::count_request();
    }

    /// An `UpdateItem` on `key`'s row that bumps the fencing counter, as every write does.
    fn update(&self, key: &str) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(&self.table)
            .key(KEY, AttributeValue::S(key.to_owned()))
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
    }

    /// The conditional write that takes the lease of `row` for `owner`: free, ours, or expired.
    fn take(&self, row: &str, owner: &str, ttl: Duration) -> UpdateItemFluentBuilder {
        self.update(row)
            .update_expression(
                "SET lease_owner = :me, lease_expiry = :expiry ADD lease_counter :one",
            )
            .condition_expression(TAKEABLE)
            .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
            .expression_attribute_values(":expiry", expiry_after(ttl))
            .expression_attribute_values(":now", AttributeValue::N(now_millis().to_string()))
    }

    fn failed<E, R>(&self, operation: &'static str, key: &str, error: &SdkError<E, R>) -> LeaseError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug + 'static,
    {
        Box::new(RequestFailed {
            operation,
            table: self.table.clone(),
            key: key.to_owned(),
            detail: crate::aws_error::cause(error),
        })
    }

    /// Sends a conditional update: `true` when it was applied, `false` when its condition
    /// failed.
    async fn conditional(
        &self,
        operation: &'static str,
        key: &LeaseKey,
        request: UpdateItemFluentBuilder,
    ) -> Result<bool, LeaseError> {
        self.count_request();
        match request.send().await {
            Ok(_) => Ok(true),
            Err(error) if is_condition_failure(&error) => Ok(false),
            Err(error) => Err(self.failed(operation, &key.to_string(), &error)),
        }
    }

    /// The item under `key`, read consistently.
    async fn item(&self, key: &str) -> Result<Option<HashMap<String, AttributeValue>>, LeaseError> {
        self.count_request();
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(KEY, AttributeValue::S(key.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|error| self.failed("GetItem", key, &error))?;
        Ok(output.item)
    }

    /// Fills in the checkpoint of a shard that has none from its bare-shard-id row, by the rules
    /// of [`legacy_stream`](Self::legacy_stream).
    async fn with_legacy(&self, key: &LeaseKey, own: LeaseState) -> Result<LeaseState, LeaseError> {
        if own.checkpoint.is_some()
            || self
                .legacy_stream
                .as_deref()
                .is_some_and(|stream| stream != key.stream())
        {
            return Ok(own);
        }
        let bare = state_of(self.item(key.shard()).await?.as_ref());
        let Some(checkpoint) = bare.checkpoint else {
            return Ok(own);
        };
        if self.legacy_stream.is_none() {
            return Err(Box::new(UnattributedLegacyRow {
                table: self.table.clone(),
                shard: key.shard().to_owned(),
                stream: key.stream().to_owned(),
            }));
        }
        let mut adopt = self
            .update(&key.to_string())
            .condition_expression("attribute_not_exists(checkpoint)")
            .expression_attribute_values(":seq", AttributeValue::S(checkpoint.clone()));
        adopt = match bare.checkpoint_sub {
            Some(sub) => adopt
                .update_expression(
                    "SET checkpoint = :seq, checkpoint_sub = :sub ADD lease_counter :one",
                )
                .expression_attribute_values(":sub", AttributeValue::N(sub.to_string())),
            None => adopt.update_expression("SET checkpoint = :seq ADD lease_counter :one"),
        };
        if self
            .conditional("UpdateItem (adopt legacy row)", key, adopt)
            .await?
        {
            tracing::info!(
                table = self.table,
                shard = key.shard(),
                stream = key.stream(),
                checkpoint,
                "copied the bare shard id row's checkpoint under the stream's key"
            );
            return Ok(LeaseState {
                checkpoint: Some(checkpoint),
                checkpoint_sub: bare.checkpoint_sub,
                lease_counter: own.lease_counter + 1,
                ..own
            });
        }
        // Another owner saved progress under the stream's key meanwhile: that is newer.
        Ok(state_of(self.item(&key.to_string()).await?.as_ref()))
    }
}

/// The most items one `BatchGetItem` reads and one `TransactWriteItems` writes.
const MANY: usize = 100;

/// How often unprocessed keys of a `BatchGetItem` (throttling) are asked for again.
const UNPROCESSED_ROUNDS: u32 = 5;

impl DynamoLeaseStore {
    /// The transactional update of one partition key's row, on condition of its counter.
    fn key_update(&self, commit: &KeyCommit) -> Result<TransactWriteItem, LeaseError> {
        let mut clauses = Clauses::default();
        let mut values = HashMap::from([(":one".to_owned(), AttributeValue::N("1".to_owned()))]);
        if let Some(position) = &commit.checkpoint {
            for (name, value) in
                position_clauses(&mut clauses, &RowForm::new(position, &commit.below))
            {
                values.insert(name.to_owned(), value);
            }
        }
        match &commit.failing {
            FailingChange::Keep => {}
            FailingChange::Clear => clauses.remove.push(FAILING),
            FailingChange::Set(failing) => {
                clauses.set.push("failing = :failing");
                values.insert(":failing".to_owned(), failing_item(failing));
            }
        }
        if let Some(expires_at) = commit.expires_at {
            clauses.set.push("expires_at = :expires");
            values.insert(
                ":expires".to_owned(),
                AttributeValue::N(expires_at.to_string()),
            );
        }
        // Nobody wrote the row since it was read: every write bumps the counter.
        let condition = if commit.expected_counter == 0 {
            "attribute_not_exists(lease_counter)"
        } else {
            values.insert(
                ":expected".to_owned(),
                AttributeValue::N(commit.expected_counter.to_string()),
            );
            "lease_counter = :expected"
        };
        let update = Update::builder()
            .table_name(&self.table)
            .key(KEY, AttributeValue::S(commit.row.to_string()))
            .update_expression(clauses.expression())
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .build()
            .map_err(|error| -> LeaseError { Box::new(error) })?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Writes `indices` of `commits` in one transaction; a transaction cancelled because some
    /// rows' conditions failed is sent again without them. Marks what was written.
    async fn commit_chunk(
        &self,
        commits: &[KeyCommit],
        mut indices: Vec<usize>,
        written: &mut [bool],
    ) -> Result<(), LeaseError> {
        while !indices.is_empty() {
            let items = indices
                .iter()
                .map(|&index| self.key_update(&commits[index]))
                .collect::<Result<Vec<_>, _>>()?;
            let Err(error) = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items))
                .send()
                .await
            else {
                for index in indices {
                    written[index] = true;
                }
                return Ok(());
            };
            let first = commits[indices[0]].row.to_string();
            let Some(TransactWriteItemsError::TransactionCanceledException(canceled)) =
                error.as_service_error()
            else {
                return Err(self.failed("TransactWriteItems", &first, &error));
            };
            let reasons = canceled.cancellation_reasons();
            let before = indices.len();
            if reasons.len() == before {
                indices = indices
                    .into_iter()
                    .zip(reasons)
                    .filter(|(_, reason)| reason.code() != Some("ConditionalCheckFailed"))
                    .map(|(index, _)| index)
                    .collect();
            }
            if indices.len() == before {
                // Cancelled for another reason than a row written meanwhile (a conflict with
                // another transaction, throttling): nothing was written.
                return Err(self.failed("TransactWriteItems", &first, &error));
            }
        }
        Ok(())
    }
}

fn is_condition_failure<R>(error: &SdkError<UpdateItemError, R>) -> bool {
    error
        .as_service_error()
        .is_some_and(UpdateItemError::is_conditional_check_failed_exception)
}

/// The row's state; an absent row is the default state.
fn state_of(item: Option<&HashMap<String, AttributeValue>>) -> LeaseState {
    let mut state = LeaseState::default();
    let Some(item) = item else {
        return state;
    };
    let string = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
    let number = |name: &str| {
        item.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<u64>().ok())
    };
    state.checkpoint = string(CHECKPOINT);
    state.checkpoint_sub = number(CHECKPOINT_SUB);
    state.aggregate_sequence = string(AGGREGATE_SEQUENCE);
    state.aggregate_sub = number(AGGREGATE_SUB);
    state.lease_owner = string(OWNER);
    state.lease_expiry = number(EXPIRY);
    state.lease_counter = number(COUNTER).unwrap_or_default();
    state.parent_shards = item
        .get(PARENTS)
        .and_then(|v| v.as_ss().ok())
        .cloned()
        .unwrap_or_default();
    state.failing = item.get(FAILING).and_then(failing_of);
    state.expires_at = number(EXPIRES_AT);
    state.done_above = item
        .get(DONE_ABOVE)
        .and_then(|v| v.as_ss().ok())
        .map(|positions| positions_of(positions))
        .unwrap_or_default();
    state.reported = string(REPORTED).and_then(|member| positions_of(&[member]).pop());
    state.contended = string(CONTENDED).and_then(|member| positions_of(&[member]).pop());
    state
}

/// The positions of a `done_above` set (`sequence` or `sequence/sub`), in order. A member that
/// is not a position was not written by this toolkit: it is ignored, so at worst its record runs
/// again.
fn positions_of(members: &[String]) -> Vec<Position> {
    let mut positions: Vec<Position> = members
        .iter()
        .filter_map(|member| {
            let (sequence, sub) = match member.split_once('/') {
                Some((sequence, sub)) => (sequence, Some(sub.parse().ok()?)),
                None => (member.as_str(), None),
            };
            Position::from_checkpoint(sequence, sub).ok()
        })
        .collect();
    positions.sort();
    positions
}

/// The clauses of an `UpdateItem` being built: every write bumps the fencing counter.
#[derive(Default)]
struct Clauses {
    set: Vec<&'static str>,
    remove: Vec<&'static str>,
}

impl Clauses {
    fn expression(&self) -> String {
        let mut expression = String::new();
        if !self.set.is_empty() {
            expression.push_str("SET ");
            expression.push_str(&self.set.join(", "));
            expression.push(' ');
        }
        if !self.remove.is_empty() {
            expression.push_str("REMOVE ");
            expression.push_str(&self.remove.join(", "));
            expression.push(' ');
        }
        expression.push_str("ADD lease_counter :one");
        expression
    }
}

/// Adds the clauses that write `position` as the checkpoint, `below` naming the record
/// `checkpoint` holds when the position lies inside an aggregate.
fn set_position(
    mut request: UpdateItemFluentBuilder,
    clauses: &mut Clauses,
    position: &Position,
    below: &Below,
) -> UpdateItemFluentBuilder {
    for (name, value) in position_clauses(clauses, &RowForm::new(position, below)) {
        request = request.expression_attribute_values(name, value);
    }
    request
}

/// The clauses of `form`, and the values they name.
fn position_clauses(
    clauses: &mut Clauses,
    form: &RowForm<'_>,
) -> Vec<(&'static str, AttributeValue)> {
    let mut values = Vec::with_capacity(3);
    if let Some(checkpoint) = form.checkpoint {
        clauses.set.push("checkpoint = :seq");
        values.push((":seq", AttributeValue::S(checkpoint.to_owned())));
    }
    match form.aggregate {
        Some((sequence, sub)) => {
            clauses.set.extend([
                "aggregate_sequence = :aggregate",
                "aggregate_sub = :aggregate_sub",
            ]);
            values.push((":aggregate", AttributeValue::S(sequence.to_owned())));
            values.push((":aggregate_sub", AttributeValue::N(sub.to_string())));
        }
        None => clauses.remove.extend([AGGREGATE_SEQUENCE, AGGREGATE_SUB]),
    }
    match form.legacy_sub {
        Some(sub) => {
            clauses.set.push("checkpoint_sub = :sub");
            values.push((":sub", AttributeValue::N(sub.to_string())));
        }
        None => clauses.remove.push(CHECKPOINT_SUB),
    }
    values
}

/// Adds the clauses and values that apply `change` to the failing record.
fn set_failing(
    request: UpdateItemFluentBuilder,
    clauses: &mut Clauses,
    change: &FailingChange,
) -> UpdateItemFluentBuilder {
    match change {
        FailingChange::Keep => request,
        FailingChange::Clear => {
            clauses.remove.push(FAILING);
            request
        }
        FailingChange::Set(failing) => {
            clauses.set.push("failing = :failing");
            request.expression_attribute_values(":failing", failing_item(failing))
        }
    }
}

/// The `failing` map of a row.
fn failing_item(failing: &FailingRecord) -> AttributeValue {
    let mut map = HashMap::from([
        (
            "sequence".to_owned(),
            AttributeValue::S(failing.sequence.clone()),
        ),
        (
            "attempts".to_owned(),
            AttributeValue::N(failing.attempts.to_string()),
        ),
        (
            "last_error".to_owned(),
            AttributeValue::S(failing.last_error.clone()),
        ),
        (
            "first_failure".to_owned(),
            AttributeValue::N(failing.first_failure.to_string()),
        ),
        (
            "last_failure".to_owned(),
            AttributeValue::N(failing.last_failure.to_string()),
        ),
    ]);
    if let Some(sub) = failing.sub_sequence {
        map.insert(
            "sub_sequence".to_owned(),
            AttributeValue::N(sub.to_string()),
        );
    }
    AttributeValue::M(map)
}

/// The failing record a row's `failing` map holds, if it is readable.
fn failing_of(value: &AttributeValue) -> Option<FailingRecord> {
    let map = value.as_m().ok()?;
    let string = |name: &str| map.get(name).and_then(|v| v.as_s().ok()).cloned();
    let number = |name: &str| {
        map.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<u64>().ok())
    };
    let position = Position::from_checkpoint(&string("sequence")?, number("sub_sequence")).ok()?;
    let mut failing = FailingRecord::first(&position, &string("last_error").unwrap_or_default(), 0);
    failing.attempts = u32::try_from(number("attempts")?).unwrap_or(u32::MAX);
    failing.first_failure = number("first_failure").unwrap_or_default();
    failing.last_failure = number("last_failure").unwrap_or_default();
    Some(failing)
}

fn expiry_after(ttl: Duration) -> AttributeValue {
    AttributeValue::N(now_millis().saturating_add(millis(ttl)).to_string())
}

impl LeaseStore for DynamoLeaseStore {
    fn acquire<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let request = self.take(&key.to_string(), owner, ttl);
            self.conditional("UpdateItem (acquire)", key, request).await
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let request = self
                .update(&key.to_string())
                .update_expression("SET lease_expiry = :expiry ADD lease_counter :one")
                .condition_expression(OURS)
                .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
                .expression_attribute_values(":expiry", expiry_after(ttl));
            self.conditional("UpdateItem (renew)", key, request).await
        })
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let request = self
                .update(&key.to_string())
                .update_expression(
                    "SET checkpoint = :seq REMOVE checkpoint_sub, aggregate_sequence, \
                     aggregate_sub ADD lease_counter :one",
                )
                .condition_expression(OURS)
                .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
                .expression_attribute_values(":seq", AttributeValue::S(sequence.to_owned()));
            self.conditional("UpdateItem (checkpoint)", key, request)
                .await
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        Box::pin(async move {
            let own = state_of(self.item(&key.to_string()).await?.as_ref());
            self.with_legacy(key, own).await
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            let request = self
                .update(&key.to_string())
                .update_expression("REMOVE lease_owner, lease_expiry ADD lease_counter :one")
                .condition_expression(OURS)
                .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()));
            // Already taken by another owner: there is nothing of ours to release.
            self.conditional("UpdateItem (release)", key, request)
                .await
                .map(drop)
        })
    }

    fn acquire_and_read<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
        attempting: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<Claim, LeaseError>> {
        Box::pin(async move {
            let row = key.to_string();
            self.count_request();
            let mut request = self.take(&row, owner, ttl);
            if let Some(attempting) = attempting {
                request = request
                    .update_expression(
                        "SET lease_owner = :me, lease_expiry = :expiry, \
                         reported = if_not_exists(reported, :attempting) ADD lease_counter :one",
                    )
                    .expression_attribute_values(
                        ":attempting",
                        AttributeValue::S(attempting.to_string()),
                    );
            }
            let outcome = request
                .return_values(ReturnValue::AllNew)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            match outcome {
                Ok(output) => {
                    let own = state_of(output.attributes.as_ref());
                    Ok(Claim::Acquired(self.with_legacy(key, own).await?))
                }
                Err(error) if is_condition_failure(&error) => {
                    let holder = error.as_service_error().and_then(|service| match service {
                        UpdateItemError::ConditionalCheckFailedException(failed) => {
                            failed.item.as_ref()
                        }
                        _ => None,
                    });
                    Ok(Claim::Held(state_of(holder)))
                }
                Err(error) => Err(self.failed("UpdateItem (acquire and read)", &row, &error)),
            }
        })
    }

    fn checkpoint_position<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: &'a Position,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let write = |below: &Below| {
                let mut clauses = Clauses::default();
                set_position(self.update(&key.to_string()), &mut clauses, position, below)
                    .update_expression(clauses.expression())
                    .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
            };
            let Position::Record {
                sequence,
                sub_sequence: Some(_),
            } = position
            else {
                let request = write(&Below::Keep).condition_expression(OURS);
                return self
                    .conditional("UpdateItem (checkpoint)", key, request)
                    .await;
            };
            // Inside an aggregate, `checkpoint` stays; unless the row is of the 0.1.0 form at
            // this very aggregate, which keeps its form (see `Below::Legacy`).
            let request = write(&Below::Keep)
                .condition_expression(
                    "lease_owner = :me AND NOT (checkpoint = :inside AND attribute_exists(checkpoint_sub))",
                )
                .expression_attribute_values(":inside", AttributeValue::S(sequence.to_string()));
            if self
                .conditional("UpdateItem (checkpoint)", key, request)
                .await?
            {
                return Ok(true);
            }
            let request = write(&Below::Legacy).condition_expression(OURS);
            self.conditional("UpdateItem (checkpoint, 0.1.0 form)", key, request)
                .await
        })
    }

    fn checkpoint_and_release<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        position: Option<&'a Position>,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        checkpoint_and_release_by_commit(self, key, owner, position)
    }

    fn finish<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: Option<&'a str>,
        expires_at: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let mut clauses = Clauses::default();
            let request = set_position(
                self.update(&key.to_string()),
                &mut clauses,
                &Position::ShardEnd,
                &Below::Keep,
            );
            clauses.set.push("expires_at = :expires");
            let request = request
                .update_expression(clauses.expression())
                .expression_attribute_values(":expires", AttributeValue::N(expires_at.to_string()));
            // Only if nobody moved the checkpoint since the gate read it, and nothing is left
            // undone at it: no partial aggregate, no failing record above it. Both are stale
            // (and ignored) at or below `checkpoint`, which another writer may have moved past
            // them; sequence numbers compare by length, then as text.
            let request = match expected {
                Some(expected) => request
                    .condition_expression(
                        "checkpoint = :expected AND attribute_not_exists(checkpoint_sub) \
                         AND (attribute_not_exists(aggregate_sequence) \
                              OR size(aggregate_sequence) < :length \
                              OR (size(aggregate_sequence) = :length AND aggregate_sequence <= :expected)) \
                         AND (attribute_not_exists(failing) \
                              OR size(failing.#sequence) < :length \
                              OR (size(failing.#sequence) = :length AND failing.#sequence <= :expected))",
                    )
                    .expression_attribute_names("#sequence", "sequence")
                    .expression_attribute_values(
                        ":expected",
                        AttributeValue::S(expected.to_owned()),
                    )
                    .expression_attribute_values(
                        ":length",
                        AttributeValue::N(expected.len().to_string()),
                    ),
                None => request.condition_expression(
                    "attribute_not_exists(checkpoint) AND attribute_not_exists(aggregate_sequence) \
                     AND attribute_not_exists(failing)",
                ),
            };
            self.conditional("UpdateItem (finish shard)", key, request)
                .await
        })
    }

    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let mut clauses = Clauses::default();
            let mut request = self.update(&key.to_string());
            if let Some(position) = &commit.checkpoint {
                request = set_position(request, &mut clauses, position, &commit.below);
            }
            request = set_failing(request, &mut clauses, &commit.failing);
            if !commit.parent_shards.is_empty() {
                clauses.set.push("parent_shards = :parents");
                request = request.expression_attribute_values(
                    ":parents",
                    AttributeValue::Ss(commit.parent_shards.clone()),
                );
            }
            match commit.done_above.as_deref() {
                None => {}
                // A string set cannot be empty: an empty one is removed.
                Some([]) => clauses.remove.push(DONE_ABOVE),
                Some(done_above) => {
                    clauses.set.push("done_above = :done_above");
                    request = request.expression_attribute_values(
                        ":done_above",
                        AttributeValue::Ss(done_above.iter().map(ToString::to_string).collect()),
                    );
                }
            }
            match &commit.reported {
                ReportedChange::Keep => {}
                ReportedChange::Clear => clauses.remove.push(REPORTED),
                ReportedChange::Set(position) => {
                    clauses.set.push("reported = :reported");
                    request = request.expression_attribute_values(
                        ":reported",
                        AttributeValue::S(position.to_string()),
                    );
                }
            }
            clauses.remove.extend([OWNER, EXPIRY]);
            let request = request
                .update_expression(clauses.expression())
                .condition_expression(OURS)
                .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()));
            self.conditional("UpdateItem (checkpoint and release)", key, request)
                .await
        })
    }

    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>> {
        Box::pin(async move {
            let mut found: HashMap<String, HashMap<String, AttributeValue>> = HashMap::new();
            for chunk in keys.chunks(MANY) {
                let mut wanted = KeysAndAttributes::builder()
                    .set_keys(Some(
                        chunk
                            .iter()
                            .map(|key| {
                                HashMap::from([(
                                    KEY.to_owned(),
                                    AttributeValue::S(key.to_string()),
                                )])
                            })
                            .collect(),
                    ))
                    .consistent_read(true)
                    .build()
                    .map_err(|error| -> LeaseError { Box::new(error) })?;
                for round in 0.. {
                    let first = chunk[0].to_string();
                    let output = self
                        .client
                        .batch_get_item()
                        .request_items(&self.table, wanted)
                        .send()
                        .await
                        .map_err(|error| self.failed("BatchGetItem", &first, &error))?;
                    for item in output
                        .responses
                        .and_then(|mut responses| responses.remove(&self.table))
                        .unwrap_or_default()
                    {
                        if let Some(AttributeValue::S(key)) = item.get(KEY) {
                            found.insert(key.clone(), item);
                        }
                    }
                    match output
                        .unprocessed_keys
                        .and_then(|mut unprocessed| unprocessed.remove(&self.table))
                    {
                        Some(rest) if !rest.keys().is_empty() => {
                            if round >= UNPROCESSED_ROUNDS {
                                return Err(format!(
                                    "DynamoDB BatchGetItem on table '{}' left {} keys unread after {UNPROCESSED_ROUNDS} rounds (throttled)",
                                    self.table,
                                    rest.keys().len()
                                )
                                .into());
                            }
                            tokio::time::sleep(Duration::from_millis(50 << round)).await;
                            wanted = rest;
                        }
                        _ => break,
                    }
                }
            }
            Ok(keys
                .iter()
                .map(|key| state_of(found.get(&key.to_string())))
                .collect())
        })
    }

    fn commit_rows<'a>(
        &'a self,
        commits: &'a [KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>> {
        Box::pin(async move {
            let mut written = vec![false; commits.len()];
            for start in (0..commits.len()).step_by(MANY) {
                let indices = (start..commits.len().min(start + MANY)).collect();
                self.commit_chunk(commits, indices, &mut written).await?;
            }
            Ok(written)
        })
    }

    fn requests(&self) -> Option<u64> {
        Some(self.sent.load(Ordering::Relaxed))
    }

    fn mark_contended<'a>(
        &'a self,
        key: &'a LeaseKey,
        first: &'a Position,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            let row = key.to_string();
            self.count_request();
            self.update(&row)
                .update_expression("SET contended = :first ADD lease_counter :one")
                .expression_attribute_values(":first", AttributeValue::S(first.to_string()))
                .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
                .send()
                .await
                .map_err(|error| self.failed("UpdateItem (mark contended)", &row, &error))?;
            Ok(())
        })
    }
}
