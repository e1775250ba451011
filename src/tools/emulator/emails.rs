//! The emails the emulator accepted, kept so that `GET /emails/{id}` and
//! `GET /emails` answer as Resend's retrieve and list endpoints do: the email
//! object (`object: "email"`, `last_event`, …), a 404 `not_found` for an id it
//! does not know, and lists newest first with `limit`, `after` and `before`.

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

use super::validate::{ApiError, addresses};

/// Emails kept; the oldest is forgotten when a new one would exceed it (a GET for
/// it is then a 404, as after Resend's retention). A digest is about 2 KB of html
/// and text, so a full store holds about 200 MB.
pub const KEPT: usize = 100_000;

/// `limit` of a list when none is given, and the most it may be (Resend's numbers).
const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 100;

/// One accepted email, in the fields Resend's retrieve endpoint returns.
struct Sent {
    id: String,
    created_at: String,
    from: Value,
    to: Vec<String>,
    subject: Value,
    html: Value,
    text: Value,
    cc: Value,
    bcc: Value,
    reply_to: Value,
    tags: Option<Value>,
    scheduled_at: Value,
    last_event: &'static str,
}

impl Sent {
    /// The retrieve endpoint's object (`full`), or a list item: the same without
    /// `object`, `html`, `text` and `tags`, as Resend lists them.
    fn to_json(&self, full: bool) -> Value {
        let mut out = json!({
            "id": self.id,
            "to": self.to,
            "from": self.from,
            "created_at": self.created_at,
            "subject": self.subject,
            "bcc": self.bcc,
            "cc": self.cc,
            "reply_to": self.reply_to,
            "last_event": self.last_event,
            "scheduled_at": self.scheduled_at,
        });
        if full {
            out["object"] = json!("email");
            out["html"] = self.html.clone();
            out["text"] = self.text.clone();
            if let Some(tags) = &self.tags {
                out["tags"] = tags.clone();
            }
        }
        out
    }
}

/// Where a list starts.
enum EmailsCursor {
    Newest,
    /// Older than this position (the next page).
    After(usize),
    /// Newer than this position (the page before).
    Before(usize),
}

/// The accepted emails, oldest first, at most `capacity` of them.
pub(crate) struct Emails {
    /// Boxed: growing the queue past a power of two moves pointers, not whole emails (a
    /// stall of milliseconds at 65,536 emails held the emulator's lock, so the next
    /// requests' heads were read late, stamped together, and one was refused 429).
    sent: VecDeque<Box<Sent>>,
    /// The sequence number of `sent[0]`; each email's never changes, so an id maps to it.
    first: u64,
    by_id: HashMap<String, u64>,
    capacity: usize,
}

impl Default for Emails {
    fn default() -> Self {
        Emails::with_capacity(KEPT)
    }
}

impl Emails {
    pub(crate) fn with_capacity(capacity: usize) -> Emails {
        // The id map at its full size from the start: growing, it rehashes under the
        // emulator's lock (see `SENDS_PRESIZED`).
        let by_id = HashMap::with_capacity(capacity.min(KEPT));
        Emails { sent: VecDeque::new(), first: 0, by_id, capacity: capacity.max(1) }
    }

    /// Remembers an email accepted as `id` at `created_at`, whose fate (the events it
    /// led to) ended with `last_event`; forgets the oldest when full.
    pub(crate) fn insert(&mut self, id: &str, email: &Value, created_at: String, last_event: &'static str) {
        if self.sent.len() == self.capacity
            && let Some(old) = self.sent.pop_front()
        {
            self.by_id.remove(&old.id);
            self.first += 1;
        }
        let field = |name: &str| email.get(name).cloned().unwrap_or(Value::Null);
        let list = |name: &str| match addresses(email.get(name)) {
            a if a.is_empty() => Value::Null,
            a => json!(a),
        };
        self.by_id.insert(id.to_string(), self.first + self.sent.len() as u64);
        self.sent.push_back(Box::new(Sent {
            id: id.to_string(),
            created_at,
            from: field("from"),
            to: addresses(email.get("to")),
            subject: field("subject"),
            html: field("html"),
            text: field("text"),
            cc: list("cc"),
            bcc: list("bcc"),
            reply_to: list("reply_to"),
            tags: email.get("tags").cloned(),
            scheduled_at: field("scheduled_at"),
            last_event,
        }));
    }

