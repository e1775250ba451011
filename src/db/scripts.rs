//! The Lua scripts (embedded with `include_str!`) as typed calls. Each call
//! touches the keys of one partition only; `EVALSHA` falls back to loading the
//! script after `NOSCRIPT` (a restarted Redis), which the redis crate handles.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use crate::db::keys::Keys;
use crate::outcome::{DeliveryState, Outcome, Reason, Requeue};
use crate::work::{DeliveryRef, Lane, Ready};

struct Scripts {
    enqueue: Script,
    ingest: Script,
    defer: Script,
    claim: Script,
    seal: Script,
    gate: Script,
    take: Script,
    reschedule: Script,
    settle: Script,
    decide: Script,
    requeue: Script,
    release: Script,
    renew: Script,
    pause: Script,
    forget: Script,
    suppress: Script,
    cascade: Script,
    event: Script,
    optout: Script,
    due: Script,
    fanout: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    enqueue: Script::new(include_str!("../../lua/enqueue.lua")),
    ingest: Script::new(include_str!("../../lua/ingest.lua")),
    defer: Script::new(include_str!("../../lua/defer.lua")),
    claim: Script::new(include_str!("../../lua/claim.lua")),
    seal: Script::new(include_str!("../../lua/seal.lua")),
    gate: Script::new(include_str!("../../lua/gate.lua")),
    take: Script::new(include_str!("../../lua/take.lua")),
    reschedule: Script::new(include_str!("../../lua/reschedule.lua")),
    settle: Script::new(include_str!("../../lua/settle.lua")),
    decide: Script::new(include_str!("../../lua/decide.lua")),
    requeue: Script::new(include_str!("../../lua/requeue.lua")),
    release: Script::new(include_str!("../../lua/release.lua")),
    renew: Script::new(include_str!("../../lua/renew.lua")),
    pause: Script::new(include_str!("../../lua/pause.lua")),
    forget: Script::new(include_str!("../../lua/forget.lua")),
    suppress: Script::new(include_str!("../../lua/suppress.lua")),
    cascade: Script::new(include_str!("../../lua/cascade.lua")),
    event: Script::new(include_str!("../../lua/event.lua")),
    optout: Script::new(include_str!("../../lua/optout.lua")),
    due: Script::new(include_str!("../../lua/due.lua")),
    fanout: Script::new(include_str!("../../lua/fanout.lua")),
});

/// Loads every script (on every primary of a cluster: SCRIPT LOAD goes to all), so
/// one that does not compile stops the start, and the first calls need no NOSCRIPT
/// round trip. `more` are scripts kept elsewhere (the limiter's). Returns how many.
pub async fn load_all(conn: &mut impl ConnectionLike, more: &[&Script]) -> RedisResult<usize> {
    let s = &*SCRIPTS;
    let ours = [
        &s.enqueue,
        &s.ingest,
        &s.defer,
        &s.claim,
        &s.seal,
        &s.gate,
        &s.take,
        &s.reschedule,
        &s.settle,
        &s.decide,
        &s.requeue,
        &s.release,
        &s.renew,
        &s.pause,
        &s.forget,
        &s.suppress,
        &s.cascade,
        &s.event,
        &s.optout,
        &s.due,
        &s.fanout,
    ];
    for script in ours.iter().chain(more) {
        script.load_async(conn).await?;
    }
    Ok(ours.len() + more.len())
}

/// A reply a script's caller does not know: an error, never a guessed state.
fn unexpected(script: &str, reply: &str) -> redis::RedisError {
    let detail = format!("{script} answered {reply:?}");
    redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected script reply", detail))
}

/// Enqueues deliveries of one partition and one campaign period; `true` where new.
pub async fn enqueue(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    items: &[DeliveryRef],
    retention_secs: u64,
) -> RedisResult<Vec<bool>> {
    let now: Vec<(DeliveryRef, u64)> = items.iter().map(|d| (d.clone(), 0)).collect();
    enqueue_at(conn, keys, partition, &now, retention_secs).await
}

