//! The user's code: a function of one record that says what became of it.
//!
//! The processor needs three answers, not two: a record that is done, a record that failed for
//! now and must be retried in order (the shard stops there), and a record that will never
//! succeed (poison), which must be moved aside rather than block its shard forever. [`Outcome`]
//! carries them; [`Handler`] is implemented by any `async` function or closure of a [`Record`],
//! and [`json`] adapts one that takes a typed payload.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;

use crate::record::Record;
use crate::store::BoxFuture;

/// The error a handler reports with a failed record.
pub type HandlerError = Box<dyn StdError + Send + Sync>;

/// What became of one record.
///
/// A handler returning `Result<(), E>` gets `Ok` as [`Outcome::Ack`] and `Err` as
/// [`Outcome::Retry`]: an error is transient unless the handler says otherwise.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::{Outcome, Record};
///
/// async fn handle(record: Record) -> Outcome {
///     match record.data() {
///         b"" => Outcome::reject("an empty record can never succeed"),
///         b"busy" => Outcome::retry("the downstream service is busy"),
///         _ => Outcome::ack(),
///     }
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// Done: the checkpoint may move past the record.
    Ack,
    /// Failed for now: stop the shard here and let Lambda deliver the record again.
    Retry(HandlerError),
    /// Will never succeed: move the record aside (dead-letter it) and go on.
    Reject(HandlerError),
}

impl Outcome {
    /// The record is done.
    ///
    /// ```
    /// # use kinesis_checkpoint::Outcome;
    /// assert!(Outcome::ack().is_ack());
    /// ```
    #[must_use]
    pub const fn ack() -> Self {
        Self::Ack
    }

    /// The record failed for now and must be retried, in order.
    ///
    /// ```
    /// # use kinesis_checkpoint::Outcome;
    /// assert!(!Outcome::retry("timeout").is_ack());
    /// ```
    pub fn retry(error: impl Into<HandlerError>) -> Self {
        Self::Retry(error.into())
    }

    /// The record will never succeed.
    ///
    /// ```
    /// # use kinesis_checkpoint::Outcome;
    /// assert!(matches!(Outcome::reject("bad order"), Outcome::Reject(_)));
    /// ```
    pub fn reject(error: impl Into<HandlerError>) -> Self {
        Self::Reject(error.into())
    }

    /// Whether the record is done.
    ///
    /// ```
    /// # use kinesis_checkpoint::Outcome;
    /// assert!(Outcome::from(Ok::<(), std::io::Error>(())).is_ack());
    /// ```
    #[must_use]
    pub const fn is_ack(&self) -> bool {
        matches!(self, Self::Ack)
    }
}

impl<E: Into<HandlerError>> From<Result<(), E>> for Outcome {
    fn from(result: Result<(), E>) -> Self {
        match result {
            Ok(()) => Self::Ack,
            Err(error) => Self::Retry(error.into()),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ack => f.write_str("done"),
            Self::Retry(error) => write!(f, "to retry: {error}"),
            Self::Reject(error) => write!(f, "rejected: {error}"),
        }
    }
}

/// Processes one record.
///
/// Implemented for every `Fn(Record) -> impl Future<Output = impl Into<Outcome>>`, so an
/// `async fn` or a closure returning an `async` block is a handler.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::{Handler, Outcome, Record};
///
/// async fn count(record: Record) -> Result<(), std::io::Error> {
///     tracing::info!(bytes = record.data().len(), "counted");
///     Ok(())
/// }
///
/// fn assert_handler(_: impl Handler) {}
/// assert_handler(count);
/// assert_handler(|_record: Record| async { Outcome::ack() });
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Processes `record` and says what became of it.
    fn handle(&self, record: Record) -> BoxFuture<'_, Outcome>;

    /// What the processor calls: [`handle`](Self::handle), without its box where the type
    /// knows its future. The closures and [`json`] handlers return their future as it is, so
    /// a record's dispatch allocates nothing for it (the `processor` bench); any other
    /// handler gets `handle`'s boxed future, and needs to implement `handle` only.
    ///
    /// Contract: an implementation does exactly what `handle` does, with the same record; the
    /// user code it runs is called before this returns, as `handle` calls it, and the future
    /// only awaits what it returned.
    ///
    /// ```
    /// use kinesis_checkpoint::{Handler, LeaseKey, Outcome, Record};
    ///
    /// let handler = |record: Record| async move {
    ///     if record.data().is_empty() { Outcome::reject("empty") } else { Outcome::ack() }
    /// };
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// let record = Record::new(key, "1".parse()?, "k", "hi");
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// assert!(runtime.block_on(handler.handle_unboxed(record)).is_ack());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn handle_unboxed(&self, record: Record) -> impl Future<Output = Outcome> + Send + '_
    where
        Self: Sized,
    {
        self.handle(record)
    }
}

