//! The engine's interface on the table: a claim that returns the row, and a last write that
//! releases the lease, one request each; the partition-key mode's many rows in batches (see
//! `rows`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};

use super::DynamoLeaseStore;
use super::conversion::state_of;
use super::expressions::{Clauses, is_condition_failure, set_failing, set_parents, set_position};
use super::schema::{DONE_ABOVE, EXPIRY, OBSOLETE, OURS, OWNER, REPORTED};
use crate::key::LeaseKey;
use crate::sequence::Position;
use crate::store::memory::millis;
use crate::store::{
    Below, BoxFuture, CheckpointStore, Claim, Commit, KeyCommit, LeaseError, LeaseState,
    ReportedChange,
};

impl crate::store::sealed::Sealed for DynamoLeaseStore {}

impl CheckpointStore for DynamoLeaseStore {
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
            let expiry = self.clock.now_millis().saturating_add(millis(ttl));
            let mut request = self.take_until(&row, owner, expiry);
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
            // The row as it was: whose lease this claim took, and from it the row as written
            // (the same changes the update makes), in the one request.
            let outcome = request
                .return_values(ReturnValue::AllOld)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            match outcome {
                Ok(output) => {
                    let mut state = state_of(output.attributes.as_ref());
                    let lapsed = state
                        .lease_owner
                        .as_ref()
                        .is_some_and(|before| before != owner);
                    let lapsed_mark = state.reported.clone().filter(|_| lapsed);
                    state.lease_owner = Some(owner.to_owned());
                    state.lease_expiry = Some(expiry);
                    state.lease_counter += 1;
                    if state.reported.is_none() {
                        state.reported = attempting.cloned();
                    }
                    let state = self.with_legacy(key, state).await?;
                    Ok(Claim::Acquired { state, lapsed_mark })
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

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(Self::renew(self, key, owner, ttl))
    }

    fn commit<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        commit: &'a Commit,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let request = self.commit_request(key, owner, commit, !commit.keep_lease);
            self.conditional("UpdateItem (checkpoint and release)", key, request)
                .await
        })
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
                        "checkpoint = :expected \
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

    fn read<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<LeaseState, LeaseError>> {
        Box::pin(Self::read(self, key))
    }

    fn read_rows<'a>(
        &'a self,
        keys: &'a [LeaseKey],
    ) -> BoxFuture<'a, Result<Vec<LeaseState>, LeaseError>> {
        Box::pin(self.read_many(keys))
    }

    fn commit_rows<'a>(
        &'a self,
        commits: &'a [KeyCommit],
    ) -> BoxFuture<'a, Result<Vec<bool>, LeaseError>> {
        Box::pin(self.write_many(commits))
    }

    fn transact<'a>(
        &'a self,
        key: &'a LeaseKey,
        owner: &'a str,
        transaction: &'a crate::store::Transaction,
    ) -> BoxFuture<'a, Result<crate::store::Transacted, LeaseError>> {
        Box::pin(self.transact_items(key, owner, transaction))
    }

    fn transact_rows<'a>(
        &'a self,
        transaction: &'a crate::store::RowsTransaction,
    ) -> BoxFuture<'a, Result<crate::store::RowsTransacted, LeaseError>> {
        Box::pin(self.transact_row_items(transaction))
    }

    fn requests(&self) -> Option<u64> {
        Some(self.sent.load(Ordering::Relaxed))
    }
}

impl DynamoLeaseStore {
    /// The `UpdateItem` of `commit` on `key`'s row, on condition that `owner` holds the lease,
    /// releasing it when `release`: the invocation's last write, and (as an `Update` of a
    /// transaction) the lease row's action of [`transact`](CheckpointStore::transact).
    pub(super) fn commit_request(
        &self,
        key: &LeaseKey,
        owner: &str,
        commit: &Commit,
        release: bool,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        let mut clauses = Clauses::default();
        let mut request = self.update(&key.to_string());
        if let Some(position) = &commit.checkpoint {
            request = set_position(request, &mut clauses, position, &commit.below);
        }
        request = set_failing(request, &mut clauses, &commit.failing);
        request = set_parents(request, &mut clauses, commit);
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
        clauses.remove.extend(OBSOLETE);
        if release {
            clauses.remove.extend([OWNER, EXPIRY]);
        }
        request
            .update_expression(clauses.expression())
            .condition_expression(OURS)
            .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
    }
}
