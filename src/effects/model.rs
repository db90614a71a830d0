//! [`Tables`]: `DynamoDB` tables in memory, for the memory store's transactions.
//!
//! The memory store commits a record's writes with the checkpoint under one lock, as
//! `TransactWriteItems` does, so the simulations can count effects: how often each item was
//! written, not only how often a handler ran. It understands the expressions a handler of
//! records usually writes, on top-level attributes: conditions with `attribute_exists`,
//! `attribute_not_exists`, the six comparisons, `AND`, `OR`, `NOT` and parentheses; updates with
//! `SET a = v`, `SET a = a + v` (or `-`), `if_not_exists(a, v)`, `ADD` and `REMOVE`. Anything
//! else is refused with [`Unsupported`], never guessed at.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

use super::write::{ItemId, Write};

/// One item: its attributes.
pub type Item = HashMap<String, AttributeValue>;

/// An expression the memory store's tables cannot evaluate.
///
/// ```
/// use kinesis_checkpoint::effects::Unsupported;
///
/// let error = Unsupported { expression: "SET a.b = :v".into(), reason: "a nested path".into() };
/// assert!(error.to_string().contains("SET a.b = :v"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the memory store cannot evaluate '{expression}': {reason}")]
pub struct Unsupported {
    /// The expression.
    pub expression: String,
    /// What in it is not understood.
    pub reason: String,
}

/// Why [`Tables::apply`] wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The action at this index failed its condition.
    Condition(usize),
    /// An expression is beyond this model.
    Unsupported(Unsupported),
}

/// Tables of items, keyed by [`ItemId`]; how many times each item was written.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tables {
    items: BTreeMap<ItemId, Item>,
    writes: BTreeMap<ItemId, u64>,
}

impl Tables {
    pub(crate) fn item(&self, id: &ItemId) -> Option<&Item> {
        self.items.get(id)
    }

    pub(crate) fn items(&self, table: &str) -> Vec<Item> {
        self.items
            .iter()
            .filter(|(id, _)| id.table() == table)
            .map(|(_, item)| item.clone())
            .collect()
    }

    pub(crate) fn writes_of(&self, id: &ItemId) -> u64 {
        self.writes.get(id).copied().unwrap_or(0)
    }

    /// Checks every action's condition against the tables as they are, then applies them all;
    /// or applies none.
    pub(crate) fn apply(&mut self, writes: &[Write]) -> Result<(), Refused> {
        let mut next = Vec::with_capacity(writes.len());
        for (index, write) in writes.iter().enumerate() {
            let current = self.items.get(write.item());
            let (condition, names, values) = parts(write.action());
            if let Some(condition) = condition {
                let holds = Expr::new(condition, names, values)
                    .condition(current)
                    .map_err(Refused::Unsupported)?;
                if !holds {
                    return Err(Refused::Condition(index));
                }
            }
            next.push(after(write.action(), current).map_err(Refused::Unsupported)?);
        }
        for (write, item) in writes.iter().zip(next) {
            let id = write.item().clone();
            match item {
                Change::Keep => continue,
                Change::Delete => {
                    self.items.remove(&id);
                }
                Change::Put(item) => {
                    self.items.insert(id.clone(), item);
                }
            }
            *self.writes.entry(id).or_default() += 1;
        }
        Ok(())
    }
}

enum Change {
    Keep,
    Delete,
    Put(Item),
}

type Names = Option<HashMap<String, String>>;
type Values = Option<HashMap<String, AttributeValue>>;

fn parts(action: &TransactWriteItem) -> (Option<&str>, Option<&Names>, Option<&Values>) {
    if let Some(put) = &action.put {
        (
            put.condition_expression.as_deref(),
            Some(&put.expression_attribute_names),
            Some(&put.expression_attribute_values),
        )
    } else if let Some(update) = &action.update {
        (
            update.condition_expression.as_deref(),
            Some(&update.expression_attribute_names),
            Some(&update.expression_attribute_values),
        )
    } else if let Some(delete) = &action.delete {
        (
            delete.condition_expression.as_deref(),
            Some(&delete.expression_attribute_names),
            Some(&delete.expression_attribute_values),
        )
    } else if let Some(check) = &action.condition_check {
        (
            Some(check.condition_expression.as_str()),
            Some(&check.expression_attribute_names),
            Some(&check.expression_attribute_values),
        )
    } else {
        (None, None, None)
    }
}

