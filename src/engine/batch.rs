//! A batch as the engine holds it: the event's records grouped by shard, in order, KPL
//! aggregates unpacked, and the few questions asked of those entries (where a checkpoint
//! settles, which record precedes an aggregate).
//!
//! Intake ends here. Parsing belongs to [`record`](crate::record) and unpacking to
//! [`kpl`](crate::kpl); this module turns their output into [`Entry`]s, which everything after
//! it (dedupe, dispatch, the checkpoint) reads, and never looks further up.

use crate::event::{MalformedRecord, Parsed, Payloads, Placed, ReadEvent};
use crate::key::LeaseKey;
use crate::record::Record;
use crate::report::{Disposition, PositionSource, RecordReport, ShardReport, StopReason};
use crate::sequence::{Position, SequenceNumber, cmp_record};

/// One item of a shard's batch: a record, or a malformed one that stops the shard where it
/// stands.
///
/// The rare kinds are boxed: a batch's entries are one vector as long as the batch, written
/// and read once per invocation.
pub(crate) enum Entry {
    Record(Record),
    /// A record of a one-shard event whose payload is still in the event: dispatch reads it,
    /// a chunk at a time, from the batch's [`Payloads`]; every stage before it reads only the
    /// position. Only a [`ShardBatch`] that holds its `payloads` holds these, and it reads
    /// them all ([`ShardBatch::read_whole`]) before anything that needs a record's key or
    /// payload but the in-order dispatch.
    Placed(Placed),
    Malformed(Box<(MalformedRecord, SequenceNumber)>),
    AfterMalformed(Record),
    /// A KPL aggregate whose MD5 matches but whose contents cannot be read: a poison record,
    /// dead-lettered whole.
    Undecodable(Box<crate::kpl::KplError>),
}

impl Entry {
    /// The stream and shard, when the record could be read.
    pub(crate) fn key(&self) -> Option<&LeaseKey> {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => Some(record.key()),
            Self::Malformed(..) => None,
            Self::Undecodable(error) => Some(error.record().key()),
            Self::Placed(_) => unread(),
        }
    }

    /// The partition key the record runs under, or `None` for an entry that stops the shard
    /// where it stands (a malformed record, or one after it).
    pub(crate) fn partition_key(&self) -> Option<&str> {
        match self {
            Self::Record(record) => Some(record.partition_key()),
            Self::Malformed(..) | Self::AfterMalformed(_) => None,
            Self::Undecodable(error) => Some(error.record().partition_key()),
            Self::Placed(_) => unread(),
        }
    }

    /// The key Kinesis routed the record by (the aggregate's for a KPL sub-record), or `None`
    /// as for [`partition_key`](Self::partition_key): what the mapping keeps order by when
    /// `ParallelizationFactor` is above 1.
    pub(crate) fn routing_key(&self) -> Option<&str> {
        match self {
            Self::Record(record) => Some(record.routing_key()),
            Self::Malformed(..) | Self::AfterMalformed(_) => None,
            Self::Undecodable(error) => Some(error.record().routing_key()),
            Self::Placed(_) => unread(),
        }
    }

    /// The key records run in order by: the routing key in the partition-key mode, the
    /// record's own otherwise.
    pub(crate) fn ordering_key(&self, routing: bool) -> Option<&str> {
        if routing {
            self.routing_key()
        } else {
            self.partition_key()
        }
    }

    pub(crate) fn sequence(&self) -> &SequenceNumber {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => record.sequence(),
            Self::Malformed(malformed) => &malformed.1,
            Self::Undecodable(error) => error.record().sequence(),
            Self::Placed(placed) => &placed.sequence,
        }
    }

    /// The KPL sub-record number, without building the position.
    pub(crate) fn sub_sequence(&self) -> Option<u64> {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => record.sub_sequence(),
            // An event's record, not a KPL sub-record: those are unpacked from records read.
            Self::Malformed(..) | Self::Placed(_) => None,
            Self::Undecodable(error) => error.record().sub_sequence(),
        }
    }

    /// How the entry's position compares with `other`, without building the position.
    pub(crate) fn cmp_position(&self, other: &Position) -> std::cmp::Ordering {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => {
                cmp_record(record.sequence(), record.sub_sequence(), other)
            }
            Self::Malformed(malformed) => cmp_record(&malformed.1, None, other),
            Self::Placed(placed) => cmp_record(&placed.sequence, None, other),
            Self::Undecodable(error) => {
                let record = error.record();
                cmp_record(record.sequence(), record.sub_sequence(), other)
            }
        }
    }

    pub(crate) fn position(&self) -> Position {
        match self {
            Self::Record(record) | Self::AfterMalformed(record) => record.position(),
            Self::Malformed(malformed) => Position::record(malformed.1.clone()),
            Self::Undecodable(error) => error.record().position(),
            Self::Placed(placed) => Position::record(placed.sequence.clone()),
        }
    }
}

