//! The team's suppression list, as Resend keeps it (its Suppressions API, in private
//! beta, in its documented shape): one list shared by all of the team's domains, each
//! entry an address (trimmed and lowercased, as Resend stores it) with its `origin`
//! (`bounce`, `complaint` or `manual`), kept oldest first. The routes it answers:
//! `GET /suppressions` (`limit` 1..=100, 20 when absent; `after` or `before` an id;
//! `origin` to keep one origin's),
//! `GET` and `DELETE /suppressions/{id_or_email}` (the address may be percent-encoded),
//! `POST /suppressions` (an address already listed keeps its entry, and its id is
//! answered), `POST /suppressions/batch/add` and `POST /suppressions/batch/remove`.
//!
//! A send to a listed address (any of `to`, `cc`, `bcc`) is accepted but not delivered:
//! its `last_event` is `suppressed`, and its `email.suppressed` webhook gives a reason
//! from the entry's origin: `previous_bounce`, `previous_complaint` or
//! `manually_suppressed`.
//!
//! Adding through the API posts a `suppression.added` webhook for each address newly
//! listed, removing posts `suppression.removed`. Seeding (`POST /_emulator/suppressions`,
//! `Emulator::suppress`) posts none: it stands for suppressions made before the webhook
//! was configured, or through another product.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

use serde_json::{Value, json};

use super::validate::{self, ApiError};
use super::webhooks;

/// `limit` of a list when none is given, and the most it may be (Resend's numbers).
const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 100;
/// Addresses (or ids) one batch request may name.
const MAX_BATCH: usize = 100;

/// Why an address is on the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuppressionOrigin {
    /// A permanent bounce.
    Bounce,
    /// A spam complaint.
    Complaint,
    /// Added by hand (the API, the dashboard).
    Manual,
}

impl SuppressionOrigin {
    /// As Resend writes it in the entry's `origin`.
    pub fn as_str(self) -> &'static str {
        match self {
            SuppressionOrigin::Bounce => "bounce",
            SuppressionOrigin::Complaint => "complaint",
            SuppressionOrigin::Manual => "manual",
        }
    }

    /// The `data.suppressed.reason` of an email not delivered for an entry of this origin.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            SuppressionOrigin::Bounce => "previous_bounce",
            SuppressionOrigin::Complaint => "previous_complaint",
            SuppressionOrigin::Manual => "manually_suppressed",
        }
    }
}

impl FromStr for SuppressionOrigin {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bounce" => Ok(SuppressionOrigin::Bounce),
            "complaint" => Ok(SuppressionOrigin::Complaint),
            "manual" => Ok(SuppressionOrigin::Manual),
            _ => Err("The `origin` must be one of `bounce`, `complaint`, `manual`.".to_string()),
        }
    }
}

/// One listed address, in the fields Resend's retrieve endpoint returns (`source_id`
/// is always null: the emulator does not say which email led to a listing).
struct Entry {
    id: String,
    email: String,
    origin: SuppressionOrigin,
    created_at: String,
}

impl Entry {
    /// The retrieve endpoint's object (list items are the same).
    fn to_json(&self) -> Value {
        json!({
            "object": "suppression",
            "id": self.id,
            "email": self.email,
            "origin": self.origin.as_str(),
            "source_id": null,
            "created_at": self.created_at,
        })
    }

    /// A signed webhook's body about this entry (`suppression.added`, `.removed`).
    fn event(&self, kind: &str) -> String {
        let data = json!({
            "id": self.id,
            "email": self.email,
            "origin": self.origin.as_str(),
            "source_id": null,
            "created_at": self.created_at,
        });
        webhooks::suppression_event(kind, data)
    }
}

/// An answer, and the webhook bodies the change it made leads to.
pub(crate) type Changed = (Value, Vec<String>);

/// The list: entries by insertion sequence (oldest first, stable under additions, so a
/// cursor walk visits each entry once), and the sequence of each id and address.
#[derive(Default)]
pub(crate) struct Suppressions {
    entries: BTreeMap<u64, Entry>,
    by_id: HashMap<String, u64>,
    by_email: HashMap<String, u64>,
    next: u64,
}

