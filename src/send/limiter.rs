//! The request limiter: the provider never counts more than `rps` requests in
//! any sliding second, team-wide, and requests are spread evenly (one per
//! `1/rps`, no burst after an idle spell). A request leaves no sooner than one
//! second plus a small guard after the request `rps` before it left, measured
//! between the moments requests actually leave (upper bounds of them), so the
//! guard that absorbs jitter is paid once per sliding second, not per request.
//!
//! By default the limiter lives in Redis (limiter.lua on one key, Redis `TIME`
//! the only clock), so every instance and every process with the same prefix
//! shares it. The slot is taken by the task that sends, right before it writes
//! the request, never granted in one task and used in another; once the request's
//! bytes can go out on a ready connection (its body is first read), Redis's clock
//! marks its departure (an upper bound), which is what the request `rps` after it
//! waits a second from. A request that was the first on its connection is marked
//! again when it ends: it may have waited at the far end (a TLS handshake). A 429's `retry-after` pauses
//! every instance; a `ratelimit-limit` below the configured rate is adopted
//! team-wide.
//! `resend.limiter = "process"` keeps the same rules in this process only.
//! (governor was tried first: it spaces the grants, not the departures, and a
//! grant acted on late, under CPU contention, let eleven requests reach the
//! provider within a second. A guard added to every interval came next: safe,
//! but it cost 2-4 % of the ceiling.)

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{Config, LimiterMode};
use crate::resend::RateHeaders;
use crate::shutdown::Shutdown;
use crate::store::{Store, scripts};

/// How long to wait before asking Redis again after it could not be asked.
const REDIS_RETRY: Duration = Duration::from_millis(100);

/// How long a pacing read or take may go unanswered before it is given up and asked
/// again: a call stuck on a primary that died (the client gives up on it only after
/// `redis.response_timeout_ms`) must not hold every slot for seconds after its replica
/// has taken over. A take given up that Redis did run leaves its slot unused.
const CALL_PATIENCE: Duration = Duration::from_secs(1);

/// A taker at most this late for its slot (half an interval at most) keeps the cadence.
const SLACK: Duration = Duration::from_millis(20);

/// Team-wide request pacing.
pub(crate) enum Limiter {
    Process(LocalPacer),
    Redis(Box<Shared>),
}

/// A slot this instance took: the request's number.
#[derive(Debug, Clone, Copy)]
pub struct TakenSlot {
    n: u64,
}

impl Limiter {
    /// The limiter `config` asks for.
    pub(crate) fn from_config(config: &Config, store: &Store) -> Limiter {
        let r = &config.resend;
        let guard = Duration::from_millis(r.pacing_guard_ms);
        match r.limiter {
            LimiterMode::Process => Limiter::Process(LocalPacer::new(r.requests_per_second, guard)),
            LimiterMode::Redis => Limiter::Redis(Box::new(Shared::new(store.clone(), r.requests_per_second, guard))),
        }
    }

    /// The cadence: the time between two slots at the configured rate (a rate the
    /// provider lowered makes slots further apart; a batch prepared early for one waits
    /// in [`Limiter::take`]).
    pub(crate) fn interval(&self) -> Duration {
        match self {
            Limiter::Process(l) => l.interval(),
            Limiter::Redis(s) => Duration::from_secs(1) / s.rps,
        }
    }

    /// The configured rate (`resend.requests_per_second`).
    pub(crate) fn configured(&self) -> u32 {
        match self {
            Limiter::Process(l) => l.state.lock().expect("pacer lock").configured,
            Limiter::Redis(s) => s.rps,
        }
    }

