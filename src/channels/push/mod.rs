//! The Web Push channel: each of its deliveries is one notification (`[templates.NAME.push]`
//! title, body and url, rendered with the subscriber's data) sent to each of the
//! subscriber's browsers through its push service (RFC 8030), encrypted for that browser
//! (RFC 8291) and signed for by the sender (VAPID, RFC 8292). Its readers (`channels/mod.rs`)
//! read the channel's own stream (`stream:push`) and put deliveries off into
//! `due:push`: a push service that is down holds no email.
//!
//! Exactly once in effect, as far as the platform allows:
//! - the payload (with its `tag`) is fixed in the record before the first request, and
//!   every request of the delivery carries the same `Topic` (a hash of the delivery id):
//!   a push service replaces a message it still holds with a newer one of the same topic,
//!   and a browser replaces a shown notification with one of the same tag;
//! - a subscription that answered 201 is marked in the record (`push_sent:<id>`) as its
//!   answer arrives, and the replicas have the mark, before anything else of the delivery
//!   is written: it is not sent to again, even when the sender is killed before the other
//!   browsers answer or a failover loses the settlement (the protocol model's
//!   `no_browser_posted_again_after_its_201`);
//! - no Redis connection is held while a push service takes its time, so a slow one
//!   holds no email whatever `redis.pool_size` is;
//! - 404/410 removes the subscription; with none left and nothing sent, the delivery is
//!   skipped `no_subscription` (`outcome_unknown` if a request of it went unanswered: a
//!   browser may have it). 413 fails it (`push_too_large`); 429 puts it off for at least
//!   its `Retry-After`; 5xx and no answer put it off until the delivery deadline.

mod resolver;

use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use crate::audience::render::Renderer;
use crate::audience::subscribers::push::{self as subscriptions, Subscription};
use crate::channels::{self, ChannelSender, Slots};
use crate::config::PushChannelConfig;
use crate::model::outcome::{Outcome, Reason};
use crate::model::push_endpoint::{AllowedHosts, EndpointRefusal};
use crate::model::webpush::{self as crypto, VapidKey};
use crate::model::work::{Channel, DeliveryRef};
use crate::send::ctx::Ctx;
use crate::send::limiter::LocalPacer;
use crate::send::read::{self, Claimed};
use crate::store::records;
use crate::store::scripts::{self, Decision};
use resolver::CheckedResolver;

/// The record field holding the notification's payload, fixed before its first request.
pub const BODY_FIELD: &str = "push_body";
pub use crate::audience::subscribers::push::sent_field;

/// The record field an instance sets before its requests of the delivery leave, and
/// clears once it has recorded their answers: one left behind (a crash, a stall past the
/// lease) says requests whose fate nobody knows may have reached a browser.
pub fn inflight_field(owner: &str) -> String {
    format!("push_inflight:{owner}")
}

/// How long a VAPID token is made valid for (push services take up to 24 h); one is made
/// anew once less than an hour of it is left.
const VAPID_VALID_SECONDS: i64 = 12 * 3600;

/// The payload a browser's service worker gets: the notification and its `tag`.
pub fn payload(notification: &crate::audience::render::Notification, tag: &str) -> String {
    let mut v = serde_json::to_value(notification).expect("serializes");
    v["tag"] = tag.into();
    v.to_string()
}

/// What one subscription's answer means for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushAnswer {
    /// 2xx (201 Created): the push service has it.
    Sent,
    /// 404 or 410: the subscription is gone (the browser unsubscribed, or it expired).
    Gone,
    /// 413: the payload is too large for this push service.
    TooLarge,
    /// 429 or 5xx: asked again later, not before this long (ms; 0: the delivery's
    /// backoff).
    Again(u64),
    /// No answer (a timeout, a lost connection): it may have been taken; asked again later.
    Unanswered,
    /// Another 4xx (400, 401, 403: a request or a VAPID key it will not take), or a 3xx
    /// (a push service answers; it does not send the daemon elsewhere, and no redirect is
    /// followed): not asked again.
    Refused(u16),
    /// Not asked: its endpoint is not one to aim at (`push_endpoint`), checked before the
    /// request and again on the addresses its host resolves to.
    EndpointRefused(EndpointRefusal),
}

