//! A batch an invocation died running, run again one record at a time, so that a record that
//! kills its invocation is found and dead-lettered.
//!
//! An invocation that dies (out of memory, an abort, a native crash, killed at its time-out)
//! writes nothing: its lease lapses, and the mark its claim left on the row (`reported`, the
//! batch's first record) stays above the checkpoint. The next claim that takes the lapsed lease
//! finds that mark (`shard_lease::Claimed::died_at`) and runs the batch here. Before each
//! record, one conditional write checkpoints the records done so far and pins the record about
//! to run in the row's `failing`, its attempts counted as if it dies. A record that comes back
//! (done, failed, rejected) is counted as it really went; one that kills this invocation too is
//! found pinned by the next claim, its death counted. A record with `max_attempts` attempts
//! against it (deaths, failures, panics and time-outs alike) is dead-lettered from the event's
//! payload without running again, and the shard moves on.
//!
//! The shard stays careful while the row's `failing` names a record pinned so and not done
//! (an invocation that ended before reaching it leaves the pin): every death on it is counted.
//! It costs one write per record, only in the deliveries after a death: a healthy batch pays
//! nothing. With a transactional handler a mark commits the writes of the record before it with
//! the checkpoint (one `TransactWriteItems` instead of an `UpdateItem`), so progress up to a
//! killer is kept as with a plain handler.

use super::attempt::{Failing, Prepared, Runner};
use super::batch::Entry;
use super::ordered::Dispatched;
use super::ready::{Ready, last_write};
use crate::dead_letter::DeadLetterReason;
use crate::handler::Handler;
use crate::report::{Disposition, StopReason};
use crate::sequence::Position;
use crate::store::{FailingChange, FailingRecord, LeaseState, ReportedChange};

/// What a pinned record's `failing` says until it comes back.
pub(crate) const DIED: &str = "the invocation died running this record (out of memory, an abort, a crash, or killed at its time-out)";

/// Whether the row pins a record that died and is not done: the shard runs carefully until it
/// comes back.
pub(super) fn suspect(state: &LeaseState) -> bool {
    let Some(failing) = state.failing.as_ref().filter(|f| f.last_error == DIED) else {
        return false;
    };
    let checkpoint = state.position().ok().flatten();
    Position::from_checkpoint(&failing.sequence, failing.sub_sequence)
        .is_ok_and(|pinned| checkpoint.is_none_or(|checkpoint| pinned > checkpoint))
}

/// Runs the ready batch one record at a time, each pinned in the row before it runs (see the
/// [module](self)).
pub(super) async fn dispatch<H: Handler>(
    runner: &Runner<'_, H>,
    ready: &Ready,
    owner: &str,
) -> Dispatched {
    let pending = &ready.pending()[..ready.runnable];
    let mut failing = Failing {
        known: ready.state.failing.clone(),
        change: FailingChange::Keep,
    };
    let mut dispositions = vec![Disposition::NotAttempted; pending.len()];
    let mut stopped = None;
    // Records before `done` are done; before `committed`, their writes are committed too.
    let (mut done, mut committed) = (0, 0);
    for (index, entry) in pending.iter().enumerate() {
        if ready
            .state
            .done_above
            .binary_search(&entry.position())
            .is_ok()
        {
            dispositions[index] = Disposition::Duplicate;
            done = index + 1;
            continue;
        }
        let counted = counted(&failing, ready, entry);
        let outcome = match pinned_out(runner, counted.as_ref(), entry) {
            Pinned::Out(record) => dead_letter(runner, record, counted, &mut failing)
                .await
                .map_err(|reason| (index, reason)),
            Pinned::Stop(reason) => Err((index, reason)),
            Pinned::Run => {
                let marked = Mark {
                    ready,
                    owner,
                    pending,
                    from: committed,
                    to: done,
                };
                match marked.write(runner, counted, &mut dispositions).await {
                    Ok(()) => {
                        committed = done;
                        runner
                            .attempt(entry, &mut failing)
                            .await
                            .map_err(|reason| (index, reason))
                    }
                    Err(stop) => Err(stop),
                }
            }
        };
        match outcome {
            Ok(disposition) => {
                dispositions[index] = disposition;
                done = index + 1;
            }
            Err((at, reason)) => {
                let entry = &pending[at];
                tracing::warn!(sequence = %entry.sequence(), sub_sequence = entry.sub_sequence(), %reason, "the record is not done; stopping");
                dispositions[at] = Disposition::Reported;
                done = at;
                stopped = Some((at, reason));
                break;
            }
        }
    }
    let failing = last_failing(failing.known, pending, stopped.as_ref());
    Dispatched {
        dispositions,
        done_through: done.checked_sub(1).map(|last| pending[last].position()),
        stopped,
        failing,
        done_above: Vec::new(),
    }
}

