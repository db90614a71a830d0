//! One invocation as the engine sees it: who it is (the lease owner), how long it has, and the
//! lease it holds on a shard.
//!
//! Every decision that reads the clock against the deadline or the lease goes through these two
//! types, so the shard mode, the dispatchers and the attempt runner agree on when to stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lambda_runtime::Context;

use crate::clock::Clock;
use crate::store::memory::millis;

/// 2001-09-09 in epoch milliseconds: every real deadline is later.
const PLAUSIBLE_EPOCH_MILLIS: u64 = 1_000_000_000_000;

/// This invocation's identity and deadline.
pub(crate) struct Invocation {
    pub(crate) owner: String,
    /// Epoch milliseconds; `None` when the context has none (a test's default context).
    deadline: Option<u64>,
    /// The latest start (epoch milliseconds) that leaves a record at least half of the time
    /// from the batch's arrival to the deadline: computed once, as it is asked before every
    /// record.
    fair_share_until: u64,
    /// The last time (epoch milliseconds) a record may start: one starting later would have
    /// no more than the deadline's margin left. Computed once, in whole milliseconds, as it is
    /// asked before every record.
    last_start: Option<u64>,
    /// When a record's call is stopped (epoch milliseconds): the deadline less its margin,
    /// whenever the record started.
    stop_at: Option<u64>,
    /// The processor's clock: every reading of the time in this invocation.
    clock: Arc<dyn Clock>,
}

impl Invocation {
    /// The invocation of `context`, on `clock`, whose records stop `margin` before the deadline.
    pub(crate) fn new(context: &Context, clock: Arc<dyn Clock>, margin: Duration) -> Self {
        // Lambda's request ids are unique; a context without one (a test's) still needs an owner
        // no other invocation shares, or two of them would both hold the lease.
        static LOCAL: AtomicU64 = AtomicU64::new(0);
        let request = if context.request_id.is_empty() {
            format!(
                "local-{}-{}",
                std::process::id(),
                LOCAL.fetch_add(1, Ordering::Relaxed)
            )
        } else {
            context.request_id.clone()
        };
        let function = &context.env_config.function_name;
        let started = clock.now_millis();
        let deadline = match context.deadline {
            0 => None,
            // `cargo lambda watch` (1.9) sends its timeout, not an epoch deadline. A value
            // before 2001 cannot be a deadline: read it as the time left from now.
            relative if relative < PLAUSIBLE_EPOCH_MILLIS => Some(started.saturating_add(relative)),
            deadline => Some(deadline),
        };
        // Half of the time from arrival to the deadline, and a start no later than this leaves
        // at least that much; a budget under 2 ms has no half, and every start is fair.
        let fair_share_until = deadline.map_or(u64::MAX, |deadline| {
            match deadline.saturating_sub(started) / 2 {
                0 => u64::MAX,
                half => deadline - half,
            }
        });
        // A record starts while more than the margin is left, and its call stops once no more
        // than the margin is: in whole milliseconds of the deadline, the first is the margin's
        // floor, the second its ceiling.
        let whole = millis(margin);
        let rounded_up =
            whole.saturating_add(u64::from(!margin.subsec_nanos().is_multiple_of(1_000_000)));
        Self {
            clock,
            last_start: deadline.map(|deadline| deadline.saturating_sub(whole)),
            stop_at: deadline.map(|deadline| deadline.saturating_sub(rounded_up)),
            owner: if function.is_empty() {
                request
            } else {
                format!("{function}:{request}")
            },
            deadline,
            fair_share_until,
        }
    }

    /// The clock's time now, epoch milliseconds.
    pub(crate) fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// The clock everything in this invocation waits on.
    pub(crate) fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    pub(crate) fn time_left(&self) -> Option<Duration> {
        self.time_left_at(self.now())
    }

    /// The time left at `now` (epoch milliseconds), for a caller that has read the clock.
    pub(crate) fn time_left_at(&self, now: u64) -> Option<Duration> {
        self.deadline
            .map(|deadline| Duration::from_millis(deadline.saturating_sub(now)))
    }

    /// Whether a record may start at `now` (epoch milliseconds): more than the deadline's
    /// margin is left.
    pub(crate) fn may_start_at(&self, now: u64) -> bool {
        self.last_start.is_none_or(|last| now < last)
    }

    /// When a record's call is stopped (epoch milliseconds), or `None` without a deadline.
    pub(crate) const fn stop_at(&self) -> Option<u64> {
        self.stop_at
    }

    /// Whether a record started at `started` (epoch milliseconds) had at least half of the
    /// invocation's time: only then is a run into the deadline the record's own fault.
    pub(crate) fn had_fair_share(&self, started: u64) -> bool {
        started <= self.fair_share_until
    }

    /// A lease outlives the invocation that holds it by the clock-skew margin at most: an
    /// invocation that dies blocks its shard that long past its deadline, and the local view of
    /// the lease (which ends a margin early) lasts to the deadline.
    pub(crate) fn lease_ttl(&self, wanted: Duration, skew: Duration) -> Duration {
        self.time_left().map_or(wanted, |left| {
            wanted.min(left + skew).max(Duration::from_millis(1))
        })
    }
}

