//! The admin landing page's figures: what an operator asks first in an incident.
//! Each campaign period's SLO report (the same as `mailstream slo --json`), whether
//! sending is paused, whether the provider is down, each partition's backlog and dead letters (the same reads as
//! the `/metrics` gauges), the deliveries failing now by error name, and the
//! suppressions and webhook events of the last 24 hours, and a chart of the deliveries
//! settled per minute in the last hour (sent, skipped, outcome unknown, failed). The page refreshes itself
//! every `REFRESH_SECONDS` unless paused (`?refresh=off`).

use hyper::StatusCode;
use minijinja::context;
use serde::Serialize;

use super::pages::{self, value};
use crate::config::Config;
use crate::http::server::HttpResponse;
use crate::metrics::{self, Partition};
use crate::ops::dead_letters::{self, FailureGroup};
use crate::store::{Minute, Store};
use crate::{audience::suppression, ops::slo};

/// How often the overview page reloads itself while not paused.
const REFRESH_SECONDS: u64 = 15;

/// How many minutes the chart shows (the per-minute counters keep a little more).
const CHART_MINUTES: usize = 60;

/// The overview (also `/admin/api/overview`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Overview {
    /// Redis's clock when it was read (RFC 3339).
    pub at: String,
    pub slo: slo::SloReport,
    /// A quota pause holds sending (on every instance).
    pub paused: bool,
    /// Since when the provider counts as down (RFC 3339), if it does.
    pub provider_down_since: Option<String>,
    pub partitions: Vec<Partition>,
    pub dead_letters: u64,
    pub outcome_unknown_letters: u64,
    /// Suppressions made in the last 24 hours, by reason.
    pub suppressed_last_24h: std::collections::BTreeMap<String, u64>,
    /// Provider events recorded on deliveries in the last 24 hours, by type.
    pub webhook_events_last_24h: std::collections::BTreeMap<String, u64>,
    /// Deliveries failed or of unknown outcome now (not retried since), by status and
    /// error name, the largest group first.
    pub failures_by_reason: Vec<FailureGroup>,
    /// Deliveries settled in each of the last `CHART_MINUTES` minutes, oldest first.
    pub last_hour: Vec<Minute>,
}

/// Reads the overview from Redis.
pub(crate) async fn read(store: &Store, config: &Config) -> anyhow::Result<Overview> {
    let now = store.time().await?;
    let slo = slo::evaluate(store, config, None, None).await?;
    let mut conn = store.conn().await?;
    let mut partitions = Vec::new();
    for p in 0..store.keys.partitions() {
        partitions.push(metrics::partition(&mut conn, store, &config.redis.group, p).await?);
    }
    let down = crate::store::scripts::provider_down_since(&mut conn, &store.keys).await?;
    let provider_down_since = down
        .and_then(|ms| chrono::DateTime::from_timestamp_millis(ms as i64))
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    let suppressed_last_24h = suppression::of_the_last_day(store).await?;
    Ok(Overview {
        at: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        slo,
        paused: partitions.iter().any(|p| p.paused),
        provider_down_since,
        dead_letters: partitions.iter().map(|p| p.dead).sum(),
        outcome_unknown_letters: partitions.iter().map(|p| p.unknown).sum(),
        partitions,
        suppressed_last_24h,
        webhook_events_last_24h: crate::store::scripts::webhook_events_last_24h(store).await?,
        failures_by_reason: dead_letters::by_reason(&dead_letters::failing(store, None).await?),
        last_hour: store.per_minute(now, CHART_MINUTES).await?,
    })
}

/// The overview page; `?refresh=off` pauses its reloading.
pub(crate) async fn page(store: &Store, config: &Config, query: &str) -> anyhow::Result<HttpResponse> {
    let o = read(store, config).await?;
    let paused = form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "refresh" && v == "off");
    let refresh = (!paused).then_some(REFRESH_SECONDS);
    let acted = super::actions::acted(query);
    let chart = minijinja::Value::from_safe_string(super::chart::svg(&o.last_hour));
    let context =
        context! { title => "Overview", signed_in => true, o => value(&o), chart, refresh, acted => value(&acted) };
    Ok(pages::page(StatusCode::OK, "overview.html", context))
}
