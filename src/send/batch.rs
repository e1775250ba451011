//! A batch record's life around its request: seal (seal.lua), the last gate
//! (gate.lua, in the few milliseconds before its slot, then WAIT with replicas),
//! settle (settle.lua) or reschedule and put back (reschedule.lua), and for operator
//! mail whose sender was refused, sealing it once again from its fallback sender
//! (fallback.lua). Any failure to
//! record an outcome leaves the batch sealed under a lease that expires, and
//! whoever takes it over resends the same bytes with the same key.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;

use crate::config::Config;
use crate::model::error_name::ErrorName;
use crate::model::id::new_id;
use crate::model::outcome::{Failpoint, Outcome, Reason};
use crate::model::work::{Audience, Channel, DeliveryRef, Lane, Ready, Sealed};
use crate::resend::{Action, ProviderError};
use crate::send::ctx::Ctx;
use crate::store::Conn;
use crate::store::scripts::{
    self, BatchFound, Fallback, FallbackRequest, Gate, GateLimits, GateRequest, Reschedule, SealRequest, Settlement,
    Settler, Verdict,
};

/// The gate's limits from the config.
fn gate_limits(config: &Config) -> GateLimits {
    let d = &config.delivery;
    GateLimits {
        lease_ms: config.lease().as_millis() as u64,
        window_ms: d.resend_window().as_millis() as u64,
        deadline_ms: d.deadline().as_millis() as u64,
        maybe_sent_deadline_ms: d.maybe_sent_deadline().as_millis() as u64,
        retention_secs: config.retention().as_secs(),
    }
}

/// What the last gate said of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gated {
    /// The request may leave (with the batch updated if members were dropped).
    Go,
    /// It may not, and the gate has done what follows (settled, put back, left for a taker).
    Stop,
    /// Replicas did not acknowledge the gate's write: the request has not left, and the
    /// batch, still 'sending', is the caller's to put back.
    Unreplicated,
}

/// The connections last gates run on. On a cluster with `redis.wait_replicas`, each
/// partition has one of its own: `WAIT` blocks the connection it is sent on (up to a
/// second when no replica answers), and on the shared multiplexed connection it would
/// hold every command to that node, other partitions' and the limiter's included.
/// Elsewhere a gate takes any connection (from the pool, one client each).
pub(crate) struct GateConns(Option<Vec<tokio::sync::Mutex<Option<Conn>>>>);

/// A connection for one gate: any, or its partition's own (held until the gate is done).
enum GateConn<'a> {
    Any(Conn),
    Own(tokio::sync::MutexGuard<'a, Option<Conn>>),
}

impl GateConns {
    pub(crate) fn new(config: &Config) -> GateConns {
        let r = &config.redis;
        GateConns((r.cluster && r.wait_replicas > 0).then(|| (0..r.partitions).map(|_| Default::default()).collect()))
    }

    async fn get(&self, ctx: &Ctx, p: u16) -> anyhow::Result<GateConn<'_>> {
        let Some(own) = &self.0 else { return Ok(GateConn::Any(ctx.store.conn().await?)) };
        let mut conn = own[usize::from(p)].lock().await;
        if conn.is_none() {
            *conn = Some(ctx.store.dedicated().await?);
        }
        Ok(GateConn::Own(conn))
    }
}

impl GateConn<'_> {
    fn conn(&mut self) -> &mut Conn {
        match self {
            GateConn::Any(conn) => conn,
            GateConn::Own(conn) => conn.as_mut().expect("made in get"),
        }
    }
}

/// Runs the last gate for `b`, just before its slot, and acts on what it says. On a
/// Redis error, [`Gated::Stop`]: the batch stays sealed and is taken over after its lease.
pub(crate) async fn pass_gate(ctx: &Ctx, conns: &GateConns, b: &mut Sealed) -> Gated {
    match last_gate(ctx, conns, b).await {
        Ok(gated) => gated,
        Err(e) => {
            ctx.metrics.redis_error("gate", &e);
            Gated::Stop
        }
    }
}

