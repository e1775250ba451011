//! Deliveries: enqueue (kick, ingest), defer, release at their hour, claim, decide,
//! requeue, hand back, renew leases.

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::{SCRIPTS, counts_index, unexpected};
use crate::model::outcome::{DeliveryState, Outcome, Reason, Requeue};
use crate::model::work::{Channel, DeliveryRef, Lane, recipients_of};
use crate::store::keys::Keys;

/// A campaign period's kick window, the numbers enqueue.lua and window.lua judge it by
/// (prelude.lua, `kick_until`): the period's start on the calendar, in its campaign's zone,
/// and the kick window's retention (`Store::kick_window_secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KickWindow {
    /// When the period starts, in Redis-clock (Unix) ms.
    pub start_ms: u64,
    pub window_secs: u64,
}

/// What enqueue.lua did with one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enqueued {
    /// Per item, `true` where it was enqueued now, `false` where it already was.
    Added(Vec<bool>),
    /// The period's kick window ended at `kick_until_ms` (Redis-clock ms): nothing was written.
    Closed { kick_until_ms: u64 },
}

/// Enqueues deliveries of one partition and one campaign period (each at most once), unless
/// the period's kick window has ended.
pub async fn enqueue(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    items: &[DeliveryRef],
    retention_secs: u64,
    window: KickWindow,
) -> RedisResult<Enqueued> {
    let Some(first) = items.first() else { return Ok(Enqueued::Added(Vec::new())) };
    let ids: Vec<(String, u64, Channel)> = items
        .iter()
        .map(|item| {
            debug_assert!(
                item.campaign == first.campaign && item.period == first.period,
                "one campaign period per call"
            );
            (item.id(), 0, item.channel)
        })
        .collect();
    enqueue_ids(conn, keys, partition, (&first.campaign, &first.period), &ids, retention_secs, window).await
}

/// [`enqueue`] for deliveries of `campaign`'s `period` given by id, with their release
/// times (Redis-clock ms: one in the future waits in the partition's due set, 0 or a past
/// time goes to the stream now) and channels (what a fan-out builds, without a
/// [`DeliveryRef`] each).
///
/// Runs `lua/enqueue.lua`:
/// ```text
/// KEYS[1] periods index, KEYS[2] the partition's audience; then per channel c (1..n): KEYS[3c]
///   its stream, KEYS[3c+1] its counts hash, KEYS[3c+2] its due set; then per item
///   KEYS[3+3n+i] delivery key: the partition's delivery prefix plus the delivery id
/// ARGV[1] retention seconds, ARGV[2] `campaign:period`, ARGV[3] the prefix's length,
///   ARGV[4] '1' if a release time (ms; 0: now) follows each item's channel, else '0' (all now),
///   ARGV[5] n, ARGV[6] the period's start (Redis-clock ms), ARGV[7] the kick window's retention
///   seconds; then per item: its channel (1..n) [, its release time]
/// ```
pub(crate) async fn enqueue_ids(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    (campaign, period): (&str, &str),
    items: &[(String, u64, Channel)],
    retention_secs: u64,
    window: KickWindow,
) -> RedisResult<Enqueued> {
    if items.is_empty() {
        return Ok(Enqueued::Added(Vec::new()));
    }
    // Each key is the partition's delivery prefix plus the id (the script reads the id
    // back from it), built in one buffer: a fan-out makes a million of them.
    let prefix = keys.delivery(partition, "");
    let timed = items.iter().any(|(_, release_ms, _)| *release_ms > 0);
    let mut call = SCRIPTS.enqueue.prepare_invoke();
    call.key(keys.periods(partition)).key(keys.audience(partition));
    // Every channel's stream, counts and due set, in the order of `Channel::ALL`.
    for channel in Channel::ALL {
        let lane = Lane::of(campaign, channel);
        call.key(keys.lane_stream(partition, lane))
            .key(keys.channel_counts(partition, campaign, period, channel))
            .key(keys.lane_due(partition, lane));
    }
    call.arg(retention_secs)
        .arg(format!("{campaign}:{period}"))
        .arg(prefix.len())
        .arg(if timed { "1" } else { "0" })
        .arg(Channel::ALL.len())
        .arg(window.start_ms)
        .arg(window.window_secs);
    let mut key = String::with_capacity(prefix.len() + 96);
    for (id, release_ms, channel) in items {
        key.truncate(0);
        key.push_str(&prefix);
        key.push_str(id);
        call.key(key.as_str()).arg(*channel as usize + 1);
        if timed {
            call.arg(release_ms);
        }
    }
    let (status, kick_until, added): (String, u64, Vec<i64>) = call.invoke_async(conn).await?;
    read_added(&status, kick_until, added, items.len())
}