fn after(action: &TransactWriteItem, current: Option<&Item>) -> Result<Change, Unsupported> {
    if let Some(put) = &action.put {
        return Ok(Change::Put(put.item.clone()));
    }
    if action.delete.is_some() {
        return Ok(Change::Delete);
    }
    let Some(update) = &action.update else {
        return Ok(Change::Keep);
    };
    let mut item = current.cloned().unwrap_or_else(|| update.key.clone());
    Expr::new(
        &update.update_expression,
        Some(&update.expression_attribute_names),
        Some(&update.expression_attribute_values),
    )
    .update(&mut item)?;
    Ok(Change::Put(item))
}

/// One expression, tokenised, with the names and values it refers to.
struct Expr<'a> {
    text: &'a str,
    tokens: Vec<String>,
    at: usize,
    names: Option<&'a HashMap<String, String>>,
    values: Option<&'a HashMap<String, AttributeValue>>,
}

impl<'a> Expr<'a> {
    fn new(text: &'a str, names: Option<&'a Names>, values: Option<&'a Values>) -> Self {
        Self {
            text,
            tokens: tokenize(text),
            at: 0,
            names: names.and_then(Option::as_ref),
            values: values.and_then(Option::as_ref),
        }
    }

    fn unsupported(&self, reason: impl Into<String>) -> Unsupported {
        Unsupported {
            expression: self.text.to_owned(),
            reason: reason.into(),
        }
    }

    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.at).map(String::as_str)
    }

    fn next(&mut self) -> Option<String> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn expect(&mut self, wanted: &str) -> Result<(), Unsupported> {
        match self.next() {
            Some(token) if token.eq_ignore_ascii_case(wanted) => Ok(()),
            other => Err(self.unsupported(format!("expected '{wanted}', found {other:?}"))),
        }
    }

    fn keyword(&mut self, wanted: &str) -> bool {
        let found = self.peek().is_some_and(|t| t.eq_ignore_ascii_case(wanted));
        if found {
            self.at += 1;
        }
        found
    }

    fn condition(mut self, item: Option<&Item>) -> Result<bool, Unsupported> {
        let holds = self.or(item)?;
        match self.peek() {
            None => Ok(holds),
            Some(rest) => Err(self.unsupported(format!("unexpected '{rest}'"))),
        }
    }

    fn or(&mut self, item: Option<&Item>) -> Result<bool, Unsupported> {
        let mut holds = self.and(item)?;
        while self.keyword("OR") {
            holds |= self.and(item)?;
        }
        Ok(holds)
    }

    fn and(&mut self, item: Option<&Item>) -> Result<bool, Unsupported> {
        let mut holds = self.not(item)?;
        while self.keyword("AND") {
            holds &= self.not(item)?;
        }
        Ok(holds)
    }

    fn not(&mut self, item: Option<&Item>) -> Result<bool, Unsupported> {
        if self.keyword("NOT") {
            return Ok(!self.not(item)?);
        }
        if self.peek() == Some("(") {
            self.at += 1;
            let holds = self.or(item)?;
            self.expect(")")?;
            return Ok(holds);
        }
        let first = self
            .next()
            .ok_or_else(|| self.unsupported("it ends early"))?;
        if first == "attribute_exists" || first == "attribute_not_exists" {
            self.expect("(")?;
            let name = self.path()?;
            self.expect(")")?;
            let exists = item.is_some_and(|item| item.contains_key(&name));
            return Ok(exists == (first == "attribute_exists"));
        }
        self.at -= 1;
        let left = self.operand(item)?;
        let operator = self
            .next()
            .ok_or_else(|| self.unsupported("it ends early"))?;
        let right = self.operand(item)?;
        let ordering = match (&left, &right) {
            (Some(left), Some(right)) => compare(left, right),
            _ => None,
        };
        Ok(match operator.as_str() {
            "=" => ordering == Some(Ordering::Equal),
            "<>" => ordering != Some(Ordering::Equal),
            "<" => ordering == Some(Ordering::Less),
            "<=" => matches!(ordering, Some(Ordering::Less | Ordering::Equal)),
            ">" => ordering == Some(Ordering::Greater),
            ">=" => matches!(ordering, Some(Ordering::Greater | Ordering::Equal)),
            other => return Err(self.unsupported(format!("the operator '{other}'"))),
        })
    }

    /// A top-level attribute name, its `#placeholder` resolved.
    fn path(&mut self) -> Result<String, Unsupported> {
        let token = self
            .next()
            .ok_or_else(|| self.unsupported("it ends early"))?;
        if self.peek().is_some_and(|t| t == "." || t == "[") {
            return Err(self.unsupported("a nested path"));
        }
        if let Some(placeholder) = token.strip_prefix('#') {
            let _ = placeholder;
            return self
                .names
                .and_then(|names| names.get(&token))
                .cloned()
                .ok_or_else(|| self.unsupported(format!("no name for {token}")));
        }
        if token.starts_with(':') || !is_name(&token) {
            return Err(self.unsupported(format!("'{token}' is not an attribute name")));
        }
        Ok(token)
    }

    fn value(&self, token: &str) -> Result<AttributeValue, Unsupported> {
        self.values
            .and_then(|values| values.get(token))
            .cloned()
            .ok_or_else(|| self.unsupported(format!("no value for {token}")))
    }

    /// A value or an attribute's (`None` when the item lacks it).
    fn operand(&mut self, item: Option<&Item>) -> Result<Option<AttributeValue>, Unsupported> {
        match self.peek() {
            Some(token) if token.starts_with(':') => {
                let token = token.to_owned();
                self.at += 1;
                self.value(&token).map(Some)
            }
            Some("if_not_exists") => {
                self.at += 1;
                self.expect("(")?;
                let name = self.path()?;
                self.expect(",")?;
                let fallback = self.operand(item)?;
                self.expect(")")?;
                Ok(item.and_then(|item| item.get(&name)).cloned().or(fallback))
            }
            _ => {
                let name = self.path()?;
                Ok(item.and_then(|item| item.get(&name)).cloned())
            }
        }
    }

    fn update(mut self, item: &mut Item) -> Result<(), Unsupported> {
        let before = item.clone();
        while let Some(clause) = self.next() {
            match clause.to_ascii_uppercase().as_str() {
                "SET" => loop {
                    let name = self.path()?;
                    self.expect("=")?;
                    let mut value = self.operand(Some(&before))?;
                    if let Some(sign @ ("+" | "-")) = self.peek() {
                        let negative = sign == "-";
                        self.at += 1;
                        let other = self.operand(Some(&before))?;
                        value = Some(self.arithmetic(value, other, negative)?);
                    }
                    let value = value.ok_or_else(|| {
                        self.unsupported(format!("the value set into '{name}' does not exist"))
                    })?;
                    item.insert(name, value);
                    if !self.keyword(",") {
                        break;
                    }
                },
                "ADD" => loop {
                    let name = self.path()?;
                    let token = self.next().unwrap_or_default();
                    let value = self.value(&token)?;
                    let sum = match (before.get(&name), value) {
                        (None, value) => value,
                        (Some(AttributeValue::Ss(old)), AttributeValue::Ss(new)) => {
                            let mut set = old.clone();
                            set.extend(new.into_iter().filter(|v| !old.contains(v)));
                            AttributeValue::Ss(set)
                        }
                        (Some(old), new) => self.arithmetic(Some(old.clone()), Some(new), false)?,
                    };
                    item.insert(name, sum);
                    if !self.keyword(",") {
                        break;
                    }
                },
                "REMOVE" => loop {
                    let name = self.path()?;
                    item.remove(&name);
                    if !self.keyword(",") {
                        break;
                    }
                },
                other => return Err(self.unsupported(format!("the clause '{other}'"))),
            }
        }
        Ok(())
    }

    fn arithmetic(
        &self,
        left: Option<AttributeValue>,
        right: Option<AttributeValue>,
        negative: bool,
    ) -> Result<AttributeValue, Unsupported> {
        let (Some(AttributeValue::N(left)), Some(AttributeValue::N(right))) = (left, right) else {
            return Err(self.unsupported("arithmetic on something that is not a number"));
        };
        let (Ok(left), Ok(right)) = (left.parse::<i128>(), right.parse::<i128>()) else {
            return Err(self.unsupported("arithmetic on a number that is not whole"));
        };
        let result = if negative {
            left.checked_sub(right)
        } else {
            left.checked_add(right)
        };
        result
            .map(|n| AttributeValue::N(n.to_string()))
            .ok_or_else(|| self.unsupported("the number overflows"))
    }
}

