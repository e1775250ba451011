//! When to try a failed batch again: exponential backoff with jitter, a
//! provider's `retry-after` as a floor, and a hard cap on attempts, so every
//! batch ends by construction. Pure: the randomness is passed in.

use std::time::Duration;

use rand::RngExt;

use crate::config::DeliveryConfig;

/// The retry rules of a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
    /// Attempts in all, the first one included.
    pub max_attempts: u32,
}

/// What to do after a retryable failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    RetryIn(Duration),
    GiveUp,
}

impl RetryPolicy {
    pub fn from_config(d: &DeliveryConfig) -> RetryPolicy {
        RetryPolicy {
            base: Duration::from_millis(d.retry_base_ms),
            max: Duration::from_millis(d.retry_max_ms),
            max_attempts: d.max_attempts,
        }
    }

    /// After `failed` attempts have failed (1 after the first), the next step.
    /// The delay is drawn from [d/2, d] with d = min(max, base * 2^(failed-1)), and is
    /// never shorter than the provider's `retry_after`.
    pub fn after_failure(&self, failed: u32, retry_after: Option<Duration>, rng: &mut impl RngExt) -> Next {
        if failed >= self.max_attempts {
            return Next::GiveUp;
        }
        let exp = failed.saturating_sub(1).min(30);
        let ceiling = self.base.saturating_mul(1u32 << exp).min(self.max);
        let half = ceiling / 2;
        let jitter = Duration::from_millis(rng.random_range(0..=half.as_millis() as u64));
        let delay = (half + jitter).max(retry_after.unwrap_or_default());
        Next::RetryIn(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn policy() -> RetryPolicy {
        RetryPolicy { base: Duration::from_secs(1), max: Duration::from_secs(60), max_attempts: 5 }
    }

    #[test]
    fn delays_double_within_their_jitter_band() {
        let mut rng = StdRng::seed_from_u64(7);
        for (failed, ceiling) in [(1, 1_000), (2, 2_000), (3, 4_000), (4, 8_000)] {
            for _ in 0..50 {
                let Next::RetryIn(d) = policy().after_failure(failed, None, &mut rng) else {
                    panic!("attempt {failed} must retry");
                };
                let ms = d.as_millis() as u64;
                assert!((ceiling / 2..=ceiling).contains(&ms), "attempt {failed}: {ms} ms");
            }
        }
    }

    #[test]
    fn delays_stop_growing_at_the_maximum() {
        let p = RetryPolicy { max_attempts: 100, ..policy() };
        let mut rng = StdRng::seed_from_u64(1);
        let Next::RetryIn(d) = p.after_failure(40, None, &mut rng) else { panic!() };
        assert!(d <= Duration::from_secs(60) && d >= Duration::from_secs(30), "{d:?}");
    }

    #[test]
    fn the_attempt_cap_ends_every_batch() {
        let mut rng = StdRng::seed_from_u64(3);
        assert!(matches!(policy().after_failure(4, None, &mut rng), Next::RetryIn(_)));
        assert_eq!(policy().after_failure(5, None, &mut rng), Next::GiveUp);
        assert_eq!(policy().after_failure(6, None, &mut rng), Next::GiveUp);
        let once = RetryPolicy { max_attempts: 1, ..policy() };
        assert_eq!(once.after_failure(1, None, &mut rng), Next::GiveUp);
    }

    #[test]
    fn retry_after_is_a_floor() {
        let mut rng = StdRng::seed_from_u64(9);
        let Next::RetryIn(d) = policy().after_failure(1, Some(Duration::from_secs(7)), &mut rng) else { panic!() };
        assert_eq!(d, Duration::from_secs(7));
    }

    #[test]
    fn same_seed_same_delays() {
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (1..5).map(|n| policy().after_failure(n, None, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(11), draw(11));
    }
}