/// [`enqueue`] with a release time (Redis-clock ms) per delivery: one in the future
/// waits in the partition's due set, 0 (or a past time) goes to the stream now.
pub async fn enqueue_at(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    items: &[(DeliveryRef, u64)],
    retention_secs: u64,
) -> RedisResult<Vec<bool>> {
    let Some((first, _)) = items.first() else { return Ok(Vec::new()) };
    let ids: Vec<(String, u64)> = items
        .iter()
        .map(|(item, release_ms)| {
            debug_assert!(
                item.campaign == first.campaign && item.period == first.period,
                "one campaign period per call"
            );
            (item.id(), *release_ms)
        })
        .collect();
    enqueue_ids(conn, keys, partition, &first.campaign, &first.period, &ids, retention_secs).await
}

/// [`enqueue_at`] for deliveries of `campaign`'s `period` given by id (what a fan-out
/// builds, without a [`DeliveryRef`] each).
pub async fn enqueue_ids(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    campaign: &str,
    period: &str,
    items: &[(String, u64)],
    retention_secs: u64,
) -> RedisResult<Vec<bool>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    // Each key is the partition's delivery prefix plus the id (the script reads the id
    // back from it), built in one buffer: a fan-out makes a million of them.
    let prefix = keys.delivery(partition, "");
    let timed = items.iter().any(|(_, release_ms)| *release_ms > 0);
    let mut call = SCRIPTS.enqueue.prepare_invoke();
    call.key(keys.stream(partition))
        .key(keys.counts(partition, campaign, period))
        .key(keys.periods(partition))
        .key(keys.due(partition))
        .arg(retention_secs)
        .arg(format!("{campaign}:{period}"))
        .arg(prefix.len())
        .arg(if timed { "1" } else { "0" });
    let mut key = String::with_capacity(prefix.len() + 96);
    for (id, release_ms) in items {
        key.truncate(0);
        key.push_str(&prefix);
        key.push_str(id);
        call.key(key.as_str());
        if timed {
            call.arg(release_ms);
        }
    }
    let added: Vec<i64> = call.invoke_async(conn).await?;
    Ok(added.into_iter().map(|a| a == 1).collect())
}

/// One transactional item for [`ingest`]: its delivery, the request as stored in the
/// delivery record (JSON), and the request's hash (a replay must match it).
#[derive(Debug, Clone, Copy)]
pub struct IngestItem<'a> {
    pub delivery: &'a DeliveryRef,
    pub hash: &'a str,
    pub request: &'a str,
}

/// What ingest.lua did with one item; each names the delivery of its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingested {
    New(String),
    /// The same request was enqueued before under this key.
    Duplicate(String),
    /// The key was used before for a different request: refused.
    Conflict(String),
}

/// Enqueues transactional items of one partition and one period (see lua/ingest.lua).
pub async fn ingest(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    items: &[IngestItem<'_>],
    retention_secs: u64,
) -> RedisResult<Vec<Ingested>> {
    let Some(first) = items.first() else { return Ok(Vec::new()) };
    let (campaign, period) = (&first.delivery.campaign, &first.delivery.period);
    let mut call = SCRIPTS.ingest.prepare_invoke();
    call.key(keys.lane_stream(partition, Lane::Transactional))
        .key(keys.counts(partition, campaign, period))
        .key(keys.periods(partition))
        .arg(retention_secs)
        .arg(format!("{campaign}:{period}"));
    for item in items {
        debug_assert!(item.delivery.lane() == Lane::Transactional && &item.delivery.period == period);
        let id = item.delivery.id();
        call.key(keys.idempotency(partition, item.delivery.home())).key(keys.delivery(partition, &id));
        call.arg(id).arg(item.hash).arg(item.request);
    }
    let rows: Vec<(String, String)> = call.invoke_async(conn).await?;
    Ok(rows
        .into_iter()
        .map(|(status, id)| match status.as_str() {
            "new" => Ingested::New(id),
            "duplicate" => Ingested::Duplicate(id),
            _ => Ingested::Conflict(id),
        })
        .collect())
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

/// Defers claimed digest deliveries of partition `p` (entry, delivery) whose render
/// hook gave no answer (see lua/defer.lua).
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
    let mut call = SCRIPTS.defer.prepare_invoke();
    call.key(keys.stream(partition)).key(keys.due(partition)).arg(group).arg(owner);
    call.arg(backoff.base_ms).arg(backoff.max_ms).arg(backoff.deadline_ms).arg(backoff.jitter_percent);
    for (entry, d) in items {
        let id = d.id();
        call.key(keys.delivery(partition, &id)).arg(*entry).arg(id);
    }
    let out: Vec<i64> = call.invoke_async(conn).await?;
    Ok(out
        .into_iter()
        .map(|v| match v {
            -1 => Deferred::NotHeld,
            -2 => Deferred::Expired,
            ms => Deferred::For(ms.max(0) as u64),
        })
        .collect())
}

/// Moves up to `limit` deliveries whose release time has come (at `now_ms`, or Redis's
/// clock when 0) from partition `p`'s due set into its stream; returns how many.
pub async fn release_due(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    now_ms: u64,
    limit: usize,
) -> RedisResult<u64> {
    SCRIPTS.due.key(keys.due(partition)).key(keys.stream(partition)).arg(now_ms).arg(limit).invoke_async(conn).await
}

/// What acquiring a fan-out record found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fanout {
    /// Ours now; `resumed` when it continues a fan-out that stopped halfway; one SSCAN
    /// cursor per partition (`None`: that partition is finished).
    Acquired { resumed: bool, cursors: Vec<Option<u64>> },
    /// Another holder is fanning it out.
    Held { owner: String },
    /// Already fanned out.
    Done,
}