/// enqueue.lua's answer: per item 1 where new, 0 where already enqueued; or the window closed.
pub(super) fn read_added(status: &str, kick_until_ms: u64, added: Vec<i64>, items: usize) -> RedisResult<Enqueued> {
    match status {
        "ok" if added.len() == items => {
            Ok(Enqueued::Added(added.into_iter().map(|a| super::flag("enqueue.lua", a)).collect::<RedisResult<_>>()?))
        }
        "closed" if added.is_empty() => Ok(Enqueued::Closed { kick_until_ms }),
        other => Err(unexpected("enqueue.lua", &format!("{other} with {} of {items} items", added.len()))),
    }
}

/// Whether a campaign period may still be kicked (window.lua, writing nothing): `Ok` with
/// the window's end, or `Err` with it once it has ended (both Redis-clock ms).
///
/// Runs `lua/window.lua`:
/// ```text
/// KEYS none. ARGV[1] the period's start (Redis-clock ms), ARGV[2] the kick window's retention
///   seconds.
/// ```
pub async fn kick_window(conn: &mut impl ConnectionLike, window: KickWindow) -> RedisResult<Result<u64, u64>> {
    let (status, kick_until, _now): (String, u64, u64) =
        SCRIPTS.window.arg(window.start_ms).arg(window.window_secs).invoke_async(conn).await?;
    read_window(&status, kick_until)
}

/// window.lua's answer.
pub(super) fn read_window(status: &str, kick_until_ms: u64) -> RedisResult<Result<u64, u64>> {
    match status {
        "open" => Ok(Ok(kick_until_ms)),
        "closed" => Ok(Err(kick_until_ms)),
        other => Err(unexpected("window.lua", other)),
    }
}

/// One transactional item for [`ingest`]: its delivery, the request as stored in the
/// delivery record (JSON), and the request's hash (a replay must match it).
#[derive(Debug, Clone, Copy)]
pub struct IngestItem<'a> {
    pub delivery: &'a DeliveryRef,
    pub hash: &'a str,
    pub request: &'a str,
    /// Its template lists the application channel: its event is enqueued with it, and its
    /// record keeps this much of the request (`Request::for_event`).
    pub event: Option<&'a str>,
    /// Its attachments' JSON and their bytes (base64), kept apart from the request.
    pub attachments: Option<(&'a str, u64)>,
}

/// What ingest.lua did with one item; each names the delivery of its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingested {
    New(String),
    /// The same request was enqueued before under this key.
    Duplicate(String),
    /// The key was used before for a different request: refused.
    Conflict(String),
    /// Its attachments would take the partition past its pending bytes: not enqueued.
    Over(String),
}

/// Enqueues transactional items of one partition and one period (see lua/ingest.lua), at
/// most `most_pending` attachment bytes pending in the partition.
///
/// Runs `lua/ingest.lua`:
/// ```text
/// KEYS[1] transactional stream, KEYS[2] counts hash, KEYS[3] periods index, KEYS[4] the
///   application stream, KEYS[5] the application channel's counts hash, KEYS[6] the counts
///   hash of the day before, KEYS[7] the partition's pending attachments, KEYS[8] its address
///   index; then per item: KEYS[6+3i] guard key, KEYS[7+3i] delivery key, KEYS[8+3i] its event's key
/// ARGV[1] retention seconds, ARGV[2] `campaign:period`, ARGV[3] the most attachment bytes
///   pending in the partition; then per item: delivery id, request hash, request JSON, its
///   event's request JSON ('' without the application channel), its attachments' JSON ('' for
///   none), their bytes (0 for none), the hashes of the addresses it is sent to inline
///   (comma-separated; '-' for none)
/// ```
pub async fn ingest(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    items: &[IngestItem<'_>],
    (retention_secs, most_pending): (u64, u64),
) -> RedisResult<Vec<Ingested>> {
    let Some(first) = items.first() else { return Ok(Vec::new()) };
    let (campaign, period) = (&first.delivery.campaign, &first.delivery.period);
    let mut call = SCRIPTS.ingest.prepare_invoke();
    call.key(keys.lane_stream(partition, Lane::Transactional))
        .key(keys.counts(partition, campaign, period))
        .key(keys.periods(partition))
        .key(keys.lane_stream(partition, Lane::App))
        .key(keys.channel_counts(partition, campaign, period, Channel::App))
        .key(keys.counts(partition, campaign, &day_before(period)))
        .key(keys.attachments(partition))
        .key(keys.by_address(partition))
        .arg(retention_secs)
        .arg(format!("{campaign}:{period}"))
        .arg(most_pending);
    for item in items {
        debug_assert!(item.delivery.lane() == Lane::Transactional && &item.delivery.period == period);
        let id = item.delivery.id();
        let event = item.delivery.clone().on(Channel::App).id();
        call.key(keys.idempotency(partition, item.delivery.home()))
            .key(keys.delivery(partition, &id))
            .key(keys.delivery(partition, &event));
        let (attachments, bytes) = item.attachments.unwrap_or(("", 0));
        call.arg(id).arg(item.hash).arg(item.request).arg(item.event.unwrap_or("")).arg(attachments).arg(bytes);
        // The request's own `to` (a subscriber's address is found through its subscriber).
        let to = serde_json::from_str(item.request).map(|r| recipients_of(&r)).unwrap_or_default();
        call.arg(keys.address_hashes(&to));
    }
    read_ingested(call.invoke_async(conn).await?)
}

/// The day before `day` (`%Y-%m-%d`, a transactional period); `day` itself if it is not one.
fn day_before(day: &str) -> String {
    chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.pred_opt())
        .map_or_else(|| day.to_string(), |d| d.format("%Y-%m-%d").to_string())
}

