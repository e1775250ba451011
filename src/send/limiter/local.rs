//! The limiter in this process (`resend.limiter = "process"`), which is also how an
//! instance paces alone while the shared one is out of reach.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::SLACK;
use crate::resend::RateHeaders;

/// Pacing kept in this process (`resend.limiter = "process"`): for a single instance
/// that wants no Redis round trip per request. The same two rules as limiter.lua.
pub(crate) struct LocalPacer {
    pub(super) guard: Duration,
    state: Mutex<PacerState>,
}

struct PacerState {
    pub(super) configured: u32,
    pub(super) rps: u32,
    /// The cadence: when the next request may leave.
    next: Option<Instant>,
    /// What the last grant changed (the cadence before it, the departure it pushed out of
    /// the window's memory), to take it back.
    undo: Option<(Option<Instant>, Option<Instant>)>,
    /// Requests granted so far.
    granted: u64,
    /// Departures of the last `configured` requests, the newest last.
    departures: VecDeque<Instant>,
    paused_until: Option<Instant>,
}

impl PacerState {
    pub(super) fn interval(&self) -> Duration {
        Duration::from_secs(1) / self.rps.max(1)
    }

    /// When the next request may leave, by the cadence, the pause and the window.
    pub(super) fn allowed(&self, guard: Duration) -> Option<Instant> {
        let n = self.rps as usize;
        let window = (self.departures.len() >= n)
            .then(|| self.departures[self.departures.len() - n] + Duration::from_secs(1) + guard);
        [self.next, self.paused_until, window].into_iter().flatten().max()
    }
}

impl LocalPacer {
    /// `rps` requests per second in any sliding second that is `guard` longer than one.
    pub fn new(rps: u32, guard: Duration) -> LocalPacer {
        let rps = rps.max(1);
        let state = PacerState {
            configured: rps,
            rps,
            next: None,
            undo: None,
            granted: 0,
            departures: VecDeque::new(),
            paused_until: None,
        };
        LocalPacer { guard, state: Mutex::new(state) }
    }

    /// The configured rate.
    pub(super) fn configured(&self) -> u32 {
        self.state.lock().expect("limiter lock").configured
    }

    /// The time between two slots of the cadence.
    pub fn interval(&self) -> Duration {
        self.state.lock().expect("limiter lock").interval()
    }

    /// When the next request may leave: now, or later (never during a pause).
    pub(super) fn next_slot(&self) -> Instant {
        let now = Instant::now();
        self.state.lock().expect("limiter lock").allowed(self.guard).map_or(now, |at| at.max(now))
    }

    /// Records that request `n` left at `at` (only ever moves its departure later).
    pub fn sent(&self, n: u64, at: Instant) {
        let mut s = self.state.lock().expect("limiter lock");
        let back = s.granted.checked_sub(n + 1).and_then(|b| usize::try_from(b).ok());
        let len = s.departures.len();
        if let Some(d) = back.filter(|&b| b < len).map(|b| &mut s.departures[len - 1 - b]) {
            *d = (*d).max(at);
        }
    }

    /// When its last requests left (at most the configured rate of them), the oldest first.
    pub(super) fn departures(&self) -> Vec<Instant> {
        self.state.lock().expect("limiter lock").departures.iter().copied().collect()
    }

    /// Takes the slot if it is due (the request's number), else says how long until it is.
    pub(super) fn try_take(&self) -> Result<u64, Duration> {
        let now = Instant::now();
        let mut s = self.state.lock().expect("limiter lock");
        if let Some(at) = s.allowed(self.guard).filter(|&at| at > now) {
            return Err(at - now);
        }
        let slack = SLACK.min(s.interval() / 2);
        let cadence = s.next.filter(|&next| now - next <= slack).unwrap_or(now);
        let before = s.next;
        s.next = Some(cadence + s.interval());
        s.departures.push_back(now);
        let forgotten = if s.departures.len() > s.configured as usize { s.departures.pop_front() } else { None };
        s.undo = Some((before, forgotten));
        s.granted += 1;
        Ok(s.granted - 1)
    }

    /// Takes back slot `n`, whose request was never written, when it is the last granted:
    /// as if it had not been (its place in the window and the cadence are free again).
    /// Whether it was; one granted before another stays counted, as having left now.
    pub(super) fn take_back(&self, n: u64) -> bool {
        let mut s = self.state.lock().expect("limiter lock");
        if s.granted != n + 1 {
            return false;
        }
        let Some((before, forgotten)) = s.undo.take() else { return false };
        s.departures.pop_back();
        if let Some(d) = forgotten {
            s.departures.push_front(d);
        }
        s.granted -= 1;
        s.next = before;
        true
    }

