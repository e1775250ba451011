//! The reclaimer, run by every instance at once (each step is a Lua script or an
//! XAUTOCLAIM, so racing instances cannot both win): takes over stream entries
//! whose holder's lease expired, resends sealed batches that are due (a retry,
//! or a holder that died mid-send), settles what a lost write left behind,
//! looks for stuck deliveries, and trims streams below the oldest entry still needed.
//! It never waits on the queues: what has no room goes back to Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tracing::Instrument;

use crate::model::outcome::{Failpoint, Reason};
use crate::model::work::{Lane, Sealed};
use crate::send::ctx::Ctx;
use crate::send::queue::Batcher;
use crate::send::read::EmailReader;
use crate::send::settle;
use crate::send::stuck;
use crate::store::Conn;
use crate::store::records;
use crate::store::scripts::{self, Take, Verdict};
use crate::store::streams;

/// Due batches examined per partition per pass.
const DUE_BATCHES_PER_PASS: usize = 64;
/// Passes between stream trims.
const TRIM_EVERY: u32 = 10;

/// What the reclaimer works with.
pub(crate) struct Reclaimer {
    pub ctx: Arc<Ctx>,
    /// Taken-over entries are processed like new ones.
    pub reader: Arc<EmailReader>,
    /// Due batches are queued here for resending.
    pub batcher: Arc<Batcher>,
}

impl Reclaimer {
    /// Runs the reclaimer every `tick` until shutdown.
    pub async fn run(self, tick: Duration) {
        let ctx = &self.ctx;
        let mut shutdown = ctx.shutdown.clone();
        let mut pass = 0u32;
        loop {
            ctx.failpoints.at(Failpoint::ReclaimTick).await;
            // The watchdog hears from this loop: if it hangs, systemd restarts the daemon.
            ctx.notify.alive();
            if !ctx.pause.is_paused() {
                for p in 0..ctx.store.keys.partitions() {
                    if shutdown.is_triggered() {
                        return;
                    }
                    if let Err(e) = self.due_batches(p).await {
                        ctx.metrics.redis_error("take", &e);
                    }
                    // The application channel takes over its own (`app.rs`).
                    for lane in Lane::EMAIL {
                        if let Err(e) = self.expired_leases(p, lane).await {
                            ctx.metrics.redis_error("autoclaim", &e);
                        }
                    }
                    if let Err(e) = release_due(ctx, p).await {
                        ctx.metrics.redis_error("due", &e);
                    }
                }
            }
            if pass.is_multiple_of(TRIM_EVERY) {
                let (mut unread, mut unacked) = (0, 0);
                for p in 0..ctx.store.keys.partitions() {
                    for lane in Lane::ALL {
                        match trim(ctx, p, lane).await {
                            Ok(Some(group)) => (unread, unacked) = (unread + group.lag, unacked + group.pending),
                            Ok(None) => {}
                            Err(e) => ctx.metrics.redis_error("trim", &e),
                        }
                    }
                }
                let state = if ctx.pause.is_paused() {
                    "paused (provider quota)"
                } else if ctx.health.is_down() {
                    "holding (Resend down; probing)"
                } else {
                    "sending"
                };
                ctx.notify.status(&format!("{state}; backlog: {unread} unread, {unacked} claimed or in batches"));
                // Stuck is measured in minutes (slo.stuck_after_seconds): every tenth pass
                // is often enough, and spares Redis a dozen reads per partition per tick.
                self.look_for_stuck().await;
            }
            pass = pass.wrapping_add(1);
            if !shutdown.sleep(tick).await {
                return;
            }
        }
    }

    /// Looks for stuck deliveries in every partition (bounded reads of the stream,
    /// the pending list and the batches; see `stuck.rs`) and reports them.
    async fn look_for_stuck(&self) {
        let ctx = &self.ctx;
        match stuck::look_everywhere(&ctx.store, &ctx.config).await {
            Ok(tally) => {
                ctx.metrics.set_stuck(stuck::by_campaign(&tally, ctx.config.campaigns.iter().map(|c| c.name.as_str())))
            }
            Err(e) => ctx.metrics.redis_error("stuck", &e),
        }
    }