/// ingest.lua's answer: per item, what it did and the delivery of its key.
pub(super) fn read_ingested(rows: Vec<(String, String)>) -> RedisResult<Vec<Ingested>> {
    rows.into_iter()
        .map(|(status, id)| match status.as_str() {
            "new" => Ok(Ingested::New(id)),
            "duplicate" => Ok(Ingested::Duplicate(id)),
            "conflict" => Ok(Ingested::Conflict(id)),
            "over" => Ok(Ingested::Over(id)),
            other => Err(unexpected("ingest.lua", other)),
        })
        .collect()
}

/// How [`defer`] backs off.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base_ms: u64,
    pub max_ms: u64,
    /// Deferred no more once this long has passed since the first wait.
    pub deadline_ms: u64,
    /// 0-100: shortens each delay by up to half this percentage.
    pub jitter_percent: u8,
}

/// What [`defer`] did with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deferred {
    /// Due again after this long.
    For(u64),
    /// Not this owner's any more.
    NotHeld,
    /// Past the deadline: the caller decides it.
    Expired,
}

/// Defers claimed deliveries of one lane of partition `p` (entry, delivery): a digest
/// whose render hook gave no answer, an application event the application did not take
/// (see lua/defer.lua). Each waits in its lane's due set.
///
/// Runs `lua/defer.lua`:
/// ```text
/// KEYS[1] stream, KEYS[2] due set; KEYS[2+i] delivery keys
/// ARGV[1] group, ARGV[2] owner, ARGV[3] base ms, ARGV[4] max ms, ARGV[5] deadline ms,
///   ARGV[6] jitter percent (0-100, drawn by the caller); then per item: entry id, delivery id
/// ```
pub async fn defer(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    group: &str,
    owner: &str,
    backoff: Backoff,
    items: &[(&str, &DeliveryRef)],
) -> RedisResult<Vec<Deferred>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let lane = items[0].1.lane();
    debug_assert!(items.iter().all(|(_, d)| d.lane() == lane), "one lane per call");
    let mut call = SCRIPTS.defer.prepare_invoke();
    call.key(keys.lane_stream(partition, lane)).key(keys.lane_due(partition, lane)).arg(group).arg(owner);
    call.arg(backoff.base_ms).arg(backoff.max_ms).arg(backoff.deadline_ms).arg(backoff.jitter_percent);
    for (entry, d) in items {
        let id = d.id();
        call.key(keys.delivery(partition, &id)).arg(*entry).arg(id);
    }
    read_deferred(call.invoke_async(conn).await?)
}

/// defer.lua's answer: per delivery, the delay in ms, -1 (not held) or -2 (expired).
pub(super) fn read_deferred(out: Vec<i64>) -> RedisResult<Vec<Deferred>> {
    out.into_iter()
        .map(|v| match v {
            -1 => Ok(Deferred::NotHeld),
            -2 => Ok(Deferred::Expired),
            ms if ms >= 0 => Ok(Deferred::For(ms as u64)),
            other => Err(unexpected("defer.lua", &other.to_string())),
        })
        .collect()
}

