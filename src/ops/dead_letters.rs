//! Dead letters, for the operator: deliveries that failed (or whose outcome is
//! unknown) are listed from their partitions' streams, with the error name and
//! the delivery's current state, and can be requeued by id. `failing` lists those that
//! still are (for the admin pages' failures by reason).
//!
//! Raw Redis here: the read-only listing of the dead-letter streams, newest first (a requeue goes
//! through `store::scripts`).

use anyhow::Context;
use redis::streams::StreamRangeReply;
use serde::Serialize;

use crate::model::outcome::Requeue;
use crate::model::work::DeliveryRef;
use crate::store::scripts;
use crate::store::{Store, records};

/// One listed entry (ids and names only: no addresses).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeadLetter {
    /// When it was recorded, milliseconds since the epoch (from the entry id).
    pub at_ms: u64,
    pub partition: u16,
    pub delivery: String,
    pub error: String,
    pub attempts: String,
    /// The delivery's state now (it may have been requeued and sent since).
    pub state_now: String,
}

/// Which stream to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterKind {
    Failed,
    OutcomeUnknown,
}

/// The newest `limit` entries of every partition, oldest first.
pub async fn list(store: &Store, kind: DeadLetterKind, limit: usize) -> anyhow::Result<Vec<DeadLetter>> {
    let mut conn = store.conn().await?;
    let mut out = Vec::new();
    for p in 0..store.keys.partitions() {
        let stream = match kind {
            DeadLetterKind::Failed => store.keys.dead(p),
            DeadLetterKind::OutcomeUnknown => store.keys.unknown(p),
        };
        let reply: StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(&stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("reading {stream}"))?;
        let mut pipe = redis::pipe();
        for e in &reply.ids {
            let id: String = e.get("delivery").unwrap_or_default();
            pipe.hget(store.keys.delivery(p, &id), "state");
        }
        // (a dead letter's delivery id names its record in the same partition)
        let states: Vec<Option<String>> =
            if reply.ids.is_empty() { Vec::new() } else { pipe.query_async(&mut conn).await? };
        for (e, state) in reply.ids.iter().zip(states) {
            out.push(DeadLetter {
                at_ms: e.id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0),
                partition: p,
                delivery: e.get("delivery").unwrap_or_default(),
                error: e.get("error").unwrap_or_default(),
                attempts: e.get("attempts").unwrap_or_default(),
                state_now: state.unwrap_or_else(|| "expired".into()),
            });
        }
    }
    out.sort_by_key(|d| d.at_ms);
    let skip = out.len().saturating_sub(limit);
    Ok(out.split_off(skip))
}

/// Requeues deliveries by id (`campaign:period:subscriber:target`) from the command line;
/// returns what became of each (an id that names no delivery is `Missing`).
pub async fn retry(store: &Store, ids: &[String], allow_unknown: bool) -> anyhow::Result<Vec<(String, Requeue)>> {
    retry_by(store, ids, allow_unknown, "command line").await
}

/// [`retry`], asked by `who` (kept in each requeued delivery's history).
pub async fn retry_by(
    store: &Store,
    ids: &[String],
    allow_unknown: bool,
    who: &str,
) -> anyhow::Result<Vec<(String, Requeue)>> {
    let mut conn = store.conn().await?;
    let mut out = Vec::new();
    for id in ids {
        let result = match DeliveryRef::parse(id) {
            Some(d) => {
                let p = store.keys.partition_of(d.home());
                let ids = [d.id()];
                let gone = records::deliveries_marked(&mut conn, &store.keys, p, &ids, "attachments_deleted").await?;
                if gone.first() == Some(&true) {
                    Requeue::FilesGone
                } else {
                    scripts::requeue(&mut conn, &store.keys, p, &d, (allow_unknown, who))
                        .await
                        .with_context(|| format!("requeue of {id}"))?
                }
            }
            None => Requeue::Missing,
        };
        out.push((id.clone(), result));
    }
    Ok(out)
}

