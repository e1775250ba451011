//! The audience: a subscriber registry in Redis (written by `mailstream
//! subscribe`, readable with redis-cli) and the kick that fans a campaign
//! period out over it, or over NDJSON records, through enqueue.lua.

use std::collections::HashSet;

use anyhow::{Context, bail};
use chrono::Utc;
use serde::{Deserialize, Serialize};

use crate::config::{CampaignConfig, Config, is_name};
use crate::id::new_id;
use crate::scripts::{self, NewDelivery};
use crate::store::Store;

/// Target id given to a subscriber who names none.
pub const DEFAULT_TARGET: &str = "default";
/// Deliveries per enqueue.lua call: large enough to amortize the round trip,
/// small enough that one call never blocks Redis for long.
const ENQUEUE_CHUNK: usize = 500;

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
    #[serde(default = "yes")]
    pub entitled: bool,
    /// Has not unsubscribed (checked again when sending).
    #[serde(default = "yes")]
    pub subscribed: bool,
    /// Free-form values for the template (`subscriber.data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Map<String, serde_json::Value>>,
}

fn yes() -> bool {
    true
}

impl Subscriber {
    /// Checks ids and address; the message names the field, never the address.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !is_name(&self.id) {
            bail!("subscriber id must be 1-128 of letters, digits, '_', '-', '.' (got {:?})", self.id);
        }
        let ok_email = self.email.len() <= 320
            && self.email.split_once('@').is_some_and(|(l, d)| !l.is_empty() && d.contains('.'))
            && !self.email.contains(|c: char| c.is_whitespace() || c == '<' || c == '>' || c == ',');
        if !ok_email {
            bail!("subscriber {}: email is not a plain address", self.id);
        }
        if let Some(t) = self.targets.iter().find(|t| !is_name(t)) {
            bail!("subscriber {}: target id must be 1-128 of letters, digits, '_', '-', '.' (got {t:?})", self.id);
        }
        Ok(())
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
        }
    }

    fn targets_or_default(&self) -> Vec<String> {
        if self.targets.is_empty() { vec![DEFAULT_TARGET.to_string()] } else { self.targets.clone() }
    }
}

/// Writes (upserts) subscribers into the registry, pipelined.
pub async fn upsert(store: &Store, subscribers: &[Subscriber]) -> anyhow::Result<()> {
    for s in subscribers {
        s.validate()?;
    }
    let mut conn = store.conn().await?;
    for chunk in subscribers.chunks(1000) {
        let mut pipe = redis::pipe();
        for s in chunk {
            let p = store.keys.partition_of(&s.id);
            let key = store.keys.subscriber(p, &s.id);
            pipe.hset_multiple(
                &key,
                &[
                    ("email", s.email.clone()),
                    ("targets", s.targets_or_default().join(",")),
                    ("entitled", u8::from(s.entitled).to_string()),
                    ("subscribed", u8::from(s.subscribed).to_string()),
                ],
            )
            .ignore();
            match &s.data {
                Some(data) => pipe.hset(&key, "data", serde_json::to_string(data)?).ignore(),
                None => pipe.hdel(&key, "data").ignore(),
            };
            pipe.sadd(store.keys.subscribers(p), &s.id).ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.context("writing subscribers")?;
    }
    Ok(())
}

/// What a kick did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KickReport {
    pub campaign: String,
    pub period: String,
    /// Deliveries enqueued by this kick.
    pub new: u64,
    /// Deliveries that were already enqueued for this period.
    pub duplicates: u64,
    /// Subscribers skipped because they were not entitled or had unsubscribed.
    pub not_eligible: u64,
}

/// The period a kick is for: `--period` if given (checked), else the current one.
pub fn period_for(campaign: &CampaignConfig, explicit: Option<&str>) -> anyhow::Result<String> {
    match explicit {
        Some(p) if campaign.period.is_valid(p) => Ok(p.to_string()),
        Some(p) => bail!(
            "--period {p:?} is not a {} period (expected e.g. {})",
            campaign.period.name(),
            campaign.period.period_at(Utc::now(), campaign.tz())
        ),
        None => Ok(campaign.period.period_at(Utc::now(), campaign.tz())),
    }
}

/// Fans `campaign` out over the whole registry for `period`.
pub async fn kick_registry(store: &Store, config: &Config, campaign: &str, period: &str) -> anyhow::Result<KickReport> {
    let retention = config.retention().as_secs();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..store.keys.partitions() {
        let (store, campaign, period) = (store.clone(), campaign.to_string(), period.to_string());
        tasks.spawn(async move { kick_partition(&store, p, &campaign, &period, retention).await });
    }
    let mut report = KickReport { campaign: campaign.to_string(), period: period.to_string(), ..Default::default() };
    while let Some(done) = tasks.join_next().await {
        let part = done.context("kick task panicked")??;
        report.new += part.new;
        report.duplicates += part.duplicates;
        report.not_eligible += part.not_eligible;
    }
    Ok(report)
}

