//! [`Write`] and [`Writes`]: one `DynamoDB` action a record asks for, and all of a record's.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Delete, Put, TransactWriteItem, Update,
};

/// The item an action is on: its table and its key, in a form two actions on the same item
/// compare equal in (`DynamoDB` refuses a transaction with two actions on one item).
///
/// ```
/// use std::collections::HashMap;
///
/// use aws_sdk_dynamodb::types::{AttributeValue, Delete};
/// use kinesis_checkpoint::effects::Write;
///
/// let key = HashMap::from([("id".to_owned(), AttributeValue::N("007".to_owned()))]);
/// let one = Write::delete(Delete::builder().table_name("orders").set_key(Some(key)).build()?);
/// let key = HashMap::from([("id".to_owned(), AttributeValue::N("7".to_owned()))]);
/// let other = Write::delete(Delete::builder().table_name("orders").set_key(Some(key)).build()?);
/// assert_eq!(one.item(), other.item(), "7 and 007 are one number");
/// assert_eq!(one.item().to_string(), "orders {id = 7}");
/// # Ok::<(), aws_sdk_dynamodb::error::BuildError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ItemId {
    table: String,
    /// Each key attribute's name and its value, canonical (a number without leading or
    /// trailing zeros).
    key: BTreeMap<String, String>,
}

impl ItemId {
    /// The item of `table` under `key`.
    #[must_use]
    pub fn new(table: &str, key: &HashMap<String, AttributeValue>) -> Self {
        Self {
            table: table.to_owned(),
            key: key
                .iter()
                .map(|(name, value)| (name.clone(), canonical(value)))
                .collect(),
        }
    }

    /// The table's name.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl fmt::Display for ItemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {{", self.table)?;
        for (index, (name, value)) in self.key.iter().enumerate() {
            let separator = if index == 0 { "" } else { ", " };
            write!(f, "{separator}{name} = {value}")?;
        }
        f.write_str("}")
    }
}

/// A key value as one string: keys are strings, numbers or binary.
fn canonical(value: &AttributeValue) -> String {
    match value {
        AttributeValue::S(text) => format!("{text:?}"),
        AttributeValue::N(number) => canonical_number(number),
        AttributeValue::B(blob) => format!("0x{}", hex(blob.as_ref())),
        other => format!("{other:?}"),
    }
}

