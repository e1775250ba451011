//! The team rate limit as Resend applies it: requests counted in a sliding
//! second when their head arrives, no burst, and the `ratelimit-*` and
//! `retry-after` headers on every answer.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Arrivals within the last second.
#[derive(Default)]
pub(crate) struct SlidingWindow {
    arrivals: VecDeque<Instant>,
    /// The most arrivals seen in any sliding second.
    pub max_in_1s: u64,
}

/// Rate-limit facts for one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateInfo {
    pub limited: bool,
    pub limit: Option<u32>,
    pub remaining: u32,
    pub reset_secs: u64,
    pub retry_after: Option<u64>,
}

impl SlidingWindow {
    /// Records an arrival at `now` and decides whether it is over `limit`.
    pub(crate) fn arrive(&mut self, now: Instant, limit: Option<u32>) -> RateInfo {
        let second = Duration::from_secs(1);
        while self.arrivals.front().is_some_and(|&t| now.duration_since(t) >= second) {
            self.arrivals.pop_front();
        }
        // Heads are stamped before bodies are read, so arrivals may be handled out of order.
        let at = self.arrivals.iter().rposition(|&t| t <= now).map_or(0, |i| i + 1);
        self.arrivals.insert(at, now);
        let in_window = self.arrivals.iter().filter(|&&t| t <= now).count() as u64;
        self.max_in_1s = self.max_in_1s.max(in_window);
        let oldest = *self.arrivals.front().expect("just inserted");
        let reset_secs = crate::model::ms(second.saturating_sub(now.duration_since(oldest))).div_ceil(1000).max(1);
        match limit {
            Some(limit) => {
                let limited = in_window > u64::from(limit);
                RateInfo {
                    limited,
                    limit: Some(limit),
                    remaining: u32::try_from(u64::from(limit).saturating_sub(in_window)).unwrap_or(0),
                    reset_secs,
                    retry_after: limited.then_some(reset_secs),
                }
            }
            None => RateInfo { limited: false, limit: None, remaining: 0, reset_secs, retry_after: None },
        }
    }
}

impl RateInfo {
    /// Writes the `ratelimit-*` (and, when refused, `retry-after`) headers.
    pub fn write(&self, headers: &mut hyper::HeaderMap) {
        if let Some(limit) = self.limit {
            let mut set = |name: &'static str, value: u64| {
                headers.insert(name, value.into());
            };
            set("ratelimit-limit", u64::from(limit));
            set("ratelimit-remaining", u64::from(self.remaining));
            set("ratelimit-reset", self.reset_secs);
            if let Some(after) = self.retry_after {
                set("retry-after", after);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_burst_above_the_limit_in_any_sliding_second() {
        let mut w = SlidingWindow::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        for i in 0..3 {
            assert!(!w.arrive(at(i * 10), Some(3)).limited);
        }
        assert!(w.arrive(at(990), Some(3)).limited, "a fourth within the same second");
        // Refused arrivals count too: at 1000 ms the second still holds 10, 20, 990.
        assert!(w.arrive(at(1000), Some(3)).limited);
        assert!(!w.arrive(at(1030), Some(3)).limited, "10 and 20 have left the window");
        assert_eq!(w.max_in_1s, 4);
        assert_eq!(w.arrive(at(1031), None).remaining, 0);
    }
}
