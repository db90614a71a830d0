//! What the partition-key mode's gate has learnt of a closed parent, kept for the life of the
//! process.
//!
//! In the partition-key mode no shard checkpoint says how far a parent got: the gate must check
//! each of the parent's records against its key's row. Reading the whole parent again for every
//! held batch of a child would cost time and memory without bound (a parent may hold a day of
//! records), so the gate keeps, per closed parent, only the last position of each partition key
//! and the keys already found done (a key's checkpoint only moves on, so a key done stays
//! done). A closed shard never changes, so what was read stays true. The parent is read in
//! parts of at most [`MAX_RECORDS_PER_CHECK`] records per held batch, continuing where the
//! last part ended; a key known not to be done holds the child at once, without reading on.
//! A part whose keys are all done ([`ParentScan::done_through`]) is recorded in the parent's
//! row as its checkpoint by the child's invocation, since another process (a new sandbox)
//! knows nothing of this one's reading: a scan begun afresh reads after that checkpoint
//! ([`ParentScan::starting_after`]).

use std::collections::{HashMap, HashSet};

use super::topology::{Topology, TopologyError};
use crate::gap::{CannotRead, ReadBudget, ReadFrom, SkippedRange};
use crate::key::LeaseKey;
use crate::sequence::{Position, SequenceNumber};

/// The most records of a closed parent one check reads: one held batch never reads more.
pub(crate) const MAX_RECORDS_PER_CHECK: usize = 10_000;

/// What is known of one closed parent.
#[derive(Debug, Default)]
pub(crate) struct ParentScan {
    /// The last position of each partition key among the records read so far.
    pub(crate) ends: HashMap<String, Position>,
    /// The keys whose row covers their last record.
    pub(crate) done: HashSet<String>,
    /// The last record read: the next part is read after it.
    read_to: Option<SequenceNumber>,
    /// Whether the parent has been read to its end.
    pub(crate) complete: bool,
}

impl ParentScan {
    /// A scan of a parent whose row's checkpoint is `checkpoint`: every record up to it is done
    /// (whatever its key), so a scan begun afresh (a new process) reads after it.
    pub(crate) fn starting_after(&mut self, checkpoint: Option<&Position>) {
        if let (
            None,
            Some(Position::Record {
                sequence,
                sub_sequence: None,
            }),
        ) = (&self.read_to, checkpoint)
        {
            self.read_to = Some(sequence.clone());
        }
    }

    /// The last record read, when every key read so far is done: every record of the parent
    /// up to it is done, and a scan afresh need not read it again.
    pub(crate) fn done_through(&self) -> Option<&SequenceNumber> {
        self.read_to
            .as_ref()
            .filter(|_| !self.complete && self.ends.keys().all(|key| self.done.contains(key)))
    }

    /// The keys with records not known to be done, in order (sorted, for a stable read).
    pub(crate) fn pending(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self
            .ends
            .keys()
            .filter(|key| !self.done.contains(*key))
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Reads the next part of `parent` (all of it when the topology can only read a shard
    /// whole) and learns the last position of each key in it.
    pub(crate) async fn read_on(
        &mut self,
        topology: &dyn Topology,
        parent: &LeaseKey,
    ) -> Result<(), TopologyError> {
        let range = SkippedRange {
            from: self
                .read_to
                .clone()
                .map_or(ReadFrom::TrimHorizon, ReadFrom::After),
            before: end_of_everything(),
        };
        let budget = ReadBudget::new(MAX_RECORDS_PER_CHECK, None);
        let (records, complete) = match topology
            .read_range(parent.stream(), parent.shard(), &range, budget)
            .await
        {
            Ok(read) => (read.records, read.complete),
            Err(error) if error.downcast_ref::<CannotRead>().is_some() => {
                self.ends.clear();
                (
                    topology.records(parent.stream(), parent.shard()).await?,
                    true,
                )
            }
            Err(error) => return Err(error),
        };
        if let Some(last) = records.last() {
            self.read_to = Some(last.sequence().clone());
        }
        for record in records {
            let records = match crate::kpl::deaggregate(record) {
                Ok(records) => records.into_records(),
                Err(error) => vec![error.into_record()],
            };
            for record in records {
                let position = record.position();
                self.ends
                    .entry(record.routing_key().to_owned())
                    .and_modify(|end| {
                        if position > *end {
                            end.clone_from(&position);
                        }
                    })
                    .or_insert(position);
            }
        }
        self.complete = complete;
        Ok(())
    }
}

/// A sequence number above every record: the largest Kinesis can issue (129 digits).
pub(crate) fn end_of_everything() -> SequenceNumber {
    "9".repeat(129)
        .parse()
        .expect("129 nines is a sequence number")
}

/// A record of `parent` for the gate's message.
pub(crate) fn describe(partition_key: &str, end: &Position) -> String {
    format!("record {end} of partition key {partition_key} is not done")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_everything_is_above_any_real_sequence_number() {
        let real: SequenceNumber = "49656139270218735118962416178386539874290435484610000000"
            .parse()
            .unwrap();
        assert!(end_of_everything() > real);
    }
}
