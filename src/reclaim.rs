//! The reclaimer, run by every instance at once (each step is a Lua script or an
//! XAUTOCLAIM, so racing instances cannot both win): takes over stream entries
//! whose holder's lease expired, resends sealed batches that are due (a retry,
//! or a holder that died mid-send), refreshes the shared pause, reports the
//! backlog, and trims streams below the oldest entry still needed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::streams::StreamAutoClaimReply;

use crate::Ctx;
use crate::consumer::{Entry, entry_of, process_entries};
use crate::scripts::{self, Outcome, Settlement, Take};
use crate::sender::Sealed;
use crate::shutdown::Shutdown;

/// Due batches examined per partition per pass.
const DUE_BATCHES_PER_PASS: isize = 64;
/// Passes between stream trims and backlog reports.
const TRIM_EVERY: u32 = 10;

/// Runs the reclaimer every `tick` until shutdown.
pub(crate) async fn run(ctx: Arc<Ctx>, tick: Duration, mut shutdown: Shutdown) {
    let mut pass = 0u32;
    loop {
        if let Err(e) = ctx.pause.refresh(&ctx.store).await {
            ctx.metrics.redis_error("pause", &e);
        }
        ctx.metrics.set_paused(ctx.pause.is_paused(), "quota");
        if !ctx.pause.is_paused() {
            for p in 0..ctx.store.keys.partitions() {
                if shutdown.is_triggered() {
                    return;
                }
                if let Err(e) = due_batches(&ctx, p).await {
                    ctx.metrics.redis_error("take", &e);
                }
                if let Err(e) = expired_leases(&ctx, p).await {
                    ctx.metrics.redis_error("autoclaim", &e);
                }
            }
        }
        if pass.is_multiple_of(TRIM_EVERY) {
            for p in 0..ctx.store.keys.partitions() {
                if let Err(e) = trim_and_report(&ctx, p).await {
                    ctx.metrics.redis_error("trim", &e);
                }
            }
        }
        pass = pass.wrapping_add(1);
        if !shutdown.sleep(tick).await {
            return;
        }
    }
}

/// Takes over batches whose retry is due or whose holder's lease ran out.
pub(crate) async fn due_batches(ctx: &Ctx, p: u16) -> anyhow::Result<()> {
    let keys = &ctx.store.keys;
    let mut conn = ctx.store.conn().await?;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let now_ms = secs * 1000 + micros / 1000;
    let due: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys.batches(p))
        .arg("-inf")
        .arg(now_ms)
        .arg("BYSCORE")
        .arg("LIMIT")
        .arg(0)
        .arg(DUE_BATCHES_PER_PASS)
        .query_async(&mut conn)
        .await?;
    let lease_ms = ctx.config.lease().as_millis() as u64;
    let window_ms = ctx.config.delivery.resend_window_hours * 3_600_000;
    for batch in due {
        if ctx.batcher.has_resend(&batch) {
            continue;
        }
        match scripts::take(&mut conn, keys, p, &batch, &ctx.owner, lease_ms, window_ms).await? {
            Take::Take { key, body, members, attempts, maybe_sent } => {
                tracing::debug!(batch = %batch, attempts, "resending sealed batch");
                ctx.batcher.push_resend(Sealed {
                    partition: p,
                    id: batch,
                    key,
                    body: Bytes::from(body),
                    members,
                    failed: attempts,
                    maybe_sent,
                });
            }
            Take::Expired { members } => {
                tracing::error!(
                    batch = %batch,
                    deliveries = members.len(),
                    "sealed batch outlived the provider's idempotency window without a known outcome; \
                     its deliveries are outcome_unknown and will not be resent"
                );
                let settlements: Vec<Settlement<'_>> = members
                    .iter()
                    .map(|member| Settlement {
                        member,
                        outcome: Outcome::OutcomeUnknown,
                        detail: "idempotency_window_passed",
                    })
                    .collect();
                let retention_ms = ctx.config.retention().as_millis() as u64;
                let n = scripts::settle(&mut conn, keys, p, &batch, &settlements, retention_ms).await?;
                if let Some(first) = members.first() {
                    ctx.metrics.settled(
                        &first.campaign,
                        Outcome::OutcomeUnknown.as_str(),
                        "idempotency_window_passed",
                        u64::from(n),
                    );
                }
            }
            Take::Skip => {}
        }
    }
    Ok(())
}

