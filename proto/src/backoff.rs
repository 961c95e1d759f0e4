//! [`Backoff`]: the one retry delay of the workspace — growing by a factor, bounded, jittered.
//!
//! Every loop that retries a failed call (the client following the leader, the scheduler's
//! propose/retry runtime, the view cache re-subscribing, a host connecting at start) waits
//! [`Backoff::next_delay`] between tries and calls [`Backoff::reset`] after a success. The
//! un-jittered delay starts at `initial` and grows by `factor` per call up to `max`; each delay
//! handed out is that value times a uniform draw from `[1 - jitter, 1 + jitter)`, so clients
//! that failed together do not retry together. Any delay is therefore at most
//! [`Backoff::longest`] = `max · (1 + jitter)`.
//!
//! The randomness comes in as an argument: tests and the simulator pass a seeded rng and get
//! the same delays every run; a shell with no rng of its own makes one with [`seeded_rng`].
//!
//! ```
//! use rand::SeedableRng;
//! use std::time::Duration;
//! use tessera_proto::backoff::Backoff;
//!
//! let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
//! let mut b = Backoff::new(Duration::from_millis(20), Duration::from_secs(2));
//! let first = b.next_delay(&mut rng);
//! assert!(first >= Duration::from_millis(10) && first < Duration::from_millis(30));
//! assert_eq!(b.base(), Duration::from_millis(40)); // doubled for the next try
//! b.reset();
//! assert_eq!(b.base(), Duration::from_millis(20));
//! ```

use rand::{Rng, SeedableRng};
use std::time::Duration;

/// A bounded, jittered, growing retry delay.
#[derive(Clone, Debug, PartialEq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    factor: f64,
    jitter: f64,
    /// The un-jittered delay the next call hands out.
    current: Duration,
}

impl Backoff {
    /// Doubling from `initial` up to `max` (raised to `initial` if smaller), each delay
    /// jittered by ±50 %.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max: max.max(initial), factor: 2.0, jitter: 0.5, current: initial }
    }

    /// Grows by `factor` per delay instead of doubling; below 1 (or not a number) it is 1.
    pub fn with_factor(mut self, factor: f64) -> Backoff {
        self.factor = if factor >= 1.0 && factor.is_finite() { factor } else { 1.0 };
        self
    }

    /// Spreads each delay by ±`jitter` (a fraction, clamped to 0..=1; 0 turns jitter off).
    pub fn with_jitter(mut self, jitter: f64) -> Backoff {
        self.jitter = if jitter.is_nan() { 0.0 } else { jitter.clamp(0.0, 1.0) };
        self
    }

    /// The delay to wait before the next try; the following one grows by the factor, up to
    /// the maximum.
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let base = self.current;
        self.current = scale(base, self.factor).unwrap_or(self.max).min(self.max);
        if self.jitter == 0.0 {
            return base;
        }
        let spread = rng.random_range(1.0 - self.jitter..1.0 + self.jitter);
        scale(base, spread).unwrap_or(self.longest())
    }

    /// Back to the first delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.initial;
    }

    /// The un-jittered delay the next [`Backoff::next_delay`] is drawn around.
    pub fn base(&self) -> Duration {
        self.current
    }

    /// The first delay.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The largest un-jittered delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The longest delay [`Backoff::next_delay`] can hand out: `max · (1 + jitter)`.
    pub fn longest(&self) -> Duration {
        scale(self.max, 1.0 + self.jitter).unwrap_or(Duration::MAX)
    }
}

/// `d · k`, or `None` when that does not fit a [`Duration`].
fn scale(d: Duration, k: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(d.as_secs_f64() * k).ok()
}

