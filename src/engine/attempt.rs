//! The shared attempt runner: one record through the handler, guarded, and what a failure
//! means.
//!
//! Every dispatcher (in order, per key, careful, the partition-key mode) runs a record through
//! [`Runner::attempt`] and nothing else: the checks before the call (the lease, the deadline),
//! the call with its panic and time-out guard, the failure counted against the row's failing
//! record, and the dead letter once a record is rejected or out of attempts. So a record is
//! treated alike whichever mode dispatched it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use tracing::Instrument;

use super::batch::Entry;
use super::invocation::{Invocation, LeaseWatch};
use super::settings::Settings;
use crate::clock::{Clock, Sleep};
use crate::dead_letter::{DeadLetter, DeadLetterReason};
use crate::handler::{Handler, Outcome};
use crate::key::LeaseKey;
use crate::record::Record;
use crate::report::{Disposition, StopReason};
use crate::sequence::Position;
use crate::store::{FailingChange, FailingRecord};

/// Runs records for one shard of one invocation: the processor's settings, the invocation's
/// deadline and the lease held (one that never lapses in the partition-key mode).
pub(crate) struct Runner<'a, H> {
    pub(crate) settings: &'a Settings<H>,
    pub(crate) invocation: &'a Invocation,
    pub(crate) lease: &'a LeaseWatch,
    /// Where the writes of a transactional handler's records go until the commit, by record;
    /// `None` where nothing commits them.
    #[cfg(feature = "dynamodb")]
    pub(crate) staged: Option<&'a Staged>,
}

/// The writes staged by a transactional handler, by record.
#[cfg(feature = "dynamodb")]
pub(crate) type Staged = std::sync::Mutex<std::collections::BTreeMap<Position, Writes>>;

