//! The emulator's webhooks, as Resend sends them through Svix: after accepting
//! mail it posts signed events to a configured URL: `email.delivered` for
//! ordinary recipients and `delivered@resend.dev`, `email.bounced` (Permanent)
//! for `bounced@resend.dev`, `email.delivered` then `email.complained` for
//! `complained@resend.dev`, `email.suppressed` for `suppressed@resend.dev` (any
//! `+label` allowed) and for a recipient on the suppression list (with the reason its
//! entry gives), and `suppression.added` / `suppression.removed` when the list is
//! changed through the API. A non-2xx answer is retried a few times with backoff.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::model::svix::SigningKey;

/// Where the emulator sends its webhooks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookTarget {
    /// The daemon's public URL plus `/webhooks/resend`.
    pub url: String,
    /// The signing secret (`whsec_…`).
    pub secret: String,
}

/// Delays before the retries of an event that was not acknowledged (Svix retries
/// over days; this is the same shape, shorter).
const RETRIES: [Duration; 3] = [Duration::from_millis(200), Duration::from_secs(1), Duration::from_secs(5)];

/// Counters of the webhooks sent.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub delivered: AtomicU64,
    pub retried: AtomicU64,
    pub failed: AtomicU64,
}

/// Events waiting to be posted, and the task that posts them.
pub(crate) struct Outbox {
    target: WebhookTarget,
    queue: OnceLock<mpsc::UnboundedSender<(String, String)>>,
    pub counters: std::sync::Arc<Counters>,
}

impl Outbox {
    pub fn new(target: WebhookTarget) -> Outbox {
        Outbox { target, queue: OnceLock::new(), counters: Default::default() }
    }

    /// Queues the events for one accepted email (`email` as it was sent, `id` Resend's;
    /// `suppressed`, the reason, when a recipient is on the suppression list).
    pub fn accepted(&self, id: &str, email: &Value, suppressed: Option<&str>) {
        for body in events_for(id, email, suppressed) {
            self.post_event(body);
        }
    }

    /// Queues one event's body (a suppression's, say), signed and retried as the rest.
    pub fn post_event(&self, body: String) {
        let sender = self.queue.get_or_init(|| self.start());
        let message = format!("msg_{}", crate::model::id::new_uuid().replace('-', ""));
        let _ = sender.send((message, body));
    }

    /// Starts the posting task (in the runtime the first email arrives in).
    fn start(&self) -> mpsc::UnboundedSender<(String, String)> {
        let (tx, mut rx) = mpsc::unbounded_channel::<(String, String)>();
        let key = SigningKey::parse(&self.target.secret);
        let (url, counters) = (self.target.url.clone(), self.counters.clone());
        crate::resend::client::install_crypto_provider();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("an HTTP client");
        tokio::spawn(async move {
            while let Some((message, body)) = rx.recv().await {
                let (http, url, counters, key) = (http.clone(), url.clone(), counters.clone(), key.clone());
                // Each event on its own, as Svix does: a slow one does not hold up the rest.
                tokio::spawn(async move { post(&http, &url, key.as_ref(), &message, body, &counters).await });
            }
        });
        tx
    }
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    key: Option<&SigningKey>,
    message: &str,
    body: String,
    counters: &Counters,
) {
    for attempt in 0..=RETRIES.len() {
        if attempt > 0 {
            counters.retried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(RETRIES[attempt - 1]).await;
        }
        let timestamp = chrono::Utc::now().timestamp();
        let signature = key.map(|k| k.sign(message, timestamp, body.as_bytes())).unwrap_or_default();
        let sent = http
            .post(url)
            .header("svix-id", message)
            .header("svix-timestamp", timestamp.to_string())
            .header("svix-signature", signature)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        if sent.is_ok_and(|r| r.status().is_success()) {
            counters.delivered.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    counters.failed.fetch_add(1, Ordering::Relaxed);
}

fn recipients(email: &Value) -> Vec<String> {
    match email.get("to") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    }
}

/// The events an accepted email leads to, in order, by its first recipient (the
/// last is what `GET /emails/{id}` reports as `last_event`).
pub(crate) fn fate(email: &Value) -> &'static [&'static str] {
    let to = recipients(email);
    let first = to.first().map(|a| super::validate::bare_address(a).to_ascii_lowercase()).unwrap_or_default();
    let (local, domain) = first.split_once('@').unwrap_or(("", ""));
    let local = local.split('+').next().unwrap_or("");
    match (local, domain) {
        ("bounced", "resend.dev") => &["email.bounced"],
        ("complained", "resend.dev") => &["email.delivered", "email.complained"],
        ("suppressed", "resend.dev") => &["email.suppressed"],
        _ => &["email.delivered"],
    }
}

