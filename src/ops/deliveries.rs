//! The delivery log: "who got what, and why not?" from what Redis already holds.
//! Pages start with settled deliveries, newest first, from each partition's recent
//! settlements (`recent`: the newest 1,000 ids of the partition, scored by when they
//! settled, written by the script that settles them; see `newest`). Past the oldest
//! time every partition's index covers, the rest follows a partition at a time, in
//! Redis's order (`scan`): first the deliveries that keep a record (unsettled, failed,
//! outcome_unknown), by SCAN over their natural ids (`campaign:period:subscriber:target`,
//! so a filter on campaign, period or subscriber is a SCAN pattern; SCAN reads at most
//! `SCAN_COUNT` keys per step and never blocks Redis); then those settled compactly,
//! bucket by bucket of each period's settled history (`store::history`; a subscriber's
//! deliveries of a period share one bucket). Statuses and `since` are checked on each.
//! Addresses are shown masked.
//!
//! Raw Redis here: the listing's read-only pipelines over records, addresses and batches: what an
//! operator looks at, read as it is, never by the send path.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::model::BadValue;
use crate::model::outcome::DeliveryState;
use crate::model::work::DeliveryRef;
use crate::resend::error::mask;
use crate::store::{Store, history};

mod newest;
mod scan;
pub mod search;
pub mod waiting;

/// The statuses a delivery can be in (what `--status` accepts).
pub(crate) const STATUSES: [&str; 8] =
    ["pending", "processing", "sealed", "sent", "skipped", "failed", "outcome_unknown", "unknown"];

/// Which deliveries to list.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub campaign: Option<String>,
    pub period: Option<String>,
    pub subscriber: Option<String>,
    /// Any of these (empty: all).
    pub statuses: Vec<String>,
    /// Settled at or after this time (unsettled deliveries are left out).
    pub since: Option<DateTime<Utc>>,
    pub limit: usize,
}

/// One delivery as the log shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeliveryRow {
    pub id: String,
    pub campaign: String,
    pub period: String,
    pub subscriber: String,
    pub target: String,
    /// Where it reaches the subscriber (`email`, `app`).
    pub channel: crate::model::work::Channel,
    /// One of `STATUSES`; `unknown` for a state this version does not know.
    pub status: String,
    /// The error name (failed, outcome_unknown) or the reason (skipped).
    pub why: Option<String>,
    /// What the provider said of the request that failed it (addresses masked).
    pub said: Option<String>,
    pub provider_id: Option<String>,
    pub settled_at: Option<String>,
    /// Requests made for its batch, and times it was claimed.
    pub sends: u64,
    pub claims: u64,
    /// Provider events (delivered, opened, bounced, ...) and when they came.
    pub events: BTreeMap<String, String>,
    /// Why the provider failed the email after accepting it (`email.failed`'s reason), where
    /// the delivery keeps a record.
    pub provider_failed: Option<String>,
    /// The subscriber's address, masked (`a***@acme.example`).
    pub address: Option<String>,
    /// Operator mail whose sender Resend refused, sealed again from its template's
    /// fallback sender (sent so, or failed with the first refusal).
    pub used_fallback_sender: bool,
}

/// A page of rows and where the next one starts.
#[derive(Debug, Clone, Serialize)]
pub struct Page {
    pub rows: Vec<DeliveryRow>,
    /// Pass back as `cursor` for the next page; none after the last.
    pub next: Option<String>,
}

fn time(ms: &str) -> Option<String> {
    ms.parse::<i64>().ok().and_then(DateTime::from_timestamp_millis).map(|t| t.to_rfc3339())
}

