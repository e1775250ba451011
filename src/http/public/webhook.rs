//! `POST /webhooks/resend`: Resend's events, signed Svix-style. The signature is
//! verified on the raw bytes before anything is parsed (401 otherwise, and
//! nothing changes); a verified body that is not JSON is 400; every verified
//! event is 200, unknown types included (counted, ignored). Each effect happens
//! once per event id (SET NX in the same script as the effect): an event about a
//! delivery is counted in the hour's tally and written on its record while it keeps
//! one (a delivery settled sent keeps a compact entry instead); a permanent bounce, a complaint or the
//! provider's suppression suppresses the address (cascading to its
//! subscribers); transient bounces are counted. A Redis failure is 500, so the
//! sender retries.

use hyper::StatusCode;
use serde_json::Value;

use crate::audience::suppression::{self, Act};
use crate::config::Config;
use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::metrics::Metrics;
use crate::model::names::names;
use crate::model::outcome::Why;
use crate::model::svix::{self, Signed, SigningKey};
use crate::model::work::DeliveryRef;
use crate::store::Store;
use crate::store::scripts;

/// The path Resend posts to.
pub const PATH: &str = "/webhooks/resend";

names! {
    /// An event type mailstream knows, by the name written on a delivery (`ev_<name>`)
    /// and used as a label (bounded: the rest are `other`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum EventKind {
        Sent = "sent",
        Delivered = "delivered",
        DeliveryDelayed = "delivery_delayed",
        Bounced = "bounced",
        Complained = "complained",
        Opened = "opened",
        Clicked = "clicked",
        Failed = "failed",
        Suppressed = "suppressed",
        /// `suppression.added`: Resend put an address on its own list.
        SuppressionAdded = "suppression_added",
        /// `suppression.removed`: Resend took it off.
        SuppressionRemoved = "suppression_removed",
        Other = "other",
    }
}

impl EventKind {
    /// The kind of an event `type` (`email.bounced`, `suppression.added`); one it does
    /// not know is `Other`.
    fn of_type(s: &str) -> EventKind {
        match s {
            "suppression.added" => EventKind::SuppressionAdded,
            "suppression.removed" => EventKind::SuppressionRemoved,
            _ => {
                let kind = s.strip_prefix("email.").and_then(|name| name.parse().ok());
                let about_an_email = |k: &EventKind| {
                    !matches!(k, EventKind::Other | EventKind::SuppressionAdded | EventKind::SuppressionRemoved)
                };
                kind.filter(about_an_email).unwrap_or(EventKind::Other)
            }
        }
    }
}

/// What a verified event asks of mailstream (a pure reading of its JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    pub kind: EventKind,
    /// The delivery it is about, from the `delivery` tag mailstream sets.
    pub delivery: Option<DeliveryRef>,
    /// The recipients (only for events that act on addresses).
    pub to: Vec<String>,
    /// What to do to those addresses.
    pub act: Option<Act>,
    /// Why Resend failed an email after accepting it (`email.failed`'s `failed.reason`),
    /// as a bounded name.
    pub failed_reason: Option<String>,
}

/// Reads an event envelope `{type, created_at, data}`; `None` when the body is not
/// JSON. JSON of another shape is an event of an unknown type (acknowledged, ignored).
fn parse_event(body: &[u8]) -> Option<Event> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let kind = EventKind::of_type(v.get("type").and_then(Value::as_str).unwrap_or(""));
    let data = v.get("data").unwrap_or(&Value::Null);
    let delivery = tag(data, "delivery").and_then(|t| DeliveryRef::from_tag(&t));
    let act = match kind {
        EventKind::Bounced => {
            let bounce_type = data.get("bounce").and_then(|b| b.get("type")).and_then(Value::as_str).unwrap_or("");
            // Only a permanent bounce means the address is dead.
            Some(if bounce_type.eq_ignore_ascii_case("permanent") {
                Act::Suppress(Why::Bounced)
            } else {
                Act::CountTransient
            })
        }
        EventKind::Complained => Some(Act::Suppress(Why::Complained)),
        EventKind::Suppressed => Some(Act::Suppress(Why::ProviderSuppressed)),
        EventKind::SuppressionAdded => Some(Act::ProviderAdd),
        EventKind::SuppressionRemoved => Some(Act::ProviderLift),
        _ => None,
    };
    // An email event names its recipients in `to`; a suppression event its one address in `email`.
    let to = match (&act, data.get("to").or_else(|| data.get("email"))) {
        (None, _) => Vec::new(),
        (Some(_), Some(Value::String(s))) => vec![s.clone()],
        (Some(_), Some(Value::Array(a))) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    };
    let failed_reason = (kind == EventKind::Failed).then(|| {
        let reason = data.get("failed").and_then(|f| f.get("reason")).and_then(Value::as_str);
        reason_name(reason.unwrap_or(""))
    });
    Some(Event { kind, delivery, to, act, failed_reason })
}