impl<H: Handler> Runner<'_, H> {
    /// Runs one record, unless something says the shard must stop before it. A record that
    /// fails is counted in `failing`, and dead-lettered when it is rejected or out of attempts.
    ///
    /// The record runs in a `record` span (stream, shard, sequence and sub-sequence number)
    /// only when `DEBUG` is on: every line the runner and the dispatchers write about a record
    /// names its sequence number itself, under the `shard` span that names the stream and
    /// shard, and a span per record costs a string per record.
    pub(crate) async fn attempt(
        &self,
        entry: &Entry,
        failing: &mut Failing,
    ) -> Result<Disposition, StopReason> {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let span = tracing::debug_span!(
                "record",
                stream = entry.key().map(LeaseKey::stream),
                shard = entry.key().map(LeaseKey::shard),
                sequence = %entry.sequence(),
                sub_sequence = entry.sub_sequence(),
            );
            self.run(entry, failing).instrument(span).await
        } else {
            self.run(entry, failing).await
        }
    }

    /// [`attempt`](Self::attempt)'s steps: the checks, the guarded call (with a transactional
    /// handler's writes beside it), what it came to, and a failure counted.
    async fn run(&self, entry: &Entry, failing: &mut Failing) -> Result<Disposition, StopReason> {
        let (record, now, stop_at) = match self.prepare(entry) {
            Prepared::Run {
                record,
                now,
                stop_at,
            } => (record, now, stop_at),
            Prepared::Stop(reason) => return Err(reason),
            Prepared::Undecodable(error) => {
                let reason = StopReason::Rejected(error.to_string());
                return self.failed(error.record(), reason, true, failing).await;
            }
        };
        #[cfg(feature = "dynamodb")]
        let (called, writes) = if self.settings.transactional {
            crate::effects::staging(self.call(record.clone(), stop_at)).await
        } else {
            (self.call(record.clone(), stop_at).await, None)
        };
        #[cfg(not(feature = "dynamodb"))]
        let (called, writes) = (self.call(record.clone(), stop_at).await, None);
        match self.settle(record, called, writes, now, failing) {
            Settle::Done(disposition) => Ok(disposition),
            Settle::Stop(reason) => Err(reason),
            Settle::Failed(reason, rejected) => {
                self.failed(record, reason, rejected, failing).await
            }
        }
    }

    /// What comes before a record's call: the entry's record, unless the entry or the checks
    /// (the lease, the deadline) say the shard stops here.
    pub(crate) fn prepare<'e>(&self, entry: &'e Entry) -> Prepared<'e> {
        let Self {
            invocation, lease, ..
        } = self;
        let record = match entry {
            Entry::Record(record) => record,
            Entry::Malformed(malformed) => {
                return Prepared::Stop(StopReason::Malformed(malformed.0.to_string()));
            }
            Entry::AfterMalformed(_) => {
                return Prepared::Stop(StopReason::Malformed(
                    "an earlier record of the batch cannot be processed".to_owned(),
                ));
            }
            Entry::Undecodable(error) => return Prepared::Undecodable(error),
            Entry::Placed(placed) => unreachable!(
                "record {} of the event is run before it is read",
                placed.sequence
            ),
        };
        // One reading of the clock serves both checks and the fair share should the record run
        // into the deadline.
        let now = invocation.now();
        if lease.lost_at(now) {
            return Prepared::Stop(StopReason::Fenced);
        }
        if !invocation.may_start_at(now) {
            return Prepared::Stop(StopReason::Deadline);
        }
        let stop_at = invocation.stop_at();
        Prepared::Run {
            record,
            now,
            stop_at,
        }
    }

    /// What the call of `record`, started at `now`, came to.
    pub(crate) fn settle(
        &self,
        record: &Record,
        called: Result<Outcome, StopReason>,
        writes: Option<Writes>,
        now: u64,
        failing: &mut Failing,
    ) -> Settle {
        let (reason, rejected) = match called {
            Ok(Outcome::Ack) => {
                // Most handlers stage nothing: `keep` is called only for writes.
                if let Some(reason) = writes.and_then(|writes| self.keep(record, writes)) {
                    return Settle::Failed(reason, false);
                }
                failing.succeeded(record);
                return Settle::Done(Disposition::Processed);
            }
            Ok(Outcome::Retry(error)) => (StopReason::Retry(error.to_string()), false),
            Ok(Outcome::Reject(error)) => (StopReason::Rejected(error.to_string()), true),
            // Cut by the invocation's deadline, not by its own fault: a record started late had
            // no fair chance, and its effect may still land. Only a record given at least half
            // of the invocation's time counts an attempt, so one that hangs is still
            // dead-lettered in the end (it comes first in the redelivery, with the whole time).
            Err(StopReason::HandlerTimedOut) if !self.invocation.had_fair_share(now) => {
                tracing::warn!(
                    sequence = %record.sequence(),
                    sub_sequence = record.sub_sequence(),
                    "the record started late and was cut by the deadline; not counted as an attempt"
                );
                return Settle::Stop(StopReason::HandlerTimedOut);
            }
            Err(reason) => (reason, false),
        };
        Settle::Failed(reason, rejected)
    }

    /// Keeps the writes of a done `record` for the commit; or, where nothing would commit
    /// them, says why the record is not done (its writes are never dropped).
    #[cfg(feature = "dynamodb")]
    fn keep(&self, record: &Record, writes: Writes) -> Option<StopReason> {
        let Some(staged) = self.staged else {
            return Some(StopReason::Retry(
                "this mode cannot commit a transactional handler's writes with its checkpoint"
                    .to_owned(),
            ));
        };
        staged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(record.position(), writes);
        None
    }

    /// Nothing to keep without transactions.
    #[cfg(not(feature = "dynamodb"))]
    #[allow(clippy::unused_self, reason = "the same call as with transactions")]
    const fn keep(&self, _: &Record, (): Writes) -> Option<StopReason> {
        None
    }

    /// Counts a failure of `record` and dead-letters it when it was `rejected` or is out of
    /// attempts (and a sink is set); otherwise the shard stops there.
    pub(crate) async fn failed(
        &self,
        record: &Record,
        reason: StopReason,
        rejected: bool,
        failing: &mut Failing,
    ) -> Result<Disposition, StopReason> {
        let position = record.position();
        // `Rejected`'s own text is for a shard that stops there (no sink); a dead letter is
        // the other case and says only what the handler said.
        let error = match &reason {
            StopReason::Rejected(message) if self.settings.dead_letters.is_some() => {
                format!("the handler rejected the record: {message}")
            }
            _ => reason.to_string(),
        };
        let attempts = failing.failed(&position, &error, self.invocation.now());
        if self.settings.dead_letters.is_none() {
            if rejected {
                tracing::warn!(
                    sequence = %record.sequence(),
                    sub_sequence = record.sub_sequence(),
                    %reason,
                    "no dead-letter sink is configured: the rejected record is reported and retried"
                );
            }
            return Err(reason);
        }
        let dead_reason = if rejected {
            DeadLetterReason::Rejected
        } else if attempts >= self.settings.max_attempts {
            DeadLetterReason::Exhausted
        } else {
            return Err(reason);
        };
        self.dead_letter(record, attempts, error, dead_reason, failing)
            .await
    }

    /// Sends `record` to the dead-letter sink after `attempts` attempts, the last one's `error`
    /// with it, and moves past it; or says why the shard stops there instead (the lease was
    /// lost meanwhile, the sink failed). Only with a sink.
    pub(crate) async fn dead_letter(
        &self,
        record: &Record,
        attempts: u32,
        error: String,
        dead_reason: DeadLetterReason,
        failing: &mut Failing,
    ) -> Result<Disposition, StopReason> {
        let Some(sink) = &self.settings.dead_letters else {
            return Err(StopReason::Retry(error));
        };
        // A handler that ran long may have outlived the lease, and a new owner may have run
        // the record since: a dead letter sent now would be a second handling of it. Reported
        // instead, it is the new owner's.
        if self.lease.lost_at(self.invocation.now()) {
            tracing::warn!(
                sequence = %record.sequence(),
                sub_sequence = record.sub_sequence(),
                "the lease was lost while the record ran: not dead-lettered, reported for its new owner"
            );
            return Err(StopReason::Fenced);
        }
        let mut letter = DeadLetter::new(record.clone(), attempts, error, dead_reason);
        letter.at = self.invocation.clock().now();
        match sink.send(&letter).await {
            Ok(()) => {
                tracing::warn!(
                    sequence = %record.sequence(),
                    sub_sequence = record.sub_sequence(),
                    attempts,
                    reason = dead_reason.as_str(),
                    error = letter.error,
                    "dead-lettered the record; moving past it"
                );
                failing.succeeded(record);
                Ok(Disposition::DeadLettered)
            }
            Err(sink_error) => {
                tracing::error!(
                    stream = record.stream(),
                    shard = record.shard(),
                    sequence = %record.sequence(),
                    sub_sequence = record.sub_sequence(),
                    error = %sink_error,
                    "could not dead-letter the record; it is reported and retried"
                );
                Err(StopReason::DeadLetterFailed(sink_error.to_string()))
            }
        }
    }

    /// Calls the handler, turning a panic or a run past `stop_at` (epoch milliseconds) into a
    /// stop. The handler's future is held in the returned guard rather than boxed: a record's
    /// dispatch allocates nothing for it.
    pub(crate) fn call(
        &self,
        record: Record,
        stop_at: Option<u64>,
    ) -> impl Future<Output = Result<Outcome, StopReason>> + Send + '_ {
        Guarded {
            // Called now, as `Handler::handle` is: the user code runs before the first poll.
            handler: self.settings.handler.handle_unboxed(record),
            stop_at,
            clock: self.invocation.clock(),
            timer: None,
        }
    }
}