impl<F, Fut, O> Handler for F
where
    F: Fn(Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<Outcome>,
{
    fn handle(&self, record: Record) -> BoxFuture<'_, Outcome> {
        Box::pin(self.handle_unboxed(record))
    }

    fn handle_unboxed(&self, record: Record) -> impl Future<Output = Outcome> + Send + '_ {
        Call::Running {
            future: self(record),
        }
    }
}

/// A handler of JSON payloads of type `T`: see [`json`].
pub struct Json<T, F> {
    handler: F,
    payload: PhantomData<fn() -> T>,
}

impl<T, F> fmt::Debug for Json<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Json")
            .field("payload", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

/// Adapts a handler of typed payloads: each record's data is read as JSON of type `T` and handed
/// over with the record. A payload that is not a `T` is rejected (poison: it would fail again
/// on every delivery), with an error naming the stream, shard and sequence number.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::{Handler, Outcome, Record, json};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Order {
///     order_id: String,
///     amount_cents: i64,
/// }
///
/// let handler = json(|order: Order, record: Record| async move {
///     tracing::info!(order.order_id, order.amount_cents, sequence = %record.sequence(), "applied");
///     Outcome::ack()
/// });
/// # fn assert_handler(_: impl Handler) {}
/// # assert_handler(handler);
/// ```
pub fn json<T, F, Fut, O>(handler: F) -> Json<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(T, Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<Outcome>,
{
    Json {
        handler,
        payload: PhantomData,
    }
}

impl<T, F, Fut, O> Handler for Json<T, F>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(T, Record) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<Outcome>,
{
    fn handle(&self, record: Record) -> BoxFuture<'_, Outcome> {
        Box::pin(self.handle_unboxed(record))
    }

    fn handle_unboxed(&self, record: Record) -> impl Future<Output = Outcome> + Send + '_ {
        // The user code is called here, as `handle` always called it; the future only
        // awaits it.
        match record.json::<T>() {
            Ok(payload) => Call::Running {
                future: (self.handler)(payload, record),
            },
            Err(error) => Call::Decided {
                outcome: Some(Outcome::reject(error)),
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// A handler's future: the user code's, its output made an [`Outcome`], or the outcome
    /// known when the handler was called (a payload that is not the JSON asked for).
    ///
    /// Written out rather than an `async` block, which wraps the user code's future in a state
    /// machine of its own, polled and dropped with every record (the `processor` bench).
    #[project = CallProjection]
    enum Call<F> {
        Running { #[pin] future: F },
        Decided { outcome: Option<Outcome> },
    }
}

impl<F, O> Future for Call<F>
where
    F: Future<Output = O>,
    O: Into<Outcome>,
{
    type Output = Outcome;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Outcome> {
        match self.project() {
            CallProjection::Running { future } => future.poll(cx).map(Into::into),
            CallProjection::Decided { outcome } => std::task::Poll::Ready(
                outcome
                    .take()
                    .expect("a handler's future is not polled once it is ready"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LeaseKey;

    fn record(data: &'static str) -> Record {
        Record::new(
            LeaseKey::new("orders", "shardId-000000000000"),
            "1".parse().unwrap(),
            "k",
            data,
        )
    }

    #[tokio::test]
    async fn an_error_result_is_a_retry_and_ok_is_done() {
        let handler = |record: Record| async move {
            if record.data() == b"fail" {
                Err("downstream refused")
            } else {
                Ok(())
            }
        };
        assert!(handler.handle(record("fine")).await.is_ack());
        assert!(matches!(
            handler.handle(record("fail")).await,
            Outcome::Retry(_)
        ));
    }

    #[tokio::test]
    async fn a_payload_of_the_wrong_type_is_rejected_and_never_reaches_the_handler() {
        let handler = json(|value: u32, _record: Record| async move {
            assert_eq!(value, 7);
            Outcome::ack()
        });
        assert!(handler.handle(record("7")).await.is_ack());
        let Outcome::Reject(error) = handler.handle(record("\"seven\"")).await else {
            panic!("a string is not a u32");
        };
        assert!(error.to_string().contains("shardId-000000000000"));
    }
}
