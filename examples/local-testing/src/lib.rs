//! The handler the local-testing example tests: running balances per customer, which come out
//! right only if each movement is applied once and in order.
//!
//! Nothing here knows about tests. The tests (`tests/`) run this handler through the local event
//! source of `kinesis-checkpoint-testing`, which delivers a stream in memory as Lambda's mapping
//! would, misbehaviour included.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kinesis_checkpoint::{Handler, Outcome, Record, json};
use serde::Deserialize;

/// One record: money in (positive) or out (negative) of a customer's account.
#[derive(Debug, Clone, Deserialize)]
pub struct Movement {
    /// The customer, also the record's partition key.
    pub customer: String,
    /// How much, in cents.
    pub cents: i64,
}

/// The customers' balances: what the handler keeps (a table, in a real function).
#[derive(Debug, Clone, Default)]
pub struct Balances(Arc<Mutex<HashMap<String, i64>>>);

impl Balances {
    /// The balance of `customer`, in cents.
    #[must_use]
    pub fn of(&self, customer: &str) -> i64 {
        self.lock().get(customer).copied().unwrap_or(0)
    }

    /// Applies `movement`, unless it would take the balance below zero: that can never succeed,
    /// so it is rejected.
    #[must_use]
    pub fn apply(&self, movement: &Movement) -> Outcome {
        let mut balances = self.lock();
        let balance = balances.entry(movement.customer.clone()).or_default();
        if *balance + movement.cents < 0 {
            return Outcome::reject(format!(
                "{} cents would overdraw {}'s balance of {balance}",
                -movement.cents, movement.customer
            ));
        }
        *balance += movement.cents;
        Outcome::ack()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, i64>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The handler: each record's [`Movement`] applied to `balances`.
#[must_use]
pub fn handler(balances: Balances) -> impl Handler {
    json(move |movement: Movement, _record: Record| {
        let outcome = balances.apply(&movement);
        async move { outcome }
    })
}