/// What asking a placed entry for what only its record knows means: a stage that reads
/// records ran on a batch not read whole first ([`ShardBatch::read_whole`]).
fn unread() -> ! {
    unreachable!("a placed entry's record is read before anything asks for its key")
}

/// `position`, or the whole aggregate when `position` is the last of its sub-records in
/// `entries` (which hold every sub-record of an aggregate: Lambda delivers Kinesis records
/// whole, and they are unpacked here). `entries` are in the shard's order.
pub(crate) fn settled(entries: &[Entry], position: Position) -> Position {
    let Position::Record {
        sequence,
        sub_sequence: Some(_),
    } = &position
    else {
        return position;
    };
    let next = entries.partition_point(|entry| entry.cmp_position(&position).is_le());
    if entries
        .get(next)
        .is_some_and(|entry| entry.sequence() == sequence)
    {
        return position;
    }
    Position::record(sequence.clone())
}

/// The record just before the aggregate `position` lies in, when `entries` hold one: done
/// whole, since everything below `position` is done.
pub(crate) fn prior<'a>(entries: &'a [Entry], position: &Position) -> Option<&'a SequenceNumber> {
    let Position::Record {
        sequence,
        sub_sequence: Some(_),
    } = position
    else {
        return None;
    };
    let first = entries.partition_point(|entry| entry.sequence() < sequence);
    first.checked_sub(1).map(|index| entries[index].sequence())
}

/// Replaces every KPL aggregate among `entries` by its sub-records, in order; an aggregate that
/// cannot be read becomes [`Entry::Undecodable`]. Plain records pass through untouched.
pub(crate) fn deaggregate(entries: Vec<Entry>) -> Vec<Entry> {
    let aggregate = |entry: &Entry| match entry {
        Entry::Record(record) => crate::kpl::is_aggregate(record.data()),
        _ => false,
    };
    // Most batches hold no aggregate: keep their entries where they are, rather than move
    // them all into a new vector (the `memory` bench: large allocations cost most here).
    if !entries.iter().any(aggregate) {
        return entries;
    }
    let mut expanded = Vec::with_capacity(entries.len());
    for entry in entries {
        match entry {
            Entry::Record(record) if crate::kpl::is_aggregate(record.data()) => {
                match crate::kpl::deaggregate(record) {
                    Ok(records) => {
                        expanded.extend(records.into_records().into_iter().map(Entry::Record));
                    }
                    Err(error) => expanded.push(Entry::Undecodable(Box::new(error))),
                }
            }
            other => expanded.push(other),
        }
    }
    expanded
}

/// One shard's records in the order of the event.
pub(crate) struct ShardBatch {
    pub(crate) key: LeaseKey,
    pub(crate) entries: Vec<Entry>,
    /// Where the payloads of the [`Entry::Placed`] among `entries` are; `None` when there are
    /// none.
    pub(crate) payloads: Option<Payloads>,
}

/// The event's records grouped by stream and shard, keeping order, as [`group`] says. An event
/// read as one shard's is its one group as it stands: no record is looked at again here (by
/// now its place in the record block is far behind, and reading each record's key cost a
/// cache miss per record; the `processor` bench).
pub(crate) fn group_event(
    read: ReadEvent,
) -> (
    Vec<ShardBatch>,
    Vec<MalformedRecord>,
    Option<MalformedRecord>,
) {
    match read {
        ReadEvent::OneShard { key, records } => {
            let entries = records.into_iter().map(Entry::Record).collect();
            let group = ShardBatch {
                key,
                entries,
                payloads: None,
            };
            (vec![group], Vec::new(), None)
        }
        ReadEvent::Placed {
            key,
            placed,
            payloads,
        } => {
            let entries = placed.into_iter().map(Entry::Placed).collect();
            let group = ShardBatch {
                key,
                entries,
                payloads: Some(payloads),
            };
            (vec![group], Vec::new(), None)
        }
        ReadEvent::Mixed(parsed) => group(parsed),
    }
}

