//! Per-key concurrency within one invocation: records of different partition keys run at
//! once, the records of one key strictly in order.
//!
//! A handler that calls a database or an API spends its time waiting, and Kinesis promises
//! order per partition key only. So with [`Processor::concurrency`](crate::Processor::concurrency)
//! above 1, the shard's pending records are dispatched as one queue per partition key, with at
//! most `max_in_flight` handlers running; the lowest waiting record of any idle key starts
//! first, so the checkpoint moves as early as it can.
//!
//! The rules that keep the shard exact:
//!
//! - When a record of key K fails (retry, panic, time-out, a dead-letter sink that fails), no
//!   later record of K runs; the other keys go on.
//! - The checkpoint is the highest position below which every record is done. Records done
//!   above it (other keys that went on) are remembered in the row's `done_above`, written with
//!   the checkpoint in the same conditional write, so a redelivery skips them.
//! - `done_above` is bounded ([`Processor::max_done_above`](crate::Processor::max_done_above),
//!   [`DEFAULT_MAX_DONE_ABOVE`](crate::processor::DEFAULT_MAX_DONE_ABOVE) by default). At the bound no new record starts above the lowest
//!   record not done (that one may always start, since finishing it only shrinks the set): the
//!   rest is not attempted and comes back with the redelivery. Nothing runs twice and nothing is
//!   forgotten; progress past a stuck key waits until the stuck record is done or dead-lettered.
//! - The record reported is the lowest one not done; Lambda redelivers from it, and everything
//!   done above it is skipped.
//! - A KPL sub-record runs under its own partition key and is remembered by its sub-sequence.
//! - Dead letters work as in order: a rejected record (or one out of attempts) goes to the sink
//!   and counts as done. The row remembers the attempts of one failing record, the lowest; a
//!   record above it starts counting once it is the lowest.
//! - A malformed record stops the shard where it stands: records before it are dispatched per
//!   key, it and everything after it are not.
//! - A lost lease or a deadline stops every key: no new record starts.
//!
//! Handlers run concurrently on the invocation's task (as `join_all` would run them), not on
//! other threads: that is what waiting on I/O needs. A handler that computes for long should
//! move that work to `tokio::task::spawn_blocking`.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use super::attempt::{Failing, Runner};
use super::batch::Entry;
use super::ordered::Dispatched;
use crate::handler::Handler;
use crate::report::{Disposition, StopReason};
use crate::sequence::Position;
use crate::store::{FailingChange, FailingRecord};

/// The bounds of one keyed dispatch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_in_flight: usize,
    pub(crate) max_done_above: usize,
    /// Order by the routing key (the partition-key mode), not the record's own key.
    pub(crate) by_routing_key: bool,
}

/// What became of one pending record.
#[derive(Debug)]
pub(crate) enum State {
    Waiting,
    Running,
    /// Done; `cleared` when it was the row's failing record.
    Done(Disposition, bool),
    /// Not done: the handler failed (`ran`), or the record was not started because the shard
    /// must stop (lease lost, deadline). `counted` is its failure as the row would remember it.
    Failed {
        reason: StopReason,
        ran: bool,
        counted: Option<FailingRecord>,
    },
}

impl State {
    pub(crate) const fn is_done(&self) -> bool {
        matches!(self, Self::Done(..))
    }
}

/// What a keyed run did with each pending record.
pub(crate) struct Run {
    pub(crate) states: Vec<State>,
    /// Why the run stopped starting records, when something stopped every key.
    stop: Option<StopReason>,
    /// The first entry that never runs (a malformed record), or the count.
    barrier: usize,
}

impl Run {
    /// The index of the lowest record not done, or the count when all are.
    pub(crate) fn lowest_not_done(&self) -> usize {
        self.states
            .iter()
            .position(|state| !state.is_done())
            .unwrap_or(self.states.len())
    }

    /// Why the record at `index`, which is not done, is not: its failure, the reason every key
    /// stopped, or (for a malformed entry) what attempting it says.
    pub(crate) async fn reason<H: Handler>(
        &self,
        index: usize,
        runner: &Runner<'_, H>,
        pending: &[Entry],
    ) -> StopReason {
        match &self.states[index] {
            State::Failed { reason, .. } => reason.clone(),
            _ if index >= self.barrier => {
                // A malformed entry (or one after it): attempting it runs nothing and says why.
                let mut untouched = Failing {
                    known: None,
                    change: FailingChange::Keep,
                };
                match runner.attempt(&pending[index], &mut untouched).await {
                    Err(reason) => reason,
                    Ok(_) => unreachable!("an entry without a partition key never runs"),
                }
            }
            // Not started: every key stopped (lease lost, deadline) before it.
            _ => self.stop.clone().unwrap_or(StopReason::Deadline),
        }
    }

