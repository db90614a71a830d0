//! Orders from a `DynamoDB` table's stream (`EVENT_SOURCE=dynamodb-streams`): each change of
//! an order item becomes the order record the Kinesis ledger reads, so one ledger serves both
//! sources.
//!
//! An `INSERT` or `MODIFY` carries the item's new image (`order_id` S, `amount_cents` N, and
//! optionally `currency` S, `fail` S, `fail_times` N): it is applied as that order. A `REMOVE`
//! applies nothing. The mapping must show new images (`StreamViewType` `NEW_IMAGE` or
//! `NEW_AND_OLD_IMAGES`).

use std::sync::Arc;

use kinesis_checkpoint::effects::Writes;
use kinesis_checkpoint::processor::{Effect, TransactionalHandler};
use kinesis_checkpoint::{Handler, Outcome, Record};
use serde_json::{Map, Value};

use crate::Order;

/// What a change asks of the ledger.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Apply this record: the order, as the Kinesis ledger reads it.
    Order(Record),
    /// Nothing to apply (the item was removed).
    Removed,
}

/// The change `record` carries.
///
/// # Errors
///
/// A change whose JSON or new image is not an order, with what is missing.
///
/// ```
/// # use kinesis_checkpoint::{LeaseKey, Record};
/// use ledger::changes::{Change, read};
///
/// let change = r#"{"eventName":"INSERT","dynamodb":{"NewImage":{"order_id":{"S":"A-1"},"amount_cents":{"N":"1250"}}}}"#;
/// let record = Record::new(LeaseKey::new("arn", "shardId-1"), "1".parse()?, "{}", change);
/// let Change::Order(order) = read(&record)? else { panic!("an order") };
/// assert_eq!(order.json::<ledger::Order>()?.amount_cents, 1250);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read(record: &Record) -> Result<Change, String> {
    let change: Value =
        serde_json::from_slice(record.data()).map_err(|e| format!("not a change's JSON: {e}"))?;
    if change["eventName"] == "REMOVE" {
        return Ok(Change::Removed);
    }
    let image = change["dynamodb"]["NewImage"]
        .as_object()
        .ok_or("the change has no NewImage: the stream must show new images")?;
    let order: Map<String, Value> = image
        .iter()
        .filter_map(|(name, value)| Some((name.clone(), plain(value)?)))
        .collect();
    let order: Order = serde_json::from_value(Value::Object(order))
        .map_err(|e| format!("the new image is not an order: {e}"))?;
    let payload = serde_json::to_vec(&order).map_err(|e| e.to_string())?;
    Ok(Change::Order(Record::new(
        record.key().clone(),
        record.sequence().clone(),
        record.partition_key(),
        payload,
    )))
}

/// A string or number attribute as plain JSON; `None` for any other type.
fn plain(value: &Value) -> Option<Value> {
    if let Some(text) = value["S"].as_str() {
        return Some(Value::String(text.to_owned()));
    }
    let number = value["N"].as_str()?;
    number
        .parse::<i64>()
        .ok()
        .map(Value::from)
        .or_else(|| number.parse::<f64>().ok().map(Value::from))
}

/// `inner`, the Kinesis ledger's handler, over a stream's changes: a removal is acknowledged,
/// a change that is no order rejected.
pub fn orders<H: Handler>(inner: H) -> impl Handler {
    let inner = Arc::new(inner);
    move |record: Record| {
        let inner = Arc::clone(&inner);
        async move {
            match read(&record) {
                Ok(Change::Order(order)) => inner.handle(order).await,
                Ok(Change::Removed) => Outcome::ack(),
                Err(error) => Outcome::reject(error),
            }
        }
    }
}

/// [`orders`], for the transactional ledger: a removal writes nothing.
pub fn effects<T: TransactionalHandler>(inner: T) -> impl TransactionalHandler {
    let inner = Arc::new(inner);
    move |record: Record| {
        let inner = Arc::clone(&inner);
        async move {
            match read(&record) {
                Ok(Change::Order(order)) => inner.handle(order).await,
                Ok(Change::Removed) => Effect::Commit(Writes::default()),
                Err(error) => Effect::Reject(error.into()),
            }
        }
    }
}
