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
//!   many rows. It is sealed: its methods carry the engine's row forms, which change with the
//!   engine. [`MemoryLeaseStore`](crate::MemoryLeaseStore) and `DynamoLeaseStore` implement it, and [`SeedStore`].
//!
//! A wrapper of a store (metrics, injected faults in tests) is a `Layer` inside `Layered`,
//! which spells the method list once, instead of an implementation that forwards every method
//! by hand.
//!
//! | file | what |
//! |---|---|
//! | `lease` | [`LeaseStore`], [`LeaseState`], [`FailingRecord`], [`BoxFuture`], [`LeaseError`] |
//! | `checkpoints` | [`CheckpointStore`] and the writes it takes: the claim, the commit, the key rows, the transactions |
//! | `row` | how a position is written into a row and read back |
//! | `seed` | [`SeedStore`] |
//! | `layer` | `Layer`, `Layered`: wrappers that see every call |
//! | `memory` | [`MemoryLeaseStore`](crate::MemoryLeaseStore) |
//! | `dynamo` | `DynamoLeaseStore` (feature `dynamodb`) |
//! | `metered` | the per-invocation request and latency counters of the metrics |

pub(crate) mod checkpoints;
#[cfg(feature = "dynamodb")]
pub mod dynamo;
pub(crate) mod layer;
pub(crate) mod lease;
pub(crate) mod memory;
pub(crate) mod metered;
pub(crate) mod row;
pub(crate) mod seed;

pub use checkpoints::CheckpointStore;
pub(crate) use checkpoints::{
    Claim, Commit, FailingChange, KeyCommit, ReportedChange, commit_again_once,
};
#[cfg(feature = "dynamodb")]
pub(crate) use checkpoints::{RowsTransacted, RowsTransaction, Transacted, Transaction};
pub(crate) use layer::Layered;
pub(crate) use lease::BoxFuture;
pub use lease::{FailingRecord, LeaseError, LeaseState, LeaseStore};
pub(crate) use row::Below;
#[cfg(feature = "dynamodb")]
pub(crate) use row::RowForm;
pub use seed::SeedStore;

/// Keeps [`CheckpointStore`] to the crate's own stores: its methods carry the engine's row
/// forms, which change with the engine. A store of your own implements [`LeaseStore`].
pub(crate) mod sealed {
    /// Implemented by the crate's stores only.
    pub trait Sealed {}
}
