//! [`Processor::transactional`]: a handler that says which `DynamoDB` writes a record makes,
//! committed with the checkpoint past it (see [`effects`](crate::effects)).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use super::{PartitionKeyMode, Processor, ShardMode};
use crate::effects::{Writes, stage};
use crate::handler::{Handler, HandlerError, Outcome};
use crate::record::Record;
use crate::store::{BoxFuture, CheckpointStore};

/// What a transactional handler made of one record.
///
/// A handler returning `Result<Writes, E>` gets `Ok` as [`Effect::Commit`] and `Err` as
/// [`Effect::Retry`].
///
/// ```
/// use kinesis_checkpoint::effects::Writes;
/// use kinesis_checkpoint::processor::Effect;
///
/// assert!(matches!(Effect::from(Writes::new()), Effect::Commit(_)));
/// assert!(matches!(Effect::from(Err::<Writes, _>("busy")), Effect::Retry(_)));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Effect {
    /// Done, once these writes are committed with the checkpoint past the record.
    Commit(Writes),
    /// Failed for now: stop the shard here and let Lambda deliver the record again.
    Retry(HandlerError),
    /// Will never succeed: move the record aside (dead-letter it) and go on.
    Reject(HandlerError),
}

impl From<Writes> for Effect {
    fn from(writes: Writes) -> Self {
        Self::Commit(writes)
    }
}

impl<E: Into<HandlerError>> From<Result<Writes, E>> for Effect {
    fn from(result: Result<Writes, E>) -> Self {
        match result {
            Ok(writes) => Self::Commit(writes),
            Err(error) => Self::Retry(error.into()),
        }
    }
}

/// Processes one record by saying what to write, instead of writing it.
///
/// The writes are committed with the checkpoint past the record, in one `TransactWriteItems`
/// on condition of the lease (in the partition-key mode, of the key's row), so a record's
/// effect lands exactly once however often the record
/// is delivered or its invocation dies. The handler must not write to `DynamoDB` itself (what
/// it writes alone is only effectively once), and should read what its writes depend on with
/// a condition on them instead of trusting a read: the records before it in the batch have
/// not been committed when it runs.
///
/// Implemented for every `Fn(Record) -> impl Future<Output = impl Into<Effect>>`.
///
/// ```
/// use aws_sdk_dynamodb::types::{AttributeValue, Update};
/// use kinesis_checkpoint::effects::{Write, Writes};
/// use kinesis_checkpoint::processor::TransactionalHandler;
/// use kinesis_checkpoint::Record;
///
/// async fn count(record: Record) -> Result<Writes, Box<dyn std::error::Error + Send + Sync>> {
///     let update = Update::builder()
///         .table_name("counts")
///         .key("key", AttributeValue::S(record.partition_key().to_owned()))
///         .update_expression("ADD records :one")
///         .expression_attribute_values(":one", AttributeValue::N("1".into()))
///         .build()?;
///     Ok(Writes::from(Write::update(update)))
/// }
///
/// fn assert_transactional(_: impl TransactionalHandler) {}
/// assert_transactional(count);
/// ```
pub trait TransactionalHandler: Send + Sync + 'static {
    /// Says what `record` writes, or why it cannot be done.
    fn handle(&self, record: Record) -> BoxFuture<'_, Effect>;
}

impl<F, Fut, O> TransactionalHandler for F
where
    F: Fn(Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<Effect>,
{
    fn handle(&self, record: Record) -> BoxFuture<'_, Effect> {
        let future = self(record);
        Box::pin(async move { future.await.into() })
    }
}

/// A [`TransactionalHandler`] as the processor runs it: built only by
/// [`Processor::transactional`] and [`Processor::transactional_by_partition_key`], whose
/// engine takes the writes it stages.
///
/// As a plain [`Handler`] (reached through a wrapper of the caller's own, outside the
/// processor that built it) it cannot hand its writes on, so every record fails with
/// [`NotStaging`](crate::effects::NotStaging) rather than be acknowledged without its writes.
pub struct Transactional<T> {
    handler: T,
}

impl<T> fmt::Debug for Transactional<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transactional")
            .field("handler", &std::any::type_name::<T>())
            .finish()
    }
}

impl<T: TransactionalHandler> Handler for Transactional<T> {
    fn handle(&self, record: Record) -> BoxFuture<'_, Outcome> {
        let effect = self.handler.handle(record);
        Box::pin(async move {
            match effect.await {
                Effect::Commit(writes) => match stage(writes) {
                    Ok(()) => Outcome::Ack,
                    Err(not_staging) => Outcome::retry(not_staging),
                },
                Effect::Retry(error) => Outcome::Retry(error),
                Effect::Reject(error) => Outcome::Reject(error),
            }
        })
    }
}

