//! What a delivery not yet settled waits for, in words an operator in an incident reads:
//! its state, the last error of its batch's requests, when it is tried next, when it
//! would give up (the deadline), and until when a resend is still safe (Resend's
//! idempotency window). Read from its record and, once sealed, its batch's record.
//!
//! Raw Redis here: the read-only look at a sealed delivery's batch (its record and its due
//! time), as an operator looks at it.

use serde::Serialize;

use super::{Detail, Store};
use crate::config::DeliveryConfig;
use crate::model::ms;

/// A waiting delivery's story (times in milliseconds since the epoch).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct WaitingStory {
    /// Its state in words.
    pub what: String,
    /// The error name of its batch's last failed request, if one failed.
    pub last_error: Option<String>,
    /// Failed requests of its batch so far.
    pub failed_requests: u64,
    /// When it is tried next (a batch due again, a lease ending, a local hour).
    pub next_attempt_ms: Option<u64>,
    /// When it gives up: `failed` (`expired`) for a batch no request of which can have
    /// arrived, `outcome_unknown` for one that may have been sent.
    pub deadline_ms: Option<u64>,
    /// Until when its batch may be sent again under the same key (Resend keeps a key 24 h).
    pub window_ends_ms: Option<u64>,
}

/// The story of `d` if it is not settled (`None` once it is).
pub async fn of(store: &Store, delivery: &DeliveryConfig, d: &Detail) -> anyhow::Result<Option<WaitingStory>> {
    let field = |f: &str| d.fields.get(f).and_then(|v| v.parse::<u64>().ok());
    let w = match d.row.status.as_str() {
        "pending" => WaitingStory {
            what: match field("release_ms") {
                Some(_) => "enqueued; waits for its hour, then for a reader".into(),
                None => "enqueued; waits for a reader (is an instance running and not paused?)".into(),
            },
            next_attempt_ms: field("release_ms"),
            ..Default::default()
        },
        "processing" => WaitingStory {
            what: format!("claimed by {}; being rendered and sealed", d.fields.get("lease_owner").map_or("?", |o| o)),
            next_attempt_ms: field("lease_until"),
            ..Default::default()
        },
        "sealed" => match d.fields.get("batch") {
            Some(batch) => sealed(store, delivery, d, batch).await?,
            None => WaitingStory { what: "sealed into a batch".into(), ..Default::default() },
        },
        _ => return Ok(None),
    };
    Ok(Some(w))
}

/// A batch's state, failed requests, last error, maybe-sent mark, first and last sealing.
type BatchFields = (Option<String>, Option<u64>, Option<String>, Option<String>, Option<u64>, Option<u64>);

async fn sealed(store: &Store, delivery: &DeliveryConfig, d: &Detail, batch: &str) -> anyhow::Result<WaitingStory> {
    let reference = crate::model::work::DeliveryRef::parse(&d.row.id).expect("a row's id parses");
    let p = store.keys.partition_of(reference.home());
    let mut conn = store.conn().await?;
    let (state, tries, last_error, maybe_sent, first, sealed): BatchFields = redis::cmd("HMGET")
        .arg(store.keys.batch(p, batch))
        .arg(&["state", "tries", "last_error", "maybe_sent", "first_sealed_ms", "sealed_ms"][..])
        .query_async(&mut conn)
        .await?;
    let due: Option<f64> = redis::cmd("ZSCORE").arg(store.keys.batches(p)).arg(batch).query_async(&mut conn).await?;
    let maybe_sent = maybe_sent.as_deref() == Some("1");
    let failed_requests = tries.unwrap_or(0);
    let what = match state.as_deref() {
        None => format!("sealed into batch {batch}, whose record is gone: it will be decided lost"),
        Some("sending") => format!("sealed into batch {batch}; its request is leaving now"),
        Some("retry") if maybe_sent => format!(
            "sealed into batch {batch}; {failed_requests} request(s) failed, one may have arrived: \
             retried with the same key, never blind after the window"
        ),
        Some("retry") => format!("sealed into batch {batch}; {failed_requests} request(s) failed, retried"),
        Some(_) => format!("sealed into batch {batch}; waits for a request slot"),
    };
    let deadline_ms = if maybe_sent {
        sealed.map(|s| s + ms(delivery.maybe_sent_deadline()))
    } else {
        first.map(|f| f + ms(delivery.deadline()))
    };
    Ok(WaitingStory {
        what,
        last_error,
        failed_requests,
        next_attempt_ms: due.map(|t| t as u64),
        deadline_ms,
        window_ends_ms: sealed.map(|s| s + ms(delivery.resend_window())),
    })
}
