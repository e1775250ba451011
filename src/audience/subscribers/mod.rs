//! The subscriber registry: the application's subscribers in Redis (written by
//! `mailstream subscribe` and `kick --audience`, readable with redis-cli), the
//! record's layout in one place, and [`resolve`], the one send-time reading of
//! a record into "send to this address" or "skip, because".
//!
//! Raw Redis here: the registry's own upserts and pages, one pipeline per batch of records (the
//! audience index, the address index and the record kept in step); the send path reads records only
//! through `store::records`.

pub mod push;

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::config::is_name;
use crate::model::names::names;
use crate::model::outcome::Reason;
use crate::store::Store;
use crate::store::conn::Conn;
use crate::store::records::SubscriberRow;

/// Target id given to a subscriber who names none.
const DEFAULT_TARGET: &str = "default";

/// A subscriber as `subscribe` and `kick --audience -` take it (one NDJSON line).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Subscriber {
    pub id: String,
    pub email: String,
    /// What the subscriber gets one delivery per period about (a team, a project).
    #[serde(default)]
    pub targets: Vec<String>,
    /// Has the plan that includes this mail (checked again when sending).
    #[serde(default = "crate::config::yes")]
    pub entitled: bool,
    /// Has not unsubscribed (checked again when sending).
    #[serde(default = "crate::config::yes")]
    pub subscribed: bool,
    /// Free-form values for the template (`subscriber.data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Map<String, serde_json::Value>>,
    /// An IANA zone (`Europe/Berlin`) for campaigns delivered at a local hour; a
    /// missing one means the campaign's zone. An unknown one is refused where it enters
    /// (one stored before that rule means the campaign's zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
}

impl Subscriber {
    /// Checks ids, address and zone; the message names the field, never the address.
    pub fn validate(&self) -> anyhow::Result<()> {
        let (id, email, zone) = (Some(self.id.as_str()), Some(self.email.as_str()), self.time_zone.as_deref());
        check_fields(id, email, &self.targets, zone).map_err(|(field, why)| anyhow::anyhow!("{field}: {why}"))
    }

    /// A made-up subscriber for the demo, tests and benchmarks: `user-000042` at
    /// `delivered+user-000042@resend.dev` (Resend's always-delivered test address).
    pub fn synthetic(i: u64) -> Subscriber {
        Subscriber {
            id: format!("user-{i:06}"),
            email: format!("delivered+user-{i:06}@resend.dev"),
            targets: vec![format!("team-{}", i % 97)],
            entitled: true,
            subscribed: true,
            data: None,
            time_zone: None,
        }
    }

    /// The targets, or the default one when none is named.
    pub fn targets_or_default(&self) -> Vec<String> {
        if self.targets.is_empty() { vec![DEFAULT_TARGET.to_string()] } else { self.targets.clone() }
    }
}

/// Checks the fields of a record that are given (flags give some): the first wrong one,
/// named as the record names it, and why, never echoing an address.
pub(crate) fn check_fields(
    id: Option<&str>,
    email: Option<&str>,
    targets: &[String],
    time_zone: Option<&str>,
) -> Result<(), (&'static str, String)> {
    if id.is_some_and(|id| !is_name(id)) {
        // The id is not quoted: an address mistaken for an id must not be echoed.
        return Err(("id", "a subscriber id must be 1-128 of letters, digits, '_', '-', '.'".into()));
    }
    if let Some(Err(why)) = email.map(crate::model::address::check) {
        return Err(("email", format!("the address {why}")));
    }
    if targets.iter().any(|t| !is_name(t)) {
        return Err(("targets", "a target id must be 1-128 of letters, digits, '_', '-', '.'".into()));
    }
    if let Some(zone) = time_zone.filter(|z| z.parse::<chrono_tz::Tz>().is_err()) {
        let zone: String = zone.chars().take(64).collect();
        return Err((
            "time_zone",
            format!("{zone:?} is not an IANA time zone this build knows (such as \"Europe/Berlin\")"),
        ));
    }
    Ok(())
}

