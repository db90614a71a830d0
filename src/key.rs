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
/// serves every stream. The key is shared: each record of a batch carries its key, and a clone
/// is one reference count.
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
#[derive(Clone)]
pub struct LeaseKey {
    /// `stream:shard`, in one shared block: a record's key is cloned when the record is read
    /// and released with it, and with two blocks (stream and shard) that was four atomic
    /// reference counts per record (the `processor` bench).
    joined: Arc<str>,
    /// Where the stream ends in `joined`: the index of the colon after it. Either part may
    /// hold colons of its own (a partition key's row does, see [`row_key`]): this index, not
    /// the text, tells the parts apart.
    stream_len: usize,
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
    pub fn new(stream: impl AsRef<str>, shard: impl AsRef<str>) -> Self {
        let (stream, shard) = (stream.as_ref(), shard.as_ref());
        let mut joined = String::with_capacity(stream.len() + 1 + shard.len());
        joined.push_str(stream);
        joined.push(':');
        joined.push_str(shard);
        Self {
            joined: Arc::from(joined),
            stream_len: stream.len(),
        }
    }

    /// The key a row is stored under, read back: `stream:shard`, where a `DynamoDB` stream's
    /// name is its ARN (colons included) and a shard id starts with `shardId-`. `None` for a
    /// text without a colon (a bare shard id).
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// let key = LeaseKey::parse("orders:shardId-000000000001").unwrap();
    /// assert_eq!((key.stream(), key.shard()), ("orders", "shardId-000000000001"));
    /// let arn = "arn:aws:dynamodb:us-east-1:123456789012:table/t/stream/2026-12-07T00:45:33.175";
    /// let key = LeaseKey::parse(&format!("{arn}:shardId-00000001796604333303-f37b0ef0")).unwrap();
    /// assert_eq!(key.stream(), arn);
    /// assert!(LeaseKey::parse("shardId-000000000001").is_none());
    /// ```
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let colon = match text.find(":shardId-") {
            Some(colon) => colon,
            None if text.starts_with("arn:") => text.rfind(':')?,
            None => text.find(':')?,
        };
        Some(Self::new(&text[..colon], &text[colon + 1..]))
    }

    /// The stream the shard belongs to.
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// assert_eq!(LeaseKey::new("orders", "shardId-000000000000").stream(), "orders");
    /// ```
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.joined[..self.stream_len]
    }

    /// The shard id, unique within its stream only.
    ///
    /// ```
    /// # use kinesis_checkpoint::LeaseKey;
    /// assert_eq!(LeaseKey::new("orders", "shardId-000000000001").shard(), "shardId-000000000001");
    /// ```
    #[must_use]
    pub fn shard(&self) -> &str {
        &self.joined[self.stream_len + 1..]
    }
}

/// Equal by their text. The records of one event share their key (the event's reader reads
/// each key once), so two keys holding the same block are equal without comparing text:
/// grouping an event compares every record's key with its group's, and comparing the text was
/// most of it (the `processor` bench).
impl PartialEq for LeaseKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.joined, &other.joined)
            || (self.stream_len == other.stream_len && self.joined == other.joined)
    }
}

impl Eq for LeaseKey {}

/// Hashed by its text, as [`PartialEq`] compares it.
impl std::hash::Hash for LeaseKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.stream().hash(state);
        self.shard().hash(state);
    }
}

/// Ordered by stream, then shard.
impl Ord for LeaseKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.stream(), self.shard()).cmp(&(other.stream(), other.shard()))
    }
}

impl PartialOrd for LeaseKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseKey")
            .field("stream", &self.stream())
            .field("shard", &self.shard())
            .finish()
    }
}

/// `stream:shard`, the `lease_key` of the shard's row. A stream name holds no colon, so the form
/// is unambiguous.
impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.joined)
    }
}

/// The row of `partition_key` on the shard of `shard`: `stream:shard:partition-key`. A shard's
/// own row has one colon, a key's row two or more, so the two never meet.
///
/// ```
/// use kinesis_checkpoint::LeaseKey;
/// use kinesis_checkpoint::internal::row_key;
///
/// let row = row_key(&LeaseKey::new("orders", "shardId-000000000000"), "customer-7");
/// assert_eq!(row.to_string(), "orders:shardId-000000000000:customer-7");
/// ```
#[must_use]
pub fn row_key(shard: &LeaseKey, partition_key: &str) -> LeaseKey {
    LeaseKey::new(shard.stream(), format!("{}:{partition_key}", shard.shard()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_equal_by_their_text_whether_or_not_they_share_it() {
        let key = LeaseKey::new("orders", "shardId-000000000001");
        let shared = key.clone();
        let spelled_again = LeaseKey::new("orders", "shardId-000000000001");
        assert_eq!(key, shared);
        assert_eq!(key, spelled_again);
        assert_ne!(key, LeaseKey::new("orders", "shardId-000000000002"));
        assert_ne!(key, LeaseKey::new("payments", "shardId-000000000001"));
        // The same text split elsewhere is another key.
        assert_ne!(LeaseKey::new("a", "b:c"), LeaseKey::new("a:b", "c"));
    }

    #[test]
    fn a_key_reads_back_its_parts_and_orders_by_stream_then_shard() {
        let key = LeaseKey::new("orders", "shardId-000000000001:customer-7");
        assert_eq!(key.stream(), "orders");
        assert_eq!(key.shard(), "shardId-000000000001:customer-7");
        assert_eq!(key.to_string(), "orders:shardId-000000000001:customer-7");
        assert_eq!(
            format!("{key:?}"),
            r#"LeaseKey { stream: "orders", shard: "shardId-000000000001:customer-7" }"#
        );
        // By the parts, not the joined text: '-' sorts before ':'.
        assert!(LeaseKey::new("a", "z") < LeaseKey::new("a-b", "a"));
        assert!(LeaseKey::new("a", "a") < LeaseKey::new("a", "b"));
    }
}
