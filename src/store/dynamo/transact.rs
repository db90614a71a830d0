//! `TransactWriteItems`: a transactional handler's writes and the lease row's update, one
//! request.
//!
//! The lease row's action is the same `UpdateItem` the invocation's last write sends
//! ([`commit_request`](DynamoLeaseStore::commit_request)), as an `Update` of the transaction,
//! so every field of the commit reaches the row by the one path. It goes last, so a
//! cancellation reason's index below it is the index of the record's write.
//!
//! The partition-key mode's transaction ([`RowsTransaction`]) is the same with the keys' rows
//! in place of the lease row: each row's action is the conditional `Update`
//! [`commit_rows`](crate::store::CheckpointStore::commit_rows) sends, after the writes.

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{TransactWriteItem, Update};

use super::DynamoLeaseStore;
use crate::key::LeaseKey;
use crate::store::{LeaseError, RowsTransacted, RowsTransaction, Transacted, Transaction};

/// The code of a cancellation reason whose action was refused by its condition.
const CONDITION_FAILED: &str = "ConditionalCheckFailed";

impl DynamoLeaseStore {
    /// Sends `transaction` for `owner` on `key`'s row.
    pub(super) async fn transact_items(
        &self,
        key: &LeaseKey,
        owner: &str,
        transaction: &Transaction,
    ) -> Result<Transacted, LeaseError> {
        let row = key.to_string();
        let request = self.commit_request(
            key,
            owner,
            &transaction.commit,
            !transaction.commit.keep_lease,
        );
        let input = request.as_input();
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(input.get_key().clone())
            .set_update_expression(input.get_update_expression().clone())
            .set_condition_expression(input.get_condition_expression().clone())
            .set_expression_attribute_names(input.get_expression_attribute_names().clone())
            .set_expression_attribute_values(input.get_expression_attribute_values().clone())
            .build()
            .map_err(|error| Box::new(error) as LeaseError)?;
        let lease_action = transaction.writes.len();
        let mut items: Vec<TransactWriteItem> = transaction
            .writes
            .iter()
            .map(|write| write.action().clone())
            .collect();
        items.push(TransactWriteItem::builder().update(update).build());
        self.count_request();
        let sent = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(&transaction.token)
            .send()
            .await;
        let Err(error) = sent else {
            return Ok(Transacted::Committed);
        };
        if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            error.as_service_error()
        {
            let reasons = cancelled.cancellation_reasons();
            let code = |index: usize| reasons.get(index).and_then(|reason| reason.code());
            // The lease first: fenced, whatever else was refused.
            if code(lease_action) == Some(CONDITION_FAILED) {
                return Ok(Transacted::Fenced);
            }
            let refused = (0..lease_action).find(|index| code(*index) == Some(CONDITION_FAILED));
            if let Some(action) = refused {
                let reason = reasons[action].message().map_or_else(
                    || CONDITION_FAILED.to_owned(),
                    |m| format!("{CONDITION_FAILED}: {m}"),
                );
                return Ok(Transacted::Refused { action, reason });
            }
        }
        Err(self.failed("TransactWriteItems", &row, &error))
    }

    /// Sends the partition-key mode's `transaction`: the writes, then each key's row.
    pub(super) async fn transact_row_items(
        &self,
        transaction: &RowsTransaction,
    ) -> Result<RowsTransacted, LeaseError> {
        let first_row = transaction
            .rows
            .first()
            .map(|commit| commit.row.to_string())
            .unwrap_or_default();
        let writes = transaction.writes.len();
        let mut items: Vec<TransactWriteItem> = transaction
            .writes
            .iter()
            .map(|write| write.action().clone())
            .collect();
        for commit in &transaction.rows {
            items.push(self.key_update(commit)?);
        }
        self.count_request();
        let sent = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(&transaction.token)
            .send()
            .await;
        let Err(error) = sent else {
            return Ok(RowsTransacted::Committed);
        };
        if let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            error.as_service_error()
        {
            let reasons = cancelled.cancellation_reasons();
            let refused = |index: usize| {
                reasons.get(index).and_then(|reason| reason.code()) == Some(CONDITION_FAILED)
            };
            // The rows first: fenced, whatever else was refused.
            let fenced: Vec<usize> = (0..transaction.rows.len())
                .filter(|row| refused(writes + row))
                .collect();
            if !fenced.is_empty() {
                return Ok(RowsTransacted::Fenced(fenced));
            }
            if let Some(action) = (0..writes).find(|index| refused(*index)) {
                let reason = reasons[action].message().map_or_else(
                    || CONDITION_FAILED.to_owned(),
                    |m| format!("{CONDITION_FAILED}: {m}"),
                );
                return Ok(RowsTransacted::Refused { action, reason });
            }
        }
        Err(self.failed("TransactWriteItems", &first_row, &error))
    }
}
