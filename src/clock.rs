//! One clock for everything that reads time.
//!
//! Lease expiries, Lambda's deadline and record arrival times are compared as wall time in epoch
//! milliseconds; renewals, handler time-outs and back-offs wait. Both go through one [`Clock`],
//! injected where the processor, the stores and the local event source are built, so that a
//! simulation runs on virtual time: its waits take no real time, and two runs of one seed see
//! the same times and replay exactly, however loaded the machine is. Production uses
//! [`SystemClock`], the system's wall time and tokio's timers.
//!
//! A leaf: this module imports nothing of the crate.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A wait the clock returns: it ends when the clock has advanced by the duration asked.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where time comes from.
///
/// The contract:
/// - [`now_millis`](Self::now_millis) is the wall time in milliseconds since the Unix epoch:
///   what lease expiries, Lambda's deadline and record arrival times are written and compared
///   in. It never runs backwards within one clock.
/// - [`sleep`](Self::sleep) returns a future that ends once `now_millis` has advanced by at
///   least `duration` (and no sooner, up to the clock's millisecond resolution). A zero duration
///   ends at once or at the next tick. The future is `'static`: it borrows nothing of the clock.
/// - Both are cheap.
///
/// Two clocks of one process may disagree (that is what a skewed sandbox is), but everything
/// one processor, store or event source does is timed by the one clock it was given.
///
/// ```
/// use std::time::Duration;
///
/// use kinesis_checkpoint::clock::{Clock, SystemClock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let clock = SystemClock;
/// let before = clock.now_millis();
/// clock.sleep(Duration::from_millis(2)).await;
/// assert!(clock.now_millis() >= before + 2);
/// # }
/// ```
pub trait Clock: Send + Sync + fmt::Debug {
    /// The wall time, in milliseconds since the Unix epoch.
    fn now_millis(&self) -> u64;

    /// A future that ends once `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> Sleep;

    /// The time since a fixed point of this clock, at its finest resolution, never running
    /// backwards: what a measurement of how long something took (a checkpoint write's latency)
    /// subtracts.
    ///
    /// ```
    /// use kinesis_checkpoint::clock::{Clock, SystemClock};
    ///
    /// let before = SystemClock.monotonic();
    /// assert!(SystemClock.monotonic() >= before);
    /// ```
    fn monotonic(&self) -> Duration;

    /// The wall time as a [`SystemTime`].
    ///
    /// ```
    /// use kinesis_checkpoint::clock::{Clock, SystemClock};
    ///
    /// assert!(SystemClock.now() > std::time::UNIX_EPOCH);
    /// ```
    fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.now_millis())
    }

    /// A future that ends once the clock reads `at` (epoch milliseconds) or later; at once when
    /// it already does.
    ///
    /// ```
    /// use kinesis_checkpoint::clock::{Clock, SystemClock};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let clock = SystemClock;
    /// let at = clock.now_millis() + 3;
    /// clock.sleep_until(at).await;
    /// assert!(clock.now_millis() >= at);
    /// # }
    /// ```
    fn sleep_until(&self, at: u64) -> Sleep {
        self.sleep(Duration::from_millis(at.saturating_sub(self.now_millis())))
    }
}

/// The system's wall time and tokio's timers: the clock of production, and the default
/// everywhere one is taken.
///
/// ```
/// use std::sync::Arc;
///
/// use kinesis_checkpoint::clock::{Clock, SystemClock};
///
/// let clock: Arc<dyn Clock> = Arc::new(SystemClock);
/// assert!(clock.now_millis() > 1_700_000_000_000);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> u64 {
        millis_since_epoch(SystemTime::now())
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }

    fn monotonic(&self) -> Duration {
        static BASE: OnceLock<Instant> = OnceLock::new();
        BASE.get_or_init(Instant::now).elapsed()
    }
}

/// The default clock, shared: [`SystemClock`].
///
/// ```
/// use kinesis_checkpoint::clock::{Clock, system};
///
/// assert!(system().now_millis() > 1_700_000_000_000);
/// ```
#[must_use]
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// The system's wall time, for what stamps a value without an injected clock at hand (a
/// [`Record`](crate::Record) built by hand, a dead letter built outside the processor).
pub(crate) fn system_time() -> SystemTime {
    SystemTime::now()
}

/// `time` in epoch milliseconds (0 before the epoch, `u64::MAX` past the year 584 million).
pub(crate) fn millis_since_epoch(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_before_the_epoch_reads_as_zero() {
        assert_eq!(millis_since_epoch(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(millis_since_epoch(UNIX_EPOCH + Duration::from_millis(7)), 7);
    }

    #[test]
    fn sleep_until_a_time_already_past_ends_at_once() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let clock = SystemClock;
            let started = std::time::Instant::now();
            clock.sleep_until(0).await;
            assert!(started.elapsed() < Duration::from_secs(1));
        });
    }
}