async fn last_gate(ctx: &Ctx, conns: &GateConns, b: &mut Sealed) -> anyhow::Result<Gated> {
    let mut gate_conn = conns.get(ctx, b.partition).await?;
    let conn = gate_conn.conn();
    let new_key = idempotency_key(&ctx.config.redis.prefix, &new_id());
    let request = GateRequest {
        partition: b.partition,
        batch: &b.id,
        owner: &ctx.owner,
        new_key: &new_key,
        limits: gate_limits(&ctx.config),
        maybe_sent: b.maybe_sent,
    };
    let go = match scripts::gate(conn, &ctx.store.keys, &request, &b.members).await? {
        Gate::Go { .. } => true,
        Gate::Resealed { key, body, kept, skipped, .. } => {
            tracing::info!(skipped = skipped.len(), "members no longer wanted were left out at the last gate");
            count_skipped(ctx, &b.members, &skipped);
            let mut all: Vec<Option<DeliveryRef>> = std::mem::take(&mut b.members).into_iter().map(Some).collect();
            b.members = kept.iter().filter_map(|&i| all.get_mut(i).and_then(Option::take)).collect();
            b.key = key;
            b.body = Bytes::from(body);
            true
        }
        Gate::Empty { skipped } => {
            count_skipped(ctx, &b.members, &skipped);
            false
        }
        Gate::Withhold { reasons } => {
            tracing::warn!(
                "a request that may have been sent holds members no longer wanted: it is not resent, and its \
                 deliveries are outcome_unknown"
            );
            let verdicts = reasons.into_iter().map(|r| Verdict::Unknown(r.unwrap_or(Reason::Withheld))).collect();
            settle(ctx, b.partition, &b.id, &b.members, Settler::Holder(&ctx.owner), verdicts, &[]).await;
            false
        }
        Gate::Paused => {
            put_back(ctx, b, QUOTA_RECHECK).await;
            false
        }
        Gate::Expired => {
            tracing::error!(
                deliveries = b.members.len(),
                "sealed batch outlived the provider's idempotency window without a known outcome; \
                 its deliveries are outcome_unknown and will not be resent"
            );
            settle_all(ctx, b, Verdict::Unknown(Reason::IdempotencyWindowPassed), None).await;
            false
        }
        Gate::Deadline { maybe_sent } => {
            tracing::error!(deliveries = b.members.len(), maybe_sent, "batch passed its delivery deadline");
            let verdict = if maybe_sent { Verdict::Unknown(Reason::Expired) } else { Verdict::Failed(Reason::Expired) };
            settle_all(ctx, b, verdict, None).await;
            false
        }
        Gate::NotHeld => {
            tracing::info!("batch was taken over by another holder before its request left");
            false
        }
        Gate::Settled => {
            tracing::debug!("batch was taken over and settled by another holder");
            false
        }
        Gate::Lost => {
            tracing::error!(deliveries = b.members.len(), "a sealed batch's record is gone (a lost write)");
            let verdicts = vec![Verdict::Unknown(Reason::RecordLost); b.members.len()];
            settle(ctx, b.partition, &b.id, &b.members, Settler::Lost, verdicts, &[]).await;
            false
        }
    };
    if !go {
        return Ok(Gated::Stop);
    }
    ctx.failpoints.at(Failpoint::Gating).await;
    replicated(ctx, conn, b).await
}

/// With `redis.wait_replicas`, waits until replicas hold the gate's 'sending' of `b`: a
/// new primary must not think the request never left and re-seal it under another key.
async fn replicated(ctx: &Ctx, conn: &mut Conn, b: &Sealed) -> anyhow::Result<Gated> {
    let batch_key = ctx.store.keys.batch(b.partition, &b.id);
    match ctx.store.replicated(conn, &batch_key).await {
        Ok(true) if ctx.config.redis.wait_replicas == 0 => Ok(Gated::Go),
        Ok(true) => {
            // The gate's write must still be there: after a failover between the gate and
            // WAIT, the new primary's WAIT acknowledges writes that do not include it, and
            // the batch may since be another holder's, or a resend of one already sent.
            let (owner, state, key): (Option<String>, Option<String>, Option<String>) =
                redis::cmd("HMGET").arg(&batch_key).arg("owner").arg("state").arg("key").query_async(conn).await?;
            let held = owner.as_deref() == Some(ctx.owner.as_str())
                && state.as_deref() == Some("sending")
                && key.as_deref() == Some(b.key.as_str());
            if !held {
                tracing::warn!("the last gate's write was lost in a failover; the batch is taken over after its lease");
                return Ok(Gated::Stop);
            }
            Ok(Gated::Go)
        }
        // Not acknowledged, or not asked (a failover under way): the request has not left,
        // so the batch must go back unsent, never be left 'sending' to look maybe sent.
        Ok(false) => Ok(Gated::Unreplicated),
        Err(e) => {
            ctx.metrics.redis_error("wait", &e);
            Ok(Gated::Unreplicated)
        }
    }
}

