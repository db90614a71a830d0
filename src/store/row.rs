//! How a position is written into a lease row and read back out of it.
//!
//! A row's `checkpoint` must name a record done whole, since the seed crate, the KCL and a
//! person reading the table take it for "everything up to here is done", and a writer that
//! knows nothing of KPL rewrites it alone. A position inside a KPL aggregate therefore takes
//! more than one attribute: the record done whole below the aggregate, and the aggregate's own
//! progress beside it, believed only while the aggregate lies above `checkpoint`. This module
//! holds that mapping in one place, for both stores and the engine: reading
//! ([`LeaseState::partial_aggregate`], [`LeaseState::unfinished`]), and writing ([`Below`], and
//! the crate's `RowForm`).

use super::lease::LeaseState;
use crate::sequence::{Position, SequenceError, SequenceNumber};

impl LeaseState {
    /// The shard's parents as the row records them: `None` when the row does not know them
    /// (the gate asks the stream), an empty list when it records that there are none
    /// ([`parentless`](LeaseState::parentless)).
    ///
    /// ```
    /// # use kinesis_checkpoint::store::LeaseState;
    /// let mut state = LeaseState::default();
    /// assert_eq!(state.known_parents(), None);
    /// state.parentless = true;
    /// assert_eq!(state.known_parents(), Some(&[][..]));
    /// state.parent_shards = vec!["shardId-000000000000".to_owned()];
    /// assert_eq!(state.known_parents(), Some(&["shardId-000000000000".to_owned()][..]));
    /// ```
    #[must_use]
    pub fn known_parents(&self) -> Option<&[String]> {
        (self.parentless || !self.parent_shards.is_empty()).then_some(self.parent_shards.as_slice())
    }

    /// The checkpoint in the extended order, or `None` when the shard was never checkpointed.
    ///
    /// # Errors
    ///
    /// A stored checkpoint that is neither a sequence number nor [`SHARD_END`](crate::sequence::SHARD_END): the row was
    /// written by something else, and guessing would skip or replay records.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::sequence::SHARD_END;
    /// # use kinesis_checkpoint::store::LeaseState;
    /// let mut state = LeaseState::default();
    /// assert_eq!(state.position()?, None);
    /// state.checkpoint = Some(SHARD_END.to_owned());
    /// assert_eq!(state.position()?, Some(Position::ShardEnd));
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    pub fn position(&self) -> Result<Option<Position>, SequenceError> {
        Ok(self.partial_aggregate()?.or(self.whole()?))
    }

    /// The record `checkpoint` names as done whole (or [`Position::ShardEnd`]), ignoring any
    /// progress inside an aggregate after it.
    ///
    /// # Errors
    ///
    /// A `checkpoint` that is neither a sequence number nor [`SHARD_END`](crate::sequence::SHARD_END).
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::store::LeaseState;
    /// let mut state = LeaseState::default();
    /// state.checkpoint = Some("7".to_owned());
    /// state.aggregate_sequence = Some("9".to_owned());
    /// state.aggregate_sub = Some(0);
    /// assert_eq!(state.whole()?, Some(Position::record("7".parse()?)));
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    pub fn whole(&self) -> Result<Option<Position>, SequenceError> {
        self.checkpoint
            .as_deref()
            .map(|checkpoint| Position::from_checkpoint(checkpoint, None))
            .transpose()
    }

    /// The position inside a KPL aggregate the row records and believes, if any:
    /// `aggregate_sequence`/`aggregate_sub` while that aggregate lies above `checkpoint`.
    ///
    /// # Errors
    ///
    /// A `checkpoint` or a believed `aggregate_sequence` that is not a sequence number.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::store::LeaseState;
    /// let mut state = LeaseState::default();
    /// state.checkpoint = Some("11".to_owned());
    /// state.aggregate_sequence = Some("12".to_owned());
    /// state.aggregate_sub = Some(3);
    /// assert_eq!(state.partial_aggregate()?, Some(Position::sub_record("12".parse()?, 3)));
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    pub fn partial_aggregate(&self) -> Result<Option<Position>, SequenceError> {
        let whole = self.whole()?;
        let (Some(aggregate), Some(sub)) = (self.aggregate_sequence.as_deref(), self.aggregate_sub)
        else {
            return Ok(None);
        };
        if whole == Some(Position::ShardEnd) {
            return Ok(None);
        }
        let inside = Position::sub_record(aggregate.parse()?, sub);
        // `S/k` sorts below the whole `S`: an aggregate at or below `checkpoint` is stale.
        Ok(whole.is_none_or(|whole| inside > whole).then_some(inside))
    }

