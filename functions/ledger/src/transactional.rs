//! The ledger's transactional mode (`LEDGER_MODE=transactional`): each record's update of its
//! order is committed with the checkpoint past it, in one `TransactWriteItems`, so an order is
//! applied exactly once even when an invocation dies between the update and the checkpoint.
//! With `CHECKPOINT_MODE=partition-key` the checkpoint is the advance of the order's partition
//! key's row.
//!
//! The update is the plain mode's (`ADD total_cents :amount, applied :one`, not idempotent on
//! purpose): a record applied twice would show in `applied`. The simulated failures are the
//! plain mode's too; a transient one's attempts are still counted in the book, outside the
//! transaction, since they are a record of attempts, not an effect of the order.

use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, Update};
use kinesis_checkpoint::Record;
use kinesis_checkpoint::effects::{Write, Writes};
use kinesis_checkpoint::processor::{Effect, TransactionalHandler};

use crate::{Book, Fail, Order};

/// Which way the ledger applies orders, from `LEDGER_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LedgerMode {
    /// `plain` (the default): the handler updates the order itself, effectively once.
    #[default]
    Plain,
    /// `transactional`: the update is committed with the checkpoint, exactly once.
    Transactional,
}

impl LedgerMode {
    /// The mode `LEDGER_MODE` names (`plain` when unset).
    ///
    /// # Errors
    ///
    /// A value that is neither `plain` nor `transactional`.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var("LEDGER_MODE").as_deref() {
            Err(_) | Ok("plain") => Ok(Self::Plain),
            Ok("transactional") => Ok(Self::Transactional),
            Ok(other) => Err(format!(
                "LEDGER_MODE is 'plain' or 'transactional', not '{other}'"
            )),
        }
    }
}

/// The update of `order`'s row in `table` that record `sequence` makes.
#[must_use]
pub fn update(table: &str, order: &Order, sequence: &str) -> Write {
    let update = Update::builder()
        .table_name(table)
        .key("order_id", AttributeValue::S(order.order_id.clone()))
        .update_expression(
            "ADD total_cents :amount, applied :one SET last_sequence = :seq, currency = :currency",
        )
        .expression_attribute_values(":amount", AttributeValue::N(order.amount_cents.to_string()))
        .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
        .expression_attribute_values(":seq", AttributeValue::S(sequence.to_owned()))
        .expression_attribute_values(":currency", AttributeValue::S(order.currency.clone()))
        .build()
        .expect("table name, key and update expression are set");
    Write::update(update)
}

/// The ledger's transactional handler: each order's update into `table`, to be committed with
/// the checkpoint; `book` counts the simulated transient failures' attempts.
pub fn handler<B: Book>(book: Arc<B>, table: impl Into<String>) -> impl TransactionalHandler {
    let table: Arc<str> = table.into().into();
    move |record: Record| {
        let book = Arc::clone(&book);
        let table = Arc::clone(&table);
        async move { effect(book.as_ref(), &table, &record).await }
    }
}

