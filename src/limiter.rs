//! The request limiter: no burst, one request per `1/rps` seconds plus a small
//! guard, measured between the moments requests actually leave, so the provider
//! never counts more than `rps` requests in any sliding second, team-wide.
//!
//! By default the slot lives in Redis (limiter.lua: a GCRA with no tolerance on one
//! key, Redis `TIME` the only clock), so every instance and every process with
//! the same prefix shares it. The slot is taken by the task that sends, right
//! before it writes the request, never granted in one task and used in another;
//! a departure that was late anyway pushes the next slot back. A 429's
//! `retry-after` pauses every instance; a `ratelimit-limit` below the configured
//! rate is adopted team-wide. `resend.limiter = "process"` keeps the same rules
//! in this process only. (governor was tried first: it spaces the grants, not
//! the departures, and a grant acted on late, under CPU contention, let eleven
//! requests reach the provider within a second.)

use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use redis::Script;
use tokio::time::Instant;

use crate::config::{Config, LimiterMode};
use crate::db::Store;
use crate::resend::RateHeaders;
use crate::shutdown::Shutdown;

/// A departure later than this after its slot was taken is recorded as late.
const LATE: Duration = Duration::from_millis(1);

/// How long to wait before asking Redis again after it could not be asked.
const REDIS_RETRY: Duration = Duration::from_millis(100);

pub static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/limiter.lua")));

/// Team-wide request pacing.
pub enum Limiter {
    Process(Local),
    Redis(Box<Shared>),
}

/// A slot this instance took: when the answer came (locally), Redis's clock when it
/// was taken, and how long the round trip took (shared limiter).
#[derive(Debug, Clone, Copy)]
pub struct Taken {
    at: Instant,
    redis_us: Option<u64>,
    round_trip: Duration,
}

impl Limiter {
    /// The limiter `config` asks for.
    pub fn from_config(config: &Config, store: &Store) -> Limiter {
        let r = &config.resend;
        let guard = Duration::from_millis(r.pacing_guard_ms);
        match r.limiter {
            LimiterMode::Process => Limiter::Process(Local::new(r.requests_per_second, guard)),
            LimiterMode::Redis => Limiter::Redis(Box::new(Shared::new(store.clone(), r.requests_per_second, guard))),
        }
    }

    /// When the next slot is, as far as can be told now (to seal and gate a batch just before it).
    pub async fn next_slot(&self) -> Instant {
        match self {
            Limiter::Process(l) => l.next_slot(),
            Limiter::Redis(s) => {
                s.peek().await.map_or_else(|_| Instant::now() + REDIS_RETRY, |wait| Instant::now() + wait)
            }
        }
    }

    /// Waits for the next slot and takes it: the caller writes its request right away.
    /// Gives up, returning how far off the slot is, when it lies more than `patience`
    /// ahead, or at shutdown (`Duration::ZERO`).
    pub async fn take(&self, patience: Duration, shutdown: &mut Shutdown) -> Result<Taken, Duration> {
        loop {
            let wait = match self {
                Limiter::Process(l) => match l.try_take() {
                    Ok(()) => return Ok(Taken { at: Instant::now(), redis_us: None, round_trip: Duration::ZERO }),
                    Err(wait) => wait,
                },
                Limiter::Redis(s) => {
                    let asked = Instant::now();
                    match s.try_take().await {
                        Ok(Ok(redis_us)) => {
                            let at = Instant::now();
                            return Ok(Taken { at, redis_us: Some(redis_us), round_trip: at - asked });
                        }
                        Ok(Err(wait)) => wait,
                        // No slot without Redis: never send unpaced.
                        Err(_) => REDIS_RETRY,
                    }
                }
            };
            if wait > patience {
                return Err(wait);
            }
            if !shutdown.sleep(wait).await {
                return Err(Duration::ZERO);
            }
        }
    }

    /// The request of a taken slot is leaving now; if that may be later than the slot,
    /// the next slot moves back by as much. Redis's clock read the slot somewhere in the
    /// round trip, so the departure is counted at the latest it can be: the slot plus
    /// the whole round trip plus the time since the answer. Spacing these upper bounds
    /// spaces the real departures by at least an interval, whichever instance sends.
    pub async fn departed(&self, taken: Taken) {
        let late = taken.round_trip + taken.at.elapsed();
        match self {
            Limiter::Process(l) => l.sent(Instant::now()),
            Limiter::Redis(s) if late > LATE => {
                let at = taken.redis_us.unwrap_or_default() + late.as_micros() as u64;
                let _ = s.call("late", at).await;
            }
            Limiter::Redis(_) => {}
        }
    }

    /// No slot is granted before `d` from now, on any instance (a 429's `retry-after`).
    pub async fn pause_for(&self, d: Duration) {
        match self {
            Limiter::Process(l) => l.pause_for(d),
            Limiter::Redis(s) => {
                let _ = s.call("pause", d.as_millis() as u64).await;
            }
        }
    }