/// A record's fields as a row; `None` unless the key names a delivery.
fn row(d: DeliveryRef, fields: &BTreeMap<String, String>, email: Option<&str>) -> DeliveryRow {
    let status = match DeliveryState::parse(fields.get("state").map_or("", String::as_str)) {
        DeliveryState::Unknown(_) => "unknown".to_string(),
        known => known.as_str().to_string(),
    };
    let get = |f: &str| fields.get(f).cloned();
    let number = |f: &str| fields.get(f).and_then(|v| v.parse().ok()).unwrap_or(0);
    // An application event is sent to no address.
    let email = email.filter(|_| d.channel == crate::model::work::Channel::Email);
    DeliveryRow {
        id: d.id(),
        channel: d.channel,
        campaign: d.campaign,
        period: d.period,
        subscriber: d.subscriber,
        target: d.target,
        status,
        why: get("error").or_else(|| get("reason")),
        said: get("error_message"),
        provider_id: get("provider_id"),
        settled_at: fields.get("settled_ms").and_then(|ms| time(ms)),
        sends: number("sends"),
        claims: number("claims"),
        events: fields.iter().filter_map(|(k, v)| Some((k.strip_prefix("ev_")?.to_string(), time(v)?))).collect(),
        provider_failed: get("provider_failed_reason"),
        address: email.map(mask),
        used_fallback_sender: fields.get("fallback").is_some_and(|f| f == "1"),
    }
}

fn wanted(filter: &Filter, fields: &BTreeMap<String, String>, r: &DeliveryRow) -> bool {
    let status_ok = filter.statuses.is_empty() || filter.statuses.contains(&r.status);
    let since_ok = filter.since.is_none_or(|since| {
        fields.get("settled_ms").and_then(|ms| ms.parse::<i64>().ok()).is_some_and(|ms| ms >= since.timestamp_millis())
    });
    status_ok && since_ok
}

/// The settlements a listing shows newest first: those its partitions' indexes hold
/// scored from `floor` (the oldest time every partition's index still covers) up to,
/// not including, `until` (when the listing began: what settles while an operator pages
/// through is left to the scan, not lost between the two parts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub floor: i64,
    pub until: i64,
}

impl Span {
    /// Nothing shown newest first.
    pub(crate) const NONE: Span = Span { floor: i64::MAX, until: i64::MIN };

    fn holds(&self, ms: f64) -> bool {
        ms >= self.floor as f64 && ms < self.until as f64
    }
}

/// Where a page starts. Settled deliveries come first, newest first, from each
/// partition's recent settlements (`recent`) within the listing's [`Span`]. Then the
/// rest by SCAN (unsettled deliveries, older ones, newer ones), leaving out what the
/// first part showed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ListCursor {
    /// Settled before (`ms`, `id`) in (time, id) order, within `span`.
    Newest { span: Span, ms: i64, id: String },
    /// A partition, SCAN's cursor in it, and how many matches of that SCAN step the
    /// previous page already showed.
    Scan { span: Span, partition: u16, scan: u64, skip: usize },
    /// A partition's settled history (after its records): the `campaign:period`, channel
    /// and bucket reached, and how many of that bucket's matches the previous page showed.
    History {
        span: Span,
        partition: u16,
        period: String,
        channel: crate::model::work::Channel,
        bucket: u32,
        skip: usize,
    },
}

impl ListCursor {
    fn parse(s: &str) -> anyhow::Result<ListCursor> {
        let bad = || anyhow::Error::new(BadValue(format!("not a cursor this log gave out: {s:?}")));
        let n = |v: &str| v.parse::<i64>().map_err(|_| bad());
        if let Some(rest) = s.strip_prefix("n.") {
            let [floor, until, ms, id] = rest.splitn(4, '.').collect::<Vec<_>>()[..] else { return Err(bad()) };
            DeliveryRef::parse(id).ok_or_else(bad)?;
            let span = Span { floor: n(floor)?, until: n(until)? };
            return Ok(ListCursor::Newest { span, ms: n(ms)?, id: id.to_string() });
        }
        if let Some(rest) = s.strip_prefix("h.") {
            let [floor, until, p, channel, bucket, skip, period] = rest.splitn(7, '.').collect::<Vec<_>>()[..] else {
                return Err(bad());
            };
            return Ok(ListCursor::History {
                span: Span { floor: n(floor)?, until: n(until)? },
                partition: p.parse().map_err(|_| bad())?,
                period: period.to_string(),
                channel: channel.parse().map_err(|_| bad())?,
                bucket: bucket.parse().map_err(|_| bad())?,
                skip: skip.parse().map_err(|_| bad())?,
            });
        }
        let rest = s.strip_prefix("s.").ok_or_else(bad)?;
        let [floor, until, p, scan, skip] = rest.split('.').collect::<Vec<_>>()[..] else { return Err(bad()) };
        Ok(ListCursor::Scan {
            span: Span { floor: n(floor)?, until: n(until)? },
            partition: p.parse().map_err(|_| bad())?,
            scan: scan.parse().map_err(|_| bad())?,
            skip: skip.parse().map_err(|_| bad())?,
        })
    }

