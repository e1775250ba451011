//! Transactional sends (a receipt, a password reset): what the ingest API
//! (`POST /v1/deliveries` on the public listener) and `mailstream enqueue` take.
//! Each item names its recipient (a subscriber id, or an address given inline),
//! its content (a template, or a ready subject and body), its data, and the
//! caller's idempotency key, which is its dedup key: the same key enqueues once
//! within the retention, whatever the day. Items are checked one by one (a bad
//! item is reported with its field, the others go on) and enqueued in the
//! transactional lane (`lua/ingest.lua`), on the same exactly-once path as
//! campaigns. An address given inline is kept in the delivery's record only.
//!
//! Raw Redis here: one read-only pipeline, whether the subscribers an ingest names exist; the items
//! are written by ingest.lua.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{Config, is_name};
use crate::model::work::{Audience, Channel, DeliveryRef, Lane, TRANSACTIONAL};
use crate::store::Store;
use crate::store::scripts::{self, IngestItem, Ingested};

/// The most items one request (or one `enqueue` call) may carry.
pub(crate) const MAX_ITEMS: usize = 1000;

/// The subscriber part of a transactional delivery id whose address was given inline.
const INLINE: &str = "-";

/// One transactional item as checked: exactly one recipient, exactly one kind of
/// content. Stored as JSON in the delivery record (`request`) and read back by the
/// consumer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Not stored (it is the delivery id's last part).
    #[serde(skip_serializing, default)]
    pub idempotency_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriber: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Map<String, serde_json::Value>>,
    /// Files sent with the email (a receipt's PDF): kept in a field of the record of
    /// their own, deleted when the delivery settles, never in `request`.
    #[serde(default, skip_serializing)]
    pub attachments: Vec<Attachment>,
}

/// One file sent with an email, as Resend takes it: its name, its bytes in base64 and
/// its media type. Resend's `path` (a URL it fetches) is not taken: mailstream never
/// has anything fetched on a caller's word.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    pub filename: String,
    /// The file's bytes, base64 (the standard alphabet, padded).
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
}

/// Why an item was refused: which field, and why (never the field's value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct FieldError {
    pub field: String,
    pub error: String,
}

fn refuse(field: &str, error: &str) -> FieldError {
    FieldError { field: field.to_string(), error: error.to_string() }
}

impl Request {
    /// A request as a delivery record keeps it (`stored`), read back; `None` if it is not
    /// one (a record written by hand, or damaged).
    pub fn from_stored(json: &str) -> Option<Request> {
        serde_json::from_str(json).ok()
    }

    /// Reads and checks one item (a JSON object) against the config's templates.
    fn from_json(value: serde_json::Value, config: &Config) -> Result<Request, FieldError> {
        let Some(object) = value.as_object() else {
            return Err(refuse("", "each delivery must be a JSON object"));
        };
        // Field by field, so an error names the field and never quotes a value.
        for (name, v) in object {
            match name.as_str() {
                "data" if !v.is_object() => return Err(refuse(name, "must be a JSON object")),
                "data" => {}
                "attachments" => check_attachments(v, config)?,
                "idempotency_key" | "to" | "subscriber" | "template" | "subject" | "html" | "text" => {
                    if !v.is_string() {
                        return Err(refuse(name, "must be a string"));
                    }
                }
                _ => return Err(refuse(name, "unknown field")),
            }
        }
        let r: Request = serde_json::from_value(value).map_err(|_| refuse("", "not a delivery"))?;
        r.check(config)?;
        Ok(r)
    }

