//! The limiter in Redis, shared by every instance with the same prefix, and what an
//! instance does while it cannot reach it: it paces alone at its share.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{ALONE_MAX, CALL_PATIENCE, JOINED_BEFORE, LocalPacer, REDIS_RETRY, TakenSlot};
use crate::metrics::Metrics;
use crate::store::{Store, scripts};

/// Pacing kept in Redis, shared by every instance with the same prefix.
pub struct Shared {
    pub(super) store: Store,
    pub(super) key: String,
    pub(super) rps: u32,
    pub(super) guard_us: u64,
    /// This instance among the live ones the limiter counts (unique to the process).
    pub(super) id: String,
    pub(super) metrics: Option<Arc<Metrics>>,
    standing: Mutex<Standing>,
}

/// What this instance knows of its place in the team, for when the limiter is out of reach.
#[derive(Default)]
struct Standing {
    /// When its first hello was sent.
    joined: Option<Instant>,
    /// Its last hello answered: when it was sent, the share it gave (requests/s), the
    /// live instances it counted.
    hello: Option<(Instant, u32, u32)>,
    /// While the limiter cannot be reached.
    spell: Option<Spell>,
    /// Whether the last hello answered said some peer's share is kept out of the shared
    /// rate (one that may still pace alone, or is back less than a second after its last
    /// request alone).
    reserved: bool,
}

/// A spell without the shared limiter.
struct Spell {
    /// When the limiter was first found out of reach.
    since: Instant,
    /// The share, paced here: `None` when this instance may not pace alone.
    pacer: Option<LocalPacer>,
    /// When its last request alone left (granted, until it is on the wire). A spell with
    /// none yet ends at the first answer; one with some, only at a hello answered.
    last: Option<Instant>,
    /// Requests granted alone that have not ended: no hello brings this instance back
    /// before they did (their second, from their arrival at the latest, is held on its return).
    open: std::collections::BTreeSet<u64>,
    /// A hello saying it is back is on its way: no request leaves alone meanwhile (so its
    /// last one alone is known when it says so), and one more may if it goes unanswered.
    returning: bool,
    /// Whether an instance that may not pace alone said so.
    told: bool,
}

impl Shared {
    pub fn new(store: Store, rps: u32, guard: Duration) -> Shared {
        let key = store.keys.limiter();
        Shared {
            store,
            key,
            rps: rps.max(1),
            guard_us: guard.as_micros() as u64,
            id: String::new(),
            metrics: None,
            standing: Mutex::new(Standing::default()),
        }
    }

    /// The guard added to every sliding second.
    fn guard(&self) -> Duration {
        Duration::from_micros(self.guard_us)
    }

    /// One call of limiter.lua; returns (wait or flag, Redis now in µs, request number).
    pub(super) async fn call(&self, op: &str, arg: u64) -> anyhow::Result<(u64, u64, u64)> {
        self.call_as(op, arg, (0, &[])).await
    }

    /// [`Shared::call`] with the share this instance paced alone at and when each of its
    /// requests alone leaves its second, ms from now (for 'back').
    async fn call_as(&self, op: &str, arg: u64, (share, each): (u32, &[u64])) -> anyhow::Result<(u64, u64, u64)> {
        // A connection that says soon that the limiter's node is gone: this instance paces
        // alone meanwhile, so a call that waits for its replica's promotion only costs time.
        let mut conn = self.store.brief().await?;
        let alone_max = crate::model::ms(ALONE_MAX);
        let id = Some((self.id.as_str(), alone_max, share, each)).filter(|_| matches!(op, "hello" | "back"));
        Ok(scripts::limiter(&mut conn, &self.key, op, self.rps, self.guard_us, arg, None, id).await?)
    }

    /// Takes a slot if one is due, as the sending task does (for measuring its cost).
    pub async fn probe(&self) -> anyhow::Result<bool> {
        Ok(self.try_take().await?.is_ok())
    }

    /// [`Shared::call`] given up after [`CALL_PATIENCE`].
    pub(super) async fn call_patiently(&self, op: &str, arg: u64) -> anyhow::Result<(u64, u64, u64)> {
        self.call_patiently_as(op, arg, (0, &[])).await
    }

    async fn call_patiently_as(&self, op: &str, arg: u64, back: (u32, &[u64])) -> anyhow::Result<(u64, u64, u64)> {
        tokio::time::timeout(CALL_PATIENCE, self.call_as(op, arg, back))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the limiter's Redis did not answer within {CALL_PATIENCE:?}")))
    }

    /// Takes the slot if it is due: `Ok(Ok(request number))`, or `Ok(Err(wait))`.
    pub(super) async fn try_take(&self) -> anyhow::Result<Result<u64, Duration>> {
        let (wait, _, n) = self.call_patiently("take", 0).await?;
        Ok(if wait == 0 { Ok(n) } else { Err(Duration::from_micros(wait)) })
    }