/// An address as Resend stores and compares it: trimmed, lowercased.
pub(crate) fn normalize(email: &str) -> String {
    email.trim().to_lowercase()
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(422, "validation_error", message)
}

fn not_found() -> ApiError {
    ApiError::new(404, "not_found", "Suppression not found")
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|_| ApiError::new(400, "validation_error", "Request body is not valid JSON."))
}

/// A request's address, normalized, if it is one.
fn address(value: Option<&Value>) -> Result<String, ApiError> {
    let raw = value.and_then(Value::as_str).ok_or_else(|| invalid("The `email` field is missing."))?;
    let email = normalize(raw);
    if validate::is_address(&email) {
        Ok(email)
    } else {
        Err(invalid("Invalid `email` field. The email address needs to follow the `email@example.com` format."))
    }
}

/// A batch's `field`: an array of 1..=100 strings.
fn batch_of<'a>(body: &'a Value, field: &str) -> Result<Vec<&'a str>, ApiError> {
    let items = body
        .get(field)
        .and_then(Value::as_array)
        .filter(|items| (1..=MAX_BATCH).contains(&items.len()))
        .ok_or_else(|| invalid(format!("The `{field}` field must hold between 1 and {MAX_BATCH} items.")))?;
    items.iter().map(|v| v.as_str().ok_or_else(|| invalid(format!("Each of `{field}` must be a string.")))).collect()
}