    fn check(&self, config: &Config) -> Result<(), FieldError> {
        if !is_name(&self.idempotency_key) {
            return Err(refuse("idempotency_key", "required: 1-128 of letters, digits, '_', '-', '.'"));
        }
        match (&self.to, &self.subscriber) {
            (Some(to), None) => {
                if let Err(why) = crate::model::address::check(to) {
                    return Err(refuse("to", &format!("the address {why}")));
                }
            }
            (None, Some(s)) if !is_name(s) => {
                return Err(refuse("subscriber", "1-128 of letters, digits, '_', '-', '.'"));
            }
            (Some(_), Some(_)) | (None, None) => {
                return Err(refuse("to", "give exactly one of to (an address) or subscriber (an id)"));
            }
            _ => {}
        }
        // Operator mail goes to the team's own addresses and no others.
        let operators = self.template.as_ref().and_then(|t| config.templates.get(t)).map(|t| t.audience);
        if operators == Some(Audience::Operators) {
            match &self.to {
                Some(to) if config.operators.includes(to) => {}
                _ => {
                    return Err(refuse("to", "an operator template mails only the addresses of [operators] to"));
                }
            }
        }
        let ready = self.subject.is_some() || self.html.is_some() || self.text.is_some();
        match (&self.template, ready) {
            (Some(t), false) if !config.templates.contains_key(t) => {
                Err(refuse("template", "no such template in the config"))
            }
            (Some(_), false) => Ok(()),
            (None, true) if self.subject.as_deref().is_none_or(|s| s.trim().is_empty()) => {
                Err(refuse("subject", "required with ready content"))
            }
            (None, true) if self.html.is_none() && self.text.is_none() => {
                Err(refuse("html", "ready content needs html or text"))
            }
            (None, true) => Ok(()),
            (Some(_), true) => Err(refuse("template", "give a template or ready subject/html/text, not both")),
            (None, false) => Err(refuse("template", "give a template or ready subject/html/text")),
        }
    }

    /// Its attachments as the record keeps them (a JSON array, in Resend's shape) and their
    /// bytes (base64); `None` without any.
    pub fn stored_attachments(&self) -> Option<(String, u64)> {
        if self.attachments.is_empty() {
            return None;
        }
        let bytes = self.attachments.iter().map(|a| a.content.len() as u64).sum();
        Some((serde_json::to_string(&self.attachments).expect("attachments serialize"), bytes))
    }

    /// The delivery this item makes on `day` (UTC, `YYYY-MM-DD`).
    pub fn delivery(&self, day: &str) -> DeliveryRef {
        DeliveryRef::new(TRANSACTIONAL, day, self.subscriber.as_deref().unwrap_or(INLINE), &self.idempotency_key)
    }

    /// The request as the delivery record keeps it, and its hash (a replay must match).
    /// What its application event keeps of it: the template and the names of its data
    /// fields (never a value, never an address), as a request's JSON.
    pub fn for_event(&self) -> String {
        let names = self.data.as_ref().map(|d| d.keys().map(|k| (k.clone(), serde_json::Value::Null)).collect());
        let event = Request { template: self.template.clone(), data: names, ..Request::default() };
        serde_json::to_string(&event).expect("a request serializes")
    }

    pub fn stored(&self) -> (String, String) {
        let json = serde_json::to_string(self).expect("a request serializes");
        let mut hash = Sha256::new();
        hash.update(self.idempotency_key.as_bytes());
        hash.update(b"\n");
        hash.update(json.as_bytes());
        // The same key with other files is another request; without any, the hash is as it
        // always was.
        if let Some((attachments, _)) = self.stored_attachments() {
            hash.update(b"\n");
            hash.update(attachments.as_bytes());
        }
        let hex: String = hash.finalize()[..12].iter().map(|b| format!("{b:02x}")).collect();
        (json, hex)
    }
}

