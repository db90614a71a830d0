//! The expressions of an `UpdateItem`, built from the clauses a write needs, and the
//! attribute values they name.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::AttributeValue;

use super::schema::{AGGREGATE_SEQUENCE, AGGREGATE_SUB, FAILING};
use crate::sequence::Position;
use crate::store::memory::millis;
use crate::store::{Below, Commit, FailingChange, FailingRecord, RowForm};

/// The clauses of an `UpdateItem` being built: every write bumps the fencing counter.
#[derive(Default)]
pub(super) struct Clauses {
    pub(super) set: Vec<&'static str>,
    pub(super) remove: Vec<&'static str>,
}

impl Clauses {
    pub(super) fn expression(&self) -> String {
        let mut expression = String::new();
        if !self.set.is_empty() {
            expression.push_str("SET ");
            expression.push_str(&self.set.join(", "));
            expression.push(' ');
        }
        if !self.remove.is_empty() {
            expression.push_str("REMOVE ");
            expression.push_str(&self.remove.join(", "));
            expression.push(' ');
        }
        expression.push_str("ADD lease_counter :one");
        expression
    }
}

/// Adds the clauses that write `position` as the checkpoint, `below` naming the record
/// `checkpoint` holds when the position lies inside an aggregate.
pub(super) fn set_position(
    mut request: UpdateItemFluentBuilder,
    clauses: &mut Clauses,
    position: &Position,
    below: &Below,
) -> UpdateItemFluentBuilder {
    for (name, value) in position_clauses(clauses, &RowForm::new(position, below)) {
        request = request.expression_attribute_values(name, value);
    }
    request
}

/// The clauses of `form`, and the values they name.
pub(super) fn position_clauses(
    clauses: &mut Clauses,
    form: &RowForm<'_>,
) -> Vec<(&'static str, AttributeValue)> {
    let mut values = Vec::with_capacity(3);
    if let Some(checkpoint) = form.checkpoint {
        clauses.set.push("checkpoint = :seq");
        values.push((":seq", AttributeValue::S(checkpoint.to_owned())));
    }
    match form.aggregate {
        Some((sequence, sub)) => {
            clauses.set.extend([
                "aggregate_sequence = :aggregate",
                "aggregate_sub = :aggregate_sub",
            ]);
            values.push((":aggregate", AttributeValue::S(sequence.to_owned())));
            values.push((":aggregate_sub", AttributeValue::N(sub.to_string())));
        }
        None => clauses.remove.extend([AGGREGATE_SEQUENCE, AGGREGATE_SUB]),
    }
    values
}

/// Adds the clauses that write the parents `commit` learnt: listed in `parent_shards`, or
/// recorded as none (`parentless`); nothing when it learnt nothing.
pub(super) fn set_parents(
    mut request: UpdateItemFluentBuilder,
    clauses: &mut Clauses,
    commit: &Commit,
) -> UpdateItemFluentBuilder {
    for (name, value) in parents_clauses(clauses, commit) {
        request = request.expression_attribute_values(name, value);
    }
    request
}

/// The clauses of the parents `commit` learnt, and the values they name: what every write of a
/// commit (one `UpdateItem`, or a transaction's) adds.
pub(super) fn parents_clauses(
    clauses: &mut Clauses,
    commit: &Commit,
) -> Vec<(&'static str, AttributeValue)> {
    if !commit.parent_shards.is_empty() {
        clauses.set.push("parent_shards = :parents");
        vec![(":parents", AttributeValue::Ss(commit.parent_shards.clone()))]
    } else if commit.parentless {
        clauses.set.push("parentless = :parentless");
        vec![(":parentless", AttributeValue::Bool(true))]
    } else {
        Vec::new()
    }
}

/// Adds the clauses and values that apply `change` to the failing record.
pub(super) fn set_failing(
    request: UpdateItemFluentBuilder,
    clauses: &mut Clauses,
    change: &FailingChange,
) -> UpdateItemFluentBuilder {
    match change {
        FailingChange::Keep => request,
        FailingChange::Clear => {
            clauses.remove.push(FAILING);
            request
        }
        FailingChange::Set(failing) => {
            clauses.set.push("failing = :failing");
            request.expression_attribute_values(":failing", failing_item(failing))
        }
    }
}

/// The `failing` map of a row.
pub(super) fn failing_item(failing: &FailingRecord) -> AttributeValue {
    let mut map = HashMap::from([
        (
            "sequence".to_owned(),
            AttributeValue::S(failing.sequence.clone()),
        ),
        (
            "attempts".to_owned(),
            AttributeValue::N(failing.attempts.to_string()),
        ),
        (
            "last_error".to_owned(),
            AttributeValue::S(failing.last_error.clone()),
        ),
        (
            "first_failure".to_owned(),
            AttributeValue::N(failing.first_failure.to_string()),
        ),
        (
            "last_failure".to_owned(),
            AttributeValue::N(failing.last_failure.to_string()),
        ),
    ]);
    if let Some(sub) = failing.sub_sequence {
        map.insert(
            "sub_sequence".to_owned(),
            AttributeValue::N(sub.to_string()),
        );
    }
    AttributeValue::M(map)
}

pub(super) fn is_condition_failure<R>(error: &SdkError<UpdateItemError, R>) -> bool {
    error
        .as_service_error()
        .is_some_and(UpdateItemError::is_conditional_check_failed_exception)
}

/// The lease expiry of a lease taken or renewed at `now` (epoch milliseconds) for `ttl`.
pub(super) fn expiry_at(now: u64, ttl: Duration) -> AttributeValue {
    AttributeValue::N(now.saturating_add(millis(ttl)).to_string())
}
