//! The request limiter: no burst, one request per `1/rps` seconds plus a small
//! guard, measured between the moments requests actually leave, so the provider
//! never counts more than `rps` requests in any sliding second. The dispatcher
//! asks when the next slot is, seals its batch just before, and marks the
//! request sent when it leaves; a late start pushes the next slot back instead
//! of squeezing two requests together.
//!
//! A 429's `retry-after` pauses every slot; a `ratelimit-limit` below the
//! configured rate lowers the pace. This paces one instance; the Redis-backed
//! limiter that several instances share comes later. (governor was tried first:
//! it spaces the grants, not the departures, and a grant that is acted on late,
//! under CPU contention, let eleven requests reach the provider within a second.)

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::resend::RateHeaders;

/// Team-wide request pacing for this instance.
pub struct Limiter {
    guard: Duration,
    state: Mutex<State>,
}

struct State {
    rps: u32,
    /// When the last request left.
    last: Option<Instant>,
    paused_until: Option<Instant>,
}

impl Limiter {
    /// `rps` requests per second, each slot `guard` longer than `1/rps`.
    pub fn new(rps: u32, guard: Duration) -> Limiter {
        Limiter { guard, state: Mutex::new(State { rps: rps.max(1), last: None, paused_until: None }) }
    }

    /// The time between two slots.
    pub fn interval(&self) -> Duration {
        interval(self.state.lock().expect("limiter lock").rps, self.guard)
    }

    /// When the next request may leave: now, or later (never during a pause).
    pub fn next_slot(&self) -> Instant {
        let now = Instant::now();
        let s = self.state.lock().expect("limiter lock");
        let after_last = s.last.map(|t| t + interval(s.rps, self.guard));
        [Some(now), after_last, s.paused_until].into_iter().flatten().max().unwrap_or(now)
    }

    /// Records that a request left at `at` (only ever moves the mark later).
    pub fn sent(&self, at: Instant) {
        let mut s = self.state.lock().expect("limiter lock");
        if s.last.is_none_or(|t| t < at) {
            s.last = Some(at);
        }
    }

    /// Waits for the next slot, following it as it moves (a late departure, a new
    /// pause), and takes it: the caller sends right away. Gives up, returning how far
    /// off the slot is, when it lies more than `patience` ahead.
    pub async fn wait_for_slot(&self, patience: Duration) -> Result<(), Duration> {
        loop {
            let slot = self.next_slot();
            let now = Instant::now();
            if slot <= now {
                self.sent(now);
                return Ok(());
            }
            if slot - now > patience {
                return Err(slot - now);
            }
            tokio::time::sleep_until(slot).await;
        }
    }

    /// No slot is granted before `d` from now (a 429's `retry-after`).
    pub fn pause_for(&self, d: Duration) {
        let until = Instant::now() + d;
        let mut s = self.state.lock().expect("limiter lock");
        if s.paused_until.is_none_or(|u| u < until) {
            s.paused_until = Some(until);
        }
    }

    /// Obeys a response's rate headers; returns the new rate when it was lowered.
    pub fn observe(&self, rate: &RateHeaders) -> Option<u32> {
        let mut s = self.state.lock().expect("limiter lock");
        match rate.limit {
            Some(limit) if limit >= 1 && limit < s.rps => {
                s.rps = limit;
                Some(limit)
            }
            _ => None,
        }
    }
}

fn interval(rps: u32, guard: Duration) -> Duration {
    Duration::from_secs(1) / rps.max(1) + guard
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_includes_the_guard() {
        let l = Limiter::new(10, Duration::from_millis(2));
        assert_eq!(l.interval(), Duration::from_millis(102));
    }

    #[test]
    fn a_lower_provider_limit_is_adopted_and_a_higher_one_ignored() {
        let l = Limiter::new(10, Duration::ZERO);
        let higher = RateHeaders { limit: Some(20), ..Default::default() };
        assert_eq!(l.observe(&higher), None);
        let lower = RateHeaders { limit: Some(5), ..Default::default() };
        assert_eq!(l.observe(&lower), Some(5));
        assert_eq!(l.interval(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn slots_are_spaced_with_no_burst() {
        let l = Limiter::new(10, Duration::from_millis(2));
        let start = Instant::now();
        let mut slots = Vec::new();
        for _ in 0..11 {
            l.wait_for_slot(Duration::MAX).await.unwrap();
            slots.push(Instant::now() - start);
        }
        assert_eq!(slots[0], Duration::ZERO);
        for pair in slots.windows(2) {
            assert_eq!(pair[1] - pair[0], Duration::from_millis(102));
        }
        // Eleven requests never fit in one second: the provider's window stays at ten.
        assert!(slots[10] - slots[0] > Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_departure_pushes_the_next_slot_back() {
        let l = Limiter::new(10, Duration::ZERO);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        let planned = l.next_slot();
        // The request for that slot actually left 40 ms late (a busy CPU, say).
        tokio::time::sleep_until(planned + Duration::from_millis(40)).await;
        l.sent(Instant::now());
        assert_eq!(l.next_slot() - planned, Duration::from_millis(140));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_limiter_does_not_bank_slots() {
        let l = Limiter::new(10, Duration::ZERO);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = Instant::now();
        assert_eq!(l.next_slot(), now);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        assert_eq!(l.next_slot() - now, Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_slot() {
        let l = Limiter::new(10, Duration::ZERO);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        let slot = l.next_slot();
        l.pause_for(Duration::from_secs(2));
        assert!(l.next_slot() > slot);
        let before = Instant::now();
        l.wait_for_slot(Duration::MAX).await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_secs(2));
    }
}