/// Counts the members the gate skipped (those it actually settled).
fn count_skipped(ctx: &Ctx, members: &[DeliveryRef], skipped: &[(usize, Reason)]) {
    for (i, reason) in skipped {
        let Some(d) = members.get(*i) else { continue };
        if *reason == Reason::RecordLost {
            tracing::error!(delivery = %d.id(), "a member's record no longer names its batch; left out of it");
            continue;
        }
        ctx.metrics.settled(&d.campaign, Channel::Email, Outcome::Skipped, Some(reason), 1);
    }
}

/// The Idempotency-Key of a batch: unique per batch, fixed once sealed.
pub fn idempotency_key(prefix: &str, batch: &str) -> String {
    format!("{prefix}-{batch}")
}

/// What ends the Idempotency-Key of a fallback request (no key of ours ends so otherwise).
const FALLBACK_SUFFIX: &str = ".fallback";

/// Resend's longest Idempotency-Key, in characters.
const MAX_KEY: usize = 256;

/// The Idempotency-Key of the fallback request that follows a request under `key` whose
/// sender Resend refused: `key`, cut so that the whole never exceeds Resend's 256
/// characters, then a fixed suffix. Derived, not drawn, so whoever seals it names the
/// same request. (Our keys are at most 155 characters: none is cut in practice.)
pub fn fallback_key(key: &str) -> String {
    let keep: String = key.chars().take(MAX_KEY - FALLBACK_SUFFIX.len()).collect();
    format!("{keep}{FALLBACK_SUFFIX}")
}

/// Whether a request under `key` is the fallback of a refused one.
pub(crate) fn is_fallback_key(key: &str) -> bool {
    key.ends_with(FALLBACK_SUFFIX)
}

/// Whether a request answered with `action` may fall back to another sender: only a
/// sender refusal, of a request that is no fallback already, when neither this answer
/// nor anything its holder knows says a request of it may have been processed (a
/// refusal now does not prove an earlier request was refused too). The record is asked
/// too, by fallback.lua; and only operator mail has a sender to fall back to.
pub fn may_fall_back(action: Action, maybe_sent_now: bool, maybe_sent_before: bool, fallback_already: bool) -> bool {
    action == Action::SenderRejected && !maybe_sent_now && !maybe_sent_before && !fallback_already
}

/// What [`fall_back`] did.
#[derive(Debug)]
pub(crate) enum FellBack {
    /// Sealed again from the fallback sender: send this.
    Sealed(Sealed),
    /// No fallback (customer mail, none configured, or the record says no): settle the
    /// refusal as it is.
    No,
    /// Redis did not answer: the batch is left as it is, for whoever takes it over after
    /// its lease (it finds the refused request 'sending', or the fallback sealed).
    Unknown,
}

/// The refusal a fallback request follows, as its batch record keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub template: String,
    pub error: ErrorName,
    pub status: u16,
}

/// The refusal that batch `b` is the fallback of, or `None` when it is not a fallback
/// (one read, and only for a fallback: the record goes once it is settled).
pub(crate) async fn refusal_of(ctx: &Ctx, b: &Sealed) -> Option<Refusal> {
    if !is_fallback_key(&b.key) {
        return None;
    }
    let read = async {
        let mut conn = ctx.store.conn().await?;
        let (template, error, status): (Option<String>, Option<String>, Option<u16>) = redis::cmd("HMGET")
            .arg(ctx.store.keys.batch(b.partition, &b.id))
            .arg("fallback_template")
            .arg("fallback_error")
            .arg("fallback_status")
            .query_async(&mut conn)
            .await?;
        anyhow::Ok(template.zip(error).map(|(template, error)| Refusal {
            template,
            error: ErrorName::parse(&error),
            status: status.unwrap_or_default(),
        }))
    };
    read.await.unwrap_or_else(|e| {
        ctx.metrics.redis_error("fallback", &e);
        None
    })
}

