//! Dispatch: turns request slots into requests. It waits for work, asks the
//! limiter for the next slot, takes a batch's worth from the batcher just
//! before it (sealing is a Redis round trip, done in the lead), takes the slot
//! and hands the batch to the sender, which passes the last gate and sends.
//! It bounds the requests in flight, keeps the leases of what this instance
//! holds alive (the heartbeat), hands work back to Redis when sending pauses or
//! the daemon stops, and lets requests on the wire finish within a deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::batcher::Batcher;
use crate::config::Config;
use crate::ctx::Ctx;
use crate::limiter::Limiter;
use crate::scripts;
use crate::sender::{self, PacingNews, Sender};
use crate::work::{DeliveryRef, Work};

/// How long before its slot a batch is taken, sealed and passed through the last
/// gate: two Redis round trips (each fsynced with `appendfsync always`), done
/// ahead so the request itself leaves right at the slot and the gate's latency
/// never stretches the pacing.
const SEAL_LEAD: Duration = Duration::from_millis(25);

/// A gate passed longer ago than this (the slot moved: a `retry-after`) is passed
/// again before the request leaves.
const GATE_FRESHNESS: Duration = Duration::from_millis(500);

/// A slot further away than this (a long `retry-after`) is not waited for holding
/// a batch: it is put back in Redis, due then, for whoever is free.
const SLOT_PATIENCE: Duration = Duration::from_secs(30);

/// The sending side of a daemon: queues in, paced requests out.
pub struct Dispatcher {
    limiter: Limiter,
    batcher: Arc<Batcher>,
    sender: Sender,
    /// How long requests on the wire may take to finish at shutdown.
    drain: Duration,
}

impl Dispatcher {
    pub fn new(config: &Config, batcher: Arc<Batcher>, sender: Sender) -> Dispatcher {
        let r = &config.resend;
        let limiter = Limiter::new(r.requests_per_second, Duration::from_millis(r.pacing_guard_ms));
        Dispatcher { limiter, batcher, sender, drain: Duration::from_secs(r.timeout_seconds + 5) }
    }

