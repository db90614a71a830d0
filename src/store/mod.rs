//! Where leases and checkpoints are kept: two interfaces, and the stores.
//!
//! Lambda delivers a shard's batches at least once and, after errors or mapping updates, may
//! deliver the same records to two invocations at once. A lease makes one invocation the owner
//! of a shard while it works, and a checkpoint written on condition of still owning it records
//! what is done, so a redelivery skips it.
//!
//! There are two interfaces, and which one to implement depends on what the store can keep:
//!
//! - [`LeaseStore`] is the seed crate's, exactly its five methods (`acquire`, `renew`,
//!   `checkpoint`, `read`, `release`). A store written for the seed crate implements it and
//!   keeps compiling; it reaches the engine through [`SeedStore`], the one adapter, whose
//!   documentation lists what such a store cannot keep (the failing record, the records done
//!   above the checkpoint, the parents, `expires_at`, the reported and contended records,
//!   progress inside a KPL aggregate) and what that costs.
//! - [`CheckpointStore`] is the engine's: the claim that reads the row, the last write that
//!   carries everything and releases the lease, the gate's `finish`, the partition-key mode's
//!   many rows. Every method is required, so no store loses a field by leaving one out.
//!   Implement it when the store can keep the toolkit's schema; [`MemoryLeaseStore`] and
//!   `DynamoLeaseStore` implement both.
//!
//! A wrapper around a store (metrics, injected faults in tests) is a [`Layer`] inside
//! [`Layered`], which spells the method list once, instead of a third implementation that
//! forwards every method by hand.
//!
//! | file | what |
//! |---|---|
//! | `lease` | [`LeaseStore`], [`LeaseState`], [`FailingRecord`], [`BoxFuture`], [`LeaseError`] |
//! | `checkpoints` | [`CheckpointStore`], [`Claim`], [`Commit`], [`KeyCommit`], [`FailingChange`], [`ReportedChange`], `Transaction`, `Transacted`, `RowsTransaction`, `RowsTransacted` |
//! | `row` | how a position is written into a row and read back: [`Below`] |
//! | `seed` | [`SeedStore`] |
//! | `layer` | [`Layer`], [`Layered`], [`Call`], [`Next`], [`Operation`] |
//! | `memory` | [`MemoryLeaseStore`] |
//! | `dynamo` | `DynamoLeaseStore` (feature `dynamodb`) |
//! | `metered` | the per-invocation request and latency counters of the metrics |

mod checkpoints;
#[cfg(feature = "dynamodb")]
pub mod dynamo;
#[cfg(feature = "testing")]
pub mod every_field;
mod layer;
mod lease;
pub mod memory;
pub(crate) mod metered;
mod row;
mod seed;

pub use crate::key::{LeaseKey, row_key};
pub(crate) use checkpoints::commit_again_once;
pub use checkpoints::{CheckpointStore, Claim, Commit, FailingChange, KeyCommit, ReportedChange};
#[cfg(feature = "dynamodb")]
pub use checkpoints::{RowsTransacted, RowsTransaction, Transacted, Transaction};
pub use layer::{Call, Layer, Layered, Next, Operation};
pub use lease::{BoxFuture, FailingRecord, LeaseError, LeaseState, LeaseStore, MAX_ERROR_CHARS};
pub use memory::MemoryLeaseStore;
pub use row::Below;
#[cfg(feature = "dynamodb")]
pub(crate) use row::RowForm;
pub use seed::{NoTransactions, SeedStore};
