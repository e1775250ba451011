//! The kick: fans a campaign period out over the subscriber registry (or over
//! NDJSON records given with the kick) through enqueue.lua, each (campaign,
//! subscriber, target, period) at most once however often it is kicked.

use std::collections::HashSet;

use anyhow::{Context, bail};
use chrono::Utc;
use serde::Serialize;

use crate::config::{CampaignConfig, Config};
use crate::id::new_id;
use crate::scripts::{self, NewDelivery};
use crate::store::Store;
use crate::subscribers::{self, Subscriber, field};

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

/// The period a kick is for: `--period` if given (checked), else the current one.
pub fn period_for(campaign: &CampaignConfig, explicit: Option<&str>) -> anyhow::Result<String> {
    match explicit {
        Some(p) if campaign.period.is_valid(p) => Ok(p.to_string()),
        Some(p) => bail!(
            "--period {p:?} is not a {} period (expected e.g. {})",
            campaign.period.name(),
            campaign.period.period_at(Utc::now(), campaign.tz())
        ),
        None => Ok(campaign.period.period_at(Utc::now(), campaign.tz())),
    }
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
    let mut pending: Vec<NewDelivery> = Vec::new();
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
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(store.keys.subscriber(p, id)).arg(&[
                field::TARGETS,
                field::ENTITLED,
                field::SUBSCRIBED,
            ]);
        }
        let rows: Vec<(Option<String>, Option<String>, Option<String>)> = pipe.query_async(&mut conn).await?;
        for (id, (targets, entitled, subscribed)) in ids.iter().zip(rows) {
            // Eligibility is checked here to keep non-paying users out of the streams,
            // and checked again at send time, which is what guarantees it.
            if !(subscribers::is_set(entitled.as_deref()) && subscribers::is_set(subscribed.as_deref())) {
                report.not_eligible += 1;
                continue;
            }
            for target in subscribers::targets(targets.as_deref()) {
                pending.push(NewDelivery { id: new_id(), subscriber: id.clone(), target: target.to_string() });
            }
        }
        while pending.len() >= ENQUEUE_CHUNK {
            let rest = pending.split_off(ENQUEUE_CHUNK);
            enqueue_chunk(&mut conn, store, p, campaign, period, &pending, retention, &mut report).await?;
            pending = rest;
        }
        if cursor == 0 {
            break;
        }
    }
    enqueue_chunk(&mut conn, store, p, campaign, period, &pending, retention, &mut report).await?;
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
async fn enqueue_chunk(
    conn: &mut deadpool_redis::Connection,
    store: &Store,
    p: u16,
    campaign: &str,
    period: &str,
    items: &[NewDelivery],
    retention: u64,
    report: &mut KickReport,
) -> anyhow::Result<()> {
    let added =
        scripts::enqueue(conn, &store.keys, p, campaign, period, items, retention).await.context("enqueue.lua")?;
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
    let mut by_partition: Vec<Vec<NewDelivery>> = vec![Vec::new(); usize::from(store.keys.partitions())];
    let mut report = KickReport { campaign: campaign.to_string(), period: period.to_string(), ..Default::default() };
    for s in subscribers {
        if !(s.entitled && s.subscribed) {
            report.not_eligible += 1;
            continue;
        }
        let p = store.keys.partition_of(&s.id);
        for target in s.targets_or_default() {
            by_partition[usize::from(p)].push(NewDelivery { id: new_id(), subscriber: s.id.clone(), target });
        }
    }
    let mut conn = store.conn().await?;
    let retention = config.retention().as_secs();
    for (p, items) in by_partition.iter().enumerate() {
        for chunk in items.chunks(ENQUEUE_CHUNK) {
            enqueue_chunk(&mut conn, store, p as u16, campaign, period, chunk, retention, &mut report).await?;
        }
    }
    Ok(report)
}