/// The count of `entry` so far: as this run knows it, or as the row had it (another record's
/// failure in this run took the row's one slot).
fn counted(failing: &Failing, ready: &Ready, entry: &Entry) -> Option<FailingRecord> {
    let position = entry.position();
    [failing.known.as_ref(), ready.state.failing.as_ref()]
        .into_iter()
        .flatten()
        .find(|known| known.is(&position))
        .cloned()
}

/// What the last write says of the failing record, the row holding the last pin: what is true
/// of it; but when the run stopped before a record had its say (the store, the lease, the
/// deadline), that record stays suspect, its attempts as they are, so the next delivery runs
/// carefully too.
fn last_failing(
    known: Option<FailingRecord>,
    pending: &[Entry],
    stopped: Option<&(usize, StopReason)>,
) -> FailingChange {
    let undecided = stopped.filter(|(_, reason)| {
        matches!(
            reason,
            StopReason::Store(_) | StopReason::Fenced | StopReason::Deadline
        )
    });
    if let Some((index, _)) = undecided {
        let position = pending[*index].position();
        let attempts = known
            .as_ref()
            .filter(|known| known.is(&position))
            .map_or(0, |known| known.attempts);
        let mut suspect = FailingRecord::first(&position, DIED, 0);
        suspect.attempts = attempts;
        if let Some(known) = known.filter(|known| known.is(&position)) {
            suspect.first_failure = known.first_failure;
            suspect.last_failure = known.last_failure;
        }
        return FailingChange::Set(suspect);
    }
    known.map_or(FailingChange::Clear, FailingChange::Set)
}

/// What to do with the next record.
enum Pinned<'e> {
    /// Run it, pinned first.
    Run,
    /// It has used up its attempts: dead-letter it without running it.
    Out(&'e crate::record::Record),
    /// The checks before a record say the shard stops here.
    Stop(StopReason),
}

/// Whether `entry`, counted so far as `counted`, has used up its attempts (and a sink takes it).
fn pinned_out<'e, H: Handler>(
    runner: &Runner<'_, H>,
    counted: Option<&FailingRecord>,
    entry: &'e Entry,
) -> Pinned<'e> {
    let used_up = counted.is_some_and(|counted| counted.attempts >= runner.settings.max_attempts);
    if !used_up || runner.settings.dead_letters.is_none() {
        return Pinned::Run;
    }
    match runner.prepare(entry) {
        Prepared::Run { record, .. } => Pinned::Out(record),
        Prepared::Stop(reason) => Pinned::Stop(reason),
        Prepared::Undecodable(_) => Pinned::Run,
    }
}

/// Dead-letters the pinned `record`, its attempts (`counted`) used up, with its last error.
async fn dead_letter<H: Handler>(
    runner: &Runner<'_, H>,
    record: &crate::record::Record,
    counted: Option<FailingRecord>,
    failing: &mut Failing,
) -> Result<Disposition, StopReason> {
    let (attempts, error) = counted
        .map(|counted| (counted.attempts, counted.last_error))
        .unwrap_or_default();
    tracing::error!(
        stream = record.stream(),
        shard = record.shard(),
        sequence = %record.sequence(),
        sub_sequence = record.sub_sequence(),
        attempts,
        "the record used up its attempts, invocations that died running it included: dead-lettering it without running it again"
    );
    runner
        .dead_letter(
            record,
            attempts,
            error,
            DeadLetterReason::Exhausted,
            failing,
        )
        .await
}

