//! Gauges read from Redis when Prometheus scrapes, so they are fresh and the same
//! on every instance: what other processes did (a kick from the command line, a
//! settle by another instance) shows at once. Per campaign period (within the
//! retention): deliveries by state and duplicates offered; per partition: the
//! stream, the group's lag and pending entries, sealed and due batches; dead
//! letters and outcome-unknown entries; the shared pause.
//!
//! Raw Redis here: the read-only counts a scrape shows (XLEN, ZCARD, ZCOUNT, EXISTS), pipelined per
//! partition.

use std::time::Duration;

use anyhow::anyhow;
use prometheus::{IntGauge, IntGaugeVec, Registry};
use redis::aio::ConnectionLike;

use super::Metrics;
use crate::config::Config;
use crate::model::work::Channel;
use crate::store::{Counts, Store, streams};

/// The gauges filled at scrape time.
pub(crate) struct Gauges {
    period_deliveries: IntGaugeVec,
    period_duplicates: IntGaugeVec,
    variant_exposures: IntGaugeVec,
    backlog: IntGaugeVec,
    dead_letters: IntGaugeVec,
    redis_up: IntGauge,
}

impl Gauges {
    pub fn new(r: &Registry) -> Gauges {
        let redis_up =
            IntGauge::new("mailstream_redis_up", "1 when the last scrape could read Redis").expect("valid metric");
        r.register(Box::new(redis_up.clone())).expect("unique metric");
        Gauges {
            period_deliveries: super::families::gauges(
                r,
                "mailstream_period_deliveries",
                "Deliveries of a campaign period by channel (email, app) and state (enqueued, pending, sent, \
                 failed, skipped, outcome_unknown), read from Redis; the same on every instance",
                &["campaign", "period", "channel", "state"],
            ),
            period_duplicates: super::families::gauges(
                r,
                "mailstream_period_duplicates",
                "Offers to enqueue a delivery of the period that was already enqueued (kicked twice)",
                &["campaign", "period"],
            ),
            variant_exposures: super::families::gauges(
                r,
                "mailstream_variant_exposures",
                "A/B exposures of a campaign period: emails of each variant the provider accepted",
                &["campaign", "period", "variant"],
            ),
            backlog: super::families::gauges(
                r,
                "mailstream_backlog",
                "Per partition: stream_length, unread (the group's lag), unacked (read, not sealed), \
                 sealed_batches (unsettled), due_batches (a retry due or a holder's lease run out), scheduled \
                 (waiting for a recipient's local hour or a render hook), transactional_unread and \
                 transactional_unacked (the transactional lane)",
                &["partition", "kind"],
            ),
            dead_letters: super::families::gauges(
                r,
                "mailstream_dead_letters",
                "Entries in the dead-letter streams: failed, and unknown (outcome_unknown)",
                &["kind"],
            ),
            redis_up,
        }
    }
}

/// One partition's figures.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub(crate) struct Partition {
    pub stream_length: u64,
    pub unread: u64,
    pub unacked: u64,
    pub tx_unread: u64,
    pub tx_unacked: u64,
    pub sealed_batches: u64,
    pub due_batches: u64,
    pub scheduled: u64,
    pub dead: u64,
    pub unknown: u64,
    pub paused: bool,
}