    /// Takes over batches whose retry is due or whose holder's lease ran out.
    pub async fn due_batches(&self, p: u16) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        let mut conn = ctx.store.conn().await?;
        let now_ms = records::now_ms(&mut conn).await?;
        let due = records::due_batches(&mut conn, &ctx.store.keys, p, now_ms, DUE_BATCHES_PER_PASS).await?;
        for batch in due {
            if self.batcher.has(&batch) {
                continue;
            }
            if let Some(taken) = take(ctx, &mut conn, p, &batch).await?
                && let Err(taken) = self.batcher.push_resend(taken)
            {
                settle::put_back(ctx, &taken, Duration::ZERO).await;
            }
        }
        Ok(())
    }

    /// XAUTOCLAIMs entries idle longer than a lease and processes them like new ones
    /// (claim.lua decides whether the lease really expired). Claims only what the
    /// partition's queue has room for, so the reclaimer never waits on the batcher.
    async fn expired_leases(&self, p: u16, lane: Lane) -> anyhow::Result<()> {
        let ctx = &self.ctx;
        let keys = &ctx.store.keys;
        let count = ctx.config.delivery.read_count;
        let mut cursor = "0-0".to_string();
        while !ctx.shutdown.is_triggered() {
            let Some(room) = autoclaim_count(count, self.batcher.room(p, lane)) else { break };
            let mut conn = ctx.store.conn().await?;
            let stream = keys.lane_stream(p, lane);
            let from = (stream.as_str(), ctx.config.redis.group.as_str(), ctx.consumer.as_str());
            let lease_ms = crate::model::ms(ctx.config.lease());
            let taken = streams::take_over_idle(&mut conn, from, lease_ms, &cursor, room).await?;
            // Redis 7 drops entries deleted from the stream out of the pending list itself
            // and names them here; their deliveries can no longer be found from the stream.
            if taken.deleted > 0 {
                tracing::warn!(
                    partition = p,
                    deleted = taken.deleted,
                    "pending entries had been deleted from the stream"
                );
            }
            let entries = taken.entries;
            if !entries.is_empty() {
                tracing::info!(partition = p, entries = entries.len(), "taking over deliveries whose lease expired");
            }
            let ready = self.reader.process_entries(p, lane, &mut conn, entries).await?;
            drop(conn);
            self.reader.hand_over_now(p, lane, ready).await;
            cursor = taken.next;
            if cursor == "0-0" {
                break;
            }
        }
        Ok(())
    }
}

/// Takes over `batch` of partition `p` (take.lua) and returns it to resend under the key
/// and body its record holds, or `None`: a batch past its resend window or whose record
/// is gone is settled here, and one that is not due or held by a live holder is left.
pub(crate) async fn take(ctx: &Ctx, conn: &mut Conn, p: u16, batch: &str) -> anyhow::Result<Option<Sealed>> {
    let lease_ms = crate::model::ms(ctx.config.lease());
    let window_ms = crate::model::ms(ctx.config.delivery.resend_window());
    match scripts::take(conn, &ctx.store.keys, p, batch, &ctx.owner, lease_ms, window_ms).await? {
        Take::Take { key, body, members, tries, maybe_sent } => {
            tracing::debug!(batch = %batch, tries, "resending sealed batch");
            let taken = Sealed::new(p, batch.to_string(), key, Bytes::from(body), members);
            Ok(Some(Sealed { tries, maybe_sent, ..taken }))
        }
        Take::Expired { members } => {
            tracing::error!(
                batch = %batch,
                deliveries = members.len(),
                "sealed batch outlived the provider's idempotency window without a known outcome; \
                 its deliveries are outcome_unknown and will not be resent"
            );
            let taken = Sealed::new(p, batch.to_string(), String::new(), Bytes::new(), members);
            let verdict = Verdict::Unknown(Reason::IdempotencyWindowPassed);
            settle::record_all(ctx, &taken, verdict, None).instrument(taken.span()).await;
            Ok(None)
        }
        Take::Lost => {
            tracing::error!(batch = %batch, "a sealed batch's record is gone though it was never settled");
            settle_lost_batch(ctx, p, batch).await?;
            Ok(None)
        }
        Take::Skip => Ok(None),
    }
}

