//! The last gate: in the few milliseconds before its slot, one script call (gate.lua)
//! asks whether a sealed batch may still leave: held by this instance, not paused,
//! within its deadline and the resend window, and every member still wanted (entitled,
//! subscribed, no address suppressed). Members no longer wanted are settled skipped
//! and a never-sent batch is sealed again without them; with replicas, the gate's
//! write is WAITed for and read back before the request may leave.

use std::time::Duration;

use bytes::Bytes;

use crate::config::Config;
use crate::model::id::new_id;
use crate::model::outcome::{Failpoint, Outcome, Reason};
use crate::model::work::{Channel, DeliveryRef, Sealed};
use crate::send::ctx::Ctx;
use crate::send::{seal, settle};
use crate::store::Conn;
use crate::store::records;
use crate::store::scripts::{self, Gate, GateLimits, GateRequest, Settler, Verdict};

/// The gate's limits from the config.
fn gate_limits(config: &Config) -> GateLimits {
    let d = &config.delivery;
    GateLimits {
        lease_ms: crate::model::ms(config.lease()),
        window_ms: crate::model::ms(d.resend_window()),
        deadline_ms: crate::model::ms(d.deadline()),
        maybe_sent_deadline_ms: crate::model::ms(d.maybe_sent_deadline()),
        retention_secs: config.retention().as_secs(),
    }
}

/// What the last gate said of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gated {
    /// The request may leave (with the batch updated if members were dropped).
    Go,
    /// It may not, and the gate has done what follows (settled, put back, left for a taker).
    Stop,
    /// Replicas did not acknowledge the gate's write: the request has not left, and the
    /// batch, still 'sending', is the caller's to put back.
    Unreplicated,
    /// The partition's Redis did not answer: the batch stays sealed and is taken over
    /// after its lease (or resent by this instance once it reaches it again).
    Unreached,
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

/// Whether partition `p`'s replicas acknowledge again, asked on the connection its gates
/// run on: the probe's `WAIT` must not hold the shared connection to that node (the
/// limiter's, and other partitions', calls), as a gate's must not.
pub(crate) async fn probe_replicas(ctx: &Ctx, conns: &GateConns, p: u16) -> anyhow::Result<bool> {
    let mut gate_conn = conns.get(ctx, p).await?;
    ctx.store.replicas_probe(gate_conn.conn(), p, ctx.config.heartbeat() / 2).await
}

/// Runs the last gate for `b`, just before its slot, and acts on what it says. On a
/// Redis error, or no answer within `patience` (when given), [`Gated::Unreached`]: the
/// batch stays sealed and is taken over after its lease.
pub(crate) async fn pass(ctx: &Ctx, conns: &GateConns, b: &mut Sealed, patience: Option<Duration>) -> Gated {
    let ran = match patience {
        Some(patience) => tokio::time::timeout(patience, run(ctx, conns, b))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {patience:?}"))),
        None => run(ctx, conns, b).await,
    };
    match ran {
        Ok(gated) => gated,
        Err(e) => {
            ctx.metrics.redis_error("gate", &e);
            Gated::Unreached
        }
    }
}

async fn run(ctx: &Ctx, conns: &GateConns, b: &mut Sealed) -> anyhow::Result<Gated> {
    let mut gate_conn = conns.get(ctx, b.partition).await?;
    let conn = gate_conn.conn();
    let new_key = seal::idempotency_key(&ctx.config.redis.prefix, &new_id());
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
            settle::record(ctx, b.partition, &b.id, &b.members, Settler::Holder(&ctx.owner), verdicts, &[]).await;
            false
        }
        Gate::Paused => {
            settle::put_back(ctx, b, settle::QUOTA_RECHECK).await;
            false
        }
        Gate::Expired => {
            tracing::error!(
                deliveries = b.members.len(),
                "sealed batch outlived the provider's idempotency window without a known outcome; \
                 its deliveries are outcome_unknown and will not be resent"
            );
            settle::record_all(ctx, b, Verdict::Unknown(Reason::IdempotencyWindowPassed), None).await;
            false
        }
        Gate::Deadline { maybe_sent } => {
            tracing::error!(deliveries = b.members.len(), maybe_sent, "batch passed its delivery deadline");
            let verdict = if maybe_sent { Verdict::Unknown(Reason::Expired) } else { Verdict::Failed(Reason::Expired) };
            settle::record_all(ctx, b, verdict, None).await;
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
            settle::record(ctx, b.partition, &b.id, &b.members, Settler::Lost, verdicts, &[]).await;
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
            let holder = records::batch_holder(conn, &ctx.store.keys, b.partition, &b.id).await?;
            let held = holder.owner.as_deref() == Some(ctx.owner.as_str())
                && holder.state.as_deref() == Some("sending")
                && holder.key.as_deref() == Some(b.key.as_str());
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