/// How a status (and its `Retry-After`, ms, capped: `channels::retry_after_ms`) is read
/// (`None`: no answer came).
pub fn answered(status: Option<u16>, retry_after_ms: Option<u64>) -> PushAnswer {
    match status {
        Some(200..=299) => PushAnswer::Sent,
        Some(404 | 410) => PushAnswer::Gone,
        Some(413) => PushAnswer::TooLarge,
        Some(429) => PushAnswer::Again(retry_after_ms.unwrap_or(0)),
        Some(300..=499) => PushAnswer::Refused(status.unwrap_or_default()),
        Some(_) => PushAnswer::Again(0),
        None => PushAnswer::Unanswered,
    }
}

/// Why a notification whose payload is `bytes` long is not sent: its size and the limit
/// of a push message (RFC 8291 §4), said as this daemon's refusal, not a push service's.
pub fn too_large(bytes: usize) -> String {
    format!(
        "push notification not sent (push_too_large): its payload is {bytes} bytes, {} encrypted, over the \
         {}-byte limit of a push message (at most {} bytes of payload); no request was made",
        crypto::encrypted_len(bytes),
        crypto::MAX_MESSAGE,
        crypto::MAX_PAYLOAD
    )
}

/// What a delivery comes to once every subscription asked has answered: `None` while one
/// is to be asked again.
pub fn settles(answers: &[PushAnswer], sent_before: usize) -> Option<(Outcome, Reason)> {
    if answers.iter().any(|a| matches!(a, PushAnswer::Again(_) | PushAnswer::Unanswered)) {
        return None;
    }
    let sent = sent_before + answers.iter().filter(|a| **a == PushAnswer::Sent).count();
    Some(if sent > 0 {
        (Outcome::Sent, Reason::Accepted)
    } else if answers.contains(&PushAnswer::TooLarge) {
        (Outcome::Failed, Reason::PushTooLarge)
    } else if answers.iter().any(|a| matches!(a, PushAnswer::Refused(_))) {
        (Outcome::Failed, Reason::PushRefused)
    } else if answers.iter().any(|a| matches!(a, PushAnswer::EndpointRefused(_))) {
        (Outcome::Skipped, Reason::PushEndpointRefused)
    } else {
        (Outcome::Skipped, Reason::NoSubscription)
    })
}

/// Each push service's pace (by origin), by the email limiter's departure rule kept in
/// this process: one request per `1/rate` and never more than `rate` in any sliding
/// second, so none bursts after an idle spell or in the first second.
struct Pace {
    per_second: u32,
    services: Mutex<HashMap<String, Arc<LocalPacer>>>,
}

impl Pace {
    fn new(per_second: u32) -> Pace {
        Pace { per_second, services: Mutex::default() }
    }

    /// Waits for `origin`'s next slot and takes it: the request leaves right away.
    async fn take(&self, origin: &str) {
        let service = {
            let mut services = self.services.lock().expect("pace");
            services
                .entry(origin.to_string())
                .or_insert_with(|| Arc::new(LocalPacer::new(self.per_second, Duration::ZERO)))
                .clone()
        };
        service.take_slot().await;
    }
}

/// A push service's VAPID header while it is valid: (header, valid until, unix s).
type Token = (String, i64);

/// The Web Push channel's sender: one per daemon, shared by its partition readers.
pub(crate) struct PushChannel {
    ctx: Arc<Ctx>,
    config: PushChannelConfig,
    vapid: VapidKey,
    renderer: Renderer,
    http: reqwest::Client,
    slots: Slots,
    /// The pace of each push service (by origin).
    pace: Pace,
    tokens: Mutex<HashMap<String, Token>>,
    /// The push services its subscriptions may name (`channels.push.allowed_hosts`).
    allowed: Arc<AllowedHosts>,
}