    /// Every email remembered, oldest first, as `GET /emails/{id}` shows it.
    pub(crate) fn all(&self) -> Vec<Value> {
        self.sent.iter().map(|s| s.to_json(true)).collect()
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).map(|seq| (seq - self.first) as usize)
    }

    /// `GET /emails/{id}`.
    pub(crate) fn get(&self, id: &str) -> Result<Value, ApiError> {
        let at = self.position(id).ok_or_else(|| ApiError::new(404, "not_found", "Email not found"))?;
        Ok(self.sent[at].to_json(true))
    }

    /// `GET /emails?limit=&after=|before=`: newest first.
    pub(crate) fn list(&self, query: Option<&str>) -> Result<Value, ApiError> {
        let invalid = |message: &str| ApiError::new(422, "validation_error", message);
        let mut limit = DEFAULT_LIMIT;
        let mut cursor = EmailsCursor::Newest;
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match key.as_ref() {
                "limit" => {
                    limit = super::validate::list_limit(&value, MAX_LIMIT)?;
                }
                "after" | "before" => {
                    if !matches!(cursor, EmailsCursor::Newest) {
                        return Err(invalid("Use either `after` or `before`, not both."));
                    }
                    let at = self.position(&value).ok_or_else(|| invalid("The cursor is not a known email id."))?;
                    cursor = if key == "after" { EmailsCursor::After(at) } else { EmailsCursor::Before(at) };
                }
                _ => {}
            }
        }
        let len = self.sent.len();
        let (range, has_more) = match cursor {
            EmailsCursor::Newest => {
                let start = len.saturating_sub(limit);
                (start..len, start > 0)
            }
            EmailsCursor::After(at) => {
                let start = at.saturating_sub(limit);
                (start..at, start > 0)
            }
            EmailsCursor::Before(at) => {
                let end = (at + 1 + limit).min(len);
                (at + 1..end, end < len)
            }
        };
        let data: Vec<Value> = range.rev().map(|i| self.sent[i].to_json(false)).collect();
        Ok(json!({ "object": "list", "has_more": has_more, "data": data }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(n: usize, capacity: usize) -> Emails {
        let mut emails = Emails::with_capacity(capacity);
        for i in 0..n {
            let email = json!({"from": "a@acme.example", "to": format!("u{i}@resend.dev"), "subject": "s",
                "cc": ["c@acme.example"], "tags": [{"name": "campaign", "value": "d"}]});
            emails.insert(&format!("id{i}"), &email, "2026-11-30T00:00:00.000000+00:00".into(), "delivered");
        }
        emails
    }

    fn ids(list: &Value) -> Vec<&str> {
        list["data"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap()).collect()
    }

    #[test]
    fn an_email_reads_back_in_resends_shape() {
        let emails = store(1, 10);
        let got = emails.get("id0").unwrap();
        assert_eq!(got["object"], "email");
        assert_eq!(got["to"], json!(["u0@resend.dev"]), "one address becomes an array");
        assert_eq!(got["cc"], json!(["c@acme.example"]));
        assert_eq!((got["bcc"].is_null(), got["html"].is_null(), got["scheduled_at"].is_null()), (true, true, true));
        assert_eq!(got["last_event"], "delivered");
        assert_eq!(got["tags"][0]["name"], "campaign");
        let e = emails.get("nope").unwrap_err();
        assert_eq!((e.status.as_u16(), e.name, e.message.as_str()), (404, "not_found", "Email not found"));
    }

    #[test]
    fn lists_run_newest_first_and_page_both_ways() {
        let emails = store(5, 10);
        let first = emails.list(Some("limit=2")).unwrap();
        assert_eq!((ids(&first), first["has_more"].as_bool()), (vec!["id4", "id3"], Some(true)));
        assert!(first["data"][0].get("html").is_none() && first["data"][0].get("object").is_none());
        let next = emails.list(Some("limit=2&after=id3")).unwrap();
        assert_eq!((ids(&next), next["has_more"].as_bool()), (vec!["id2", "id1"], Some(true)));
        let last = emails.list(Some("limit=2&after=id1")).unwrap();
        assert_eq!((ids(&last), last["has_more"].as_bool()), (vec!["id0"], Some(false)));
        let back = emails.list(Some("limit=2&before=id1")).unwrap();
        assert_eq!((ids(&back), back["has_more"].as_bool()), (vec!["id3", "id2"], Some(true)));
        let all = emails.list(None).unwrap();
        assert_eq!((ids(&all).len(), all["has_more"].as_bool()), (5, Some(false)));
        for bad in ["limit=0", "limit=101", "limit=x", "after=nope", "after=id1&before=id3"] {
            assert_eq!(emails.list(Some(bad)).unwrap_err().status.as_u16(), 422, "{bad}");
        }
    }

    #[test]
    fn the_oldest_are_forgotten_past_the_capacity() {
        let emails = store(5, 3);
        assert!(emails.get("id1").is_err());
        assert!(emails.get("id2").is_ok());
        assert_eq!(ids(&emails.list(None).unwrap()), vec!["id4", "id3", "id2"]);
        assert_eq!(ids(&emails.list(Some("after=id3")).unwrap()), vec!["id2"]);
    }
}
