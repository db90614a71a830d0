//! A clock on tokio's time, virtual under a paused runtime: the invariant scenarios and the
//! local event source run hours of leases and deadlines in milliseconds.

use std::time::Duration;

use kinesis_checkpoint::clock::{Clock, Sleep};

/// A clock on tokio's time: a fixed wall time at its creation plus the [`tokio::time::Instant`]
/// time elapsed since.
///
/// Under a runtime whose time is paused (`#[tokio::test(start_paused = true)]`, or
/// `Builder::start_paused(true)`, with tokio's `test-util` feature), tokio's time is virtual: it
/// stands still while tasks run and jumps to the next timer when every task waits, so this
/// clock's wall time and its sleeps are virtual too, and a run is the same however loaded the
/// machine is. Under a runtime whose time runs, it is real time from a fixed start.
///
/// Create and read it inside the runtime whose time it follows: outside one, tokio's instant is
/// the system's, and a paused runtime's instant means nothing there.
///
/// ```
/// use std::time::Duration;
///
/// use kinesis_checkpoint::clock::Clock;
/// use kinesis_checkpoint_testing::TokioClock;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let clock = TokioClock::starting_at(1_764_512_345_000);
/// clock.sleep(Duration::from_millis(5)).await;
/// assert!(clock.now_millis() >= 1_764_512_345_005);
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    epoch_millis: u64,
    start: tokio::time::Instant,
    offset_millis: i64,
}

impl TokioClock {
    /// A clock that reads `epoch_millis` now.
    #[must_use]
    pub fn starting_at(epoch_millis: u64) -> Self {
        Self {
            epoch_millis,
            start: tokio::time::Instant::now(),
            offset_millis: 0,
        }
    }

    /// The same time line, read `offset_millis` ahead (or behind, when negative): another
    /// sandbox's clock, off by that much. Its sleeps last as long as this clock's.
    ///
    /// ```
    /// use kinesis_checkpoint::clock::Clock;
    /// use kinesis_checkpoint_testing::TokioClock;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let clock = TokioClock::starting_at(1_000_000);
    /// assert_eq!(clock.skewed(-250).now_millis() + 250, clock.now_millis());
    /// # }
    /// ```
    #[must_use]
    pub const fn skewed(mut self, offset_millis: i64) -> Self {
        self.offset_millis = self.offset_millis.saturating_add(offset_millis);
        self
    }
}

impl Clock for TokioClock {
    fn now_millis(&self) -> u64 {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_millis
            .saturating_add(elapsed)
            .saturating_add_signed(self.offset_millis)
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }

    fn monotonic(&self) -> Duration {
        self.start.elapsed()
    }
}
