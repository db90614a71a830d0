//! The `DynamoDB` Streams example's handler, apart from `main` so that its test runs the code
//! the function deploys.
//!
//! Each change arrives as a record whose payload is the stream record's JSON as Lambda sent it:
//! `eventName`, and `dynamodb` with `Keys`, `NewImage` and `OldImage`. The handler reads the
//! fields it needs with serde and ignores the rest.

use std::collections::HashMap;

use kinesis_checkpoint::{Outcome, Record};
use serde::Deserialize;

/// One change of the `accounts` table, as much of it as the handler reads.
#[derive(Debug, Deserialize)]
pub struct Change {
    /// `INSERT`, `MODIFY` or `REMOVE`.
    #[serde(rename = "eventName")]
    pub event: String,
    /// The stream record.
    pub dynamodb: Images,
}

/// The item's images, attribute by attribute in `DynamoDB`'s JSON (`{"N": "12"}`).
#[derive(Debug, Deserialize)]
pub struct Images {
    /// The item after the change; absent for a removal.
    #[serde(rename = "NewImage", default)]
    pub new_image: HashMap<String, HashMap<String, String>>,
}

impl Change {
    /// The new balance, in cents, when the change has one.
    #[must_use]
    pub fn balance(&self) -> Option<i64> {
        self.dynamodb
            .new_image
            .get("balance")?
            .get("N")?
            .parse()
            .ok()
    }
}

/// Handles one change: a negative balance is refused (dead-lettered, whole), a removal is
/// acknowledged, any other change is logged.
#[allow(
    clippy::unused_async,
    reason = "a handler is an async fn; a real one awaits its downstream here"
)]
pub async fn handle(change: Change, record: Record) -> Outcome {
    if change.event == "REMOVE" {
        return Outcome::ack();
    }
    match change.balance() {
        Some(balance) if balance < 0 => Outcome::reject(format!("a negative balance: {balance}")),
        Some(balance) => {
            tracing::info!(balance, item = record.partition_key(), "balance changed");
            Outcome::ack()
        }
        None => Outcome::reject("the change has no balance"),
    }
}