/// A batch record gone before settlement (a lost write) leaves its members sealed
/// into it with nothing to resend: find them (a scan of the partition's records;
/// this is rare) and settle them as outcome_unknown, `record_lost`, one by one.
async fn settle_lost_batch(ctx: &Ctx, p: u16, batch: &str) -> anyhow::Result<()> {
    let members = records::sealed_into(&ctx.store, p, batch).await?;
    tracing::error!(batch = %batch, deliveries = members.len(), "deliveries of a lost batch are outcome_unknown");
    ctx.metrics.records_lost(members.len() as u64);
    let verdicts = vec![Verdict::Unknown(Reason::RecordLost); members.len()];
    let settled = settle::record(ctx, p, batch, &members, scripts::Settler::Lost, verdicts, &[]);
    settled.instrument(crate::model::work::batch_span(p, batch)).await;
    Ok(())
}

/// How many entries one XAUTOCLAIM may take: a read's worth, at most the queue's room
/// (read once: the queue may fill between a check and the call); `None` when there is
/// no room, since `COUNT 0` is an error to Redis.
fn autoclaim_count(read_count: usize, room: usize) -> Option<usize> {
    Some(read_count.min(room)).filter(|&n| n > 0)
}

/// Deliveries released from a due set per partition per pass.
const RELEASE_PER_PASS: usize = 1000;

/// Releases the deliveries of partition `p` whose time has come (a local hour, a render
/// hook's or the application's retry) into their lane's stream: email's due set, then
/// the application channel's.
async fn release_due(ctx: &Ctx, p: u16) -> anyhow::Result<()> {
    let mut conn = ctx.store.conn().await?;
    for lane in [Lane::Digest, Lane::App, Lane::Push] {
        let released = scripts::release_due(&mut conn, &ctx.store.keys, p, lane, 0, RELEASE_PER_PASS).await?;
        if released > 0 {
            tracing::info!(partition = p, lane = lane.as_str(), released, "deliveries released at their time");
        }
    }
    Ok(())
}

/// A consumer (a past process) idle this long with nothing pending is removed
/// from the group, so `XINFO CONSUMERS` does not collect every restart forever.
const FORGET_CONSUMERS_AFTER: Duration = Duration::from_secs(600);

/// Trims the stream below the oldest entry this deployment's group still needs
/// (the first pending one, or the first not yet read), and removes consumers of
/// past processes. Returns the group's standing as it found it.
pub(crate) async fn trim(ctx: &Ctx, p: u16, lane: Lane) -> anyhow::Result<Option<streams::GroupInfo>> {
    let stream = ctx.store.keys.lane_stream(p, lane);
    let group = &ctx.config.redis.group;
    let mut conn = ctx.store.conn().await?;
    let Some(ours) = streams::group_info(&mut conn, &stream, group).await? else {
        return Ok(None);
    };
    if ours.foreign_groups && !FOREIGN_GROUPS_SEEN.swap(true, Ordering::Relaxed) {
        tracing::warn!(stream = %stream, "the stream has other consumer groups; trimming follows only {group}");
    }

    let last = ours.last_delivered;
    let first_unread = (last.0, last.1 + 1);
    let keep_from = match streams::oldest_pending(&mut conn, &stream, group).await? {
        Some(oldest_pending) => oldest_pending.min(first_unread),
        None => first_unread,
    };
    streams::trim_before(&mut conn, &stream, keep_from).await?;

    let forget_ms = crate::model::ms(FORGET_CONSUMERS_AFTER.max(ctx.config.lease() * 10));
    for c in streams::consumers(&mut conn, &stream, group).await? {
        if c.name != ctx.consumer && c.pending == 0 && c.idle_ms > forget_ms {
            // Checked again inside the script: it may have resumed reading since.
            let keys = &ctx.store.keys;
            if scripts::forget_consumer(&mut conn, keys, p, lane, group, &c.name, forget_ms).await? {
                tracing::debug!(partition = p, consumer = %c.name, "removed an idle consumer with nothing pending");
            }
        }
    }
    Ok(Some(ours))
}

/// Whether the "other consumer groups" warning was given (once per process).
static FOREIGN_GROUPS_SEEN: AtomicBool = AtomicBool::new(false);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_claims_nothing_and_never_asks_for_count_0() {
        assert_eq!(autoclaim_count(100, 0), None);
        assert_eq!(autoclaim_count(0, 50), None);
        assert_eq!(autoclaim_count(100, 30), Some(30));
        assert_eq!(autoclaim_count(100, 300), Some(100));
    }
}
