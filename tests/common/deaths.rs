//! Deaths for the exactly-once harnesses (`tests/exactly_once.rs`, `tests/exactly_once_keys.rs`):
//! where an invocation dies, the reaper that kills it there, and the store layer that counts
//! the store calls a death can strike before or after. Shared so that the two modes' harnesses
//! kill their invocations the same way.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::types::{AttributeValue, Update};
use kinesis_checkpoint::BoxFuture;
use kinesis_checkpoint::effects::Write;
use kinesis_checkpoint::internal::{Call, Layer, Next, Operation};
use kinesis_checkpoint::store::LeaseError;

/// Where an invocation dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// Before the counted store call of this index is sent.
    BeforeCall(usize),
    /// After that call was applied, before its answer arrives.
    AfterCall(usize),
    /// After the handler of record `n` did its work (the plain handler's effect, the
    /// transactional handler's staging).
    AfterRecord(u64),
}

impl fmt::Display for Death {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BeforeCall(index) => write!(f, "before store call {index}"),
            Self::AfterCall(index) => write!(f, "after store call {index}"),
            Self::AfterRecord(n) => write!(f, "after record {n}"),
        }
    }
}

/// The death planned for one delivery, and the signal that it happened.
#[derive(Default)]
pub struct Reaper {
    pub plan: Mutex<Option<Death>>,
    calls: AtomicUsize,
    pub died: tokio::sync::Notify,
}

impl Reaper {
    /// Dies here: signals the death and never returns (the invocation is dropped).
    pub async fn die(&self) {
        *self.plan.lock().unwrap() = None;
        self.died.notify_one();
        std::future::pending::<()>().await;
    }

    pub fn planned(&self, death: Death) -> bool {
        *self.plan.lock().unwrap() == Some(death)
    }
}

/// Kills the invocation at the reaper's store call; only the operations in `counted` are
/// counted (the claim and the writes of one mode).
pub struct Deaths {
    pub reaper: Arc<Reaper>,
    pub counted: &'static [Operation],
}

impl Layer for Deaths {
    fn wrap<'a, T: fmt::Debug + Send + 'a>(
        &'a self,
        call: Call<'a>,
        next: Next<'a, T>,
    ) -> BoxFuture<'a, Result<T, LeaseError>> {
        let counted = self.counted.contains(&call.operation());
        Box::pin(async move {
            if !counted {
                return next.run(call).await;
            }
            let index = self.reaper.calls.fetch_add(1, Ordering::SeqCst);
            if self.reaper.planned(Death::BeforeCall(index)) {
                self.reaper.die().await;
            }
            let answer = next.run(call).await;
            if self.reaper.planned(Death::AfterCall(index)) {
                self.reaper.die().await;
            }
            answer
        })
    }
}

/// Record `n`'s effect: one `ADD` on its own item of `table`.
pub fn count_up(table: &str, n: u64) -> Write {
    Write::update(
        Update::builder()
            .table_name(table)
            .key("id", AttributeValue::S(format!("order-{n}")))
            .update_expression("ADD applied :one")
            .expression_attribute_values(":one", AttributeValue::N("1".to_owned()))
            .build()
            .unwrap(),
    )
}
