//! The kick: fans a campaign period out over the subscriber registry (or over
//! NDJSON records given with the kick) through enqueue.lua, each (campaign,
//! subscriber, target, period) at most once however often it is kicked.

use std::collections::HashSet;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::{CampaignConfig, Config};
use crate::db::Store;
use crate::db::scripts;
use crate::subscribers::{self, Subscriber, field};
use crate::work::DeliveryRef;

/// Deliveries per enqueue.lua call: large enough to amortize the round trip,
/// small enough that one call never blocks Redis for long.
const ENQUEUE_CHUNK: usize = 500;

/// What a kick did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KickReport {
    pub campaign: String,
    pub period: String,
    /// Deliveries enqueued by this kick.
    pub new: u64,
    /// Deliveries that were already enqueued for this period.
    pub duplicates: u64,
    /// Subscribers skipped because they were not entitled or had unsubscribed.
    pub not_eligible: u64,
}

/// Which periods a kick may enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PeriodRule {
    /// The current period, the previous or the next one.
    #[default]
    NearNow,
    /// Any period still within the retention (`--allow-any-period`).
    AnyWithinRetention,
}

/// The period a kick is for, judged at `now` (Redis's clock, so two kickers on either
/// side of a period boundary agree): `explicit` if given and allowed, else the current
/// one. A period that started longer than `retention` ago is refused outright: its
/// deliveries' records may have expired, so kicking it again could send twice.
pub fn choose_period(
    campaign: &CampaignConfig,
    explicit: Option<&str>,
    rule: PeriodRule,
    now: DateTime<Utc>,
    retention: std::time::Duration,
) -> anyhow::Result<String> {
    let (kind, tz) = (campaign.period, campaign.tz());
    let current = kind.period_at(now, tz);
    let Some(p) = explicit else { return Ok(current) };
    let Some(start) = kind.start(p, tz) else {
        bail!("--period {p:?} is not a {} period (expected e.g. {current})", kind.name());
    };
    let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    if start + retention <= now {
        bail!(
            "period {p} started more than delivery.retention_days ago: its deliveries' records may have \
             expired, so kicking it again could send twice; refused"
        );
    }
    let near = [kind.previous(&current, tz), Some(current.clone()), kind.next(&current, tz)];
    if rule == PeriodRule::NearNow && !near.iter().flatten().any(|n| n == p) {
        bail!(
            "--period {p} is not the current period ({current}), the one before or the one after; \
             pass --allow-any-period to kick it anyway"
        );
    }
    Ok(p.to_string())
}

/// [`choose_period`] on Redis's clock.
pub async fn period_for(
    store: &Store,
    config: &Config,
    campaign: &CampaignConfig,
    explicit: Option<&str>,
    rule: PeriodRule,
) -> anyhow::Result<String> {
    let now = store.time().await?;
    choose_period(campaign, explicit, rule, now, config.retention())
}

/// Fans `campaign` out over the whole registry for `period`.
pub async fn kick_registry(store: &Store, config: &Config, campaign: &str, period: &str) -> anyhow::Result<KickReport> {
    let retention = config.retention().as_secs();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..store.keys.partitions() {
        let (store, campaign, period) = (store.clone(), campaign.to_string(), period.to_string());
        tasks.spawn(async move { kick_partition(&store, p, &campaign, &period, retention).await });
    }
    let mut report = KickReport { campaign: campaign.to_string(), period: period.to_string(), ..Default::default() };
    while let Some(done) = tasks.join_next().await {
        let part = done.context("kick task panicked")??;
        report.new += part.new;
        report.duplicates += part.duplicates;
        report.not_eligible += part.not_eligible;
    }
    Ok(report)
}

async fn kick_partition(
    store: &Store,
    p: u16,
    campaign: &str,
    period: &str,
    retention: u64,
) -> anyhow::Result<KickReport> {
    let mut conn = store.conn().await?;
    let mut report = KickReport::default();
    let mut seen = HashSet::new();
    let mut cursor: u64 = 0;
    let mut pending: Vec<DeliveryRef> = Vec::new();
    loop {
        let (next, ids): (u64, Vec<String>) = redis::cmd("SSCAN")
            .arg(store.keys.subscribers(p))
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .context("scanning subscribers")?;
        // SSCAN may return an id twice while the set rehashes.
        let ids: Vec<String> = ids.into_iter().filter(|id| seen.insert(id.clone())).collect();
        cursor = next;
        if ids.is_empty() {
            // SSCAN may answer a page with no ids and a cursor to go on with.
            if cursor == 0 {
                break;
            }
            continue;
        }
        eligible(&mut conn, store, p, campaign, period, &ids, &mut pending, &mut report).await?;
        while pending.len() >= ENQUEUE_CHUNK {
            let rest = pending.split_off(ENQUEUE_CHUNK);
            enqueue_chunk(&mut conn, store, p, &pending, retention, &mut report).await?;
            pending = rest;
        }
        if cursor == 0 {
            break;
        }
    }
    enqueue_chunk(&mut conn, store, p, &pending, retention, &mut report).await?;
    Ok(report)
}