/// One campaign period's fan-out, as run by `owner`.
#[derive(Debug, Clone, Copy)]
pub struct FanoutOf<'a> {
    pub campaign: &'a str,
    pub period: &'a str,
    pub owner: &'a str,
}

/// Takes the fan-out record of a campaign period for its owner (`restart`: start again
/// if it is done, as an operator's kick does; a scheduler never does).
pub async fn fanout_acquire(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    run: FanoutOf<'_>,
    lease_ms: u64,
    restart: bool,
    retention_secs: u64,
) -> RedisResult<Fanout> {
    let row: Vec<String> = SCRIPTS
        .fanout
        .key(keys.fanout(run.campaign, run.period))
        .arg("acquire")
        .arg(run.owner)
        .arg(lease_ms)
        .arg(if restart { "1" } else { "0" })
        .arg(keys.partitions())
        .arg(retention_secs)
        .invoke_async(conn)
        .await?;
    Ok(match row.first().map(String::as_str) {
        Some("acquired") => Fanout::Acquired {
            resumed: row.get(1).map(String::as_str) == Some("1"),
            cursors: row[2..].iter().map(|c| c.parse().ok()).collect(),
        },
        Some("held") => Fanout::Held { owner: row.get(1).cloned().unwrap_or_default() },
        _ => Fanout::Done,
    })
}

/// What one page of a fan-out did, recorded with the cursor it ended at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FanoutPage {
    pub new: u64,
    pub duplicates: u64,
    pub not_eligible: u64,
    pub scanned: u64,
}

/// Records a page of partition `p` (`cursor` None: the partition is finished) and
/// renews the lease; `false` if the record is no longer the run's owner's.
pub async fn fanout_progress(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    run: FanoutOf<'_>,
    lease_ms: u64,
    p: u16,
    cursor: Option<u64>,
    page: FanoutPage,
) -> RedisResult<bool> {
    let held: i64 = SCRIPTS
        .fanout
        .key(keys.fanout(run.campaign, run.period))
        .arg("progress")
        .arg(run.owner)
        .arg(lease_ms)
        .arg(p)
        .arg(cursor.map_or("done".to_string(), |c| c.to_string()))
        .arg(page.new)
        .arg(page.duplicates)
        .arg(page.not_eligible)
        .arg(page.scanned)
        .invoke_async(conn)
        .await?;
    Ok(held == 1)
}

/// Starts a fan-out still running (record `key`, found by a scan) again from the
/// beginning of every partition; whether it was running.
pub async fn fanout_rewind(conn: &mut impl ConnectionLike, key: &str, partitions: u16) -> RedisResult<bool> {
    let rewound: i64 = SCRIPTS.fanout.key(key).arg("rewind").arg("").arg(0).arg(partitions).invoke_async(conn).await?;
    Ok(rewound == 1)
}

/// Marks the fan-out done; `false` if the record is no longer the run's owner's.
pub async fn fanout_finish(conn: &mut impl ConnectionLike, keys: &Keys, run: FanoutOf<'_>) -> RedisResult<bool> {
    let key = keys.fanout(run.campaign, run.period);
    let held: i64 = SCRIPTS.fanout.key(key).arg("finish").arg(run.owner).arg(0).invoke_async(conn).await?;
    Ok(held == 1)
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
    Ok(rows.into_iter().map(parse_claim).collect())
}

