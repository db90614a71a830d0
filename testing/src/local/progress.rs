//! Where each shard stands for the mapping, lane by lane: which records are due next, and what
//! an answer does to them (the next batch's start, retries, back-off, bisection, discards).
//!
//! This is the mapping's bookkeeping, apart from the loop that reads the stream and the
//! invocations that carry batches to the function: every rule of Lambda's that decides what is
//! delivered again, and what is given up on, is here.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_lambda_events::event::streams::KinesisEventResponse;

use super::delivery::{Delivery, DeliveryOutcome, DiscardReason, Discarded, RunReport};
use super::function::InvocationError;
use super::mapping::{Mapping, lane_of};
use super::rng::Rng;
use super::stream::StreamRecord;

/// One shard as the event source tracks it.
#[derive(Debug)]
pub(super) struct ShardProgress {
    pub(super) parents: Vec<String>,
    /// Every record read so far, in order.
    pub(super) records: Vec<StreamRecord>,
    /// The shard is closed and `records` holds all of it.
    pub(super) ended: bool,
    pub(super) lanes: Vec<Lane>,
    /// Delivered without waiting for its parents.
    pub(super) early: bool,
}

/// One lane of a shard: all of it, or with a `ParallelizationFactor` above 1, the records of
/// some partition keys.
#[derive(Debug, Clone)]
pub(super) struct Lane {
    /// Every record of this lane before this index of the shard's records is done with.
    pub(super) next: usize,
    /// Failed attempts at `next` since it last moved.
    pub(super) failures: u32,
    /// The batch size now (halved by bisection).
    pub(super) limit: usize,
    backoff: Duration,
    /// Epoch milliseconds on the source's clock.
    not_before: Option<u64>,
    pub(super) last_failure: String,
}

/// A batch on its way to the function.
pub(super) struct Batch {
    pub(super) shard: String,
    lane: usize,
    /// Indexes into the shard's records.
    pub(super) indexes: Vec<usize>,
    pub(super) request_id: String,
    stray: bool,
}

impl ShardProgress {
    /// Read to its end and every record of every lane done with.
    pub(super) fn is_finished(&self, lanes: usize) -> bool {
        self.ended
            && self.lanes.iter().enumerate().all(|(index, lane)| {
                self.records[lane.next.min(self.records.len())..]
                    .iter()
                    .all(|r| lane_of(&r.partition_key, lanes) != index)
            })
    }
}

impl Lane {
    pub(super) const fn new(batch_size: usize) -> Self {
        Self {
            next: 0,
            failures: 0,
            limit: batch_size,
            backoff: Duration::from_millis(1),
            not_before: None,
            last_failure: String::new(),
        }
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.backoff = Duration::from_millis(1);
        self.not_before = None;
    }

    /// Waits out the back-off from `now` (epoch milliseconds).
    fn back_off(&mut self, maximum: Duration, now: u64) {
        let backoff = u64::try_from(self.backoff.as_millis()).unwrap_or(u64::MAX);
        self.not_before = Some(now.saturating_add(backoff));
        self.backoff = (self.backoff * 2).min(maximum);
    }
}

/// The earliest moment a lane waiting after a failure may be retried, `now` being the moment the
/// batches were chosen. A wait over by then belongs to a lane with nothing left to deliver (it
/// would have had a batch): not a reason to go on.
pub(super) fn earliest_retry(shards: &BTreeMap<String, ShardProgress>, now: u64) -> Option<u64> {
    shards
        .values()
        .flat_map(|s| s.lanes.iter())
        .filter_map(|l| l.not_before)
        .filter(|&when| when > now)
        .min()
}

/// One batch per lane that has records due at `now` (epoch milliseconds on the source's clock;
/// `clock` on the stream's, which record ages are measured by), and a stray copy of some.
pub(super) fn next_batches(
    mapping: &Mapping,
    shards: &mut BTreeMap<String, ShardProgress>,
    clock: u64,
    rng: &mut Rng,
    report: &mut RunReport,
    now: u64,
) -> Vec<Batch> {
    // A parent the stream no longer lists has expired: nothing of it will come.
    let known: Vec<String> = shards.keys().cloned().collect();
    // A shard is finished once read and done with, and its own parents finished: an empty
    // child of a split is not finished before the split's parent. Parents sort before their
    // children (shard ids grow), so one pass in id order sees them first.
    let mut finished: Vec<String> = Vec::new();
    for (id, shard) in shards.iter() {
        let parents_finished = shard
            .parents
            .iter()
            .all(|p| finished.contains(p) || !known.contains(p));
        if parents_finished && shard.is_finished(mapping.parallelization_factor) {
            finished.push(id.clone());
        }
    }
    let mut batches = Vec::new();
    for (id, shard) in shards.iter_mut() {
        let parents_done = shard
            .parents
            .iter()
            .all(|p| finished.contains(p) || !known.contains(p));
        if !(parents_done || shard.early) {
            continue;
        }
        for lane_index in 0..shard.lanes.len() {
            if shard.lanes[lane_index]
                .not_before
                .is_some_and(|when| when > now)
            {
                continue;
            }
            let indexes = take_batch(mapping, id, shard, lane_index, clock, &mut report.discarded);
            if indexes.is_empty() {
                continue;
            }
            if !parents_done && shard.lanes[lane_index].failures == 0 {
                report.early_children += 1;
            }
            let stray = rng.chance(mapping.concurrent_deliveries);
            for copy in [false, true] {
                if copy && !stray {
                    continue;
                }
                report.deliveries += 1;
                batches.push(Batch {
                    shard: id.clone(),
                    lane: lane_index,
                    indexes: indexes.clone(),
                    request_id: format!("local-{}", report.deliveries),
                    stray: copy,
                });
            }
        }
    }
    batches
}

