//! Suppression (suppress.lua, cascade.lua), a webhook event on a delivery, and the
//! one-click opt-out.

use std::collections::BTreeMap;

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::{SCRIPTS, unexpected};
use crate::model::names::names;
use crate::model::work::DeliveryRef;
use crate::store::keys::Keys;

names! {
    /// What to do to an address's suppression (suppress.lua's mode).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum SuppressMode {
        /// Suppress it (a permanent bounce, a complaint, the provider's list, an operator).
        Suppress = "suppress",
        /// Count a transient or undetermined bounce; suppress at the threshold.
        Transient = "transient",
        /// Lift it (an operator).
        Remove = "remove",
        /// Lift it only if it is Resend's own (`provider_suppressed`): Resend took the
        /// address off its list.
        ProviderRemove = "provider_remove",
    }
}

/// What `suppress` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suppressed {
    /// Suppressed now.
    New,
    /// It was already.
    Already,
    /// A transient bounce was counted, below the threshold.
    Counted,
    Removed,
    /// A provider's lift left it: the suppression is not Resend's (or there is none).
    Kept,
    /// This event had its effect before (a retried or repeated webhook).
    Duplicate,
}

/// A suppression step for one address, with its event's limits.
#[derive(Debug, Clone)]
pub struct Suppression<'a> {
    pub mode: SuppressMode,
    pub reason: &'a str,
    /// `webhook`, `operator` or `provider` (Resend's own list: its webhooks and a sync).
    pub source: &'a str,
    /// The webhook event's id ('' for an operator).
    pub event: &'a str,
    pub seen_ttl_secs: u64,
    pub transient_window_ms: u64,
    pub transient_threshold: u32,
}

/// Suppresses, counts or lifts an address (in its home partition); returns what
/// happened and the ids of the subscribers with that address.
///
/// Runs `lua/suppress.lua`:
/// ```text
/// KEYS[1] seen key, KEYS[2] suppression hash, KEYS[3] transient-bounce zset, KEYS[4] address index
/// ARGV[1] mode: 'suppress' (permanent bounce, complaint, provider suppression, operator),
///   'transient' (a transient or undetermined bounce: counted), 'remove' (operator lifts it),
///   'provider_remove' (Resend took it off its own list: lifted only when the suppression is
///   Resend's, reason 'provider_suppressed'; an operator's, a bounce's or a complaint's stays)
/// ARGV[2] reason, ARGV[3] source ('webhook' | 'operator' | 'provider'), ARGV[4] event id ('' for
///   an operator or a sync),
/// ARGV[5] seen TTL s, ARGV[6] transient window ms, ARGV[7] transient bounces that suppress
/// ```
pub async fn suppress(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    address: &crate::store::keys::Address,
    s: &Suppression<'_>,
) -> RedisResult<(Suppressed, Vec<String>)> {
    let row: Vec<String> = SCRIPTS
        .suppress
        .key(keys.seen(address.partition, s.event, "s"))
        .key(keys.suppression(address))
        .key(keys.bounces(address))
        .key(keys.address_index(address))
        .arg(s.mode.as_str())
        .arg(s.reason)
        .arg(s.source)
        .arg(s.event)
        .arg(s.seen_ttl_secs)
        .arg(s.transient_window_ms)
        .arg(s.transient_threshold)
        .invoke_async(conn)
        .await?;
    read_suppress(row)
}

/// suppress.lua's answer: what it did, then the ids of the subscribers with the address.
pub(super) fn read_suppress(row: Vec<String>) -> RedisResult<(Suppressed, Vec<String>)> {
    let mut it = row.into_iter();
    let state = match it.next().as_deref() {
        Some("new") => Suppressed::New,
        Some("already") => Suppressed::Already,
        Some("counted") => Suppressed::Counted,
        Some("removed") => Suppressed::Removed,
        Some("kept") => Suppressed::Kept,
        Some("duplicate") => Suppressed::Duplicate,
        other => return Err(unexpected("suppress.lua", other.unwrap_or(""))),
    };
    Ok((state, it.collect()))
}

/// Adds (or lifts) `address` in partition `p`'s suppressed addresses and marks (or
/// unmarks) the subscribers `ids` of `p` as suppressed; `None` when this event's
/// cascade was already done in this partition.
///
/// Runs `lua/cascade.lua`:
/// ```text
/// KEYS[1] seen key (ignored without an event), KEYS[2] audience hash, KEYS[3] suppressed
/// addresses hash, KEYS[4..] subscriber records
/// ARGV[1] mode ('suppress' | 'remove'), ARGV[2] reason, ARGV[3] event id ('' for an
/// operator), ARGV[4] seen TTL s, ARGV[5] address hash, ARGV[6..] the subscribers' ids (as KEYS[4..])
/// ```
pub(crate) async fn cascade(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    address: &crate::store::keys::Address,
    ids: &[&str],
    s: &Suppression<'_>,
) -> RedisResult<Option<u64>> {
    let mut call = SCRIPTS.cascade.prepare_invoke();
    call.key(keys.seen(p, s.event, "c")).key(keys.audience(p)).key(keys.suppressed(p));
    for id in ids {
        call.key(keys.subscriber(p, id));
    }
    let lift = matches!(s.mode, SuppressMode::Remove | SuppressMode::ProviderRemove);
    let mode = if lift { "remove" } else { "suppress" };
    call.arg(mode).arg(s.reason).arg(s.event).arg(s.seen_ttl_secs).arg(&address.hash).arg(ids);
    read_cascade(call.invoke_async(conn).await?)
}

