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
//!
//! While the limiter's key cannot be reached (its node died, until its replica is
//! promoted), an instance paces alone: at its share, the rate over the live instances it
//! last counted (every heartbeat says hello to the limiter), in this process, no sooner
//! than a second after it first found the key unreachable; it goes back to the shared
//! limiter at the first hello answered, which holds every instance's next request until a
//! second after its last one alone. An instance that joined too recently to be counted by
//! every peer, or whose share is under one request a second, sends nothing until it
//! reaches the limiter again; none paces alone longer than [`ALONE_MAX`].
//! `docs/resend.md` shows why the requests of every instance stay within the rate.
//! (governor was tried first: it spaces the grants, not the departures, and a
//! grant acted on late, under CPU contention, let eleven requests reach the
//! provider within a second. A guard added to every interval came next: safe,
//! but it cost 2-4 % of the ceiling.)

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{Config, LimiterMode};
use crate::metrics::Metrics;
use crate::resend::RateHeaders;
use crate::shutdown::Shutdown;
use crate::store::Store;

mod local;
mod shared;

pub(crate) use local::LocalPacer;
pub use shared::Shared;

/// How long to wait before asking Redis again after it could not be asked.
const REDIS_RETRY: Duration = Duration::from_millis(100);

/// How long a pacing read or take may go unanswered before it is given up: a call stuck
/// on a primary that died (the client gives up on it only after
/// `redis.response_timeout_ms`) must not hold every slot for seconds. A call given up
/// begins a spell without the limiter (its own pacing after a second, unless a hello is
/// answered first); a take given up that Redis did run leaves its slot unused.
const CALL_PATIENCE: Duration = Duration::from_millis(500);

/// How often an instance in a spell without the limiter asks whether it answers again
/// (and says hello while the limiter keeps a peer's share out of the shared rate).
const HELLO_IN_SPELL: Duration = Duration::from_millis(200);

/// A taker at most this late for its slot (half an interval at most) keeps the cadence.
const SLACK: Duration = Duration::from_millis(20);

/// How long after its last hello answered an instance may pace alone: as long as its
/// peers keep its share out of the shared rate once one of them is back (limiter.lua),
/// and longer than a cluster's failover (its node timeout and a promotion).
pub const ALONE_MAX: Duration = Duration::from_secs(30);

/// How long before it found the limiter unreachable an instance must have said its first
/// hello to pace alone: long enough for every peer to have counted it (a peer says hello
/// every heartbeat, at most a second, and may find the key gone a heartbeat and a call's
/// patience after another did), so no share is bigger than the instances pacing alone allow.
const JOINED_BEFORE: Duration = Duration::from_secs(5);

/// Team-wide request pacing.
pub(crate) enum Limiter {
    Process(LocalPacer),
    Redis(Box<Shared>),
}

/// A slot this instance took: the request's number, and whether it was taken alone.
#[derive(Debug, Clone, Copy)]
pub struct TakenSlot {
    n: u64,
    alone: bool,
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

    /// A daemon's limiter: its hellos name it `id` (unique to the process) among the live
    /// instances, and `metrics` says when it paces alone.
    pub(crate) fn counted_as(mut self, id: &str, metrics: &Arc<Metrics>) -> Limiter {
        if let Limiter::Redis(s) = &mut self {
            s.id = id.to_string();
            s.metrics = Some(metrics.clone());
        }
        self
    }

    /// The cadence: the time between two slots at the configured rate (a rate the
    /// provider lowered makes slots further apart; a batch prepared early for one waits
    /// in [`Limiter::take`]).
    pub(crate) fn interval(&self) -> Duration {
        match self {
            Limiter::Process(l) => l.interval(),
            Limiter::Redis(s) => s.alone(LocalPacer::interval).unwrap_or(Duration::from_secs(1) / s.rps),
        }
    }

    /// The configured rate (`resend.requests_per_second`).
    pub(crate) fn configured(&self) -> u32 {
        match self {
            Limiter::Process(l) => l.configured(),
            Limiter::Redis(s) => s.rps,
        }
    }

    /// When the next slot is, as far as can be told now (to seal and gate a batch just before it).
    pub(crate) async fn next_slot(&self) -> Instant {
        match self {
            Limiter::Process(l) => l.next_slot(),
            Limiter::Redis(s) => s.next_slot().await,
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
                Limiter::Process(l) => l.try_take().map(|n| TakenSlot { n, alone: false }),
                // No slot without Redis but a share of the rate: never send unpaced.
                Limiter::Redis(s) => s.grant().await,
            };
            let wait = match granted {
                Ok(slot) => {
                    on_grant();
                    return Ok(slot);
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
            Limiter::Redis(s) if taken.alone => s.departed_alone(taken.n),
            Limiter::Redis(s) => {
                let _ = s.call("late", taken.n).await;
            }
        }
    }

    /// The request of a taken slot has ended (answered, or given up). One that was the
    /// first on its connection (`late`) may have waited at the far end: its departure is
    /// recorded again, an upper bound of its arrival.
    pub(crate) async fn ended(&self, taken: TakenSlot, late: bool) {
        match self {
            Limiter::Redis(s) if taken.alone => s.ended_alone(taken.n, late),
            _ if late => self.departed(taken).await,
            _ => {}
        }
    }

    /// A taken slot whose request will not be written (its batch went back at a second
    /// look at its gate): counted as left now, the conservative guess; one this instance
    /// granted alone, and the last it did, is taken back instead.
    pub(crate) fn unused(&self, taken: TakenSlot) {
        if let (Limiter::Redis(s), true) = (self, taken.alone) {
            s.unused_alone(taken.n);
        }
    }

    /// Says hello to the shared limiter: counted among the live instances, this one learns
    /// its share; after a spell without it, it comes back. Returns when to say it next:
    /// every `beat`; five times a second in a spell, to end it soon, and while the limiter
    /// keeps a peer's share out, so that share comes back soon after the peer does.
    pub(crate) async fn hello(&self, beat: Duration) -> Duration {
        match self {
            Limiter::Redis(s) => {
                s.hello().await;
                if s.watching() { HELLO_IN_SPELL } else { beat }
            }
            Limiter::Process(_) => beat,
        }
    }

    /// No slot is granted before `d` from now, on any instance (a 429's `retry-after`).
    pub(crate) async fn pause_for(&self, d: Duration) {
        match self {
            Limiter::Process(l) => l.pause_for(d),
            Limiter::Redis(s) => {
                s.alone(|pacer| pacer.pause_for(d));
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