/// The next records of one lane, discarding those too old to deliver.
fn take_batch(
    mapping: &Mapping,
    shard_id: &str,
    shard: &mut ShardProgress,
    lane_index: usize,
    clock: u64,
    discarded: &mut Vec<Discarded>,
) -> Vec<usize> {
    let lanes = mapping.parallelization_factor;
    let lane = &mut shard.lanes[lane_index];
    let mut indexes = Vec::new();
    let mut i = lane.next;
    while i < shard.records.len() && indexes.len() < lane.limit {
        let record = &shard.records[i];
        if lane_of(&record.partition_key, lanes) == lane_index {
            let too_old = mapping.maximum_record_age.is_some_and(|age| {
                clock.saturating_sub(record.arrival_millis)
                    > u64::try_from(age.as_millis()).unwrap_or(u64::MAX)
            });
            if too_old && indexes.is_empty() {
                discarded.push(Discarded {
                    shard: shard_id.to_owned(),
                    sequence: record.sequence.clone(),
                    reason: DiscardReason::TooOld,
                });
                lane.next = i + 1;
                lane.failures = 0;
            } else if too_old {
                break;
            } else {
                indexes.push(i);
            }
        } else if indexes.is_empty() {
            lane.next = i + 1;
        }
        i += 1;
    }
    indexes
}

/// Applies one answer to its lane, as the mapping would.
#[allow(
    clippy::too_many_lines,
    reason = "one decision table, clearer in one place"
)]
pub(super) fn apply(
    mapping: &Mapping,
    shards: &mut BTreeMap<String, ShardProgress>,
    batch: &Batch,
    answer: Result<KinesisEventResponse, InvocationError>,
    rng: &mut Rng,
    report: &mut RunReport,
    now: u64,
) -> Delivery {
    let shard = shards.get_mut(&batch.shard).expect("a tracked shard");
    let sequences: Vec<String> = batch
        .indexes
        .iter()
        .map(|&i| shard.records[i].sequence.clone())
        .collect();
    let mut delivery = Delivery {
        request_id: batch.request_id.clone(),
        shard: batch.shard.clone(),
        lane: batch.lane,
        sequences,
        outcome: DeliveryOutcome::Done,
    };
    if let Err(InvocationError::TimedOut(_)) = &answer {
        report.timed_out.push(batch.request_id.clone());
    }
    if batch.stray {
        report.strays += 1;
        if answer.is_err() {
            report.function_errors += 1;
        }
        delivery.outcome = DeliveryOutcome::Stray;
        return delivery;
    }
    let lane = &mut shard.lanes[batch.lane];
    let last = *batch.indexes.last().expect("a batch is never empty");
    let failed_at = match answer {
        Ok(response) if mapping.report_batch_item_failures => {
            let reported: Vec<String> = response
                .batch_item_failures
                .iter()
                .map(|f| f.item_identifier.clone().unwrap_or_default())
                .collect();
            if reported.is_empty() {
                None
            } else if let Some(at) = delivery
                .sequences
                .iter()
                .position(|s| reported.contains(s))
                .filter(|_| reported.iter().all(|r| delivery.sequences.contains(r)))
            {
                report.partial_failures += 1;
                delivery.outcome = DeliveryOutcome::PartialFailure {
                    from: delivery.sequences[at].clone(),
                };
                Some((at, format!("record {} reported", delivery.sequences[at])))
            } else {
                // An identifier that is not in the batch fails the whole batch.
                report.function_errors += 1;
                let error = format!("unknown batchItemFailures identifiers {reported:?}");
                delivery.outcome =
                    DeliveryOutcome::Failed(InvocationError::Function(error.clone()));
                Some((0, error))
            }
        }
        Ok(_) => None,
        Err(error) => {
            report.function_errors += 1;
            let text = error.to_string();
            delivery.outcome = DeliveryOutcome::Failed(error);
            if mapping.bisect_batch_on_function_error && batch.indexes.len() > 1 {
                lane.limit = batch.indexes.len() / 2;
                report.bisections += 1;
            }
            Some((0, text))
        }
    };
    match failed_at {
        None => {
            if rng.chance(mapping.duplicate_deliveries) {
                report.redeliveries += 1;
            } else {
                lane.next = last + 1;
                lane.limit = mapping.batch_size;
            }
            lane.succeeded();
        }
        Some((at, error)) => {
            if at > 0 {
                lane.next = batch.indexes[at];
                lane.failures = 0;
            }
            lane.failures += 1;
            lane.last_failure = error;
            let exhausted = mapping
                .maximum_retry_attempts
                .is_some_and(|retries| lane.failures > retries);
            if exhausted {
                for &i in batch.indexes.iter().filter(|&&i| i >= lane.next) {
                    report.discarded.push(Discarded {
                        shard: batch.shard.clone(),
                        sequence: shard.records[i].sequence.clone(),
                        reason: DiscardReason::RetriesExhausted,
                    });
                }
                lane.next = last + 1;
                lane.limit = mapping.batch_size;
                lane.succeeded();
            } else {
                lane.back_off(mapping.maximum_backoff, now);
            }
        }
    }
    delivery
}
