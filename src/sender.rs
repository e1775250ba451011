//! One batch request's life: seal (seal.lua) → the last gate (gate.lua, in the
//! few milliseconds before its slot) → POST with the sealed key and body →
//! settle (settle.lua) or reschedule (reschedule.lua). Any failure to record an outcome leaves the batch sealed
//! under a lease that expires, and whoever takes it over resends the same bytes
//! with the same key. The sender reports what the provider said about pacing
//! back to its caller.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use bytes::Bytes;
use chrono::Utc;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::config::Config;
use crate::ctx::Ctx;
use crate::db::scripts::{
    self, BatchFound, Gate, GateLimits, GateRequest, Reschedule, SealRequest, Settlement, Settler, Verdict,
};
use crate::id::new_id;
use crate::outcome::{Failpoint, Outcome, Reason};
use crate::pause::quota_renews;
use crate::resend::{Action, Client, ErrorName, ItemResult, ProviderError, RateHeaders};
use crate::retry::RetryPolicy;
use crate::work::{DeliveryRef, Ready, Sealed};

/// Logs the provider becoming unreachable, and reachable again, once per change
/// (not once per request).
pub struct ProviderHealth {
    base_url: String,
    down: AtomicBool,
}

impl ProviderHealth {
    pub fn new(base_url: &str) -> ProviderHealth {
        ProviderHealth { base_url: base_url.to_string(), down: AtomicBool::new(false) }
    }

    fn unreachable(&self) {
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::error!(
                base_url = %self.base_url,
                "Resend is unreachable (connection refused or no route); batches stay sealed and are retried \
                 with backoff until their deadline"
            );
        }
    }

    fn reachable(&self) {
        if self.down.swap(false, Ordering::Relaxed) {
            tracing::warn!(base_url = %self.base_url, "Resend is reachable again");
        }
    }
}

/// What the provider said about pacing, for the limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacingNews {
    pub rate: RateHeaders,
    /// A 429 `rate_limit_exceeded` asked every request to wait this long.
    pub pause: Option<Duration>,
}

/// The `endpoint` label of `POST /emails/batch`.
const BATCH_ENDPOINT: &str = "emails_batch";

/// Sends sealed batches and records what became of them.
pub struct Sender {
    client: Client,
    retry: RetryPolicy,
    rng: Mutex<StdRng>,
    health: ProviderHealth,
}

impl Sender {
    pub fn new(client: Client, retry: RetryPolicy, rng: StdRng, base_url: &str) -> Sender {
        Sender { client, retry, rng: Mutex::new(rng), health: ProviderHealth::new(base_url) }
    }

    /// The sender `config` describes; `seed` fixes the retry jitter (tests).
    pub fn from_config(config: &Config, seed: Option<u64>) -> anyhow::Result<Sender> {
        let r = &config.resend;
        let key = r.api_key.clone().context("no Resend API key: set RESEND_API_KEY or resend.api_key_file")?;
        let client = Client::new(&r.base_url, key, Duration::from_secs(r.timeout_seconds))?;
        let rng = seed.map_or_else(rand::make_rng, StdRng::seed_from_u64);
        Ok(Sender::new(client, RetryPolicy::from_config(&config.delivery), rng, &r.base_url))
    }

    /// Sends a batch that passed the last gate (the caller has just taken its slot) and
    /// records what happened.
    pub async fn attempt(&self, ctx: &Ctx, b: Sealed) -> PacingNews {
        ctx.failpoints.at(Failpoint::Gated).await;
        let started = std::time::Instant::now();
        let emails = b.members.len();
        let answer = self.client.send_batch(&b.key, b.body.clone(), emails).await;
        let took = started.elapsed();
        ctx.failpoints.at(Failpoint::Answered).await;
        match answer {
            Ok(accepted) => {
                self.health.reachable();
                ctx.metrics.provider_request(BATCH_ENDPOINT, Ok(()), emails, took);
                let verdicts: Vec<Verdict> = accepted
                    .items
                    .into_iter()
                    .map(|item| match item {
                        ItemResult::Sent(id) => Verdict::Sent(id),
                        ItemResult::Invalid => Verdict::Failed(Reason::Provider(ErrorName::ValidationError)),
                    })
                    .collect();
                settle(ctx, b.partition, &b.id, &b.members, Settler::Answer, verdicts).await;
                PacingNews { rate: accepted.rate, pause: None }
            }
            Err((e, rate)) => {
                ctx.metrics.provider_request(BATCH_ENDPOINT, Err(&e), emails, took);
                let pause = e.retry_after.filter(|_| e.name == ErrorName::RateLimitExceeded);
                self.failed(ctx, b, e).await;
                PacingNews { rate, pause }
            }
        }
    }

