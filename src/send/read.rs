//! The partition readers. Their front half is one for email and every other channel:
//! entries are parsed, claimed (claim.lua), the claims mapped (held, done, gone, or
//! claimed too often), what is done acknowledged, and what will not be sent settled
//! (decide.lua) — [`claim_read`] and [`settle_decided`]. The email reader, [`EmailReader`],
//! then has each delivery resolved and rendered at send time (`resolve.rs`), hands what
//! is ready to the queues, and puts off what a render hook did not answer (defer.lua);
//! a channel's reader (`channels/`) fixes each message and sends it itself.

use std::sync::Arc;
use std::time::Duration;

use crate::audience::render::Renderer;
use crate::model::outcome::{Failpoint, Outcome, Reason};
use crate::model::work::{DeliveryRef, Lane, Ready};
use crate::send::ctx::Ctx;
use crate::send::queue::Batcher;
use crate::send::release;
use crate::send::resolve::{Fate, Resolver};
use crate::store::conn::Conn;
use crate::store::records;
use crate::store::scripts::{self, Claim, Decision, Deferred};
use crate::store::streams::{self, StreamEntry};

/// A delivery read from its stream (`entry`) and claimed by this instance.
pub(crate) struct Claimed {
    pub entry: String,
    pub delivery: DeliveryRef,
}

