//! The consumer: one reader per partition and lane joins the consumer group,
//! reads delivery ids, claims them (claim.lua), resolves each at send time
//! ([`subscribers::resolve`]; for a campaign with a render hook, the
//! application's answer too; for a transactional send, the request its record
//! keeps), renders it, and hands it to the batcher. What will not be sent is
//! decided here (decide.lua); what a render hook did not answer is put off
//! (defer.lua).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;

use crate::audience::ingest;
use crate::audience::render::{self, RenderInput, Renderer};
use crate::audience::render_hook::{self, Answer, Hooks};
use crate::audience::subscribers::{self, Resolved, field};
use crate::audience::tokens::{self, Tokens};
use crate::config::Config;
use crate::model::outcome::{Failpoint, Outcome, Reason};
use crate::model::work::{Audience, DeliveryRef, Lane, Ready, TRANSACTIONAL};
use crate::send::ctx::Ctx;
use crate::send::queue::Batcher;
use crate::send::release;
use crate::store::Store;
use crate::store::scripts::{self, Claim, Decision, Deferred};
use crate::store::streams::{self, Entry};

/// The email object `delivery` is sent as, exactly as it will be sealed: the
/// campaign's template (or its variant's parts) over the subscriber's data, with
/// the unsubscribe headers.
fn compose(
    config: &Config,
    renderer: &Renderer,
    tokens: &Tokens,
    delivery: &DeliveryRef,
    email: &str,
    data: &serde_json::Value,
    variant: Option<&str>,
) -> Result<String, Reason> {
    let campaign = config.campaign(&delivery.campaign).ok_or(Reason::UnknownCampaign)?;
    let headers = tokens::headers(config, tokens, &delivery.subscriber, &delivery.campaign);
    let (target, subscriber_id) = (&delivery.target, &delivery.subscriber);
    let input = RenderInput { delivery, variant, target, subscriber_id, data, headers: &headers };
    let from = campaign.from.as_deref().unwrap_or(&config.resend.from);
    renderer.render(&campaign.template, from, email, &input).map_err(|e| {
        tracing::warn!(campaign = %delivery.campaign, error = %e.kind(), "template failed to render");
        Reason::RenderError
    })
}

/// The variant a subscriber gets: the hook's choice if it names one of the
/// campaign's variants, else the stable assignment; none without variants.
fn variant_of(config: &Config, delivery: &DeliveryRef, chosen: Option<&str>) -> Option<String> {
    let arms = config.campaign(&delivery.campaign)?.variants.active();
    match chosen.filter(|c| arms.iter().any(|a| a.name == *c)) {
        Some(c) => Some(c.to_string()),
        None => render::assign(&delivery.campaign, &delivery.subscriber, arms).map(str::to_string),
    }
}

/// What `mailstream preview` shows: the email a delivery would be sealed as now, or
/// why it would not be sent. Reads the subscriber as the consumer does; writes nothing.
/// (A campaign with a render hook is previewed from the registry, without asking it.)
pub async fn preview(store: &Store, config: &Config, delivery: &DeliveryRef) -> anyhow::Result<Result<String, Reason>> {
    let p = store.keys.partition_of(delivery.home());
    let mut conn = store.conn().await?;
    let row: subscribers::Row = redis::cmd("HMGET")
        .arg(store.keys.subscriber(p, &delivery.subscriber))
        .arg(&subscribers::RESOLVE_FIELDS)
        .arg(field::opted_out(&delivery.campaign))
        .query_async(&mut conn)
        .await?;
    let renderer = crate::audience::render::Renderer::of(config)?;
    let tokens = Tokens::new(&config.unsubscribe.secrets);
    let variant = variant_of(config, delivery, None);
    Ok(match subscribers::resolve(row) {
        Resolved::Send { email, data } => {
            compose(config, &renderer, &tokens, delivery, &email, &data, variant.as_deref())
        }
        Resolved::Skip(reason) | Resolved::Fail(reason) => Err(reason),
    })
}

/// What becomes of one claimed delivery.
enum Fate {
    Ready {
        json: String,
        variant: Option<String>,
        audience: Audience,
    },
    Decide(Outcome, Reason),
    /// Its render hook gave no answer for it: put off, asked again later.
    Defer,
}

