//! The writes the transactional tests' handlers return (`tests/transactional.rs`,
//! `tests/transactional_keys.rs`): shared so the two modes are tested with the same writes.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put, Update};
use kinesis_checkpoint::Record;
use kinesis_checkpoint::effects::{OnConditionFailed, Write, Writes};
use kinesis_checkpoint::processor::Effect;

use super::n_of;

pub fn id_key(id: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([("id".to_owned(), AttributeValue::S(id.to_owned()))])
}

/// A put of order `id` into `table`, only if it is not there yet.
pub fn put_once(table: &str, id: &str, n: u64) -> Write {
    let put = Put::builder()
        .table_name(table)
        .item("id", AttributeValue::S(id.to_owned()))
        .item("n", AttributeValue::N(n.to_string()))
        .condition_expression("attribute_not_exists(id)")
        .build()
        .unwrap();
    Write::put(put, &["id"]).unwrap()
}

/// An update that adds 1 to `count` of item `id`.
pub fn count_up(table: &str, id: &str) -> Write {
    Write::update(
        Update::builder()
            .table_name(table)
            .set_key(Some(id_key(id)))
            .update_expression("ADD #count :one")
            .expression_attribute_names("#count", "count")
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .build()
            .unwrap(),
    )
}

/// A handler that puts order `order-{id(n)}` once for each record `n`.
pub fn orders(
    table: &'static str,
    id: impl Fn(u64) -> u64 + Send + Sync + 'static,
    policy: OnConditionFailed,
) -> impl Fn(Record) -> std::future::Ready<Effect> + Send + Sync + 'static {
    move |record: Record| {
        let n = n_of(&record);
        let writes = Writes::from(put_once(table, &format!("order-{}", id(n)), n))
            .on_condition_failed(policy);
        std::future::ready(Effect::Commit(writes))
    }
}