/// The operator template of `b` and its fallback sender: `Some` only for a request of
/// one operator email whose template names `fallback_from`, to an address that is one
/// of `[operators] to` now (read from its record: the config may have changed since it
/// was enqueued).
async fn fallback_sender(ctx: &Ctx, conn: &mut Conn, b: &Sealed) -> anyhow::Result<Option<(String, String)>> {
    let [member] = b.members.as_slice() else { return Ok(None) };
    let request: Option<String> = redis::cmd("HGET")
        .arg(ctx.store.keys.delivery(b.partition, &member.id()))
        .arg("request")
        .query_async(conn)
        .await?;
    let Some(request) = request.and_then(|r| serde_json::from_str::<crate::audience::ingest::Request>(&r).ok()) else {
        return Ok(None);
    };
    let to_operators = request.to.as_deref().is_some_and(|to| ctx.config.operators.includes(to));
    Ok(request.template.filter(|_| to_operators).and_then(|name| {
        let t = ctx.config.templates.get(&name).filter(|t| t.audience == Audience::Operators)?;
        Some((name, t.fallback_from.clone()?))
    }))
}

/// The emails of a sealed body, each from `from` instead.
fn from_sender(body: &[u8], from: &str) -> Option<Vec<String>> {
    let emails: Vec<serde_json::Map<String, serde_json::Value>> = serde_json::from_slice(body).ok()?;
    let swap = |mut email: serde_json::Map<String, serde_json::Value>| {
        email.insert("from".into(), from.into());
        serde_json::to_string(&email).expect("an email serializes")
    };
    Some(emails.into_iter().map(swap).collect())
}

/// Resend refused the sender of `b` (`e`, an answer: nothing of this request was sent)
/// and, as far as its holder knows, no earlier request of it may have been processed
/// ([`may_fall_back`]): if it is operator mail whose template names a fallback sender,
/// seals it again from that sender under [`fallback_key`], still held, to send as its
/// holder's next resend.
pub(crate) async fn fall_back(ctx: &Ctx, b: &Sealed, e: &ProviderError) -> FellBack {
    // Customer mail is never looked up: a request of one transactional email at most.
    if b.members.len() != 1 || b.members[0].lane() != Lane::Transactional {
        return FellBack::No;
    }
    let result = async {
        let mut conn = ctx.store.conn().await?;
        let Some((template, from)) = fallback_sender(ctx, &mut conn, b).await? else { return Ok(FellBack::No) };
        let Some(emails) = from_sender(&b.body, &from) else {
            tracing::error!(template, "a sealed body is not a list of emails; no sender fallback");
            return Ok(FellBack::No);
        };
        let key = fallback_key(&b.key);
        let request = FallbackRequest {
            partition: b.partition,
            batch: &b.id,
            owner: &ctx.owner,
            refused_key: &b.key,
            key: &key,
            template: &template,
            error: e.name.as_str(),
            status: e.status.unwrap_or_default(),
            lease_ms: ctx.config.lease().as_millis() as u64,
            retention_secs: ctx.config.retention().as_secs(),
        };
        let sealed = match scripts::fallback(&mut conn, &ctx.store.keys, &request, &b.members, &emails).await? {
            Fallback::Sealed { body } => body,
            other => {
                tracing::info!(template, outcome = ?other, "no sender fallback for this request");
                return Ok(FellBack::No);
            }
        };
        tracing::info!(
            template,
            error = e.name.as_str(),
            "sender refused: operator mail sealed again from fallback_from"
        );
        ctx.failpoints.at(Failpoint::FellBack).await;
        let again = Sealed { key, body: Bytes::from(sealed), tries: b.tries + 1, maybe_sent: false, ..b.clone() };
        anyhow::Ok(FellBack::Sealed(again))
    };
    result.await.unwrap_or_else(|err| {
        ctx.metrics.redis_error("fallback", &err);
        FellBack::Unknown
    })
}

/// Seals the emails of partition `p` into a new batch (those still held by this
/// instance); `None` when nothing was sealed.
pub(crate) async fn seal(ctx: &Ctx, p: u16, items: Vec<Ready>) -> Option<Sealed> {
    match seal_batch(ctx, p, items).await {
        Ok(sealed) => {
            ctx.failpoints.at(Failpoint::Sealed).await;
            sealed
        }
        Err(e) => {
            // What was sealed is recovered from its records; the rest stays claimed and is
            // reclaimed after its lease.
            ctx.metrics.redis_error("seal", &e);
            None
        }
    }
}

