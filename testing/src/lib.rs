//! Test doubles for [`kinesis_checkpoint`], kept apart from the library as tokio keeps
//! `tokio-test`: a deployed function builds none of them.
//!
//! | item | what it is |
//! |---|---|
//! | [`local`] | a local event source that behaves like Lambda's Kinesis event source mapping |
//! | [`MemoryDeadLetters`] | a dead-letter sink that keeps whole letters in memory |
//! | [`MemoryQueue`] | a queue in memory with SQS's rules, for the dead-letter redrive |
//! | [`TokioClock`] | a clock on tokio's time, virtual under a paused runtime |

mod clock;
mod dead_letters;
pub mod local;

pub use clock::TokioClock;
pub use dead_letters::{MemoryDeadLetters, MemoryQueue, QueueRefused};