    fn render(&self) -> String {
        match self {
            ListCursor::Newest { span, ms, id } => format!("n.{}.{}.{ms}.{id}", span.floor, span.until),
            ListCursor::Scan { span, partition, scan, skip } => {
                format!("s.{}.{}.{partition}.{scan}.{skip}", span.floor, span.until)
            }
            ListCursor::History { span, partition, period, channel, bucket, skip } => {
                format!("h.{}.{}.{partition}.{channel}.{bucket}.{skip}.{period}", span.floor, span.until)
            }
        }
    }
}

/// One page of deliveries matching `filter`, from `cursor` (none: the start).
pub async fn page(store: &Store, filter: &Filter, cursor: Option<&str>) -> anyhow::Result<Page> {
    if filter.limit < 1 {
        return Err(BadValue("the limit must be at least 1".into()).into());
    }
    if let Some(s) = filter.statuses.iter().find(|s| !STATUSES.contains(&s.as_str())) {
        return Err(BadValue(format!("no status {s:?}: one of {}", STATUSES.join(", "))).into());
    }
    let keys = &store.keys;
    let partitions: Vec<u16> = match &filter.subscriber {
        Some(sub) => vec![keys.partition_of(sub)],
        None => (0..keys.partitions()).collect(),
    };
    let mut conn = store.conn().await?;
    let mut at = match cursor {
        Some(c) => ListCursor::parse(c)?,
        None => {
            let floor = newest::floor(&mut conn, store, &partitions, filter).await?;
            let span = if floor == i64::MAX {
                Span::NONE
            } else {
                Span { floor, until: store.time().await?.timestamp_millis() }
            };
            ListCursor::Newest { span, ms: i64::MAX, id: String::new() }
        }
    };
    let mut rows = Vec::new();
    if let ListCursor::Newest { span, ms, id } = &at {
        let span = *span;
        if let Some((ms, id)) = newest::page(&mut conn, store, &partitions, filter, span, (*ms, id), &mut rows).await? {
            return Ok(Page { rows, next: Some(ListCursor::Newest { span, ms, id }.render()) });
        }
        at = ListCursor::Scan { span, partition: partitions[0], scan: 0, skip: 0 };
    }
    scan::page(&mut conn, store, &partitions, filter, at, rows).await
}

/// What delivery `d` keeps, as a record's fields: its record, or its compact entry in the
/// settled history (empty: neither).
pub async fn kept(store: &Store, d: &DeliveryRef) -> anyhow::Result<BTreeMap<String, String>> {
    let p = store.keys.partition_of(d.home());
    let mut conn = store.conn().await?;
    Ok(fields_of(&mut conn, store, p, std::slice::from_ref(d)).await?.pop().unwrap_or_default())
}

/// Every row `filter` wants, all pages of it (`filter.limit` rows a page): for reports
/// and tests over a whole period.
pub async fn every(store: &Store, filter: &Filter) -> anyhow::Result<Vec<DeliveryRow>> {
    let mut rows = Vec::new();
    let mut cursor = None;
    loop {
        let page = page(store, filter, cursor.as_deref()).await?;
        rows.extend(page.rows);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return Ok(rows),
        }
    }
}

/// The rows of `refs` (deliveries of partition `p`) that `filter` wants, aligned with
/// `refs` (`None`: gone, not wanted, or already shown newest first: in the partition's
/// recent settlements within `span`).
async fn read_rows(
    conn: &mut crate::store::Conn,
    store: &Store,
    p: u16,
    refs: Vec<DeliveryRef>,
    filter: &Filter,
    span: Span,
) -> anyhow::Result<Vec<Option<DeliveryRow>>> {
    let fields = fields_of(conn, store, p, &refs).await?;
    rows_of(conn, store, p, refs.into_iter().zip(fields).collect(), filter, span).await
}

