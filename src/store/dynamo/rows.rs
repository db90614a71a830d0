//! The partition-key mode's many rows: read 100 per `BatchGetItem`, written 100 per
//! `TransactWriteItems`, each row on condition of the counter it was read with.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, TransactWriteItem, Update};

use super::DynamoLeaseStore;
use super::conversion::state_of;
use super::expressions::failing_item;
use super::expressions::{Clauses, position_clauses};
use super::schema::{FAILING, KEY, OBSOLETE, REPORTED};
use crate::key::LeaseKey;
use crate::store::{FailingChange, KeyCommit, LeaseError, LeaseState, RowForm};

/// The most items one `BatchGetItem` reads and one `TransactWriteItems` writes.
const MANY: usize = 100;

/// How often unprocessed keys of a `BatchGetItem` (throttling) are asked for again.
const UNPROCESSED_ROUNDS: u32 = 5;

impl DynamoLeaseStore {
    /// The transactional update of one partition key's row, on condition of its counter.
    pub(super) fn key_update(&self, commit: &KeyCommit) -> Result<TransactWriteItem, LeaseError> {
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
        // Key rows keep no mark any more: `reported` goes with the attributes no one reads.
        clauses.remove.extend(OBSOLETE);
        clauses.remove.push(REPORTED);
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

    /// Many rows, in the order of `keys`: 100 per consistent `BatchGetItem`, keys left
    /// unprocessed (throttling) asked for again a few times.
    pub(super) async fn read_many(&self, keys: &[LeaseKey]) -> Result<Vec<LeaseState>, LeaseError> {
        {
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
                            self.pause(Duration::from_millis(50 << round)).await;
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
        }
    }

    /// Many partition keys' rows, 100 per `TransactWriteItems`, each on condition of its
    /// counter; whether each was written, in order.
    pub(super) async fn write_many(&self, commits: &[KeyCommit]) -> Result<Vec<bool>, LeaseError> {
        {
            let mut written = vec![false; commits.len()];
            for start in (0..commits.len()).step_by(MANY) {
                let indices = (start..commits.len().min(start + MANY)).collect();
                self.commit_chunk(commits, indices, &mut written).await?;
            }
            Ok(written)
        }
    }
}
