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
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::clock::{self, Clock};
use crate::key::LeaseKey;
use crate::lazy_client::LazyClient;
use crate::store::memory::millis;
use crate::store::{LeaseError, LeaseState};

mod admin;
mod checkpoints;
mod conversion;
mod expressions;
mod lease;
mod rows;
mod schema;
mod transact;

use conversion::state_of;
use expressions::{expiry_at, is_condition_failure};
use schema::{KEY, TAKEABLE};

pub use admin::{Moved, Row};

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
    /// Built on the first request (see `lazy_client`).
    client: LazyClient<Client>,
    table: String,
    legacy_stream: Option<String>,
    /// Requests sent, shared by clones: what [`CheckpointStore::requests`](crate::store::CheckpointStore::requests) reports.
    sent: Arc<AtomicU64>,
    /// What the lease expiries written and the `:now` of the conditions are read from.
    clock: Arc<dyn Clock>,
}

/// A shard whose only progress is in a row keyed by its bare shard id, in a table that names no
/// stream for those rows.
///
/// Recover it from a [`LeaseError`] with `downcast_ref`:
///
/// ```
/// # use kinesis_checkpoint::store::LeaseError;
/// # use kinesis_checkpoint::store::dynamo::UnattributedLegacyRow;
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
        Self::with(LazyClient::new(config, Client::new), table)
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
        Self::with(LazyClient::ready(client), table)
    }

    fn with(client: LazyClient<Client>, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            legacy_stream: None,
            sent: Arc::default(),
            clock: clock::system(),
        }
    }

    /// Reads the time its lease expiries and conditions use (`now` plus the TTL; a lease
    /// expired before `now`) from `clock` (default [`SystemClock`](crate::clock::SystemClock)).
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use kinesis_checkpoint::DynamoLeaseStore;
    /// use kinesis_checkpoint::clock::SystemClock;
    /// # async fn run() {
    /// let config = aws_config::load_from_env().await;
    /// let store = DynamoLeaseStore::new(&config, "orders-leases").clock(Arc::new(SystemClock));
    /// # }
    /// ```
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The lease expiry for a lease taken or renewed now for `ttl`.
    pub(super) fn expiry_after(&self, ttl: Duration) -> AttributeValue {
        expiry_at(self.clock.now_millis(), ttl)
    }

    /// The clock's time now, as the `:now` of a condition.
    pub(super) fn now_value(&self) -> AttributeValue {
        AttributeValue::N(self.clock.now_millis().to_string())
    }

    /// Waits `duration` on the store's clock (a back-off).
    pub(super) async fn pause(&self, duration: Duration) {
        self.clock.sleep(duration).await;
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

    /// Counts one request about to be sent, for [`CheckpointStore::requests`](crate::store::CheckpointStore::requests).
    fn count_request(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
        crate::store::metered::count_request();
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
        self.take_until(
            row,
            owner,
            self.clock.now_millis().saturating_add(millis(ttl)),
        )
    }

    /// [`take`](Self::take), the lease lapsing at `expiry` (epoch milliseconds).
    fn take_until(&self, row: &str, owner: &str, expiry: u64) -> UpdateItemFluentBuilder {
        self.update(row)
            .update_expression(
                "SET lease_owner = :me, lease_expiry = :expiry ADD lease_counter :one",
            )
            .condition_expression(TAKEABLE)
            .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
            .expression_attribute_values(":expiry", AttributeValue::N(expiry.to_string()))
            .expression_attribute_values(":now", self.now_value())
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
        let adopt = self
            .update(&key.to_string())
            .condition_expression("attribute_not_exists(checkpoint)")
            .update_expression("SET checkpoint = :seq ADD lease_counter :one")
            .expression_attribute_values(":seq", AttributeValue::S(checkpoint.clone()));
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
                lease_counter: own.lease_counter + 1,
                ..own
            });
        }
        // Another owner saved progress under the stream's key meanwhile: that is newer.
        Ok(state_of(self.item(&key.to_string()).await?.as_ref()))
    }
}