    /// Waits for the next slot, following it as it moves, and takes it: the caller sends
    /// right away (its departure is the grant's moment unless [`LocalPacer::sent`] says later).
    pub async fn take_slot(&self) -> u64 {
        loop {
            match self.try_take() {
                Ok(n) => return n,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// Waits for the next slot, following it as it moves (a late departure, a new
    /// pause), and takes it: the caller sends right away. Gives up, returning how far
    /// off the slot is, when it lies more than `patience` ahead.
    #[cfg(test)]
    async fn wait_for_slot(&self, patience: Duration) -> Result<u64, Duration> {
        loop {
            match self.try_take() {
                Ok(n) => return Ok(n),
                Err(wait) if wait > patience => return Err(wait),
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }

    /// No slot is granted before `d` from now (a 429's `retry-after`).
    pub(super) fn pause_for(&self, d: Duration) {
        let until = Instant::now() + d;
        let mut s = self.state.lock().expect("limiter lock");
        if s.paused_until.is_none_or(|u| u < until) {
            s.paused_until = Some(until);
        }
    }

    /// Obeys a response's rate headers; returns the new rate when it was lowered.
    pub(super) fn observe(&self, rate: &RateHeaders) -> Option<u32> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cadence_is_one_over_the_rate() {
        let l = LocalPacer::new(10, Duration::from_millis(5));
        assert_eq!(l.interval(), Duration::from_millis(100));
    }

    #[test]
    fn a_lower_provider_limit_is_adopted_and_a_higher_one_ignored() {
        let l = LocalPacer::new(10, Duration::ZERO);
        let higher = RateHeaders { limit: Some(20), ..Default::default() };
        assert_eq!(l.observe(&higher), None);
        let lower = RateHeaders { limit: Some(5), ..Default::default() };
        assert_eq!(l.observe(&lower), Some(5));
        assert_eq!(l.interval(), Duration::from_millis(200));
    }

    /// Takes `count` slots in a row, sending at once; the times from the first.
    async fn slots(l: &LocalPacer, count: usize) -> Vec<Duration> {
        let start = Instant::now();
        let mut slots = Vec::new();
        for _ in 0..count {
            let n = l.wait_for_slot(Duration::MAX).await.unwrap();
            l.sent(n, Instant::now());
            slots.push(Instant::now() - start);
        }
        slots
    }

    #[tokio::test(start_paused = true)]
    async fn slots_are_spread_and_every_sliding_second_holds_the_rate_with_its_guard() {
        let l = LocalPacer::new(10, Duration::from_millis(2));
        let slots = slots(&l, 31).await;
        assert_eq!(slots[0], Duration::ZERO);
        for (i, pair) in slots.windows(2).enumerate() {
            assert!(pair[1] - pair[0] >= Duration::from_millis(100), "slot {i}: {slots:?}");
        }
        // Eleven requests never fit in one second plus the guard...
        for window in slots.windows(11) {
            assert!(window[10] - window[0] >= Duration::from_millis(1002), "{slots:?}");
        }
        // ...and the guard is paid once a second, not once a request.
        assert_eq!(slots[30] - slots[0], Duration::from_millis(3006));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_departure_holds_back_the_request_a_second_after_it() {
        let l = LocalPacer::new(10, Duration::ZERO);
        let start = Instant::now();
        let first = l.wait_for_slot(Duration::MAX).await.unwrap();
        // The request for that slot actually left 40 ms late (a busy CPU, say).
        l.sent(first, start + Duration::from_millis(40));
        for _ in 0..9 {
            l.wait_for_slot(Duration::MAX).await.unwrap();
        }
        assert_eq!(Instant::now() - start, Duration::from_millis(900), "the cadence is kept");
        assert_eq!(l.next_slot() - start, Duration::from_millis(1040), "the eleventh waits a second after it");
    }

    /// A slot whose request was never written, taken back while it is the last granted,
    /// frees its place in the cadence and the window (the window still counts every
    /// request that left); one with a later grant after it cannot be.
    #[tokio::test(start_paused = true)]
    async fn the_last_slot_granted_and_unused_is_taken_back() {
        let l = LocalPacer::new(4, Duration::ZERO);
        let start = Instant::now();
        for _ in 0..4 {
            let n = l.wait_for_slot(Duration::MAX).await.unwrap();
            l.sent(n, Instant::now());
        }
        // Four left at 0, 250, 500 and 750 ms: the fifth at 1000 ms (the window and the cadence).
        assert_eq!(l.next_slot() - start, Duration::from_millis(1000));
        let unused = l.wait_for_slot(Duration::MAX).await.unwrap();
        assert_eq!(l.next_slot() - start, Duration::from_millis(1250));
        assert!(l.take_back(unused));
        assert!(!l.take_back(unused), "taken back once");
        // Its place is free again: the next slot is now; the window still holds the four
        // that left (the one after it waits for the second after the one at 250 ms).
        assert_eq!(l.next_slot() - start, Duration::from_millis(1000));
        let n = l.wait_for_slot(Duration::MAX).await.unwrap();
        assert_eq!(n, unused, "its number is given again");
        l.sent(n, Instant::now());
        assert_eq!(l.next_slot() - start, Duration::from_millis(1250));
        let a = l.wait_for_slot(Duration::MAX).await.unwrap();
        let _b = l.wait_for_slot(Duration::MAX).await.unwrap();
        assert!(!l.take_back(a), "not the last granted");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_limiter_does_not_bank_slots() {
        let l = LocalPacer::new(10, Duration::ZERO);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = Instant::now();
        assert_eq!(l.next_slot(), now);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        assert_eq!(l.next_slot() - now, Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_slot() {
        let l = LocalPacer::new(10, Duration::ZERO);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        let slot = l.next_slot();
        l.pause_for(Duration::from_secs(2));
        assert!(l.next_slot() > slot);
        let before = Instant::now();
        l.wait_for_slot(Duration::MAX).await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_secs(2));
    }
}
