//! How a run of records' writes is cut into transactions: `TransactWriteItems` holds at most
//! 100 actions and 4 MB, and no two actions on one item.
//!
//! The checkpoint's own action (the lease row's conditional update) takes one of the 100 and
//! its bytes: [`Room`] reserves them. A record's writes are never split, since they commit
//! together or not at all; a chunk ends before the first record that would break a limit,
//! including one that touches an item already in the chunk (two records updating one counter
//! go in two transactions, in order). A record that breaks a limit alone can never commit.

use std::collections::HashSet;

use super::write::{ItemId, Writes};

/// The most actions `TransactWriteItems` takes.
pub const MAX_ACTIONS: usize = 100;
/// The most bytes `TransactWriteItems` takes (4 MB).
pub const MAX_BYTES: usize = 4 * 1024 * 1024;

/// What a transaction has room for besides the checkpoint's action; also what one row's
/// update takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    pub(crate) actions: usize,
    pub(crate) bytes: usize,
}

impl Room {
    /// No room: what a record whose row is already in the chunk adds to it.
    pub(crate) const NONE: Self = Self {
        actions: 0,
        bytes: 0,
    };

    /// The room left beside a checkpoint action of `checkpoint_bytes`.
    pub(crate) const fn beside(checkpoint_bytes: usize) -> Self {
        Self {
            actions: MAX_ACTIONS - 1,
            bytes: MAX_BYTES.saturating_sub(checkpoint_bytes),
        }
    }

    /// A whole transaction: the rows' updates are counted with the records'
    /// ([`next_chunk`]'s `row`).
    pub(crate) const WHOLE: Self = Self {
        actions: MAX_ACTIONS,
        bytes: MAX_BYTES,
    };
}

/// Why one record's writes can never commit in one transaction with the checkpoint.
///
/// ```
/// use kinesis_checkpoint::effects::TooLarge;
///
/// let error = TooLarge::Actions(120);
/// assert!(error.to_string().contains("120 actions"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TooLarge {
    /// More actions than a transaction holds beside the checkpoint's (99).
    #[error("the record asks for {0} actions; a transaction holds 99 beside the checkpoint's")]
    Actions(usize),
    /// More bytes than a transaction holds beside the checkpoint's.
    #[error("the record's writes count {0} bytes; a transaction holds 4 MB with the checkpoint")]
    Bytes(usize),
    /// Two of the record's own actions are on one item, which `DynamoDB` refuses.
    #[error("the record asks for two actions on one item: {0}")]
    SameItem(ItemId),
}

/// How many of `records` (at least one) the next transaction takes, in order; `Err` when the
/// first alone can never fit. `row` says what each record adds beside its writes: the update
/// of its row, when the chunk does not hold that row yet (the partition-key mode's rows);
/// [`Room::NONE`] when the chunk's one row is reserved in `room` (the shard mode's).
pub(crate) fn next_chunk(
    records: &[Option<&Writes>],
    room: Room,
    mut row: impl FnMut(usize) -> Room,
) -> Result<usize, TooLarge> {
    let mut actions = 0;
    let mut bytes = 0;
    let mut items: HashSet<&ItemId> = HashSet::new();
    for (index, writes) in records.iter().enumerate() {
        let Some(writes) = writes else {
            continue;
        };
        let extra = row(index);
        let more_actions = writes.len() + extra.actions;
        let more_bytes = writes.bytes() + extra.bytes;
        let mut own: HashSet<&ItemId> = HashSet::new();
        let mut twice = None;
        for write in *writes {
            if !own.insert(write.item()) {
                twice.get_or_insert(write.item());
            }
        }
        let fits = actions + more_actions <= room.actions
            && bytes + more_bytes <= room.bytes
            && twice.is_none()
            && own.is_disjoint(&items);
        if !fits {
            if index > 0 {
                return Ok(index);
            }
            return Err(if let Some(item) = twice {
                TooLarge::SameItem(item.clone())
            } else if more_actions > room.actions {
                TooLarge::Actions(writes.len())
            } else {
                TooLarge::Bytes(writes.bytes())
            });
        }
        actions += more_actions;
        bytes += more_bytes;
        items.extend(own);
    }
    Ok(records.len())
}

/// The `ClientRequestToken` of the transaction that commits the records from `first` to
/// `last` of the shard `row` under the lease taken at `counter`: the same for a retry of the
/// same transaction, which `DynamoDB` then applies once (within 10 minutes), and different for
/// any other (another range, another claim). 34 characters of the 36 allowed.
pub(crate) fn token(row: &str, counter: u64, first: &str, last: &str) -> String {
    let text = format!("{row}\u{0}{counter}\u{0}{first}\u{0}{last}");
    let high = fnv1a(text.as_bytes(), 0xcbf2_9ce4_8422_2325);
    let low = fnv1a(text.as_bytes(), 0x6c62_272e_07bb_0142);
    format!("kc{high:016x}{low:016x}")
}

