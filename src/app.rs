//! The application channel: each of its deliveries is one signed POST of the delivery's
//! event to the application (`[channels.app] url`), the Standard Webhooks way: the
//! `webhook-id` is the delivery id, so the application takes each event once however
//! often it comes. One reader per partition reads the channel's own stream (`stream:app`),
//! claims (claim.lua), checks the subscriber still wants it, sends, and settles
//! (decide.lua) or puts it off (defer.lua, into `due:app`); it takes over its own expired
//! leases. Nothing here touches an email's stream, batch or limiter, so an application
//! that is down holds no email, and an email outage holds no event.
//!
//! The event carries ids only (campaign, period, subscriber id, target, channel, the
//! template and the names of its data fields), never an address. Its body is written
//! into the delivery's record before the first request (`app_body`, first writer wins),
//! so every retry sends the same id and body.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use redis::AsyncCommands;
use redis::streams::StreamAutoClaimReply;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::AppChannelConfig;
use crate::ctx::Ctx;
use crate::db::conn::Conn;
use crate::db::scripts::{self, Backoff, Claim, Decision, Deferred};
use crate::db::streams::{self, Entry, entry_of};
use crate::outcome::{Outcome, Reason};
use crate::subscribers::{self, Resolved};
use crate::svix::SigningKey;
use crate::work::{Channel, DeliveryRef, Lane, TRANSACTIONAL};

/// The record field holding the event's body, fixed before its first request.
const BODY_FIELD: &str = "app_body";
/// The record field set when a request of the event got no answer (it may have been taken).
const MAYBE_TAKEN_FIELD: &str = "app_maybe_taken";

/// How an event that will not be sent again ends: `failed`, or `outcome_unknown` when a
/// request of it may have been taken.
fn fails(maybe_taken: bool) -> Outcome {
    if maybe_taken { Outcome::OutcomeUnknown } else { Outcome::Failed }
}

/// The event an application delivery sends (see the module doc).
pub fn event_body(d: &DeliveryRef, template: &str, data_keys: &[String]) -> String {
    serde_json::json!({
        "type": "delivery",
        "data": {
            "delivery": d.id(),
            "campaign": d.campaign,
            "period": d.period,
            "subscriber": d.subscriber,
            "target": d.target,
            "channel": d.channel.as_str(),
            "template": template,
            "data_keys": data_keys,
        }
    })
    .to_string()
}

/// The Standard Webhooks headers of one request: (`webhook-id`, `webhook-timestamp`,
/// `webhook-signature`).
pub fn signed_headers(key: &SigningKey, id: &str, timestamp: i64, body: &[u8]) -> [(&'static str, String); 3] {
    [
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", key.sign(id, timestamp, body)),
    ]
}

/// What one request's answer means for its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// 2xx: settled `sent`.
    Taken,
    /// 410: settled `failed`, not asked again.
    Gone,
    /// Anything else (429, 5xx, another 4xx, a timeout, no connection): asked again later
    /// with the same id and body, until the delivery deadline.
    Again,
}

/// What becomes of an event no longer wanted when it is claimed: skipped if no request
/// of it has left (no body written yet), else `outcome_unknown` (one may have been taken).
pub fn unwanted_outcome(body_written: bool) -> Outcome {
    if body_written { Outcome::OutcomeUnknown } else { Outcome::Skipped }
}

/// Writes each event's body into its record unless one is there (first writer wins),
/// waits until replicas have it (`Store::durable`), then reads back the body that is:
/// every request of an event, by anyone and after a failover, carries that body. Read
/// after the WAIT, so a failover just before it (a new primary acknowledging without
/// the write) shows as no body, and nothing is sent: the lease runs out, and whoever
/// claims it next writes and sends the one body that then survives.
pub async fn fix_bodies(
    conn: &mut Conn,
    store: &crate::db::Store,
    p: u16,
    items: &[(&DeliveryRef, String)],
) -> anyhow::Result<Vec<Option<String>>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let mut read = redis::pipe();
    let mut write = Vec::new();
    for (d, body) in items {
        let key = store.keys.delivery(p, &d.id());
        read.hget(&key, BODY_FIELD);
        write.push((key, body.as_str()));
    }
    // Never onto a record settled (and gone) meanwhile: that event is not sent again.
    scripts::note(conn, BODY_FIELD, &write).await?;
    store.durable(conn, &store.keys.lane_stream(p, Lane::App)).await?;
    Ok(read.query_async(conn).await?)
}