/// A provider's failure reason as a name safe to count and show: Resend's reasons are
/// snake_case codes (`reached_daily_quota`); anything else (free text, which might hold
/// an address) is `other`, and none is `unspecified`.
pub fn reason_name(reason: &str) -> String {
    let r = reason.trim();
    if r.is_empty() {
        return "unspecified".into();
    }
    let code = r.len() <= 48 && r.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if code { r.to_string() } else { "other".into() }
}

/// A tag's value: `tags` is usually an object `{"name": "value"}`, sometimes an
/// array of `{name, value}`.
fn tag(data: &Value, name: &str) -> Option<String> {
    match data.get("tags")? {
        Value::Object(map) => map.get(name)?.as_str().map(str::to_string),
        Value::Array(items) => items
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(name))?
            .get("value")?
            .as_str()
            .map(str::to_string),
        _ => None,
    }
}

/// An event id safe in a key name: itself if plain, else a hash of it.
fn event_key(id: &str) -> String {
    if !id.is_empty() && id.len() <= 100 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return id.to_string();
    }
    use sha2::Digest;
    sha2::Sha256::digest(id.as_bytes()).iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The webhook endpoint: its keys, and what it writes to.
pub struct Webhooks {
    keys: Vec<SigningKey>,
    store: Store,
    config: Config,
    metrics: std::sync::Arc<Metrics>,
    /// Unix seconds now (injected in tests).
    clock: fn() -> i64,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl Webhooks {
    /// `None` when no signing secret is configured: then every request is refused.
    pub fn new(config: &Config, store: Store, metrics: std::sync::Arc<Metrics>) -> Webhooks {
        let keys = config.webhook.secrets.iter().filter_map(|s| SigningKey::parse(s.expose())).collect();
        Webhooks { keys, store, config: config.clone(), metrics, clock: unix_now }
    }

    /// The same with a fixed clock (tests with the official vectors).
    pub fn with_clock(mut self, clock: fn() -> i64) -> Webhooks {
        self.clock = clock;
        self
    }

    /// Answers one request to `/webhooks/resend`.
    pub async fn handle(&self, req: HttpRequest) -> HttpResponse {
        if req.method() != hyper::Method::POST {
            return server::text(StatusCode::METHOD_NOT_ALLOWED, "POST only\n");
        }
        let verified = match Signed::from_headers(req.headers()) {
            None => Err(svix::Rejection::MissingHeaders),
            Some(_) if self.keys.is_empty() => Err(svix::Rejection::BadSignature),
            Some(signed) => {
                svix::verify(&self.keys, &signed, req.body(), (self.clock)()).map(|()| signed.id.to_string())
            }
        };
        let id = match verified {
            Ok(id) => id,
            Err(why) => {
                self.metrics.webhook_request("rejected", Some(why.as_str()));
                return server::text(StatusCode::UNAUTHORIZED, "signature missing, invalid or stale\n");
            }
        };
        let Some(event) = parse_event(req.body()) else {
            self.metrics.webhook_request("invalid", None);
            return server::text(StatusCode::BAD_REQUEST, "not a JSON event\n");
        };
        match self.apply(&event_key(&id), &event).await {
            Ok(duplicate) => {
                self.metrics.webhook_request(if duplicate { "duplicate" } else { "verified" }, None);
                self.metrics.webhook_event(event.kind.as_str());
                server::json_text(StatusCode::OK, &b"{\"ok\":true}"[..])
            }
            Err(e) => {
                // Not acknowledged: the sender retries, and each effect still happens once.
                self.metrics.redis_error("webhook", &e);
                server::text(StatusCode::INTERNAL_SERVER_ERROR, "try again later\n")
            }
        }
    }

    /// Has the event's effects; returns whether it had had them all before.
    async fn apply(&self, id: &str, event: &Event) -> anyhow::Result<bool> {
        let ttl = self.config.webhook.seen_ttl().as_secs();
        let mut duplicate = true;
        if let (Some(d), true) = (&event.delivery, event.kind != EventKind::Other) {
            // Concurrent events share one connection: their scripts reach Redis in one write
            // and are made durable by one fsync (no WAIT follows on it).
            let mut conn = self.store.shared().await?;
            let counter = match (event.kind, &event.failed_reason) {
                (EventKind::Failed, Some(reason)) => Some(("provider_failed", reason.as_str())),
                (EventKind::DeliveryDelayed, _) => Some(("delivery_delayed", "")),
                _ => None,
            };
            let e = scripts::DeliveryEvent { id, kind: event.kind.as_str(), counter, seen_ttl_secs: ttl };
            let wrote = scripts::event(&mut conn, &self.store.keys, d, &e).await?;
            duplicate &= wrote == scripts::EventWrite::Repeat;
        }
        if let Some(act) = event.act {
            for to in &event.to {
                let state = suppression::apply(&self.store, &self.config, to, act, Some(id)).await?;
                duplicate &= state == scripts::Suppressed::Duplicate;
                if state == scripts::Suppressed::New {
                    let why = match act {
                        Act::Suppress(why) => why,
                        Act::ProviderAdd => Why::ProviderSuppressed,
                        _ => Why::TransientBounces,
                    };
                    self.metrics.suppressed(why.as_str());
                }
            }
        }
        Ok(duplicate && (event.delivery.is_some() || event.act.is_some()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn events_are_read_whatever_shape_their_tags_take() {
        let d = DeliveryRef::new("weekly_digest", "2026-W48", "u.42", "team-1");
        let body = serde_json::json!({
            "type": "email.bounced",
            "created_at": "2026-11-30T00:00:00Z",
            "data": {"email_id": "x", "to": ["ann@person.example"], "tags": {"delivery": d.tag()},
                     "bounce": {"type": "Permanent", "subType": "General", "message": "no such user"}}
        });
        let e = parse_event(body.to_string().as_bytes()).unwrap();
        assert_eq!(e.kind, EventKind::Bounced);
        assert_eq!(e.delivery, Some(d.clone()));
        assert_eq!(e.act, Some(Act::Suppress(Why::Bounced)));
        assert_eq!(e.to, vec!["ann@person.example"]);
        let transient = serde_json::json!({
            "type": "email.bounced",
            "data": {"to": "ann@person.example", "tags": [{"name": "delivery", "value": d.tag()}], "bounce": {"type": "Transient", "subType": "MailboxFull"}}
        });
        let e = parse_event(transient.to_string().as_bytes()).unwrap();
        assert_eq!((e.act, e.delivery), (Some(Act::CountTransient), Some(d)));
        let unknown = parse_event(br#"{"type":"contact.created","data":{"id":"c"}}"#).unwrap();
        assert_eq!((unknown.kind, unknown.act), (EventKind::Other, None));
        assert_eq!(parse_event(b"[1,2]").unwrap().kind, EventKind::Other, "JSON, not an envelope");
        // Resend's own list: the address is `data.email`.
        let added =
            br#"{"type":"suppression.added","data":{"id":"s1","email":"ann@person.example","origin":"bounce"}}"#;
        let e = parse_event(added).unwrap();
        assert_eq!(
            (e.kind, e.act, e.to.as_slice()),
            (EventKind::SuppressionAdded, Some(Act::ProviderAdd), &["ann@person.example".to_string()][..])
        );
        let removed = br#"{"type":"suppression.removed","data":{"id":"s1","email":"ann@person.example"}}"#;
        assert_eq!(parse_event(removed).unwrap().act, Some(Act::ProviderLift));
        assert_eq!(parse_event(br#"{"type":"email.suppression_added","data":{}}"#).unwrap().kind, EventKind::Other);
        // After a 200: the reason as a bounded name.
        let failed = br#"{"type":"email.failed","data":{"failed":{"reason":"reached_daily_quota"}}}"#;
        assert_eq!(parse_event(failed).unwrap().failed_reason.as_deref(), Some("reached_daily_quota"));
        let free_text = br#"{"type":"email.failed","data":{"failed":{"reason":"ann@x.example bounced"}}}"#;
        assert_eq!(parse_event(free_text).unwrap().failed_reason.as_deref(), Some("other"));
        assert_eq!(
            parse_event(br#"{"type":"email.failed","data":{}}"#).unwrap().failed_reason.as_deref(),
            Some("unspecified")
        );
        assert!(parse_event(b"not json").is_none() && parse_event(b"").is_none());
    }

    #[test]
    fn event_ids_are_safe_in_key_names() {
        assert_eq!(event_key("msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"), "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk");
        let odd = event_key("msg:{0}:evil key");
        assert!(odd.len() == 32 && odd.bytes().all(|b| b.is_ascii_hexdigit()), "{odd}");
    }

    proptest! {
        #[test]
        fn the_event_parser_never_panics(body in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse_event(&body);
        }

        #[test]
        fn the_event_parser_never_panics_on_json(kind in "email\\.[a-z_]{0,12}", to in ".{0,30}", tag in ".{0,60}") {
            let body = serde_json::json!({"type": kind, "data": {"to": [to], "tags": {"delivery": tag}, "bounce": {"type": "Permanent"}}});
            let _ = parse_event(body.to_string().as_bytes());
        }
    }
}