fn parse_claim(row: Vec<String>) -> Claim {
    let mut it = row.into_iter();
    match it.next().as_deref() {
        Some("claimed") => Claim::Claimed { claims: it.next().and_then(|n| n.parse().ok()).unwrap_or(1) },
        Some("held") => Claim::Held,
        Some("gone") | None => Claim::Gone,
        Some(state) => Claim::Done(DeliveryState::parse(state)),
    }
}

/// A batch to seal.
#[derive(Debug, Clone)]
pub struct SealRequest<'a> {
    pub partition: u16,
    pub batch: &'a str,
    pub idempotency_key: &'a str,
    pub owner: &'a str,
    pub group: &'a str,
    pub lease_ms: u64,
}

/// Seals a batch of `members`; returns the 0-based positions of those that were sealed.
pub async fn seal(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    req: &SealRequest<'_>,
    members: &[Ready],
) -> RedisResult<Vec<usize>> {
    let p = req.partition;
    if members.is_empty() {
        return Ok(Vec::new());
    }
    let mut call = SCRIPTS.seal.prepare_invoke();
    call.key(keys.batch(p, req.batch))
        .key(keys.batches(p))
        .key(keys.lane_stream(p, Lane::Digest))
        .key(keys.lane_stream(p, Lane::Transactional))
        .arg(req.batch)
        .arg(req.idempotency_key)
        .arg(req.owner)
        .arg(req.group)
        .arg(req.lease_ms);
    for m in members {
        let id = m.delivery.id();
        call.key(keys.delivery(p, &id)).arg(&m.entry).arg(id).arg(&m.json).arg(m.variant.as_deref().unwrap_or(""));
        call.arg(address_hashes(keys, &m.recipients()));
    }
    let sealed: Vec<usize> = call.invoke_async(conn).await?;
    Ok(sealed.into_iter().map(|i| i - 1).collect())
}

/// The hashes of `addresses` as seal.lua keeps them for the last gate: comma-separated,
/// `-` for none.
pub fn address_hashes(keys: &Keys, addresses: &[String]) -> String {
    if addresses.is_empty() {
        return "-".to_string();
    }
    addresses.iter().map(|a| keys.address(a).hash).collect::<Vec<_>>().join(",")
}

/// The limits the last gate applies, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct GateLimits {
    pub lease_ms: u64,
    /// A maybe-sent batch sealed longer ago than this is never resent.
    pub window_ms: u64,
    /// A batch never sent is given up (failed, expired) this long after it was first sealed.
    pub deadline_ms: u64,
    /// A maybe-sent batch is given up (outcome_unknown) this long after it was sealed.
    pub maybe_sent_deadline_ms: u64,
    pub retention_secs: u64,
}

/// What the last gate decided for a batch about to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Send it as sealed; this is request number `sends`.
    Go { sends: u32 },
    /// Members were skipped (never sent before): send this body under this key instead.
    Resealed { sends: u32, key: String, body: String, kept: Vec<usize>, skipped: Vec<(usize, Reason)> },
    /// Every member was skipped; the batch is gone.
    Empty { skipped: Vec<(usize, Reason)> },
    /// It may have been sent and some members are no longer wanted: not resent. Per
    /// member, the reason it is no longer wanted (`None`: still wanted).
    Withhold { reasons: Vec<Option<Reason>> },
    /// Sending is paused.
    Paused,
    /// Maybe sent and past the provider's idempotency window.
    Expired,
    /// Past its deadline; `maybe_sent` tells which one.
    Deadline { maybe_sent: bool },
    /// Another instance holds it now.
    NotHeld,
    /// Its record is gone and every member is final: another holder settled it.
    Settled,
    /// Its record is gone while a member is not final (a lost write).
    Lost,
}

/// Which batch the gate is asked about, by whom.
#[derive(Debug, Clone)]
pub struct GateRequest<'a> {
    pub partition: u16,
    pub batch: &'a str,
    pub owner: &'a str,
    /// The key to re-seal under if members are dropped from a batch never sent.
    pub new_key: &'a str,
    pub limits: GateLimits,
    /// The holder took the batch marked as maybe sent (its record may have lost the mark
    /// in a failover since).
    pub maybe_sent: bool,
}