impl PushChannel {
    /// The channel, if the config sets `[channels.push]`.
    pub fn from_ctx(ctx: &Arc<Ctx>) -> anyhow::Result<Option<Arc<PushChannel>>> {
        let Some(config) = ctx.config.channels.push.clone() else { return Ok(None) };
        let key = config.vapid_private_key.as_ref().context("channels.push: no VAPID private key")?;
        let vapid =
            VapidKey::parse(key.expose()).context("channels.push: the VAPID key is not a base64url P-256 scalar")?;
        crate::resend::client::install_crypto_provider();
        let allowed = Arc::new(config.allowed());
        // An endpoint is untrusted: no redirect is followed (a 3xx is an answer), no proxy
        // from the environment stands between, and a host connects only to an address that
        // was checked, found by the one lookup of its request.
        let http = reqwest::Client::builder()
            .user_agent(concat!("mailstream/", env!("CARGO_PKG_VERSION")))
            .timeout(Duration::from_millis(config.timeout_ms))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(CheckedResolver::new(allowed.clone())))
            .build()?;
        let per_second = NonZeroU32::new(config.requests_per_second_per_service).context("a positive pace")?;
        let pace = Pace::new(per_second.get());
        Ok(Some(Arc::new(PushChannel {
            renderer: crate::audience::render::Renderer::of(&ctx.config).context("compiling templates")?,
            slots: Slots::new(ctx, config.concurrency),
            pace,
            tokens: Mutex::default(),
            allowed,
            ctx: ctx.clone(),
            config,
            vapid,
            http,
        })))
    }

    /// The VAPID header for a push service (`origin`): kept while more than an hour of
    /// it is left.
    fn authorization(&self, origin: &str) -> String {
        let now = chrono::Utc::now().timestamp();
        let mut tokens = self.tokens.lock().expect("tokens");
        if let Some((header, until)) = tokens.get(origin)
            && *until - now > 3600
        {
            return header.clone();
        }
        let until = now + VAPID_VALID_SECONDS;
        let header = self.vapid.authorization(origin, until, &self.config.subject);
        tokens.insert(origin.to_string(), (header.clone(), until));
        header
    }

    /// One request of `payload` to one subscription, paced per push service; none to an
    /// endpoint that is not one to aim at.
    async fn post(&self, s: &Subscription, topic: &str, payload: &[u8]) -> PushAnswer {
        if let Err(refusal) = s.admit(&self.allowed) {
            return PushAnswer::EndpointRefused(refusal);
        }
        let Ok(receiver) = s.receiver() else { return PushAnswer::Gone };
        let Ok(body) = crypto::encrypt(payload, &receiver) else { return PushAnswer::TooLarge };
        let origin = s.origin();
        self.pace.take(&origin).await;
        let request = self
            .http
            .post(&s.endpoint)
            .header("authorization", self.authorization(&origin))
            .header("ttl", self.config.ttl_seconds)
            .header("urgency", self.config.urgency.as_str())
            .header("topic", topic)
            .header("content-encoding", "aes128gcm")
            .header("content-type", "application/octet-stream")
            .body(body);
        let (status, retry_after) = match request.send().await {
            Ok(r) => (Some(r.status().as_u16()), channels::retry_after_ms(r.headers())),
            // Its host resolved to forbidden addresses only: nothing was sent.
            Err(e) if resolver::refused_by_resolver(&e) => {
                return PushAnswer::EndpointRefused(EndpointRefusal::AddressForbidden);
            }
            Err(_) => (None, None),
        };
        self.ctx.metrics.push_request(status);
        answered(status, retry_after)
    }
}

impl ChannelSender for PushChannel {
    const CHANNEL: Channel = Channel::Push;
    const BODY_FIELD: &'static str = BODY_FIELD;
    const MAYBE_TAKEN_FIELD: &'static str = "push_maybe_taken";
    const UNAVAILABLE: Reason = Reason::PushUnavailable;
    const OPS: (&'static str, &'static str) = ("push_read", "push_settle");

    fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    fn slots(&self) -> &Slots {
        &self.slots
    }

    fn body(&self, d: &DeliveryRef, template: &str, data: &serde_json::Value) -> Result<String, Reason> {
        let notification = self.renderer.render_push(template, d, data).map_err(|_| Reason::RenderError)?;
        let payload = payload(&notification, &crypto::topic(&d.id()));
        if payload.len() > crypto::MAX_PAYLOAD {
            tracing::warn!(
                campaign = %d.campaign,
                template,
                message_bytes = crypto::encrypted_len(payload.len()),
                limit_bytes = crypto::MAX_MESSAGE,
                "{}",
                too_large(payload.len())
            );
            return Err(Reason::PushTooLarge);
        }
        Ok(payload)
    }