    /// Grants request slots to work until shutdown, then hands back what is queued and
    /// lets in-flight requests finish within the drain time; what does not finish
    /// stays sealed for recovery.
    pub async fn run(self: Arc<Self>, ctx: Arc<Ctx>) {
        // In a JoinSet, so the heartbeat dies with this task if it is aborted: a heartbeat
        // outliving its holder would keep a dead instance's leases alive.
        let mut heartbeat = JoinSet::new();
        heartbeat.spawn(keep_alive(ctx.clone(), self.batcher.clone()));
        let mut shutdown = ctx.shutdown.clone();
        let in_flight = Arc::new(Semaphore::new(ctx.config.resend.max_in_flight));
        let mut tasks = JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                _ = shutdown.wait() => break,
                p = in_flight.clone().acquire_owned() => p.expect("never closed"),
            };
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = self.batcher.wait_for_work() => {}
            }
            if ctx.pause.is_paused() {
                // Nothing rendered waits in memory across a pause.
                hand_back_all(&ctx, &self.batcher).await;
                shutdown.sleep(Duration::from_secs(1)).await;
                continue;
            }
            let asked = Instant::now();
            let slot = self.limiter.next_slot();
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = tokio::time::sleep_until(slot.checked_sub(SEAL_LEAD).unwrap_or(slot)) => {}
            }
            let mut sealed = match self.batcher.take() {
                None => continue,
                Some(Work::Fresh(p, items)) => match sender::seal(&ctx, p, items).await {
                    Some(sealed) => sealed,
                    None => continue,
                },
                Some(Work::Resend(sealed)) => sealed,
            };
            self.batcher.hold(&sealed.id, sealed.partition);
            let gated = Instant::now();
            let mut go = sender::pass_gate(&ctx, &mut sealed).await;
            if go {
                // Wait for the slot as it stands now: the previous request may have left
                // late, or a 429 may have paused sending, since it was first asked.
                let waited = tokio::select! {
                    _ = shutdown.wait() => Err(Duration::ZERO),
                    waited = self.limiter.wait_for_slot(SLOT_PATIENCE) => waited,
                };
                match waited {
                    // Unsent, back to Redis: due when the slot is (at once when stopping).
                    Err(delay) => {
                        sender::put_back(&ctx, sealed.partition, &sealed.id, delay).await;
                        go = false;
                    }
                    // The slot moved while the batch waited: look again right before it leaves.
                    Ok(()) if gated.elapsed() > GATE_FRESHNESS => go = sender::pass_gate(&ctx, &mut sealed).await,
                    Ok(()) => {}
                }
            }
            if !go {
                self.batcher.unhold(&sealed.id);
                continue;
            }
            ctx.metrics.limiter_waited(asked.elapsed());
            let (me, ctx) = (self.clone(), ctx.clone());
            tasks.spawn(async move {
                let id = sealed.id.clone();
                // The request leaves now; if this task started late, the next slot moves back.
                me.limiter.sent(Instant::now());
                let news = me.sender.attempt(&ctx, sealed).await;
                me.obey(&news);
                me.batcher.unhold(&id);
                drop(permit);
            });
        }
        // Stop: nothing more is queued, and what is queued goes back to Redis at once.
        self.batcher.close();
        hand_back_all(&ctx, &self.batcher).await;
        let deadline = Instant::now() + self.drain;
        while !tasks.is_empty() {
            if tokio::time::timeout_at(deadline, tasks.join_next()).await.is_err() {
                tracing::warn!(
                    requests = tasks.len(),
                    "drain deadline passed; unfinished batches stay sealed for recovery"
                );
                tasks.abort_all();
                while tasks.join_next().await.is_some() {}
            }
        }
        heartbeat.shutdown().await;
    }

    /// Applies what the provider said about pacing.
    fn obey(&self, news: &PacingNews) {
        if let Some(after) = news.pause {
            self.limiter.pause_for(after);
        }
        if let Some(rps) = self.limiter.observe(&news.rate) {
            tracing::warn!(requests_per_second = rps, "provider declares a lower rate limit; pacing lowered");
        }
    }
}

/// Hands everything queued back to Redis: claimed emails become pending again (any
/// instance reads them at once), queued resends are put back unsent.
async fn hand_back_all(ctx: &Ctx, batcher: &Batcher) {
    let drained = batcher.drain();
    for (p, items) in &drained.fresh {
        sender::hand_back(ctx, *p, items).await;
    }
    for sealed in &drained.resend {
        sender::put_back(ctx, sealed.partition, &sealed.id, Duration::ZERO).await;
    }
}

/// The heartbeat: every `config.heartbeat()`, rereads the shared pause and renews the
/// leases of everything this instance holds (claimed emails in the queues, batches
/// in hand), in Redis time. A task of its own, so no slow step elsewhere stops it.
async fn keep_alive(ctx: Arc<Ctx>, batcher: Arc<Batcher>) {
    let lease_ms = ctx.config.lease().as_millis() as u64;
    loop {
        match ctx.pause.refresh(&ctx.store).await {
            Ok(()) => ctx.metrics.set_paused(ctx.pause.is_paused()),
            Err(e) => ctx.metrics.redis_error("pause", &e),
        }
        for p in 0..ctx.store.keys.partitions() {
            let claimed: Vec<DeliveryRef> = batcher.claimed(p);
            let batches: Vec<String> = batcher.in_hand(p);
            let result = async {
                let mut conn = ctx.store.conn().await?;
                let claimed: Vec<&DeliveryRef> = claimed.iter().collect();
                let batches: Vec<&str> = batches.iter().map(String::as_str).collect();
                anyhow::Ok(
                    scripts::renew(&mut conn, &ctx.store.keys, p, &ctx.owner, lease_ms, &claimed, &batches).await?,
                )
            };
            if let Err(e) = result.await {
                ctx.metrics.redis_error("renew", &e);
            }
        }
        tokio::time::sleep(ctx.config.heartbeat()).await;
    }
}