async fn seal_batch(ctx: &Ctx, p: u16, items: Vec<Ready>) -> anyhow::Result<Option<Sealed>> {
    let batch = new_id();
    let key = idempotency_key(&ctx.config.redis.prefix, &batch);
    let request = SealRequest {
        partition: p,
        batch: &batch,
        idempotency_key: &key,
        owner: &ctx.owner,
        group: &ctx.config.redis.group,
        lease_ms: ctx.config.lease().as_millis() as u64,
    };
    let mut conn = ctx.store.conn().await?;
    let positions = scripts::seal(&mut conn, &ctx.store.keys, &request, &items).await?;
    if positions.len() < items.len() {
        tracing::info!(
            partition = p,
            dropped = items.len() - positions.len(),
            "deliveries taken over by another holder were left out of the batch"
        );
    }
    if positions.is_empty() {
        return Ok(None);
    }
    // The same body seal.lua stored: the sealed members' JSON, in order.
    let mut body = String::with_capacity(positions.iter().map(|&i| items[i].json.len() + 1).sum::<usize>() + 2);
    body.push('[');
    for (n, &i) in positions.iter().enumerate() {
        if n > 0 {
            body.push(',');
        }
        body.push_str(&items[i].json);
    }
    body.push(']');
    let mut items: Vec<Option<Ready>> = items.into_iter().map(Some).collect();
    let members = positions.iter().filter_map(|&i| items[i].take()).map(|r| r.delivery).collect();
    Ok(Some(Sealed::new(p, batch, key, Bytes::from(body), members)))
}

/// How soon a batch refused for quota, or put back during a pause, is due again
/// (no instance takes a batch while paused).
pub(crate) const QUOTA_RECHECK: Duration = Duration::from_secs(1);

/// Puts a sealed batch this instance holds back in Redis, unsent, due after `delay`
/// (its slot moved far away, a pause, a stop), so another instance may take it and
/// nobody thinks this request may have been sent; what the holder knows of earlier
/// ones is written back with it (a failover may have taken the record's mark back).
pub(crate) async fn put_back(ctx: &Ctx, b: &Sealed, delay: Duration) {
    let r = Reschedule {
        delay_ms: delay.as_millis() as u64,
        failed_request: false,
        maybe_sent: b.maybe_sent,
        error: Reason::Postponed,
    };
    reschedule(ctx, b.partition, &b.id, &r).await;
}

pub(crate) async fn reschedule(ctx: &Ctx, partition: u16, batch: &str, r: &Reschedule) {
    let result = async {
        let mut conn = ctx.store.conn().await?;
        anyhow::Ok(scripts::reschedule(&mut conn, &ctx.store.keys, partition, batch, &ctx.owner, r).await?)
    };
    match result.await {
        Ok(Some(_)) => {}
        Ok(None) => tracing::info!("batch was taken over by another holder; its retry is theirs"),
        Err(err) => ctx.metrics.redis_error("reschedule", &err),
    }
}

/// Settles every member of a batch this instance holds with one verdict.
pub(crate) async fn settle_all(ctx: &Ctx, b: &Sealed, verdict: Verdict, said: Option<&str>) {
    let verdicts = vec![verdict; b.members.len()];
    let said = vec![said; b.members.len()];
    settle(ctx, b.partition, &b.id, &b.members, Settler::Holder(&ctx.owner), verdicts, &said).await;
}