    async fn failed(&self, ctx: &Ctx, b: Sealed, e: ProviderError) {
        if e.name == ErrorName::ConnectionFailed {
            self.health.unreachable();
        } else {
            self.health.reachable();
        }
        let next = {
            let mut rng = self.rng.lock().expect("rng lock");
            plan(&e, b.tries, b.maybe_sent, &self.retry, &mut *rng, Utc::now())
        };
        let error = Reason::Provider(e.name.clone());
        match next {
            Plan::Retry { delay } => {
                // What this holder knows of earlier requests counts too: a failover may have
                // taken the record's mark back.
                let r = Reschedule {
                    delay_ms: delay.as_millis() as u64,
                    failed_request: true,
                    maybe_sent: e.maybe_sent || b.maybe_sent,
                    error,
                };
                reschedule(ctx, b.partition, &b.id, &r).await;
                ctx.metrics.retry_scheduled(&e.name, b.tries + 1, delay);
            }
            Plan::PauseUntil(until) => {
                if let Err(err) = ctx.pause.begin(&ctx.store, until, e.name.as_str()).await {
                    ctx.metrics.redis_error("pause", &err);
                }
                ctx.metrics.set_paused(true);
                // Due again almost at once, but no instance takes a batch while paused: it
                // goes out as soon as the pause ends, by expiry or `mailstream resume`.
                let r = Reschedule {
                    delay_ms: QUOTA_RECHECK.as_millis() as u64,
                    failed_request: true,
                    maybe_sent: b.maybe_sent,
                    error,
                };
                reschedule(ctx, b.partition, &b.id, &r).await;
            }
            Plan::Settle(outcome) => {
                let verdict = if outcome == Outcome::Failed { Verdict::Failed(error) } else { Verdict::Unknown(error) };
                settle_all(ctx, &b, verdict).await;
            }
        }
    }
}

/// The gate's limits from the config.
fn gate_limits(config: &Config) -> GateLimits {
    let d = &config.delivery;
    GateLimits {
        lease_ms: config.lease().as_millis() as u64,
        window_ms: d.resend_window_hours * 3_600_000,
        deadline_ms: d.deadline_hours * 3_600_000,
        maybe_sent_deadline_ms: d.maybe_sent_deadline_hours * 3_600_000,
        retention_secs: config.retention().as_secs(),
    }
}

/// Runs the last gate for `b`, just before its slot, and acts on what it says; true
/// when the request may leave (with `b` updated if members were dropped). On a Redis
/// error, false: the batch stays sealed and is taken over after its lease.
pub async fn pass_gate(ctx: &Ctx, b: &mut Sealed) -> bool {
    match last_gate(ctx, b).await {
        Ok(go) => go,
        Err(e) => {
            ctx.metrics.redis_error("gate", &e);
            false
        }
    }
}