/// Moves up to `limit` deliveries whose release time has come (at `now_ms`, or Redis's
/// clock when 0) from the due set of partition `p`'s `lane` into its stream; returns how
/// many. Email's due set is the digest lane's.
///
/// Runs `lua/due.lua`:
/// ```text
/// KEYS[1] due set, KEYS[2] stream
/// ARGV[1] now in ms (0: Redis's clock; tests pass a fake one), ARGV[2] most to release
/// ```
pub async fn release_due(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    lane: Lane,
    now_ms: u64,
    limit: usize,
) -> RedisResult<u64> {
    let (due, stream) = (keys.lane_due(partition, lane), keys.lane_stream(partition, lane));
    SCRIPTS.due.key(due).key(stream).arg(now_ms).arg(limit).invoke_async(conn).await
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Ours now, under a lease; claimed this many times in all.
    Claimed { claims: u32 },
    /// Another holder's lease is live: do nothing.
    Held,
    /// No record where the stream says there is one (a lost write).
    Gone,
    /// Sealed into a batch or already settled: acknowledge the entry.
    Done(DeliveryState),
}

/// Claims deliveries of one partition for `owner` for `lease_ms`.
///
/// Runs `lua/claim.lua`:
/// ```text
/// KEYS: delivery keys. ARGV[1] owner, ARGV[2] lease milliseconds.
/// ```
pub async fn claim(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    ids: &[&str],
    owner: &str,
    lease_ms: u64,
) -> RedisResult<Vec<Claim>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut call = SCRIPTS.claim.prepare_invoke();
    for id in ids {
        call.key(keys.delivery(partition, id));
    }
    call.arg(owner).arg(lease_ms);
    let rows: Vec<Vec<String>> = call.invoke_async(conn).await?;
    rows.into_iter().map(read_claim).collect()
}

/// One delivery's line of claim.lua's answer.
pub(super) fn read_claim(row: Vec<String>) -> RedisResult<Claim> {
    match row.as_slice() {
        [tag, claims] if tag == "claimed" => match claims.parse() {
            Ok(claims) => Ok(Claim::Claimed { claims }),
            Err(_) => Err(unexpected("claim.lua", claims)),
        },
        [tag] if tag == "held" => Ok(Claim::Held),
        [tag] if tag == "gone" => Ok(Claim::Gone),
        // A state: what this version knows of it, or `Unknown` for another version's.
        [state] if !state.is_empty() => Ok(Claim::Done(DeliveryState::parse(state))),
        _ => Err(unexpected("claim.lua", &row.join(" "))),
    }
}

/// A claimed delivery that will not be sent, and why.
#[derive(Debug, Clone)]
pub struct Decision<'a> {
    pub entry: &'a str,
    pub delivery: &'a DeliveryRef,
    /// Skipped or Failed.
    pub outcome: Outcome,
    pub reason: Reason,
    /// The record is missing (claim found it gone): it is written back as decided.
    pub lost: bool,
}

