//! The consumer: one reader per partition joins the consumer group, reads
//! delivery ids, claims them (claim.lua), resolves each at send time
//! ([`subscribers::resolve`]), renders it, and hands it to the batcher. What
//! will not be sent is decided here (decide.lua).

use std::sync::Arc;
use std::time::Duration;

use redis::streams::{StreamId, StreamReadReply};

use crate::batcher::Batcher;
use crate::ctx::Ctx;
use crate::outcome::{Failpoint, Outcome, Reason};
use crate::render::{RenderInput, Renderer};
use crate::scripts::{self, Claim, Claimed, Decision};
use crate::store::ensure_group;
use crate::subscribers::{self, Resolved};
use crate::work::{DeliveryRef, Ready};

/// A stream entry: its id and the delivery id it carries (None: malformed entry).
pub type Entry = (String, Option<String>);

/// The delivery id of a stream entry.
pub fn entry_of(s: StreamId) -> Entry {
    let delivery = s.map.get("delivery").and_then(|v| redis::from_redis_value_ref::<String>(v).ok());
    (s.id, delivery)
}

/// Reads, claims, resolves and renders; hands what is ready to the batcher.
pub struct Consumer {
    ctx: Arc<Ctx>,
    renderer: Renderer,
    batcher: Arc<Batcher>,
}

impl Consumer {
    pub fn new(ctx: Arc<Ctx>, renderer: Renderer, batcher: Arc<Batcher>) -> Consumer {
        Consumer { ctx, renderer, batcher }
    }

    /// Reads partition `p` until shutdown.
    pub async fn read_partition(self: Arc<Self>, p: u16) {
        let ctx = &self.ctx;
        let mut shutdown = ctx.shutdown.clone();
        let stream = ctx.store.keys.stream(p);
        let group = ctx.config.redis.group.clone();
        let mut failures = 0u32;
        while !shutdown.is_triggered() {
            if ctx.pause.is_paused() {
                shutdown.sleep(Duration::from_secs(1)).await;
                continue;
            }
            let result = async {
                let mut conn = ctx.store.conn().await?;
                let reply: redis::RedisResult<StreamReadReply> = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(&group)
                    .arg(&ctx.owner)
                    .arg("COUNT")
                    .arg(ctx.config.delivery.read_count)
                    .arg("BLOCK")
                    .arg(ctx.config.delivery.block_ms)
                    .arg("STREAMS")
                    .arg(&stream)
                    .arg(">")
                    .query_async(&mut conn)
                    .await;
                let reply = match reply {
                    Err(e) if e.code() == Some("NOGROUP") => {
                        // The stream or group vanished (a Redis restarted without persistence).
                        ensure_group(&mut conn, &stream, &group).await?;
                        return Ok(());
                    }
                    other => other?,
                };
                let entries: Vec<Entry> = reply.keys.into_iter().flat_map(|k| k.ids).map(entry_of).collect();
                let ready = self.process_entries(p, &mut conn, entries).await?;
                // The connection goes back to the pool before waiting for room in the queue.
                drop(conn);
                self.hand_over(p, ready).await;
                anyhow::Ok(())
            }
            .await;
            match result {
                Ok(()) => failures = 0,
                Err(e) => {
                    failures += 1;
                    ctx.metrics.redis_error("read", &e);
                    let backoff = Duration::from_millis(200 * u64::from(failures.min(25)));
                    shutdown.sleep(backoff).await;
                }
            }
        }
    }

    /// Claims, resolves and renders `entries` of partition `p`; returns the emails to
    /// hand to the batcher (what will not be sent is decided here).
    pub async fn process_entries(
        &self,
        p: u16,
        conn: &mut deadpool_redis::Connection,
        entries: Vec<Entry>,
    ) -> anyhow::Result<Vec<Ready>> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = &self.ctx;
        let keys = &ctx.store.keys;
        let group = &ctx.config.redis.group;
        let (wellformed, malformed): (Vec<_>, Vec<_>) = entries.into_iter().partition(|(_, d)| d.is_some());
        let wellformed: Vec<(String, String)> =
            wellformed.into_iter().map(|(e, d)| (e, d.unwrap_or_default())).collect();