    /// `f` on the pacer of the spell this instance paces alone in, if it does.
    pub(super) fn alone<T>(&self, f: impl FnOnce(&LocalPacer) -> T) -> Option<T> {
        let st = self.standing.lock().expect("standing lock");
        st.spell.as_ref().and_then(|spell| spell.pacer.as_ref()).map(f)
    }

    /// Whether this instance is in a spell without the limiter: its slots come from its own
    /// pacing (or none do) until a hello is answered.
    pub(super) fn in_spell(&self) -> bool {
        self.standing.lock().expect("standing lock").spell.is_some()
    }

    /// Whether it should say hello again soon: in a spell (to end it as soon as the
    /// limiter answers), or while the limiter keeps a peer's share out of the shared rate.
    /// A peer's share is kept out until it is heard from after the last instance came
    /// back (it may still pace alone), so every instance saying hello five times a second
    /// meanwhile gives the shares back within moments of the last return, instead of at
    /// each one's next heartbeat.
    pub(super) fn watching(&self) -> bool {
        let st = self.standing.lock().expect("standing lock");
        st.spell.is_some() || st.reserved
    }

    /// The limiter did not answer: a spell begins (if none has), paced alone at the share
    /// of the last hello if this instance may, its first request a second (and the guard)
    /// after now, when no request granted by the limiter can still be in its second.
    pub(super) fn unreached(&self, error: &anyhow::Error) {
        let now = Instant::now();
        let mut st = self.standing.lock().expect("standing lock");
        if st.spell.is_some() {
            return;
        }
        if let Some(m) = &self.metrics {
            // Each spell's first call given up (mailstream_redis_errors_total{op="limiter"}).
            m.count_redis_error("limiter");
        }
        let guard = self.guard();
        let joined_in_time = st.joined.is_some_and(|joined| now.saturating_duration_since(joined) >= JOINED_BEFORE);
        let share = st.hello.filter(|&(at, share, _)| share >= 1 && now < at + ALONE_MAX);
        let pacer = share.filter(|_| joined_in_time).map(|(_, share, _)| {
            let pacer = LocalPacer::new(share, guard);
            pacer.pause_for(Duration::from_secs(1) + guard);
            pacer
        });
        tracing::info!(
            error = %format!("{error:#}"),
            may_pace_alone = pacer.is_some(),
            "the shared limiter did not answer: its hellos ask again, and this instance paces alone after a second \
             if it may"
        );
        st.spell =
            Some(Spell { since: now, pacer, last: None, open: Default::default(), returning: false, told: false });
    }

    /// A slot by the spell's own pacer: while the share lasts (up to [`ALONE_MAX`] after
    /// the last hello answered); else, how long to wait before asking again.
    pub(super) fn take_alone(&self) -> Result<TakenSlot, Duration> {
        let now = Instant::now();
        let mut st = self.standing.lock().expect("standing lock");
        let share = st.hello.filter(|&(at, _, _)| now < at + ALONE_MAX);
        let Some(spell) = st.spell.as_mut() else { return Err(Duration::ZERO) };
        if spell.returning {
            return Err(REDIS_RETRY);
        }
        let Some(pacer) = spell.pacer.as_ref().filter(|_| share.is_some()) else {
            if !spell.told && now - spell.since > Duration::from_secs(1) {
                spell.told = true;
                tracing::warn!(
                    "the shared limiter cannot be reached and this instance may not pace alone (it joined too \
                     recently to be counted by its peers, too many instances share the rate, or it paced alone \
                     as long as it may): it sends nothing until it reaches the limiter"
                );
            }
            return Err(REDIS_RETRY);
        };
        let n = pacer.try_take()?;
        if spell.last.is_none() {
            if let Some(m) = &self.metrics {
                m.set_limiter_alone(true);
            }
            let (share, live) = share.map_or((0, 0), |(_, share, live)| (share, live));
            tracing::warn!(
                requests_per_second = share,
                live_instances = live,
                unreachable_ms = (now - spell.since).as_millis() as u64,
                "the shared limiter cannot be reached: this instance paces alone at its share of the rate"
            );
        }
        spell.last = Some(now);
        spell.open.insert(n);
        Ok(TakenSlot { n, alone: true })
    }

    /// The next slot: the limiter's, or, in a spell without it, this instance's own.
    pub(super) async fn next_slot(&self) -> Instant {
        if self.in_spell() {
            return self.alone(LocalPacer::next_slot).unwrap_or(Instant::now() + REDIS_RETRY);
        }
        match self.call_patiently("peek", 0).await {
            Ok((wait, _, _)) => Instant::now() + Duration::from_micros(wait),
            Err(e) => {
                self.unreached(&e);
                self.alone(LocalPacer::next_slot).unwrap_or(Instant::now() + REDIS_RETRY)
            }
        }
    }