impl Suppressions {
    /// Addresses listed.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    fn seq_of(&self, id_or_email: &str) -> Option<u64> {
        // An id holds no `@` and an address does, so the two maps cannot both answer.
        self.by_id.get(id_or_email).or_else(|| self.by_email.get(&normalize(id_or_email))).copied()
    }

    /// Lists `email` (normalized and valid) as `origin`, unless it is listed already;
    /// the entry, and whether it is new.
    fn insert(&mut self, email: String, origin: SuppressionOrigin) -> (&Entry, bool) {
        let (seq, new) = match self.by_email.get(&email) {
            Some(&seq) => (seq, false),
            None => {
                let seq = self.next;
                self.next += 1;
                let id = crate::model::id::new_uuid();
                let created_at = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
                self.by_id.insert(id.clone(), seq);
                self.by_email.insert(email.clone(), seq);
                self.entries.insert(seq, Entry { id, email, origin, created_at });
                (seq, true)
            }
        };
        (&self.entries[&seq], new)
    }

    fn remove(&mut self, id_or_email: &str) -> Option<Entry> {
        let seq = self.seq_of(id_or_email)?;
        let entry = self.entries.remove(&seq)?;
        self.by_id.remove(&entry.id);
        self.by_email.remove(&entry.email);
        Some(entry)
    }

    /// Lists `email` as `origin` without a webhook (a listing made before the webhook
    /// was configured); the entry's id, the existing one if it was listed already.
    pub(crate) fn seed(&mut self, email: &str, origin: SuppressionOrigin) -> Result<String, ApiError> {
        let email = address(Some(&Value::from(email)))?;
        Ok(self.insert(email, origin).0.id.clone())
    }

    /// `POST /_emulator/suppressions`: `[{"email", "origin"?}, …]`, all checked before any
    /// is listed (400 for a bad one); `{"added": n}`, the addresses newly listed.
    pub(crate) fn seed_all(&mut self, body: &[u8]) -> Result<Value, ApiError> {
        let refused = |e: ApiError| ApiError::new(400, "validation_error", e.message);
        let items = match parse_body(body)? {
            Value::Array(items) => items,
            _ => return Err(refused(invalid("The body must be a JSON array of {\"email\", \"origin\"}."))),
        };
        let mut checked = Vec::with_capacity(items.len());
        for item in &items {
            let email = address(item.get("email")).map_err(refused)?;
            let origin = match item.get("origin") {
                None | Some(Value::Null) => SuppressionOrigin::Manual,
                Some(o) => o.as_str().unwrap_or("").parse().map_err(|m: String| refused(invalid(m)))?,
            };
            checked.push((email, origin));
        }
        let mut added = 0;
        for (email, origin) in checked {
            added += usize::from(self.insert(email, origin).1);
        }
        Ok(json!({ "added": added }))
    }

    /// Every entry as (address, origin), oldest first.
    pub(crate) fn all(&self) -> Vec<(String, String)> {
        self.entries.values().map(|e| (e.email.clone(), e.origin.as_str().to_string())).collect()
    }

    /// Why `email` (as sent) is not delivered: the reason of its first listed recipient
    /// (`to`, then `cc`, then `bcc`), or `None` when none is listed.
    pub(crate) fn reason_for(&self, email: &Value) -> Option<&'static str> {
        if self.by_email.is_empty() {
            // The common case, and the benchmarks': no address to lowercase and look up.
            return None;
        }
        ["to", "cc", "bcc"]
            .iter()
            .flat_map(|field| validate::addresses(email.get(*field)))
            .find_map(|a| self.by_email.get(&normalize(validate::bare_address(&a))))
            .map(|seq| self.entries[seq].origin.reason())
    }

    /// `GET /suppressions/{id_or_email}` (`key` already percent-decoded).
    pub(crate) fn get(&self, key: &str) -> Result<Value, ApiError> {
        let seq = self.seq_of(key).ok_or_else(not_found)?;
        Ok(self.entries[&seq].to_json())
    }

    /// `GET /suppressions?limit=&after=|before=&origin=`: oldest first.
    pub(crate) fn list(&self, query: Option<&str>) -> Result<Value, ApiError> {
        let mut limit = DEFAULT_LIMIT;
        let mut after = None;
        let mut before = None;
        let mut origin = None;
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match key.as_ref() {
                "origin" => origin = Some(value.parse::<SuppressionOrigin>().map_err(invalid)?),
                "limit" => {
                    limit = super::validate::list_limit(&value, MAX_LIMIT)?;
                }
                "after" | "before" => {
                    if after.is_some() || before.is_some() {
                        return Err(invalid("Use either `after` or `before`, not both."));
                    }
                    // A cursor is an id (not an address), as Resend's lists take.
                    let seq = self.by_id.get(value.as_ref()).copied();
                    let seq = seq.ok_or_else(|| invalid("The cursor is not a known suppression id."))?;
                    if key == "after" {
                        after = Some(seq);
                    } else {
                        before = Some(seq);
                    }
                }
                _ => {}
            }
        }
        // One more than the page, to know whether there are more.
        let kept = |e: &&Entry| origin.is_none_or(|o| e.origin == o);
        let mut page: Vec<&Entry> = match (after, before) {
            (Some(seq), _) => self.entries.range(seq + 1..).map(|(_, e)| e).filter(kept).take(limit + 1).collect(),
            (_, Some(seq)) => self.entries.range(..seq).rev().map(|(_, e)| e).filter(kept).take(limit + 1).collect(),
            _ => self.entries.values().filter(kept).take(limit + 1).collect(),
        };
        let has_more = page.len() > limit;
        page.truncate(limit);
        if before.is_some() {
            page.reverse();
        }
        let data: Vec<Value> = page.iter().map(|e| e.to_json()).collect();
        Ok(json!({ "object": "list", "has_more": has_more, "data": data }))
    }

    /// `POST /suppressions` `{"email"}`: `{object, id}`; origin `manual` when new.
    pub(crate) fn add(&mut self, body: &[u8]) -> Result<Changed, ApiError> {
        let email = address(parse_body(body)?.get("email"))?;
        let (entry, new) = self.insert(email, SuppressionOrigin::Manual);
        let events = if new { vec![entry.event("suppression.added")] } else { Vec::new() };
        Ok((json!({ "object": "suppression", "id": entry.id }), events))
    }

    /// `POST /suppressions/batch/add` `{"emails": [1..=100]}`: all checked before any is
    /// listed; `{"data": [{object, id}…]}` in the order given.
    pub(crate) fn batch_add(&mut self, body: &[u8]) -> Result<Changed, ApiError> {
        let body = parse_body(body)?;
        let emails = batch_of(&body, "emails")?
            .into_iter()
            .map(|e| address(Some(&Value::from(e))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut data = Vec::with_capacity(emails.len());
        let mut events = Vec::new();
        for email in emails {
            let (entry, new) = self.insert(email, SuppressionOrigin::Manual);
            data.push(json!({ "object": "suppression", "id": entry.id }));
            if new {
                events.push(entry.event("suppression.added"));
            }
        }
        Ok((json!({ "data": data }), events))
    }

    /// `DELETE /suppressions/{id_or_email}`: `{object, id, deleted: true}`.
    pub(crate) fn delete(&mut self, key: &str) -> Result<Changed, ApiError> {
        let entry = self.remove(key).ok_or_else(not_found)?;
        let answer = json!({ "object": "suppression", "id": entry.id, "deleted": true });
        Ok((answer, vec![entry.event("suppression.removed")]))
    }

    /// `POST /suppressions/batch/remove` with exactly one of `{"emails"}` and `{"ids"}`
    /// (1..=100): `{"data": [{object, id, deleted}…]}` for those that were listed.
    pub(crate) fn batch_remove(&mut self, body: &[u8]) -> Result<Changed, ApiError> {
        let body = parse_body(body)?;
        let keys = match (body.get("emails"), body.get("ids")) {
            (Some(_), None) => batch_of(&body, "emails")?,
            (None, Some(_)) => {
                let ids = batch_of(&body, "ids")?;
                if !ids.iter().all(|id| is_uuid(id)) {
                    return Err(invalid("Each of `ids` must be a UUID."));
                }
                ids
            }
            // A `null` for the other counts as giving it, as Resend refuses it.
            _ => return Err(invalid("Give exactly one of `emails` and `ids`.")),
        };
        let mut data = Vec::new();
        let mut events = Vec::new();
        for key in keys {
            if let Some(entry) = self.remove(key) {
                data.push(json!({ "object": "suppression", "id": entry.id, "deleted": true }));
                events.push(entry.event("suppression.removed"));
            }
        }
        Ok((json!({ "data": data }), events))
    }
}

/// Whether `s` is written as a UUID (`8-4-4-4-12` hex digits), as suppression ids are.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == '-' } else { c.is_ascii_hexdigit() })
}

