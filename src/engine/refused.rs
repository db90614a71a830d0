//! A record's write refused by its own condition inside a transaction, in either mode: the
//! whole transaction was cancelled, so the record is that failure, named by the table, the
//! key and the condition, and retried or rejected as its writes say.

use std::collections::BTreeMap;

use super::batch::Entry;
use crate::effects::{ConditionFailed, OnConditionFailed, Writes};
use crate::key::LeaseKey;
use crate::report::StopReason;
use crate::sequence::Position;

/// The record whose write at `action` of a transaction (whose writes belong to the records
/// `owners`, indices into `entries`) its condition refused, as the store said (`reason`): its
/// index, why it failed, and whether it is rejected. Its writes are dropped from `staged`.
pub(super) fn refusal(
    (entries, key): (&[Entry], &LeaseKey),
    staged: &mut BTreeMap<Position, Writes>,
    owners: &[usize],
    action: usize,
    reason: &str,
) -> (usize, StopReason, bool) {
    let index = owners[action];
    let entry = &entries[index];
    let writes = staged.remove(&entry.position()).unwrap_or_default();
    let first_of_record = owners.partition_point(|owner| *owner < index);
    let refused = writes.iter().nth(action - first_of_record).map_or_else(
        || ConditionFailed::new(&key.to_string(), None, reason),
        |write| ConditionFailed::of(write, reason),
    );
    tracing::warn!(sequence = %entry.sequence(), %refused, "a record's write was refused by its condition; nothing of its transaction landed");
    let rejected = writes.condition_failed() == OnConditionFailed::Reject;
    let reason = if rejected {
        StopReason::Rejected(refused.to_string())
    } else {
        StopReason::Retry(refused.to_string())
    };
    (index, reason, rejected)
}