/// Runs the last gate for a batch this instance holds, right before its request. Every
/// member's addresses (as sealed) are checked against the partition's suppressed
/// addresses; a campaign member's subscriber record also says whether it is still
/// wanted (a transactional member has no subscription to check, and its subscriber, if
/// any, lives in another slot).
pub async fn gate(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    req: &GateRequest<'_>,
    members: &[DeliveryRef],
) -> RedisResult<Gate> {
    let (p, batch, limits) = (req.partition, req.batch, &req.limits);
    let (counts, index) = counts_index(keys, p, members.iter().map(|d| (d.campaign.as_str(), d.period.as_str())));
    let mut call = SCRIPTS.gate.prepare_invoke();
    call.key(keys.batch(p, batch))
        .key(keys.batches(p))
        .key(keys.paused(p))
        .key(keys.suppressed(p))
        .arg(batch)
        .arg(req.owner)
        .arg(limits.lease_ms)
        .arg(limits.window_ms)
        .arg(limits.deadline_ms)
        .arg(limits.maybe_sent_deadline_ms)
        .arg(limits.retention_secs)
        .arg(req.new_key)
        .arg(counts.len())
        .arg(if req.maybe_sent { "1" } else { "0" });
    for c in &counts {
        call.key(c);
    }
    for (d, ci) in members.iter().zip(index) {
        let id = d.id();
        let check = d.lane() == Lane::Digest;
        // An unchecked member names its own record again: every key stays in this slot.
        let subscriber = if check { keys.subscriber(p, &d.subscriber) } else { keys.delivery(p, &id) };
        call.key(keys.delivery(p, &id)).key(subscriber);
        call.arg(&d.campaign).arg(ci).arg(if check { "1" } else { "0" });
    }
    let row: Vec<String> = call.invoke_async(conn).await?;
    let skipped = |s: &str| -> Vec<(usize, Reason)> {
        s.split(' ')
            .filter_map(|item| item.split_once(':'))
            .filter_map(|(i, r)| Some((i.parse().ok()?, Reason::parse(r))))
            .collect()
    };
    let number = |s: &str| s.parse::<u32>().unwrap_or(1);
    Ok(match row.as_slice() {
        [tag, sends] if tag == "go" => Gate::Go { sends: number(sends) },
        [tag, sends, key, body, kept, gone] if tag == "resealed" => Gate::Resealed {
            sends: number(sends),
            key: key.clone(),
            body: body.clone(),
            kept: kept.split(' ').filter_map(|i| i.parse().ok()).collect(),
            skipped: skipped(gone),
        },
        [tag, gone] if tag == "empty" => Gate::Empty { skipped: skipped(gone) },
        [tag, reasons] if tag == "withhold" => {
            Gate::Withhold { reasons: reasons.split(' ').map(|r| (!r.is_empty()).then(|| Reason::parse(r))).collect() }
        }
        [tag] if tag == "paused" => Gate::Paused,
        [tag] if tag == "expired" => Gate::Expired,
        [tag, maybe] if tag == "deadline" => Gate::Deadline { maybe_sent: maybe == "1" },
        [tag] if tag == "not_held" => Gate::NotHeld,
        [tag] if tag == "settled" => Gate::Settled,
        [tag] if tag == "lost" => Gate::Lost,
        // Only the tag: the rest may hold a body, and with it addresses.
        _ => return Err(unexpected("gate.lua", row.first().map_or("", String::as_str))),
    })
}

/// What `take` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// Resend `body` with `key`; `tries` failed requests so far.
    Take { key: String, body: String, members: Vec<DeliveryRef>, tries: u32, maybe_sent: bool },
    /// Sealed too long ago to resend blind: settle every member as outcome_unknown.
    Expired { members: Vec<DeliveryRef> },
    /// The batch record is gone though it was never settled (a lost write).
    Lost,
    /// Not due, taken by someone else, or gone.
    Skip,
}

/// A sealed batch's members, as recorded in it (space-separated delivery ids).
pub fn parse_members(ids: &str) -> Vec<DeliveryRef> {
    ids.split(' ').filter_map(DeliveryRef::parse).collect()
}