/// The lease as dispatch sees it: lost when a renew was refused or when it lapsed without one.
///
/// The store's expiry is the writer's clock at the request plus the TTL, and a rival judges it
/// by its own clock: the local view counts from the moment the request was *sent* and ends a
/// skew margin early, so it never outlives the stored lease, however slow the answer or the
/// gate, and whichever sandbox's clock runs ahead.
pub(crate) struct LeaseWatch {
    pub(crate) ttl: Duration,
    skew: u64,
    lost: AtomicBool,
    lapses_at: AtomicU64,
}

impl LeaseWatch {
    /// A lease that never lapses (the partition-key mode holds none), taken at `now` (epoch
    /// milliseconds).
    pub(crate) fn new(now: u64, ttl: Duration) -> Self {
        Self::starting_at(now, ttl, Duration::ZERO)
    }

    /// A lease for `ttl` whose claim was sent at `sent` (epoch milliseconds).
    pub(crate) fn starting_at(sent: u64, ttl: Duration, skew: Duration) -> Self {
        let skew = millis(skew);
        Self {
            ttl,
            skew,
            lost: AtomicBool::new(false),
            lapses_at: AtomicU64::new(Self::lapse(sent, ttl, skew)),
        }
    }

    fn lapse(sent: u64, ttl: Duration, skew: u64) -> u64 {
        sent.saturating_add(millis(ttl)).saturating_sub(skew)
    }

    /// The margin the local view ends early by.
    pub(crate) fn skew(&self) -> Duration {
        Duration::from_millis(self.skew)
    }

    /// A renew sent at `sent` (epoch milliseconds) was granted for `ttl`.
    pub(crate) fn renewed(&self, sent: u64, ttl: Duration) {
        self.lapses_at
            .store(Self::lapse(sent, ttl, self.skew), Ordering::Relaxed);
    }

    pub(crate) fn fence(&self) {
        self.lost.store(true, Ordering::Relaxed);
    }

    /// Whether the lease is lost at `now` (epoch milliseconds).
    pub(crate) fn lost_at(&self, now: u64) -> bool {
        self.lost.load(Ordering::Relaxed) || now >= self.lapses_at.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Sleep;

    const START: u64 = 1_800_000_000_000;

    /// A clock that reads `START` for ever: the tests give every other time explicitly.
    #[derive(Debug)]
    struct Stopped;

    impl Clock for Stopped {
        fn now_millis(&self) -> u64 {
            START
        }

        fn sleep(&self, duration: Duration) -> Sleep {
            Box::pin(tokio::time::sleep(duration))
        }

        fn monotonic(&self) -> Duration {
            Duration::ZERO
        }
    }

    /// An invocation that arrives at `START` with `deadline` in its context.
    fn arriving_with(deadline: u64) -> Invocation {
        arriving_with_margin(deadline, Duration::ZERO)
    }

    /// The same, with records stopped `margin` before the deadline.
    fn arriving_with_margin(deadline: u64, margin: Duration) -> Invocation {
        let mut context = Context::default();
        context.deadline = deadline;
        Invocation::new(&context, Arc::new(Stopped), margin)
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_starts_while_more_than_the_margin_is_left_and_stops_at_the_deadline_less_it()
    {
        let invocation = arriving_with_margin(START + 1_000, Duration::from_millis(100));
        assert!(invocation.may_start_at(START + 899));
        assert!(
            !invocation.may_start_at(START + 900),
            "only the margin is left"
        );
        assert_eq!(invocation.stop_at(), Some(START + 900));

        // A margin of 100.5 ms: at START + 900, 100 ms are left, not more than the margin; at
        // START + 899, 101 are, and the call has 0.5 of them, so it stops at once (whole
        // milliseconds, as Lambda gives the deadline).
        let invocation = arriving_with_margin(START + 1_000, Duration::from_micros(100_500));
        assert!(invocation.may_start_at(START + 899));
        assert!(!invocation.may_start_at(START + 900));
        assert_eq!(invocation.stop_at(), Some(START + 899));

        // Without a deadline, every start is allowed and no call is stopped.
        let invocation = arriving_with_margin(0, Duration::from_millis(100));
        assert!(invocation.may_start_at(u64::MAX - 1));
        assert_eq!(invocation.stop_at(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_has_a_fair_share_when_it_starts_by_the_middle_of_the_invocation() {
        let invocation = arriving_with(START + 1_000);
        assert!(invocation.had_fair_share(START));
        assert!(
            invocation.had_fair_share(START + 500),
            "half is a fair share"
        );
        assert!(!invocation.had_fair_share(START + 501));
        assert!(
            !invocation.had_fair_share(START + 2_000),
            "past the deadline"
        );

        // Without a deadline, or with less than 2 ms to it, every start is fair.
        assert!(arriving_with(0).had_fair_share(u64::MAX));
        assert!(arriving_with(START + 1).had_fair_share(START + 5));
    }
}
