//! The Lua scripts (embedded with `include_str!`) as typed calls. Each call
//! touches the keys of one partition only; `EVALSHA` falls back to loading the
//! script after `NOSCRIPT` (a restarted Redis), which the redis crate handles.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

use crate::keys::Keys;
use crate::outcome::{DeliveryState, Outcome, Reason, Requeue};
use crate::work::{DeliveryRef, Ready};

struct Scripts {
    enqueue: Script,
    claim: Script,
    seal: Script,
    take: Script,
    reschedule: Script,
    settle: Script,
    decide: Script,
    requeue: Script,
    pause: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    enqueue: Script::new(include_str!("../lua/enqueue.lua")),
    claim: Script::new(include_str!("../lua/claim.lua")),
    seal: Script::new(include_str!("../lua/seal.lua")),
    take: Script::new(include_str!("../lua/take.lua")),
    reschedule: Script::new(include_str!("../lua/reschedule.lua")),
    settle: Script::new(include_str!("../lua/settle.lua")),
    decide: Script::new(include_str!("../lua/decide.lua")),
    requeue: Script::new(include_str!("../lua/requeue.lua")),
    pause: Script::new(include_str!("../lua/pause.lua")),
});

/// A delivery to enqueue: its new id and what it is for.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    pub id: String,
    pub subscriber: String,
    pub target: String,
}

/// Enqueues deliveries of one partition and one campaign period; `true` where new.
pub async fn enqueue(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    campaign: &str,
    period: &str,
    items: &[NewDelivery],
    retention_secs: u64,
) -> RedisResult<Vec<bool>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let mut call = SCRIPTS.enqueue.prepare_invoke();
    call.key(keys.stream(partition))
        .key(keys.counts(partition, campaign, period))
        .arg(retention_secs)
        .arg(campaign)
        .arg(period);
    for item in items {
        call.key(keys.dedup(partition, campaign, period, &item.subscriber, &item.target))
            .key(keys.delivery(partition, &item.id))
            .arg(&item.id)
            .arg(&item.subscriber)
            .arg(&item.target);
    }
    let added: Vec<i64> = call.invoke_async(conn).await?;
    Ok(added.into_iter().map(|a| a == 1).collect())
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Ours now, under a lease.
    Claimed(Claimed),
    /// Another holder's lease is live: do nothing.
    Held,
    /// The record is gone (expired): acknowledge the entry.
    Gone,
    /// Sealed into a batch or already decided: acknowledge the entry.
    Done(DeliveryState),
}

/// A delivery this instance now holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub campaign: String,
    pub period: String,
    pub subscriber: String,
    pub target: String,
    /// Times it has been claimed, this one included.
    pub attempts: u32,
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
        Some("claimed") => {
            let mut next = || it.next().unwrap_or_default();
            let (campaign, period, subscriber, target) = (next(), next(), next(), next());
            let attempts = next().parse().unwrap_or(1);
            Claim::Claimed(Claimed { campaign, period, subscriber, target, attempts })
        }
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
    pub retention_secs: u64,
}

/// Seals a batch of `members`; returns the 0-based positions of those that were sealed.
pub async fn seal(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    req: &SealRequest<'_>,
    members: &[Ready],
) -> RedisResult<Vec<usize>> {
    let p = req.partition;
    let mut call = SCRIPTS.seal.prepare_invoke();
    call.key(keys.batch(p, req.batch))
        .key(keys.batches(p))
        .key(keys.stream(p))
        .arg(req.batch)
        .arg(req.idempotency_key)
        .arg(req.owner)
        .arg(req.group)
        .arg(req.lease_ms)
        .arg(req.retention_secs);
    for m in members {
        call.key(keys.delivery(p, &m.delivery.id))
            .arg(&m.entry)
            .arg(&m.delivery.id)
            .arg(tally(&m.delivery.campaign, &m.delivery.period))
            .arg(&m.json);
    }
    let sealed: Vec<usize> = call.invoke_async(conn).await?;
    Ok(sealed.into_iter().map(|i| i - 1).collect())
}

/// A sealed batch's counts suffix for one member: `campaign:period`.
fn tally(campaign: &str, period: &str) -> String {
    format!("{campaign}:{period}")
}

/// What `take` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// Resend `body` with `key`; `attempts` failed attempts so far.
    Take { key: String, body: String, members: Vec<DeliveryRef>, attempts: u32, maybe_sent: bool },
    /// Sealed too long ago to resend blind: settle every member as outcome_unknown.
    Expired { members: Vec<DeliveryRef> },
    /// The batch record expired before it was settled (its members' records, written
    /// earlier, expired first): nothing is left to send or settle, only to report.
    Lost,
    /// Not due, taken by someone else, or gone.
    Skip,
}

