//! Sequential dispatch: a shard's pending records through the handler one at a time, in
//! order, until the first that is not done; and what any dispatch returns.
//!
//! The default (`concurrency` 1). [`keyed`](super::keyed) is the per-key alternative and fills
//! in the same [`Dispatched`], which the shard mode's checkpoint write reads.

use super::attempt::{Failing, Runner};
use super::batch::{Entry, read_chunk};
use crate::event::Payloads;
use crate::handler::Handler;
use crate::report::{Disposition, StopReason};
use crate::sequence::Position;
use crate::store::{FailingChange, FailingRecord};

/// The result of dispatching the pending records.
pub(crate) struct Dispatched {
    /// One per pending record.
    pub(crate) dispositions: Vec<Disposition>,
    /// The position below which (inclusive) every pending record is done.
    pub(crate) done_through: Option<Position>,
    /// The index of the record to report, and why.
    pub(crate) stopped: Option<(usize, StopReason)>,
    /// What to remember of the record that failed.
    pub(crate) failing: FailingChange,
    /// Records done above `done_through`, in order (per-key concurrency only).
    pub(crate) done_above: Vec<Position>,
}

/// What the last write of a shard's invocation leaves: the records' dispositions, the record
/// to report and the checkpoint written.
pub(crate) type Committed = (
    Vec<Disposition>,
    Option<(usize, StopReason)>,
    Option<Position>,
);

/// Runs the handler over `pending` in order until a record is not done, dead-lettering the
/// records that can never be, and skipping those the row remembers as done above the
/// checkpoint. With per-key concurrency, [`keyed::dispatch`](super::keyed::dispatch) does it.
///
/// The records of [`Entry::Placed`] entries are read out of `payloads` a
/// [`chunk`](Payloads::chunk) at a time, just before they run, and freed once their chunk is
/// done (unless the handler kept them): the entries themselves stay as they are, positions
/// only.
pub(crate) async fn dispatch<H: Handler>(
    runner: &Runner<'_, H>,
    pending: &[Entry],
    mut payloads: Option<&mut Payloads>,
    failing: Option<FailingRecord>,
    done_above: &[Position],
) -> Dispatched {
    let mut failing = Failing {
        known: failing,
        change: FailingChange::Keep,
    };
    let mut dispositions = vec![Disposition::NotAttempted; pending.len()];
    // Every record before `index` is done: the position below which all are done is the
    // previous record's, taken once at the end rather than cloned for every record.
    let done_before = |index: usize| index.checked_sub(1).map(|last| pending[last].position());
    let size = payloads.as_deref().map_or(usize::MAX, Payloads::chunk);
    let mut start = 0;
    for chunk in pending.chunks(size) {
        let mut read = match payloads.as_deref_mut() {
            Some(payloads) => read_chunk(chunk, |placed| payloads.read(placed)),
            None => Vec::new(),
        }
        .into_iter()
        .peekable();
        for (offset, entry) in chunk.iter().enumerate() {
            let index = start + offset;
            let record = read
                .next_if(|(at, _)| *at == offset)
                .map(|(_, record)| record);
            // Only a row written under per-key concurrency remembers records done above its
            // checkpoint; without them, no position needs building to look one up.
            if !done_above.is_empty() && done_above.binary_search(&entry.position()).is_ok() {
                dispositions[index] = Disposition::Duplicate;
                continue;
            }
            let read;
            let entry = match record {
                Some(record) => {
                    read = Entry::Record(record);
                    &read
                }
                None => entry,
            };
            let attempted = runner.attempt(entry, &mut failing).await;
            match attempted {
                Ok(disposition) => dispositions[index] = disposition,
                Err(reason) => {
                    tracing::warn!(
                        sequence = %entry.sequence(),
                        sub_sequence = entry.sub_sequence(),
                        %reason,
                        "the record is not done; stopping"
                    );
                    dispositions[index] = Disposition::Reported;
                    return Dispatched {
                        dispositions,
                        done_through: done_before(index),
                        stopped: Some((index, reason)),
                        failing: failing.change,
                        done_above: Vec::new(),
                    };
                }
            }
        }
        start += chunk.len();
    }
    Dispatched {
        dispositions,
        done_through: done_before(pending.len()),
        stopped: None,
        failing: failing.change,
        done_above: Vec::new(),
    }
}

/// Marks the records from `from` on whose effect happened in this invocation (processed, or
/// dead-lettered) as not recorded, since the write that was to record them failed or was
/// refused, and returns the record to report: the first of them, or a lower one already
/// reported (per-key concurrency), or Lambda would skip it.
pub(crate) fn unrecorded(
    dispositions: &mut [Disposition],
    from: usize,
    stopped: Option<(usize, StopReason)>,
    reason: StopReason,
) -> Option<(usize, StopReason)> {
    // A record dead-lettered here is in the sink, but with the checkpoint behind it Lambda
    // would move past it while the row never does: a closed shard would never be found
    // exhausted and its children would wait forever. It is reported like a processed one,
    // and dead-lettered again on redelivery.
    let mut first = None;
    for (index, disposition) in dispositions.iter_mut().enumerate().skip(from) {
        if disposition.runs_again_unrecorded() {
            *disposition = Disposition::Uncheckpointed;
            first.get_or_insert(index);
        }
    }
    match (first, stopped) {
        (Some(first), Some((index, stop))) if index < first => Some((index, stop)),
        (Some(first), _) => Some((first, reason)),
        (None, stopped) => stopped,
    }
}