/// Writes (upserts) subscribers into the registry, one pipeline per partition per
/// 1000 (a cluster takes pipelines within one slot only). Keeps the address index
/// (salted address hash → subscriber ids) that suppressions cascade through, and
/// marks a subscriber whose address is suppressed.
pub async fn upsert(store: &Store, subscribers: &[Subscriber]) -> anyhow::Result<()> {
    for s in subscribers {
        s.validate()?;
    }
    let mut by_partition: Vec<Vec<&Subscriber>> = vec![Vec::new(); usize::from(store.keys.partitions())];
    for s in subscribers {
        by_partition[usize::from(store.keys.partition_of(&s.id))].push(s);
    }
    let mut conn = store.waited_conn().await?;
    for (p, list) in by_partition.iter().enumerate() {
        for chunk in list.chunks(1000) {
            write_chunk(store, &mut conn, p as u16, chunk).await.context("writing subscribers")?;
        }
    }
    Ok(())
}

async fn write_chunk(store: &Store, conn: &mut Conn, p: u16, chunk: &[&Subscriber]) -> anyhow::Result<()> {
    let keys = &store.keys;
    // The addresses they had, to move them in the index.
    let mut pipe = redis::pipe();
    for s in chunk {
        pipe.hget(keys.subscriber(p, &s.id), field::EMAIL);
    }
    let before: Vec<Option<String>> = pipe.query_async(conn).await?;
    // The index and the suppressions live in each address's home partition: one
    // pipeline per home partition (a cluster takes a pipeline within one slot only),
    // each keeping the order of its commands.
    let mut by_home: BTreeMap<u16, (redis::Pipeline, Vec<usize>)> = BTreeMap::new();
    for (i, (s, old)) in chunk.iter().zip(&before).enumerate() {
        if let Some(old) = old.as_deref().filter(|old| !old.eq_ignore_ascii_case(&s.email)) {
            let old = keys.address(old);
            by_home.entry(old.partition).or_default().0.srem(keys.address_index(&old), &s.id).ignore();
        }
        let address = keys.address(&s.email);
        let (pipe, order) = by_home.entry(address.partition).or_default();
        pipe.sadd(keys.address_index(&address), &s.id).ignore();
        pipe.hget(keys.suppression(&address), "reason");
        order.push(i);
    }
    let mut suppressed: Vec<Option<String>> = vec![None; chunk.len()];
    for (pipe, order) in by_home.into_values() {
        let reasons: Vec<Option<String>> = pipe.query_async(conn).await?;
        for (i, reason) in order.into_iter().zip(reasons) {
            suppressed[i] = reason;
        }
    }
    let mut pipe = redis::pipe();
    for (s, reason) in chunk.iter().zip(&suppressed) {
        let key = keys.subscriber(p, &s.id);
        pipe.hset_multiple(
            &key,
            &[
                (field::EMAIL, s.email.clone()),
                (field::TARGETS, s.targets_or_default().join(",")),
                (field::ENTITLED, flag(s.entitled).to_string()),
                (field::SUBSCRIBED, flag(s.subscribed && reason.is_none()).to_string()),
            ],
        )
        .ignore();
        match &s.data {
            Some(data) => pipe.hset(&key, field::DATA, serde_json::to_string(data)?).ignore(),
            None => pipe.hdel(&key, field::DATA).ignore(),
        };
        match &s.time_zone {
            Some(zone) => pipe.hset(&key, field::TIME_ZONE, zone).ignore(),
            None => pipe.hdel(&key, field::TIME_ZONE).ignore(),
        };
        match reason {
            Some(reason) => pipe.hset(&key, field::SUPPRESSED, reason).ignore(),
            None => pipe.hdel(&key, field::SUPPRESSED).ignore(),
        };
        let targets = s.targets_or_default().join(",");
        match audience_entry(s.entitled, s.subscribed, reason.is_some(), &targets, s.time_zone.as_deref()) {
            Some(entry) => pipe.hset(keys.audience(p), &s.id, entry).ignore(),
            None => pipe.hdel(keys.audience(p), &s.id).ignore(),
        };
        pipe.sadd(keys.subscribers(p), &s.id).ignore();
    }
    let _: () = pipe.query_async(conn).await?;
    // A plan cancelled or a subscription ended must survive a failover once reported.
    store.durable(conn, &keys.subscribers(p)).await
}