/// `number` without a sign on zero, leading zeros or trailing fractional zeros, so that `7`,
/// `07` and `7.0` name one item, as they do in `DynamoDB`.
fn canonical_number(number: &str) -> String {
    let (sign, digits) = number
        .strip_prefix('-')
        .map_or(("", number), |rest| ("-", rest));
    let digits = digits.strip_prefix('+').unwrap_or(digits);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let whole = whole.trim_start_matches('0');
    let fraction = fraction.trim_end_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    if whole == "0" && fraction.is_empty() {
        return "0".to_owned();
    }
    if fraction.is_empty() {
        format!("{sign}{whole}")
    } else {
        format!("{sign}{whole}.{fraction}")
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

/// A [`Write::put`] naming a key attribute its item does not have.
///
/// ```
/// use aws_sdk_dynamodb::types::{AttributeValue, Put};
/// use kinesis_checkpoint::effects::Write;
///
/// let put = Put::builder().table_name("orders").item("total", AttributeValue::N("1".into())).build()?;
/// let error = Write::put(put, &["id"]).unwrap_err();
/// assert_eq!(error.to_string(), "the put into table 'orders' has no key attribute 'id'");
/// # Ok::<(), aws_sdk_dynamodb::error::BuildError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the put into table '{table}' has no key attribute '{attribute}'")]
pub struct MissingKey {
    table: String,
    attribute: String,
}

/// One action a record asks for, on any table: a put, an update, a delete or a condition check,
/// as `DynamoDB`'s [`TransactWriteItem`], with the item it is on.
///
/// ```
/// use aws_sdk_dynamodb::types::{AttributeValue, Update};
/// use kinesis_checkpoint::effects::Write;
///
/// let update = Update::builder()
///     .table_name("balances")
///     .key("account", AttributeValue::S("a-1".into()))
///     .update_expression("ADD balance :amount")
///     .expression_attribute_values(":amount", AttributeValue::N("25".into()))
///     .build()?;
/// let write = Write::update(update);
/// assert_eq!(write.item().table(), "balances");
/// assert!(write.action().update.is_some());
/// # Ok::<(), aws_sdk_dynamodb::error::BuildError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Write {
    action: TransactWriteItem,
    item: ItemId,
    condition: Option<String>,
    bytes: usize,
}

impl Write {
    /// A put of an item whose key attributes are `key` (a put carries the whole item, not which
    /// of its attributes are the key).
    ///
    /// # Errors
    ///
    /// [`MissingKey`] when the item lacks one of `key`.
    pub fn put(put: Put, key: &[&str]) -> Result<Self, MissingKey> {
        let mut key_values = HashMap::new();
        for name in key {
            let Some(value) = put.item.get(*name) else {
                return Err(MissingKey {
                    table: put.table_name.clone(),
                    attribute: (*name).to_owned(),
                });
            };
            key_values.insert((*name).to_owned(), value.clone());
        }
        let item = ItemId::new(&put.table_name, &key_values);
        let condition = put.condition_expression.clone();
        let bytes = put.table_name.len()
            + map_bytes(&put.item)
            + text_bytes(condition.as_deref())
            + names_bytes(put.expression_attribute_names.as_ref())
            + values_bytes(put.expression_attribute_values.as_ref());
        Ok(Self::of(
            TransactWriteItem::builder().put(put).build(),
            item,
            condition,
            bytes,
        ))
    }

    /// An update of the item under the update's key.
    #[must_use]
    pub fn update(update: Update) -> Self {
        let item = ItemId::new(&update.table_name, &update.key);
        let condition = update.condition_expression.clone();
        let bytes = update.table_name.len()
            + map_bytes(&update.key)
            + update.update_expression.len()
            + text_bytes(condition.as_deref())
            + names_bytes(update.expression_attribute_names.as_ref())
            + values_bytes(update.expression_attribute_values.as_ref());
        Self::of(
            TransactWriteItem::builder().update(update).build(),
            item,
            condition,
            bytes,
        )
    }

    /// A delete of the item under the delete's key.
    #[must_use]
    pub fn delete(delete: Delete) -> Self {
        let item = ItemId::new(&delete.table_name, &delete.key);
        let condition = delete.condition_expression.clone();
        let bytes = delete.table_name.len()
            + map_bytes(&delete.key)
            + text_bytes(condition.as_deref())
            + names_bytes(delete.expression_attribute_names.as_ref())
            + values_bytes(delete.expression_attribute_values.as_ref());
        Self::of(
            TransactWriteItem::builder().delete(delete).build(),
            item,
            condition,
            bytes,
        )
    }

    /// A check that the item under the check's key meets its condition: nothing is written, but
    /// the transaction (the record, and the checkpoint past it) commits only if it holds.
    #[must_use]
    pub fn condition_check(check: ConditionCheck) -> Self {
        let item = ItemId::new(&check.table_name, &check.key);
        let condition = Some(check.condition_expression.clone());
        let bytes = check.table_name.len()
            + map_bytes(&check.key)
            + text_bytes(condition.as_deref())
            + names_bytes(check.expression_attribute_names.as_ref())
            + values_bytes(check.expression_attribute_values.as_ref());
        Self::of(
            TransactWriteItem::builder().condition_check(check).build(),
            item,
            condition,
            bytes,
        )
    }

    const fn of(
        action: TransactWriteItem,
        item: ItemId,
        condition: Option<String>,
        bytes: usize,
    ) -> Self {
        Self {
            action,
            item,
            condition,
            bytes,
        }
    }

    /// The action, as `TransactWriteItems` takes it.
    #[must_use]
    pub const fn action(&self) -> &TransactWriteItem {
        &self.action
    }

    /// The item the action is on.
    #[must_use]
    pub const fn item(&self) -> &ItemId {
        &self.item
    }

    /// The action's condition expression, if it has one.
    #[must_use]
    pub fn condition(&self) -> Option<&str> {
        self.condition.as_deref()
    }

    /// How many bytes the action counts for against the transaction's 4 MB: its table name,
    /// key or item, expressions and the names and values they use (an upper bound of what
    /// `DynamoDB` counts).
    #[must_use]
    pub const fn bytes(&self) -> usize {
        self.bytes
    }
}

fn text_bytes(text: Option<&str>) -> usize {
    text.map_or(0, str::len)
}

fn names_bytes(names: Option<&HashMap<String, String>>) -> usize {
    names.map_or(0, |names| {
        names
            .iter()
            .map(|(name, real)| name.len() + real.len())
            .sum()
    })
}

fn values_bytes(values: Option<&HashMap<String, AttributeValue>>) -> usize {
    values.map_or(0, map_bytes)
}

fn map_bytes(map: &HashMap<String, AttributeValue>) -> usize {
    map.iter()
        .map(|(name, value)| name.len() + value_bytes(value))
        .sum()
}

/// A value's size as `DynamoDB` counts it, at most: numbers 21 bytes, one byte of
/// overhead per element of a list or map, 3 per list or map.
fn value_bytes(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) => text.len(),
        AttributeValue::N(number) => number.len().min(21) + 1,
        AttributeValue::B(blob) => blob.as_ref().len(),
        AttributeValue::Ss(texts) => texts.iter().map(String::len).sum(),
        AttributeValue::Ns(numbers) => numbers.iter().map(|n| n.len().min(21) + 1).sum(),
        AttributeValue::Bs(blobs) => blobs.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(list) => 3 + list.iter().map(|v| 1 + value_bytes(v)).sum::<usize>(),
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(k, v)| 1 + k.len() + value_bytes(v))
                .sum::<usize>()
        }
        _ => 1,
    }
}

