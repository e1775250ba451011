//! The render hook: an endpoint of the application that mailstream asks, at send
//! time, what each delivery of a campaign should be. A request carries up to 100
//! deliveries (ids only); the answer says per delivery either
//! `{"send": {"to": …, "data": {…}, "variant": …}}` or `{"skip": "not_entitled"}`.
//! Entitlement is checked here, at the moment of sending. A hook that is down,
//! slow or answers garbage delays deliveries (the consumer defers them); it never
//! fails them at once, and nothing is sent without its answer.
//!
//! Requests are signed: `mailstream-timestamp: <unix seconds>` and
//! `mailstream-signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`
//! (the README shows a ten-line check).

use std::collections::HashMap;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::config::{RenderHookConfig, Secret};
use crate::model::outcome::Reason;
use crate::model::work::DeliveryRef;

/// The most deliveries one hook request carries.
pub(crate) const MAX_PER_REQUEST: usize = 100;

/// What the hook said about one delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Send { to: String, data: Option<serde_json::Map<String, serde_json::Value>>, variant: Option<String> },
    Skip(Reason),
}

/// Why a whole request got no usable answer (nothing in it is decided).
#[derive(Debug)]
pub(crate) enum HookError {
    Unreachable(String),
    Status(u16),
    Garbage,
}

impl HookError {
    /// The bounded `result` label of `mailstream_render_hook_requests_total`.
    pub fn label(&self) -> &'static str {
        match self {
            HookError::Unreachable(_) => "unreachable",
            HookError::Status(_) => "status",
            HookError::Garbage => "garbage",
        }
    }
}

impl std::fmt::Display for HookError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HookError::Unreachable(e) => write!(f, "unreachable: {e}"),
            HookError::Status(s) => write!(f, "answered HTTP {s}"),
            HookError::Garbage => f.write_str("answered something that is not a hook answer"),
        }
    }
}

#[derive(Serialize)]
struct Asked<'a> {
    delivery: String,
    campaign: &'a str,
    period: &'a str,
    subscriber: &'a str,
    target: &'a str,
}

#[derive(Deserialize)]
struct Answers {
    deliveries: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendAnswer {
    to: String,
    #[serde(default)]
    data: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    variant: Option<String>,
}

/// Signs `body` sent at `timestamp` (unix seconds): the `mailstream-signature` value.
pub fn sign(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("v1={hex}")
}

/// A skip reason as the hook names it (by the names mailstream records); any other
/// name is kept bounded as `hook_skipped`.
fn skip_reason(s: &str) -> Reason {
    match Reason::parse(s) {
        r @ (Reason::NotEntitled
        | Reason::NoAddress
        | Reason::NothingToReport
        | Reason::Unsubscribed
        | Reason::Suppressed
        | Reason::UnknownSubscriber) => r,
        _ => Reason::HookSkipped,
    }
}

/// Reads one answered item: its delivery id and what to do, or `None` if it is not
/// a well-formed answer (such an item counts as unanswered).
fn read_item(item: &serde_json::Value) -> Option<(String, Answer)> {
    let id = item.get("delivery")?.as_str()?.to_string();
    match (item.get("send"), item.get("skip")) {
        (Some(send), None) => {
            let send: SendAnswer = serde_json::from_value(send.clone()).ok()?;
            if !crate::model::address::is_valid(&send.to) {
                return None;
            }
            Some((id, Answer::Send { to: send.to, data: send.data, variant: send.variant }))
        }
        (None, Some(skip)) => Some((id, Answer::Skip(skip_reason(skip.as_str()?)))),
        _ => None,
    }
}

/// Calls render hooks (one pooled client for all of them).
pub(crate) struct Hooks {
    http: reqwest::Client,
    secret: Option<Secret>,
}

impl Hooks {
    pub fn new(secret: Option<Secret>) -> anyhow::Result<Hooks> {
        crate::resend::client::install_crypto_provider();
        let http = reqwest::Client::builder().user_agent(concat!("mailstream/", env!("CARGO_PKG_VERSION"))).build()?;
        Ok(Hooks { http, secret })
    }