/// A subscriber's entry in its partition's audience ([`crate::store::keys::Keys::audience`]):
/// its stored targets and zone, `targets|time_zone`, if it is entitled, subscribed and not
/// suppressed (else it has none).
fn audience_entry(
    entitled: bool,
    subscribed: bool,
    suppressed: bool,
    targets: &str,
    zone: Option<&str>,
) -> Option<String> {
    // Campaign opt-outs are kept apart (`off:<campaign>`): the audience is the rest of the rule.
    Unwanted::of(true, entitled, subscribed, suppressed, false)
        .is_none()
        .then(|| format!("{targets}|{}", zone.unwrap_or("")))
}

/// Reads an audience entry: (targets, zone).
pub(crate) fn read_audience_entry(entry: &str) -> (impl Iterator<Item = &str>, Option<&str>) {
    let (stored, zone) = entry.split_once('|').unwrap_or((entry, ""));
    (targets(Some(stored).filter(|t| !t.is_empty())), Some(zone).filter(|z| !z.is_empty()))
}

/// Builds every partition's audience and the campaigns' opt-out sets from the subscriber
/// records (`mailstream upgrade`, from layout 2), and starts any fan-out that was halfway
/// from the beginning again (its cursors were over the registry set: only duplicates
/// follow). Returns how many subscribers are in the audiences.
pub async fn build_audience(store: &Store) -> anyhow::Result<u64> {
    let keys = &store.keys;
    let mut conn = store.conn().await?;
    let mut wanted = 0;
    for p in 0..keys.partitions() {
        let mut cursor = 0u64;
        loop {
            let (next, ids) = registry_page(&mut conn, store, p, cursor).await?;
            let mut read = redis::pipe();
            for id in &ids {
                read.hgetall(keys.subscriber(p, id));
            }
            let records: Vec<BTreeMap<String, Vec<u8>>> = read.query_async(&mut conn).await?;
            let mut write = redis::pipe();
            for (id, r) in ids.iter().zip(records) {
                let text = |f: &str| r.get(f).and_then(|v| std::str::from_utf8(v).ok());
                let (entitled, subscribed) = (is_set(text(field::ENTITLED)), is_set(text(field::SUBSCRIBED)));
                let targets = text(field::TARGETS).unwrap_or(DEFAULT_TARGET);
                match audience_entry(
                    entitled,
                    subscribed,
                    r.contains_key(field::SUPPRESSED),
                    targets,
                    text(field::TIME_ZONE),
                ) {
                    Some(entry) => {
                        write.hset(keys.audience(p), id, entry).ignore();
                        wanted += 1;
                    }
                    None => {
                        write.hdel(keys.audience(p), id).ignore();
                    }
                }
                for campaign in r.keys().filter_map(|k| k.strip_prefix("off:")) {
                    write.sadd(keys.opted_out(p, campaign), id).ignore();
                }
            }
            let _: () = write.query_async(&mut conn).await?;
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    for key in store.scan(&keys.fanout("*", "*")).await? {
        crate::store::scripts::fanout_rewind(&mut conn, &key, keys.partitions()).await?;
    }
    Ok(wanted)
}

/// One SSCAN page of partition `p`'s registry from `cursor`: (next cursor, ids). An id
/// may come twice while the set grows.
pub(crate) async fn registry_page(
    conn: &mut Conn,
    store: &Store,
    p: u16,
    cursor: u64,
) -> anyhow::Result<(u64, Vec<String>)> {
    let page = redis::cmd("SSCAN")
        .arg(store.keys.subscribers(p))
        .arg(cursor)
        .arg("COUNT")
        .arg(1000)
        .query_async(conn)
        .await
        .context("scanning subscribers")?;
    Ok(page)
}

/// The first target of subscriber `id` (what a preview shows when none is named).
pub(crate) async fn first_target(store: &Store, id: &str) -> anyhow::Result<String> {
    let mut conn = store.conn().await?;
    let targets: Option<String> =
        conn.hget(store.keys.subscriber(store.keys.partition_of(id), id), field::TARGETS).await?;
    let Some(stored) = targets else { bail!("no subscriber {id:?} in the registry") };
    Ok(self::targets(Some(&stored)).next().unwrap_or(DEFAULT_TARGET).to_string())
}

/// The record's field names (the store's layout of it).
pub use crate::store::records::field;

/// How a yes/no field is stored.
fn flag(on: bool) -> &'static str {
    if on { "1" } else { "0" }
}

/// Whether a stored yes/no field says yes (anything but "1" is no).
pub(crate) fn is_set(value: Option<&str>) -> bool {
    value == Some("1")
}

names! {
/// Why a subscriber record does not want a campaign's mail now: the one rule, in the one
/// order, of the kick, the claim and the last gate (`unwanted` in `lua/prelude.lua`; a
/// test holds the two to the same answer for every record).
///
/// Its names are those of a kick's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unwanted {
    /// No record (removed since its id was seen).
    Missing = "missing",
    Suppressed = "suppressed",
    NotEntitled = "not_entitled",
    Unsubscribed = "unsubscribed",
    /// Subscribed, but this campaign turned off (one-click unsubscribe).
    OptedOut = "opted_out",
}
}