/// How a status is read (`None`: no answer came).
pub fn answered(status: Option<u16>) -> Answered {
    match status {
        Some(200..=299) => Answered::Taken,
        Some(410) => Answered::Gone,
        _ => Answered::Again,
    }
}

/// The application channel's sender: one per daemon, shared by its partition readers.
pub(crate) struct AppChannel {
    ctx: Arc<Ctx>,
    config: AppChannelConfig,
    key: SigningKey,
    http: reqwest::Client,
    /// Per partition reader, its requests in flight (`concurrency` shared out). A reader
    /// takes a slot for each event before it reads it, so an event's request leaves as
    /// soon as it is claimed, well within its lease.
    slots: Vec<Arc<Semaphore>>,
}

/// A claimed delivery on its way to the application.
struct Claimed {
    entry: String,
    delivery: DeliveryRef,
}

impl AppChannel {
    /// The channel, if the config sets `[channels.app]`.
    pub fn from_ctx(ctx: &Arc<Ctx>) -> anyhow::Result<Option<Arc<AppChannel>>> {
        let Some(config) = ctx.config.channels.app.clone() else { return Ok(None) };
        let secret = config.secret.as_ref().context("channels.app: no signing secret")?;
        let key = SigningKey::parse(secret.expose()).context("channels.app: the secret is not whsec_<base64>")?;
        crate::resend::client::install_crypto_provider();
        let http = reqwest::Client::builder()
            .user_agent(concat!("mailstream/", env!("CARGO_PKG_VERSION")))
            .timeout(Duration::from_millis(config.timeout_ms))
            .build()?;
        let partitions = usize::from(ctx.config.redis.partitions);
        let per = config.concurrency.div_ceil(partitions).max(1);
        let slots = (0..partitions).map(|_| Arc::new(Semaphore::new(per))).collect();
        Ok(Some(Arc::new(AppChannel { ctx: ctx.clone(), config, key, http, slots })))
    }

    /// Request slots of partition `p`'s reader: at least one (waiting for it with `wait`),
    /// and as many more as are free, up to a read's worth.
    async fn permits(&self, p: u16, wait: bool) -> Vec<OwnedSemaphorePermit> {
        let slots = &self.slots[usize::from(p)];
        let mut out = Vec::new();
        if wait {
            out.push(slots.clone().acquire_owned().await.expect("the semaphore is never closed"));
        }
        while out.len() < self.ctx.config.delivery.read_count {
            match slots.clone().try_acquire_owned() {
                Ok(permit) => out.push(permit),
                Err(_) => break,
            }
        }
        out
    }

    /// Reads partition `p`'s application stream until shutdown, taking over its expired
    /// leases every half lease.
    pub(crate) async fn read_partition(self: Arc<Self>, p: u16) {
        let ctx = &self.ctx;
        let mut shutdown = ctx.shutdown.clone();
        let stream = ctx.store.keys.lane_stream(p, Lane::App);
        let group = ctx.config.redis.group.clone();
        let mut failures = 0u32;
        let mut reader: Option<Conn> = None;
        let mut last_takeover = tokio::time::Instant::now();
        while !shutdown.is_triggered() {
            let result = async {
                if reader.is_none() {
                    reader = Some(ctx.store.dedicated().await?);
                }
                let conn = reader.as_mut().expect("just connected");
                if last_takeover.elapsed() >= ctx.config.lease() / 2 {
                    last_takeover = tokio::time::Instant::now();
                    self.take_over(p, conn).await?;
                }
                // Read only what there are request slots for: the rest waits in the stream,
                // unclaimed, for whichever instance has room.
                let permits = self.permits(p, true).await;
                let from = (stream.as_str(), group.as_str(), ctx.consumer.as_str());
                let entries = streams::read_new(conn, from, permits.len(), ctx.config.delivery.block_ms).await?;
                self.clone().process(p, conn, entries, permits).await
            }
            .await;
            match result {
                Ok(()) => failures = 0,
                Err(e) => {
                    reader = None;
                    failures += 1;
                    ctx.metrics.redis_error("app_read", &e);
                    shutdown.sleep(Duration::from_millis(200 * u64::from(failures.min(25)))).await;
                }
            }
        }
        // Let the requests in flight settle (each ends within its timeout).
        let slots = &self.slots[usize::from(p)];
        let _ = slots.acquire_many(self.config.concurrency.div_ceil(self.slots.len()).max(1) as u32).await;
    }

