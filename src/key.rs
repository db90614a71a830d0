//! [`LeaseKey`]: the name one shard's (or one partition key's) row lives under, and
//! [`row_key`], the partition-key mode's rule for a key's row.
//!
//! A leaf: the record, the engine and every store name rows by it, so it depends on nothing
//! else in the crate.

use std::fmt;
use std::sync::Arc;

/// The name one shard's lease and checkpoint live under: the stream and the shard id.
///
/// Every stream's first shard is `shardId-000000000000`, so a store keys by both, and one table
/// serves every stream. Both parts are shared: each record of a batch carries its key.
///
/// # Examples
///
/// ```
/// use kinesis_checkpoint::LeaseKey;
///
/// let key = LeaseKey::new("orders", "shardId-000000000003");
/// assert_eq!(key.stream(), "orders");
/// assert_eq!(key.to_string(), "orders:shardId-000000000003");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey {
    stream: Arc<str>,
    shard: Arc<str>,
}

impl LeaseKey {
    /// The lease of `shard` on `stream`.
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// let key = LeaseKey::new("orders", "shardId-000000000000");
    /// assert_eq!(key.shard(), "shardId-000000000000");
    /// ```
    #[must_use]
    pub fn new(stream: impl Into<Arc<str>>, shard: impl Into<Arc<str>>) -> Self {
        Self {
            stream: stream.into(),
            shard: shard.into(),
        }
    }

    /// The stream the shard belongs to.
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// assert_eq!(LeaseKey::new("orders", "shardId-000000000000").stream(), "orders");
    /// ```
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The shard id, unique within its stream only.
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// assert_eq!(LeaseKey::new("orders", "shardId-000000000001").shard(), "shardId-000000000001");
    /// ```
    #[must_use]
    pub fn shard(&self) -> &str {
        &self.shard
    }
}

/// `stream:shard`, the `lease_key` of the shard's row. A stream name holds no colon, so the form
/// is unambiguous.
impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.stream, self.shard)
    }
}

/// The row of `partition_key` on the shard of `shard`: `stream:shard:partition-key`. A shard's
/// own row has one colon, a key's row two or more, so the two never meet.
///
/// ```
/// use kinesis_checkpoint::LeaseKey;
/// use kinesis_checkpoint::store::row_key;
///
/// let row = row_key(&LeaseKey::new("orders", "shardId-000000000000"), "customer-7");
/// assert_eq!(row.to_string(), "orders:shardId-000000000000:customer-7");
/// ```
#[must_use]
pub fn row_key(shard: &LeaseKey, partition_key: &str) -> LeaseKey {
    LeaseKey::new(shard.stream(), format!("{}:{partition_key}", shard.shard()))
}