impl Unwanted {
    /// What a record says, by its fields: it exists, `entitled` and `subscribed` are
    /// `1`, `suppressed` and the campaign's opt-out field are set.
    pub fn of(exists: bool, entitled: bool, subscribed: bool, suppressed: bool, opted_out: bool) -> Option<Unwanted> {
        if !exists {
            Some(Unwanted::Missing)
        } else if suppressed {
            Some(Unwanted::Suppressed)
        } else if !entitled {
            Some(Unwanted::NotEntitled)
        } else if !subscribed {
            Some(Unwanted::Unsubscribed)
        } else if opted_out {
            Some(Unwanted::OptedOut)
        } else {
            None
        }
    }

    /// The reason a delivery is skipped for it.
    pub fn reason(self) -> Reason {
        match self {
            Unwanted::Missing => Reason::UnknownSubscriber,
            Unwanted::Suppressed => Reason::Suppressed,
            Unwanted::NotEntitled => Reason::NotEntitled,
            Unwanted::Unsubscribed | Unwanted::OptedOut => Reason::Unsubscribed,
        }
    }
}

/// Subscriber `id` as stored, if there is one.
pub async fn stored(store: &Store, id: &str) -> anyhow::Result<Option<Subscriber>> {
    let p = store.keys.partition_of(id);
    let mut conn = store.conn().await?;
    type RecordFields =
        (Option<String>, Option<String>, Option<String>, Option<String>, Option<String>, Option<String>);
    let fields = [field::EMAIL, field::TARGETS, field::ENTITLED, field::SUBSCRIBED, field::DATA, field::TIME_ZONE];
    let (email, stored_targets, entitled, subscribed, data, time_zone): RecordFields = redis::cmd("HMGET")
        .arg(store.keys.subscriber(p, id))
        .arg(&fields)
        .query_async(&mut conn)
        .await
        .context("reading the subscriber")?;
    let Some(email) = email else { return Ok(None) };
    let data = match data {
        Some(text) => Some(serde_json::from_str(&text).with_context(|| {
            format!("subscriber {id}: its stored data is not a JSON object; write the whole record with --replace")
        })?),
        None => None,
    };
    Ok(Some(Subscriber {
        id: id.to_string(),
        email,
        targets: targets(stored_targets.as_deref()).map(str::to_string).collect(),
        entitled: is_set(entitled.as_deref()),
        subscribed: is_set(subscribed.as_deref()),
        data,
        time_zone,
    }))
}

/// The stored targets of a record (comma-separated), or the default one.
pub fn targets(stored: Option<&str>) -> impl Iterator<Item = &str> {
    stored.unwrap_or(DEFAULT_TARGET).split(',').filter(|t| !t.is_empty())
}

/// What a subscriber record says about sending to it now.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// Send to this address, with this data for the template.
    Send { email: String, data: serde_json::Value },
    /// Not wanted any more.
    Skip(Reason),
    /// Cannot be sent correctly (a digest without its data would be a wrong email, not a lesser one).
    Fail(Reason),
}

