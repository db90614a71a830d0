//! A local event source that behaves like Lambda's Kinesis event source mapping (feature
//! `local`).
//!
//! Lambda's mapping cannot run on a laptop (SAM local needs Docker and does not poll streams),
//! yet how a handler behaves under redelivery, partial failures, resharding and duplicate
//! deliveries is exactly what needs trying before a deploy. This module reproduces the mapping:
//!
//! | piece | what it is |
//! |---|---|
//! | [`MemoryStream`] | a stream in memory that splits and merges like Kinesis |
//! | `KinesisStream` | a Kinesis endpoint, such as `kinesis-local` (feature `kinesis`) |
//! | [`Mapping`] | the mapping's settings, and the chances of its misbehaviour |
//! | [`EventSource`] | the mapping itself: batches, retries, bisection, discards |
//! | [`Function`] | what it invokes: a [`Processor`](kinesis_checkpoint::Processor), or [`RuntimeApi`] for a function binary under `cargo lambda watch` |
//! | [`Rng`] | the seeded chances, so a run replays |
//!
//! # Testing your own handler
//!
//! A handler that keeps a running total per customer must see each order once and in order,
//! whatever the mapping does; a test can check it under duplicate and concurrent deliveries and
//! a split:
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//!
//! use kinesis_checkpoint::gate::Gate;
//! use kinesis_checkpoint_testing::local::{EventSource, Mapping, MemoryStream};
//! use kinesis_checkpoint::{MemoryLeaseStore, Outcome, Processor, Record};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let stream = MemoryStream::new("orders", 2);
//! for n in 0..300 {
//!     if n == 150 {
//!         stream.split("shardId-000000000000");
//!     }
//!     stream.put(&format!("customer-{}", n % 10), format!("{n}"));
//! }
//!
//! // The handler under test: it remembers, per customer, the orders it saw.
//! let seen: Arc<Mutex<HashMap<String, Vec<u32>>>> = Arc::default();
//! let handler = {
//!     let seen = seen.clone();
//!     move |record: Record| {
//!         let n: u32 = std::str::from_utf8(record.data()).unwrap().parse().unwrap();
//!         seen.lock().unwrap().entry(record.partition_key().to_owned()).or_default().push(n);
//!         async { Outcome::ack() }
//!     }
//! };
//! let processor = Processor::new(Arc::new(MemoryLeaseStore::new()), handler)
//!     .gate(Gate::new(Arc::new(stream.clone()), Default::default()));
//!
//! let mapping = Mapping::default()
//!     .batch_size(25)
//!     .duplicate_deliveries(0.2)
//!     .concurrent_deliveries(0.2)
//!     .children_before_parents(1.0)
//!     .seed(42);
//! EventSource::new(stream, mapping).run(Arc::new(processor)).await?;
//!
//! for (customer, orders) in seen.lock().unwrap().iter() {
//!     assert!(orders.windows(2).all(|w| w[0] < w[1]), "{customer}: once each, in order");
//!     assert_eq!(orders.len(), 30);
//! }
//! # Ok(())
//! # }
//! ```

mod delivery;
mod function;
mod invoke;
mod kinesis;
mod mapping;
mod progress;
mod rng;
mod source;
mod stream;

pub use delivery::{Delivery, DeliveryOutcome, DiscardReason, Discarded, RunReport, SourceError};
pub use function::{Function, InvocationError, RuntimeApi};
pub use kinesis::KinesisStream;
pub use mapping::Mapping;
pub use rng::Rng;
pub use source::EventSource;
pub use stream::{MemoryStream, ShardRead, Shards, StreamError, StreamRecord};