    /// Each record's disposition, `reported` being the one reported.
    pub(crate) fn dispositions(&self, reported: usize) -> Vec<Disposition> {
        self.states
            .iter()
            .enumerate()
            .map(|(index, state)| match state {
                _ if index == reported => Disposition::Reported,
                State::Done(disposition, _) => *disposition,
                State::Failed { ran: true, .. } => Disposition::Failed,
                State::Failed { ran: false, .. } | State::Waiting | State::Running => {
                    Disposition::NotAttempted
                }
            })
            .collect()
    }
}

/// Dispatches `pending` one queue per partition key, at most `limits.max_in_flight` at once,
/// for a shard's row: see the [module documentation](self) for the rules.
pub(crate) async fn dispatch<H: Handler>(
    runner: &Runner<'_, H>,
    pending: &[Entry],
    known: Option<FailingRecord>,
    done_above: &[Position],
    limits: Limits,
) -> Dispatched {
    let remembered: HashSet<&Position> = done_above.iter().collect();
    let last = pending.last().map(Entry::position);
    // Remembered records beyond this batch stay in the row whatever happens here.
    let beyond = done_above
        .iter()
        .filter(|position| last.as_ref().is_some_and(|last| *position > last))
        .count();
    let run = run(
        runner,
        pending,
        &|_| known.clone(),
        &|entry| remembered.contains(&entry.position()),
        beyond,
        limits,
    )
    .await;

    let watermark = run.lowest_not_done();
    let done_through = watermark
        .checked_sub(1)
        .map(|index| pending[index].position());
    let done_above = (watermark..pending.len())
        .filter(|&index| run.states[index].is_done())
        .map(|index| pending[index].position())
        .collect();
    let cleared = run
        .states
        .iter()
        .any(|state| matches!(state, State::Done(_, true)));
    let mut failing = if cleared {
        FailingChange::Clear
    } else {
        FailingChange::Keep
    };
    let stopped = if watermark < pending.len() {
        if let State::Failed {
            counted: Some(counted),
            ..
        } = &run.states[watermark]
        {
            failing = FailingChange::Set(counted.clone());
        }
        let reason = run.reason(watermark, runner, pending).await;
        Some((watermark, reason))
    } else {
        None
    };
    Dispatched {
        dispositions: run.dispositions(watermark),
        done_through,
        stopped,
        failing,
        done_above,
    }
}

/// Runs `pending` one queue per partition key: a record starts when the records of its key
/// before it are done; the lowest such record first; at most `limits.max_in_flight` at once;
/// none above the lowest record not done once `limits.max_done_above` records (counting
/// `beyond`, remembered records after the batch) would be done above it. Entries `skip` says
/// are done already are duplicates; `known` gives each partition key's failing record.
pub(crate) async fn run<H: Handler>(
    runner: &Runner<'_, H>,
    pending: &[Entry],
    known: &(dyn Fn(&str) -> Option<FailingRecord> + Sync),
    skip: &(dyn Fn(&Entry) -> bool + Sync),
    beyond: usize,
    limits: Limits,
) -> Run {
    let count = pending.len();
    // Entries from the first malformed one on never run.
    let barrier = pending
        .iter()
        .position(|entry| entry.ordering_key(limits.by_routing_key).is_none())
        .unwrap_or(count);

    let (mut states, mut queues, mut done) = queued(pending, barrier, skip, limits.by_routing_key);
    // The head of every idle key's queue, lowest first.
    let mut ready: BTreeSet<usize> = queues.values().filter_map(|q| q.front().copied()).collect();
    let mut watermark = advance(&states, 0);

    let mut stop: Option<StopReason> = None;
    let mut in_flight = InFlight::default();
    loop {
        while stop.is_none() && in_flight.len() < limits.max_in_flight {
            let Some(&index) = ready.first() else { break };
            // Records done above the lowest one not done, and those that may become so.
            let above = done - watermark + beyond + in_flight.len();
            if index != watermark && above >= limits.max_done_above {
                break;
            }
            ready.remove(&index);
            states[index] = State::Running;
            let entry = &pending[index];
            let known = entry.ordering_key(limits.by_routing_key).and_then(known);
            in_flight.push(async move {
                let mut failing = Failing {
                    known,
                    change: FailingChange::Keep,
                };
                let result = runner.attempt(entry, &mut failing).await;
                (index, result, failing.change)
            });
        }
        let Some((index, result, change)) = in_flight.next().await else {
            break;
        };
        let key = pending[index]
            .ordering_key(limits.by_routing_key)
            .unwrap_or_default();
        match result {
            Ok(disposition) => {
                states[index] = State::Done(disposition, change == FailingChange::Clear);
                done += 1;
                let queue = queues.get_mut(key).expect("a queue per key");
                queue.pop_front();
                if let Some(&next) = queue.front() {
                    ready.insert(next);
                }
                watermark = advance(&states, watermark);
            }
            Err(reason) => {
                let ran = !matches!(reason, StopReason::Fenced | StopReason::Deadline);
                if !ran {
                    stop.get_or_insert_with(|| reason.clone());
                }
                states[index] = failed(&pending[index], key, reason, ran, change);
            }
        }
    }
    Run {
        states,
        stop,
        barrier,
    }
}