/// What each of `refs` (deliveries of partition `p`) keeps, as a record's fields: its
/// record, or its compact entry in the settled history (empty: neither, it expired).
async fn fields_of(
    conn: &mut crate::store::Conn,
    store: &Store,
    p: u16,
    refs: &[DeliveryRef],
) -> anyhow::Result<Vec<BTreeMap<String, String>>> {
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for d in refs {
        pipe.cmd("HGETALL").arg(store.keys.delivery(p, &d.id()));
    }
    let mut fields: Vec<BTreeMap<String, String>> = pipe.query_async(conn).await?;
    let gone: Vec<usize> = (0..refs.len()).filter(|&i| fields[i].is_empty()).collect();
    let compact: Vec<DeliveryRef> = gone.iter().map(|&i| refs[i].clone()).collect();
    for (i, entry) in gone.into_iter().zip(history::lookup(conn, &store.keys, p, &compact).await?) {
        fields[i] = entry.map(|e| e.fields()).unwrap_or_default();
    }
    Ok(fields)
}

/// The rows of `items` (deliveries of partition `p` with what they keep) that `filter`
/// wants, aligned with them; see [`read_rows`].
async fn rows_of(
    conn: &mut crate::store::Conn,
    store: &Store,
    p: u16,
    items: Vec<(DeliveryRef, BTreeMap<String, String>)>,
    filter: &Filter,
    span: Span,
) -> anyhow::Result<Vec<Option<DeliveryRow>>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    // Whether each was shown newest first is asked only when something was.
    let asks_index = span != Span::NONE;
    let mut pipe = redis::pipe();
    for (d, _) in &items {
        pipe.cmd("HGET").arg(store.keys.subscriber(p, &d.subscriber)).arg("email");
        if asks_index {
            pipe.cmd("ZSCORE").arg(store.keys.recent(p)).arg(d.id());
        }
    }
    let replies: Vec<redis::Value> = pipe.query_async(conn).await?;
    let mut out = Vec::new();
    let mut sealed_into = Vec::new();
    for ((d, fields), reply) in items.into_iter().zip(replies.chunks(if asks_index { 2 } else { 1 })) {
        let registered: Option<String> = redis::from_redis_value_ref(&reply[0]).ok().flatten();
        let indexed: Option<f64> = reply.get(1).and_then(|v| redis::from_redis_value_ref(v).ok().flatten());
        let shown = indexed.is_some_and(|ms| span.holds(ms));
        // Nothing kept: it expired between finding and reading it.
        let r = (!fields.is_empty() && !shown)
            .then(|| row(d, &fields, inline_to(&fields).or(registered).as_deref()))
            .filter(|r| wanted(filter, &fields, r));
        sealed_into.push(r.as_ref().and_then(|r| sealed_batch(r, &fields)));
        out.push(r);
    }
    let sealed = out.iter_mut().zip(sealed_into).filter_map(|(r, b)| Some((r.as_mut()?, b?))).collect();
    batch_sends(conn, store, p, sealed).await?;
    Ok(out)
}

/// The batch a sealed delivery is in (its record gets the request count only when settled).
fn sealed_batch(r: &DeliveryRow, fields: &BTreeMap<String, String>) -> Option<String> {
    (r.status == "sealed").then(|| fields.get("batch").cloned()).flatten()
}

/// Sets each sealed row's requests from its batch record, which counts them as they are made.
async fn batch_sends(
    conn: &mut crate::store::Conn,
    store: &Store,
    p: u16,
    sealed: Vec<(&mut DeliveryRow, String)>,
) -> anyhow::Result<()> {
    if sealed.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for (_, batch) in &sealed {
        pipe.cmd("HGET").arg(store.keys.batch(p, batch)).arg("sends");
    }
    let sends: Vec<Option<u64>> = pipe.query_async(conn).await?;
    for ((row, _), n) in sealed.into_iter().zip(sends) {
        row.sends = n.unwrap_or(row.sends);
    }
    Ok(())
}

/// One delivery in full: its row, every field of its record (no field holds an
/// address), and what the record tells of its history, in time order.
#[derive(Debug, Clone, Serialize)]
pub struct Detail {
    pub row: DeliveryRow,
    pub fields: BTreeMap<String, String>,
    pub history: Vec<(String, String)>,
    /// A Web Push delivery: the subscriber's browser subscriptions now, masked (the push
    /// service's host and the subscription's id, never the endpoint), each marked when
    /// this delivery reached it.
    pub browsers: Vec<String>,
    /// What it waits for while not settled (filled by [`waiting::of`], which needs the
    /// delivery settings).
    pub waiting: Option<waiting::WaitingStory>,
}