/// cascade.lua's answer: subscribers changed, or -1 when the event was applied before.
pub(super) fn read_cascade(changed: i64) -> RedisResult<Option<u64>> {
    match changed {
        -1 => Ok(None),
        n if n >= 0 => Ok(Some(n as u64)),
        other => Err(unexpected("cascade.lua", &other.to_string())),
    }
}

/// What `event` did with an event about a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventWrite {
    /// Counted, and written on the delivery's record.
    Written,
    /// Counted; the delivery keeps no record (settled compactly, or expired).
    Counted,
    /// Seen before: nothing changed.
    Repeat,
}

/// A provider event about one delivery, as event.lua takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeliveryEvent<'a> {
    /// The event's id (each effect once per id).
    pub id: &'a str,
    /// Its type's name, e.g. `delivered`.
    pub kind: &'a str,
    /// The campaign period counter it adds to, with its reason ('' for none), for an event
    /// after the provider accepted the email: `provider_failed`, `delivery_delayed`.
    pub counter: Option<(&'a str, &'a str)>,
    pub seen_ttl_secs: u64,
}

/// Counts a provider event about a delivery (in the hour's tally and, after acceptance,
/// its period's counts), and writes it on the delivery's record if it has one, once per
/// event id.
///
/// Runs `lua/event.lua`:
/// ```text
/// KEYS[1] seen key, KEYS[2] delivery record, KEYS[3] the hour's webhook tally,
/// KEYS[4] the delivery's campaign period counts
/// ARGV[1] event type (e.g. delivered), ARGV[2] seen TTL s, ARGV[3] the period counter this
/// event adds to ('' for none: provider_failed, delivery_delayed), ARGV[4] its reason ('' for none)
/// ```
pub(crate) async fn event(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    delivery: &DeliveryRef,
    e: &DeliveryEvent<'_>,
) -> RedisResult<EventWrite> {
    let p = keys.partition_of(delivery.home());
    let (counter, reason) = e.counter.unwrap_or(("", ""));
    let written: i64 = SCRIPTS
        .event
        .key(keys.seen(p, e.id, "e"))
        .key(keys.delivery(p, &delivery.id()))
        .key(keys.webhooks(p, chrono::Utc::now().timestamp_millis() / HOUR_MS))
        .key(keys.channel_counts(p, &delivery.campaign, &delivery.period, delivery.channel))
        .arg(e.kind)
        .arg(e.seen_ttl_secs)
        .arg(counter)
        .arg(reason)
        .invoke_async(conn)
        .await?;
    read_event(written)
}

const HOUR_MS: i64 = 3_600_000;

/// The webhook events written on deliveries in the last 24 hours (this hour and the 23
/// before it, as event.lua tallies them), by type, over every partition.
pub async fn webhook_events_last_24h(store: &crate::store::Store) -> anyhow::Result<BTreeMap<String, u64>> {
    let hour = chrono::Utc::now().timestamp_millis() / HOUR_MS;
    let mut cmds = Vec::new();
    for p in 0..store.keys.partitions() {
        for h in hour - 23..=hour {
            cmds.push(redis::cmd("HGETALL").arg(store.keys.webhooks(p, h)).clone());
        }
    }
    let tallies: Vec<BTreeMap<String, u64>> = store.conn().await?.each(&cmds).await?;
    let mut total = BTreeMap::new();
    for (kind, n) in tallies.into_iter().flatten() {
        *total.entry(kind).or_insert(0) += n;
    }
    Ok(total)
}

/// event.lua's answer: 1 written, 0 a repeat, -1 no such delivery.
pub(super) fn read_event(written: i64) -> RedisResult<EventWrite> {
    match written {
        1 => Ok(EventWrite::Written),
        2 => Ok(EventWrite::Counted),
        0 => Ok(EventWrite::Repeat),
        other => Err(unexpected("event.lua", &other.to_string())),
    }
}

/// Turns `campaign` off on `channel` for `subscriber` (the field `off:<campaign>` for
/// email, `off:<campaign>:<channel>` for another channel, and the matching opt-out set):
/// `Some(true)` if it was on, `Some(false)` if already off, `None` if there is no such
/// subscriber.
///
/// Runs `lua/optout.lua`:
/// ```text
/// KEYS[1] subscriber record, KEYS[2] the campaign's opt-out set. ARGV[1] campaign, ARGV[2] id.
/// ```
pub async fn opt_out(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    subscriber: &str,
    campaign: &str,
    channel: crate::model::work::Channel,
) -> RedisResult<Option<bool>> {
    let p = keys.partition_of(subscriber);
    // The record's field is `off:` and this (optout.lua adds the prefix).
    let field = match channel {
        crate::model::work::Channel::Email => campaign.to_string(),
        other => format!("{campaign}:{other}"),
    };
    let r: i64 = SCRIPTS
        .optout
        .key(keys.subscriber(p, subscriber))
        .key(keys.channel_opted_out(p, campaign, channel))
        .arg(field)
        .arg(subscriber)
        .invoke_async(conn)
        .await?;
    read_opt_out(r)
}

/// optout.lua's answer: 1 turned off now, 0 already off, -1 no such subscriber.
pub(super) fn read_opt_out(r: i64) -> RedisResult<Option<bool>> {
    match r {
        1 => Ok(Some(true)),
        0 => Ok(Some(false)),
        -1 => Ok(None),
        other => Err(unexpected("optout.lua", &other.to_string())),
    }
}