/// The attachments of an item, field by field (an error names the field, never a value):
/// each `{filename, content, content_type?}`, `content` valid base64, a `path` refused, and
/// all of them together within `attachments.max_bytes` after base64.
fn check_attachments(v: &serde_json::Value, config: &Config) -> Result<(), FieldError> {
    use base64::Engine;
    let Some(items) = v.as_array() else { return Err(refuse("attachments", "must be a JSON array")) };
    let mut bytes = 0u64;
    for (i, a) in items.iter().enumerate() {
        let field = |name: &str| format!("attachments[{i}].{name}");
        let Some(a) = a.as_object() else { return Err(refuse(&format!("attachments[{i}]"), "must be a JSON object")) };
        for (name, value) in a {
            match name.as_str() {
                "path" => return Err(refuse(&field("path"), REMOTE_PATH)),
                "filename" | "content" | "content_type" if value.is_string() => {}
                "filename" | "content" | "content_type" => return Err(refuse(&field(name), "must be a string")),
                _ => return Err(refuse(&field(name), "unknown field (filename, content, content_type)")),
            }
        }
        let text = |name: &str| a.get(name).and_then(|v| v.as_str());
        let filename = text("filename").unwrap_or("");
        if filename.trim().is_empty() || filename.len() > 255 || filename.chars().any(|c| c.is_control()) {
            return Err(refuse(&field("filename"), "required: 1-255 characters, no control characters"));
        }
        let Some(content) = text("content") else {
            return Err(refuse(&field("content"), "required: the file's bytes in base64"));
        };
        if base64::engine::general_purpose::STANDARD.decode(content).is_err() {
            return Err(refuse(&field("content"), "not base64 (the standard alphabet, padded)"));
        }
        if text("content_type").is_some_and(|t| t.len() > 255 || !t.contains('/') || !t.is_ascii()) {
            return Err(refuse(&field("content_type"), "a media type such as application/pdf"));
        }
        bytes += content.len() as u64;
    }
    let max = config.attachments.max_bytes;
    if bytes > max {
        return Err(refuse("attachments", &format!("{bytes} bytes after base64, above attachments.max_bytes ({max})")));
    }
    Ok(())
}

/// Why an attachment's `path` is refused.
pub const REMOTE_PATH: &str =
    "a URL for Resend to fetch is not taken: send the file's bytes as content (mailstream enqueue --attach FILE)";

/// The first item of `items` that names an attachment by a remote `path`, as its field
/// (the ingest API refuses such a request whole, 400).
pub fn remote_path(items: &[serde_json::Value]) -> Option<String> {
    items.iter().enumerate().find_map(|(n, item)| {
        let attachments = item.get("attachments")?.as_array()?;
        let i = attachments.iter().position(|a| a.get("path").is_some())?;
        Some(format!("deliveries[{n}].attachments[{i}].path"))
    })
}

/// What became of one item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ItemResult {
    /// Enqueued now.
    Accepted { index: usize, delivery: String },
    /// Enqueued before under this key with the same request: nothing new.
    Duplicate { index: usize, delivery: String },
    /// Refused: the key was used before for a different request.
    Conflict { index: usize, delivery: String, error: String },
    /// Refused: a field is missing or wrong.
    Invalid { index: usize, field: String, error: String },
    /// Refused: well-formed, but what it names is not there (`unknown_subscriber`: no
    /// such subscriber in the registry).
    Refused { index: usize, field: String, error: String },
    /// Not enqueued now: its attachments would take the partition past
    /// `attachments.max_pending_bytes`. The same request later enqueues it.
    RetryLater { index: usize, field: String, error: String },
}

impl ItemResult {
    /// Moves its index by `by` (items enqueued in chunks).
    pub(crate) fn shift(&mut self, by: usize) {
        match self {
            ItemResult::Accepted { index, .. }
            | ItemResult::Duplicate { index, .. }
            | ItemResult::Conflict { index, .. }
            | ItemResult::Invalid { index, .. }
            | ItemResult::Refused { index, .. }
            | ItemResult::RetryLater { index, .. } => *index += by,
        }
    }

    pub fn is_refused(&self) -> bool {
        matches!(
            self,
            ItemResult::Conflict { .. }
                | ItemResult::Invalid { .. }
                | ItemResult::Refused { .. }
                | ItemResult::RetryLater { .. }
        )
    }
}

