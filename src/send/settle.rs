//! What became of a batch, recorded: each member's verdict (settle.lua: sent with the
//! provider's id, skipped, failed with a dead letter, or outcome unknown), counted as
//! recorded; or the batch put back unsent, due later (reschedule.lua). A failure to
//! record leaves the batch sealed under a lease that expires, and whoever takes it
//! over resends the same bytes with the same key.

use std::collections::HashMap;
use std::time::Duration;

use crate::model::outcome::{Failpoint, Outcome, Reason};
use crate::model::work::{Channel, DeliveryRef, Sealed};
use crate::send::ctx::Ctx;
use crate::store::scripts::{self, BatchFound, Reschedule, Settlement, Settler, Verdict};

/// How soon a batch refused for quota, or put back during a pause, is due again
/// (no instance takes a batch while paused).
pub(crate) const QUOTA_RECHECK: Duration = Duration::from_secs(1);

/// Puts a sealed batch this instance holds back in Redis, unsent, due after `delay`
/// (its slot moved far away, a pause, a stop), so another instance may take it and
/// nobody thinks this request may have been sent; what the holder knows of earlier
/// ones is written back with it (a failover may have taken the record's mark back).
pub(crate) async fn put_back(ctx: &Ctx, b: &Sealed, delay: Duration) {
    let r = Reschedule {
        delay_ms: crate::model::ms(delay),
        failed_request: false,
        maybe_sent: b.maybe_sent,
        error: Reason::Postponed,
        said: None,
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
pub(crate) async fn record_all(ctx: &Ctx, b: &Sealed, verdict: Verdict, said: Option<&str>) {
    let verdicts = vec![verdict; b.members.len()];
    let said = vec![said; b.members.len()];
    record(ctx, b.partition, &b.id, &b.members, Settler::Holder(&ctx.owner), verdicts, &said).await;
}

/// Records each member's verdict (same order as the batch) and counts what was recorded;
/// false when Redis could not be asked (the batch stays sealed for recovery).
pub(crate) async fn record(
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
                ctx.metrics.records_lost(members.len() as u64);
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
