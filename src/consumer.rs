//! The consumer: one reader per partition joins the consumer group, reads
//! delivery ids, claims them (claim.lua), resolves each at send time
//! ([`subscribers::resolve`]), renders it, and hands it to the batcher. What
//! will not be sent is decided here (decide.lua).

use std::sync::Arc;
use std::time::Duration;

use redis::streams::StreamReadReply;

use crate::batcher::Batcher;
use crate::config::Config;
use crate::ctx::Ctx;
use crate::db::Store;
use crate::db::ensure_group;
use crate::db::scripts::{self, Claim, Decision};
use crate::db::streams::{Entry, entry_of};
use crate::outcome::{Failpoint, Outcome, Reason};
use crate::public::unsubscribe::{self, Tokens};
use crate::render::{RenderInput, Renderer};
use crate::sender;
use crate::subscribers::{self, Resolved};
use crate::work::{DeliveryRef, Ready};

/// The email object `delivery` is sent as, exactly as it will be sealed: the
/// campaign's template over the subscriber's data, with the unsubscribe headers.
pub fn compose(
    config: &Config,
    renderer: &Renderer,
    tokens: &Tokens,
    delivery: &DeliveryRef,
    email: &str,
    data: &serde_json::Value,
) -> Result<String, Reason> {
    let campaign = config.campaign(&delivery.campaign).ok_or(Reason::UnknownCampaign)?;
    let headers = unsubscribe::headers(config, tokens, &delivery.subscriber, &delivery.campaign);
    let (target, subscriber_id) = (&delivery.target, &delivery.subscriber);
    let input = RenderInput { delivery, target, subscriber_id, data, headers: &headers };
    let from = campaign.from.as_deref().unwrap_or(&config.resend.from);
    renderer.render(&campaign.template, from, email, &input).map_err(|e| {
        tracing::warn!(campaign = %delivery.campaign, error = %e.kind(), "template failed to render");
        Reason::RenderError
    })
}

/// What `mailstream preview` shows: the email a delivery would be sealed as now, or
/// why it would not be sent. Reads the subscriber as the consumer does; writes nothing.
pub async fn preview(store: &Store, config: &Config, delivery: &DeliveryRef) -> anyhow::Result<Result<String, Reason>> {
    let p = store.keys.partition_of(&delivery.subscriber);
    let mut conn = store.conn().await?;
    let row: subscribers::Row = redis::cmd("HMGET")
        .arg(store.keys.subscriber(p, &delivery.subscriber))
        .arg(&subscribers::resolve_fields(&delivery.campaign))
        .query_async(&mut conn)
        .await?;
    let renderer = Renderer::new(&config.templates)?;
    let tokens = Tokens::new(&config.unsubscribe.secrets);
    Ok(match subscribers::resolve(row) {
        Resolved::Send { email, data } => compose(config, &renderer, &tokens, delivery, &email, &data),
        Resolved::Skip(reason) | Resolved::Fail(reason) => Err(reason),
    })
}

/// Reads, claims, resolves and renders; hands what is ready to the batcher.
pub struct Consumer {
    ctx: Arc<Ctx>,
    renderer: Renderer,
    batcher: Arc<Batcher>,
    /// Signs the one-click unsubscribe links each email carries.
    tokens: Tokens,
}

impl Consumer {
    pub fn new(ctx: Arc<Ctx>, renderer: Renderer, batcher: Arc<Batcher>) -> Consumer {
        let tokens = Tokens::new(&ctx.config.unsubscribe.secrets);
        Consumer { ctx, renderer, batcher, tokens }
    }