/// A valid item as ingest.lua takes it: its index, delivery, stored request, the
/// request's hash, and whether its template lists the application channel.
/// An item to enqueue: its index, delivery, request, hash, its event's request if any, and
/// its attachments if any (their JSON, their bytes).
type StoredItem = (usize, DeliveryRef, String, String, Option<String>, Option<(String, u64)>);

/// Checks `items` and enqueues the valid ones; one result per item, in order. An item
/// naming a subscriber the registry does not hold is refused (`unknown_subscriber`).
pub async fn enqueue(store: &Store, config: &Config, items: Vec<serde_json::Value>) -> anyhow::Result<Vec<ItemResult>> {
    enqueue_with(store, config, items, UnknownSubscriber::Refuse).await
}

/// What becomes of an item naming a subscriber the registry does not hold.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UnknownSubscriber {
    /// Refused at the door (`unknown_subscriber`).
    Refuse,
    /// Enqueued: skipped at send as `unknown_subscriber` unless the subscriber is added
    /// before (`enqueue --allow-unknown`).
    Allow,
}

/// [`enqueue`], choosing what becomes of an unknown subscriber.
pub async fn enqueue_with(
    store: &Store,
    config: &Config,
    items: Vec<serde_json::Value>,
    unknown: UnknownSubscriber,
) -> anyhow::Result<Vec<ItemResult>> {
    let mut results: Vec<Option<ItemResult>> = vec![None; items.len()];
    let mut valid: Vec<(usize, Request)> = Vec::new();
    for (index, value) in items.into_iter().enumerate() {
        match Request::from_json(value, config) {
            Ok(r) => valid.push((index, r)),
            Err(e) => results[index] = Some(ItemResult::Invalid { index, field: e.field, error: e.error }),
        }
    }
    if unknown == UnknownSubscriber::Refuse {
        let known = known_subscribers(store, &valid).await?;
        valid = valid
            .into_iter()
            .zip(known)
            .filter_map(|((index, r), known)| {
                if known {
                    return Some((index, r));
                }
                let (field, error) = ("subscriber".into(), "unknown_subscriber".into());
                results[index] = Some(ItemResult::Refused { index, field, error });
                None
            })
            .collect();
    }
    let day = store.time().await?.format("%Y-%m-%d").to_string();
    let keys = &store.keys;
    // By the partition of the key, so the key's guard and its delivery share a slot.
    let mut by_partition: BTreeMap<u16, Vec<StoredItem>> = BTreeMap::new();
    for (index, r) in &valid {
        let d = r.delivery(&day);
        let (request, hash) = r.stored();
        // A template may list the application channel too: its event comes with it.
        let app = r
            .template
            .as_ref()
            .and_then(|t| config.templates.get(t))
            .is_some_and(|t| t.channels.contains(&Channel::App));
        let event = app.then(|| r.for_event());
        let files = r.stored_attachments();
        by_partition.entry(keys.partition_of(d.home())).or_default().push((*index, d, request, hash, event, files));
    }
    let mut conn = store.waited_conn().await?;
    let limits = (config.retention().as_secs(), config.attachments.max_pending_bytes);
    for (p, list) in &by_partition {
        if list.iter().any(|item| item.5.is_some()) {
            crate::store::records::prune_pending_attachments(&mut conn, keys, *p).await?;
        }
        for chunk in list.chunks(500) {
            let calls: Vec<IngestItem<'_>> = chunk
                .iter()
                .map(|(_, d, request, hash, event, files)| IngestItem {
                    delivery: d,
                    hash,
                    request,
                    event: event.as_deref(),
                    attachments: files.as_ref().map(|(json, bytes)| (json.as_str(), *bytes)),
                })
                .collect();
            let done = scripts::ingest(&mut conn, keys, *p, &calls, limits).await?;
            for ((index, ..), ingested) in chunk.iter().zip(done) {
                let index = *index;
                results[index] = Some(match ingested {
                    Ingested::New(delivery) => ItemResult::Accepted { index, delivery },
                    Ingested::Duplicate(delivery) => ItemResult::Duplicate { index, delivery },
                    Ingested::Conflict(delivery) => ItemResult::Conflict {
                        index,
                        delivery,
                        error: "idempotency_key was used before for a different request".into(),
                    },
                    Ingested::Over(_) => ItemResult::RetryLater {
                        index,
                        field: "attachments".into(),
                        error: format!(
                            "attachments.max_pending_bytes ({}) of attachments wait to be sent in this partition: \
                             send the same request again later",
                            config.attachments.max_pending_bytes
                        ),
                    },
                });
            }
        }
        // Reported enqueued only once it would survive a failover (a retry is idempotent).
        store.durable(&mut conn, &keys.lane_stream(*p, Lane::Transactional)).await?;
    }
    Ok(results.into_iter().map(|r| r.expect("every item has a result")).collect())
}

