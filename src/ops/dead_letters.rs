//! Dead letters, for the operator: deliveries that failed (or whose outcome is
//! unknown) are listed from their partitions' streams, with the error name and
//! the delivery's current state, and can be requeued by id.
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

/// Requeues deliveries by id (`campaign:period:subscriber:target`); returns what
/// became of each (an id that names no delivery is `Missing`).
pub async fn retry(store: &Store, ids: &[String], allow_unknown: bool) -> anyhow::Result<Vec<(String, Requeue)>> {
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
                    scripts::requeue(&mut conn, &store.keys, p, &d, allow_unknown)
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