/// What the checks before a record say.
pub(crate) enum Prepared<'e> {
    /// Run the record; the clock read `now`, and its call stops at `stop_at`.
    Run {
        record: &'e Record,
        now: u64,
        stop_at: Option<u64>,
    },
    /// The shard stops before the entry.
    Stop(StopReason),
    /// A KPL aggregate that cannot be read: a failure of its own.
    Undecodable(&'e crate::kpl::KplError),
}

/// What a call came to.
pub(crate) enum Settle {
    Done(Disposition),
    Stop(StopReason),
    /// A failure to count, `true` when rejected.
    Failed(StopReason, bool),
}

/// A transactional handler's writes for one record; nothing without transactions.
#[cfg(feature = "dynamodb")]
type Writes = crate::effects::Writes;
#[cfg(not(feature = "dynamodb"))]
type Writes = ();

/// The failing record as dispatch goes: the one the row remembered, and the change to write.
pub(crate) struct Failing {
    /// The failing record the row (or this dispatch) knows of.
    pub(crate) known: Option<FailingRecord>,
    /// What to write of it.
    pub(crate) change: FailingChange,
}

impl Failing {
    /// Counts a failure of the record at `position` at `now` (epoch milliseconds); returns its
    /// attempts so far.
    pub(crate) fn failed(&mut self, position: &Position, error: &str, now: u64) -> u32 {
        let next = match &self.known {
            Some(known) => known.again(position, error, now),
            None => FailingRecord::first(position, error, now),
        };
        let attempts = next.attempts;
        self.known = Some(next.clone());
        self.change = FailingChange::Set(next);
        attempts
    }

