//! The ledger: an example Lambda function built on kinesis-checkpoint.
//!
//! It materializes order events from a Kinesis stream into a `DynamoDB` table: each record adds
//! its amount to its order's running total and counts itself in `applied`. Neither update is
//! idempotent on purpose, so a record applied twice shows (the total and the count are off),
//! which makes the ledger a test of the toolkit's effectively-once processing.
//!
//! # Payload
//!
//! ```json
//! {"order_id": "A-1001", "amount_cents": 2500, "currency": "EUR"}
//! ```
//!
//! For demos and tests, a payload can ask to fail:
//!
//! - `"fail": "transient"` fails the record with a retry on its first `fail_times` attempts
//!   (default 1), as a downstream outage would; attempts are counted in the book, so they
//!   survive cold starts;
//! - `"fail": "poison"` rejects the record: it can never succeed;
//! - `"fail": "abort"` aborts the process on every attempt, as an out-of-memory kill or a
//!   native crash would: the toolkit counts each death and dead-letters the record after
//!   `MAX_ATTEMPTS` of them;
//! - `"pause_ms": N` waits N milliseconds before applying, as a slow downstream would (the
//!   tests of concurrent invocations hold a lease with it).
//!
//! A payload that is not such JSON, or has an empty `order_id`, is rejected too.

pub mod aws;
pub mod changes;
pub mod transactional;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use kinesis_checkpoint::aws_error::cause;
use kinesis_checkpoint::{BoxFuture, Handler, Outcome, Record, json};
use serde::{Deserialize, Serialize};

/// One order event, the JSON payload of a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The order the amount belongs to; the ledger item's key.
    pub order_id: String,
    /// The amount in cents; negative for a refund.
    pub amount_cents: i64,
    /// ISO 4217 currency code.
    #[serde(default = "default_currency")]
    pub currency: String,
    /// Asks the record to fail, for demos and tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail: Option<Fail>,
    /// How many attempts a `"fail": "transient"` record fails before it succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_times: Option<u32>,
    /// Milliseconds to wait before applying, for tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<u64>,
}

fn default_currency() -> String {
    "EUR".to_owned()
}

/// A failure a payload asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fail {
    /// Fails with a retry on the first `fail_times` attempts.
    Transient,
    /// Rejected: never succeeds.
    Poison,
    /// Aborts the process, every time: an out-of-memory kill or a native crash.
    Abort,
}

/// One order's line in the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The sum of every applied amount.
    pub total_cents: i64,
    /// How many records were applied.
    pub applied: u64,
    /// The sequence number of the last record applied.
    pub last_sequence: String,
    /// The currency of the last record applied.
    pub currency: String,
}

/// A book write that failed: the record is retried.
#[derive(Debug, thiserror::Error)]
#[error("ledger table '{table}': {detail}")]
pub struct BookError {
    table: String,
    detail: String,
}

/// Where the ledger is kept.
pub trait Book: Send + Sync + 'static {
    /// Adds `order` to its entry, noting `sequence` as the last applied.
    fn apply<'a>(
        &'a self,
        order: &'a Order,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<(), BookError>>;

    /// Counts one more attempt at the record `sequence` and returns the count.
    fn attempt<'a>(&'a self, sequence: &'a str) -> BoxFuture<'a, Result<u32, BookError>>;
}

/// The value of the environment variable `name`, or an error saying what to set.
///
/// # Errors
///
/// The variable is not set.
pub fn required(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("set {name} (see functions/ledger/src/main.rs)"))
}

/// Logs to standard output as Lambda's advanced logging controls ask: `AWS_LAMBDA_LOG_FORMAT`
/// `JSON` or text, and the level from `AWS_LAMBDA_LOG_LEVEL`, else `RUST_LOG` (a level, or
/// per-target levels such as `info,kinesis_checkpoint=debug`), else `INFO`.
///
/// `lambda_runtime::tracing::init_default_subscriber` does the same with `tracing-subscriber`'s
/// `EnvFilter`, whose regular-expression engine is about 0.3 MB of the arm64 binary
/// (BENCHMARKS.md, section 4): per-target levels need no regular expression.
///
/// ```no_run
/// ledger::init_logging();
/// tracing::info!("logged as Lambda's log controls ask");
/// ```
pub fn init_logging() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;

    let filter: Targets = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|levels| levels.to_ascii_lowercase().parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO));
    let layer = tracing_subscriber::fmt::layer()
        .with_target(false)
        .without_time();
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    if json {
        tracing_subscriber::registry()
            .with(layer.json().with_filter(filter))
            .init();
    } else {
        tracing_subscriber::registry()
            .with(layer.with_filter(filter))
            .init();
    }
}