/// How a delivery claimed more than `delivery.max_claims` times ends (`too_many_attempts`):
/// `failed`, or — for a channel whose message field says a request of it may have left —
/// `outcome_unknown`.
#[derive(Clone, Copy)]
pub(crate) enum OverClaimed {
    /// Nothing of it can have left: an email is claimed only until it is sealed.
    Failed,
    /// `outcome_unknown` when the delivery's record holds this field (the message a
    /// channel fixes before its first request), else `failed`.
    UnknownIfWritten(&'static str),
}

/// A claimed delivery that will not be sent, by its index in [`ClaimedRead::items`].
pub(crate) struct NotSent {
    pub index: usize,
    pub outcome: Outcome,
    pub reason: Reason,
    /// Its record was gone at the claim: written back as decided.
    pub lost: bool,
}

impl NotSent {
    pub fn new(index: usize, outcome: Outcome, reason: Reason) -> NotSent {
        NotSent { index, outcome, reason, lost: false }
    }
}

/// One read, claimed: every well-formed delivery of it (`items`), those this instance now
/// holds (`live`, by index) and those that will not be sent (`decided`).
pub(crate) struct ClaimedRead {
    pub items: Vec<Claimed>,
    pub live: Vec<usize>,
    pub decided: Vec<NotSent>,
}

/// The front half of every reader: claims the deliveries `entries` of partition `p`'s
/// `lane` name, and acknowledges the entries whose work is done or owned elsewhere
/// (sealed or settled) and those naming no delivery of this lane. An entry held under a
/// live lease stays; one whose record is missing is a lost write, failed (`record_lost`)
/// and never acknowledged silently; one claimed too often ends as `over` says.
pub(crate) async fn claim_read(
    ctx: &Ctx,
    (p, lane): (u16, Lane),
    conn: &mut Conn,
    entries: Vec<StreamEntry>,
    over: OverClaimed,
) -> anyhow::Result<ClaimedRead> {
    let keys = &ctx.store.keys;
    let mut items = Vec::new();
    let mut ack = Vec::new();
    for (entry, id) in entries {
        match id.as_deref().and_then(DeliveryRef::parse).filter(|d| d.lane() == lane) {
            Some(delivery) => items.push(Claimed { entry, delivery }),
            None => ack.push(entry),
        }
    }
    if !ack.is_empty() {
        tracing::warn!(
            partition = p,
            entries = ack.len(),
            "stream entries without a delivery id of this lane acknowledged"
        );
    }
    let ids: Vec<String> = items.iter().map(|c| c.delivery.id()).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let claims = scripts::claim(conn, keys, p, &id_refs, &ctx.owner, crate::model::ms(ctx.config.lease())).await?;
    let (mut live, mut decided, mut over_claimed) = (Vec::new(), Vec::new(), Vec::new());
    for (i, claim) in claims.into_iter().enumerate() {
        match claim {
            Claim::Claimed { claims } if claims > ctx.config.delivery.max_claims => over_claimed.push(i),
            Claim::Claimed { .. } => live.push(i),
            Claim::Held => {}
            Claim::Done(_) => ack.push(items[i].entry.clone()),
            Claim::Gone => {
                tracing::error!(delivery = %ids[i], "a stream entry names a delivery whose record is gone");
                ctx.metrics.records_lost(1);
                decided.push(NotSent { index: i, outcome: Outcome::Failed, reason: Reason::RecordLost, lost: true });
            }
        }
    }
    let written = match over {
        OverClaimed::UnknownIfWritten(field) if !over_claimed.is_empty() => {
            let over_ids: Vec<String> = over_claimed.iter().map(|&i| ids[i].clone()).collect();
            records::deliveries_marked(conn, keys, p, &over_ids, field).await?
        }
        _ => vec![false; over_claimed.len()],
    };
    for (i, written) in over_claimed.into_iter().zip(written) {
        let outcome = if written { Outcome::OutcomeUnknown } else { Outcome::Failed };
        decided.push(NotSent::new(i, outcome, Reason::TooManyAttempts));
    }
    let group = &ctx.config.redis.group;
    streams::ack(conn, &keys.lane_stream(p, lane), group, &ack).await?;
    Ok(ClaimedRead { items, live, decided })
}

/// Settles `decided` (of `items`) with decide.lua, acknowledging their entries, and
/// counts what was settled now.
pub(crate) async fn settle_decided(
    ctx: &Ctx,
    conn: &mut Conn,
    p: u16,
    items: &[Claimed],
    decided: &[NotSent],
) -> anyhow::Result<()> {
    let list: Vec<Decision<'_>> = decided
        .iter()
        .map(|d| {
            let item = &items[d.index];
            let (outcome, reason, lost) = (d.outcome, d.reason.clone(), d.lost);
            Decision { entry: &item.entry, delivery: &item.delivery, outcome, reason, lost }
        })
        .collect();
    decide(ctx, conn, p, &list).await
}

/// Settles what will not be (or was) sent with decide.lua, and counts what was settled
/// now (not what another holder settled first).
pub(crate) async fn decide(ctx: &Ctx, conn: &mut Conn, p: u16, decisions: &[Decision<'_>]) -> anyhow::Result<()> {
    if decisions.is_empty() {
        return Ok(());
    }
    let (group, retention) = (&ctx.config.redis.group, ctx.config.retention().as_secs());
    let decided = scripts::decide(conn, &ctx.store.keys, p, group, &ctx.owner, decisions, retention).await?;
    for (d, _) in decisions.iter().zip(decided).filter(|(_, now)| *now) {
        let reason = (d.outcome != Outcome::Sent).then_some(&d.reason);
        ctx.metrics.settled(&d.delivery.campaign, d.delivery.channel, d.outcome, reason, 1);
    }
    Ok(())
}

/// Reads, claims, resolves and renders; hands what is ready to the batcher.
pub(crate) struct EmailReader {
    ctx: Arc<Ctx>,
    resolver: Resolver,
    batcher: Arc<Batcher>,
}

impl EmailReader {
    pub fn new(ctx: Arc<Ctx>, renderer: Renderer, batcher: Arc<Batcher>) -> anyhow::Result<EmailReader> {
        let resolver = Resolver::new(ctx.clone(), renderer)?;
        Ok(EmailReader { ctx, resolver, batcher })
    }

    /// Reads partition `p`'s stream of `lane` until shutdown.
    pub(crate) async fn read_partition(self: Arc<Self>, p: u16, lane: Lane) {
        let ctx = &self.ctx;
        let mut shutdown = ctx.shutdown.clone();
        let stream = ctx.store.keys.lane_stream(p, lane);
        let group = ctx.config.redis.group.clone();
        let mut failures = 0u32;
        // The blocking read has a connection of its own, kept while it works.
        let mut reader: Option<Conn> = None;
        while !shutdown.is_triggered() {
            if ctx.pause.is_paused() {
                shutdown.sleep(Duration::from_secs(1)).await;
                continue;
            }
            let result = async {
                if reader.is_none() {
                    reader = Some(ctx.store.dedicated().await?);
                }
                let conn = reader.as_mut().expect("just connected");
                let (count, block_ms) = (ctx.config.delivery.read_count, ctx.config.delivery.block_ms);
                let from = (stream.as_str(), group.as_str(), ctx.consumer.as_str());
                let entries = streams::read_new(conn, from, count, block_ms).await?;
                // The reader's own connection claims and resolves too: no second one is
                // taken from the pool (and held through a render hook's answer).
                let ready = self.process_entries(p, lane, conn, entries).await?;
                if let Err(refused) = self.batcher.push(p, lane, ready).await {
                    // Stopping: what was claimed goes back to Redis for the next instance.
                    release::hand_back(ctx, p, &refused).await;
                }
                anyhow::Ok(())
            }
            .await;
            match result {
                Ok(()) => failures = 0,
                Err(e) => {
                    // A broken connection is not reused.
                    reader = None;
                    failures += 1;
                    ctx.metrics.redis_error("read", &e);
                    let backoff = Duration::from_millis(200 * u64::from(failures.min(25)));
                    shutdown.sleep(backoff).await;
                }
            }
        }
    }

    /// Claims, resolves and renders `entries` of partition `p`'s `lane`; returns the
    /// emails to hand to the batcher (what will not be sent is decided here, and what
    /// a render hook did not answer is put off).
    pub(crate) async fn process_entries(
        &self,
        p: u16,
        lane: Lane,
        conn: &mut Conn,
        entries: Vec<StreamEntry>,
    ) -> anyhow::Result<Vec<Ready>> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = &self.ctx;
        let ClaimedRead { items, live, mut decided } =
            claim_read(ctx, (p, lane), conn, entries, OverClaimed::Failed).await?;
        let live: Vec<(usize, (&str, &DeliveryRef))> =
            live.into_iter().map(|i| (i, (items[i].entry.as_str(), &items[i].delivery))).collect();
        let resolving: Vec<(&str, &DeliveryRef)> = live.iter().map(|(_, item)| *item).collect();
        let fates = match lane {
            Lane::Digest => self.resolver.campaign_fates(p, conn, &resolving).await?,
            Lane::Transactional => self.resolver.transactional_fates(p, conn, &resolving).await?,
            Lane::App | Lane::Push => anyhow::bail!("a channel other than email is read by its own sender"),
        };
        let mut ready = Vec::new();
        let mut deferred: Vec<(usize, (&str, &DeliveryRef))> = Vec::new();
        for ((i, (entry, delivery)), fate) in live.into_iter().zip(fates) {
            match fate {
                Fate::Ready { json, variant, audience } => {
                    let delivery = delivery.clone();
                    ready.push(Ready { entry: entry.to_string(), delivery, json, variant, audience });
                }
                Fate::Decide(outcome, reason) => decided.push(NotSent::new(i, outcome, reason)),
                Fate::Defer => deferred.push((i, (entry, delivery))),
            }
        }
        for i in self.defer(p, conn, &deferred).await? {
            decided.push(NotSent::new(i, Outcome::Failed, Reason::HookUnavailable));
        }
        settle_decided(ctx, conn, p, &items, &decided).await?;
        ctx.failpoints.at(Failpoint::Claimed).await;
        Ok(ready)
    }

    /// Puts off deliveries a render hook did not answer; returns those past their
    /// deadline (to be failed: `render_hook_unavailable`).
    async fn defer(
        &self,
        p: u16,
        conn: &mut Conn,
        indexed: &[(usize, (&str, &DeliveryRef))],
    ) -> anyhow::Result<Vec<usize>> {
        if indexed.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = &self.ctx;
        let d = &ctx.config.delivery;
        let backoff = scripts::Backoff {
            base_ms: d.retry_base_ms,
            max_ms: d.retry_max_ms.min(60_000),
            deadline_ms: crate::model::ms(d.deadline()),
            jitter_percent: rand::random_range(0..=20),
        };
        let (keys, group) = (&ctx.store.keys, &ctx.config.redis.group);
        let items: Vec<(&str, &DeliveryRef)> = indexed.iter().map(|(_, item)| *item).collect();
        let done = scripts::defer(conn, keys, p, group, &ctx.owner, backoff, &items).await?;
        let mut expired = Vec::new();
        for ((i, (_, delivery)), result) in indexed.iter().zip(done) {
            match result {
                Deferred::For(_) => ctx.metrics.render_hook_deferred(&delivery.campaign, 1),
                Deferred::Expired => expired.push(*i),
                Deferred::NotHeld => {}
            }
        }
        Ok(expired)
    }

    /// Queues claimed emails for the batcher if there is room now, else hands them
    /// back to Redis (the reclaimer never waits on the queues).
    pub(crate) async fn hand_over_now(&self, p: u16, lane: Lane, ready: Vec<Ready>) {
        if let Err(refused) = self.batcher.try_push(p, lane, ready) {
            release::hand_back(&self.ctx, p, &refused).await;
        }
    }
}
