//! What an operator does to the lease table by hand: list every row, move a shard's checkpoint,
//! and import checkpoints from another consumer. These are the writes of the
//! `kinesis-checkpoint` command, kept beside the store so that they use the same schema and the
//! same fencing (`lease_counter`) as the invocations they must not race.

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::DynamoLeaseStore;
use super::conversion::state_of;
use super::expressions::{Clauses, is_condition_failure, set_position};
use super::schema::{
    AGGREGATE_SEQUENCE, AGGREGATE_SUB, CHECKPOINT, DONE_ABOVE, EXPIRES_AT, EXPIRY, FAILING, KEY,
    OBSOLETE, OWNER, REPORTED,
};
use crate::key::LeaseKey;
use crate::sequence::Position;
use crate::store::{Below, LeaseError, LeaseState};

/// One row of the lease table, as an operator sees it.
///
/// ```
/// use kinesis_checkpoint::store::dynamo::Row;
///
/// let row = Row::new("orders:shardId-000000000001", Default::default());
/// assert_eq!(row.key().map(|key| key.shard().to_owned()), Some("shardId-000000000001".to_owned()));
/// assert!(Row::new("shardId-000000000001", Default::default()).key().is_none(), "a bare row");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Row {
    /// The row's partition key: `stream:shard`, or a bare shard id in rows of earlier versions.
    pub lease_key: String,
    /// What the row holds.
    pub state: LeaseState,
}

impl Row {
    /// A row under `lease_key`.
    ///
    /// ```
    /// # use kinesis_checkpoint::store::dynamo::Row;
    /// let row = Row::new("orders:shardId-000000000000", Default::default());
    /// ```
    #[must_use]
    pub fn new(lease_key: impl Into<String>, state: LeaseState) -> Self {
        Self {
            lease_key: lease_key.into(),
            state,
        }
    }

    /// The stream and shard of the row; `None` for a bare shard id row of an earlier version.
    ///
    /// ```
    /// # use kinesis_checkpoint::store::dynamo::Row;
    /// let row = Row::new("orders:shardId-000000000000", Default::default());
    /// assert_eq!(row.key().unwrap().stream(), "orders");
    /// ```
    #[must_use]
    pub fn key(&self) -> Option<LeaseKey> {
        LeaseKey::parse(&self.lease_key)
    }
}

/// What a [`move_checkpoint`](DynamoLeaseStore::move_checkpoint) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved {
    /// The checkpoint moved; the row as it was before.
    Moved(LeaseState),
    /// A live lease is held, so nothing was written; the row as it stands, naming the holder.
    Held(LeaseState),
}