async fn last_gate(ctx: &Ctx, b: &mut Sealed) -> anyhow::Result<bool> {
    let mut conn = ctx.store.conn().await?;
    let new_key = idempotency_key(&ctx.config.redis.prefix, &new_id());
    let request = GateRequest {
        partition: b.partition,
        batch: &b.id,
        owner: &ctx.owner,
        new_key: &new_key,
        limits: gate_limits(&ctx.config),
        maybe_sent: b.maybe_sent,
    };
    let go = match scripts::gate(&mut conn, &ctx.store.keys, &request, &b.members).await? {
        Gate::Go { .. } => true,
        Gate::Resealed { key, body, kept, skipped, .. } => {
            tracing::info!(batch = %b.id, skipped = skipped.len(), "members no longer wanted were left out at the last gate");
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
                batch = %b.id,
                "a request that may have been sent holds members no longer wanted: it is not resent, and its \
                 deliveries are outcome_unknown"
            );
            let verdicts = reasons.into_iter().map(|r| Verdict::Unknown(r.unwrap_or(Reason::Withheld))).collect();
            settle(ctx, b.partition, &b.id, &b.members, Settler::Holder(&ctx.owner), verdicts).await;
            false
        }
        Gate::Paused => {
            put_back(ctx, b, QUOTA_RECHECK).await;
            false
        }
        Gate::Expired => {
            tracing::error!(
                batch = %b.id,
                deliveries = b.members.len(),
                "sealed batch outlived the provider's idempotency window without a known outcome; \
                 its deliveries are outcome_unknown and will not be resent"
            );
            settle_all(ctx, b, Verdict::Unknown(Reason::IdempotencyWindowPassed)).await;
            false
        }
        Gate::Deadline { maybe_sent } => {
            tracing::error!(batch = %b.id, deliveries = b.members.len(), maybe_sent, "batch passed its delivery deadline");
            let verdict = if maybe_sent { Verdict::Unknown(Reason::Expired) } else { Verdict::Failed(Reason::Expired) };
            settle_all(ctx, b, verdict).await;
            false
        }
        Gate::NotHeld => {
            tracing::info!(batch = %b.id, "batch was taken over by another holder before its request left");
            false
        }
        Gate::Settled => {
            tracing::debug!(batch = %b.id, "batch was taken over and settled by another holder");
            false
        }
        Gate::Lost => {
            tracing::error!(batch = %b.id, deliveries = b.members.len(), "a sealed batch's record is gone (a lost write)");
            let verdicts = vec![Verdict::Unknown(Reason::RecordLost); b.members.len()];
            settle(ctx, b.partition, &b.id, &b.members, Settler::Lost, verdicts).await;
            false
        }
    };
    if !go {
        return Ok(false);
    }
    ctx.failpoints.at(Failpoint::Gating).await;
    replicated(ctx, &mut conn, b).await
}

