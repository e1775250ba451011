//! When to try a failed batch again: exponential backoff with jitter and a
//! provider's `retry-after` as a floor. There is no cap on attempts: a batch
//! ends at its deadline (the last gate), so an outage delays mail instead of
//! failing it. Pure: the randomness is passed in.

use std::time::Duration;

use rand::RngExt;

use crate::config::DeliveryConfig;

/// The retry rules of a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
}

impl RetryPolicy {
    pub(crate) fn from_config(d: &DeliveryConfig) -> RetryPolicy {
        RetryPolicy { base: Duration::from_millis(d.retry_base_ms), max: Duration::from_millis(d.retry_max_ms) }
    }

    /// How long to wait after `failed` requests have failed (1 after the first).
    /// The delay is drawn from [d/2, d] with d = min(max, base * 2^(failed-1)), and is
    /// never shorter than the provider's `retry_after`.
    pub(crate) fn after_failure(&self, failed: u32, retry_after: Option<Duration>, rng: &mut impl RngExt) -> Duration {
        let exp = failed.saturating_sub(1).min(30);
        let ceiling = self.base.saturating_mul(1u32 << exp).min(self.max);
        let half = ceiling / 2;
        let jitter = Duration::from_millis(rng.random_range(0..=crate::model::ms(half)));
        (half + jitter).max(retry_after.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn policy() -> RetryPolicy {
        RetryPolicy { base: Duration::from_secs(1), max: Duration::from_secs(60) }
    }

    #[test]
    fn delays_double_within_their_jitter_band() {
        let mut rng = StdRng::seed_from_u64(7);
        for (failed, ceiling) in [(1, 1_000), (2, 2_000), (3, 4_000), (4, 8_000)] {
            for _ in 0..50 {
                let ms = crate::model::ms(policy().after_failure(failed, None, &mut rng));
                assert!((ceiling / 2..=ceiling).contains(&ms), "attempt {failed}: {ms} ms");
            }
        }
    }

    #[test]
    fn delays_stop_growing_at_the_maximum_and_never_give_up() {
        let mut rng = StdRng::seed_from_u64(1);
        for failed in [40, 1_000, u32::MAX] {
            let d = policy().after_failure(failed, None, &mut rng);
            assert!(d <= Duration::from_secs(60) && d >= Duration::from_secs(30), "{d:?}");
        }
    }

    #[test]
    fn retry_after_is_a_floor() {
        let mut rng = StdRng::seed_from_u64(9);
        assert_eq!(policy().after_failure(1, Some(Duration::from_secs(7)), &mut rng), Duration::from_secs(7));
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