impl DynamoLeaseStore {
    /// Every row of the table, read consistently, page by page; `progress` is told how many
    /// rows were read so far after each page.
    ///
    /// # Errors
    ///
    /// The `Scan` failed: the error names the table.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::DynamoLeaseStore;
    /// # async fn run() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let store = DynamoLeaseStore::new(&aws_config::load_from_env().await, "orders-leases");
    /// for row in store.rows(|_| ()).await? {
    ///     println!("{} at {:?}", row.lease_key, row.state.checkpoint);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn rows(&self, mut progress: impl FnMut(usize)) -> Result<Vec<Row>, LeaseError> {
        let mut rows = Vec::new();
        let mut start = None;
        loop {
            self.count_request();
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|error| self.failed("Scan", "every row", &error))?;
            for item in page.items() {
                let Some(key) = item.get(KEY).and_then(|v| v.as_s().ok()) else {
                    continue;
                };
                rows.push(Row::new(key.clone(), state_of(Some(item))));
            }
            progress(rows.len());
            start = page.last_evaluated_key;
            if start
                .as_ref()
                .is_none_or(std::collections::HashMap::is_empty)
            {
                break;
            }
        }
        rows.sort_by(|a, b| a.lease_key.cmp(&b.lease_key));
        Ok(rows)
    }

    /// The row of `key` as stored, read consistently; unlike [`read`](crate::store::CheckpointStore::read)
    /// it never adopts a bare shard id row, so it never writes.
    ///
    /// # Errors
    ///
    /// The `GetItem` failed.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey};
    /// # async fn run() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let store = DynamoLeaseStore::new(&aws_config::load_from_env().await, "orders-leases");
    /// let state = store.row(&LeaseKey::new("orders", "shardId-000000000000")).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn row(&self, key: &LeaseKey) -> Result<LeaseState, LeaseError> {
        Ok(state_of(self.item(&key.to_string()).await?.as_ref()))
    }

    /// Moves the shard's checkpoint to `to` (`None`: no checkpoint, so the shard starts from
    /// the mapping's starting position), forgets its failing record, and takes the lease from
    /// whoever holds it, so that a running invocation is fenced and cannot write its own
    /// checkpoint over this one. Refused while a live lease is held unless `force`. A position
    /// inside a KPL aggregate is written as that aggregate's progress with no `checkpoint`,
    /// since no record before it is known done whole (a seed or KCL reader would start the
    /// shard from its initial position).
    ///
    /// # Errors
    ///
    /// The `UpdateItem` failed for another reason than a live lease.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position};
    /// # use kinesis_checkpoint::store::dynamo::Moved;
    /// # async fn run() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let store = DynamoLeaseStore::new(&aws_config::load_from_env().await, "orders-leases");
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// match store.move_checkpoint(&key, Some(&Position::ShardEnd), false).await? {
    ///     Moved::Moved(before) => println!("was at {:?}", before.checkpoint),
    ///     Moved::Held(now) => println!("held by {:?}", now.lease_owner),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn move_checkpoint(
        &self,
        key: &LeaseKey,
        to: Option<&Position>,
        force: bool,
    ) -> Result<Moved, LeaseError> {
        let row = key.to_string();
        let mut clauses = Clauses::default();
        let mut request = self.update(&row);
        match to {
            // Inside an aggregate no record before it is known done whole: `checkpoint` goes,
            // and the position is the aggregate's progress alone (a seed or KCL reader would
            // start the shard from its initial position).
            Some(position) if position.sub_sequence().is_some() => {
                request = set_position(request, &mut clauses, position, &Below::Keep);
                clauses.remove.extend([CHECKPOINT, EXPIRES_AT]);
            }
            Some(position) => {
                request = set_position(request, &mut clauses, position, &Below::Keep);
            }
            None => {
                clauses
                    .remove
                    .extend([CHECKPOINT, AGGREGATE_SEQUENCE, AGGREGATE_SUB, EXPIRES_AT]);
            }
        }
        // What the row remembered of the old position goes with it.
        clauses
            .remove
            .extend([FAILING, OWNER, EXPIRY, REPORTED, DONE_ABOVE]);
        clauses.remove.extend(OBSOLETE);
        request = request
            .update_expression(clauses.expression())
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if !force {
            request = request
                .condition_expression("attribute_not_exists(lease_owner) OR lease_expiry < :now")
                .expression_attribute_values(":now", self.now_value());
        }
        self.count_request();
        match request.send().await {
            Ok(output) => Ok(Moved::Moved(state_of(output.attributes.as_ref()))),
            Err(error) if is_condition_failure(&error) => {
                let holder = error.as_service_error().and_then(|service| match service {
                    UpdateItemError::ConditionalCheckFailedException(failed) => {
                        failed.item.as_ref()
                    }
                    _ => None,
                });
                Ok(Moved::Held(state_of(holder)))
            }
            Err(error) => Err(self.failed("UpdateItem (move checkpoint)", &row, &error)),
        }
    }

    /// Writes `position` (and the shard's `parents`, when known) as the checkpoint of a shard
    /// that has none yet: what an import from another consumer does. Returns `false`, writing
    /// nothing, when the shard already has a checkpoint: progress made here is newer than any
    /// imported one. A position inside a KPL aggregate is written as that aggregate's progress,
    /// with no `checkpoint` (see [`move_checkpoint`](Self::move_checkpoint)).
    ///
    /// # Errors
    ///
    /// The `UpdateItem` failed for another reason than an existing checkpoint.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let store = DynamoLeaseStore::new(&aws_config::load_from_env().await, "orders-leases");
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// let written = store.import_checkpoint(&key, &Position::record("42".parse()?), &[]).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn import_checkpoint(
        &self,
        key: &LeaseKey,
        position: &Position,
        parents: &[String],
    ) -> Result<bool, LeaseError> {
        let mut clauses = Clauses::default();
        // A position inside an aggregate is imported as that aggregate's progress, with no
        // `checkpoint`: no record before it is known (see `Below`).
        let mut request = set_position(
            self.update(&key.to_string()),
            &mut clauses,
            position,
            &Below::Keep,
        );
        if !parents.is_empty() {
            clauses.set.push("parent_shards = :parents");
            request = request
                .expression_attribute_values(":parents", AttributeValue::Ss(parents.to_vec()));
        }
        let request = request
            .update_expression(clauses.expression())
            .condition_expression(
                "attribute_not_exists(checkpoint) AND attribute_not_exists(aggregate_sequence)",
            );
        self.conditional("UpdateItem (import checkpoint)", key, request)
            .await
    }
}