/// The key each malformed record of `parsed` reports under (`None` for a well-formed one): its
/// own, or its nearest readable neighbour's when its stream or shard is unknown. Computed
/// before `parsed` is consumed: the neighbours are looked up by index.
fn malformed_keys(parsed: &[Parsed]) -> Vec<Option<LeaseKey>> {
    let neighbour_key = |index: usize| -> Option<LeaseKey> {
        let before = parsed[..index].iter().rev().find_map(|p| p.as_ref().ok());
        let after = || parsed[index + 1..].iter().find_map(|p| p.as_ref().ok());
        before.or_else(after).map(|record| record.key().clone())
    };
    parsed
        .iter()
        .enumerate()
        .map(|(index, item)| match item {
            Ok(_) => None,
            Err(malformed) => match (&malformed.stream, &malformed.shard) {
                (Some(stream), Some(shard)) => Some(LeaseKey::new(stream.as_str(), shard.as_str())),
                _ => neighbour_key(index),
            },
        })
        .collect()
}

/// Groups the batch by stream and shard, keeping order. The first malformed record ends the
/// batch for every shard: it joins its own shard's group (or its neighbour's, when its shard is
/// unknown) and stops it; records after it are not dispatched. Every later malformed record
/// joins a group the same way, so that its shard reports it (or an earlier record) even when
/// no other record of that shard follows the first. Returns the groups, the malformed records
/// that belong to no group, and the first malformed record without a sequence number that no
/// earlier report of its shard covers, which fails the whole batch.
fn group(
    parsed: Vec<Parsed>,
) -> (
    Vec<ShardBatch>,
    Vec<MalformedRecord>,
    Option<MalformedRecord>,
) {
    let mut groups: Vec<ShardBatch> = Vec::new();
    let mut orphans = Vec::new();
    let cut = parsed.iter().position(Result::is_err);
    // Only for a batch that holds a malformed record: a vector as long as the batch costs most
    // of the grouping (the `processor` bench), and a well-formed batch needs none of it.
    let malformed_keys = if cut.is_some() {
        malformed_keys(&parsed)
    } else {
        Vec::new()
    };
    let mut unreportable = None;
    let total = parsed.len();
    for (index, item) in parsed.into_iter().enumerate() {
        // A record's key is read from the record: cloned only for a new group, not for every
        // record (two reference counts taken and given back).
        let (malformed_key, entry) = match item {
            Ok(record) => {
                if cut.is_some_and(|cut| index > cut) {
                    // Past the malformed record: not dispatched, but its shard reports from it
                    // when the malformed record is not in the same group.
                    (None, Entry::AfterMalformed(record))
                } else {
                    (None, Entry::Record(record))
                }
            }
            Err(malformed) => {
                let key = malformed_keys[index].clone();
                let Some(sequence) = malformed.reportable_sequence() else {
                    // Past the first malformed record, every entry of a group stops it: a
                    // group that already has one reports a record before this one.
                    let covered = key.as_ref().is_some_and(|key| {
                        groups
                            .iter()
                            .any(|group| group.key == *key && group.stops_after_malformed())
                    });
                    if !covered && unreportable.is_none() {
                        unreportable = Some(*malformed);
                    }
                    continue;
                };
                let Some(key) = key else {
                    // No record of the batch names a shard: the first report covers the rest.
                    if orphans.is_empty() {
                        orphans.push(*malformed);
                    }
                    continue;
                };
                (
                    Some(key),
                    Entry::Malformed(Box::new((*malformed, sequence))),
                )
            }
        };
        join(&mut groups, malformed_key.as_ref(), entry, total - index);
    }
    (groups, orphans, unreportable)
}

/// Adds `entry` to the group of its key (`malformed_key`, or the record's own), or to a new one;
/// `left` entries of the batch, this one included, are still to come.
fn join(groups: &mut Vec<ShardBatch>, malformed_key: Option<&LeaseKey>, entry: Entry, left: usize) {
    let key = malformed_key
        .or_else(|| entry.key())
        .expect("a record names its key");
    if let Some(found) = groups.iter().position(|group| group.key == *key) {
        groups[found].entries.push(entry);
        return;
    }
    let key = key.clone();
    // Lambda sends one shard per batch: the first group is sized for the rest of the batch at
    // once. Growing it record by record would reallocate it a dozen times for 10,000 records,
    // and each large allocation makes glibc's malloc consolidate every small block the event's
    // parsing just freed.
    let capacity = if groups.is_empty() { left } else { 1 };
    let mut entries = Vec::with_capacity(capacity);
    entries.push(entry);
    groups.push(ShardBatch {
        key,
        entries,
        payloads: None,
    });
}