    /// XAUTOCLAIMs entries of partition `p`'s application stream idle longer than a
    /// lease and processes them like new ones (claim.lua decides whether the lease
    /// really expired).
    async fn take_over(self: &Arc<Self>, p: u16, conn: &mut Conn) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        let permits = self.permits(p, false).await;
        if permits.is_empty() {
            return Ok(());
        }
        let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(ctx.store.keys.lane_stream(p, Lane::App))
            .arg(&ctx.config.redis.group)
            .arg(&ctx.consumer)
            .arg(ctx.config.lease().as_millis() as u64)
            .arg("0-0")
            .arg("COUNT")
            .arg(permits.len())
            .query_async(conn)
            .await?;
        let entries: Vec<Entry> = reply.claimed.into_iter().map(entry_of).collect();
        if !entries.is_empty() {
            tracing::info!(
                partition = p,
                entries = entries.len(),
                "taking over application events whose lease expired"
            );
        }
        self.clone().process(p, conn, entries, permits).await
    }

    /// Claims `entries`, settles what will not be sent, and starts a request for each of
    /// the rest (waiting for a slot).
    async fn process(
        self: Arc<Self>,
        p: u16,
        conn: &mut Conn,
        entries: Vec<Entry>,
        mut permits: Vec<OwnedSemaphorePermit>,
    ) -> anyhow::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let ctx = &self.ctx;
        let keys = &ctx.store.keys;
        let group = &ctx.config.redis.group;
        let mut wellformed = Vec::new();
        let mut ack = Vec::new();
        for (entry, id) in entries {
            match id.as_deref().and_then(DeliveryRef::parse).filter(|d| d.lane() == Lane::App) {
                Some(d) => wellformed.push(Claimed { entry, delivery: d }),
                None => ack.push(entry),
            }
        }
        let ids: Vec<String> = wellformed.iter().map(|c| c.delivery.id()).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let claims = scripts::claim(conn, keys, p, &ids, &ctx.owner, ctx.config.lease().as_millis() as u64).await?;
        let mut live = Vec::new();
        let mut decisions: Vec<(usize, Outcome, Reason, bool)> = Vec::new();
        for (i, claim) in claims.into_iter().enumerate() {
            match claim {
                Claim::Claimed { claims } if claims > ctx.config.delivery.max_claims => {
                    // A request of it may have been taken once its body is written.
                    let written: bool = conn.hexists(keys.delivery(p, ids[i]), BODY_FIELD).await?;
                    decisions.push((i, fails(written), Reason::TooManyAttempts, false));
                }
                Claim::Claimed { .. } => live.push(i),
                Claim::Held => {}
                Claim::Done(_) => ack.push(wellformed[i].entry.clone()),
                Claim::Gone => decisions.push((i, Outcome::Failed, Reason::RecordLost, true)),
            }
        }
        if !ack.is_empty() {
            let stream = keys.lane_stream(p, Lane::App);
            let _: () = redis::cmd("XACK").arg(stream).arg(group).arg(&ack).query_async(conn).await?;
        }
        // A transactional event: what its record keeps of the request (no subscription
        // applies to a receipt, and it has no address of its own); an event ingested by
        // an earlier version reads its email's record.
        let (transactional, live): (Vec<usize>, Vec<usize>) =
            live.into_iter().partition(|&i| wellformed[i].delivery.campaign == TRANSACTIONAL);
        let mut send = Vec::new();
        let mut pipe = redis::pipe();
        for &i in &transactional {
            let d = &wellformed[i].delivery;
            pipe.hget(keys.delivery(p, &d.id()), "request");
            pipe.hget(keys.delivery(p, &d.clone().on(Channel::Email).id()), "request");
        }
        let requests: Vec<(Option<String>, Option<String>)> =
            if transactional.is_empty() { Vec::new() } else { pipe.query_async(conn).await? };
        let requests = requests.into_iter().map(|(own, email)| own.or(email));
        for (&i, request) in transactional.iter().zip(requests) {
            match request.and_then(|r| serde_json::from_str::<crate::ingest::Request>(&r).ok()) {
                Some(r) => {
                    let mut names: Vec<String> = r.data.iter().flat_map(|m| m.keys().cloned()).collect();
                    names.sort();
                    send.push((i, r.template.unwrap_or_default(), names));
                }
                None => decisions.push((i, Outcome::Failed, Reason::RecordLost, false)),
            }
        }
        // Still wanted? The subscriber's record, with this channel's opt-out; and whether a
        // request of the event may have left already (its body is written).
        let mut pipe = redis::pipe();
        for &i in &live {
            let d = &wellformed[i].delivery;
            pipe.cmd("HMGET")
                .arg(keys.subscriber(p, &d.subscriber))
                .arg(&subscribers::RESOLVE_FIELDS)
                .arg(subscribers::field::channel_opted_out(&d.campaign, Channel::App));
            pipe.hexists(keys.delivery(p, &d.id()), BODY_FIELD);
        }
        let rows: Vec<(subscribers::Row, bool)> =
            if live.is_empty() { Vec::new() } else { pipe.query_async(conn).await? };
        for (&i, (row, written)) in live.iter().zip(rows) {
            let d = &wellformed[i].delivery;
            let Some(campaign) = ctx.config.campaign(&d.campaign) else {
                decisions.push((i, Outcome::Failed, Reason::UnknownCampaign, false));
                continue;
            };
            match subscribers::resolve(row) {
                Resolved::Send { data, .. } => {
                    let mut names: Vec<String> =
                        data.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
                    names.sort();
                    send.push((i, campaign.template.clone(), names));
                }
                Resolved::Skip(reason) => decisions.push((i, unwanted_outcome(written), reason, false)),
                Resolved::Fail(reason) => decisions.push((i, Outcome::Failed, reason, false)),
            }
        }
        if !decisions.is_empty() {
            let list: Vec<Decision<'_>> = decisions
                .iter()
                .map(|(i, outcome, reason, lost)| Decision {
                    entry: &wellformed[*i].entry,
                    delivery: &wellformed[*i].delivery,
                    outcome: *outcome,
                    reason: reason.clone(),
                    lost: *lost,
                })
                .collect();
            self.decide(conn, p, &list).await?;
        }
        // The body is fixed before the first request: a retry, by anyone, sends the same.
        let items: Vec<(&DeliveryRef, String)> = send
            .iter()
            .map(|(i, template, names)| {
                let d = &wellformed[*i].delivery;
                (d, event_body(d, template, names))
            })
            .collect();
        let bodies = fix_bodies(conn, &ctx.store, p, &items).await?;
        let mut claimed: Vec<Option<Claimed>> = wellformed.into_iter().map(Some).collect();
        for ((i, _, _), body) in send.iter().zip(bodies) {
            let item = claimed[*i].take().expect("each delivery once");
            let Some(body) = body else { continue };
            // A slot was taken for each entry read: one is there.
            let Some(permit) = permits.pop() else { break };
            let this = self.clone();
            tokio::spawn(async move {
                let _permit = permit;
                if let Err(e) = this.send(p, item, body).await {
                    this.ctx.metrics.redis_error("app_settle", &e);
                }
            });
        }
        Ok(())
    }

    /// One request, then its delivery settled or put off.
    async fn send(&self, p: u16, item: Claimed, body: String) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        let id = item.delivery.id();
        let timestamp = chrono::Utc::now().timestamp();
        let mut request = self.http.post(&self.config.url).header("content-type", "application/json");
        for (name, value) in signed_headers(&self.key, &id, timestamp, body.as_bytes()) {
            request = request.header(name, value);
        }
        let status = match request.body(body).send().await {
            Ok(response) => Some(response.status().as_u16()),
            Err(_) => None,
        };
        ctx.metrics.app_request(status);
        let mut conn = ctx.store.conn().await?;
        if status.is_none() {
            // No answer: the application may have taken it. Marked before it is put off, so
            // an outcome given later does not say it was never sent.
            scripts::note(&mut conn, MAYBE_TAKEN_FIELD, &[(ctx.store.keys.delivery(p, &id), "1")]).await?;
        }
        let decide =
            |outcome, reason| Decision { entry: &item.entry, delivery: &item.delivery, outcome, reason, lost: false };
        match answered(status) {
            Answered::Taken => self.decide(&mut conn, p, &[decide(Outcome::Sent, Reason::Accepted)]).await,
            Answered::Gone => self.decide(&mut conn, p, &[decide(Outcome::Failed, Reason::AppGone)]).await,
            Answered::Again => {
                let d = &ctx.config.delivery;
                let backoff = Backoff {
                    base_ms: d.retry_base_ms,
                    max_ms: d.retry_max_ms,
                    deadline_ms: d.deadline().as_millis() as u64,
                    jitter_percent: rand::random_range(0..=20),
                };
                let group = &ctx.config.redis.group;
                let items = [(item.entry.as_str(), &item.delivery)];
                let deferred =
                    scripts::defer(&mut conn, &ctx.store.keys, p, group, &ctx.owner, backoff, &items).await?;
                match deferred.first() {
                    Some(Deferred::Expired) => {
                        // After a lost answer, the application may have taken it.
                        let key = ctx.store.keys.delivery(p, &id);
                        let maybe: bool = conn.hexists(&key, MAYBE_TAKEN_FIELD).await?;
                        self.decide(&mut conn, p, &[decide(fails(maybe), Reason::AppUnavailable)]).await
                    }
                    Some(Deferred::For(ms)) => {
                        tracing::debug!(partition = p, status, delay_ms = ms, "application event put off");
                        Ok(())
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// Settles what will not be (or was) sent, and counts it.
    async fn decide(&self, conn: &mut Conn, p: u16, decisions: &[Decision<'_>]) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        let (group, retention) = (&ctx.config.redis.group, ctx.config.retention().as_secs());
        let decided = scripts::decide(conn, &ctx.store.keys, p, group, &ctx.owner, decisions, retention).await?;
        for (d, _) in decisions.iter().zip(decided).filter(|(_, now)| *now) {
            let reason = (d.outcome != Outcome::Sent).then_some(&d.reason);
            ctx.metrics.settled(&d.delivery.campaign, Channel::App, d.outcome, reason, 1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_the_channel_promises() {
        assert_eq!(answered(Some(200)), Answered::Taken);
        assert_eq!(answered(Some(204)), Answered::Taken);
        assert_eq!(answered(Some(410)), Answered::Gone);
        for again in [Some(429), Some(500), Some(503), Some(400), Some(401), Some(404), None] {
            assert_eq!(answered(again), Answered::Again, "{again:?}");
        }
    }

    #[test]
    fn the_event_carries_ids_and_field_names_only() {
        let d = DeliveryRef::new("weekly_digest", "2026-W49", "u1", "team-1").on(Channel::App);
        let body = event_body(&d, "weekly_digest", &["plan".into(), "usage".into()]);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["data"]["delivery"], "weekly_digest:2026-W49:u1:team-1:app");
        assert_eq!(v["data"]["data_keys"], serde_json::json!(["plan", "usage"]));
        assert!(!body.contains('@'), "{body}");
    }
}