/// Reads a subscriber record at send time: it exists, is not suppressed, is
/// entitled, is subscribed, and its address and data are well-formed.
pub fn resolve(row: SubscriberRow) -> Resolved {
    let (email, entitled, subscribed, suppressed, data, opted_out) = row;
    let set = |v: &Option<Vec<u8>>| v.as_deref() == Some(b"1");
    let unwanted =
        Unwanted::of(email.is_some(), set(&entitled), set(&subscribed), suppressed.is_some(), opted_out.is_some());
    if let Some(why) = unwanted {
        return Resolved::Skip(why.reason());
    }
    let Some(email) = email else { return Resolved::Skip(Reason::UnknownSubscriber) };
    let Ok(email) = String::from_utf8(email) else { return Resolved::Fail(Reason::InvalidSubscriberData) };
    if !crate::model::address::is_valid(&email) {
        return Resolved::Skip(Reason::InvalidAddress);
    }
    match data.map(|d| serde_json::from_slice::<serde_json::Value>(&d)) {
        None => Resolved::Send { email, data: serde_json::Value::Null },
        Some(Ok(data)) => Resolved::Send { email, data },
        Some(Err(_)) => Resolved::Fail(Reason::InvalidSubscriberData),
    }
}

/// Reads a subscriber record for a transactional send (a receipt, a reset): it
/// exists, is not suppressed, and its address and data are well-formed;
/// entitlement and subscriptions are about campaigns and do not apply.
pub(crate) fn resolve_transactional(row: SubscriberRow) -> Resolved {
    let (email, _, _, suppressed, data, _) = row;
    resolve((email, Some(b"1".to_vec()), Some(b"1".to_vec()), suppressed, data, None))
}

/// The fields of a record, in the order the docs give them.
const FIELDS: [&str; 7] = ["id", "email", "targets", "entitled", "subscribed", "data", "time_zone"];

/// One NDJSON line as a record: each field checked on its own, so the error names it.
pub(crate) fn record(line: &str, max_data_bytes: usize) -> Result<Subscriber, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("not a subscriber record ({})", e.classify_name()))?;
    let Some(object) = value.as_object() else { return Err("not a subscriber record (not a JSON object)".into()) };
    for (name, v) in object {
        let (ok, wanted) = match name.as_str() {
            "id" | "email" => (v.is_string(), "a string"),
            "time_zone" => (v.is_string() || v.is_null(), "a string"),
            "targets" => (v.as_array().is_some_and(|a| a.iter().all(|t| t.is_string())), "an array of strings"),
            "entitled" | "subscribed" => (v.is_boolean(), "true or false"),
            "data" => (v.is_object() || v.is_null(), "a JSON object"),
            _ => {
                let name: String = name.chars().take(64).collect();
                return Err(format!("unknown field {name:?}; expected one of {}", FIELDS.join(", ")));
            }
        };
        if !ok {
            return Err(format!("{name}: must be {wanted}"));
        }
    }
    if let Some(missing) = ["id", "email"].into_iter().find(|f| !object.contains_key(*f)) {
        return Err(format!("missing field {missing:?}"));
    }
    if let Some(data) = object.get("data").filter(|d| !d.is_null()) {
        let size = serde_json::to_vec(data).map_or(usize::MAX, |d| d.len());
        if size > max_data_bytes {
            return Err(format!("data: {size} bytes, more than subscribers.max_data_bytes ({max_data_bytes})"));
        }
    }
    let s: Subscriber =
        serde_json::from_value(value).map_err(|e| format!("not a subscriber record ({})", e.classify_name()))?;
    s.validate().map_err(|e| format!("{e:#}"))?;
    Ok(s)
}