/// Takes over a batch whose retry is due or whose holder's lease expired.
pub async fn take(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    batch: &str,
    owner: &str,
    lease_ms: u64,
    window_ms: u64,
) -> RedisResult<Take> {
    let row: Vec<String> = SCRIPTS
        .take
        .key(keys.batch(partition, batch))
        .key(keys.batches(partition))
        .arg(batch)
        .arg(owner)
        .arg(lease_ms)
        .arg(window_ms)
        .invoke_async(conn)
        .await?;
    Ok(match row.as_slice() {
        [tag, key, body, ids, tries, maybe_sent] if tag == "take" => Take::Take {
            key: key.clone(),
            body: body.clone(),
            members: parse_members(ids),
            tries: tries.parse().unwrap_or(0),
            maybe_sent: maybe_sent == "1",
        },
        [tag, ids] if tag == "expired" => Take::Expired { members: parse_members(ids) },
        [tag] if tag == "lost" => Take::Lost,
        [tag] if tag == "skip" => Take::Skip,
        // Only the tag: the rest may hold a body, and with it addresses.
        _ => return Err(unexpected("take.lua", row.first().map_or("", String::as_str))),
    })
}

/// A retry to schedule (or a putting back) for a batch this instance holds.
#[derive(Debug, Clone)]
pub struct Reschedule {
    pub delay_ms: u64,
    /// Whether a request failed (false: the batch is put back unsent).
    pub failed_request: bool,
    /// Whether the provider may have processed the request (timeouts, 5xx).
    pub maybe_sent: bool,
    /// The failure (kept as the batch's `last_error`).
    pub error: Reason,
}

/// Reschedules a held batch; returns its failed requests so far, `None` when this
/// owner no longer holds it.
pub async fn reschedule(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    batch: &str,
    owner: &str,
    r: &Reschedule,
) -> RedisResult<Option<u32>> {
    let tries: i64 = SCRIPTS
        .reschedule
        .key(keys.batch(partition, batch))
        .key(keys.batches(partition))
        .arg(batch)
        .arg(owner)
        .arg(r.delay_ms)
        .arg(u8::from(r.failed_request))
        .arg(u8::from(r.maybe_sent))
        .arg(r.error.as_str())
        .invoke_async(conn)
        .await?;
    Ok(u32::try_from(tries).ok())
}

/// What became of one member of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Accepted by the provider, under this email id.
    Sent(String),
    /// Not sent (settle.lua records `outcome_unknown` instead if an attempt may have been).
    Failed(Reason),
    /// Nobody can say whether it was sent.
    Unknown(Reason),
}

impl Verdict {
    pub fn outcome(&self) -> Outcome {
        match self {
            Verdict::Sent(_) => Outcome::Sent,
            Verdict::Failed(_) => Outcome::Failed,
            Verdict::Unknown(_) => Outcome::OutcomeUnknown,
        }
    }

    /// The reason, for anything but a send.
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            Verdict::Sent(_) => None,
            Verdict::Failed(r) | Verdict::Unknown(r) => Some(r),
        }
    }

    /// What settle.lua stores beside the state: the provider's id, or the reason.
    fn detail(&self) -> &str {
        match self {
            Verdict::Sent(id) => id,
            Verdict::Failed(r) | Verdict::Unknown(r) => r.as_str(),
        }
    }
}

/// A member's settlement.
#[derive(Debug, Clone)]
pub struct Settlement<'a> {
    pub member: &'a DeliveryRef,
    pub verdict: Verdict,
}

/// Distinct counts keys for `members`, and each member's 1-based index into them.
fn counts_index<'a>(
    keys: &Keys,
    partition: u16,
    members: impl Iterator<Item = (&'a str, &'a str)>,
) -> (Vec<String>, Vec<usize>) {
    let mut distinct: HashMap<(&str, &str), usize> = HashMap::new();
    let mut names = Vec::new();
    let index = members
        .map(|(campaign, period)| {
            *distinct.entry((campaign, period)).or_insert_with(|| {
                names.push(keys.counts(partition, campaign, period));
                names.len()
            })
        })
        .collect();
    (names, index)
}