/// Reads subscribers `ids` of partition `p` and queues a delivery per target of each
/// eligible one (entitled, subscribed, not suppressed, not opted out of `campaign`).
/// Checked here to keep them out of the streams, and checked again at send time,
/// which is what guarantees it.
#[allow(clippy::too_many_arguments)]
async fn eligible(
    conn: &mut crate::db::conn::Conn,
    store: &Store,
    p: u16,
    campaign: &str,
    period: &str,
    ids: &[String],
    pending: &mut Vec<DeliveryRef>,
    report: &mut KickReport,
) -> anyhow::Result<()> {
    let mut pipe = redis::pipe();
    let opted_out = field::opted_out(campaign);
    for id in ids {
        let fields = [field::TARGETS, field::ENTITLED, field::SUBSCRIBED, field::SUPPRESSED, &opted_out];
        pipe.cmd("HMGET").arg(store.keys.subscriber(p, id)).arg(&fields);
    }
    type Row = (Option<String>, Option<String>, Option<String>, Option<String>, Option<String>);
    let rows: Vec<Row> = if ids.is_empty() { Vec::new() } else { pipe.query_async(conn).await? };
    for (id, (targets, entitled, subscribed, suppressed, off)) in ids.iter().zip(rows) {
        let eligible = subscribers::is_set(entitled.as_deref())
            && subscribers::is_set(subscribed.as_deref())
            && suppressed.is_none()
            && off.is_none();
        if !eligible {
            report.not_eligible += 1;
            continue;
        }
        for target in subscribers::targets(targets.as_deref()) {
            pending.push(DeliveryRef::new(campaign, period, id, target));
        }
    }
    Ok(())
}

async fn enqueue_chunk(
    conn: &mut crate::db::conn::Conn,
    store: &Store,
    p: u16,
    items: &[DeliveryRef],
    retention: u64,
    report: &mut KickReport,
) -> anyhow::Result<()> {
    let added = scripts::enqueue(conn, &store.keys, p, items, retention).await.context("enqueue.lua")?;
    let new = added.iter().filter(|&&a| a).count() as u64;
    report.new += new;
    report.duplicates += added.len() as u64 - new;
    Ok(())
}

/// Upserts NDJSON subscriber records, then enqueues `campaign` for the eligible ones only.
pub async fn kick_list(
    store: &Store,
    config: &Config,
    campaign: &str,
    period: &str,
    subscribers: &[Subscriber],
) -> anyhow::Result<KickReport> {
    subscribers::upsert(store, subscribers).await?;
    let mut by_partition: Vec<Vec<String>> = vec![Vec::new(); usize::from(store.keys.partitions())];
    for s in subscribers {
        by_partition[usize::from(store.keys.partition_of(&s.id))].push(s.id.clone());
    }
    let mut report = KickReport { campaign: campaign.to_string(), period: period.to_string(), ..Default::default() };
    let mut conn = store.conn().await?;
    let retention = config.retention().as_secs();
    for (p, ids) in by_partition.iter().enumerate() {
        // As written a moment ago, suppressions and opt-outs included.
        for chunk in ids.chunks(ENQUEUE_CHUNK) {
            let mut pending = Vec::new();
            eligible(&mut conn, store, p as u16, campaign, period, chunk, &mut pending, &mut report).await?;
            enqueue_chunk(&mut conn, store, p as u16, &pending, retention, &mut report).await?;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn campaign() -> CampaignConfig {
        crate::config::Config::example().campaigns[0].clone()
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    const RETENTION: std::time::Duration = std::time::Duration::from_secs(35 * 86_400);

    #[test]
    fn the_period_follows_the_clock_it_is_given() {
        // Two kickers reading one clock on either side of Monday 00:00 JST agree on
        // whichever side that clock is: the clock is Redis's, shared by both.
        let c = campaign();
        let before = at("2026-11-29T14:59:59Z");
        let after = at("2026-11-29T15:00:00Z");
        assert_eq!(choose_period(&c, None, PeriodRule::NearNow, before, RETENTION).unwrap(), "2026-W48");
        assert_eq!(choose_period(&c, None, PeriodRule::NearNow, after, RETENTION).unwrap(), "2026-W49");
    }

    #[test]
    fn explicit_periods_are_limited_to_near_now_unless_asked() {
        let (c, now) = (campaign(), at("2026-11-30T03:00:00Z"));
        for ok in ["2026-W48", "2026-W49", "2026-W50"] {
            assert_eq!(choose_period(&c, Some(ok), PeriodRule::NearNow, now, RETENTION).unwrap(), ok);
        }
        let far = choose_period(&c, Some("2026-W46"), PeriodRule::NearNow, now, RETENTION).unwrap_err();
        assert!(far.to_string().contains("--allow-any-period"), "{far}");
        assert!(choose_period(&c, Some("2026-W46"), PeriodRule::AnyWithinRetention, now, RETENTION).is_ok());
        assert!(choose_period(&c, Some("2027-W10"), PeriodRule::AnyWithinRetention, now, RETENTION).is_ok());
    }

    #[test]
    fn a_period_older_than_the_retention_is_refused_outright() {
        let (c, now) = (campaign(), at("2026-11-30T03:00:00Z"));
        let old = choose_period(&c, Some("2026-W40"), PeriodRule::AnyWithinRetention, now, RETENTION).unwrap_err();
        assert!(old.to_string().contains("refused"), "{old}");
        let bad = choose_period(&c, Some("2025-W53"), PeriodRule::AnyWithinRetention, now, RETENTION).unwrap_err();
        assert!(bad.to_string().contains("is not a week period"), "{bad}");
    }
}
