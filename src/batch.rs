//! A batch record's life around its request: seal (seal.lua), the last gate
//! (gate.lua, in the few milliseconds before its slot, then WAIT with replicas),
//! settle (settle.lua) or reschedule and put back (reschedule.lua). Any failure to
//! record an outcome leaves the batch sealed under a lease that expires, and
//! whoever takes it over resends the same bytes with the same key.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;

use crate::config::Config;
use crate::ctx::Ctx;
use crate::db::Conn;
use crate::db::scripts::{
    self, BatchFound, Gate, GateLimits, GateRequest, Reschedule, SealRequest, Settlement, Settler, Verdict,
};
use crate::id::new_id;
use crate::outcome::{Failpoint, Outcome, Reason};
use crate::work::{DeliveryRef, Ready, Sealed};

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
        ctx.metrics.settled(&d.campaign, Outcome::Skipped, Some(reason), 1);
    }
}

/// The Idempotency-Key of a batch: unique per batch, fixed once sealed.
pub fn idempotency_key(prefix: &str, batch: &str) -> String {
    format!("{prefix}-{batch}")
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
        ctx.metrics.settled(campaign, outcome, reason, n);
    }
}
