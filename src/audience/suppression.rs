//! Suppression: an address that bounced for good, complained or was suppressed
//! by the provider gets no more mail. The record lives in the address's home
//! partition under a salted hash (never the address); the suppression cascades
//! to every partition, whose `suppressed` hash the last gate reads for every
//! address in a sealed body, and to every subscriber with that address, who are
//! marked suppressed and unsubscribed in their own partitions. Transient bounces are counted, and
//! suppress at a threshold within a window. Used by the webhook listener and by
//! `mailstream suppressions`.
//!
//! Raw Redis here: the suppression records' read for `mailstream suppressions` (a suppression is
//! written by `store::scripts`).

use std::collections::BTreeMap;

use redis::AsyncCommands;
use serde::Serialize;

use crate::config::Config;
use crate::model::outcome::Why;
use crate::store::Store;
use crate::store::scripts::{self, SuppressMode, Suppressed, Suppression};

/// What to do to an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Suppress(Why),
    /// Count one transient (or undetermined) bounce.
    CountTransient,
    Lift,
    /// Resend put the address on its own list (`suppression.added`, or found by a sync):
    /// suppressed as `provider_suppressed`, source `provider`.
    ProviderAdd,
    /// Resend took it off its list (`suppression.removed`, or gone at a sync): lifted only
    /// where the suppression is Resend's own, never an operator's, a bounce's or a complaint's.
    ProviderLift,
}

impl Act {
    /// suppress.lua's mode, the reason written, and whether the step is Resend's list.
    fn step(self) -> (SuppressMode, Why, bool) {
        match self {
            Act::Suppress(why) => (SuppressMode::Suppress, why, false),
            Act::CountTransient => (SuppressMode::Transient, Why::TransientBounces, false),
            Act::Lift => (SuppressMode::Remove, Why::Manual, false),
            Act::ProviderAdd => (SuppressMode::Suppress, Why::ProviderSuppressed, true),
            Act::ProviderLift => (SuppressMode::ProviderRemove, Why::ProviderSuppressed, true),
        }
    }
}

/// Acts on `email`'s suppression and cascades to its subscribers; `event` is the
/// webhook event's id (each step happens once per id), `None` for an operator.
pub async fn apply(
    store: &Store,
    config: &Config,
    email: &str,
    act: Act,
    event: Option<&str>,
) -> anyhow::Result<Suppressed> {
    apply_to(store, config, store.keys.address(email), act, event).await
}

/// [`apply`] to an address named by its hash (an operator sees only hashes).
pub(crate) async fn apply_to(
    store: &Store,
    config: &Config,
    address: crate::store::keys::Address,
    act: Act,
    event: Option<&str>,
) -> anyhow::Result<Suppressed> {
    let keys = &store.keys;
    let w = &config.webhook;
    let (mode, reason, provider) = act.step();
    let source = match (provider, event) {
        (true, _) => "provider",
        (false, Some(_)) => "webhook",
        (false, None) => "operator",
    };
    let step = Suppression {
        mode,
        reason: reason.as_str(),
        source,
        event: event.unwrap_or(""),
        seen_ttl_secs: w.seen_ttl().as_secs(),
        transient_window_ms: crate::model::ms(w.transient_bounce_window()),
        transient_threshold: w.transient_bounces_to_suppress,
    };
    let mut conn = store.waited_conn().await?;
    let (state, ids) = scripts::suppress(&mut conn, keys, &address, &step).await?;
    // Each step is acknowledged (to Resend, to the operator) only once a failover cannot
    // take it back: a webhook answered with an error is retried.
    store.durable(&mut conn, &keys.suppression(&address)).await?;
    // The cascade runs whenever the address is (or was just) suppressed or lifted, also
    // for a repeated event: a crash may have left it halfway (each partition's step
    // happens once per event all the same). A repeated event finishes what the record
    // says now: suppressed (a transient threshold reached included, for whatever reason
    // the record gives), or lifted since, when there is nothing to finish. A provider's
    // lift that kept the suppression (not Resend's) has nothing to cascade; repeated, it
    // finishes whichever of the two the record says.
    let recorded: Option<String> = match state {
        Suppressed::Already | Suppressed::Duplicate => conn.hget(keys.suppression(&address), "reason").await?,
        _ => None,
    };
    let cascade = match state {
        Suppressed::Counted | Suppressed::Kept => None,
        Suppressed::Removed => Some((SuppressMode::Remove, reason.as_str().to_string())),
        Suppressed::Duplicate if mode == SuppressMode::Remove => {
            Some((SuppressMode::Remove, reason.as_str().to_string()))
        }
        Suppressed::Duplicate if mode == SuppressMode::ProviderRemove => match recorded {
            Some(r) => Some((SuppressMode::Suppress, r)),
            None => Some((SuppressMode::Remove, reason.as_str().to_string())),
        },
        Suppressed::New => Some((SuppressMode::Suppress, reason.as_str().to_string())),
        Suppressed::Already => Some((SuppressMode::Suppress, recorded.unwrap_or(reason.as_str().into()))),
        Suppressed::Duplicate => recorded.map(|r| (SuppressMode::Suppress, r)),
    };
    if let Some((mode, reason)) = cascade {
        // Every partition: each keeps the suppressed addresses its last gate reads.
        let mut by_partition: BTreeMap<u16, Vec<&str>> = (0..keys.partitions()).map(|p| (p, Vec::new())).collect();
        for id in &ids {
            by_partition.entry(keys.partition_of(id)).or_default().push(id);
        }
        let step = Suppression { mode, reason: &reason, ..step };
        for (p, ids) in by_partition {
            scripts::cascade(&mut conn, keys, p, &address, &ids, &step).await?;
            store.durable(&mut conn, &keys.suppressed(p)).await?;
        }
    }
    Ok(state)
}