/// A delivery that failed (or whose outcome is unknown) and still is: the dead letters
/// without those retried since (a retried one that failed again is listed once).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Failing {
    pub delivery: String,
    /// `failed` or `outcome_unknown`.
    pub status: String,
    /// The error name (`validation_error`, `timeout`, …).
    pub error: String,
    /// What Resend said of it (addresses masked), if anything.
    pub said: Option<String>,
    /// When it was recorded a dead letter last, milliseconds since the epoch.
    pub at_ms: u64,
}

/// Failing deliveries of one error name and status, for the admin pages.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FailureGroup {
    pub status: String,
    pub error: String,
    pub count: u64,
    /// What Resend said most recently of one of them (addresses masked), if anything.
    pub said: Option<String>,
    /// When the newest of them failed, milliseconds since the epoch.
    pub last_ms: u64,
    /// The campaign periods they are of (`campaign period`).
    pub periods: std::collections::BTreeSet<String>,
}

/// Dead-letter entries read per XRANGE.
const RANGE: usize = 5000;

/// Every delivery that failed or whose outcome is unknown and still is, from the
/// dead-letter streams (they keep the retention's entries), optionally only those of one
/// campaign period, newest first.
pub async fn failing(store: &Store, period: Option<(&str, &str)>) -> anyhow::Result<Vec<Failing>> {
    let mut conn = store.conn().await?;
    let mut out = Vec::new();
    for p in 0..store.keys.partitions() {
        // The newest entry of each delivery, with the state the stream stands for.
        let mut newest: std::collections::HashMap<String, (u64, &'static str, String)> = Default::default();
        for (stream, status) in [(store.keys.dead(p), "failed"), (store.keys.unknown(p), "outcome_unknown")] {
            let mut start = "-".to_string();
            loop {
                let reply: StreamRangeReply = redis::cmd("XRANGE")
                    .arg(&stream)
                    .arg(&start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(RANGE)
                    .query_async(&mut conn)
                    .await
                    .with_context(|| format!("reading {stream}"))?;
                for e in &reply.ids {
                    let id: String = e.get("delivery").unwrap_or_default();
                    let Some(d) = DeliveryRef::parse(&id) else { continue };
                    if period.is_some_and(|(c, per)| d.campaign != c || d.period != per) {
                        continue;
                    }
                    let at = e.id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0);
                    let error: String = e.get("error").unwrap_or_default();
                    newest.insert(id, (at, status, error));
                }
                match reply.ids.last() {
                    Some(last) if reply.ids.len() == RANGE => start = format!("({}", last.id),
                    _ => break,
                }
            }
        }
        let ids: Vec<String> = newest.keys().cloned().collect();
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(store.keys.delivery(p, id)).arg("state").arg("error").arg("error_message");
        }
        let fields: Vec<(Option<String>, Option<String>, Option<String>)> =
            if ids.is_empty() { Vec::new() } else { pipe.query_async(&mut conn).await? };
        for (id, (state, error, said)) in ids.into_iter().zip(fields) {
            let (at_ms, status, listed) = newest.remove(&id).expect("read above");
            // Requeued (and perhaps sent) since, or expired: no longer failing.
            if state.as_deref() != Some(status) {
                continue;
            }
            out.push(Failing { delivery: id, status: status.into(), error: error.unwrap_or(listed), said, at_ms });
        }
    }
    out.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then_with(|| a.delivery.cmp(&b.delivery)));
    Ok(out)
}

/// `failing` grouped by status and error name, the largest group first.
pub fn by_reason(failing: &[Failing]) -> Vec<FailureGroup> {
    let mut groups: Vec<FailureGroup> = Vec::new();
    // Newest first, so the first message seen of a group is its most recent.
    for f in failing {
        let i = match groups.iter().position(|g| g.status == f.status && g.error == f.error) {
            Some(i) => i,
            None => {
                groups.push(FailureGroup {
                    status: f.status.clone(),
                    error: f.error.clone(),
                    count: 0,
                    said: None,
                    last_ms: f.at_ms,
                    periods: Default::default(),
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[i];
        g.count += 1;
        if g.said.is_none() {
            g.said = f.said.clone();
        }
        if let Some(d) = DeliveryRef::parse(&f.delivery) {
            g.periods.insert(format!("{} {}", d.campaign, d.period));
        }
    }
    groups.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.status.cmp(&b.status)).then(a.error.cmp(&b.error)));
    groups
}