    /// One request to each subscription not sent to yet, each answer recorded as it
    /// arrives, then the delivery settled or put off. No Redis connection is held while a
    /// push service takes its time: each is taken for a write and given back.
    async fn send(self: Arc<Self>, p: u16, item: Claimed, body: String) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        let keys = &ctx.store.keys;
        let d = &item.delivery;
        let record = keys.delivery(p, &d.id());
        let mine = inflight_field(&ctx.owner);
        let (all, fields) = {
            let mut conn = ctx.store.conn().await?;
            // Still ours, just before the requests leave (and for another lease): a holder
            // that stalled since its claim must not post what another may have sent since.
            let lease = crate::model::ms(ctx.config.lease());
            let (held, _) = scripts::renew(&mut conn, keys, p, &ctx.owner, lease, &[d], &[]).await?;
            if held == 0 {
                tracing::info!(
                    partition = p,
                    "a push delivery's lease ran out before its requests: left to its holder"
                );
                return Ok(());
            }
            scripts::note(&mut conn, &mine, &[(record.clone(), "1")]).await?;
            ctx.store.durable(&mut conn, &record).await?;
            // The browsers, and what the record already says of them, in one round trip.
            records::push_subscriptions_and_marks(&mut conn, keys, p, &d.subscriber, &record).await?
        };
        let sent_before: BTreeSet<String> =
            fields.iter().filter_map(|f| f.strip_prefix("push_sent:")).map(str::to_string).collect();
        let asked: Vec<(String, Subscription)> =
            subscriptions::read(all).into_iter().filter(|(sid, _)| !sent_before.contains(sid)).collect();
        let topic = crypto::topic(&d.id());
        let mut requests = tokio::task::JoinSet::new();
        for (i, (sid, s)) in asked.iter().enumerate() {
            let (this, sid, s, topic, body) = (self.clone(), sid.clone(), s.clone(), topic.clone(), body.clone());
            let (record, subscriber) = (record.clone(), d.subscriber.clone());
            requests.spawn(async move {
                let answer = this.post(&s, &topic, body.as_bytes()).await;
                (i, answer, this.record(p, &record, &subscriber, &sid, answer).await)
            });
        }
        let mut answers = vec![PushAnswer::Unanswered; asked.len()];
        while let Some(done) = requests.join_next().await {
            let (i, a, recorded) = done.context("a push request's task")?;
            answers[i] = a;
            recorded?;
        }
        let mut conn = ctx.store.conn().await?;
        // Every answer is recorded: this instance's requests are no longer in doubt.
        records::clear_mark(&mut conn, &record, &mine).await?;
        // The marks survive a failover before anything is settled or put off: a settlement
        // lost with a failover is claimed again, and then skips every browser marked.
        ctx.store.durable(&mut conn, &record).await?;
        let sent = sent_before.len() + answers.iter().filter(|a| **a == PushAnswer::Sent).count();
        // A request that went unanswered, now or before, or one of an instance that never
        // recorded its answers, may have reached a browser.
        let maybe_taken = answers.contains(&PushAnswer::Unanswered)
            || fields.iter().any(|f| f == "push_maybe_taken" || (f.starts_with("push_inflight:") && *f != mine));
        let decision = |(outcome, reason)| Decision { entry: &item.entry, delivery: d, outcome, reason, lost: false };
        match settles(&answers, sent_before.len()) {
            Some((Outcome::Skipped | Outcome::Failed, reason)) if maybe_taken => {
                read::decide(self.ctx(), &mut conn, p, &[decision((Outcome::OutcomeUnknown, reason))]).await
            }
            Some(settled) => read::decide(self.ctx(), &mut conn, p, &[decision(settled)]).await,
            None => {
                let wait = answers.iter().map(|a| if let PushAnswer::Again(ms) = a { *ms } else { 0 }).max();
                // Past the deadline, a delivery a browser has is sent; else it failed.
                let reached = (sent > 0).then_some((Outcome::Sent, Reason::Accepted));
                channels::put_off(&*self, &mut conn, p, &item, wait.unwrap_or(0), reached).await
            }
        }
    }
}