    /// A slot: the limiter's while it answers; in a spell without it (until a hello is
    /// answered: the take path never waits on a node that may be gone), this instance's
    /// share; `Err(wait)` when none is due.
    pub(super) async fn grant(&self) -> Result<TakenSlot, Duration> {
        if !self.in_spell() {
            match self.try_take().await {
                Ok(granted) => return granted.map(|n| TakenSlot { n, alone: false }),
                Err(e) => self.unreached(&e),
            }
        }
        // Asked again soon: the spell may end with the next hello.
        self.take_alone().map_err(|wait| wait.clamp(Duration::from_millis(1), REDIS_RETRY))
    }

    /// A request granted alone is on the wire (or gave up): its second counts from now.
    pub(super) fn departed_alone(&self, n: u64) {
        let now = Instant::now();
        let mut st = self.standing.lock().expect("standing lock");
        if let Some(spell) = st.spell.as_mut() {
            if let Some(pacer) = &spell.pacer {
                pacer.sent(n, now);
            }
            spell.last = spell.last.max(Some(now));
        }
    }

    /// A request granted alone has ended; `late`: it may have arrived only now.
    pub(super) fn ended_alone(&self, n: u64, late: bool) {
        if late {
            self.departed_alone(n);
        }
        let mut st = self.standing.lock().expect("standing lock");
        if let Some(spell) = st.spell.as_mut() {
            spell.open.remove(&n);
        }
    }

    /// A request granted alone will not be written (its batch went back at a second look):
    /// taken back from the pacer when it is the last granted, so its place goes to the
    /// next batch; else counted as having left now.
    pub(super) fn unused_alone(&self, n: u64) {
        let taken_back = {
            let mut st = self.standing.lock().expect("standing lock");
            st.spell.as_mut().is_some_and(|spell| {
                let back = spell.pacer.as_ref().is_some_and(|pacer| pacer.take_back(n));
                if back {
                    spell.open.remove(&n);
                }
                back
            })
        };
        if !taken_back {
            self.ended_alone(n, true);
        }
    }

