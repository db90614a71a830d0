//! The seed crate's five methods, on the table: each one conditional `UpdateItem` (or a
//! consistent `GetItem`) that bumps the fencing counter, as the seed crate's own store writes
//! them, so that the two share a table.

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use super::DynamoLeaseStore;
use super::conversion::state_of;
use super::expressions::{Clauses, set_position};
use super::schema::OURS;
use crate::key::LeaseKey;
use crate::sequence::Position;
use crate::store::{Below, BoxFuture, LeaseError, LeaseState, LeaseStore};

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
        Box::pin(Self::renew(self, key, owner, ttl))
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
                    "SET checkpoint = :seq REMOVE aggregate_sequence, aggregate_sub \
                     ADD lease_counter :one",
                )
                .condition_expression(OURS)
                .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
                .expression_attribute_values(":seq", AttributeValue::S(sequence.to_owned()));
            self.conditional("UpdateItem (checkpoint)", key, request)
                .await
        })
    }

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        Box::pin(Self::read(self, key))
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
}

impl DynamoLeaseStore {
    /// Reads `key`'s row, consistently, whoever owns it (a bare-shard-id row of an earlier
    /// version by the rules of [`legacy_stream`](Self::legacy_stream)). The same read as both
    /// traits' `read`, callable without naming one.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey};
    /// # async fn run() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let config = aws_config::load_from_env().await;
    /// let store = DynamoLeaseStore::new(&config, "orders-leases");
    /// let row = store.read(&LeaseKey::new("orders", "shardId-000000000000")).await?;
    /// println!("{:?}", row.checkpoint);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The request failed, or the shard's only progress is in an [`UnattributedLegacyRow`](super::UnattributedLegacyRow).
    pub async fn read(&self, key: &LeaseKey) -> Result<LeaseState, LeaseError> {
        let own = state_of(self.item(&key.to_string()).await?.as_ref());
        self.with_legacy(key, own).await
    }

    /// Heartbeats `owner`'s lease for another `ttl`; `false` when it is no longer held. The
    /// same renew as both traits' `renew`, callable without naming one.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey};
    /// # async fn run() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let config = aws_config::load_from_env().await;
    /// let store = DynamoLeaseStore::new(&config, "orders-leases");
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// let still_ours = store.renew(&key, "me", Duration::from_secs(30)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The request failed for another reason than its condition.
    pub async fn renew(
        &self,
        key: &LeaseKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, LeaseError> {
        let request = self
            .update(&key.to_string())
            .update_expression("SET lease_expiry = :expiry ADD lease_counter :one")
            .condition_expression(OURS)
            .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
            .expression_attribute_values(":expiry", self.expiry_after(ttl));
        self.conditional("UpdateItem (renew)", key, request).await
    }

    /// Writes `position` as the checkpoint under `owner`'s lease, keeping the lease: a
    /// position inside an aggregate beside the checkpoint, in the row's form. Returns `false`
    /// when fenced. The engine does not need it (its last write is
    /// [`commit`](crate::store::CheckpointStore::commit)); tools and tests that write a row step
    /// by step do.
    ///
    /// ```no_run
    /// # use kinesis_checkpoint::{DynamoLeaseStore, LeaseKey, Position};
    /// # async fn run() -> Result<(), kinesis_checkpoint::store::LeaseError> {
    /// let config = aws_config::load_from_env().await;
    /// let store = DynamoLeaseStore::new(&config, "orders-leases");
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// let inside = Position::sub_record("9".parse()?, 2);
    /// store.checkpoint_position(&key, "me", &inside).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The request failed for another reason than its condition.
    pub async fn checkpoint_position(
        &self,
        key: &LeaseKey,
        owner: &str,
        position: &Position,
    ) -> Result<bool, LeaseError> {
        let mut clauses = Clauses::default();
        let request = set_position(
            self.update(&key.to_string()),
            &mut clauses,
            position,
            &Below::Keep,
        )
        .update_expression(clauses.expression())
        .condition_expression(OURS)
        .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()));
        self.conditional("UpdateItem (checkpoint)", key, request)
            .await
    }
}