    /// What keeps the shard from being exhausted at its checkpoint, although nothing may follow
    /// it in the stream: a partial aggregate, or a failing record above the checkpoint. `None`
    /// when nothing does. The gate finishes a closed parent only when this is `None`.
    ///
    /// ```
    /// # use kinesis_checkpoint::Position;
    /// # use kinesis_checkpoint::store::{FailingRecord, LeaseState};
    /// let mut state = LeaseState::default();
    /// state.checkpoint = Some("12".to_owned());
    /// assert_eq!(state.unfinished(), None);
    /// state.failing = Some(FailingRecord::first(&Position::record("13".parse()?), "boom", 0));
    /// assert!(state.unfinished().unwrap().contains("13"));
    /// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
    /// ```
    #[must_use]
    pub fn unfinished(&self) -> Option<String> {
        let position = match self.position() {
            Ok(position) => position,
            Err(error) => return Some(format!("the checkpoint is unreadable: {error}")),
        };
        if let Some(Position::Record {
            sequence,
            sub_sequence: Some(sub),
        }) = &position
        {
            return Some(format!(
                "KPL aggregate {sequence} is done up to sub-record {sub} only"
            ));
        }
        let failing = self.failing.as_ref()?;
        let failing_at = Position::from_checkpoint(&failing.sequence, failing.sub_sequence).ok();
        // A failing record at or below the checkpoint is stale (another writer moved past it).
        let believed = match (&failing_at, &position) {
            (Some(at), Some(checkpoint)) => at > checkpoint,
            _ => true,
        };
        believed.then(|| {
            format!(
                "record {}{} is failing ({} attempts)",
                failing.sequence,
                failing
                    .sub_sequence
                    .map(|sub| format!("/{sub}"))
                    .unwrap_or_default(),
                failing.attempts
            )
        })
    }
}

/// Which record a row's `checkpoint` attribute names when the position written lies inside a
/// KPL aggregate (`checkpoint` must name a record done whole; see [`LeaseState`]).
///
/// ```
/// use kinesis_checkpoint::internal::Below;
///
/// assert_eq!(Below::default(), Below::Keep);
/// let before: Below = Below::Record("41".parse()?);
/// # Ok::<(), kinesis_checkpoint::sequence::SequenceError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Below {
    /// Leave `checkpoint` as it is: it names a record done whole before the aggregate, or the
    /// shard has none yet.
    #[default]
    Keep,
    /// This record, the last one done whole before the aggregate.
    Record(SequenceNumber),
}

impl Below {
    /// What to write below `position`, given the record `prior` just before its aggregate
    /// (done, since everything below `position` is) and the row as read.
    pub(crate) fn of(
        position: &Position,
        prior: Option<&SequenceNumber>,
        row: &LeaseState,
    ) -> Self {
        let Position::Record {
            sequence,
            sub_sequence: Some(_),
        } = position
        else {
            return Self::Keep;
        };
        match prior.filter(|prior| *prior < sequence) {
            // Never move `checkpoint` back: keep it when it is already at or past `prior`.
            Some(prior)
                if row
                    .whole()
                    .ok()
                    .flatten()
                    .is_none_or(|whole| whole <= Position::record(prior.clone())) =>
            {
                Self::Record(prior.clone())
            }
            _ => Self::Keep,
        }
    }
}

/// A position as a row's attributes hold it: what every store writes, so that all write the
/// same form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowForm<'a> {
    /// `checkpoint`: set to this, or (`None`) left as it is.
    pub(crate) checkpoint: Option<&'a str>,
    /// `aggregate_sequence` and `aggregate_sub`: set, or (`None`) removed.
    pub(crate) aggregate: Option<(&'a str, u64)>,
}

impl<'a> RowForm<'a> {
    pub(crate) fn new(position: &'a Position, below: &'a Below) -> Self {
        match (position, below) {
            (
                Position::Record {
                    sequence,
                    sub_sequence: Some(sub),
                },
                below,
            ) => match below {
                Below::Keep => Self {
                    checkpoint: None,
                    aggregate: Some((sequence.as_str(), *sub)),
                },
                Below::Record(prior) => Self {
                    checkpoint: Some(prior.as_str()),
                    aggregate: Some((sequence.as_str(), *sub)),
                },
            },
            (whole, _) => Self {
                checkpoint: Some(whole.checkpoint()),
                aggregate: None,
            },
        }
    }

    /// Applies the form to a row held in memory.
    pub(crate) fn apply(&self, row: &mut LeaseState) {
        if let Some(checkpoint) = self.checkpoint {
            row.checkpoint = Some(checkpoint.to_owned());
        }
        row.aggregate_sequence = self.aggregate.map(|(sequence, _)| sequence.to_owned());
        row.aggregate_sub = self.aggregate.map(|(_, sub)| sub);
    }
}