    /// Asks `hook` about `deliveries` (at most [`MAX_PER_REQUEST`]), retrying a failed
    /// request `hook.retries` times; the answers by delivery id. Items the hook left
    /// out or answered wrongly are simply absent.
    pub(crate) async fn ask(
        &self,
        hook: &RenderHookConfig,
        deliveries: &[&DeliveryRef],
    ) -> Result<HashMap<String, Answer>, HookError> {
        let asked: Vec<Asked<'_>> = deliveries
            .iter()
            .map(|d| Asked {
                delivery: d.id(),
                campaign: &d.campaign,
                period: &d.period,
                subscriber: &d.subscriber,
                target: &d.target,
            })
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({ "deliveries": asked })).expect("serializable");
        let mut last = HookError::Garbage;
        for attempt in 0..=hook.retries {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << attempt.min(5))).await;
            }
            match self.once(hook, &body).await {
                Ok(answers) => return Ok(answers),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn once(&self, hook: &RenderHookConfig, body: &[u8]) -> Result<HashMap<String, Answer>, HookError> {
        let timestamp = chrono::Utc::now().timestamp();
        let secret = self.secret.as_ref().map(|s| s.expose()).unwrap_or_default();
        let response = self
            .http
            .post(&hook.url)
            .timeout(Duration::from_millis(hook.timeout_ms))
            .header("content-type", "application/json")
            .header("mailstream-timestamp", timestamp.to_string())
            .header("mailstream-signature", sign(secret, timestamp, body))
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| {
                HookError::Unreachable(if e.is_timeout() { "timed out".into() } else { "no connection".into() })
            })?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            return Err(HookError::Status(status));
        }
        let bytes = response.bytes().await.map_err(|_| HookError::Unreachable("body cut off".into()))?;
        let answers: Answers = serde_json::from_slice(&bytes).map_err(|_| HookError::Garbage)?;
        Ok(answers.deliveries.iter().filter_map(read_item).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_signature_is_hmac_over_timestamp_dot_body() {
        // Python: hmac.new(b"secret-of-16-chars", b"1700000000.{}", hashlib.sha256).hexdigest()
        let s = sign("secret-of-16-chars", 1_700_000_000, b"{}");
        assert_eq!(s, "v1=0697daecccb07d8201dae7bfbcf2dcbe1110628b1c0574a7559644220763429d");
        assert!(s.starts_with("v1=") && s.len() == 3 + 64);
        assert_ne!(s, sign("secret-of-16-chars", 1_700_000_001, b"{}"));
    }

    #[test]
    fn items_are_read_strictly() {
        let id = "c:p:s:t";
        let send = read_item(&json!({"delivery": id, "send": {"to": "a@b.example", "data": {"n": 1}, "variant": "b"}}));
        assert!(matches!(send, Some((_, Answer::Send { ref variant, .. })) if variant.as_deref() == Some("b")));
        assert_eq!(
            read_item(&json!({"delivery": id, "skip": "not_entitled"})),
            Some((id.into(), Answer::Skip(Reason::NotEntitled)))
        );
        assert_eq!(
            read_item(&json!({"delivery": id, "skip": "whatever"})),
            Some((id.into(), Answer::Skip(Reason::HookSkipped)))
        );
        for bad in [
            json!({"delivery": id}),
            json!({"delivery": id, "send": {"to": "not an address"}}),
            json!({"delivery": id, "send": {"to": "a@b.example", "cc": "x"}}),
            json!({"delivery": id, "send": {"to": "a@b.example"}, "skip": "x"}),
            json!({"send": {"to": "a@b.example"}}),
            json!("garbage"),
        ] {
            assert_eq!(read_item(&bad), None, "{bad}");
        }
    }
}
