//! The memory store's transactions: the records' writes applied to tables in memory, with the
//! checkpoint, under the rows' lock, as `TransactWriteItems` would apply them.

use std::collections::HashMap;
use std::sync::{MutexGuard, PoisonError};

use super::MemoryLeaseStore;
use crate::effects::{Item, ItemId, Refused, Tables};
use crate::key::LeaseKey;
use crate::store::{LeaseError, RowsTransacted, RowsTransaction, Transacted, Transaction};

/// How long a request token is remembered: `DynamoDB`'s 10 minutes.
const TOKEN_MILLIS: u64 = 10 * 60 * 1000;

/// The tables, and the tokens of the transactions committed (with when they lapse).
#[derive(Debug, Default)]
pub(super) struct Effects {
    tables: Tables,
    tokens: HashMap<String, u64>,
    /// Transactions committed (a retried token not counted again).
    committed: u64,
}

impl MemoryLeaseStore {
    fn effects(&self) -> MutexGuard<'_, Effects> {
        // As for the rows: a transaction is applied whole or not at all before the guard drops.
        self.effects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The item of `table` under `key` that transactions wrote, if any.
    ///
    /// ```
    /// use std::collections::HashMap;
    ///
    /// use aws_sdk_dynamodb::types::AttributeValue;
    /// use kinesis_checkpoint::MemoryLeaseStore;
    ///
    /// let store = MemoryLeaseStore::new();
    /// let key = HashMap::from([("id".to_owned(), AttributeValue::S("o-1".into()))]);
    /// assert!(store.item("orders", &key).is_none());
    /// ```
    #[must_use]
    pub fn item(
        &self,
        table: &str,
        key: &HashMap<String, aws_sdk_dynamodb::types::AttributeValue>,
    ) -> Option<Item> {
        self.effects()
            .tables
            .item(&ItemId::new(table, key))
            .cloned()
    }

    /// Every item of `table` that transactions wrote.
    ///
    /// ```
    /// # use kinesis_checkpoint::MemoryLeaseStore;
    /// assert!(MemoryLeaseStore::new().items("orders").is_empty());
    /// ```
    #[must_use]
    pub fn items(&self, table: &str) -> Vec<Item> {
        self.effects().tables.items(table)
    }

    /// How many committed actions wrote the item `id` (a condition check writes nothing): what
    /// a test of exactly-once effects counts.
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use aws_sdk_dynamodb::types::AttributeValue;
    /// use kinesis_checkpoint::effects::ItemId;
    /// # use kinesis_checkpoint::MemoryLeaseStore;
    ///
    /// let key = HashMap::from([("id".to_owned(), AttributeValue::S("o-1".into()))]);
    /// assert_eq!(MemoryLeaseStore::new().writes_of(&ItemId::new("orders", &key)), 0);
    /// ```
    #[must_use]
    pub fn writes_of(&self, id: &ItemId) -> u64 {
        self.effects().tables.writes_of(id)
    }

    /// How many transactions were committed (a retry of one, by its token, not counted again).
    ///
    /// ```
    /// # use kinesis_checkpoint::MemoryLeaseStore;
    /// assert_eq!(MemoryLeaseStore::new().transactions(), 0);
    /// ```
    #[must_use]
    pub fn transactions(&self) -> u64 {
        self.effects().committed
    }

    /// Commits `transaction` under both locks: the rows' first, as every other write takes it.
    pub(super) fn transact_now(
        &self,
        key: &LeaseKey,
        owner: &str,
        transaction: &Transaction,
    ) -> Result<Transacted, LeaseError> {
        let now = self.clock.now_millis();
        let mut rows = self.lock();
        let mut effects = self.effects();
        effects.tokens.retain(|_, lapses| *lapses > now);
        if effects.tokens.contains_key(&transaction.token) {
            // Applied already: a retry after a lost answer.
            return Ok(Transacted::Committed);
        }
        let row = rows.entry(key.clone()).or_default();
        if !Self::owned_by(row, owner) {
            return Ok(Transacted::Fenced);
        }
        match effects.tables.apply(&transaction.writes) {
            Ok(()) => {}
            Err(Refused::Condition(action)) => {
                return Ok(Transacted::Refused {
                    action,
                    reason: "ConditionalCheckFailed".to_owned(),
                });
            }
            Err(Refused::Unsupported(unsupported)) => return Err(Box::new(unsupported)),
        }
        Self::write_commit(row, &transaction.commit, !transaction.commit.keep_lease);
        effects
            .tokens
            .insert(transaction.token.clone(), now.saturating_add(TOKEN_MILLIS));
        effects.committed += 1;
        Ok(Transacted::Committed)
    }

    /// Commits a partition-key transaction under both locks: every row's counter checked
    /// (a fenced row wins over a refused write, as `DynamoDB`'s cancellation reasons are read),
    /// then the writes, then the rows.
    pub(super) fn transact_rows_now(
        &self,
        transaction: &RowsTransaction,
    ) -> Result<RowsTransacted, LeaseError> {
        let now = self.clock.now_millis();
        let mut rows = self.lock();
        let mut effects = self.effects();
        effects.tokens.retain(|_, lapses| *lapses > now);
        if effects.tokens.contains_key(&transaction.token) {
            // Applied already: a retry after a lost answer.
            return Ok(RowsTransacted::Committed);
        }
        let fenced: Vec<usize> = transaction
            .rows
            .iter()
            .enumerate()
            .filter(|(_, commit)| {
                rows.get(&commit.row).map_or(0, |row| row.lease_counter) != commit.expected_counter
            })
            .map(|(index, _)| index)
            .collect();
        if !fenced.is_empty() {
            return Ok(RowsTransacted::Fenced(fenced));
        }
        match effects.tables.apply(&transaction.writes) {
            Ok(()) => {}
            Err(Refused::Condition(action)) => {
                return Ok(RowsTransacted::Refused {
                    action,
                    reason: "ConditionalCheckFailed".to_owned(),
                });
            }
            Err(Refused::Unsupported(unsupported)) => return Err(Box::new(unsupported)),
        }
        for commit in &transaction.rows {
            Self::write_key_commit(rows.entry(commit.row.clone()).or_default(), commit);
        }
        effects
            .tokens
            .insert(transaction.token.clone(), now.saturating_add(TOKEN_MILLIS));
        effects.committed += 1;
        Ok(RowsTransacted::Committed)
    }
}
