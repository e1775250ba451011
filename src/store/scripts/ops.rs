//! The team-wide quota pause (one key per partition), the provider's team-wide health
//! and the wake of waiting batches when it comes back, the team-wide request limiter,
//! and idle consumers.

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::{SCRIPTS, flag, unexpected};
use crate::model::work::Lane;
use crate::store::keys::Keys;

/// Pauses sending in one partition for `ms` (only ever lengthening a pause); true if set or lengthened.
///
/// Runs `lua/pause.lua`:
/// ```text
/// KEYS[1] pause key. ARGV[1] reason, ARGV[2] milliseconds.
/// ```
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
///
/// Runs `lua/forget.lua`:
/// ```text
/// KEYS[1] stream. ARGV[1] group, ARGV[2] consumer, ARGV[3] idle ms.
/// ```
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
    /// The first and the last failure of a run at least this far apart (a burst shorter
    /// than this is not an outage).
    pub min_span_ms: u64,
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
///
/// Runs `lua/health.lua`:
/// ```text
/// KEYS[1] the provider's health hash (failures, first_ms, last_batch, down_ms, probe_ms)
/// ARGV[1] 'failed', 'succeeded' or 'probe' (reading it is an HGET of down_ms); ARGV[2] threshold; ARGV[3] window ms;
/// ARGV[4] probe interval ms; ARGV[5] the batch that failed ('failed'; '' for a failure no
/// batch can cause: no connection, a broken one); ARGV[6] the shortest span ms
/// ```
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
        .arg(rule.min_span_ms)
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

/// One call of limiter.lua on the limiter hash `key` (`send::limiter` says what each op
/// does): `op` at `rps` requests/s with a guard of `guard_us`, its argument `arg` (0 for
/// an op without one), on Redis's clock or (tests) at `now_us`; for 'hello' and 'back',
/// `peer` is this instance's id, how long it may pace alone (ms) and (back) the share it
/// paced alone at. Returns (wait µs or a
/// flag, now µs, request number), or for 'hello' and 'back' (live instances, this one's
/// share in requests/s, requests/s kept for peers that may pace alone).
///
/// Runs `lua/limiter.lua`:
/// ```text
/// KEYS[1] limiter hash: next_us (cadence), interval_us (the interval it was set with), pause_us (no departure before), rps (a lower rate
///   the provider announced), seq (requests granted), ring (ring size), d<n> (departure of
///   request n modulo ring, µs), outage_ms (when an instance last came back from pacing
///   alone), reserved ("<requests/s>:<until ms>,…": shares kept out of the shared rate)
/// KEYS[2] peers hash (KEYS[1]'s name is its hash tag: the same slot): instance id ->
///   "<stamp ms>:<share>:<held ms>[:<ms>,…]", when it last said hello, the requests/s it
///   would pace alone, until when the share it paced alone at is kept out of the shared
///   rate, and (when it said) until when each of its requests alone is, one request each
/// ARGV[1] op: 'take' | 'peek' | 'pause' | 'lower' | 'late' | 'hello' | 'back'
/// ARGV[2] configured requests per second, ARGV[3] guard µs, ARGV[4] argument:
///   pause: milliseconds; lower: requests per second; late: request number (it left before now);
///   back: how long from now its share stays out of the shared rate, ms; 0 for the others
/// ARGV[5] '' for Redis TIME, or (tests only) a fake "now" in µs
/// ARGV[6] hello/back: this instance's id ('' for the others)
/// ARGV[7] hello/back: how long an instance may pace alone after its last hello, ms
/// ARGV[8] back: the share it paced alone at, requests/s ('' for the others)
/// ARGV[9] back: for each of its requests alone still in its second, in how many ms it
///   leaves it ("<ms>,<ms>,…", at most the share; '' for the others)
/// ```
#[allow(clippy::too_many_arguments)]
pub async fn limiter(
    conn: &mut impl ConnectionLike,
    key: &str,
    op: &str,
    rps: u32,
    guard_us: u64,
    arg: u64,
    now_us: Option<u64>,
    peer: Option<(&str, u64, u32, &[u64])>,
) -> RedisResult<(u64, u64, u64)> {
    let now = now_us.map_or(String::new(), |n| n.to_string());
    let (id, alone_max, share, each) = peer.map_or(Default::default(), |(id, ms, share, each)| {
        let back = op == "back";
        let each = if back { each.iter().map(u64::to_string).collect::<Vec<_>>().join(",") } else { String::new() };
        (id.to_string(), ms.to_string(), if back { share.to_string() } else { String::new() }, each)
    });
    SCRIPTS
        .limiter
        .key(key)
        .key(Keys::limiter_peers(key))
        .arg(op)
        .arg(rps)
        .arg(guard_us)
        .arg(arg)
        .arg(now)
        .arg(id)
        .arg(alone_max)
        .arg(share)
        .arg(each)
        .invoke_async(conn)
        .await
}

/// What instance `id` last told the limiter at `key` (its entry in the peers hash):
/// when (ms), the share it would pace alone at, and until when (ms) the share it paced
/// alone at is kept out of the shared rate. For the limiter's tests.
#[cfg(test)]
pub(crate) async fn limiter_peer(conn: &mut impl ConnectionLike, key: &str, id: &str) -> RedisResult<Option<[u64; 3]>> {
    let said: Option<String> = redis::cmd("HGET").arg(Keys::limiter_peers(key)).arg(id).query_async(conn).await?;
    Ok(said.and_then(|said| {
        let fields: Vec<u64> = said.split(':').take(3).filter_map(|f| f.parse().ok()).collect();
        <[u64; 3]>::try_from(fields).ok()
    }))
}

/// Makes every batch of partition `p` that waits for a retry due now (wake.lua); how many.
///
/// Runs `lua/wake.lua`:
/// ```text
/// KEYS[1] batches zset, KEYS[2..] batch records; ARGV[i - 1] the id of KEYS[i]
/// ```
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