/// Who settles a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settler<'a> {
    /// The provider answered 2xx for the batch's key: anyone may record that.
    Answer,
    /// A verdict without such an answer: only the batch's current holder may record it.
    Holder(&'a str),
    /// The batch record is gone; its members were found by their `batch` field.
    Lost,
}

/// What a settle call found of the batch record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchFound {
    /// There, and settled now.
    Open,
    /// Another instance holds it: nothing was recorded.
    NotHeld,
    /// Gone, and every member was already final: another holder settled it first (a
    /// normal race, such as a holder that stalled past its lease).
    AlreadySettled,
    /// Gone while a member was not final: a lost write (an answer was recorded anyway).
    Missing,
}

/// How a settle call went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub batch: BatchFound,
    /// Per member, the outcome recorded now (`None` where nothing changed).
    pub recorded: Vec<Option<Outcome>>,
}

/// Settles a sealed batch's members.
pub async fn settle(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    batch: &str,
    by: Settler<'_>,
    settlements: &[Settlement<'_>],
    retention_secs: u64,
) -> RedisResult<Settled> {
    let (counts, index) = counts_index(
        keys,
        partition,
        settlements.iter().map(|s| (s.member.campaign.as_str(), s.member.period.as_str())),
    );
    let mut call = SCRIPTS.settle.prepare_invoke();
    call.key(keys.batch(partition, batch))
        .key(keys.batches(partition))
        .key(keys.dead(partition))
        .key(keys.unknown(partition))
        .arg(batch)
        .arg(counts.len())
        .arg(retention_secs)
        .arg(match by {
            Settler::Answer => "",
            Settler::Holder(owner) => owner,
            Settler::Lost => "*lost*",
        });
    for c in &counts {
        call.key(c);
    }
    for (s, ci) in settlements.iter().zip(index) {
        let id = s.member.id();
        call.key(keys.delivery(partition, &id))
            .arg(id)
            .arg(s.verdict.outcome().as_str())
            .arg(s.verdict.detail())
            .arg(ci);
    }
    let (status, recorded): (String, Vec<String>) = call.invoke_async(conn).await?;
    let batch = match status.as_str() {
        "ok" => BatchFound::Open,
        "not_held" => BatchFound::NotHeld,
        "settled" => BatchFound::AlreadySettled,
        "missing" => BatchFound::Missing,
        _ => return Err(unexpected("settle.lua", &status)),
    };
    Ok(Settled { batch, recorded: recorded.iter().map(|s| Outcome::parse(s)).collect() })
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
    let (counts, index) = counts_index(
        keys,
        partition,
        decisions.iter().map(|d| (d.delivery.campaign.as_str(), d.delivery.period.as_str())),
    );
    let mut call = SCRIPTS.decide.prepare_invoke();
    call.key(keys.lane_stream(partition, lane))
        .key(keys.dead(partition))
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
    let decided: Vec<i64> = call.invoke_async(conn).await?;
    Ok(decided.into_iter().map(|d| d == 1).collect())
}

/// Requeues a failed (or, if allowed, outcome_unknown) delivery.
pub async fn requeue(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    delivery: &DeliveryRef,
    allow_unknown: bool,
) -> RedisResult<Requeue> {
    let id = delivery.id();
    let result: String = SCRIPTS
        .requeue
        .key(keys.stream_of(partition, delivery))
        .key(keys.delivery(partition, &id))
        .key(keys.counts(partition, &delivery.campaign, &delivery.period))
        .arg(id)
        .arg(u8::from(allow_unknown))
        .invoke_async(conn)
        .await?;
    Ok(Requeue::parse(&result))
}

/// Hands back claimed deliveries (entry, delivery) of one partition; returns how many were.
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

/// Pauses sending in one partition for `ms` (only ever lengthening a pause); true if set or lengthened.
pub async fn pause(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    reason: &str,
    ms: u64,
) -> RedisResult<bool> {
    let set: i64 = SCRIPTS.pause.key(keys.paused(partition)).arg(reason).arg(ms).invoke_async(conn).await?;
    Ok(set == 1)
}

/// Removes `consumer` from the group of partition `p` if it has nothing pending and has
/// been idle longer than `idle_ms`; true if it was removed.
pub async fn forget_consumer(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    lane: Lane,
    group: &str,
    consumer: &str,
    idle_ms: u64,
) -> RedisResult<bool> {
    let stream = keys.lane_stream(partition, lane);
    let removed: i64 = SCRIPTS.forget.key(stream).arg(group).arg(consumer).arg(idle_ms).invoke_async(conn).await?;
    Ok(removed == 1)
}

/// What to do to an address's suppression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuppressMode {
    /// Suppress it (a permanent bounce, a complaint, the provider's list, an operator).
    Suppress,
    /// Count a transient or undetermined bounce; suppress at the threshold.
    Transient,
    /// Lift it (an operator).
    Remove,
}

