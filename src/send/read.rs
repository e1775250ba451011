//! The partition readers: one per partition and lane joins the consumer group,
//! reads delivery ids, claims them (claim.lua), has each resolved and rendered at
//! send time (`resolve.rs`), and hands what is ready to the queues. What will not be
//! sent is decided here (decide.lua); what a render hook did not answer is put off
//! (defer.lua).

use std::sync::Arc;
use std::time::Duration;

use crate::audience::render::Renderer;
use crate::model::outcome::{Failpoint, Outcome, Reason};
use crate::model::work::{DeliveryRef, Lane, Ready};
use crate::send::ctx::Ctx;
use crate::send::queue::Batcher;
use crate::send::release;
use crate::send::resolve::{Fate, Resolver};
use crate::store::scripts::{self, Claim, Decision, Deferred};
use crate::store::streams::{self, Entry};

/// Reads, claims, resolves and renders; hands what is ready to the batcher.
pub(crate) struct Consumer {
    ctx: Arc<Ctx>,
    resolver: Resolver,
    batcher: Arc<Batcher>,
}

impl Consumer {
    pub fn new(ctx: Arc<Ctx>, renderer: Renderer, batcher: Arc<Batcher>) -> anyhow::Result<Consumer> {
        let resolver = Resolver::new(ctx.clone(), renderer)?;
        Ok(Consumer { ctx, resolver, batcher })
    }

    /// Reads partition `p`'s stream of `lane` until shutdown.
    pub(crate) async fn read_partition(self: Arc<Self>, p: u16, lane: Lane) {
        let ctx = &self.ctx;
        let mut shutdown = ctx.shutdown.clone();
        let stream = ctx.store.keys.lane_stream(p, lane);
        let group = ctx.config.redis.group.clone();
        let mut failures = 0u32;
        // The blocking read has a connection of its own, kept while it works.
        let mut reader: Option<crate::store::conn::Conn> = None;
        while !shutdown.is_triggered() {
            if ctx.pause.is_paused() {
                shutdown.sleep(Duration::from_secs(1)).await;
                continue;
            }
            let result = async {
                if reader.is_none() {
                    reader = Some(ctx.store.dedicated().await?);
                }
                let conn = reader.as_mut().expect("just connected");
                let (count, block_ms) = (ctx.config.delivery.read_count, ctx.config.delivery.block_ms);
                let from = (stream.as_str(), group.as_str(), ctx.consumer.as_str());
                let entries = streams::read_new(conn, from, count, block_ms).await?;
                // The reader's own connection claims and resolves too: no second one is
                // taken from the pool (and held through a render hook's answer).
                let ready = self.process_entries(p, lane, conn, entries).await?;
                if let Err(refused) = self.batcher.push(p, lane, ready).await {
                    // Stopping: what was claimed goes back to Redis for the next instance.
                    release::hand_back(ctx, p, &refused).await;
                }
                anyhow::Ok(())
            }
            .await;
            match result {
                Ok(()) => failures = 0,
                Err(e) => {
                    // A broken connection is not reused.
                    reader = None;
                    failures += 1;
                    ctx.metrics.redis_error("read", &e);
                    let backoff = Duration::from_millis(200 * u64::from(failures.min(25)));
                    shutdown.sleep(backoff).await;
                }
            }
        }
    }

    /// Claims, resolves and renders `entries` of partition `p`'s `lane`; returns the
    /// emails to hand to the batcher (what will not be sent is decided here, and what
    /// a render hook did not answer is put off).
    pub(crate) async fn process_entries(
        &self,
        p: u16,
        lane: Lane,
        conn: &mut crate::store::conn::Conn,
        entries: Vec<Entry>,
    ) -> anyhow::Result<Vec<Ready>> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = &self.ctx;
        let keys = &ctx.store.keys;
        let group = &ctx.config.redis.group;
        let mut wellformed: Vec<(String, String, DeliveryRef)> = Vec::new();
        let mut malformed: Vec<String> = Vec::new();
        for (entry, id) in entries {
            match id.as_deref().and_then(DeliveryRef::parse).filter(|d| d.lane() == lane) {
                Some(d) => wellformed.push((entry, id.unwrap_or_default(), d)),
                None => malformed.push(entry),
            }
        }
        let ids: Vec<&str> = wellformed.iter().map(|(_, id, _)| id.as_str()).collect();
        let claims = scripts::claim(conn, keys, p, &ids, &ctx.owner, ctx.config.lease().as_millis() as u64).await?;