/// Merges the hook's (or the request's) data over the registry's.
fn merged(base: serde_json::Value, over: Option<&serde_json::Map<String, serde_json::Value>>) -> serde_json::Value {
    let Some(over) = over else { return base };
    let mut map = match base {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    map.extend(over.iter().map(|(k, v)| (k.clone(), v.clone())));
    serde_json::Value::Object(map)
}

/// Reads, claims, resolves and renders; hands what is ready to the batcher.
pub(crate) struct Consumer {
    ctx: Arc<Ctx>,
    renderer: Renderer,
    batcher: Arc<Batcher>,
    /// Signs the one-click unsubscribe links each email carries.
    tokens: Tokens,
    /// Asks campaigns' render hooks.
    hooks: Hooks,
}

impl Consumer {
    pub fn new(ctx: Arc<Ctx>, renderer: Renderer, batcher: Arc<Batcher>) -> anyhow::Result<Consumer> {
        let tokens = Tokens::new(&ctx.config.unsubscribe.secrets);
        let hooks = Hooks::new(ctx.config.render_hook.secret.clone())?;
        Ok(Consumer { ctx, renderer, batcher, tokens, hooks })
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
            Lane::Digest => self.campaign_fates(p, conn, &live).await?,
            Lane::Transactional => self.transactional_fates(p, conn, &live).await?,
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

    /// Campaign deliveries: the subscriber record first (one pipelined read), then,
    /// for a campaign with a render hook, the application's answer.
    async fn campaign_fates(
        &self,
        p: u16,
        conn: &mut crate::store::conn::Conn,
        live: &[(&str, &DeliveryRef)],
    ) -> anyhow::Result<Vec<Fate>> {
        let config = &self.ctx.config;
        let keys = &self.ctx.store.keys;
        let mut pipe = redis::pipe();
        for (_, d) in live {
            let key = keys.subscriber(p, &d.subscriber);
            pipe.cmd("HMGET").arg(key).arg(&subscribers::RESOLVE_FIELDS).arg(field::opted_out(&d.campaign));
        }
        let rows: Vec<subscribers::Row> = if live.is_empty() { Vec::new() } else { pipe.query_async(conn).await? };
        let mut fates = Vec::with_capacity(live.len());
        // Per campaign with a hook: (position, registry data) of what to ask it about.
        let mut ask: BTreeMap<&str, Vec<(usize, serde_json::Value)>> = BTreeMap::new();
        for (i, ((_, d), row)) in live.iter().zip(rows).enumerate() {
            fates.push(match subscribers::resolve(row) {
                Resolved::Send { data, .. }
                    if config.campaign(&d.campaign).is_some_and(|c| c.render_hook.is_some()) =>
                {
                    ask.entry(d.campaign.as_str()).or_default().push((i, data));
                    Fate::Defer
                }
                Resolved::Send { email, data } => self.render(d, &email, &data, None),
                Resolved::Skip(reason) => Fate::Decide(Outcome::Skipped, reason),
                Resolved::Fail(reason) => Fate::Decide(Outcome::Failed, reason),
            });
        }
        for (campaign, items) in ask {
            let hook = config.campaign(campaign).and_then(|c| c.render_hook.as_ref()).expect("asked only with a hook");
            for chunk in items.chunks(render_hook::MAX_PER_REQUEST) {
                let asked: Vec<&DeliveryRef> = chunk.iter().map(|(i, _)| live[*i].1).collect();
                let answers = match self.hooks.ask(hook, &asked).await {
                    Ok(answers) => {
                        self.ctx.metrics.render_hook(campaign, "ok");
                        answers
                    }
                    Err(e) => {
                        self.ctx.metrics.render_hook(campaign, e.label());
                        tracing::warn!(campaign, deliveries = chunk.len(), error = %e, "render hook gave no answer; deliveries put off");
                        continue;
                    }
                };
                for (i, data) in chunk {
                    let d = live[*i].1;
                    fates[*i] = match answers.get(&d.id()) {
                        Some(Answer::Send { to, data: theirs, variant }) => {
                            let data = merged(data.clone(), theirs.as_ref());
                            self.render(d, to, &data, variant.as_deref())
                        }
                        Some(Answer::Skip(reason)) => Fate::Decide(Outcome::Skipped, reason.clone()),
                        None => Fate::Defer,
                    };
                }
            }
        }
        Ok(fates)
    }

    fn render(&self, d: &DeliveryRef, to: &str, data: &serde_json::Value, chosen: Option<&str>) -> Fate {
        let variant = variant_of(&self.ctx.config, d, chosen);
        match compose(&self.ctx.config, &self.renderer, &self.tokens, d, to, data, variant.as_deref()) {
            Ok(json) => Fate::Ready { json, variant, audience: Audience::Customers },
            Err(reason) => Fate::Decide(Outcome::Failed, reason),
        }
    }

    /// Transactional deliveries: the request their record keeps; the recipient is the
    /// address given inline or the subscriber's (not suppressed either way; no
    /// subscription applies to a receipt).
    async fn transactional_fates(
        &self,
        p: u16,
        conn: &mut crate::store::conn::Conn,
        live: &[(&str, &DeliveryRef)],
    ) -> anyhow::Result<Vec<Fate>> {
        let (config, keys) = (&self.ctx.config, &self.ctx.store.keys);
        let mut pipe = redis::pipe();
        for (_, d) in live {
            pipe.hget(keys.delivery(p, &d.id()), "request");
        }
        let requests: Vec<Option<String>> = if live.is_empty() { Vec::new() } else { pipe.query_async(conn).await? };
        let mut fates = Vec::with_capacity(live.len());
        for ((_, d), request) in live.iter().zip(requests) {
            let Some(request) = request.and_then(|r| serde_json::from_str::<ingest::Request>(&r).ok()) else {
                fates.push(Fate::Decide(Outcome::Failed, Reason::RecordLost));
                continue;
            };
            let (to, data) = match (&request.to, &request.subscriber) {
                (Some(to), _) => (to.clone(), merged(serde_json::Value::Null, request.data.as_ref())),
                (None, Some(id)) => {
                    let row: subscribers::Row = redis::cmd("HMGET")
                        .arg(keys.subscriber(keys.partition_of(id), id))
                        .arg(&subscribers::RESOLVE_FIELDS)
                        .arg(field::opted_out(TRANSACTIONAL))
                        .query_async(conn)
                        .await?;
                    match subscribers::resolve_transactional(row) {
                        Resolved::Send { email, data } => (email, merged(data, request.data.as_ref())),
                        Resolved::Skip(reason) => {
                            fates.push(Fate::Decide(Outcome::Skipped, reason));
                            continue;
                        }
                        Resolved::Fail(reason) => {
                            fates.push(Fate::Decide(Outcome::Failed, reason));
                            continue;
                        }
                    }
                }
                (None, None) => {
                    fates.push(Fate::Decide(Outcome::Failed, Reason::RecordLost));
                    continue;
                }
            };
            // Early, as the last gate will do it: the partition's suppressed addresses.
            let suppressed: bool = conn.hexists(keys.suppressed(p), keys.address(&to).hash).await?;
            if suppressed {
                fates.push(Fate::Decide(Outcome::Skipped, Reason::Suppressed));
                continue;
            }
            let from = &config.resend.from;
            let json = match (&request.template, &request.subject) {
                (Some(template), _) => {
                    let input = RenderInput {
                        delivery: d,
                        variant: None,
                        target: &d.target,
                        subscriber_id: &d.subscriber,
                        data: &data,
                        headers: &[],
                    };
                    self.renderer.render(template, from, &to, &input).map_err(|e| {
                        tracing::warn!(template = %template, error = %e.kind(), "transactional template failed to render");
                        Reason::RenderError
                    })
                }
                (None, Some(subject)) => {
                    let content =
                        render::Ready { subject, html: request.html.as_deref(), text: request.text.as_deref() };
                    Ok(Renderer::ready(from, &to, content, d))
                }
                (None, None) => Err(Reason::RenderError),
            };
            let audience = request.template.as_ref().and_then(|t| config.templates.get(t)).map(|t| t.audience);
            fates.push(match json {
                Ok(json) => Fate::Ready { json, variant: None, audience: audience.unwrap_or_default() },
                Err(reason) => Fate::Decide(Outcome::Failed, reason),
            });
        }
        Ok(fates)
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