async fn effect(book: &impl Book, table: &str, record: &Record) -> Effect {
    let order: Order = match record.json() {
        Ok(order) => order,
        Err(error) => return Effect::Reject(error.into()),
    };
    if order.order_id.is_empty() {
        return Effect::Reject("the order has an empty order_id".into());
    }
    let sequence = record.sequence().as_str();
    match order.fail {
        Some(Fail::Poison) => {
            return Effect::Reject(format!("order {} is marked poison", order.order_id).into());
        }
        Some(Fail::Abort) => crate::abort(&order, sequence),
        Some(Fail::Transient) => match book.attempt(sequence).await {
            Ok(attempt) if attempt <= order.fail_times.unwrap_or(1) => {
                return Effect::Retry(
                    format!(
                        "order {}: simulated transient failure, attempt {attempt}",
                        order.order_id
                    )
                    .into(),
                );
            }
            Ok(_) => {}
            Err(error) => return Effect::Retry(error.into()),
        },
        None => {}
    }
    if let Some(pause) = order.pause_ms {
        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
    }
    tracing::info!(order_id = order.order_id, sequence, "staged");
    Effect::Commit(Writes::from(update(table, &order, sequence)))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use kinesis_checkpoint::processor::CheckpointMode;
    use kinesis_checkpoint::{LeaseKey, MemoryLeaseStore, Processor};

    use super::*;
    use crate::MemoryBook;

    fn event(orders: &[(&str, i64)]) -> aws_lambda_events::event::kinesis::KinesisEvent {
        let records: Vec<serde_json::Value> = orders
            .iter()
            .enumerate()
            .map(|(n, (order, amount))| {
                let data = serde_json::json!({"order_id": order, "amount_cents": amount});
                let sequence = format!("{}", 100 + n);
                serde_json::json!({
                    "kinesis": {
                        "kinesisSchemaVersion": "1.0",
                        "partitionKey": order,
                        "sequenceNumber": sequence,
                        "data": base64_of(&data.to_string()),
                        "approximateArrivalTimestamp": 1_764_512_345.5,
                    },
                    "eventSource": "aws:kinesis",
                    "eventVersion": "1.0",
                    "eventID": format!("shardId-000000000000:{sequence}"),
                    "eventName": "aws:kinesis:record",
                    "invokeIdentityArn": "arn:aws:iam::123456789012:role/test",
                    "awsRegion": "us-east-1",
                    "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({ "Records": records })).unwrap()
    }

    fn base64_of(text: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    /// Delivers three orders (two of `A-1`) twice through `processor` and checks that each
    /// was applied once, in the store's `ledger` table, in two transactions.
    async fn delivered_twice_applied_once<H: kinesis_checkpoint::Handler, M: CheckpointMode>(
        processor: &Processor<H, M>,
        store: &MemoryLeaseStore,
    ) {
        let event = event(&[("A-1", 100), ("A-1", 50), ("B-2", 7)]);
        let context = lambda_runtime::Context::default();
        for _ in 0..2 {
            let response = processor.process(event.clone(), &context).await.unwrap();
            assert!(response.batch_item_failures.is_empty());
        }
        let key = |order: &str| {
            HashMap::from([("order_id".to_owned(), AttributeValue::S(order.to_owned()))])
        };
        let a = store.item("ledger", &key("A-1")).unwrap();
        assert_eq!(a["total_cents"], AttributeValue::N("150".into()));
        assert_eq!(
            a["applied"],
            AttributeValue::N("2".into()),
            "delivered twice, applied once"
        );
        assert_eq!(store.transactions(), 2, "A-1 twice: two transactions");
    }

    #[tokio::test]
    async fn orders_are_applied_in_the_store_s_tables_with_the_checkpoint() {
        let store = Arc::new(MemoryLeaseStore::new());
        let processor = Processor::transactional(
            store.clone(),
            handler(Arc::new(MemoryBook::default()), "ledger"),
        );
        delivered_twice_applied_once(&processor, &store).await;
        let row = kinesis_checkpoint::store::CheckpointStore::read(
            store.as_ref(),
            &LeaseKey::new("orders", "shardId-000000000000"),
        )
        .await
        .unwrap();
        assert_eq!(row.checkpoint.as_deref(), Some("102"));
    }

    #[tokio::test]
    async fn in_the_partition_key_mode_orders_are_applied_once_with_their_keys_rows() {
        let store = Arc::new(MemoryLeaseStore::new());
        let processor = Processor::transactional_by_partition_key(
            store.clone(),
            handler(Arc::new(MemoryBook::default()), "ledger"),
        );
        delivered_twice_applied_once(&processor, &store).await;
        let shard = LeaseKey::new("orders", "shardId-000000000000");
        let row = kinesis_checkpoint::store::CheckpointStore::read(
            store.as_ref(),
            &kinesis_checkpoint::internal::row_key(&shard, "A-1"),
        )
        .await
        .unwrap();
        assert_eq!(row.checkpoint.as_deref(), Some("101"), "A-1's row");
    }
}
