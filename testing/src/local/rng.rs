//! The seeded randomness of a local run: every choice the event source makes by chance (a
//! duplicate delivery, a child delivered early, the order of concurrent deliveries) comes from
//! one seed, so a run that went wrong can be replayed.

/// A small, fast generator (`SplitMix64`): reproducible from its seed, not for cryptography.
///
/// ```
/// use kinesis_checkpoint_testing::local::Rng;
///
/// let mut a = Rng::new(7);
/// let mut b = Rng::new(7);
/// assert_eq!(a.below(1000), b.below(1000), "one seed, one sequence");
/// ```
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator that starts from `seed`.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Rng;
    /// let _ = Rng::new(42);
    /// ```
    #[must_use]
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Rng;
    /// let mut rng = Rng::new(1);
    /// assert_ne!(rng.next_u64(), rng.next_u64());
    /// ```
    pub const fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Rng;
    /// let mut rng = Rng::new(1);
    /// assert!(rng.below(10) < 10);
    /// ```
    pub const fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A number in `range` (its start when it is empty).
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Rng;
    /// let mut rng = Rng::new(1);
    /// assert!((5..8).contains(&rng.within(5..8)));
    /// ```
    pub fn within(&mut self, range: std::ops::Range<u64>) -> u64 {
        range.start + self.below(range.end.saturating_sub(range.start))
    }

    /// True with probability `p` (never when `p <= 0`, always when `p >= 1`).
    ///
    /// ```
    /// # use kinesis_checkpoint_testing::local::Rng;
    /// let mut rng = Rng::new(1);
    /// assert!(!rng.chance(0.0));
    /// assert!(rng.chance(1.0));
    /// ```
    pub fn chance(&mut self, p: f64) -> bool {
        // 53 bits: exactly representable, so the fraction is uniform in [0, 1).
        #[allow(clippy::cast_precision_loss)]
        let fraction = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        fraction < p
    }
}