    /// When the next slot is, as far as can be told now (to seal and gate a batch just before it).
    pub(crate) async fn next_slot(&self) -> Instant {
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
    ///
    /// Each attempt holds `book`, and `on_grant` runs under it when the slot is granted:
    /// whoever looks at the next slot holding `book` sees a granted slot and its taker's
    /// bookkeeping together (see `Dispatcher::run`).
    pub async fn take(
        &self,
        patience: Duration,
        shutdown: &mut Shutdown,
        book: &tokio::sync::Mutex<()>,
        on_grant: impl FnOnce(),
    ) -> Result<TakenSlot, Duration> {
        loop {
            let booked = book.lock().await;
            let granted = match self {
                Limiter::Process(l) => l.try_take(),
                // No slot without Redis: never send unpaced.
                Limiter::Redis(s) => s.try_take().await.unwrap_or(Err(REDIS_RETRY)),
            };
            let wait = match granted {
                Ok(n) => {
                    on_grant();
                    return Ok(TakenSlot { n });
                }
                Err(wait) => wait,
            };
            drop(booked);
            if wait > patience {
                return Err(wait);
            }
            if !shutdown.sleep(wait).await {
                return Err(Duration::ZERO);
            }
        }
    }

    /// The request of a taken slot has been written: its departure is recorded as now
    /// (in Redis, the moment the script runs, after the write), and the request `rps`
    /// after it leaves no sooner than a second plus the guard later, whichever instance
    /// sends it. Until this is recorded the grant plus 1 ms stands in.
    pub(crate) async fn departed(&self, taken: TakenSlot) {
        match self {
            Limiter::Process(l) => l.sent(taken.n, Instant::now()),
            Limiter::Redis(s) => {
                let _ = s.call("late", taken.n).await;
            }
        }
    }

    /// No slot is granted before `d` from now, on any instance (a 429's `retry-after`).
    pub(crate) async fn pause_for(&self, d: Duration) {
        match self {
            Limiter::Process(l) => l.pause_for(d),
            Limiter::Redis(s) => {
                let _ = s.call("pause", crate::model::ms(d)).await;
            }
        }
    }

    /// Obeys a response's rate headers; returns the new rate when it was lowered.
    pub(crate) async fn observe(&self, rate: &RateHeaders) -> Option<u32> {
        match self {
            Limiter::Process(l) => l.observe(rate),
            Limiter::Redis(s) => {
                let limit = rate.limit.filter(|&l| l >= 1 && l < s.rps)?;
                match s.call("lower", u64::from(limit)).await {
                    Ok((1, _, _)) => Some(limit),
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
    guard_us: u64,
}

impl Shared {
    pub fn new(store: Store, rps: u32, guard: Duration) -> Shared {
        let key = store.keys.limiter();
        Shared { store, key, rps: rps.max(1), guard_us: guard.as_micros() as u64 }
    }

    /// One call of limiter.lua; returns (wait or flag, Redis now in µs, request number).
    async fn call(&self, op: &str, arg: u64) -> anyhow::Result<(u64, u64, u64)> {
        let mut conn = self.store.conn().await?;
        Ok(scripts::limiter(&mut conn, &self.key, op, self.rps, self.guard_us, arg, None).await?)
    }

    /// Takes a slot if one is due, as the sending task does (for measuring its cost).
    pub async fn probe(&self) -> anyhow::Result<bool> {
        Ok(self.try_take().await?.is_ok())
    }

    /// [`Shared::call`] given up after [`CALL_PATIENCE`].
    async fn call_patiently(&self, op: &str) -> anyhow::Result<(u64, u64, u64)> {
        tokio::time::timeout(CALL_PATIENCE, self.call(op, 0))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the limiter's Redis did not answer within {CALL_PATIENCE:?}")))
    }

    async fn peek(&self) -> anyhow::Result<Duration> {
        Ok(Duration::from_micros(self.call_patiently("peek").await?.0))
    }

    /// Takes the slot if it is due: `Ok(Ok(request number))`, or `Ok(Err(wait))`.
    async fn try_take(&self) -> anyhow::Result<Result<u64, Duration>> {
        let (wait, _, n) = self.call_patiently("take").await?;
        Ok(if wait == 0 { Ok(n) } else { Err(Duration::from_micros(wait)) })
    }
}

/// Pacing kept in this process (`resend.limiter = "process"`): for a single instance
/// that wants no Redis round trip per request. The same two rules as limiter.lua.
pub(crate) struct LocalPacer {
    guard: Duration,
    state: Mutex<PacerState>,
}

struct PacerState {
    configured: u32,
    rps: u32,
    /// The cadence: when the next request may leave.
    next: Option<Instant>,
    /// Requests granted so far.
    granted: u64,
    /// Departures of the last `configured` requests, the newest last.
    departures: VecDeque<Instant>,
    paused_until: Option<Instant>,
}

impl PacerState {
    fn interval(&self) -> Duration {
        Duration::from_secs(1) / self.rps.max(1)
    }

    /// When the next request may leave, by the cadence, the pause and the window.
    fn allowed(&self, guard: Duration) -> Option<Instant> {
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
            granted: 0,
            departures: VecDeque::new(),
            paused_until: None,
        };
        LocalPacer { guard, state: Mutex::new(state) }
    }

    /// The time between two slots of the cadence.
    pub fn interval(&self) -> Duration {
        self.state.lock().expect("limiter lock").interval()
    }

    /// When the next request may leave: now, or later (never during a pause).
    fn next_slot(&self) -> Instant {
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

    /// Takes the slot if it is due (the request's number), else says how long until it is.
    fn try_take(&self) -> Result<u64, Duration> {
        let now = Instant::now();
        let mut s = self.state.lock().expect("limiter lock");
        if let Some(at) = s.allowed(self.guard).filter(|&at| at > now) {
            return Err(at - now);
        }
        let slack = SLACK.min(s.interval() / 2);
        let cadence = s.next.filter(|&next| now - next <= slack).unwrap_or(now);
        s.next = Some(cadence + s.interval());
        s.departures.push_back(now);
        if s.departures.len() > s.configured as usize {
            s.departures.pop_front();
        }
        s.granted += 1;
        Ok(s.granted - 1)
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
    fn pause_for(&self, d: Duration) {
        let until = Instant::now() + d;
        let mut s = self.state.lock().expect("limiter lock");
        if s.paused_until.is_none_or(|u| u < until) {
            s.paused_until = Some(until);
        }
    }

    /// Obeys a response's rate headers; returns the new rate when it was lowered.
    fn observe(&self, rate: &RateHeaders) -> Option<u32> {
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
