//! Resolving a claimed delivery at send time, and rendering it: a campaign delivery
//! from its subscriber record ([`subscribers::resolve`]: address, entitled,
//! subscribed, not suppressed) and, for a campaign with a render hook, the
//! application's answer; a transactional one from the request its record keeps. Each
//! comes out ready (the email object exactly as it will be sealed), decided (skipped or
//! failed, and why) or put off (its hook gave no answer). `mailstream preview` reads
//! the same way and writes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::audience::ingest;
use crate::audience::render::{self, RenderInput, Renderer};
use crate::audience::render_hook::{self, Answer, Hooks};
use crate::audience::subscribers::{self, Resolved, field};
use crate::audience::tokens::{self, Tokens};
use crate::config::Config;
use crate::model::outcome::{Outcome, Reason};
use crate::model::work::{Audience, DeliveryRef, TRANSACTIONAL};
use crate::send::ctx::Ctx;
use crate::store::Store;
use crate::store::records::{self, SubscriberRead};

/// The one row a read of one record returns.
fn one<T>(rows: Vec<T>) -> T {
    rows.into_iter().next().expect("one row per read")
}

/// The email object `delivery` is sent as, exactly as it will be sealed: the
/// campaign's template (or its variant's parts) over the subscriber's data, with
/// the unsubscribe headers.
pub(super) fn compose(
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
    let read =
        SubscriberRead { partition: p, id: &delivery.subscriber, opted_out: field::opted_out(&delivery.campaign) };
    let row = one(records::subscriber_rows(&mut conn, &store.keys, &[read]).await?);
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
pub(super) enum Fate {
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

/// What resolves and renders claimed deliveries: the templates, the signer of the
/// unsubscribe links and the render hooks' client.
pub(crate) struct Resolver {
    ctx: Arc<Ctx>,
    renderer: Renderer,
    /// Signs the one-click unsubscribe links each email carries.
    tokens: Tokens,
    /// Asks campaigns' render hooks.
    hooks: Hooks,
}

impl Resolver {
    pub(crate) fn new(ctx: Arc<Ctx>, renderer: Renderer) -> anyhow::Result<Resolver> {
        let tokens = Tokens::new(&ctx.config.unsubscribe.secrets);
        let hooks = Hooks::new(ctx.config.render_hook.secret.clone())?;
        Ok(Resolver { ctx, renderer, tokens, hooks })
    }

    /// Campaign deliveries: the subscriber record first (one pipelined read), then,
    /// for a campaign with a render hook, the application's answer.
    pub(super) async fn campaign_fates(
        &self,
        p: u16,
        conn: &mut crate::store::conn::Conn,
        live: &[(&str, &DeliveryRef)],
    ) -> anyhow::Result<Vec<Fate>> {
        let config = &self.ctx.config;
        let keys = &self.ctx.store.keys;
        let reads: Vec<SubscriberRead<'_>> = live
            .iter()
            .map(|(_, d)| SubscriberRead { partition: p, id: &d.subscriber, opted_out: field::opted_out(&d.campaign) })
            .collect();
        let rows = records::subscriber_rows(conn, keys, &reads).await?;
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
    pub(super) async fn transactional_fates(
        &self,
        p: u16,
        conn: &mut crate::store::conn::Conn,
        live: &[(&str, &DeliveryRef)],
    ) -> anyhow::Result<Vec<Fate>> {
        let (config, keys) = (&self.ctx.config, &self.ctx.store.keys);
        let ids: Vec<String> = live.iter().map(|(_, d)| d.id()).collect();
        let requests = records::stored_requests(conn, keys, p, &ids).await?;
        // Files kept apart from the request, spliced into the email as it is sealed.
        let files = records::deliveries_field(conn, keys, p, &ids, "attachments").await?;
        let mut fates = Vec::with_capacity(live.len());
        for (((_, d), request), files) in live.iter().zip(requests).zip(files) {
            let Some(request) = request.as_deref().and_then(ingest::Request::from_stored) else {
                fates.push(Fate::Decide(Outcome::Failed, Reason::RecordLost));
                continue;
            };
            let (to, data) = match (&request.to, &request.subscriber) {
                (Some(to), _) => (to.clone(), merged(serde_json::Value::Null, request.data.as_ref())),
                (None, Some(id)) => {
                    let (partition, opted_out) = (keys.partition_of(id), field::opted_out(TRANSACTIONAL));
                    let read = SubscriberRead { partition, id, opted_out };
                    let row = one(records::subscriber_rows(conn, keys, &[read]).await?);
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
            let suppressed = records::is_suppressed(conn, keys, p, &to).await?;
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
                        render::ReadyContent { subject, html: request.html.as_deref(), text: request.text.as_deref() };
                    Ok(Renderer::ready(from, &to, content, d))
                }
                (None, None) => Err(Reason::RenderError),
            };
            let json = json.map(|json| match &files {
                Some(files) => crate::model::work::with_attachments(&json, files),
                None => json,
            });
            let audience = request.template.as_ref().and_then(|t| config.templates.get(t)).map(|t| t.audience);
            fates.push(match json {
                Ok(json) => Fate::Ready { json, variant: None, audience: audience.unwrap_or_default() },
                Err(reason) => Fate::Decide(Outcome::Failed, reason),
            });
        }
        Ok(fates)
    }
}