/// Settles claimed deliveries that will not be sent and acknowledges their entries;
/// returns, per delivery, whether it was decided now (false: no longer ours).
///
/// Runs `lua/decide.lua`:
/// ```text
/// KEYS[1] stream, KEYS[2] dead stream, KEYS[3] recent settlements, KEYS[4] settlements per
/// minute, KEYS[5..4+c] counts hashes, KEYS[5+c..] delivery keys
/// ARGV[1] group, ARGV[2] owner, ARGV[3] c, ARGV[4] retention seconds;
///   then per delivery: stream entry id, delivery id, state, reason, counts index (1-based),
///   expect ('held': claimed by owner, 'lost': the record is missing)
/// ```
pub async fn decide(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    group: &str,
    owner: &str,
    decisions: &[Decision<'_>],
    retention_secs: u64,
) -> RedisResult<Vec<bool>> {
    if decisions.is_empty() {
        return Ok(Vec::new());
    }
    let lane = decisions[0].delivery.lane();
    debug_assert!(decisions.iter().all(|d| d.delivery.lane() == lane), "one lane per call");
    let (counts, index) = counts_index(keys, partition, decisions.iter().map(|d| d.delivery));
    let mut call = SCRIPTS.decide.prepare_invoke();
    call.key(keys.lane_stream(partition, lane))
        .key(keys.dead(partition))
        .key(keys.recent(partition))
        .key(keys.per_minute(partition))
        .arg(group)
        .arg(owner)
        .arg(counts.len())
        .arg(retention_secs);
    for c in &counts {
        call.key(c);
    }
    for (d, ci) in decisions.iter().zip(index) {
        let id = d.delivery.id();
        call.key(keys.delivery(partition, &id))
            .arg(d.entry)
            .arg(id)
            .arg(d.outcome.as_str())
            .arg(d.reason.as_str())
            .arg(ci)
            .arg(if d.lost { "lost" } else { "held" });
    }
    read_decided(call.invoke_async(conn).await?)
}

/// decide.lua's answer: 1 where decided now, 0 where no longer ours.
pub(super) fn read_decided(decided: Vec<i64>) -> RedisResult<Vec<bool>> {
    decided.into_iter().map(|d| super::flag("decide.lua", d)).collect()
}

/// Requeues a failed (or, if allowed, outcome_unknown) delivery.
///
/// Runs `lua/requeue.lua`:
/// ```text
/// KEYS[1] stream, KEYS[2] delivery, KEYS[3] counts hash of its campaign period, KEYS[4] recent
///   settlements
/// ARGV[1] delivery id, ARGV[2] '1' to allow outcome_unknown, ARGV[3] who asked (an admin
///   token's name, or `command line`)
/// ```
pub async fn requeue(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    delivery: &DeliveryRef,
    (allow_unknown, who): (bool, &str),
) -> RedisResult<Requeue> {
    let id = delivery.id();
    let result: String = SCRIPTS
        .requeue
        .key(keys.stream_of(partition, delivery))
        .key(keys.delivery(partition, &id))
        .key(keys.channel_counts(partition, &delivery.campaign, &delivery.period, delivery.channel))
        .key(keys.recent(partition))
        .arg(id)
        .arg(u8::from(allow_unknown))
        .arg(who)
        .invoke_async(conn)
        .await?;
    read_requeue(&result)
}

/// requeue.lua's answer: requeued, missing, or the state that refused it.
pub(super) fn read_requeue(result: &str) -> RedisResult<Requeue> {
    if result.is_empty() {
        return Err(unexpected("requeue.lua", result));
    }
    Ok(Requeue::parse(result))
}

/// Hands back claimed deliveries (entry, delivery) of one partition; returns how many were.
///
/// Runs `lua/release.lua`:
/// ```text
/// KEYS[1] stream, KEYS[2..] delivery keys
/// ARGV[1] group, ARGV[2] owner; then per delivery: stream entry id, delivery id
/// ```
pub async fn release(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    group: &str,
    owner: &str,
    items: &[(&str, &DeliveryRef)],
) -> RedisResult<u64> {
    let mut released = 0;
    for lane in Lane::ALL {
        let items: Vec<_> = items.iter().filter(|(_, d)| d.lane() == lane).collect();
        if items.is_empty() {
            continue;
        }
        let mut call = SCRIPTS.release.prepare_invoke();
        call.key(keys.lane_stream(partition, lane)).arg(group).arg(owner);
        for (entry, d) in items {
            let id = d.id();
            call.key(keys.delivery(partition, &id)).arg(*entry).arg(id);
        }
        let n: u64 = call.invoke_async(conn).await?;
        released += n;
    }
    Ok(released)
}

/// Renews this owner's leases on claimed deliveries and held batches of one
/// partition; returns (deliveries, batches) renewed.
///
/// Runs `lua/renew.lua`:
/// ```text
/// KEYS[1] batches zset, then n delivery keys, then batch keys
/// ARGV[1] owner, ARGV[2] lease ms, ARGV[3] n; then per batch key its batch id
/// ```
pub async fn renew(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    owner: &str,
    lease_ms: u64,
    claimed: &[&DeliveryRef],
    batches: &[&str],
) -> RedisResult<(u64, u64)> {
    if claimed.is_empty() && batches.is_empty() {
        return Ok((0, 0));
    }
    let mut call = SCRIPTS.renew.prepare_invoke();
    call.key(keys.batches(partition)).arg(owner).arg(lease_ms).arg(claimed.len());
    for d in claimed {
        call.key(keys.delivery(partition, &d.id()));
    }
    for b in batches {
        call.key(keys.batch(partition, b)).arg(*b);
    }
    call.invoke_async(conn).await
}

/// Writes `field` once on each delivery record of `items` (key, value) that still exists
/// (note.lua); returns per item the field's value now, `None` where there is no record.
///
/// Runs `lua/note.lua`:
/// ```text
/// KEYS: delivery keys. ARGV[1] field; ARGV[1+i] the value for KEYS[i].
/// ```
pub async fn note(
    conn: &mut impl ConnectionLike,
    field: &str,
    items: &[(String, &str)],
) -> RedisResult<Vec<Option<String>>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let mut call = SCRIPTS.note.prepare_invoke();
    call.arg(field);
    for (key, value) in items {
        call.key(key).arg(*value);
    }
    call.invoke_async(conn).await
}