/// The inline address of a transactional request (`to`), if the record holds one.
fn inline_to(fields: &BTreeMap<String, String>) -> Option<String> {
    crate::audience::ingest::Request::from_stored(fields.get("request")?)?.to
}

/// The delivery `id`, or `None` if there is no such record (never enqueued, or expired).
pub async fn get(store: &Store, id: &str) -> anyhow::Result<Option<Detail>> {
    let d = DeliveryRef::parse(id).ok_or_else(|| anyhow::anyhow!("not a delivery id: {id:?}"))?;
    let p = store.keys.partition_of(d.home());
    let mut conn = store.conn().await?;
    let mut fields = fields_of(&mut conn, store, p, std::slice::from_ref(&d)).await?.pop().unwrap_or_default();
    if fields.is_empty() {
        return Ok(None);
    }
    // A transactional request keeps its inline address: shown masked, like every address.
    let request = fields.get("request").map(String::as_str).and_then(crate::audience::ingest::Request::from_stored);
    let email: Option<String> = match &request {
        Some(r) if r.to.is_some() => r.to.clone(),
        _ => {
            let sp = store.keys.partition_of(&d.subscriber);
            redis::cmd("HGET").arg(store.keys.subscriber(sp, &d.subscriber)).arg("email").query_async(&mut conn).await?
        }
    };
    if let Some(mut r) = request {
        r.to = r.to.as_deref().map(mask);
        fields.insert("request".into(), serde_json::to_string(&r).unwrap_or_default());
    }
    let (push, subscriber) = (d.channel == crate::model::work::Channel::Push, d.subscriber.clone());
    let mut row = row(d, &fields, email.as_deref());
    // Its attempts and the operators' actions: the record's, and its batch's while sealed
    // (read with the batch's request count, in one look at the batch).
    let mut told = fields.remove("history").unwrap_or_default();
    if let Some(batch) = sealed_batch(&row, &fields) {
        let (sends, attempts): (Option<u64>, Option<String>) = redis::cmd("HMGET")
            .arg(store.keys.batch(p, &batch))
            .arg("sends")
            .arg("attempts")
            .query_async(&mut conn)
            .await?;
        row.sends = sends.unwrap_or(row.sends);
        told = format!("{told}\n{}", attempts.unwrap_or_default());
    }
    let mut history: Vec<(i64, String)> = told.lines().filter_map(history_line).collect();
    let ms = |f: &str| fields.get(f).and_then(|v| v.parse::<i64>().ok());
    if let Some(at) = ms("lease_until") {
        history.push((at, format!("claimed ({} claims); lease until", row.claims)));
    }
    // A verdict in the history says it already.
    if let Some(at) = ms("settled_ms").filter(|at| !history.iter().any(|(t, _)| t == at)) {
        let why = row.why.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
        history.push((at, format!("{} after {} request(s){why}", row.status, row.sends)));
    }
    for (k, v) in &fields {
        if let (Some(kind), Ok(at)) = (k.strip_prefix("ev_"), v.parse::<i64>()) {
            let reason = match (kind, &row.provider_failed) {
                ("failed", Some(reason)) => format!(" ({reason}), after the provider accepted it"),
                _ => String::new(),
            };
            history.push((at, format!("provider event: {kind}{reason}")));
        }
    }
    // By time; lines of one millisecond in the order they were written.
    history.sort_by_key(|(at, _)| *at);
    let history = history
        .into_iter()
        .map(|(at, what)| (DateTime::from_timestamp_millis(at).map(|t| t.to_rfc3339()).unwrap_or_default(), what))
        .collect();
    let mut browsers = Vec::new();
    if push {
        let sp = store.keys.partition_of(&subscriber);
        for (sid, s) in crate::audience::subscribers::push::list(&mut conn, &store.keys, sp, &subscriber).await? {
            let reached = fields.contains_key(&crate::audience::subscribers::push::sent_field(&sid));
            browsers.push(format!("{}{}", s.masked(), if reached { ": reached" } else { "" }));
        }
    }
    Ok(Some(Detail { row, fields, history, browsers, waiting: None }))
}