/// The first entry from `watermark` on that is not done: every one below it is.
fn advance(states: &[State], mut watermark: usize) -> usize {
    while watermark < states.len() && states[watermark].is_done() {
        watermark += 1;
    }
    watermark
}

/// Every entry before `barrier` waiting in its key's queue, or done when `skip` says it is a
/// duplicate: the entries' states, the queues by key, and how many are done.
fn queued<'e>(
    pending: &'e [Entry],
    barrier: usize,
    skip: &(dyn Fn(&Entry) -> bool + Sync),
    by_routing_key: bool,
) -> (Vec<State>, HashMap<&'e str, VecDeque<usize>>, usize) {
    let mut states: Vec<State> = (0..pending.len()).map(|_| State::Waiting).collect();
    let mut queues: HashMap<&str, VecDeque<usize>> = HashMap::new();
    let mut done = 0;
    for (index, entry) in pending[..barrier].iter().enumerate() {
        if skip(entry) {
            states[index] = State::Done(Disposition::Duplicate, false);
            done += 1;
        } else if let Some(key) = entry.ordering_key(by_routing_key) {
            queues.entry(key).or_default().push_back(index);
        }
    }
    (states, queues, done)
}

/// The state of `entry` (of partition key `key`) when its attempt failed for `reason`, with the
/// failing record it counted (`change`).
fn failed(entry: &Entry, key: &str, reason: StopReason, ran: bool, change: FailingChange) -> State {
    tracing::warn!(
        sequence = %entry.sequence(),
        sub_sequence = entry.sub_sequence(),
        partition_key = key,
        %reason,
        "the record is not done; its partition key stops"
    );
    State::Failed {
        reason,
        ran,
        counted: match change {
            FailingChange::Set(failing) => Some(failing),
            _ => None,
        },
    }
}

/// The records done above the checkpoint that the row should hold after this invocation:
/// those it held and those done now, above `checkpoint`. `None` when that is what it holds.
pub(crate) fn remembered(
    held: &[Position],
    done_now: &[Position],
    checkpoint: Option<&Position>,
) -> Option<Vec<Position>> {
    let above = |position: &&Position| checkpoint.is_none_or(|checkpoint| *position > checkpoint);
    let after: BTreeSet<&Position> = held.iter().chain(done_now).filter(above).collect();
    let after: Vec<Position> = after.into_iter().cloned().collect();
    (after != held).then_some(after)
}

/// The handlers running now: polled together on the invocation's task, each result taken as
/// soon as it is ready.
struct InFlight<'a, T> {
    running: Vec<Pin<Box<dyn Future<Output = T> + Send + 'a>>>,
}

impl<T> Default for InFlight<'_, T> {
    fn default() -> Self {
        Self {
            running: Vec::new(),
        }
    }
}

impl<'a, T> InFlight<'a, T> {
    fn push(&mut self, future: impl Future<Output = T> + Send + 'a) {
        self.running.push(Box::pin(future));
    }

    fn len(&self) -> usize {
        self.running.len()
    }

    /// The next result, or `None` when nothing runs.
    async fn next(&mut self) -> Option<T> {
        if self.running.is_empty() {
            return None;
        }
        std::future::poll_fn(|cx| {
            for index in 0..self.running.len() {
                if let Poll::Ready(output) = self.running[index].as_mut().poll(cx) {
                    drop(self.running.swap_remove(index));
                    return Poll::Ready(Some(output));
                }
            }
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(n: u64) -> Position {
        Position::record(n.to_string().parse().unwrap())
    }

    #[test]
    fn the_row_keeps_what_is_done_above_the_new_checkpoint_only() {
        let held = [at(5), at(9)];
        assert_eq!(
            remembered(&held, &[at(7)], Some(&at(5))),
            Some(vec![at(7), at(9)])
        );
        assert_eq!(remembered(&held, &[], None), None, "unchanged");
        assert_eq!(remembered(&held, &[], Some(&at(9))), Some(vec![]));
    }
}