impl SuppressMode {
    fn as_str(self) -> &'static str {
        match self {
            SuppressMode::Suppress => "suppress",
            SuppressMode::Transient => "transient",
            SuppressMode::Remove => "remove",
        }
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
    /// This event had its effect before (a retried or repeated webhook).
    Duplicate,
}

/// A suppression step for one address, with its event's limits.
#[derive(Debug, Clone)]
pub struct Suppression<'a> {
    pub mode: SuppressMode,
    pub reason: &'a str,
    /// `webhook` or `operator`.
    pub source: &'a str,
    /// The webhook event's id ('' for an operator).
    pub event: &'a str,
    pub seen_ttl_secs: u64,
    pub transient_window_ms: u64,
    pub transient_threshold: u32,
}

/// Suppresses, counts or lifts an address (in its home partition); returns what
/// happened and the ids of the subscribers with that address.
pub async fn suppress(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    address: &crate::db::keys::Address,
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
    let mut it = row.into_iter();
    let state = match it.next().as_deref() {
        Some("new") => Suppressed::New,
        Some("counted") => Suppressed::Counted,
        Some("removed") => Suppressed::Removed,
        Some("duplicate") => Suppressed::Duplicate,
        _ => Suppressed::Already,
    };
    Ok((state, it.collect()))
}

/// Adds (or lifts) `address` in partition `p`'s suppressed addresses and marks (or
/// unmarks) the subscribers `ids` of `p` as suppressed; `None` when this event's
/// cascade was already done in this partition.
pub async fn cascade(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    address: &crate::db::keys::Address,
    ids: &[&str],
    s: &Suppression<'_>,
) -> RedisResult<Option<u64>> {
    let mut call = SCRIPTS.cascade.prepare_invoke();
    call.key(keys.seen(p, s.event, "c")).key(keys.audience(p)).key(keys.suppressed(p));
    for id in ids {
        call.key(keys.subscriber(p, id));
    }
    let mode = if s.mode == SuppressMode::Remove { "remove" } else { "suppress" };
    call.arg(mode).arg(s.reason).arg(s.event).arg(s.seen_ttl_secs).arg(&address.hash).arg(ids);
    let changed: i64 = call.invoke_async(conn).await?;
    Ok(u64::try_from(changed).ok())
}

/// What `event` did to a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventWrite {
    Written,
    Repeat,
    NoDelivery,
}

/// Writes a provider event (`kind`, e.g. `delivered`) on a delivery once per event id.
pub async fn event(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    delivery: &DeliveryRef,
    event: &str,
    kind: &str,
    seen_ttl_secs: u64,
) -> RedisResult<EventWrite> {
    let p = keys.partition_of(delivery.home());
    let written: i64 = SCRIPTS
        .event
        .key(keys.seen(p, event, "e"))
        .key(keys.delivery(p, &delivery.id()))
        .arg(kind)
        .arg(seen_ttl_secs)
        .invoke_async(conn)
        .await?;
    Ok(match written {
        1 => EventWrite::Written,
        0 => EventWrite::Repeat,
        _ => EventWrite::NoDelivery,
    })
}

/// Turns `campaign` off for `subscriber`: `Some(true)` if it was on, `Some(false)` if
/// already off, `None` if there is no such subscriber.
pub async fn opt_out(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    subscriber: &str,
    campaign: &str,
) -> RedisResult<Option<bool>> {
    let p = keys.partition_of(subscriber);
    let r: i64 = SCRIPTS
        .optout
        .key(keys.subscriber(p, subscriber))
        .key(keys.opted_out(p, campaign))
        .arg(campaign)
        .arg(subscriber)
        .invoke_async(conn)
        .await?;
    Ok(match r {
        1 => Some(true),
        0 => Some(false),
        _ => None,
    })
}