/// serde_json errors quote input; this names only the kind of problem.
pub(crate) trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax => "invalid JSON",
            serde_json::error::Category::Data => "missing, unknown or mistyped field",
            serde_json::error::Category::Eof => "truncated JSON",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NDJSON records as the CLI's two passes read them (`cli/ndjson.rs`), one text at a
    /// time: a `data` of at most `max_data_bytes`; an error names the line and the field.
    fn parse_ndjson(text: &str, max_data_bytes: usize) -> Result<Vec<Subscriber>, crate::model::BadData> {
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let record =
                record(line, max_data_bytes).map_err(|why| crate::model::BadData(format!("line {}: {why}", n + 1)))?;
            out.push(record);
        }
        Ok(out)
    }

    #[test]
    fn ndjson_records_parse_with_defaults() {
        let text = "{\"id\":\"u1\",\"email\":\"a@b.example\"}\n\n{\"id\":\"u2\",\"email\":\"c@d.example\",\"targets\":[\"t1\",\"t2\"],\"entitled\":false}\n";
        let subs = parse_ndjson(text, 65_536).unwrap();
        assert_eq!(subs.len(), 2);
        assert!(subs[0].entitled && subs[0].subscribed);
        assert_eq!(subs[0].targets_or_default(), vec![DEFAULT_TARGET]);
        assert!(!subs[1].entitled);
    }

    #[test]
    fn resolve_reads_the_record_at_send_time() {
        let bytes = |s: &str| s.as_bytes().to_vec();
        let row = |email: Option<&str>, entitled: &str, subscribed: &str, data: Option<&str>| -> SubscriberRow {
            (email.map(bytes), Some(bytes(entitled)), Some(bytes(subscribed)), None, data.map(bytes), None)
        };
        assert_eq!(resolve((None, None, None, None, None, None)), Resolved::Skip(Reason::UnknownSubscriber));
        let mut opted_out = row(Some("a@b.example"), "1", "1", None);
        opted_out.5 = Some(bytes("1764460800000"));
        assert_eq!(resolve(opted_out), Resolved::Skip(Reason::Unsubscribed));
        let mut suppressed = row(Some("a@b.example"), "1", "1", None);
        suppressed.3 = Some(bytes("bounced"));
        assert_eq!(resolve(suppressed), Resolved::Skip(Reason::Suppressed));
        let mut garbled = row(Some("a@b.example"), "1", "1", None);
        garbled.0 = Some(vec![0xff, 0xfe, b'@']);
        assert_eq!(resolve(garbled), Resolved::Fail(Reason::InvalidSubscriberData));
        // A stored address that fails the address rule (written by hand, or before it).
        assert_eq!(resolve(row(Some("a b@b.example"), "1", "1", None)), Resolved::Skip(Reason::InvalidAddress));
        assert_eq!(resolve(row(Some("a@b.example"), "0", "1", None)), Resolved::Skip(Reason::NotEntitled));
        assert_eq!(resolve(row(Some("a@b.example"), "1", "0", None)), Resolved::Skip(Reason::Unsubscribed));
        assert_eq!(
            resolve(row(Some("a@b.example"), "1", "1", Some("{oops"))),
            Resolved::Fail(Reason::InvalidSubscriberData)
        );
        let Resolved::Send { email, data } = resolve(row(Some("a@b.example"), "1", "1", Some("{\"n\":1}"))) else {
            panic!("sendable")
        };
        assert_eq!((email.as_str(), data["n"].as_i64()), ("a@b.example", Some(1)));
    }

    #[test]
    fn bad_lines_are_named_without_their_content() {
        let parse = |text: &str| format!("{:#}", parse_ndjson(text, 100).unwrap_err());
        let msg = parse("{\"id\":\"u1\",\"email\":\"secret@person.example\",\"oops\":1}");
        assert!(msg.contains("line 1: unknown field \"oops\"; expected one of id, email"), "{msg}");
        assert!(!msg.contains("secret@person"), "{msg}");
        assert!(parse("{\"id\":\"u 1\",\"email\":\"a@b.example\"}").contains("id: a subscriber id"));
        let msg = parse("{\"id\":\"u1\",\"email\":\"not-an-address\"}");
        assert!(msg.contains("email: the address has no @"), "{msg}");
        let msg = parse(
            "{\"id\":\"u1\",\"email\":\"a@b.example\"}\n{\"id\":\"u2\",\"email\":\"a@b.example\",\"entitled\":\"secret\"}",
        );
        assert!(msg.contains("line 2: entitled: must be true or false") && !msg.contains("secret"), "{msg}");
        assert!(parse("{\"id\":\"u1\"}").contains("missing field \"email\""));
        let msg = parse("{\"id\":\"u1\",\"email\":\"a@b.example\",\"time_zone\":\"Mars/Olympus\"}");
        assert!(msg.contains("time_zone: \"Mars/Olympus\" is not an IANA time zone"), "{msg}");
        let big = format!("{{\"id\":\"u1\",\"email\":\"a@b.example\",\"data\":{{\"x\":\"{}\"}}}}", "y".repeat(200));
        assert!(parse(&big).contains("data: 208 bytes, more than subscribers.max_data_bytes (100)"), "{}", parse(&big));
    }
}