/// For each item, whether the subscriber it names is in the registry (true for an
/// item that names an address).
async fn known_subscribers(store: &Store, items: &[(usize, Request)]) -> anyhow::Result<Vec<bool>> {
    let keys = &store.keys;
    // One pipeline per partition (a cluster takes a pipeline within one slot only).
    let mut by_partition: BTreeMap<u16, Vec<(usize, &str)>> = BTreeMap::new();
    for (i, (_, r)) in items.iter().enumerate() {
        if let Some(id) = &r.subscriber {
            by_partition.entry(keys.partition_of(id)).or_default().push((i, id));
        }
    }
    let mut known = vec![true; items.len()];
    let mut conn = store.conn().await?;
    for (p, list) in by_partition {
        let mut pipe = redis::pipe();
        for (_, id) in &list {
            pipe.exists(keys.subscriber(p, id));
        }
        let found: Vec<bool> = pipe.query_async(&mut conn).await?;
        for ((i, _), found) in list.into_iter().zip(found) {
            known[i] = found;
        }
    }
    Ok(known)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(item: serde_json::Value) -> Result<Request, FieldError> {
        Request::from_json(item, &Config::example())
    }

    #[test]
    fn attachments_are_checked_field_by_field_and_kept_apart() {
        let item = |attachments: serde_json::Value| json!({"idempotency_key": "k", "to": "a@b.example", "subject": "s", "text": "t", "attachments": attachments});
        let ok = check(item(json!([{"filename": "a.pdf", "content": "JVBERg==", "content_type": "application/pdf"}])));
        let r = ok.unwrap();
        let (request, _) = r.stored();
        assert!(!request.contains("JVBERg=="), "not in the request: {request}");
        assert_eq!(r.stored_attachments().map(|(_, bytes)| bytes), Some(8));
        let err = |a| {
            let e = check(item(a)).unwrap_err();
            (e.field, e.error)
        };
        assert_eq!(err(json!([{"filename": "a", "path": "https://x.example/a"}])).0, "attachments[0].path");
        assert_eq!(err(json!([{"filename": "a", "content": "not base64!"}])).0, "attachments[0].content");
        assert_eq!(err(json!([{"content": "JVBERg=="}])).0, "attachments[0].filename");
        assert_eq!(
            err(json!([{"filename": "a", "content": "JVBERg==", "content_type": "pdf"}])).0,
            "attachments[0].content_type"
        );
        assert_eq!(err(json!({"filename": "a"})).0, "attachments");
        let big = "A".repeat(10 * 1024 * 1024 + 4);
        let (field, error) = err(json!([{"filename": "a", "content": big}]));
        assert_eq!(field, "attachments");
        assert!(error.contains("10485764 bytes") && error.contains("(10485760)"), "{error}");
        // The same key with other files is another request.
        let other = check(item(json!([{"filename": "b.pdf", "content": "JVBERg=="}]))).unwrap();
        assert_ne!(r.stored().1, other.stored().1);
    }

    #[test]
    fn a_good_item_and_each_kind_of_bad_one() {
        let ok = check(json!({"idempotency_key": "r-1", "to": "a@b.example", "subject": "Hi", "text": "x"}));
        assert!(ok.is_ok(), "{ok:?}");
        let template = check(json!({"idempotency_key": "r-2", "subscriber": "u1", "template": "weekly_digest"}));
        assert!(template.is_ok(), "{template:?}");
        let field = |item| check(item).unwrap_err().field;
        assert_eq!(field(json!({"to": "a@b.example", "subject": "s", "text": "t"})), "idempotency_key");
        assert_eq!(
            field(json!({"idempotency_key": "a:b", "to": "a@b.example", "subject": "s", "text": "t"})),
            "idempotency_key"
        );
        assert_eq!(field(json!({"idempotency_key": "k", "to": "not an address", "subject": "s", "text": "t"})), "to");
        assert_eq!(field(json!({"idempotency_key": "k", "subject": "s", "text": "t"})), "to");
        assert_eq!(field(json!({"idempotency_key": "k", "to": "a@b.example", "subscriber": "u", "text": "t"})), "to");
        assert_eq!(field(json!({"idempotency_key": "k", "to": "a@b.example", "template": "nope"})), "template");
        assert_eq!(field(json!({"idempotency_key": "k", "to": "a@b.example", "text": "t"})), "subject");
        assert_eq!(field(json!({"idempotency_key": "k", "to": "a@b.example", "subject": "s"})), "html");
        assert_eq!(
            field(json!({"idempotency_key": "k", "to": "a@b.example", "subject": "s", "text": "t", "cc": "x"})),
            "cc"
        );
        assert_eq!(field(json!({"idempotency_key": "k", "to": 7, "subject": "s", "text": "t"})), "to");
        assert_eq!(
            field(json!({"idempotency_key": "k", "to": "a@b.example", "subject": "s", "text": "t", "data": "x"})),
            "data"
        );
        assert_eq!(check(json!([1])).unwrap_err().error, "each delivery must be a JSON object");
    }

    #[test]
    fn operator_mail_goes_only_to_the_operators() {
        let ok = check(json!({"idempotency_key": "lead-1", "to": "OnCall@acme.example", "template": "new_lead"}));
        assert!(ok.is_ok(), "{ok:?}");
        for item in [
            json!({"idempotency_key": "lead-2", "to": "ann@acme.example", "template": "new_lead"}),
            json!({"idempotency_key": "lead-3", "subscriber": "u1", "template": "new_lead"}),
        ] {
            let e = check(item).unwrap_err();
            assert_eq!(
                (e.field.as_str(), e.error.as_str()),
                ("to", "an operator template mails only the addresses of [operators] to")
            );
        }
    }

    #[test]
    fn an_error_never_echoes_the_address() {
        let e = check(json!({"idempotency_key": "k", "to": "secret person@x.example", "subject": "s", "text": "t"}));
        assert!(!format!("{e:?}").contains("secret"), "{e:?}");
    }

    #[test]
    fn the_stored_request_omits_the_key_and_its_hash_changes_with_the_request() {
        let a = check(json!({"idempotency_key": "k", "to": "a@b.example", "subject": "s", "text": "t"})).unwrap();
        let b = check(json!({"idempotency_key": "k", "to": "c@b.example", "subject": "s", "text": "t"})).unwrap();
        let (json, hash) = a.stored();
        assert!(!json.contains("idempotency_key"), "{json}");
        assert_ne!(hash, b.stored().1);
        assert_eq!(hash, a.clone().stored().1);
        assert_eq!(a.delivery("2026-11-30").id(), "transactional:2026-11-30:-:k");
        let back: Request = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to.as_deref(), Some("a@b.example"));
    }
}