/// The ledger's record handler over `book`.
pub fn handler<B: Book>(book: Arc<B>) -> impl Handler {
    json(move |order: Order, record: Record| {
        let book = Arc::clone(&book);
        async move { apply(book.as_ref(), &order, &record).await }
    })
}

async fn apply(book: &impl Book, order: &Order, record: &Record) -> Outcome {
    if order.order_id.is_empty() {
        return Outcome::reject("the order has an empty order_id");
    }
    let sequence = record.sequence().as_str();
    match order.fail {
        Some(Fail::Poison) => {
            return Outcome::reject(format!("order {} is marked poison", order.order_id));
        }
        Some(Fail::Abort) => abort(order, sequence),
        Some(Fail::Transient) => match book.attempt(sequence).await {
            Ok(attempt) if attempt <= order.fail_times.unwrap_or(1) => {
                return Outcome::retry(format!(
                    "order {}: simulated transient failure, attempt {attempt}",
                    order.order_id
                ));
            }
            Ok(_) => {}
            Err(error) => return Outcome::retry(error),
        },
        None => {}
    }
    if let Some(pause) = order.pause_ms {
        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
    }
    match book.apply(order, sequence).await {
        Ok(()) => {
            tracing::info!(order_id = order.order_id, sequence, "applied");
            Outcome::ack()
        }
        Err(error) => Outcome::retry(error),
    }
}

/// Aborts the process, as an out-of-memory kill or a native crash would: no unwinding, no
/// answer to Lambda, no last write.
fn abort(order: &Order, sequence: &str) -> ! {
    tracing::error!(
        order_id = order.order_id,
        sequence,
        "simulated crash: aborting the process"
    );
    std::process::abort();
}

/// The ledger in a `DynamoDB` table whose partition key is the string `order_id`.
///
/// Its client is built on the first write, not with the book: building an SDK client builds
/// its TLS configuration, which a cold start that answers an empty event (or a batch held by
/// the gate) need not pay.
#[derive(Debug, Clone)]
pub struct DynamoBook {
    config: aws_config::SdkConfig,
    client: Arc<OnceLock<Client>>,
    table: String,
}

impl DynamoBook {
    /// The book in `table`.
    #[must_use]
    pub fn new(config: &aws_config::SdkConfig, table: impl Into<String>) -> Self {
        Self {
            config: config.clone(),
            client: Arc::default(),
            table: table.into(),
        }
    }

    fn client(&self) -> &Client {
        self.client.get_or_init(|| Client::new(&self.config))
    }

    fn failed(
        &self,
        error: &(impl aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + 'static),
    ) -> BookError {
        BookError {
            table: self.table.clone(),
            detail: cause(error),
        }
    }
}

/// The key of the item counting attempts at one record, beside the orders.
fn attempts_key(sequence: &str) -> String {
    format!("_attempts:{sequence}")
}

impl Book for DynamoBook {
    fn apply<'a>(
        &'a self,
        order: &'a Order,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<(), BookError>> {
        Box::pin(async move {
            self.client()
                .update_item()
                .table_name(&self.table)
                .key("order_id", AttributeValue::S(order.order_id.clone()))
                .update_expression(
                    "ADD total_cents :amount, applied :one SET last_sequence = :seq, currency = :currency",
                )
                .expression_attribute_values(":amount", AttributeValue::N(order.amount_cents.to_string()))
                .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
                .expression_attribute_values(":seq", AttributeValue::S(sequence.to_owned()))
                .expression_attribute_values(":currency", AttributeValue::S(order.currency.clone()))
                .send()
                .await
                .map_err(|error| self.failed(&error))?;
            Ok(())
        })
    }

