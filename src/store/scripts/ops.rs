//! The team-wide quota pause (one key per partition), the provider's team-wide health
//! and the wake of waiting batches when it comes back, and idle consumers.

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::{SCRIPTS, flag, unexpected};
use crate::model::work::Lane;
use crate::store::keys::Keys;

/// Pauses sending in one partition for `ms` (only ever lengthening a pause); true if set or lengthened.
pub async fn pause(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    reason: &str,
    ms: u64,
) -> RedisResult<bool> {
    let set: i64 = SCRIPTS.pause.key(keys.paused(partition)).arg(reason).arg(ms).invoke_async(conn).await?;
    flag("pause.lua", set)
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
    flag("forget.lua", removed)
}

/// What a provider health call is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthCall<'a> {
    /// A request of this batch failed in a way that says the provider, not the batch, is
    /// in trouble; `""` when no batch can have caused it (no connection, a broken one).
    Failed(&'a str),
    /// A request got an answer (any answer about the batch).
    Succeeded,
    /// Sending is held for a provider that is down: may this caller probe it now?
    Probe,
}

/// When the provider counts as down, and how often it is probed then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthRule {
    pub failures: u32,
    pub window_ms: u64,
    pub probe_interval_ms: u64,
}

/// The provider's team-wide health after a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// Since when it is down (Redis ms); `None` when up.
    pub down_since_ms: Option<u64>,
    /// For [`HealthCall::Probe`]: this caller may send one request now.
    pub probe: bool,
    /// This call put it down, or ended that.
    pub changed: bool,
}

/// Records or reads the provider's health (health.lua).
pub async fn health(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    call: HealthCall<'_>,
    rule: &HealthRule,
) -> RedisResult<Health> {
    let (what, batch) = match call {
        HealthCall::Failed(batch) => ("failed", batch),
        HealthCall::Succeeded => ("succeeded", ""),
        HealthCall::Probe => ("probe", ""),
    };
    let (state, since, changed): (String, String, i64) = SCRIPTS
        .health
        .key(keys.provider())
        .arg(what)
        .arg(rule.failures)
        .arg(rule.window_ms)
        .arg(rule.probe_interval_ms)
        .arg(batch)
        .invoke_async(conn)
        .await?;
    read_health(&state, &since, changed)
}

/// health.lua's answer.
pub(super) fn read_health(state: &str, since: &str, changed: i64) -> RedisResult<Health> {
    let down_since_ms = match (state, since) {
        ("up", "") => None,
        ("down" | "probe", ms) => Some(ms.parse().map_err(|_| unexpected("health.lua", ms))?),
        _ => return Err(unexpected("health.lua", state)),
    };
    Ok(Health { down_since_ms, probe: state == "probe", changed: flag("health.lua", changed)? })
}

/// Since when the provider counts as down (Redis ms), if it does: what health.lua keeps,
/// read without changing it (the heartbeat, the scrape, the admin overview).
pub async fn provider_down_since(conn: &mut impl ConnectionLike, keys: &Keys) -> RedisResult<Option<u64>> {
    redis::cmd("HGET").arg(keys.provider()).arg("down_ms").query_async(conn).await
}

/// Makes every batch of partition `p` that waits for a retry due now (wake.lua); how many.
pub async fn wake(conn: &mut impl ConnectionLike, keys: &Keys, p: u16, batches: &[String]) -> RedisResult<u64> {
    if batches.is_empty() {
        return Ok(0);
    }
    let mut call = SCRIPTS.wake.prepare_invoke();
    call.key(keys.batches(p));
    for b in batches {
        call.key(keys.batch(p, b)).arg(b);
    }
    call.invoke_async(conn).await
}
