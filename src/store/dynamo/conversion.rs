//! A row's attributes read back into a [`LeaseState`].

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::schema::{
    AGGREGATE_SEQUENCE, AGGREGATE_SUB, CHECKPOINT, COUNTER, DONE_ABOVE, EXPIRES_AT, EXPIRY,
    FAILING, OWNER, PARENTLESS, PARENTS, REPORTED,
};
use crate::sequence::Position;
use crate::store::{FailingRecord, LeaseState};

/// The row's state; an absent row is the default state.
pub(super) fn state_of(item: Option<&HashMap<String, AttributeValue>>) -> LeaseState {
    let mut state = LeaseState::default();
    let Some(item) = item else {
        return state;
    };
    let string = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
    let number = |name: &str| {
        item.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<u64>().ok())
    };
    state.checkpoint = string(CHECKPOINT);
    state.aggregate_sequence = string(AGGREGATE_SEQUENCE);
    state.aggregate_sub = number(AGGREGATE_SUB);
    state.lease_owner = string(OWNER);
    state.lease_expiry = number(EXPIRY);
    state.lease_counter = number(COUNTER).unwrap_or_default();
    state.parent_shards = item
        .get(PARENTS)
        .and_then(|v| v.as_ss().ok())
        .cloned()
        .unwrap_or_default();
    state.parentless = state.parent_shards.is_empty()
        && item
            .get(PARENTLESS)
            .and_then(|v| v.as_bool().ok())
            .is_some_and(|parentless| *parentless);
    state.failing = item.get(FAILING).and_then(failing_of);
    state.expires_at = number(EXPIRES_AT);
    state.done_above = item
        .get(DONE_ABOVE)
        .and_then(|v| v.as_ss().ok())
        .map(|positions| positions_of(positions))
        .unwrap_or_default();
    state.reported = string(REPORTED).and_then(|member| positions_of(&[member]).pop());
    state
}

/// The positions of a `done_above` set (`sequence` or `sequence/sub`), in order. A member that
/// is not a position was not written by this toolkit: it is ignored, so at worst its record runs
/// again.
pub(super) fn positions_of(members: &[String]) -> Vec<Position> {
    let mut positions: Vec<Position> = members
        .iter()
        .filter_map(|member| {
            let (sequence, sub) = match member.split_once('/') {
                Some((sequence, sub)) => (sequence, Some(sub.parse().ok()?)),
                None => (member.as_str(), None),
            };
            Position::from_checkpoint(sequence, sub).ok()
        })
        .collect();
    positions.sort();
    positions
}

/// The failing record a row's `failing` map holds, if it is readable.
pub(super) fn failing_of(value: &AttributeValue) -> Option<FailingRecord> {
    let map = value.as_m().ok()?;
    let string = |name: &str| map.get(name).and_then(|v| v.as_s().ok()).cloned();
    let number = |name: &str| {
        map.get(name)
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse::<u64>().ok())
    };
    let position = Position::from_checkpoint(&string("sequence")?, number("sub_sequence")).ok()?;
    let mut failing = FailingRecord::first(&position, &string("last_error").unwrap_or_default(), 0);
    failing.attempts = u32::try_from(number("attempts")?).unwrap_or(u32::MAX);
    failing.first_failure = number("first_failure").unwrap_or_default();
    failing.last_failure = number("last_failure").unwrap_or_default();
    Some(failing)
}