/// Reads Redis and fills the gauges (all at once, after every read succeeded).
/// On failure, or when Redis takes longer than `limit`, `mailstream_redis_up` is 0
/// and the gauges keep their last values.
pub async fn refresh(metrics: &Metrics, store: &Store, config: &Config, limit: Duration) -> anyhow::Result<()> {
    let read = async {
        let mut periods = Vec::new();
        for (campaign, period) in store.periods().await? {
            for channel in Channel::ALL {
                let figures = store.period_figures(&campaign, &period, channel).await?;
                let (counts, exposures) = (figures.counts, figures.exposed);
                // Email always (a period's series from its kick); another channel once it has any.
                if channel == Channel::Email || counts != Counts::default() {
                    periods.push((campaign.clone(), period.clone(), channel, counts, exposures));
                }
            }
        }
        let mut conn = store.conn().await?;
        let mut partitions = Vec::new();
        for p in 0..store.keys.partitions() {
            partitions.push(partition(&mut conn, store, &config.redis.group, p).await?);
        }
        let down = crate::store::scripts::provider_down_since(&mut conn, &store.keys).await?;
        anyhow::Ok((periods, partitions, down.is_some()))
    };
    let g = &metrics.redis;
    let read = tokio::time::timeout(limit, read).await.unwrap_or_else(|_| Err(anyhow!("Redis did not answer in time")));
    let (periods, partitions, provider_down) = match read {
        Ok(read) => read,
        Err(e) => {
            g.redis_up.set(0);
            return Err(e);
        }
    };
    let _exposition = metrics.exposition.lock().expect("exposition lock");
    g.redis_up.set(1);
    g.period_deliveries.reset();
    g.period_duplicates.reset();
    g.variant_exposures.reset();
    for (campaign, period, channel, c, exposures) in &periods {
        for (state, n) in states(c) {
            g.period_deliveries.with_label_values(&[campaign, period, channel.as_str(), state]).set(n as i64);
        }
        if *channel != Channel::Email {
            continue;
        }
        g.period_duplicates.with_label_values(&[campaign, period]).set(c.duplicates as i64);
        let arms = config.campaign(campaign).map(|c| c.variants.arms.as_slice()).unwrap_or_default();
        // Only declared variants: the label stays bounded by the config.
        for arm in arms {
            let n = exposures.get(&arm.name).copied().unwrap_or(0);
            g.variant_exposures.with_label_values(&[campaign, period, &arm.name]).set(n as i64);
        }
    }
    for (p, f) in partitions.iter().enumerate() {
        let p = p.to_string();
        for (kind, n) in [
            ("stream_length", f.stream_length),
            ("unread", f.unread),
            ("unacked", f.unacked),
            ("sealed_batches", f.sealed_batches),
            ("due_batches", f.due_batches),
            ("scheduled", f.scheduled),
            ("transactional_unread", f.tx_unread),
            ("transactional_unacked", f.tx_unacked),
        ] {
            g.backlog.with_label_values(&[p.as_str(), kind]).set(n as i64);
        }
    }
    g.dead_letters.with_label_values(&["failed"]).set(partitions.iter().map(|f| f.dead).sum::<u64>() as i64);
    g.dead_letters.with_label_values(&["unknown"]).set(partitions.iter().map(|f| f.unknown).sum::<u64>() as i64);
    metrics.sending.paused.set(i64::from(partitions.iter().any(|f| f.paused)));
    metrics.sending.provider_down.set(i64::from(provider_down));
    Ok(())
}

/// A period's counts as (state, deliveries).
fn states(c: &Counts) -> [(&'static str, u64); 6] {
    [
        ("enqueued", c.enqueued),
        ("pending", c.pending()),
        ("sent", c.sent),
        ("failed", c.failed),
        ("skipped", c.skipped),
        ("outcome_unknown", c.outcome_unknown),
    ]
}

/// One partition's backlog, dead letters and pause, as the gauges and the admin
/// overview show them.
pub(crate) async fn partition(
    conn: &mut impl ConnectionLike,
    store: &Store,
    group: &str,
    p: u16,
) -> anyhow::Result<Partition> {
    let keys = &store.keys;
    let stream = keys.stream(p);
    let (unread, unacked) = match streams::group_info(conn, &stream, group).await? {
        Some(g) => (g.lag, g.pending),
        None => (0, 0),
    };
    let tx = keys.lane_stream(p, crate::model::work::Lane::Transactional);
    let (tx_unread, tx_unacked) = match streams::group_info(conn, &tx, group).await? {
        Some(g) => (g.lag, g.pending),
        None => (0, 0),
    };
    let now = crate::store::records::now_ms(conn).await?;
    type Figures = (u64, u64, u64, u64, u64, bool, u64);
    let (stream_length, sealed_batches, due_batches, dead, unknown, paused, scheduled): Figures = redis::pipe()
        .cmd("XLEN")
        .arg(&stream)
        .cmd("ZCARD")
        .arg(keys.batches(p))
        .cmd("ZCOUNT")
        .arg(keys.batches(p))
        .arg("-inf")
        .arg(now)
        .cmd("XLEN")
        .arg(keys.dead(p))
        .cmd("XLEN")
        .arg(keys.unknown(p))
        .cmd("EXISTS")
        .arg(keys.paused(p))
        .cmd("ZCARD")
        .arg(keys.due(p))
        .query_async(conn)
        .await?;
    Ok(Partition {
        stream_length,
        unread,
        unacked,
        tx_unread,
        tx_unacked,
        sealed_batches,
        due_batches,
        scheduled,
        dead,
        unknown,
        paused,
    })
}