/// What becomes of a record whose writes are refused by their own condition.
///
/// ```
/// use kinesis_checkpoint::effects::{OnConditionFailed, Writes};
///
/// assert_eq!(Writes::new().condition_failed(), OnConditionFailed::Retry);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnConditionFailed {
    /// A failure for now: the record is reported (its failure counted, and dead-lettered once
    /// out of attempts, as a retry is) and runs again on redelivery, against the table as it
    /// is then.
    #[default]
    Retry,
    /// The record can never succeed: it is dead-lettered (or, without a sink, reported), and
    /// the checkpoint moves past it with nothing of it written.
    Reject,
}

/// All the writes one record asks for, committed with the checkpoint past it or not at all.
///
/// ```
/// use aws_sdk_dynamodb::types::{AttributeValue, Put};
/// use kinesis_checkpoint::effects::{OnConditionFailed, Write, Writes};
///
/// let put = Put::builder()
///     .table_name("orders")
///     .item("id", AttributeValue::S("o-1".into()))
///     .condition_expression("attribute_not_exists(id)")
///     .build()?;
/// let writes = Writes::new()
///     .with(Write::put(put, &["id"])?)
///     .on_condition_failed(OnConditionFailed::Reject);
/// assert_eq!(writes.len(), 1);
/// assert_eq!(writes.condition_failed(), OnConditionFailed::Reject);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Writes {
    writes: Vec<Write>,
    on_condition_failed: OnConditionFailed,
}

impl Writes {
    /// No writes yet: a record that only moves the checkpoint.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            writes: Vec::new(),
            on_condition_failed: OnConditionFailed::Retry,
        }
    }

    /// These writes and `write`.
    #[must_use]
    pub fn with(mut self, write: Write) -> Self {
        self.writes.push(write);
        self
    }

    /// Adds `write`.
    pub fn push(&mut self, write: Write) {
        self.writes.push(write);
    }

    /// What becomes of the record when a write's condition fails (default
    /// [`OnConditionFailed::Retry`]).
    #[must_use]
    pub const fn on_condition_failed(mut self, policy: OnConditionFailed) -> Self {
        self.on_condition_failed = policy;
        self
    }

    /// The policy [`on_condition_failed`](Self::on_condition_failed) set.
    #[must_use]
    pub const fn condition_failed(&self) -> OnConditionFailed {
        self.on_condition_failed
    }

    /// How many actions.
    #[must_use]
    pub const fn len(&self) -> usize {
        self.writes.len()
    }

    /// Whether there are none.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The writes, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Write> {
        self.writes.iter()
    }

    /// The bytes of all the writes (see [`Write::bytes`]).
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.writes.iter().map(Write::bytes).sum()
    }
}

impl From<Write> for Writes {
    fn from(write: Write) -> Self {
        Self::new().with(write)
    }
}

impl FromIterator<Write> for Writes {
    fn from_iter<I: IntoIterator<Item = Write>>(iter: I) -> Self {
        Self {
            writes: iter.into_iter().collect(),
            on_condition_failed: OnConditionFailed::Retry,
        }
    }
}

impl<'a> IntoIterator for &'a Writes {
    type Item = &'a Write;
    type IntoIter = std::slice::Iter<'a, Write>;

    fn into_iter(self) -> Self::IntoIter {
        self.writes.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_that_dynamodb_takes_for_one_are_one_key() {
        for (a, b) in [
            ("7", "007"),
            ("7", "7.00"),
            ("0", "-0.0"),
            ("-1.5", "-01.50"),
        ] {
            assert_eq!(canonical_number(a), canonical_number(b), "{a} and {b}");
        }
        assert_ne!(canonical_number("7"), canonical_number("70"));
    }

    #[test]
    fn a_string_key_and_a_number_key_of_the_same_text_are_two_items() {
        let s = HashMap::from([("id".to_owned(), AttributeValue::S("7".into()))]);
        let n = HashMap::from([("id".to_owned(), AttributeValue::N("7".into()))]);
        assert_ne!(ItemId::new("t", &s), ItemId::new("t", &n));
        assert_ne!(ItemId::new("t", &s), ItemId::new("u", &s));
    }
}