    /// Says hello: counted live, this instance learns its share. After requests alone, all
    /// of them ended, it says it is back instead, once the limiter answers, and none leaves
    /// alone while it does: the share it paced at stays out of the shared rate until a
    /// second (and the guard) after its last one alone.
    pub(super) async fn hello(&self) {
        let alone = {
            let st = self.standing.lock().expect("standing lock");
            st.spell.as_ref().is_some_and(|spell| spell.last.is_some() && spell.open.is_empty())
        };
        // First whether the limiter answers at all (a read, no mark): requests alone go on
        // meanwhile, so a spell's unanswered hellos never slow its own pacing.
        if alone && self.call_patiently("peek", 0).await.is_err() {
            return;
        }
        let sent = Instant::now();
        let back = {
            let mut st = self.standing.lock().expect("standing lock");
            match st.spell.as_mut() {
                Some(spell) if !spell.open.is_empty() => return,
                Some(spell) => spell.last.map(|last| {
                    spell.returning = true;
                    let second = Duration::from_secs(1) + self.guard();
                    let share = spell.pacer.as_ref().map_or(0, LocalPacer::configured);
                    // When each request alone still in its second leaves it (rounded up).
                    let each: Vec<u64> = spell.pacer.as_ref().map_or(Vec::new(), |pacer| {
                        pacer
                            .departures()
                            .into_iter()
                            .filter_map(|left| (left + second).checked_duration_since(sent))
                            .map(|d| crate::model::ms(d) + 1)
                            .collect()
                    });
                    ((last + second).saturating_duration_since(sent), share, each)
                }),
                None => None,
            }
        };
        let answer = match back {
            // Rounded up: its share is kept out until its last second alone has passed.
            Some((held, share, each)) => {
                self.call_patiently_as("back", crate::model::ms(held) + 1, (share, &each)).await
            }
            None => self.call_patiently("hello", 0).await,
        };
        let mut st = self.standing.lock().expect("standing lock");
        let Ok((live, share, reserve)) = answer else {
            // Not back: it goes on pacing alone, and says it again at the next hello.
            if let Some(spell) = st.spell.as_mut() {
                spell.returning = false;
            }
            return;
        };
        st.joined.get_or_insert(sent);
        st.reserved = reserve > 0;
        st.hello = Some((sent, u32::try_from(share).unwrap_or(u32::MAX), u32::try_from(live).unwrap_or(u32::MAX)));
        let Some(spell) = st.spell.take() else { return };
        if spell.last.is_none() {
            tracing::info!(spell_ms = (sent - spell.since).as_millis() as u64, "the shared limiter answers again");
            return;
        }
        if let Some(m) = &self.metrics {
            m.set_limiter_alone(false);
        }
        tracing::warn!(
            paced_alone_seconds = (sent - spell.since).as_secs_f64(),
            "the shared limiter is reached again: back from pacing alone"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Secret};
    use crate::store::redis_server::{RedisOptions, RedisServer};

    /// A limiter in `server` at 10 requests/s, saying hello as `id`.
    async fn shared(server: &RedisServer, id: &str) -> Shared {
        let mut config = Config::example();
        config.campaigns.iter_mut().for_each(|c| c.schedule = None);
        config.redis.url = Secret::new(server.url());
        config.redis.partitions = 1;
        let mut s = Shared::new(Store::open(&config).await.expect("store"), 10, Duration::from_millis(2));
        s.id = id.to_string();
        s
    }

    /// Asks for a slot until one is granted, or `tries` answers said to wait.
    async fn granted(s: &Shared, tries: u32) -> Option<TakenSlot> {
        for _ in 0..tries {
            match s.grant().await {
                Ok(slot) => return Some(slot),
                Err(wait) => tokio::time::sleep(wait.min(REDIS_RETRY)).await,
            }
        }
        None
    }

    fn share(s: &Shared) -> Option<(u32, u32)> {
        s.standing.lock().unwrap().hello.map(|(_, share, live)| (share, live))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_its_redis_an_instance_counted_by_its_peers_paces_alone_at_its_share_and_a_newcomer_sends_nothing()
    {
        let mut server = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await.unwrap();
        let (old, peer, newcomer) =
            (shared(&server, "old").await, shared(&server, "peer").await, shared(&server, "new").await);
        // Two heartbeats: each counts the three.
        for _ in 0..2 {
            peer.hello().await;
            newcomer.hello().await;
            old.hello().await;
        }
        assert_eq!(share(&old), Some((3, 3)), "three live instances: a third of 10 requests/s each, rounded down");
        assert_eq!(share(&peer), Some((3, 3)));
        // Counted by every peer long ago (instead of waiting JOINED_BEFORE); the newcomer joined just now.
        old.standing.lock().unwrap().joined = Some(Instant::now() - JOINED_BEFORE * 2);
        let slot = granted(&old, 50).await.expect("the shared limiter grants");
        assert!(!slot.alone);

        server.kill();
        let slot = granted(&old, 200).await.expect("without the limiter, the old instance paces alone");
        assert!(slot.alone && old.in_spell());
        assert_eq!(old.alone(LocalPacer::interval), Some(Duration::from_secs(1) / 3));
        old.departed_alone(slot.n);
        old.ended_alone(slot.n, false);
        // The newcomer may not: as long as the old one needed to pace alone, and a second more.
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(2) {
            assert!(newcomer.grant().await.is_err(), "a newcomer without a share sends nothing");
            tokio::time::sleep(REDIS_RETRY).await;
        }

        // Back: the old instance's hello says so; its peers not seen since keep their shares out.
        server.restart().await.unwrap();
        let mut tries = 0;
        while old.in_spell() {
            tries += 1;
            assert!(tries < 100, "the old instance never came back");
            old.hello().await;
            tokio::time::sleep(REDIS_RETRY).await;
        }
        // No request left alone while it said so: its share is kept out only until a second
        // (and the guard) after its last one, which left before it said so.
        let mut conn = old.store.conn().await.unwrap();
        let said = scripts::limiter_peer(&mut conn, &old.key, "old").await.unwrap();
        let Some([stamp, _share, held]) = said else { panic!("the old instance's entry: {said:?}") };
        assert!(held - stamp <= 1000 + 2 + 1, "its share kept out {} ms after it said it was back", held - stamp);
        let (_, _, reserved) = old.call("hello", 0).await.unwrap();
        assert!(reserved >= 6, "the two peers not seen since may pace alone at 3 each: {reserved}");
        old.hello().await;
        assert!(old.watching(), "while the limiter keeps a peer's share out, it says hello five times a second");
        peer.hello().await;
        newcomer.hello().await;
        // Its own share stays out until a second after its last request alone, no longer.
        let mut tries = 0;
        while old.call("hello", 0).await.unwrap().2 != 0 {
            tries += 1;
            assert!(tries < 100, "the shares kept out were never given back");
            tokio::time::sleep(REDIS_RETRY).await;
        }
        assert_eq!(share(&old), Some((3, 3)));
        old.hello().await;
        assert!(!old.watching(), "nothing kept out: it says hello at its heartbeat again");
    }
}