async fn kick_partition(
    store: &Store,
    p: u16,
    campaign: &str,
    period: &str,
    retention: u64,
) -> anyhow::Result<KickReport> {
    let mut conn = store.conn().await?;
    let mut report = KickReport::default();
    let mut seen = HashSet::new();
    let mut cursor: u64 = 0;
    let mut pending: Vec<NewDelivery> = Vec::new();
    loop {
        let (next, ids): (u64, Vec<String>) = redis::cmd("SSCAN")
            .arg(store.keys.subscribers(p))
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .context("scanning subscribers")?;
        // SSCAN may return an id twice while the set rehashes.
        let ids: Vec<String> = ids.into_iter().filter(|id| seen.insert(id.clone())).collect();
        cursor = next;
        if ids.is_empty() {
            // SSCAN may answer a page with no ids and a cursor to go on with.
            if cursor == 0 {
                break;
            }
            continue;
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(store.keys.subscriber(p, id)).arg(&["targets", "entitled", "subscribed"]);
        }
        let rows: Vec<(Option<String>, Option<String>, Option<String>)> = pipe.query_async(&mut conn).await?;
        for (id, (targets, entitled, subscribed)) in ids.iter().zip(rows) {
            // Eligibility is checked here to keep non-paying users out of the streams,
            // and checked again at send time, which is what guarantees it.
            if entitled.as_deref() != Some("1") || subscribed.as_deref() != Some("1") {
                report.not_eligible += 1;
                continue;
            }
            for target in targets.as_deref().unwrap_or(DEFAULT_TARGET).split(',').filter(|t| !t.is_empty()) {
                pending.push(NewDelivery { id: new_id(), subscriber: id.clone(), target: target.to_string() });
            }
        }
        while pending.len() >= ENQUEUE_CHUNK {
            let rest = pending.split_off(ENQUEUE_CHUNK);
            enqueue_chunk(&mut conn, store, p, campaign, period, &pending, retention, &mut report).await?;
            pending = rest;
        }
        if cursor == 0 {
            break;
        }
    }
    enqueue_chunk(&mut conn, store, p, campaign, period, &pending, retention, &mut report).await?;
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
async fn enqueue_chunk(
    conn: &mut deadpool_redis::Connection,
    store: &Store,
    p: u16,
    campaign: &str,
    period: &str,
    items: &[NewDelivery],
    retention: u64,
    report: &mut KickReport,
) -> anyhow::Result<()> {
    let added =
        scripts::enqueue(conn, &store.keys, p, campaign, period, items, retention).await.context("enqueue.lua")?;
    let new = added.iter().filter(|&&a| a).count() as u64;
    report.new += new;
    report.duplicates += added.len() as u64 - new;
    Ok(())
}

/// Upserts NDJSON subscriber records, then enqueues `campaign` for the eligible ones only.
pub async fn kick_list(
    store: &Store,
    config: &Config,
    campaign: &str,
    period: &str,
    subscribers: &[Subscriber],
) -> anyhow::Result<KickReport> {
    upsert(store, subscribers).await?;
    let mut by_partition: Vec<Vec<NewDelivery>> = vec![Vec::new(); usize::from(store.keys.partitions())];
    let mut report = KickReport { campaign: campaign.to_string(), period: period.to_string(), ..Default::default() };
    for s in subscribers {
        if !(s.entitled && s.subscribed) {
            report.not_eligible += 1;
            continue;
        }
        let p = store.keys.partition_of(&s.id);
        for target in s.targets_or_default() {
            by_partition[usize::from(p)].push(NewDelivery { id: new_id(), subscriber: s.id.clone(), target });
        }
    }
    let mut conn = store.conn().await?;
    let retention = config.retention().as_secs();
    for (p, items) in by_partition.iter().enumerate() {
        for chunk in items.chunks(ENQUEUE_CHUNK) {
            enqueue_chunk(&mut conn, store, p as u16, campaign, period, chunk, retention, &mut report).await?;
        }
    }
    Ok(report)
}

/// Parses NDJSON subscriber records; errors name the line, never its content.
pub fn parse_ndjson(text: &str) -> anyhow::Result<Vec<Subscriber>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let s: Subscriber = serde_json::from_str(line)
            .map_err(|e| anyhow::anyhow!("line {}: not a subscriber record ({})", n + 1, e.classify_name()))?;
        s.validate().with_context(|| format!("line {}", n + 1))?;
        out.push(s);
    }
    Ok(out)
}

/// serde_json errors quote input; this names only the kind of problem.
trait ClassifyName {
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

    #[test]
    fn ndjson_records_parse_with_defaults() {
        let text = "{\"id\":\"u1\",\"email\":\"a@b.example\"}\n\n{\"id\":\"u2\",\"email\":\"c@d.example\",\"targets\":[\"t1\",\"t2\"],\"entitled\":false}\n";
        let subs = parse_ndjson(text).unwrap();
        assert_eq!(subs.len(), 2);
        assert!(subs[0].entitled && subs[0].subscribed);
        assert_eq!(subs[0].targets_or_default(), vec![DEFAULT_TARGET]);
        assert!(!subs[1].entitled);
    }

    #[test]
    fn bad_lines_are_named_without_their_content() {
        let err = parse_ndjson("{\"id\":\"u1\",\"email\":\"secret@person.example\",\"oops\":1}").unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("line 1") && !msg.contains("secret@person"), "{msg}");
        let err = parse_ndjson("{\"id\":\"u 1\",\"email\":\"a@b.example\"}").unwrap_err();
        assert!(format!("{err:#}").contains("subscriber id"));
        let err = parse_ndjson("{\"id\":\"u1\",\"email\":\"not-an-address\"}").unwrap_err();
        assert!(format!("{err:#}").contains("email is not a plain address"));
    }
}