impl PushChannel {
    /// Writes what one subscription answered as soon as it arrives (and waits until the
    /// replicas have it), so a crash repeats only requests never answered: a 201 marks
    /// the record, a 404/410 removes the subscription, no answer says the delivery may
    /// have been taken. The connection is taken for these writes only.
    async fn record(
        &self,
        p: u16,
        record: &str,
        subscriber: &str,
        sid: &str,
        answer: PushAnswer,
    ) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        match answer {
            PushAnswer::Sent => {
                let mut conn = ctx.store.conn().await?;
                scripts::note(&mut conn, &sent_field(sid), &[(record.to_string(), "1")]).await?;
                ctx.store.durable(&mut conn, record).await?;
            }
            PushAnswer::Gone => {
                let mut conn = ctx.store.conn().await?;
                if subscriptions::remove(&mut conn, &ctx.store.keys, p, subscriber, sid).await? {
                    ctx.metrics.push_subscription_removed();
                    tracing::info!(partition = p, subscription = %sid, "push subscription gone: removed");
                }
                ctx.store.durable(&mut conn, record).await?;
            }
            PushAnswer::Unanswered => {
                let mut conn = ctx.store.conn().await?;
                scripts::note(&mut conn, <Self as ChannelSender>::MAYBE_TAKEN_FIELD, &[(record.to_string(), "1")])
                    .await?;
            }
            PushAnswer::EndpointRefused(reason) => {
                ctx.metrics.push_endpoint_refused(reason);
                tracing::warn!(
                    partition = p,
                    subscription = %sid,
                    reason = reason.as_str(),
                    "push subscription's endpoint refused: not sent to"
                );
            }
            PushAnswer::TooLarge => {
                tracing::warn!(
                    partition = p,
                    subscription = %sid,
                    limit_bytes = crypto::MAX_PAYLOAD,
                    "a push service refused the notification as too large (413)"
                );
            }
            PushAnswer::Again(_) | PushAnswer::Refused(_) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_the_channel_promises() {
        assert_eq!(answered(Some(201), None), PushAnswer::Sent);
        assert_eq!(answered(Some(404), None), PushAnswer::Gone);
        assert_eq!(answered(Some(410), None), PushAnswer::Gone);
        assert_eq!(answered(Some(413), None), PushAnswer::TooLarge);
        assert_eq!(answered(Some(429), Some(7000)), PushAnswer::Again(7000));
        assert_eq!(answered(Some(429), None), PushAnswer::Again(0));
        assert_eq!(answered(Some(503), Some(7000)), PushAnswer::Again(0));
        assert_eq!(answered(None, None), PushAnswer::Unanswered);
        assert_eq!(answered(Some(403), None), PushAnswer::Refused(403));
        // A redirect is an answer, not followed.
        assert_eq!(answered(Some(302), None), PushAnswer::Refused(302));
        assert_eq!(answered(Some(308), None), PushAnswer::Refused(308));
    }

    #[test]
    fn a_delivery_settles_once_every_browser_has_answered() {
        use PushAnswer::*;
        assert_eq!(settles(&[Sent, Gone], 0), Some((Outcome::Sent, Reason::Accepted)));
        assert_eq!(settles(&[Gone, Gone], 0), Some((Outcome::Skipped, Reason::NoSubscription)));
        assert_eq!(settles(&[], 0), Some((Outcome::Skipped, Reason::NoSubscription)));
        assert_eq!(settles(&[], 1), Some((Outcome::Sent, Reason::Accepted)));
        assert_eq!(settles(&[Gone], 1), Some((Outcome::Sent, Reason::Accepted)));
        assert_eq!(settles(&[TooLarge, Gone], 0), Some((Outcome::Failed, Reason::PushTooLarge)));
        assert_eq!(settles(&[Refused(403)], 0), Some((Outcome::Failed, Reason::PushRefused)));
        assert_eq!(settles(&[Sent, Again(0)], 0), None);
        assert_eq!(settles(&[Gone, Unanswered], 0), None);
        let refused = EndpointRefused(EndpointRefusal::AddressForbidden);
        assert_eq!(settles(&[refused, Gone], 0), Some((Outcome::Skipped, Reason::PushEndpointRefused)));
        assert_eq!(settles(&[refused, Sent], 0), Some((Outcome::Sent, Reason::Accepted)));
        assert_eq!(settles(&[refused, Refused(403)], 0), Some((Outcome::Failed, Reason::PushRefused)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_push_service_gets_its_rate_from_the_first_second_on_with_no_burst() {
        let pace = Pace::new(100);
        let start = tokio::time::Instant::now();
        let mut first_second = 0;
        for _ in 0..300 {
            pace.take("https://fcm.googleapis.com").await;
            if start.elapsed() < Duration::from_secs(1) {
                first_second += 1;
            }
        }
        assert_eq!(first_second, 100, "the first second holds the rate, not twice it");
        // Another push service has its own pace.
        let other = tokio::time::Instant::now();
        pace.take("https://updates.push.services.mozilla.com").await;
        assert_eq!(other.elapsed(), Duration::ZERO);
    }

    #[test]
    fn too_large_says_the_size_and_the_limit_as_our_refusal() {
        let said = too_large(4000);
        assert!(said.contains("4000 bytes") && said.contains("4103 encrypted"), "{said}");
        assert!(said.contains("4096-byte limit") && said.contains("3993 bytes"), "{said}");
        assert!(said.contains("no request was made"), "{said}");
    }

    #[test]
    fn the_payload_carries_the_notification_and_its_tag() {
        let n = crate::audience::render::Notification { title: "Your week".into(), body: "3 new".into(), url: None };
        let p: serde_json::Value = serde_json::from_str(&payload(&n, "abc")).unwrap();
        assert_eq!(p, serde_json::json!({"title": "Your week", "body": "3 new", "tag": "abc"}));
    }
}