/// The mark before `pending[to]`: the records from `from` to `to` done since the last mark.
struct Mark<'a> {
    ready: &'a Ready,
    owner: &'a str,
    pending: &'a [Entry],
    from: usize,
    to: usize,
}

impl Mark<'_> {
    /// Writes the mark: the records done since the last mark checkpointed (with a
    /// transactional handler, their writes committed with it), and the next record pinned, its
    /// attempts (`counted` so far) counted as if it dies. The lease stays ours. When the
    /// records' commit stops at one of them, the run stops there.
    async fn write<H: Handler>(
        &self,
        runner: &Runner<'_, H>,
        counted: Option<FailingRecord>,
        dispositions: &mut [Disposition],
    ) -> Result<(), (usize, StopReason)> {
        let position = self.pending[self.to].position();
        let now = runner.invocation.now();
        let pin = counted.map_or_else(
            || FailingRecord::first(&position, DIED, now),
            |counted| counted.again(&position, DIED, now),
        );
        let mark = |dispatched: &Dispatched| {
            let (progress, mut commit) = last_write(self.ready, dispatched);
            if dispatched.stopped.is_none() {
                commit.failing = FailingChange::Set(pin.clone());
                commit.reported = ReportedChange::Set(position.clone());
            }
            commit.keep_lease = true;
            (progress, commit)
        };
        #[cfg(feature = "dynamodb")]
        if runner.settings.transactional && self.to > self.from {
            return self.commit_done(runner, &mark, dispositions).await;
        }
        let _ = dispositions;
        let so_far = Dispatched {
            dispositions: Vec::new(),
            done_through: self
                .to
                .checked_sub(1)
                .map(|last| self.pending[last].position()),
            stopped: None,
            failing: FailingChange::Keep,
            done_above: Vec::new(),
        };
        let (_, commit) = mark(&so_far);
        let store = runner.settings.store.as_ref();
        match store.commit(&self.ready.key, self.owner, &commit).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                runner.lease.fence();
                Err((self.to, StopReason::Fenced))
            }
            Err(error) => Err((self.to, StopReason::Store(error.to_string()))),
        }
    }

    /// With a transactional handler: commits the writes of the records done since the last
    /// mark with the checkpoint, in the mark, through the shard mode's transactional commit.
    #[cfg(feature = "dynamodb")]
    async fn commit_done<H: Handler>(
        &self,
        runner: &Runner<'_, H>,
        mark: &(dyn Fn(&Dispatched) -> (Option<Position>, crate::store::Commit) + Sync),
        dispositions: &mut [Disposition],
    ) -> Result<(), (usize, StopReason)> {
        let done = &self.pending[self.from..self.to];
        let staged: std::collections::BTreeMap<Position, crate::effects::Writes> = {
            let mut staged = runner
                .staged
                .expect("the shard mode stages a transactional handler's writes")
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            done.iter()
                .filter_map(|entry| {
                    let position = entry.position();
                    staged.remove(&position).map(|writes| (position, writes))
                })
                .collect()
        };
        let dispatched = Dispatched {
            dispositions: dispositions[self.from..self.to].to_vec(),
            done_through: done.last().map(Entry::position),
            stopped: None,
            failing: FailingChange::Keep,
            done_above: Vec::new(),
        };
        let shard = super::transactional::Shard {
            key: &self.ready.key,
            owner: self.owner,
            state: &self.ready.state,
            entries: &self.ready.entries,
            pending: done,
        };
        let (settled, stopped, _) = Box::pin(super::transactional::commit(
            runner, &shard, staged, dispatched, mark,
        ))
        .await;
        dispositions[self.from..self.to].copy_from_slice(&settled);
        match stopped {
            Some((index, reason)) => Err((self.from + index, reason)),
            None => Ok(()),
        }
    }
}