/// An rng for a shell's jitter, seeded from the system clock and `salt` (say, a hash of the
/// caller's name): processes started together still draw different delays. Tests pass their
/// own seeded rng to [`Backoff::next_delay`] instead.
pub fn seeded_rng(salt: u64) -> rand::rngs::SmallRng {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    rand::rngs::SmallRng::seed_from_u64(nanos ^ salt.rotate_left(32) ^ u64::from(std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn without_jitter_it_doubles_up_to_the_maximum_and_stays_there() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut b = Backoff::new(20 * MS, 2000 * MS).with_jitter(0.0);
        let got: Vec<u128> = (0..10).map(|_| b.next_delay(&mut rng).as_millis()).collect();
        assert_eq!(got, vec![20, 40, 80, 160, 320, 640, 1280, 2000, 2000, 2000]);
    }

    #[test]
    fn a_factor_other_than_two_is_honoured_and_one_below_one_means_constant() {
        let mut rng = SmallRng::seed_from_u64(1);
        let mut b = Backoff::new(100 * MS, 1000 * MS).with_jitter(0.0).with_factor(1.5);
        let got: Vec<u128> = (0..7).map(|_| b.next_delay(&mut rng).as_millis()).collect();
        assert_eq!(got, vec![100, 150, 225, 337, 506, 759, 1000]);
        let mut flat = Backoff::new(50 * MS, 1000 * MS).with_jitter(0.0).with_factor(0.5);
        assert!((0..5).all(|_| flat.next_delay(&mut rng) == 50 * MS));
        let mut nan = Backoff::new(50 * MS, 1000 * MS).with_jitter(0.0).with_factor(f64::NAN);
        assert!((0..5).all(|_| nan.next_delay(&mut rng) == 50 * MS));
    }

    #[test]
    fn jittered_delays_stay_within_the_spread_of_their_base_and_below_the_bound() {
        let mut rng = SmallRng::seed_from_u64(42);
        let mut b = Backoff::new(20 * MS, 2000 * MS);
        let (mut below, mut above) = (false, false);
        for _ in 0..2000 {
            let base = b.base();
            let d = b.next_delay(&mut rng);
            assert!(d >= base.mul_f64(0.5) && d < base.mul_f64(1.5), "{d:?} around {base:?}");
            assert!(d <= b.longest() && b.longest() == 3000 * MS);
            below |= d < base;
            above |= d > base;
        }
        // The draw really spreads both ways (a jitter that only shortened would pass the
        // bounds above).
        assert!(below && above);
    }

    #[test]
    fn the_same_seed_gives_the_same_delays() {
        let run = |seed| {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut b = Backoff::new(10 * MS, 200 * MS);
            (0..20).map(|_| b.next_delay(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(9), run(9));
        assert_ne!(run(9), run(10));
    }

    #[test]
    fn reset_starts_over_from_the_first_delay() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut b = Backoff::new(20 * MS, 2000 * MS).with_jitter(0.0);
        for _ in 0..5 {
            b.next_delay(&mut rng);
        }
        assert_eq!(b.base(), 640 * MS);
        b.reset();
        assert_eq!(b.next_delay(&mut rng), 20 * MS);
        assert_eq!(b.next_delay(&mut rng), 40 * MS);
    }

    #[test]
    fn degenerate_settings_do_not_panic() {
        let mut rng = SmallRng::seed_from_u64(5);
        // A maximum below the first delay is raised to it.
        let mut b = Backoff::new(500 * MS, 100 * MS);
        assert_eq!(b.max(), 500 * MS);
        assert!(b.next_delay(&mut rng) < 750 * MS);
        // Huge bounds saturate instead of overflowing.
        let mut huge = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX).with_jitter(1.0);
        for _ in 0..4 {
            huge.next_delay(&mut rng);
        }
        assert_eq!(huge.longest(), Duration::MAX);
        // Jitter is clamped to a fraction.
        let mut wide = Backoff::new(100 * MS, 100 * MS).with_jitter(7.0);
        assert!((0..100).all(|_| wide.next_delay(&mut rng) < 200 * MS));
        // Zero stays zero.
        let mut zero = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(zero.next_delay(&mut rng), Duration::ZERO);
    }
}