/// FNV-1a, 64 bits, from `basis`: stable across builds and platforms, unlike `std`'s hasher.
fn fnv1a(bytes: &[u8], basis: u64) -> u64 {
    bytes.iter().fold(basis, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use aws_sdk_dynamodb::types::{AttributeValue, Update};

    use super::*;
    use crate::effects::Write;

    fn update(table: &str, id: &str, padding: usize) -> Write {
        Write::update(
            Update::builder()
                .table_name(table)
                .set_key(Some(HashMap::from([(
                    "id".to_owned(),
                    AttributeValue::S(id.to_owned()),
                )])))
                .update_expression("SET pad = :pad")
                .expression_attribute_values(":pad", AttributeValue::S("x".repeat(padding)))
                .build()
                .unwrap(),
        )
    }

    fn one(table: &str, id: &str) -> Writes {
        Writes::from(update(table, id, 0))
    }

    const ROOM: Room = Room {
        actions: MAX_ACTIONS - 1,
        bytes: MAX_BYTES - 200,
    };

    #[test]
    fn ninety_nine_single_write_records_fill_a_transaction_beside_the_checkpoint() {
        let records: Vec<Writes> = (0..250).map(|i| one("t", &i.to_string())).collect();
        let refs: Vec<Option<&Writes>> = records.iter().map(Some).collect();
        assert_eq!(next_chunk(&refs, ROOM, |_| Room::NONE), Ok(99));
        assert_eq!(next_chunk(&refs[99..], ROOM, |_| Room::NONE), Ok(99));
        assert_eq!(next_chunk(&refs[198..], ROOM, |_| Room::NONE), Ok(52));
    }

    #[test]
    fn records_without_writes_take_no_room() {
        let records: Vec<Option<Writes>> = (0..300)
            .map(|i| (i % 4 == 0).then(|| one("t", &i.to_string())))
            .collect();
        let refs: Vec<Option<&Writes>> = records.iter().map(Option::as_ref).collect();
        assert_eq!(
            next_chunk(&refs, ROOM, |_| Room::NONE),
            Ok(300),
            "75 writes"
        );
        let records: Vec<Option<Writes>> = (0..300)
            .map(|i| (i % 3 == 0).then(|| one("t", &i.to_string())))
            .collect();
        let refs: Vec<Option<&Writes>> = records.iter().map(Option::as_ref).collect();
        assert_eq!(
            next_chunk(&refs, ROOM, |_| Room::NONE),
            Ok(297),
            "the 100th write, record 297, waits"
        );
    }

    #[test]
    fn a_chunk_ends_before_a_record_that_touches_an_item_already_in_it() {
        let records = [one("t", "a"), one("t", "b"), one("t", "a"), one("t", "c")];
        let refs: Vec<Option<&Writes>> = records.iter().map(Some).collect();
        assert_eq!(next_chunk(&refs, ROOM, |_| Room::NONE), Ok(2));
        assert_eq!(next_chunk(&refs[2..], ROOM, |_| Room::NONE), Ok(2));
        // The same key in another table is another item.
        let records = [one("t", "a"), one("u", "a")];
        let refs: Vec<Option<&Writes>> = records.iter().map(Some).collect();
        assert_eq!(next_chunk(&refs, ROOM, |_| Room::NONE), Ok(2));
    }

    #[test]
    fn a_chunk_ends_before_the_record_that_would_pass_four_megabytes() {
        let big = 1_500_000;
        let records: Vec<Writes> = (0..4)
            .map(|i| Writes::from(update("t", &i.to_string(), big)))
            .collect();
        let refs: Vec<Option<&Writes>> = records.iter().map(Some).collect();
        assert_eq!(next_chunk(&refs, ROOM, |_| Room::NONE), Ok(2));
    }

    #[test]
    fn a_record_that_breaks_a_limit_alone_is_refused_with_the_limit_it_breaks() {
        let many: Writes = (0..100).map(|i| update("t", &i.to_string(), 0)).collect();
        assert_eq!(
            next_chunk(&[Some(&many)], ROOM, |_| Room::NONE),
            Err(TooLarge::Actions(100))
        );
        let twice: Writes = [update("t", "a", 0), update("t", "a", 0)]
            .into_iter()
            .collect();
        let Err(TooLarge::SameItem(item)) = next_chunk(&[Some(&twice)], ROOM, |_| Room::NONE)
        else {
            panic!("two actions on one item");
        };
        assert_eq!(item.to_string(), "t {id = \"a\"}");
        let huge = Writes::from(update("t", "a", MAX_BYTES));
        assert!(matches!(
            next_chunk(&[Some(&huge)], ROOM, |_| Room::NONE),
            Err(TooLarge::Bytes(_))
        ));
        // Behind another record, the same record only ends the chunk.
        let fine = one("t", "z");
        assert_eq!(
            next_chunk(&[Some(&fine), Some(&many)], ROOM, |_| Room::NONE),
            Ok(1)
        );
    }

    #[test]
    fn the_token_is_the_same_for_the_same_range_and_claim_and_differs_otherwise() {
        let a = token("s:shard-0", 4, "10", "20");
        assert_eq!(a, token("s:shard-0", 4, "10", "20"));
        assert_eq!(a.len(), 34);
        assert!(a.len() <= 36, "DynamoDB takes 36 characters at most");
        for other in [
            token("s:shard-1", 4, "10", "20"),
            token("s:shard-0", 5, "10", "20"),
            token("s:shard-0", 4, "10", "21"),
            token("s:shard-0", 4, "1", "020"),
        ] {
            assert_ne!(a, other);
        }
    }
}
