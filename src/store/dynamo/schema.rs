//! The table's attribute names and the conditions every write is made on: a leaf the other
//! files of the store share.

/// The table's partition key: `stream:shard`.
pub(super) const KEY: &str = "lease_key";
pub(super) const OWNER: &str = "lease_owner";
pub(super) const EXPIRY: &str = "lease_expiry";
pub(super) const COUNTER: &str = "lease_counter";
pub(super) const CHECKPOINT: &str = "checkpoint";
pub(super) const AGGREGATE_SEQUENCE: &str = "aggregate_sequence";
pub(super) const AGGREGATE_SUB: &str = "aggregate_sub";
pub(super) const PARENTS: &str = "parent_shards";
/// `true` when the shard has no parents, as the stream said: a string set cannot be empty, and
/// a row without `parent_shards` may not know them yet. Other writers (the seed crate) ignore it.
pub(super) const PARENTLESS: &str = "parentless";
pub(super) const FAILING: &str = "failing";
pub(super) const EXPIRES_AT: &str = "expires_at";
pub(super) const DONE_ABOVE: &str = "done_above";
pub(super) const REPORTED: &str = "reported";
/// Attributes earlier versions wrote and nothing reads any more: the last write of an
/// invocation removes them, so a row sheds them the first time it is used.
pub(super) const OBSOLETE: [&str; 3] = ["contended", "contended_done", "open_marks"];

/// Taking a lease succeeds when it is free, already ours, or expired.
pub(super) const TAKEABLE: &str =
    "attribute_not_exists(lease_owner) OR lease_owner = :me OR lease_expiry < :now";
/// Every other write needs the lease to be ours.
pub(super) const OURS: &str = "lease_owner = :me";