/// With `redis.wait_replicas`, waits until replicas hold the gate's 'sending' of `b`,
/// else puts `b` back: a new primary must not think the request never left and re-seal
/// it under another key.
async fn replicated(ctx: &Ctx, conn: &mut crate::db::Conn, b: &Sealed) -> anyhow::Result<bool> {
    let batch_key = ctx.store.keys.batch(b.partition, &b.id);
    match ctx.store.replicated(conn, &batch_key).await {
        Ok(true) if ctx.config.redis.wait_replicas == 0 => Ok(true),
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
                tracing::warn!(batch = %b.id, "the last gate's write was lost in a failover; the batch is taken over after its lease");
            }
            Ok(held)
        }
        // Not acknowledged, or not asked (a failover under way): the request has not left,
        // so the batch goes back unsent, never left 'sending' to look maybe sent.
        answer => {
            match answer {
                Ok(_) => tracing::warn!(batch = %b.id, "replicas did not acknowledge the batch; it waits"),
                Err(e) => ctx.metrics.redis_error("wait", &e),
            }
            put_back(ctx, b, Duration::from_secs(1)).await;
            Ok(false)
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
pub async fn seal(ctx: &Ctx, p: u16, items: Vec<Ready>) -> Option<Sealed> {
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
const QUOTA_RECHECK: Duration = Duration::from_secs(1);

/// What to do after a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Resend the same sealed batch (same key, same body) after `delay`; the last gate
    /// ends it at its deadline.
    Retry { delay: Duration },
    /// Every instance stops sending until the quota renews; the batch waits, sealed.
    PauseUntil(SystemTime),
    /// No point retrying: settle every member with this outcome.
    Settle(Outcome),
}

/// Decides what follows a failure of a batch that had failed `tries_before` times,
/// `maybe_sent_before` telling whether any earlier request may have been processed.
/// Pure, with the clock and randomness passed in. Retryable errors are retried
/// without a count: a batch ends at its deadline, so an outage delays mail.
pub fn plan(
    e: &ProviderError,
    tries_before: u32,
    maybe_sent_before: bool,
    policy: &RetryPolicy,
    rng: &mut impl rand::RngExt,
    now: chrono::DateTime<Utc>,
) -> Plan {
    match e.action {
        Action::Retryable => Plan::Retry { delay: policy.after_failure(tries_before + 1, e.retry_after, rng) },
        Action::QuotaExhausted => Plan::PauseUntil(quota_renews(&e.name, now)),
        // A refusal now does not prove an earlier attempt was refused too (an API key
        // rotated in between is refused before the idempotency store is consulted).
        Action::SenderRejected | Action::Fatal if e.maybe_sent || maybe_sent_before => {
            Plan::Settle(Outcome::OutcomeUnknown)
        }
        Action::SenderRejected | Action::Fatal => Plan::Settle(Outcome::Failed),
    }
}

/// Puts a sealed batch this instance holds back in Redis, unsent, due after `delay`
/// (its slot moved far away, a pause, a stop), so another instance may take it and
/// nobody thinks this request may have been sent; what the holder knows of earlier
/// ones is written back with it (a failover may have taken the record's mark back).
pub async fn put_back(ctx: &Ctx, b: &Sealed, delay: Duration) {
    let r = Reschedule {
        delay_ms: delay.as_millis() as u64,
        failed_request: false,
        maybe_sent: b.maybe_sent,
        error: Reason::Postponed,
    };
    reschedule(ctx, b.partition, &b.id, &r).await;
}

async fn reschedule(ctx: &Ctx, partition: u16, batch: &str, r: &Reschedule) {
    let result = async {
        let mut conn = ctx.store.conn().await?;
        anyhow::Ok(scripts::reschedule(&mut conn, &ctx.store.keys, partition, batch, &ctx.owner, r).await?)
    };
    match result.await {
        Ok(Some(_)) => {}
        Ok(None) => tracing::info!(batch = %batch, "batch was taken over by another holder; its retry is theirs"),
        Err(err) => ctx.metrics.redis_error("reschedule", &err),
    }
}

/// Hands claimed emails of partition `p` back to Redis (pending again, readable by
/// any instance at once): at a stop, a pause, or when a queue has no room.
pub async fn hand_back(ctx: &Ctx, p: u16, items: &[Ready]) {
    if items.is_empty() {
        return;
    }
    let result = async {
        let mut conn = ctx.store.conn().await?;
        let refs: Vec<(&str, &DeliveryRef)> = items.iter().map(|r| (r.entry.as_str(), &r.delivery)).collect();
        let (keys, group) = (&ctx.store.keys, &ctx.config.redis.group);
        anyhow::Ok(scripts::release(&mut conn, keys, p, group, &ctx.owner, &refs).await?)
    };
    match result.await {
        Ok(n) => tracing::debug!(partition = p, released = n, "claimed deliveries handed back"),
        // They stay claimed and are taken over when their lease expires.
        Err(err) => ctx.metrics.redis_error("release", &err),
    }
}

/// Settles every member of a batch this instance holds with one verdict.
pub async fn settle_all(ctx: &Ctx, b: &Sealed, verdict: Verdict) {
    let verdicts = vec![verdict; b.members.len()];
    settle(ctx, b.partition, &b.id, &b.members, Settler::Holder(&ctx.owner), verdicts).await;
}

/// Records each member's verdict (same order as the batch) and counts what was recorded;
/// false when Redis could not be asked (the batch stays sealed for recovery).
pub async fn settle(
    ctx: &Ctx,
    partition: u16,
    batch: &str,
    members: &[DeliveryRef],
    by: Settler<'_>,
    verdicts: Vec<Verdict>,
) -> bool {
    let settlements: Vec<Settlement<'_>> =
        members.iter().zip(verdicts).map(|(member, verdict)| Settlement { member, verdict }).collect();
    let result = async {
        let mut conn = ctx.store.conn().await?;
        let retention = ctx.config.retention().as_secs();
        anyhow::Ok(scripts::settle(&mut conn, &ctx.store.keys, partition, batch, by, &settlements, retention).await?)
    };
    match result.await {
        Ok(settled) => {
            // Already settled by another holder is a normal race (a holder that stalled past
            // its lease): only a record truly missing is a lost write.
            if settled.batch == BatchFound::Missing && by == Settler::Answer {
                let recorded = settled.recorded.iter().filter(|r| r.is_some()).count();
                tracing::error!(
                    batch = %batch,
                    deliveries = members.len(),
                    recorded,
                    "the provider accepted a batch whose record is gone (a lost write); its answer was recorded \
                     on the deliveries, so none is sent again"
                );
                ctx.metrics.lost_batch(members.len() as u64);
            }
            if settled.recorded.iter().all(Option::is_none) {
                tracing::debug!(batch = %batch, "batch was already settled, or taken over by another holder");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy { base: Duration::from_secs(1), max: Duration::from_secs(60) }
    }

    fn now() -> chrono::DateTime<Utc> {
        chrono::DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn answer(status: u16, name: &str) -> ProviderError {
        ProviderError::from_response(status, Some(name), "", None)
    }

    fn decide(e: &ProviderError, tries_before: u32, maybe_before: bool) -> Plan {
        plan(e, tries_before, maybe_before, &policy(), &mut StdRng::seed_from_u64(5), now())
    }

    #[test]
    fn a_timeout_is_retried_with_growing_backoff_and_no_count() {
        let timeout = ProviderError::local(ErrorName::Timeout, true);
        assert!(matches!(decide(&timeout, 0, false), Plan::Retry { delay } if delay <= Duration::from_secs(1)));
        assert!(matches!(decide(&timeout, 1, true), Plan::Retry { delay } if delay <= Duration::from_secs(2)));
        // However often: the last gate ends a batch at its deadline, not after a count.
        assert!(matches!(decide(&timeout, 500, true), Plan::Retry { delay } if delay <= Duration::from_secs(60)));
    }

    #[test]
    fn an_unreachable_provider_is_retried_for_as_long_as_it_takes() {
        let refused = ProviderError::local(ErrorName::ConnectionFailed, false);
        for tries in [0, 8, 100, 10_000] {
            assert!(matches!(decide(&refused, tries, false), Plan::Retry { .. }), "{tries}");
        }
    }

    #[test]
    fn a_429_waits_at_least_its_retry_after() {
        let e = ProviderError::from_response(429, Some("rate_limit_exceeded"), "", Some(Duration::from_secs(9)));
        assert_eq!(decide(&e, 0, false), Plan::Retry { delay: Duration::from_secs(9) });
        assert!(matches!(decide(&e, 40, false), Plan::Retry { delay } if delay >= Duration::from_secs(30)));
    }

    #[test]
    fn a_concurrent_request_waits_and_retries_the_same_batch() {
        let e = answer(409, "concurrent_idempotent_requests");
        assert!(matches!(decide(&e, 0, false), Plan::Retry { .. }));
        assert!(matches!(decide(&e, 9, true), Plan::Retry { .. }));
    }

    #[test]
    fn fatal_and_sender_rejected_end_at_once_without_a_sleep() {
        for e in [answer(422, "invalid_parameter"), answer(403, "invalid_api_key"), answer(422, "invalid_from_address")]
        {
            assert_eq!(decide(&e, 0, false), Plan::Settle(Outcome::Failed), "{e}");
            // After an attempt that may have been processed, nobody can say it was not.
            assert_eq!(decide(&e, 1, true), Plan::Settle(Outcome::OutcomeUnknown), "{e}");
        }
        let garbled = ProviderError::local(ErrorName::UnexpectedResponse, true);
        assert_eq!(decide(&garbled, 0, false), Plan::Settle(Outcome::OutcomeUnknown));
    }

    #[test]
    fn a_quota_pauses_until_it_renews() {
        let e = answer(429, "daily_quota_exceeded");
        let renews = chrono::DateTime::parse_from_rfc3339("2026-11-30T00:00:00Z").unwrap();
        let want = std::time::UNIX_EPOCH + Duration::from_secs(renews.timestamp() as u64);
        assert_eq!(decide(&e, 0, false), Plan::PauseUntil(want));
        assert_eq!(decide(&e, 7, false), Plan::PauseUntil(want), "never given up on");
    }
}