/// Records each member's verdict (same order as the batch) and counts what was recorded;
/// false when Redis could not be asked (the batch stays sealed for recovery).
pub(crate) async fn settle(
    ctx: &Ctx,
    partition: u16,
    batch: &str,
    members: &[DeliveryRef],
    by: Settler<'_>,
    verdicts: Vec<Verdict>,
    said: &[Option<&str>],
) -> bool {
    let settlements: Vec<Settlement<'_>> =
        members.iter().zip(verdicts).map(|(member, verdict)| Settlement { member, verdict }).collect();
    let result = async {
        let mut conn = ctx.store.conn().await?;
        let retention = ctx.config.retention().as_secs();
        let keys = &ctx.store.keys;
        anyhow::Ok(scripts::settle_saying(&mut conn, keys, partition, batch, by, &settlements, retention, said).await?)
    };
    match result.await {
        Ok(settled) => {
            // Already settled by another holder is a normal race (a holder that stalled past
            // its lease): only a record truly missing is a lost write.
            if settled.batch == BatchFound::Missing && by == Settler::Answer {
                let recorded = settled.recorded.iter().filter(|r| r.is_some()).count();
                tracing::error!(
                    deliveries = members.len(),
                    recorded,
                    "the provider accepted a batch whose record is gone (a lost write); its answer was recorded \
                     on the deliveries, so none is sent again"
                );
                ctx.metrics.lost_batch(members.len() as u64);
            }
            if settled.recorded.iter().all(Option::is_none) {
                tracing::debug!("batch was already settled, or taken over by another holder");
                return true;
            }
            ctx.failpoints.at(Failpoint::Settled).await;
            count_settled(ctx, &settlements, &settled.recorded);
            true
        }
        // The batch stays sealed; after its lease, a taker resends (a replay) and settles.
        Err(err) => {
            ctx.metrics.redis_error("settle", &err);
            false
        }
    }
}

/// Counts what settle.lua recorded (which may differ from what was asked: a failure
/// becomes outcome_unknown when an attempt may have been sent).
fn count_settled(ctx: &Ctx, settlements: &[Settlement<'_>], recorded: &[Option<Outcome>]) {
    let mut tally: HashMap<(&str, Outcome, Option<&Reason>), u64> = HashMap::new();
    for (s, outcome) in settlements.iter().zip(recorded) {
        if let Some(outcome) = *outcome {
            let reason = if outcome == Outcome::Sent { None } else { s.verdict.reason() };
            *tally.entry((s.member.campaign.as_str(), outcome, reason)).or_default() += 1;
        }
    }
    for ((campaign, outcome, reason), n) in tally {
        ctx.metrics.settled(campaign, Channel::Email, outcome, reason, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fallback_key_never_exceeds_resend_s_256_characters() {
        let key = idempotency_key("mailstream", "01JD0000000000000000000000");
        assert_eq!(fallback_key(&key), format!("{key}.fallback"));
        assert!(is_fallback_key(&fallback_key(&key)) && !is_fallback_key(&key));
        for len in [1, 246, 247, 248, 255, 256] {
            let key = "k".repeat(len);
            let derived = fallback_key(&key);
            assert!(derived.chars().count() <= MAX_KEY, "{len}: {}", derived.len());
            assert!(derived.ends_with(FALLBACK_SUFFIX) && derived != key, "{len}");
            assert!(key.starts_with(derived.trim_end_matches(FALLBACK_SUFFIX)), "{len}");
        }
        assert_eq!(fallback_key(&"k".repeat(256)).len(), 256);
        assert_eq!(fallback_key(&"k".repeat(255)).len(), 256);
        // Characters, not bytes: a key of 256 multi-byte characters is cut on one.
        assert_eq!(fallback_key(&"é".repeat(256)).chars().count(), 256);
    }

    #[test]
    fn only_a_first_sender_refusal_with_nothing_maybe_sent_may_fall_back() {
        assert!(may_fall_back(Action::SenderRejected, false, false, false));
        assert!(!may_fall_back(Action::SenderRejected, true, false, false), "this request may have been processed");
        assert!(!may_fall_back(Action::SenderRejected, false, true, false), "an earlier one may have been");
        assert!(!may_fall_back(Action::SenderRejected, false, false, true), "once only");
        for other in [Action::Fatal, Action::Retryable, Action::QuotaExhausted] {
            assert!(!may_fall_back(other, false, false, false), "{other}");
        }
    }

    #[test]
    fn a_fallback_body_changes_the_sender_only() {
        let body = br#"[{"from":"Acme <digest@acme.example>","to":["oncall@acme.example"],"subject":"s","text":"t"}]"#;
        let emails = from_sender(body, "Alerts <alerts@fallback.example>").unwrap();
        let email: serde_json::Value = serde_json::from_str(&emails[0]).unwrap();
        assert_eq!(email["from"], "Alerts <alerts@fallback.example>");
        assert_eq!((email["to"][0].as_str(), email["subject"].as_str()), (Some("oncall@acme.example"), Some("s")));
        assert!(from_sender(b"not json", "a@b.example").is_none());
    }
}