/// The transactional processor's constructor.
impl<T: TransactionalHandler> Processor<Transactional<T>, ShardMode> {
    /// A processor in the shard mode that runs `handler` on each record and commits the
    /// writes it returns with the checkpoint, in `TransactWriteItems` of at most 100 actions
    /// and 4 MB (one of them the lease row's), a chunk ending before a record that touches an
    /// item already in it; each chunk moves the checkpoint to its last record. `store` must
    /// commit transactions: `DynamoLeaseStore` (the lease table and the handler's tables in
    /// one account and region) or [`MemoryLeaseStore`](crate::MemoryLeaseStore), whose tables
    /// are in memory.
    ///
    /// A write refused by its condition fails its record as
    /// [`Writes::on_condition_failed`] says; the records before it are committed, and the
    /// message names the table, the key and the condition.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::sync::Arc;
    ///
    /// use aws_sdk_dynamodb::types::{AttributeValue, Put};
    /// use kinesis_checkpoint::effects::{Write, Writes};
    /// use kinesis_checkpoint::{MemoryLeaseStore, Processor, Record};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Arc::new(MemoryLeaseStore::new());
    /// let processor = Processor::transactional(store.clone(), |record: Record| async move {
    ///     let put = Put::builder()
    ///         .table_name("orders")
    ///         .item("id", AttributeValue::S(record.sequence().to_string()))
    ///         .build()?;
    ///     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Writes::from(Write::put(put, &["id"])?))
    /// });
    /// let json = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/events/batch.json"));
    /// let event = serde_json::from_str(json)?;
    /// let response = processor.process(event, &lambda_runtime::Context::default()).await?;
    /// assert!(response.batch_item_failures.is_empty());
    /// assert!(!store.items("orders").is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn transactional(store: Arc<dyn CheckpointStore>, handler: T) -> Self {
        let mut processor = Self::new(store, Transactional { handler });
        processor.settings.transactional = true;
        processor
    }
}

/// The transactional processor's constructor in the partition-key mode.
impl<T: TransactionalHandler> Processor<Transactional<T>, PartitionKeyMode> {
    /// A processor in the partition-key mode ([`PartitionKeyMode`]) that runs `handler` on
    /// each record and commits the writes it returns with the advance of the record's key's
    /// row: the row's update, on condition of its counter (which fences a concurrent delivery
    /// of the key), is the transaction's checkpoint action. Several keys' rows share a
    /// `TransactWriteItems`, each row one of its 100 actions; a chunk ends before a record
    /// whose writes touch an item already in it, and each key's row moves to the last record
    /// of the key the chunk commits. `store` must commit transactions, as for
    /// [`Processor::transactional`].
    ///
    /// A write refused by its condition fails its record, for its key only, as
    /// [`Writes::on_condition_failed`] says: retried, the key stops there while the other
    /// keys go on; rejected, it is dead-lettered and the key goes on. The message names the
    /// table, the key and the condition.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use aws_sdk_dynamodb::types::{AttributeValue, Update};
    /// use kinesis_checkpoint::effects::{Write, Writes};
    /// use kinesis_checkpoint::{MemoryLeaseStore, Processor, Record};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Arc::new(MemoryLeaseStore::new());
    /// let processor = Processor::transactional_by_partition_key(store.clone(), |record: Record| async move {
    ///     let update = Update::builder()
    ///         .table_name("counts")
    ///         .key("key", AttributeValue::S(record.partition_key().to_owned()))
    ///         .update_expression("ADD records :one")
    ///         .expression_attribute_values(":one", AttributeValue::N("1".into()))
    ///         .build()?;
    ///     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Writes::from(Write::update(update)))
    /// })
    /// .concurrency(8);
    /// let json = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/events/batch.json"));
    /// let event = serde_json::from_str(json)?;
    /// let response = processor.process(event, &lambda_runtime::Context::default()).await?;
    /// assert!(response.batch_item_failures.is_empty());
    /// assert!(!store.items("counts").is_empty());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A shard-mode setting does not compile here, as on [`Processor::by_partition_key`]:
    ///
    /// ```compile_fail
    /// # use std::{sync::Arc, time::Duration};
    /// # use kinesis_checkpoint::effects::Writes;
    /// # use kinesis_checkpoint::{MemoryLeaseStore, Processor, Record};
    /// let processor = Processor::transactional_by_partition_key(
    ///     Arc::new(MemoryLeaseStore::new()),
    ///     |_: Record| async { Writes::new() },
    /// )
    /// .lease_ttl(Duration::from_secs(10));
    /// ```
    pub fn transactional_by_partition_key(store: Arc<dyn CheckpointStore>, handler: T) -> Self {
        let mut processor = Self::by_partition_key(store, Transactional { handler });
        processor.settings.transactional = true;
        processor
    }
}
