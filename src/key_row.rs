//! The row key of the partition-key mode: where a partition key's checkpoint lives.
//!
//! A leaf of its own, so that the gate (which reads a parent's key rows) and the engine's
//! partition-key mode (which writes them) share the one rule without importing each other. It
//! belongs beside [`LeaseKey`] in the crate's key module, where it is to move.

use crate::lease::LeaseKey;

/// The row of `partition_key` on the shard of `shard`: `stream:shard:partition-key`. A shard's
/// own row has one colon, a key's row two or more, so the two never meet.
///
/// ```
/// use kinesis_checkpoint::LeaseKey;
/// use kinesis_checkpoint::partition_key::row_key;
///
/// let row = row_key(&LeaseKey::new("orders", "shardId-000000000000"), "customer-7");
/// assert_eq!(row.to_string(), "orders:shardId-000000000000:customer-7");
/// ```
#[must_use]
pub fn row_key(shard: &LeaseKey, partition_key: &str) -> LeaseKey {
    LeaseKey::new(shard.stream(), format!("{}:{partition_key}", shard.shard()))
}