        // Entries whose delivery is sealed or settled are acknowledged: their work is
        // done or owned elsewhere. Entries held under a live lease stay. An entry whose
        // record is missing is a lost write: recorded as failed, never acked silently.
        let mut ack: Vec<&str> = malformed.iter().map(String::as_str).collect();
        let mut live: Vec<(&str, &DeliveryRef)> = Vec::new();
        let mut decisions: Vec<Decision<'_>> = Vec::new();
        for ((entry, _, delivery), claim) in wellformed.iter().zip(claims) {
            let decide = |outcome, reason| Decision { entry, delivery, outcome, reason, lost: false };
            match claim {
                Claim::Claimed { claims } if claims > ctx.config.delivery.max_claims => {
                    decisions.push(decide(Outcome::Failed, Reason::TooManyAttempts));
                }
                Claim::Claimed { .. } => live.push((entry, delivery)),
                Claim::Held => {}
                Claim::Done(_) => ack.push(entry),
                Claim::Gone => {
                    tracing::error!(delivery = %delivery.id(), "a stream entry names a delivery whose record is gone");
                    ctx.metrics.lost_batch(1);
                    let reason = Reason::RecordLost;
                    decisions.push(Decision { entry, delivery, outcome: Outcome::Failed, reason, lost: true });
                }
            }
        }
        if !malformed.is_empty() {
            tracing::warn!(
                partition = p,
                entries = malformed.len(),
                "stream entries without a delivery id of this lane acknowledged"
            );
        }
        if !ack.is_empty() {
            let stream = keys.lane_stream(p, lane);
            let _: () = redis::cmd("XACK").arg(stream).arg(group).arg(&ack).query_async(conn).await?;
        }

        let fates = match lane {
            Lane::Digest => self.resolver.campaign_fates(p, conn, &live).await?,
            Lane::Transactional => self.resolver.transactional_fates(p, conn, &live).await?,
            Lane::App | Lane::Push => anyhow::bail!("a channel other than email is read by its own sender"),
        };
        let mut ready = Vec::new();
        let mut deferred: Vec<(&str, &DeliveryRef)> = Vec::new();
        for ((entry, delivery), fate) in live.iter().zip(fates) {
            match fate {
                Fate::Ready { json, variant, audience } => {
                    let delivery = (*delivery).clone();
                    ready.push(Ready { entry: entry.to_string(), delivery, json, variant, audience });
                }
                Fate::Decide(outcome, reason) => {
                    decisions.push(Decision { entry, delivery, outcome, reason, lost: false });
                }
                Fate::Defer => deferred.push((entry, delivery)),
            }
        }
        for (entry, delivery) in self.defer(p, conn, &deferred).await? {
            let reason = Reason::HookUnavailable;
            decisions.push(Decision { entry, delivery, outcome: Outcome::Failed, reason, lost: false });
        }

        if !decisions.is_empty() {
            let retention = ctx.config.retention().as_secs();
            let decided = scripts::decide(conn, keys, p, group, &ctx.owner, &decisions, retention).await?;
            for (d, _) in decisions.iter().zip(decided).filter(|(_, now)| *now) {
                ctx.metrics.settled(&d.delivery.campaign, d.delivery.channel, d.outcome, Some(&d.reason), 1);
            }
        }
        ctx.failpoints.at(Failpoint::Claimed).await;
        Ok(ready)
    }

    /// Puts off deliveries a render hook did not answer; returns those past their
    /// deadline (to be failed: `render_hook_unavailable`).
    async fn defer<'a>(
        &self,
        p: u16,
        conn: &mut crate::store::conn::Conn,
        items: &[(&'a str, &'a DeliveryRef)],
    ) -> anyhow::Result<Vec<(&'a str, &'a DeliveryRef)>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = &self.ctx;
        let d = &ctx.config.delivery;
        let backoff = scripts::Backoff {
            base_ms: d.retry_base_ms,
            max_ms: d.retry_max_ms.min(60_000),
            deadline_ms: d.deadline().as_millis() as u64,
            jitter_percent: rand::random_range(0..=20),
        };
        let (keys, group) = (&ctx.store.keys, &ctx.config.redis.group);
        let done = scripts::defer(conn, keys, p, group, &ctx.owner, backoff, items).await?;
        let mut expired = Vec::new();
        for (item, result) in items.iter().zip(done) {
            match result {
                Deferred::For(_) => ctx.metrics.render_hook_deferred(&item.1.campaign, 1),
                Deferred::Expired => expired.push(*item),
                Deferred::NotHeld => {}
            }
        }
        Ok(expired)
    }

    /// Queues claimed emails for the batcher if there is room now, else hands them
    /// back to Redis (the reclaimer never waits on the queues).
    pub(crate) async fn hand_over_now(&self, p: u16, lane: Lane, ready: Vec<Ready>) {
        if let Err(refused) = self.batcher.try_push(p, lane, ready) {
            release::hand_back(&self.ctx, p, &refused).await;
        }
    }
}
