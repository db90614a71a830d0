//! The exactly-once example's handler, apart from `main` so that the test runs what the function
//! runs.
//!
//! Each record is a [`Payment`]. The handler does not write to `DynamoDB`: it returns the writes
//! (the payment's item, and its account's balance), and the processor commits them with the
//! checkpoint past the record in one `TransactWriteItems`. Both land or neither does, so a
//! balance moves once per payment, however often the record is delivered or its invocation dies.

use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, Put, Update};
use kinesis_checkpoint::effects::{OnConditionFailed, Write, Writes};
use kinesis_checkpoint::processor::{Effect, TransactionalHandler};
use kinesis_checkpoint::{HandlerError, Record};
use serde::Deserialize;

/// The payload of each record.
#[derive(Debug, Clone, Deserialize)]
pub struct Payment {
    /// The payment's identifier, unique: a producer that sends one twice sends this twice.
    pub payment_id: String,
    /// The account it credits.
    pub account: String,
    /// How much, in cents: positive.
    pub amount_cents: i64,
}

/// The tables the handler writes: their names, from the function's environment.
#[derive(Debug, Clone)]
pub struct Tables {
    /// One item per payment, keyed `payment_id`.
    pub payments: String,
    /// One item per account, keyed `account`, with `balance_cents`.
    pub balances: String,
}

/// The transactional handler over `tables`.
#[must_use]
pub fn handler(tables: Tables) -> impl TransactionalHandler {
    let tables = Arc::new(tables);
    move |record: Record| {
        let effect = effect(&tables, &record);
        async move { effect }
    }
}

/// What one record writes, or why it never can.
///
/// The payment's item is put on condition that no payment of its id exists, and that condition
/// is a rejection: a payment its producer sent twice is dead-lettered, and its balance update,
/// in the same transaction, does not land.
#[must_use]
pub fn effect(tables: &Tables, record: &Record) -> Effect {
    let payment: Payment = match record.json() {
        Ok(payment) => payment,
        Err(error) => return Effect::Reject(error.into()),
    };
    if payment.amount_cents <= 0 {
        let error = format!("payment {} has no positive amount", payment.payment_id);
        return Effect::Reject(error.into());
    }
    writes(tables, &payment).map_or_else(Effect::Reject, Effect::Commit)
}

fn writes(tables: &Tables, payment: &Payment) -> Result<Writes, HandlerError> {
    let amount = AttributeValue::N(payment.amount_cents.to_string());
    let item = Put::builder()
        .table_name(&tables.payments)
        .item("payment_id", AttributeValue::S(payment.payment_id.clone()))
        .item("account", AttributeValue::S(payment.account.clone()))
        .item("amount_cents", amount.clone())
        .condition_expression("attribute_not_exists(payment_id)")
        .build()?;
    let balance = Update::builder()
        .table_name(&tables.balances)
        .key("account", AttributeValue::S(payment.account.clone()))
        .update_expression("ADD balance_cents :amount")
        .expression_attribute_values(":amount", amount)
        .build()?;
    Ok(Writes::new()
        .with(Write::put(item, &["payment_id"])?)
        .with(Write::update(balance))
        .on_condition_failed(OnConditionFailed::Reject))
}