/// One suppression as `mailstream suppressions list` shows it (no address: its hash).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SuppressionEntry {
    pub address_hash: String,
    pub reason: String,
    pub at_ms: u64,
    pub source: String,
    /// The webhook event that caused it ('' for an operator).
    pub event: String,
}

/// The suppressions made in the last 24 hours (Redis's clock), by reason: a scan of
/// the suppression records, for an operator's page or report, not a hot path.
pub(crate) async fn of_the_last_day(store: &Store) -> anyhow::Result<BTreeMap<String, u64>> {
    let now = store.time().await?;
    let since = (now.timestamp_millis().max(0) as u64).saturating_sub(24 * 3600 * 1000);
    let mut by_reason = BTreeMap::new();
    for e in list(store, None).await?.into_iter().filter(|e| e.at_ms >= since) {
        *by_reason.entry(e.reason).or_insert(0) += 1;
    }
    Ok(by_reason)
}

/// Every suppression (a scan of the suppression records), or only `email`'s.
pub async fn list(store: &Store, email: Option<&str>) -> anyhow::Result<Vec<SuppressionEntry>> {
    let keys = match email {
        Some(email) => vec![store.keys.suppression(&store.keys.address(email))],
        None => store.scan(&store.keys.suppressions_pattern()).await?,
    };
    let mut conn = store.conn().await?;
    let mut out = Vec::new();
    for key in keys {
        out.extend(read(&mut conn, &key).await?);
    }
    out.sort_by_key(|e| e.at_ms);
    Ok(out)
}

/// The suppression of the address named by its hash (`a`), if it is suppressed.
pub async fn of_address(store: &Store, a: &crate::store::keys::Address) -> anyhow::Result<Option<SuppressionEntry>> {
    read(&mut store.conn().await?, &store.keys.suppression(a)).await
}

/// The suppression record `key`, if there is one.
async fn read(conn: &mut crate::store::Conn, key: &str) -> anyhow::Result<Option<SuppressionEntry>> {
    let (reason, at_ms, source, event): (Option<String>, Option<u64>, Option<String>, Option<String>) =
        redis::cmd("HMGET").arg(key).arg(&["reason", "at_ms", "source", "event"]).query_async(conn).await?;
    Ok(reason.map(|reason| SuppressionEntry {
        address_hash: key.rsplit(':').next().unwrap_or_default().to_string(),
        reason,
        at_ms: at_ms.unwrap_or(0),
        source: source.unwrap_or_default(),
        event: event.unwrap_or_default(),
    }))
}