/// A line of a record's or a batch's history (prelude.lua's `history_line`:
/// `ms\tkind\toutcome\tname\tsaid`) as the delivery page says it.
fn history_line(line: &str) -> Option<(i64, String)> {
    let mut parts = line.splitn(5, '\t');
    let at = parts.next()?.parse().ok()?;
    let (kind, outcome, name) = (parts.next()?, parts.next()?, parts.next()?);
    let said = parts.next().filter(|s| !s.is_empty()).map(|s| format!("; Resend said: {s}")).unwrap_or_default();
    let what = match (kind, outcome) {
        ("operator", "retry") => format!("retried by {name}"),
        ("attempt", "retry") => format!("request failed: {name}, retried{said}"),
        ("attempt", verdict) => format!("{}: {name}{said}", verdict.replace('_', " ")),
        _ => return None,
    };
    Some((at, what))
}

/// `2h`, `30m`, `7d`, `90s` before `now`, or an RFC 3339 time.
pub(crate) fn parse_since(s: &str, now: DateTime<Utc>) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let (n, unit) = s.split_at(s.len().saturating_sub(1));
    let n: i64 = n.parse().map_err(|_| BadValue(format!("--since: an RFC 3339 time or a span like 2h (got {s:?})")))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => anyhow::bail!("--since: a span ends in s, m, h or d (got {s:?})"),
    };
    Ok(now - chrono::Duration::seconds(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_masked_and_filters_are_literal() {
        assert_eq!(mask("ann@acme.example"), "a***@acme.example");
        assert_eq!(mask("broken"), "***");
        assert_eq!(scan::glob_literal("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn history_lines_read_as_sentences() {
        let retry = history_line("1700000000000\tattempt\tretry\trate_limit_exceeded\tToo many requests");
        assert_eq!(
            retry,
            Some((
                1_700_000_000_000,
                "request failed: rate_limit_exceeded, retried; Resend said: Too many requests".into()
            ))
        );
        let failed = history_line("2\tattempt\toutcome_unknown\ttimeout\t");
        assert_eq!(failed, Some((2, "outcome unknown: timeout".into())));
        assert_eq!(history_line("3\toperator\tretry\tadmin ops\t"), Some((3, "retried by admin ops".into())));
        assert_eq!(history_line("not a line"), None);
        assert_eq!(history_line("4\tsomething\tnew\tx\t"), None, "a kind of a later version is left out");
    }

    #[test]
    fn an_unknown_state_is_shown_as_unknown() {
        let d = DeliveryRef::new("c", "p", "s", "t");
        let fields: BTreeMap<String, String> =
            [("state", "from_the_future"), ("ev_delivered", "1700000000000"), ("sends", "x")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let r = row(d, &fields, Some("bob@b.example"));
        assert_eq!((r.status.as_str(), r.sends, r.address.as_deref()), ("unknown", 0, Some("b***@b.example")));
        assert_eq!(r.events.keys().collect::<Vec<_>>(), ["delivered"]);
    }

    #[test]
    fn cursors_and_spans_round_trip() {
        let span = Span { floor: 1_700_000_000_000, until: 1_700_000_500_000 };
        let c = ListCursor::Scan { span, partition: 3, scan: 12345, skip: 7 };
        assert_eq!(ListCursor::parse(&c.render()).unwrap(), c);
        let n = ListCursor::Newest { span: Span::NONE, ms: 2, id: "c:2026-W48:u.1:t.2".into() };
        assert_eq!(ListCursor::parse(&n.render()).unwrap(), n);
        let channel = crate::model::work::Channel::App;
        let h = ListCursor::History { span, partition: 1, period: "c.1:2026-W48".into(), channel, bucket: 9, skip: 3 };
        assert_eq!(ListCursor::parse(&h.render()).unwrap(), h);
        for bad in ["3-x-1", "", "s.1.2.3.4", "n.1.2.3.not-an-id", "s.1.2.x.3.4", "h.1.2.3.fax.1.0.c:p", "h.1.2.3"] {
            assert!(ListCursor::parse(bad).is_err(), "{bad}");
        }
        let now = DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z").unwrap().with_timezone(&Utc);
        assert_eq!(parse_since("2h", now).unwrap().to_rfc3339(), "2026-11-30T10:00:00+00:00");
        assert_eq!(parse_since("2026-11-29T00:00:00Z", now).unwrap().to_rfc3339(), "2026-11-29T00:00:00+00:00");
        assert!(parse_since("2w", now).is_err() && parse_since("h", now).is_err());
    }
}