        let ids: Vec<&str> = wellformed.iter().map(|(_, d)| d.as_str()).collect();
        let claims = scripts::claim(conn, keys, p, &ids, &ctx.owner, ctx.config.lease().as_millis() as u64).await?;

        // Entries whose delivery is gone, sealed or decided are acknowledged: their
        // work is done or owned elsewhere. Entries held under a live lease stay.
        let mut ack: Vec<&str> = malformed.iter().map(|(e, _)| e.as_str()).collect();
        let mut claimed: Vec<(&str, DeliveryRef, Claimed)> = Vec::new();
        for ((entry, id), claim) in wellformed.iter().zip(claims) {
            match claim {
                Claim::Claimed(c) => {
                    let d = DeliveryRef { id: id.clone(), campaign: c.campaign.clone(), period: c.period.clone() };
                    claimed.push((entry, d, c));
                }
                Claim::Held => {}
                Claim::Gone | Claim::Done(_) => ack.push(entry),
            }
        }
        if !malformed.is_empty() {
            tracing::warn!(
                partition = p,
                entries = malformed.len(),
                "stream entries without a delivery id acknowledged"
            );
        }
        if !ack.is_empty() {
            let _: () = redis::cmd("XACK").arg(keys.stream(p)).arg(group).arg(&ack).query_async(conn).await?;
        }
        if claimed.is_empty() {
            return Ok(Vec::new());
        }

        // Resolve at send time: one pipelined read of every subscriber record.
        let mut pipe = redis::pipe();
        for (_, _, c) in &claimed {
            pipe.cmd("HMGET").arg(keys.subscriber(p, &c.subscriber)).arg(&subscribers::RESOLVE_FIELDS);
        }
        let rows: Vec<subscribers::Row> = pipe.query_async(conn).await?;

        let mut ready = Vec::new();
        let mut decisions: Vec<Decision<'_>> = Vec::new();
        for ((entry, delivery, c), row) in claimed.iter().zip(rows) {
            let decide = |outcome, reason| Decision { entry, delivery, outcome, reason };
            if c.attempts > ctx.config.delivery.max_attempts {
                decisions.push(decide(Outcome::Failed, Reason::TooManyAttempts));
                continue;
            }
            let (email, data) = match subscribers::resolve(row) {
                Resolved::Send { email, data } => (email, data),
                Resolved::Skip(reason) => {
                    decisions.push(decide(Outcome::Skipped, reason));
                    continue;
                }
                Resolved::Fail(reason) => {
                    decisions.push(decide(Outcome::Failed, reason));
                    continue;
                }
            };
            let Some(campaign) = ctx.config.campaign(&c.campaign) else {
                decisions.push(decide(Outcome::Failed, Reason::UnknownCampaign));
                continue;
            };
            let input = RenderInput { delivery, target: &c.target, subscriber_id: &c.subscriber, data: &data };
            let from = campaign.from.as_deref().unwrap_or(&ctx.config.resend.from);
            match self.renderer.render(&campaign.template, from, &email, &input) {
                Ok(json) => ready.push(Ready { entry: entry.to_string(), delivery: delivery.clone(), json }),
                Err(e) => {
                    tracing::warn!(campaign = %c.campaign, error = %e.kind(), "template failed to render");
                    decisions.push(decide(Outcome::Failed, Reason::RenderError));
                }
            }
        }

        if !decisions.is_empty() {
            let retention_ms = ctx.config.retention().as_millis() as u64;
            let decided = scripts::decide(conn, keys, p, group, &ctx.owner, &decisions, retention_ms).await?;
            for (d, _) in decisions.iter().zip(decided).filter(|(_, now)| *now) {
                ctx.metrics.settled(&d.delivery.campaign, d.outcome, Some(&d.reason), 1);
            }
        }
        ctx.failpoints.at(Failpoint::Claimed).await;
        Ok(ready)
    }

    /// Queues claimed emails for the batcher, waiting for room.
    pub async fn hand_over(&self, p: u16, ready: Vec<Ready>) {
        let mut shutdown = self.ctx.shutdown.clone();
        tokio::select! {
            // The dispatcher has stopped taking: what is claimed stays leased, for the next instance.
            _ = shutdown.wait() => {}
            _ = self.batcher.push(p, ready) => {}
        }
    }
}