/// A sealed batch's members, as recorded in it.
fn parse_members(ids: &str, tallies: &str) -> Vec<DeliveryRef> {
    ids.split(' ')
        .zip(tallies.split(' '))
        .filter(|(id, _)| !id.is_empty())
        .map(|(id, tally)| {
            let (campaign, period) = tally.split_once(':').unwrap_or((tally, ""));
            DeliveryRef { id: id.to_string(), campaign: campaign.to_string(), period: period.to_string() }
        })
        .collect()
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
        [tag, key, body, ids, tallies, attempts, maybe_sent] if tag == "take" => Take::Take {
            key: key.clone(),
            body: body.clone(),
            members: parse_members(ids, tallies),
            attempts: attempts.parse().unwrap_or(0),
            maybe_sent: maybe_sent == "1",
        },
        [tag, ids, tallies] if tag == "expired" => Take::Expired { members: parse_members(ids, tallies) },
        [tag] if tag == "lost" => Take::Lost,
        _ => Take::Skip,
    })
}

/// A retry to schedule for a batch this instance holds.
#[derive(Debug, Clone)]
pub struct Reschedule {
    pub delay_ms: u64,
    /// Whether this failure counts towards the attempt limit (a quota pause does not).
    pub count_attempt: bool,
    /// Whether the provider may have processed the request (timeouts, 5xx).
    pub maybe_sent: bool,
    /// The failure (kept as the batch's `last_error`).
    pub error: Reason,
}

/// Reschedules a held batch; `None` when this owner no longer holds it.
pub async fn reschedule(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    batch: &str,
    owner: &str,
    r: &Reschedule,
) -> RedisResult<Option<u32>> {
    let attempts: i64 = SCRIPTS
        .reschedule
        .key(keys.batch(partition, batch))
        .key(keys.batches(partition))
        .arg(batch)
        .arg(owner)
        .arg(r.delay_ms)
        .arg(u8::from(r.count_attempt))
        .arg(u8::from(r.maybe_sent))
        .arg(r.error.as_str())
        .invoke_async(conn)
        .await?;
    Ok(u32::try_from(attempts).ok())
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
}

/// Settles a sealed batch; returns, per member, the outcome recorded now (`None` where
/// nothing changed: already settled, or this holder lost the batch).
pub async fn settle(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    batch: &str,
    by: Settler<'_>,
    settlements: &[Settlement<'_>],
    retention_ms: u64,
) -> RedisResult<Vec<Option<Outcome>>> {
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
        .arg(retention_ms)
        .arg(match by {
            Settler::Answer => "",
            Settler::Holder(owner) => owner,
        });
    for c in &counts {
        call.key(c);
    }
    for (s, ci) in settlements.iter().zip(index) {
        call.key(keys.delivery(partition, &s.member.id))
            .arg(&s.member.id)
            .arg(s.verdict.outcome().as_str())
            .arg(s.verdict.detail())
            .arg(ci);
    }
    let recorded: Vec<String> = call.invoke_async(conn).await?;
    Ok(recorded.iter().map(|s| Outcome::parse(s)).collect())
}

/// A claimed delivery that will not be sent, and why.
#[derive(Debug, Clone)]
pub struct Decision<'a> {
    pub entry: &'a str,
    pub delivery: &'a DeliveryRef,
    /// Skipped or Failed.
    pub outcome: Outcome,
    pub reason: Reason,
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
    retention_ms: u64,
) -> RedisResult<Vec<bool>> {
    if decisions.is_empty() {
        return Ok(Vec::new());
    }
    let (counts, index) = counts_index(
        keys,
        partition,
        decisions.iter().map(|d| (d.delivery.campaign.as_str(), d.delivery.period.as_str())),
    );
    let mut call = SCRIPTS.decide.prepare_invoke();
    call.key(keys.stream(partition))
        .key(keys.dead(partition))
        .arg(group)
        .arg(owner)
        .arg(counts.len())
        .arg(retention_ms);
    for c in &counts {
        call.key(c);
    }
    for (d, ci) in decisions.iter().zip(index) {
        call.key(keys.delivery(partition, &d.delivery.id))
            .arg(d.entry)
            .arg(&d.delivery.id)
            .arg(d.outcome.as_str())
            .arg(d.reason.as_str())
            .arg(ci);
    }
    let decided: Vec<i64> = call.invoke_async(conn).await?;
    Ok(decided.into_iter().map(|d| d == 1).collect())
}

/// Requeues a failed (or, if allowed, outcome_unknown) delivery.
pub async fn requeue(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    delivery: &str,
    campaign: &str,
    period: &str,
    allow_unknown: bool,
) -> RedisResult<Requeue> {
    let result: String = SCRIPTS
        .requeue
        .key(keys.stream(partition))
        .key(keys.delivery(partition, delivery))
        .key(keys.counts(partition, campaign, period))
        .arg(delivery)
        .arg(u8::from(allow_unknown))
        .invoke_async(conn)
        .await?;
    Ok(Requeue::parse(&result))
}

/// Pauses sending for `ms` (only ever lengthening a pause); true if set or lengthened.
pub async fn pause(conn: &mut impl ConnectionLike, keys: &Keys, reason: &str, ms: u64) -> RedisResult<bool> {
    let set: i64 = SCRIPTS.pause.key(keys.paused()).arg(reason).arg(ms).invoke_async(conn).await?;
    Ok(set == 1)
}