/// XAUTOCLAIMs entries idle longer than a lease and processes them like new ones
/// (claim.lua decides whether the lease really expired).
pub(crate) async fn expired_leases(ctx: &Ctx, p: u16) -> anyhow::Result<()> {
    let keys = &ctx.store.keys;
    let mut conn = ctx.store.conn().await?;
    let mut cursor = "0-0".to_string();
    loop {
        let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(keys.stream(p))
            .arg(&ctx.config.redis.group)
            .arg(&ctx.owner)
            .arg(ctx.config.lease().as_millis() as u64)
            .arg(&cursor)
            .arg("COUNT")
            .arg(ctx.config.delivery.read_count)
            .query_async(&mut conn)
            .await?;
        // Redis 7 drops deleted entries from the PEL itself and lists them; nothing to do.
        if !reply.deleted_ids.is_empty() {
            tracing::debug!(partition = p, deleted = reply.deleted_ids.len(), "trimmed entries left the pending list");
        }
        let entries: Vec<Entry> = reply.claimed.into_iter().map(entry_of).collect();
        if !entries.is_empty() {
            tracing::info!(partition = p, entries = entries.len(), "taking over deliveries whose lease expired");
        }
        process_entries(ctx, p, &mut conn, entries).await?;
        cursor = reply.next_stream_id;
        if cursor == "0-0" {
            return Ok(());
        }
    }
}

/// Reports the backlog and trims the stream below the oldest entry the group
/// still needs (the first pending one, or the first not yet read).
pub(crate) async fn trim_and_report(ctx: &Ctx, p: u16) -> anyhow::Result<()> {
    let stream = ctx.store.keys.stream(p);
    let mut conn = ctx.store.conn().await?;
    let groups: Vec<std::collections::HashMap<String, redis::Value>> =
        redis::cmd("XINFO").arg("GROUPS").arg(&stream).query_async(&mut conn).await?;
    let mut keep_from: Option<(u64, u64)> = None;
    for g in &groups {
        let field = |name: &str| g.get(name).and_then(text);
        let name = field("name").unwrap_or_default();
        let last = field("last-delivered-id").and_then(|s| parse_id(&s)).unwrap_or((0, 0));
        let lag: Option<u64> = field("lag").and_then(|s| s.parse().ok());
        let pending: u64 = field("pending").and_then(|s| s.parse().ok()).unwrap_or(0);
        if name == ctx.config.redis.group {
            ctx.metrics.backlog(p, lag.unwrap_or(0), pending);
        }
        // Summary form: [count, smallest id, greatest id, consumers].
        let summary: Vec<redis::Value> = redis::cmd("XPENDING").arg(&stream).arg(&name).query_async(&mut conn).await?;
        let oldest = summary.get(1).and_then(text);
        // Without a lag figure (Redis cannot always tell), trim nothing past the last read.
        let first_unread = (last.0, last.1 + 1);
        let needed = match oldest.and_then(|s| parse_id(&s)) {
            Some(pending_min) => pending_min.min(first_unread),
            None => first_unread,
        };
        keep_from = Some(keep_from.map_or(needed, |k: (u64, u64)| k.min(needed)));
    }
    if let Some((ms, seq)) = keep_from {
        let _: u64 =
            redis::cmd("XTRIM").arg(&stream).arg("MINID").arg(format!("{ms}-{seq}")).query_async(&mut conn).await?;
    }
    Ok(())
}

/// A reply value as text, whatever its RESP type.
fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::Int(n) => Some(n.to_string()),
        redis::Value::Nil => None,
        other => redis::from_redis_value_ref::<String>(other).ok(),
    }
}

fn parse_id(s: &str) -> Option<(u64, u64)> {
    let (ms, seq) = s.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}
