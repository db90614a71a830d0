//! A clock whose cheap reading lags its precise one, for the tests of the checks the engine runs
//! before each record on the cheap reading (`Clock::now_millis_coarse`).

use std::sync::Arc;
use std::time::Duration;

use kinesis_checkpoint::clock::{Clock, Sleep};

/// `inner`, except that its cheap reading is `lag` milliseconds behind its precise one: more
/// than the system's coarse clock ever lags (a tick, a few milliseconds), so that a decision or
/// a time limit taken from the wrong reading shows.
#[derive(Debug)]
pub struct LaggingCheapReading {
    pub inner: Arc<dyn Clock>,
    pub lag: u64,
}

impl Clock for LaggingCheapReading {
    fn now_millis(&self) -> u64 {
        self.inner.now_millis()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.inner.sleep(duration)
    }

    fn monotonic(&self) -> Duration {
        self.inner.monotonic()
    }

    fn now_millis_coarse(&self) -> u64 {
        self.inner.now_millis().saturating_sub(self.lag)
    }
}