    /// Obeys a response's rate headers; returns the new rate when it was lowered.
    pub async fn observe(&self, rate: &RateHeaders) -> Option<u32> {
        match self {
            Limiter::Process(l) => l.observe(rate),
            Limiter::Redis(s) => {
                let limit = rate.limit.filter(|&l| l >= 1 && l < s.rps)?;
                match s.call("lower", u64::from(limit)).await {
                    Ok((1, _)) => Some(limit),
                    _ => None,
                }
            }
        }
    }
}

/// Pacing kept in Redis, shared by every instance with the same prefix.
pub struct Shared {
    store: Store,
    key: String,
    rps: u32,
    interval_us: u64,
    guard_us: u64,
}

impl Shared {
    pub fn new(store: Store, rps: u32, guard: Duration) -> Shared {
        let key = store.keys.limiter();
        let interval_us = interval(rps, guard).as_micros() as u64;
        Shared { store, key, rps: rps.max(1), interval_us, guard_us: guard.as_micros() as u64 }
    }

    /// One call of limiter.lua; returns (wait or flag, Redis now in µs).
    async fn call(&self, op: &str, arg: u64) -> anyhow::Result<(u64, u64)> {
        let mut conn = self.store.conn().await?;
        let mut call = SCRIPT.key(&self.key);
        call.arg(op).arg(self.interval_us).arg(self.guard_us).arg(arg);
        Ok(call.invoke_async(&mut conn).await?)
    }

    /// Takes a slot if one is due, as the sending task does (for measuring its cost).
    pub async fn probe(&self) -> anyhow::Result<bool> {
        Ok(self.try_take().await?.is_ok())
    }

    async fn peek(&self) -> anyhow::Result<Duration> {
        Ok(Duration::from_micros(self.call("peek", 0).await?.0))
    }

    /// Takes the slot if it is due: `Ok(Ok(redis now))`, or `Ok(Err(wait))`.
    async fn try_take(&self) -> anyhow::Result<Result<u64, Duration>> {
        let (wait, now) = self.call("take", 0).await?;
        Ok(if wait == 0 { Ok(now) } else { Err(Duration::from_micros(wait)) })
    }
}

/// Pacing kept in this process (`resend.limiter = "process"`): for a single instance
/// that wants no Redis round trip per request.
pub struct Local {
    guard: Duration,
    state: Mutex<State>,
}

struct State {
    rps: u32,
    /// When the last request left.
    last: Option<Instant>,
    paused_until: Option<Instant>,
}

impl Local {
    /// `rps` requests per second, each slot `guard` longer than `1/rps`.
    pub fn new(rps: u32, guard: Duration) -> Local {
        Local { guard, state: Mutex::new(State { rps: rps.max(1), last: None, paused_until: None }) }
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

    /// Takes the slot if it is due, else says how long until it is.
    pub fn try_take(&self) -> Result<(), Duration> {
        let slot = self.next_slot();
        let now = Instant::now();
        if slot <= now {
            self.sent(now);
            return Ok(());
        }
        Err(slot - now)
    }

    /// Waits for the next slot, following it as it moves (a late departure, a new
    /// pause), and takes it: the caller sends right away. Gives up, returning how far
    /// off the slot is, when it lies more than `patience` ahead.
    pub async fn wait_for_slot(&self, patience: Duration) -> Result<(), Duration> {
        loop {
            match self.try_take() {
                Ok(()) => return Ok(()),
                Err(wait) if wait > patience => return Err(wait),
                Err(wait) => tokio::time::sleep(wait).await,
            }
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
        let l = Local::new(10, Duration::from_millis(2));
        assert_eq!(l.interval(), Duration::from_millis(102));
    }

    #[test]
    fn a_lower_provider_limit_is_adopted_and_a_higher_one_ignored() {
        let l = Local::new(10, Duration::ZERO);
        let higher = RateHeaders { limit: Some(20), ..Default::default() };
        assert_eq!(l.observe(&higher), None);
        let lower = RateHeaders { limit: Some(5), ..Default::default() };
        assert_eq!(l.observe(&lower), Some(5));
        assert_eq!(l.interval(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn slots_are_spaced_with_no_burst() {
        let l = Local::new(10, Duration::from_millis(2));
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
        let l = Local::new(10, Duration::ZERO);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        let planned = l.next_slot();
        // The request for that slot actually left 40 ms late (a busy CPU, say).
        tokio::time::sleep_until(planned + Duration::from_millis(40)).await;
        l.sent(Instant::now());
        assert_eq!(l.next_slot() - planned, Duration::from_millis(140));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_limiter_does_not_bank_slots() {
        let l = Local::new(10, Duration::ZERO);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = Instant::now();
        assert_eq!(l.next_slot(), now);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        assert_eq!(l.next_slot() - now, Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_every_slot() {
        let l = Local::new(10, Duration::ZERO);
        l.wait_for_slot(Duration::MAX).await.unwrap();
        let slot = l.next_slot();
        l.pause_for(Duration::from_secs(2));
        assert!(l.next_slot() > slot);
        let before = Instant::now();
        l.wait_for_slot(Duration::MAX).await.unwrap();
        assert_eq!(Instant::now() - before, Duration::from_secs(2));
    }
}