/// A `suppression.added` or `suppression.removed` event's body, `data` the entry.
pub(crate) fn suppression_event(kind: &str, data: Value) -> String {
    json!({ "type": kind, "created_at": chrono::Utc::now().to_rfc3339(), "data": data }).to_string()
}

/// The event bodies an accepted email leads to, by its recipient; only
/// `email.suppressed` (with `suppressed`, the reason) when its recipient is listed.
fn events_for(id: &str, email: &Value, suppressed: Option<&str>) -> Vec<String> {
    let to = recipients(email);
    let kinds: &[&str] = if suppressed.is_some() { &["email.suppressed"] } else { fate(email) };
    // Resend writes tags as an object in its webhooks.
    let tags: serde_json::Map<String, Value> = email
        .get("tags")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter().filter_map(|t| Some((t.get("name")?.as_str()?.to_string(), t.get("value")?.clone()))).collect()
        })
        .unwrap_or_default();
    let now = chrono::Utc::now().to_rfc3339();
    kinds
        .iter()
        .map(|kind| {
            let mut data = json!({
                "email_id": id,
                "created_at": now,
                "from": email.get("from").cloned().unwrap_or(Value::Null),
                "to": to,
                "subject": email.get("subject").cloned().unwrap_or(Value::Null),
                "tags": tags,
            });
            match *kind {
                "email.bounced" => {
                    data["bounce"] = json!({"type": "Permanent", "subType": "General",
                        "message": "The recipient's mail server permanently rejected the email."});
                }
                "email.suppressed" => data["suppressed"] = json!({"reason": suppressed.unwrap_or("previous_bounce")}),
                _ => {}
            }
            json!({ "type": kind, "created_at": now, "data": data }).to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_addresses_pick_their_events() {
        let email = |to: &str| {
            json!({"from": "a@acme.example", "to": [to], "subject": "s",
            "tags": [{"name": "delivery", "value": "x"}]})
        };
        let kinds = |to: &str| -> Vec<String> {
            events_for("id1", &email(to), None)
                .iter()
                .map(|b| serde_json::from_str::<Value>(b).unwrap()["type"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(kinds("bounced+u1@resend.dev"), vec!["email.bounced"]);
        assert_eq!(kinds("complained@resend.dev"), vec!["email.delivered", "email.complained"]);
        assert_eq!(kinds("delivered+u2@resend.dev"), vec!["email.delivered"]);
        assert_eq!(kinds("ann@acme.example"), vec!["email.delivered"]);
        let bounced: Value = serde_json::from_str(&events_for("id1", &email("bounced@resend.dev"), None)[0]).unwrap();
        assert_eq!(bounced["data"]["bounce"]["type"], "Permanent");
        assert_eq!(bounced["data"]["tags"]["delivery"], "x");
        let test_address: Value =
            serde_json::from_str(&events_for("id1", &email("suppressed@resend.dev"), None)[0]).unwrap();
        assert_eq!(test_address["data"]["suppressed"]["reason"], "previous_bounce");
    }

    #[test]
    fn a_listed_recipient_is_suppressed_whatever_its_address() {
        let email = json!({"from": "a@acme.example", "to": ["bounced@resend.dev"], "subject": "s"});
        let events = events_for("id1", &email, Some("previous_complaint"));
        assert_eq!(events.len(), 1);
        let event: Value = serde_json::from_str(&events[0]).unwrap();
        assert_eq!(
            (event["type"].as_str(), event["data"]["email_id"].as_str()),
            (Some("email.suppressed"), Some("id1"))
        );
        assert_eq!(event["data"]["suppressed"], json!({"reason": "previous_complaint"}));
    }
}