fn is_name(token: &str) -> bool {
    token
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if "(),.[]=+-".contains(c) {
            tokens.push(c.to_string());
            i += 1;
        } else if c == '<' || c == '>' {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            if matches!(two.as_str(), "<=" | ">=" | "<>") {
                tokens.push(two);
                i += 2;
            } else {
                tokens.push(c.to_string());
                i += 1;
            }
        } else {
            let start = i;
            while i < chars.len() && !chars[i].is_whitespace() && !"(),.[]=+-<>".contains(chars[i])
            {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        }
    }
    tokens
}

fn compare(left: &AttributeValue, right: &AttributeValue) -> Option<Ordering> {
    match (left, right) {
        (AttributeValue::N(a), AttributeValue::N(b)) => {
            let (a, b) = (a.parse::<f64>().ok()?, b.parse::<f64>().ok()?);
            a.partial_cmp(&b)
        }
        (AttributeValue::S(a), AttributeValue::S(b)) => Some(a.cmp(b)),
        (a, b) => (a == b).then_some(Ordering::Equal),
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::{Put, Update};

    use super::*;

    fn n(value: i64) -> AttributeValue {
        AttributeValue::N(value.to_string())
    }

    fn add(id: &str, amount: i64, condition: Option<&str>) -> Write {
        let mut update = Update::builder()
            .table_name("balances")
            .key("id", AttributeValue::S(id.to_owned()))
            .update_expression("SET total = if_not_exists(total, :zero) + :amount ADD writes :one")
            .expression_attribute_values(":amount", n(amount))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1));
        if let Some(condition) = condition {
            update = update
                .condition_expression(condition)
                .expression_attribute_values(":floor", n(-amount));
        }
        Write::update(update.build().unwrap())
    }

    #[test]
    fn updates_add_up_and_every_write_of_an_item_is_counted() {
        let mut tables = Tables::default();
        tables.apply(&[add("a", 5, None)]).unwrap();
        tables.apply(&[add("a", 7, None)]).unwrap();
        let id = add("a", 0, None).item().clone();
        let item = tables.item(&id).unwrap();
        assert_eq!(item["total"], n(12));
        assert_eq!(item["writes"], n(2));
        assert_eq!(item["id"], AttributeValue::S("a".into()));
        assert_eq!(tables.writes_of(&id), 2);
    }

    #[test]
    fn a_failed_condition_names_its_action_and_writes_nothing_of_the_transaction() {
        let mut tables = Tables::default();
        tables.apply(&[add("a", 5, None)]).unwrap();
        let refused = tables.apply(&[
            add("b", 1, None),
            add("a", -10, Some("total >= :floor AND attribute_exists(id)")),
        ]);
        assert_eq!(refused, Err(Refused::Condition(1)));
        assert!(tables.item(add("b", 0, None).item()).is_none());
        // Holds on the item as it is: 5 >= 3.
        tables
            .apply(&[add("a", -3, Some("total >= :floor"))])
            .unwrap();
        assert_eq!(
            tables.item(add("a", 0, None).item()).unwrap()["total"],
            n(2)
        );
    }

    #[test]
    fn a_put_on_condition_of_absence_lands_once() {
        let put = || {
            Write::put(
                Put::builder()
                    .table_name("orders")
                    .item("id", AttributeValue::S("o-1".into()))
                    .condition_expression("attribute_not_exists(#id)")
                    .expression_attribute_names("#id", "id")
                    .build()
                    .unwrap(),
                &["id"],
            )
            .unwrap()
        };
        let mut tables = Tables::default();
        assert_eq!(tables.apply(&[put()]), Ok(()));
        assert_eq!(tables.apply(&[put()]), Err(Refused::Condition(0)));
        assert_eq!(tables.items("orders").len(), 1);
    }

    #[test]
    fn an_expression_beyond_the_model_is_refused_not_guessed() {
        let update = Update::builder()
            .table_name("t")
            .key("id", AttributeValue::S("a".into()))
            .update_expression("SET a.b = :v")
            .expression_attribute_values(":v", n(1))
            .build()
            .unwrap();
        let refused = Tables::default().apply(&[Write::update(update)]);
        assert!(matches!(refused, Err(Refused::Unsupported(u)) if u.reason == "a nested path"));
    }
}
