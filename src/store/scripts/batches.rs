//! Batches: seal, the last gate, take, reschedule, the sender fallback, settle.

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::{SCRIPTS, counts_index, unexpected};
use crate::model::outcome::{Outcome, Reason};
use crate::model::work::{DeliveryRef, Lane, Ready};
use crate::store::keys::Keys;

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
///
/// Runs `lua/seal.lua`:
/// ```text
/// KEYS[1] batch, KEYS[2] batches zset, KEYS[3] digest stream, KEYS[4] transactional stream,
///   KEYS[4+i] delivery key of member i
/// ARGV[1] batch id, ARGV[2] idempotency key, ARGV[3] owner, ARGV[4] group, ARGV[5] lease ms;
///   then per member: stream entry id, delivery id, email JSON, A/B variant ('' for none; kept
///   on the record, counted as an exposure by settle.lua once the provider accepted it), the
///   hashes of its email's addresses, comma-separated ('-' for none)
/// ```
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
        call.arg(keys.address_hashes(&m.recipients()));
    }
    read_seal(call.invoke_async(conn).await?)
}

/// seal.lua's answer: the 1-based positions of the members it sealed.
pub(super) fn read_seal(sealed: Vec<usize>) -> RedisResult<Vec<usize>> {
    sealed.into_iter().map(|i| i.checked_sub(1).ok_or_else(|| unexpected("seal.lua", "position 0"))).collect()
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
///
/// Runs `lua/gate.lua`:
/// ```text
/// KEYS[1] batch, KEYS[2] batches zset, KEYS[3] pause key, KEYS[4] suppressed addresses,
///   KEYS[5] recent settlements, KEYS[6] settlements per minute, KEYS[7..6+c] counts hashes, then
///   per member: delivery key, subscriber key
/// ARGV[1] batch id, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] window ms, ARGV[5] deadline ms,
///   ARGV[6] maybe-sent deadline ms, ARGV[7] retention seconds, ARGV[8] new key, ARGV[9] c,
///   ARGV[10] '1' if the holder knows an earlier request may have been processed (it took the
///   batch so marked: a failover may have taken the record's mark back since), else '0';
///   then per member: its campaign (a subscriber may have turned one campaign off:
///   `off:<campaign>`), counts index (1-based), '1' to check its subscriber record
/// ```
pub async fn gate(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    req: &GateRequest<'_>,
    members: &[DeliveryRef],
) -> RedisResult<Gate> {
    let (p, batch, limits) = (req.partition, req.batch, &req.limits);
    let (counts, index) = counts_index(keys, p, members.iter());
    let mut call = SCRIPTS.gate.prepare_invoke();
    call.key(keys.batch(p, batch))
        .key(keys.batches(p))
        .key(keys.paused(p))
        .key(keys.suppressed(p))
        .key(keys.recent(p))
        .key(keys.per_minute(p))
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
    read_gate(call.invoke_async(conn).await?)
}

/// gate.lua's answer (see the script for each shape).
pub(super) fn read_gate(row: Vec<String>) -> RedisResult<Gate> {
    // Only the tag in an error: the rest may hold a body, and with it addresses.
    let bad = || unexpected("gate.lua", row.first().map_or("", String::as_str));
    let skipped = |s: &str| -> RedisResult<Vec<(usize, Reason)>> {
        s.split(' ')
            .filter(|item| !item.is_empty())
            .map(|item| match item.split_once(':').map(|(i, r)| (i.parse(), r)) {
                Some((Ok(i), r)) => Ok((i, Reason::parse(r))),
                _ => Err(bad()),
            })
            .collect()
    };
    let number = |s: &str| s.parse::<u32>().map_err(|_| bad());
    let positions = |s: &str| -> RedisResult<Vec<usize>> {
        s.split(' ').filter(|i| !i.is_empty()).map(|i| i.parse().map_err(|_| bad())).collect()
    };
    Ok(match row.as_slice() {
        [tag, sends] if tag == "go" => Gate::Go { sends: number(sends)? },
        [tag, sends, key, body, kept, gone] if tag == "resealed" => Gate::Resealed {
            sends: number(sends)?,
            key: key.clone(),
            body: body.clone(),
            kept: positions(kept)?,
            skipped: skipped(gone)?,
        },
        [tag, gone] if tag == "empty" => Gate::Empty { skipped: skipped(gone)? },
        [tag, reasons] if tag == "withhold" => {
            Gate::Withhold { reasons: reasons.split(' ').map(|r| (!r.is_empty()).then(|| Reason::parse(r))).collect() }
        }
        [tag] if tag == "paused" => Gate::Paused,
        [tag] if tag == "expired" => Gate::Expired,
        [tag, maybe] if tag == "deadline" && (maybe == "0" || maybe == "1") => {
            Gate::Deadline { maybe_sent: maybe == "1" }
        }
        [tag] if tag == "not_held" => Gate::NotHeld,
        [tag] if tag == "settled" => Gate::Settled,
        [tag] if tag == "lost" => Gate::Lost,
        _ => return Err(bad()),
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
fn parse_members(ids: &str) -> Vec<DeliveryRef> {
    ids.split(' ').filter_map(DeliveryRef::parse).collect()
}

/// Takes over a batch whose retry is due or whose holder's lease expired.
///
/// Runs `lua/take.lua`:
/// ```text
/// KEYS[1] batch, KEYS[2] batches zset
/// ARGV[1] batch id, ARGV[2] owner, ARGV[3] lease ms, ARGV[4] resend window ms
/// ```
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
    read_take(row)
}

/// take.lua's answer (see the script for each shape).
pub(super) fn read_take(row: Vec<String>) -> RedisResult<Take> {
    // Only the tag in an error: the rest may hold a body, and with it addresses.
    let bad = || unexpected("take.lua", row.first().map_or("", String::as_str));
    Ok(match row.as_slice() {
        [tag, key, body, ids, tries, maybe_sent] if tag == "take" => Take::Take {
            key: key.clone(),
            body: body.clone(),
            members: parse_members(ids),
            tries: tries.parse().map_err(|_| bad())?,
            maybe_sent: maybe_sent == "1",
        },
        [tag, ids] if tag == "expired" => Take::Expired { members: parse_members(ids) },
        [tag] if tag == "lost" => Take::Lost,
        [tag] if tag == "skip" => Take::Skip,
        _ => return Err(bad()),
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
    /// What the provider said (addresses masked), kept in the batch's `attempts`.
    pub said: Option<String>,
}

/// Reschedules a held batch; returns its failed requests so far, `None` when this
/// owner no longer holds it.
///
/// Runs `lua/reschedule.lua`:
/// ```text
/// KEYS[1] batch, KEYS[2] batches zset
/// ARGV[1] batch id, ARGV[2] owner, ARGV[3] delay ms, ARGV[4] 1 if this was a failed request
/// (0: put back unsent), ARGV[5] 1 if the request may have been processed, ARGV[6] error name,
/// ARGV[7] what the provider said ('' for nothing; addresses masked)
/// ```
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
        .arg(r.said.as_deref().unwrap_or(""))
        .invoke_async(conn)
        .await?;
    read_reschedule(tries)
}

/// reschedule.lua's answer: the failed requests so far, or -1 when no longer held.
pub(super) fn read_reschedule(tries: i64) -> RedisResult<Option<u32>> {
    match tries {
        -1 => Ok(None),
        n => u32::try_from(n).map(Some).map_err(|_| unexpected("reschedule.lua", &n.to_string())),
    }
}

/// A request of operator mail whose sender Resend refused, to seal again from its
/// template's fallback sender (fallback.lua).
#[derive(Debug, Clone)]
pub struct FallbackRequest<'a> {
    pub partition: u16,
    pub batch: &'a str,
    pub owner: &'a str,
    /// The key of the refused request.
    pub refused_key: &'a str,
    /// The key derived from it, for the fallback request.
    pub key: &'a str,
    pub template: &'a str,
    /// The refusal's error name and HTTP status (kept on the record: the delivery records
    /// the original error if the fallback fails too).
    pub error: &'a str,
    pub status: u16,
    /// The holder's lease on the fallback (sealed, it sends it as its next resend).
    pub lease_ms: u64,
    /// How long the period's counts hash is kept.
    pub retention_secs: u64,
}

/// What fallback.lua did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fallback {
    /// Sealed again, held by the caller, with this body (the members' emails, in order).
    Sealed { body: String },
    /// Another holder has the batch, or the refused request is no longer its own.
    NotHeld,
    /// An earlier request may have been processed: no fallback.
    MaybeSent,
    /// It is a fallback already: one swap only.
    Again,
}

/// Seals a batch again from its fallback sender: `emails` are its members' email objects
/// (in the batch's order) with the fallback's `from`.
///
/// Runs `lua/fallback.lua`:
/// ```text
/// KEYS[1] batch, KEYS[2] batches zset, KEYS[3] the counts hash of its members' campaign
///   period (operator mail: one member), then per member its delivery key
/// ARGV[1] batch id, ARGV[2] owner, ARGV[3] the refused key, ARGV[4] the derived key,
///   ARGV[5] the new body, ARGV[6] its members' sizes, ARGV[7] the template,
///   ARGV[8] the refusal's error name, ARGV[9] its HTTP status, ARGV[10] lease ms,
///   ARGV[11] retention seconds (of the counts hash)
/// ```
pub async fn fallback(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    req: &FallbackRequest<'_>,
    members: &[DeliveryRef],
    emails: &[String],
) -> RedisResult<Fallback> {
    let p = req.partition;
    let body = format!("[{}]", emails.join(","));
    let sizes: Vec<String> = emails.iter().map(|e| e.len().to_string()).collect();
    let mut call = SCRIPTS.fallback.prepare_invoke();
    let Some(first) = members.first() else { return Ok(Fallback::NotHeld) };
    call.key(keys.batch(p, req.batch)).key(keys.batches(p)).key(keys.counts(p, &first.campaign, &first.period));
    for m in members {
        call.key(keys.delivery(p, &m.id()));
    }
    call.arg(req.batch)
        .arg(req.owner)
        .arg(req.refused_key)
        .arg(req.key)
        .arg(&body)
        .arg(sizes.join(" "))
        .arg(req.template)
        .arg(req.error)
        .arg(req.status)
        .arg(req.lease_ms)
        .arg(req.retention_secs);
    let reply: String = call.invoke_async(conn).await?;
    read_fallback(&reply, body)
}

/// fallback.lua's answer.
pub(super) fn read_fallback(reply: &str, body: String) -> RedisResult<Fallback> {
    Ok(match reply {
        "sealed" => Fallback::Sealed { body },
        "not_held" => Fallback::NotHeld,
        "maybe_sent" => Fallback::MaybeSent,
        "again" => Fallback::Again,
        other => return Err(unexpected("fallback.lua", other)),
    })
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
    settle_saying(conn, keys, partition, batch, by, settlements, retention_secs, &[]).await
}

/// [`settle`], keeping what the provider said of each member (`said`, aligned with
/// `settlements`, or empty for nothing; its message with addresses masked) on each
/// member recorded failed or outcome_unknown.
///
/// Runs `lua/settle.lua`:
/// ```text
/// KEYS[1] batch, KEYS[2] batches zset, KEYS[3] dead stream, KEYS[4] unknown stream,
/// KEYS[5] recent settlements, KEYS[6] settlements per minute, KEYS[7..6+c] counts hashes,
///   KEYS[7+c..] delivery keys of the members
/// ARGV[1] batch id, ARGV[2] c (number of counts keys), ARGV[3] retention seconds,
/// ARGV[4] mode: 'answer' (a 2xx answer), 'holder' (a verdict of the holder) or 'lost' (a lost
///   batch), ARGV[5] the holder ('' unless 'holder');
///   then per member: delivery id, state, detail (provider id or error name), counts index
///   (1-based), and what the provider said of it ('' for nothing; kept as `error_message`
///   on a member recorded failed or outcome_unknown now)
/// ```
#[allow(clippy::too_many_arguments)]
pub async fn settle_saying(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    batch: &str,
    by: Settler<'_>,
    settlements: &[Settlement<'_>],
    retention_secs: u64,
    said: &[Option<&str>],
) -> RedisResult<Settled> {
    let (counts, index) = counts_index(keys, partition, settlements.iter().map(|s| s.member));
    let (mode, holder) = match by {
        Settler::Answer => ("answer", ""),
        Settler::Holder(owner) => ("holder", owner),
        Settler::Lost => ("lost", ""),
    };
    let mut call = SCRIPTS.settle.prepare_invoke();
    call.key(keys.batch(partition, batch))
        .key(keys.batches(partition))
        .key(keys.dead(partition))
        .key(keys.unknown(partition))
        .key(keys.recent(partition))
        .key(keys.per_minute(partition))
        .arg(batch)
        .arg(counts.len())
        .arg(retention_secs)
        .arg(mode)
        .arg(holder);
    for c in &counts {
        call.key(c);
    }
    for (i, (s, ci)) in settlements.iter().zip(index).enumerate() {
        let id = s.member.id();
        call.key(keys.delivery(partition, &id))
            .arg(id)
            .arg(s.verdict.outcome().as_str())
            .arg(s.verdict.detail())
            .arg(ci)
            .arg(said.get(i).copied().flatten().unwrap_or(""));
    }
    let (status, recorded): (String, Vec<String>) = call.invoke_async(conn).await?;
    read_settle(status, recorded)
}

/// settle.lua's answer: what it found of the batch, and per member the outcome it
/// recorded now ('' where nothing changed).
pub(super) fn read_settle(status: String, recorded: Vec<String>) -> RedisResult<Settled> {
    let batch = match status.as_str() {
        "ok" => BatchFound::Open,
        "not_held" => BatchFound::NotHeld,
        "settled" => BatchFound::AlreadySettled,
        "missing" => BatchFound::Missing,
        _ => return Err(unexpected("settle.lua", &status)),
    };
    let recorded = recorded
        .iter()
        .map(|s| match s.as_str() {
            "" => Ok(None),
            outcome => outcome.parse::<Outcome>().map(Some).map_err(|_| unexpected("settle.lua", outcome)),
        })
        .collect::<RedisResult<_>>()?;
    Ok(Settled { batch, recorded })
}
