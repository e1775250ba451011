//! Dispatch: turns request slots into requests. It waits for work, asks the
//! limiter for the next slot, takes a batch's worth from the batcher just
//! before it (sealing is a Redis round trip, done in the lead), takes the slot
//! in the task that sends, and bounds the requests in flight. On shutdown it
//! lets requests on the wire finish within a deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::batcher::Batcher;
use crate::config::Config;
use crate::ctx::Ctx;
use crate::limiter::Limiter;
use crate::sender::{self, PacingNews, Sender};
use crate::work::Work;

/// How long before its slot a batch is taken and sealed: sealing is a Redis
/// round trip, done ahead so the request itself leaves right at the slot.
const SEAL_LEAD: Duration = Duration::from_millis(20);

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

    /// Grants request slots to work until shutdown, then lets in-flight requests
    /// finish within the drain time; what does not finish stays sealed for recovery.
    pub async fn run(self: Arc<Self>, ctx: Arc<Ctx>) {
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
            if let Some(left) = ctx.pause.remaining() {
                shutdown.sleep(left.min(Duration::from_secs(1))).await;
                continue;
            }
            let asked = Instant::now();
            let slot = self.limiter.next_slot();
            tokio::select! {
                _ = shutdown.wait() => break,
                _ = tokio::time::sleep_until(slot.checked_sub(SEAL_LEAD).unwrap_or(slot)) => {}
            }
            let sealed = match self.batcher.take() {
                None => continue,
                Some(Work::Fresh(p, items)) => match sender::seal(&ctx, p, items).await {
                    Some(sealed) => sealed,
                    None => continue,
                },
                Some(Work::Resend(sealed)) => sealed,
            };
            // Wait for the slot as it stands now: the previous request may have left
            // late, or a 429 may have paused sending, since it was first asked. A slot
            // more than half a lease away (a long pause) is not waited for holding the lease.
            tokio::select! {
                _ = shutdown.wait() => {
                    tracing::info!(batch = %sealed.id, "shutdown before its slot; the batch stays sealed for recovery");
                    break;
                }
                waited = self.limiter.wait_for_slot(ctx.config.lease() / 2) => {
                    if let Err(delay) = waited {
                        sender::postpone(&ctx, sealed.partition, &sealed.id, delay).await;
                        continue;
                    }
                }
            }
            ctx.metrics.limiter_waited(asked.elapsed());
            let (me, ctx) = (self.clone(), ctx.clone());
            tasks.spawn(async move {
                // The request leaves now; if this task started late, the next slot moves back.
                me.limiter.sent(Instant::now());
                let news = me.sender.attempt(&ctx, sealed).await;
                me.obey(&news);
                drop(permit);
            });
        }
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
