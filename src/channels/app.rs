//! The application channel: each of its deliveries is one signed POST of the delivery's
//! event to the application (`[channels.app] url`), the Standard Webhooks way: the
//! `webhook-id` is the delivery id, so the application takes each event once however
//! often it comes. Its readers (`channels/mod.rs`) read the channel's own stream
//! (`stream:app`) and put events off into `due:app`: an application that is down holds
//! no email, and an email outage holds no event.
//!
//! The event carries ids only (campaign, period, subscriber id, target, channel, the
//! template and the names of its data fields), never an address. Its body is written
//! into the delivery's record before the first request (`app_body`, first writer wins),
//! so every retry sends the same id and body.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::channels::{self, ChannelSender, Slots};
use crate::config::AppChannelConfig;
use crate::model::outcome::{Outcome, Reason};
use crate::model::svix::SigningKey;
use crate::model::work::{Channel, DeliveryRef};
use crate::send::ctx::Ctx;
use crate::send::read::{self, Claimed};
use crate::store::scripts::Decision;

/// The record field holding the event's body, fixed before its first request.
pub const BODY_FIELD: &str = "app_body";

/// What one request's answer means for its delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppAnswer {
    /// 2xx: settled `sent`.
    Taken,
    /// 410: settled `failed`, not asked again.
    Gone,
    /// Anything else (429, 5xx, another 4xx, a timeout, no connection): asked again later
    /// with the same id and body, until the delivery deadline; after a 429, not before its
    /// `Retry-After` (ms, capped: `channels::retry_after_ms`; 0: the delivery's backoff).
    Again(u64),
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

/// How a status (and its `Retry-After`, ms) is read (`None`: no answer came).
pub fn answered(status: Option<u16>, retry_after_ms: Option<u64>) -> AppAnswer {
    match status {
        Some(200..=299) => AppAnswer::Taken,
        Some(410) => AppAnswer::Gone,
        Some(429) => AppAnswer::Again(retry_after_ms.unwrap_or(0)),
        _ => AppAnswer::Again(0),
    }
}

/// The application channel's sender: one per daemon, shared by its partition readers.
pub(crate) struct AppChannel {
    ctx: Arc<Ctx>,
    config: AppChannelConfig,
    key: SigningKey,
    http: reqwest::Client,
    slots: Slots,
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
        let slots = Slots::new(ctx, config.concurrency);
        Ok(Some(Arc::new(AppChannel { ctx: ctx.clone(), config, key, http, slots })))
    }
}

impl ChannelSender for AppChannel {
    const CHANNEL: Channel = Channel::App;
    const BODY_FIELD: &'static str = BODY_FIELD;
    const MAYBE_TAKEN_FIELD: &'static str = "app_maybe_taken";
    const UNAVAILABLE: Reason = Reason::AppUnavailable;
    const OPS: (&'static str, &'static str) = ("app_read", "app_settle");

    fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    fn slots(&self) -> &Slots {
        &self.slots
    }

    fn body(&self, d: &DeliveryRef, template: &str, data: &serde_json::Value) -> Result<String, Reason> {
        let mut names: Vec<String> = data.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
        names.sort();
        Ok(event_body(d, template, &names))
    }

    /// One request, then its delivery settled or put off.
    async fn send(self: Arc<Self>, p: u16, item: Claimed, body: String) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        let id = item.delivery.id();
        let timestamp = chrono::Utc::now().timestamp();
        let mut request = self.http.post(&self.config.url).header("content-type", "application/json");
        for (name, value) in signed_headers(&self.key, &id, timestamp, body.as_bytes()) {
            request = request.header(name, value);
        }
        let (status, retry_after) = match request.body(body).send().await {
            Ok(response) => (Some(response.status().as_u16()), channels::retry_after_ms(response.headers())),
            Err(_) => (None, None),
        };
        ctx.metrics.app_request(status);
        let mut conn = ctx.store.conn().await?;
        if status.is_none() {
            channels::maybe_taken(&*self, &mut conn, p, &item).await?;
        }
        let decide =
            |outcome, reason| Decision { entry: &item.entry, delivery: &item.delivery, outcome, reason, lost: false };
        match answered(status, retry_after) {
            AppAnswer::Taken => {
                read::decide(self.ctx(), &mut conn, p, &[decide(Outcome::Sent, Reason::Accepted)]).await
            }
            AppAnswer::Gone => {
                read::decide(self.ctx(), &mut conn, p, &[decide(Outcome::Failed, Reason::AppGone)]).await
            }
            AppAnswer::Again(at_least_ms) => channels::put_off(&*self, &mut conn, p, &item, at_least_ms, None).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_the_channel_promises() {
        assert_eq!(answered(Some(200), None), AppAnswer::Taken);
        assert_eq!(answered(Some(204), None), AppAnswer::Taken);
        assert_eq!(answered(Some(410), None), AppAnswer::Gone);
        for again in [Some(429), Some(500), Some(503), Some(400), Some(401), Some(404), None] {
            assert_eq!(answered(again, None), AppAnswer::Again(0), "{again:?}");
        }
        // A 429's Retry-After is a floor; another status's is not read.
        assert_eq!(answered(Some(429), Some(4000)), AppAnswer::Again(4000));
        assert_eq!(answered(Some(503), Some(4000)), AppAnswer::Again(0));
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