impl ShardBatch {
    /// The batch with every record read, in one block, the event kept until the batch is
    /// dropped: what any stage but the in-order dispatch needs before it looks at a record.
    pub(crate) fn read_whole(mut self) -> Self {
        if let Some(payloads) = &mut self.payloads {
            let read = read_chunk(&self.entries, |placed| payloads.read_whole(placed));
            for (entry, record) in read {
                self.entries[entry] = Entry::Record(record);
            }
        }
        self
    }

    /// Whether the group holds an entry from the first malformed record on, which stops it.
    fn stops_after_malformed(&self) -> bool {
        self.entries
            .iter()
            .any(|entry| matches!(entry, Entry::Malformed(..) | Entry::AfterMalformed(_)))
    }
}

/// The records of the [`Entry::Placed`] among `entries`, read by `read` (out of the batch's
/// [`Payloads`]) in one block, each with its entry's index in `entries`.
pub(crate) fn read_chunk(
    entries: &[Entry],
    read: impl FnOnce(&[&Placed]) -> Vec<Record>,
) -> Vec<(usize, Record)> {
    // Gathered first: read from a slice, the block is allocated once at its size.
    let (indices, placed): (Vec<usize>, Vec<&Placed>) = entries
        .iter()
        .enumerate()
        .filter_map(|(index, entry)| match entry {
            Entry::Placed(placed) => Some((index, placed)),
            _ => None,
        })
        .unzip();
    indices.into_iter().zip(read(&placed)).collect()
}

/// A shard's entries once dispatch is done, kept by its report: the positions the report names
/// are read from them on demand.
pub(crate) struct Settled(pub(crate) Vec<Entry>);

impl PositionSource for Settled {
    fn position(&self, index: usize) -> Position {
        self.0[index].position()
    }
}

/// `report` with the first of `entries` reported and every other one not attempted: the shard
/// does nothing.
pub(crate) fn stop_all(
    mut report: ShardReport,
    entries: &[Entry],
    reason: StopReason,
) -> ShardReport {
    report.records.extend(
        entries
            .iter()
            .enumerate()
            .map(|(index, entry)| RecordReport {
                position: entry.position(),
                disposition: if index == 0 {
                    Disposition::Reported
                } else {
                    Disposition::NotAttempted
                },
            }),
    );
    report.stopped = entries
        .first()
        .map(|entry| (entry.sequence().clone(), reason));
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{LARGE, parse_event};

    fn event(shards: &[u32]) -> aws_lambda_events::event::kinesis::KinesisEvent {
        let records: Vec<_> = shards
            .iter()
            .enumerate()
            .map(|(n, shard)| {
                let sequence =
                    format!("4959033827149025660855969253836157109592157598913658{n:04}");
                serde_json::json!({
                    "eventID": format!("shardId-00000000000{shard}:{sequence}"),
                    "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
                    "kinesis": {"partitionKey": "k", "sequenceNumber": sequence, "data": "",
                                "approximateArrivalTimestamp": 1_700_000_000.0}
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({ "Records": records })).expect("event shape")
    }

    /// Each group's shard and its entries' sequence numbers, in order.
    fn shape(groups: &[ShardBatch]) -> Vec<(String, Vec<String>)> {
        groups
            .iter()
            .map(|group| {
                let sequences = group.entries.iter().map(|e| e.sequence().to_string());
                (group.key.shard().to_owned(), sequences.collect())
            })
            .collect()
    }

    #[test]
    fn one_shards_batch_is_its_one_group_as_grouping_record_by_record_makes_it() {
        let (read, _) = parse_event(&mut event(&[3, 3, 3]), LARGE);
        let ReadEvent::OneShard { records, .. } = &read else {
            panic!("one shard's batch")
        };
        let by_record = group(records.iter().cloned().map(Ok).collect()).0;
        let (groups, orphans, unreportable) = group_event(read);
        assert_eq!(shape(&groups), shape(&by_record));
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].entries.len(), 3);
        assert!(orphans.is_empty() && unreportable.is_none());
    }

    #[test]
    fn a_batch_of_two_shards_is_grouped_by_shard_in_the_events_order() {
        let (read, _) = parse_event(&mut event(&[1, 2, 1]), LARGE);
        assert!(matches!(read, ReadEvent::Mixed(_)));
        let (groups, _, _) = group_event(read);
        let shapes = shape(&groups);
        assert_eq!(shapes.len(), 2);
        assert_eq!(shapes[0].0, "shardId-000000000001");
        assert_eq!(shapes[0].1.len(), 2);
        assert!(shapes[0].1[0] < shapes[0].1[1]);
        assert_eq!(shapes[1].0, "shardId-000000000002");
    }
}
