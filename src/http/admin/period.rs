//! One campaign period's page (`/admin/period?campaign=…&period=…`, JSON at
//! `/admin/api/period`): how far it is (settled of enqueued, the rate of the last minute,
//! an estimate of the time left), its failures by reason (each with a retry of that
//! reason), and the instances reading each partition's streams (`XINFO CONSUMERS`).
//!
//! Raw Redis here: the read-only count of the period's recent settlements (each partition's
//! `recent` index) and the consumers of its streams, as an operator looks at them.

use hyper::StatusCode;
use minijinja::context;
use serde::Serialize;

use super::pages::{self, value};
use crate::http::server::HttpResponse;
use crate::model::work::{DeliveryRef, Lane};
use crate::ops::dead_letters::{self, FailureGroup};
use crate::ops::slo::{self, PeriodReport};
use crate::send::ctx::Ctx;
use crate::store::{Store, streams};

/// The span the rate is measured over.
const RATE_WINDOW_MS: i64 = 60_000;

/// One instance reading one lane of one partition.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Reader {
    pub partition: u16,
    /// `digest` or `transactional`.
    pub lane: &'static str,
    pub consumer: String,
    pub idle_ms: u64,
    pub pending: u64,
}

/// The period page.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PeriodView {
    pub campaign: String,
    pub period: String,
    /// Its figures per channel, as `mailstream slo --json` reports them.
    pub reports: Vec<PeriodReport>,
    /// Settled (sent, failed, skipped, outcome unknown) of enqueued, all channels.
    pub settled: u64,
    pub enqueued: u64,
    /// Deliveries settled per minute, measured over the last minute (or the part of it
    /// each partition's index of its newest settlements covers).
    pub per_minute: f64,
    /// What is left at that rate, in seconds (`None`: nothing left, or nothing settling).
    pub eta_seconds: Option<u64>,
    pub failures_by_reason: Vec<FailureGroup>,
    pub readers: Vec<Reader>,
}

fn asked(query: &str) -> anyhow::Result<(String, String)> {
    let get = |name: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(k, v)| k == name && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_string())
            .ok_or_else(|| anyhow::anyhow!("{name}: missing (a campaign and a period)"))
    };
    Ok((get("campaign")?, get("period")?))
}

/// Reads one campaign period's page.
pub(crate) async fn read(ctx: &Ctx, query: &str) -> anyhow::Result<PeriodView> {
    let (campaign, period) = asked(query)?;
    let store = &ctx.store;
    let report = slo::evaluate(store, &ctx.config, Some(&campaign), Some(&period)).await?;
    let reports = report.periods;
    let enqueued = reports.iter().map(|r| r.enqueued).sum::<u64>();
    let settled = reports.iter().map(|r| r.sent + r.failed + r.skipped + r.outcome_unknown).sum::<u64>();
    let per_minute = rate(store, &campaign, &period).await?;
    let left = enqueued.saturating_sub(settled);
    let eta_seconds = (left > 0 && per_minute > 0.0).then(|| (left as f64 / per_minute * 60.0).ceil() as u64);
    let failing = dead_letters::failing(store, Some((&campaign, &period))).await?;
    let readers = readers(store, &ctx.config.redis.group, campaign == crate::model::work::TRANSACTIONAL).await?;
    Ok(PeriodView {
        campaign,
        period,
        reports,
        settled,
        enqueued,
        per_minute,
        eta_seconds,
        failures_by_reason: dead_letters::by_reason(&failing),
        readers,
    })
}

/// The period's page.
pub(crate) async fn page(ctx: &Ctx, query: &str) -> anyhow::Result<HttpResponse> {
    let view = read(ctx, query).await?;
    let title = format!("{} {}", view.campaign, view.period);
    let acted = super::actions::acted(query);
    let context = context! { title, signed_in => true, v => value(&view), acted => value(&acted) };
    Ok(pages::page(StatusCode::OK, "period.html", context))
}

/// The period's settlements per minute over the last minute, from each partition's index
/// of its newest settlements (at most `RECENT_KEEP` each: where that covers less than the
/// minute, the rate is of the part it covers).
async fn rate(store: &Store, campaign: &str, period: &str) -> anyhow::Result<f64> {
    let now = store.time().await?.timestamp_millis();
    let mut conn = store.conn().await?;
    let mut per_ms = 0.0;
    for p in 0..store.keys.partitions() {
        let recent = store.keys.recent(p);
        let newest: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&recent)
            .arg("+inf")
            .arg(now - RATE_WINDOW_MS)
            .arg("BYSCORE")
            .arg("REV")
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        let Some(&(_, oldest)) = newest.last() else { continue };
        // A full index may have dropped older settlements of the minute: measure over
        // what it still covers.
        let full = newest.len() >= crate::store::keys::RECENT_KEEP;
        let since = if full { oldest as i64 } else { now - RATE_WINDOW_MS };
        let span = (now - since).max(1_000) as f64;
        let ours = newest
            .iter()
            .filter(|(id, _)| DeliveryRef::parse(id).is_some_and(|d| d.campaign == campaign && d.period == period))
            .count();
        per_ms += ours as f64 / span;
    }
    Ok((per_ms * 60_000.0 * 10.0).round() / 10.0)
}

/// The consumers of every partition's stream of the period's lane (a stream or group
/// not made yet has none).
async fn readers(store: &Store, group: &str, transactional: bool) -> anyhow::Result<Vec<Reader>> {
    let lane = if transactional { Lane::Transactional } else { Lane::Digest };
    let mut conn = store.conn().await?;
    let mut out = Vec::new();
    for p in 0..store.keys.partitions() {
        let stream = store.keys.lane_stream(p, lane);
        if streams::group_info(&mut conn, &stream, group).await?.is_none() {
            continue;
        }
        let consumers = streams::consumers(&mut conn, &stream, group).await?;
        out.extend(consumers.into_iter().map(|c| Reader {
            partition: p,
            lane: lane.as_str(),
            consumer: c.name,
            idle_ms: c.idle_ms,
            pending: c.pending,
        }));
    }
    Ok(out)
}
