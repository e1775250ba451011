//! `[slo]`: the objectives delivery is judged by, and `[slo.report]`: the SLO report
//! by email to `[operators] to`.

use chrono_tz::Tz;
use serde::Deserialize;

/// The objectives `mailstream slo`, /metrics and the alert rules judge delivery by.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloConfig {
    /// Highest acceptable failed / (sent + failed) of a campaign period.
    pub failure_rate: f64,
    /// A delivery unread this long after it was enqueued is stuck (so is a lease a
    /// whole lease past its expiry, and a sealed batch past its deadline).
    pub stuck_after_seconds: u64,
    pub report: SloReportConfig,
}

impl Default for SloConfig {
    fn default() -> Self {
        SloConfig { failure_rate: 0.01, stuck_after_seconds: 3600, report: SloReportConfig::default() }
    }
}

/// `[slo.report]`: the SLO report as operator mail, rendered with `template` (an
/// operator template), enqueued once per fire of `schedule` (a cron in `time_zone`)
/// and by `mailstream slo --mail`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloReportConfig {
    /// None: only `mailstream slo --mail` sends one.
    pub schedule: Option<String>,
    pub time_zone: String,
    /// A fire missed while no daemon ran is still sent this long after its time.
    pub catch_up_hours: u32,
    pub template: String,
}

impl Default for SloReportConfig {
    fn default() -> Self {
        SloReportConfig {
            schedule: None,
            time_zone: "Asia/Tokyo".into(),
            catch_up_hours: 6,
            template: "slo_report".into(),
        }
    }
}

impl SloReportConfig {
    pub fn tz(&self) -> Tz {
        self.time_zone.parse().unwrap_or(chrono_tz::Asia::Tokyo)
    }
}

/// Adds a message, naming its key, for each problem of `[slo]` and `[slo.report]`.
pub(super) fn validate(config: &super::Config, errors: &mut Vec<String>) {
    config.slo.validate(errors);
    validate_report(config, errors);
}

/// `[slo.report]` with a schedule needs its template, an operator one, and a retention
/// that outlives its catch-up window (the fire's idempotency keys guard it that long).
fn validate_report(config: &super::Config, errors: &mut Vec<String>) {
    let r = &config.slo.report;
    if r.schedule.is_none() {
        return;
    }
    match config.templates.get(&r.template) {
        None => errors.push(format!("slo.report.template: no [templates.{}] to render the report with", r.template)),
        Some(t) if t.audience != crate::model::work::Audience::Operators => errors.push(format!(
            "slo.report.template: {:?} must have audience = \"operators\": the report is operator mail",
            r.template
        )),
        Some(_) => {}
    }
    if u64::from(r.catch_up_hours) * 3600 >= config.retention().as_secs() {
        errors.push(format!(
            "slo.report.catch_up_hours: must be shorter than the retention (delivery.retention_days), or a late \
             start could send a fire's report twice (got {} h)",
            r.catch_up_hours
        ));
    }
}

impl SloConfig {
    /// Adds a message, naming its key, for each objective of `[slo]` that is out of range.
    fn validate(&self, errors: &mut Vec<String>) {
        let mut check = |ok: bool, message: String| {
            if !ok {
                errors.push(message);
            }
        };
        let slo = self;
        check(
            (0.0..1.0).contains(&slo.failure_rate),
            format!("slo.failure_rate: must be at least 0 and below 1 (got {})", slo.failure_rate),
        );
        check(
            (1..=7 * 86_400).contains(&slo.stuck_after_seconds),
            format!("slo.stuck_after_seconds: must be 1..=604800 (got {})", slo.stuck_after_seconds),
        );
        let r = &slo.report;
        check(
            r.time_zone.parse::<Tz>().is_ok(),
            format!("slo.report.time_zone: not an IANA time zone such as \"Asia/Tokyo\" (got {:?})", r.time_zone),
        );
        check(
            (1..=168).contains(&r.catch_up_hours),
            format!("slo.report.catch_up_hours: must be 1..=168 (got {})", r.catch_up_hours),
        );
        if let Some(schedule) = &r.schedule
            && let Err(e) = super::parse_cron(schedule)
        {
            errors.push(format!("slo.report.schedule: {e}"));
        }
    }
}