/// A path segment with its `%XX` escapes decoded. A `+` stays a plus: it is common in
/// addresses, and only a query's form encoding writes a space so.
pub(crate) fn decode_segment(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(n: usize) -> Suppressions {
        let mut list = Suppressions::default();
        for i in 0..n {
            list.seed(&format!("user{i}@acme.example"), SuppressionOrigin::Bounce).unwrap();
        }
        list
    }

    fn emails(page: &Value) -> Vec<String> {
        page["data"].as_array().unwrap().iter().map(|e| e["email"].as_str().unwrap().to_string()).collect()
    }

    #[test]
    fn a_cursor_walk_visits_every_entry_once() {
        let list = listed(250);
        let mut seen = Vec::new();
        let mut pages = Vec::new();
        let mut query = "limit=100".to_string();
        loop {
            let page = list.list(Some(&query)).unwrap();
            assert_eq!(page["object"], "list");
            let data = page["data"].as_array().unwrap();
            seen.extend(emails(&page));
            pages.push((data.len(), page["has_more"].as_bool().unwrap()));
            if !page["has_more"].as_bool().unwrap() {
                break;
            }
            query = format!("limit=100&after={}", data.last().unwrap()["id"].as_str().unwrap());
        }
        assert_eq!(pages, vec![(100, true), (100, true), (50, false)]);
        let want: Vec<String> = (0..250).map(|i| format!("user{i}@acme.example")).collect();
        assert_eq!(seen, want, "oldest first, each once");
        assert_eq!(emails(&list.list(None).unwrap()).len(), DEFAULT_LIMIT);
    }

    #[test]
    fn entries_added_during_a_walk_come_at_its_end() {
        let mut list = listed(3);
        let first = list.list(Some("limit=2")).unwrap();
        let cursor = first["data"][1]["id"].as_str().unwrap().to_string();
        list.seed("late@acme.example", SuppressionOrigin::Manual).unwrap();
        let rest = list.list(Some(&format!("limit=2&after={cursor}"))).unwrap();
        assert_eq!(emails(&rest), vec!["user2@acme.example", "late@acme.example"]);
        assert_eq!(rest["has_more"], false);
        let manual = list.list(Some("origin=manual")).unwrap();
        assert_eq!(emails(&manual), vec!["late@acme.example"]);
        let bounces = list.list(Some(&format!("origin=bounce&limit=1&after={cursor}"))).unwrap();
        assert_eq!(
            (emails(&bounces), bounces["has_more"].as_bool()),
            (vec!["user2@acme.example".to_string()], Some(false))
        );
        let back = list.list(Some(&format!("limit=2&before={cursor}"))).unwrap();
        assert_eq!((emails(&back), back["has_more"].as_bool()), (vec!["user0@acme.example".to_string()], Some(false)));
    }

    #[test]
    fn bad_list_queries_are_validation_errors() {
        let list = listed(2);
        let id = list.list(None).unwrap()["data"][0]["id"].as_str().unwrap().to_string();
        for bad in [
            "limit=0".to_string(),
            "limit=101".into(),
            "limit=x".into(),
            "after=4ef9a417-02e9-4d39-ad75-9611e0fcc33c".into(),
            "after=user0@acme.example".into(),
            "origin=spam".into(),
            format!("after={id}&before={id}"),
        ] {
            let e = list.list(Some(&bad)).unwrap_err();
            assert_eq!((e.status.as_u16(), e.name), (422, "validation_error"), "{bad}");
        }
    }

    #[test]
    fn adding_twice_answers_the_same_id_and_one_event() {
        let mut list = Suppressions::default();
        let (first, events) = list.add(br#"{"email": "  Ann@Acme.Example "}"#).unwrap();
        assert_eq!(first["object"], "suppression");
        assert_eq!(events.len(), 1);
        let event: Value = serde_json::from_str(&events[0]).unwrap();
        assert_eq!(
            (event["type"].as_str(), event["data"]["email"].as_str()),
            (Some("suppression.added"), Some("ann@acme.example"))
        );
        assert_eq!(
            (event["data"]["origin"].as_str(), event["data"]["id"].as_str()),
            (Some("manual"), first["id"].as_str())
        );
        let (again, events) = list.add(br#"{"email": "ann@acme.example"}"#).unwrap();
        assert_eq!((again["id"].as_str(), events.len()), (first["id"].as_str(), 0));
        assert_eq!(list.all(), vec![("ann@acme.example".to_string(), "manual".to_string())]);
        let got = list.get("ANN@acme.example").unwrap();
        assert_eq!((got["origin"].as_str(), got["source_id"].is_null()), (Some("manual"), true));
        let created = got["created_at"].as_str().unwrap();
        assert!(created.ends_with('Z') && created.len() == "2026-10-06T23:47:56.678Z".len(), "{created}");
        for bad in [&br#"{}"#[..], br#"{"email": "nope"}"#, br#"{"email": 3}"#] {
            assert_eq!(list.add(bad).unwrap_err().status.as_u16(), 422);
        }
        assert_eq!(list.add(b"not json").unwrap_err().status.as_u16(), 400);
    }

    #[test]
    fn entries_are_removed_by_id_and_by_address() {
        let mut list = listed(3);
        let id = list.get("user0@acme.example").unwrap()["id"].as_str().unwrap().to_string();
        let (answer, events) = list.delete(&id).unwrap();
        assert_eq!(answer, json!({"object": "suppression", "id": id, "deleted": true}));
        let event: Value = serde_json::from_str(&events[0]).unwrap();
        assert_eq!(
            (event["type"].as_str(), event["data"]["origin"].as_str()),
            (Some("suppression.removed"), Some("bounce"))
        );
        assert!(list.delete("User1@Acme.Example").is_ok());
        for gone in [id.as_str(), "user0@acme.example", "user1@acme.example"] {
            let e = list.get(gone).unwrap_err();
            assert_eq!((e.status.as_u16(), e.name, e.message.as_str()), (404, "not_found", "Suppression not found"));
            assert_eq!(list.delete(gone).unwrap_err().status.as_u16(), 404);
        }
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn batches_add_and_remove_up_to_100() {
        let mut list = listed(1);
        let (answer, events) = list.batch_add(br#"{"emails": ["a@acme.example", "user0@acme.example"]}"#).unwrap();
        assert_eq!(answer["data"].as_array().unwrap().len(), 2);
        assert_eq!(events.len(), 1, "only the address newly listed");
        let too_many = json!({ "emails": (0..101).map(|i| format!("u{i}@acme.example")).collect::<Vec<_>>() });
        for bad in [json!({"emails": []}), too_many, json!({"emails": ["a@acme.example", "bad"]})] {
            assert_eq!(list.batch_add(bad.to_string().as_bytes()).unwrap_err().status.as_u16(), 422);
        }
        assert_eq!(list.len(), 2, "a refused batch lists nothing");
        let id = answer["data"][0]["id"].as_str().unwrap();
        let unknown = "4ef9a417-02e9-4d39-ad75-9611e0fcc33c";
        let (removed, events) = list.batch_remove(json!({ "ids": [id, unknown] }).to_string().as_bytes()).unwrap();
        assert_eq!((removed["data"].as_array().unwrap().len(), events.len()), (1, 1));
        assert_eq!(removed["data"][0], json!({"object": "suppression", "id": id, "deleted": true}));
        let (removed, _) = list.batch_remove(br#"{"emails": ["USER0@acme.example"]}"#).unwrap();
        assert_eq!(removed["data"].as_array().unwrap().len(), 1);
        for bad in [
            json!({}),
            json!({"emails": ["a@acme.example"], "ids": [unknown]}),
            json!({"emails": ["a@acme.example"], "ids": null}),
            json!({"ids": []}),
            json!({"ids": ["not-a-uuid"]}),
        ] {
            assert_eq!(list.batch_remove(bad.to_string().as_bytes()).unwrap_err().status.as_u16(), 422);
        }
        assert_eq!(list.len(), 0);
    }

    #[test]
    fn seeding_takes_an_origin_and_refuses_a_bad_one() {
        let mut list = Suppressions::default();
        let body = json!([{"email": "b@acme.example", "origin": "bounce"}, {"email": "c@acme.example", "origin": "complaint"},
            {"email": "m@acme.example"}, {"email": "B@acme.example", "origin": "complaint"}]);
        assert_eq!(list.seed_all(body.to_string().as_bytes()).unwrap(), json!({"added": 3}));
        let origins: Vec<String> = list.all().into_iter().map(|(_, o)| o).collect();
        assert_eq!(origins, vec!["bounce", "complaint", "manual"], "a listed address keeps its origin");
        for bad in [json!([{"email": "x@acme.example", "origin": "spam"}]), json!([{"origin": "bounce"}]), json!({})] {
            assert_eq!(list.seed_all(bad.to_string().as_bytes()).unwrap_err().status.as_u16(), 400, "{bad}");
        }
        assert_eq!(list.len(), 3);
    }

    #[test]
    fn a_send_is_suppressed_by_any_listed_recipient() {
        let mut list = Suppressions::default();
        assert_eq!(list.reason_for(&json!({"to": "ann@acme.example"})), None);
        list.seed("cc@acme.example", SuppressionOrigin::Complaint).unwrap();
        list.seed("ann@acme.example", SuppressionOrigin::Manual).unwrap();
        assert_eq!(list.reason_for(&json!({"to": ["Ann <ANN@acme.example>"]})), Some("manually_suppressed"));
        assert_eq!(
            list.reason_for(&json!({"to": "bob@acme.example", "cc": ["cc@acme.example"]})),
            Some("previous_complaint")
        );
        assert_eq!(list.reason_for(&json!({"to": "bob@acme.example"})), None);
        assert_eq!(SuppressionOrigin::Bounce.reason(), "previous_bounce");
    }

    #[test]
    fn path_segments_are_percent_decoded() {
        assert_eq!(decode_segment("ann%40acme.example"), "ann@acme.example");
        assert_eq!(decode_segment("a+b%2Bc@x.example"), "a+b+c@x.example");
        assert_eq!(decode_segment("bad%4"), "bad%4");
        assert_eq!(decode_segment("bad%zz%"), "bad%zz%");
    }
}