    /// Reads partition `p` until shutdown.
    pub async fn read_partition(self: Arc<Self>, p: u16) {
        let ctx = &self.ctx;
        let mut shutdown = ctx.shutdown.clone();
        let stream = ctx.store.keys.stream(p);
        let group = ctx.config.redis.group.clone();
        let mut failures = 0u32;
        // The blocking read has a connection of its own, kept while it works.
        let mut reader: Option<crate::db::conn::Conn> = None;
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
                let reply: redis::RedisResult<StreamReadReply> = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg(&group)
                    .arg(&ctx.consumer)
                    .arg("COUNT")
                    .arg(ctx.config.delivery.read_count)
                    .arg("BLOCK")
                    .arg(ctx.config.delivery.block_ms)
                    .arg("STREAMS")
                    .arg(&stream)
                    .arg(">")
                    .query_async(conn)
                    .await;
                let reply = match reply {
                    Err(e) if e.code() == Some("NOGROUP") => {
                        // The stream or group vanished (a Redis restarted without persistence).
                        ensure_group(conn, &stream, &group).await?;
                        return Ok(());
                    }
                    other => other?,
                };
                let entries: Vec<Entry> = reply.keys.into_iter().flat_map(|k| k.ids).map(entry_of).collect();
                let mut conn = ctx.store.conn().await?;
                let ready = self.process_entries(p, &mut conn, entries).await?;
                // The connection goes back to the pool before waiting for room in the queue.
                drop(conn);
                if let Err(refused) = self.batcher.push(p, ready).await {
                    // Stopping: what was claimed goes back to Redis for the next instance.
                    sender::hand_back(ctx, p, &refused).await;
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

    /// Claims, resolves and renders `entries` of partition `p`; returns the emails to
    /// hand to the batcher (what will not be sent is decided here).
    pub async fn process_entries(
        &self,
        p: u16,
        conn: &mut crate::db::conn::Conn,
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
            match id.as_deref().and_then(DeliveryRef::parse) {
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
        let mut claimed: Vec<(&str, &DeliveryRef, u32)> = Vec::new();
        let mut decisions: Vec<Decision<'_>> = Vec::new();
        for ((entry, _, delivery), claim) in wellformed.iter().zip(claims) {
            match claim {
                Claim::Claimed { claims } => claimed.push((entry, delivery, claims)),
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
                "stream entries without a delivery id acknowledged"
            );
        }
        if !ack.is_empty() {
            let _: () = redis::cmd("XACK").arg(keys.stream(p)).arg(group).arg(&ack).query_async(conn).await?;
        }
        // Resolve at send time: one pipelined read of every subscriber record.
        let mut pipe = redis::pipe();
        for (_, d, _) in &claimed {
            pipe.cmd("HMGET").arg(keys.subscriber(p, &d.subscriber)).arg(&subscribers::resolve_fields(&d.campaign));
        }
        let rows: Vec<subscribers::Row> = if claimed.is_empty() { Vec::new() } else { pipe.query_async(conn).await? };

        let mut ready = Vec::new();
        for ((entry, delivery, claims), row) in claimed.iter().zip(rows) {
            let decide = |outcome, reason| Decision { entry, delivery, outcome, reason, lost: false };
            if *claims > ctx.config.delivery.max_claims {
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
            match compose(&ctx.config, &self.renderer, &self.tokens, delivery, &email, &data) {
                Ok(json) => ready.push(Ready { entry: entry.to_string(), delivery: (*delivery).clone(), json }),
                Err(reason) => decisions.push(decide(Outcome::Failed, reason)),
            }
        }

        if !decisions.is_empty() {
            let retention = ctx.config.retention().as_secs();
            let decided = scripts::decide(conn, keys, p, group, &ctx.owner, &decisions, retention).await?;
            for (d, _) in decisions.iter().zip(decided).filter(|(_, now)| *now) {
                ctx.metrics.settled(&d.delivery.campaign, d.outcome, Some(&d.reason), 1);
            }
        }
        ctx.failpoints.at(Failpoint::Claimed).await;
        Ok(ready)
    }

    /// Queues claimed emails for the batcher if there is room now, else hands them
    /// back to Redis (the reclaimer never waits on the queues).
    pub async fn hand_over_now(&self, p: u16, ready: Vec<Ready>) {
        if let Err(refused) = self.batcher.try_push(p, ready) {
            sender::hand_back(&self.ctx, p, &refused).await;
        }
    }
}