    fn attempt<'a>(&'a self, sequence: &'a str) -> BoxFuture<'a, Result<u32, BookError>> {
        Box::pin(async move {
            let output = self
                .client()
                .update_item()
                .table_name(&self.table)
                .key("order_id", AttributeValue::S(attempts_key(sequence)))
                .update_expression("ADD attempts :one")
                .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
                .return_values(ReturnValue::UpdatedNew)
                .send()
                .await
                .map_err(|error| self.failed(&error))?;
            Ok(output
                .attributes
                .as_ref()
                .and_then(|a| a.get("attempts"))
                .and_then(|n| n.as_n().ok())
                .and_then(|n| n.parse().ok())
                .unwrap_or(1))
        })
    }
}

/// The ledger in memory, for the demo and tests.
#[derive(Debug, Default)]
pub struct MemoryBook {
    entries: Mutex<HashMap<String, Entry>>,
    attempts: Mutex<HashMap<String, u32>>,
}

impl MemoryBook {
    /// Every order's entry.
    pub fn entries(&self) -> HashMap<String, Entry> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Book for MemoryBook {
    fn apply<'a>(
        &'a self,
        order: &'a Order,
        sequence: &'a str,
    ) -> BoxFuture<'a, Result<(), BookError>> {
        Box::pin(async move {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            let entry = entries.entry(order.order_id.clone()).or_default();
            entry.total_cents += order.amount_cents;
            entry.applied += 1;
            sequence.clone_into(&mut entry.last_sequence);
            order.currency.clone_into(&mut entry.currency);
            Ok(())
        })
    }

    fn attempt<'a>(&'a self, sequence: &'a str) -> BoxFuture<'a, Result<u32, BookError>> {
        Box::pin(async move {
            let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
            let count = attempts.entry(sequence.to_owned()).or_default();
            *count += 1;
            Ok(*count)
        })
    }
}

#[cfg(test)]
mod tests {
    use kinesis_checkpoint::LeaseKey;

    use super::*;

    fn record(n: u64, order: &serde_json::Value) -> Record {
        Record::new(
            LeaseKey::new("orders", "shardId-000000000000"),
            (1000 + n).to_string().parse().unwrap(),
            "k",
            order.to_string(),
        )
    }

    #[tokio::test]
    async fn each_applied_record_adds_to_its_order_so_a_duplicate_would_show() {
        let book = Arc::new(MemoryBook::default());
        let handler = handler(book.clone());
        for (n, amount) in [(1, 250), (2, 100)] {
            let order = serde_json::json!({"order_id": "A-1", "amount_cents": amount});
            assert!(handler.handle(record(n, &order)).await.is_ack());
        }
        let entry = &book.entries()["A-1"];
        assert_eq!((entry.total_cents, entry.applied), (350, 2));
        assert_eq!(entry.last_sequence, "1002");
    }

    #[tokio::test]
    async fn a_transient_record_fails_its_first_attempts_then_applies() {
        let book = Arc::new(MemoryBook::default());
        let handler = handler(book.clone());
        let order = serde_json::json!({"order_id": "B-1", "amount_cents": 5, "fail": "transient", "fail_times": 2});
        assert!(matches!(
            handler.handle(record(1, &order)).await,
            Outcome::Retry(_)
        ));
        assert!(matches!(
            handler.handle(record(1, &order)).await,
            Outcome::Retry(_)
        ));
        assert!(handler.handle(record(1, &order)).await.is_ack());
        assert_eq!(book.entries()["B-1"].applied, 1);
    }

    #[tokio::test]
    async fn poison_and_unreadable_records_are_rejected_and_never_applied() {
        let book = Arc::new(MemoryBook::default());
        let handler = handler(book.clone());
        let poison = serde_json::json!({"order_id": "C-1", "amount_cents": 5, "fail": "poison"});
        assert!(matches!(
            handler.handle(record(1, &poison)).await,
            Outcome::Reject(_)
        ));
        let nameless = serde_json::json!({"order_id": "", "amount_cents": 5});
        assert!(matches!(
            handler.handle(record(2, &nameless)).await,
            Outcome::Reject(_)
        ));
        let not_an_order = serde_json::json!({"hello": "world"});
        assert!(matches!(
            handler.handle(record(3, &not_an_order)).await,
            Outcome::Reject(_)
        ));
        assert!(book.entries().is_empty());
    }
}