    /// `record` is done (processed or dead-lettered): forget it if it is the failing one.
    pub(crate) fn succeeded(&mut self, record: &Record) {
        // Most records were never failing: no position is built for them.
        if self
            .known
            .as_ref()
            .is_some_and(|known| known.is(&record.position()))
        {
            self.known = None;
            self.change = FailingChange::Clear;
        }
    }
}

/// Why a handler that panicked with `panic` stopped, in its own words when it gave any.
#[cold]
fn panicked(panic: &(dyn std::any::Any + Send)) -> StopReason {
    StopReason::Panicked(
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned()),
    )
}

pin_project_lite::pin_project! {
    /// A handler's future, guarded: a panic becomes an error, so one bad record cannot take
    /// the batch (and its checkpoint) down with it, and a run past `stop_at` is stopped.
    ///
    /// The timer is armed only once the handler waits: one that finishes on its first poll
    /// costs no timer, and `tokio::time::timeout` would not have stopped it either, since it
    /// polls the future before its deadline. Armed, it fires at `stop_at` however long that
    /// first poll took.
    struct Guarded<'a, F> {
        // The handler's future, pinned inside the guard.
        #[pin]
        handler: F,
        // Epoch milliseconds; `None` when the invocation has no deadline.
        stop_at: Option<u64>,
        // The invocation's clock, which the timer waits on.
        clock: &'a dyn Clock,
        timer: Option<Sleep>,
    }
}

impl<F: Future<Output = Outcome>> Future for Guarded<'_, F> {
    type Output = Result<Outcome, StopReason>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let handler = this.handler;
        match std::panic::catch_unwind(AssertUnwindSafe(|| handler.poll(cx))) {
            Ok(Poll::Ready(outcome)) => return Poll::Ready(Ok(outcome)),
            Ok(Poll::Pending) => {}
            Err(panic) => return Poll::Ready(Err(panicked(panic.as_ref()))),
        }
        let Some(stop_at) = *this.stop_at else {
            return Poll::Pending;
        };
        let clock = *this.clock;
        let timer = this.timer.get_or_insert_with(|| clock.sleep_until(stop_at));
        timer
            .as_mut()
            .poll(cx)
            .map(|()| Err(StopReason::HandlerTimedOut))
    }
}
