//! The SLO report by email: every campaign period against its objective (failure
//! rate, outcome unknown, stuck, sender fallbacks, marked breached or within) and the
//! suppressions of the last day, rendered with the `[slo.report]` template and enqueued
//! as operator mail to each address of `[operators] to` (so it falls back to the
//! template's other sender when Resend refuses the first). Once per fire of its
//! schedule across instances (the fire names the idempotency keys: whoever enqueues it
//! second adds nothing), and at once by `mailstream slo --mail`.

use std::collections::BTreeMap;

use anyhow::Context;
use serde_json::json;

use crate::audience::ingest::{self, ItemResult};
use crate::config::Config;
use crate::model::work::Audience;
use crate::ops::slo;
use crate::store::Store;

/// What enqueuing one report came to.
#[derive(Debug, Clone)]
pub struct ReportEnqueued {
    pub report: slo::SloReport,
    /// One per operator address: accepted now, or already enqueued (by another instance).
    pub results: Vec<ItemResult>,
}

impl ReportEnqueued {
    /// Operators it was enqueued for now.
    pub fn accepted(&self) -> usize {
        self.results.iter().filter(|r| matches!(r, ItemResult::Accepted { .. })).count()
    }
}

/// The idempotency key of report `name` for operator address `to`: a name and a short
/// hash of the address, never the address (keys show in stream entries).
fn key(store: &Store, name: &str, to: &str) -> String {
    let hash = store.keys.address(to).hash;
    format!("slo-report.{name}.{}", &hash[..hash.len().min(12)])
}

/// What the report's template sees as `subscriber.data`.
fn data(report: &slo::SloReport, suppressions: &BTreeMap<String, u64>, name: &str) -> serde_json::Value {
    let pct = |r: f64| format!("{:.2}%", r * 100.0);
    let periods: Vec<serde_json::Value> = report
        .periods
        .iter()
        .map(|p| {
            json!({
                "campaign": p.campaign,
                "period": p.period,
                "channel": p.channel.as_str(),
                "verdict": if p.breached.is_empty() { "within".to_string() } else { format!("breached: {}", p.breached.join(", ")) },
                "failure_rate": p.failure_rate.map_or("n/a".to_string(), pct),
                "failed": p.failed,
                "decided": p.sent + p.failed,
                "outcome_unknown": p.outcome_unknown,
                "stuck": p.stuck.values().sum::<u64>(),
                "fallbacks": p.fallbacks,
                "provider_failed": p.provider_failed,
                "delivery_delayed": p.delivery_delayed,
            })
        })
        .collect();
    json!({
        "report": name,
        "status": report.status,
        "objective": pct(report.objective),
        "periods": periods,
        "breached": report.periods.iter().filter(|p| !p.breached.is_empty()).count(),
        "fallbacks": report.periods.iter().map(|p| p.fallbacks).sum::<u64>(),
        "suppressions": suppressions,
        "suppressed": suppressions.values().sum::<u64>(),
    })
}

/// Evaluates the SLO now and enqueues report `name` (a fire's time, or a one-off name)
/// to every operator.
pub async fn enqueue(store: &Store, config: &Config, name: &str) -> anyhow::Result<ReportEnqueued> {
    let r = &config.slo.report;
    let template = config
        .templates
        .get(&r.template)
        .with_context(|| format!("slo.report.template: no [templates.{}] to render the report with", r.template))?;
    anyhow::ensure!(
        template.audience == Audience::Operators && !config.operators.to.is_empty(),
        "the SLO report is operator mail: [templates.{}] needs audience = \"operators\" and [operators] to an address",
        r.template
    );
    let report = slo::evaluate(store, config, None, None).await?;
    let data = data(&report, &crate::audience::suppression::of_the_last_day(store).await?, name);
    let items = config
        .operators
        .to
        .iter()
        .map(|to| json!({"idempotency_key": key(store, name, to), "to": to, "template": r.template, "data": data}))
        .collect();
    let results = ingest::enqueue(store, config, items).await?;
    // The same key with other figures (another instance evaluated it a moment apart) is
    // a report already enqueued: that one goes.
    if let Some(ItemResult::Invalid { field, error, .. }) =
        results.iter().find(|r| matches!(r, ItemResult::Invalid { .. }))
    {
        anyhow::bail!("the SLO report was refused at ingest: {field}: {error}");
    }
    Ok(ReportEnqueued { report, results })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_report_template_renders_every_figure() {
        let config = Config::example();
        let mut report =
            slo::SloReport { objective: 0.01, stuck_after_seconds: 3600, periods: Vec::new(), status: "breached" };
        report.periods.push(slo::PeriodReport {
            campaign: "weekly_digest".into(),
            period: "2026-W49".into(),
            channel: crate::model::work::Channel::Email,
            enqueued: 100,
            sent: 90,
            failed: 10,
            skipped: 0,
            outcome_unknown: 2,
            pending: 0,
            fallbacks: 1,
            provider_failed: 3,
            provider_failed_by_reason: [("reached_daily_quota".to_string(), 3)].into(),
            delivery_delayed: 0,
            failure_rate: Some(0.1),
            stuck: [("unclaimed", 3)].into(),
            breached: vec!["failure_rate", "stuck"],
        });
        let data = data(&report, &[("bounced".to_string(), 4)].into(), "20261202T0800Z");
        let renderer = crate::audience::render::Renderer::of(&config).unwrap();
        let d = crate::model::work::DeliveryRef::new(
            crate::model::work::TRANSACTIONAL,
            "2026-12-02",
            "-",
            "slo-report.x.y",
        );
        let input = crate::audience::render::RenderInput {
            delivery: &d,
            variant: None,
            target: &d.target,
            subscriber_id: "-",
            data: &data,
            headers: &[],
        };
        let json = renderer.render("slo_report", "a@acme.example", "oncall@acme.example", &input).unwrap();
        let email: serde_json::Value = serde_json::from_str(&json).unwrap();
        let text = email["text"].as_str().unwrap();
        assert_eq!(email["subject"], "mailstream SLO: breached (1 of 1 campaign periods)");
        for figure in [
            "weekly_digest 2026-W49",
            "breached: failure_rate, stuck",
            "10.00%",
            "10 failed of 100",
            "2 outcome unknown",
            "3 stuck",
            "1 fell back to a fallback sender",
            "3 failed by Resend after it accepted them",
            "bounced: 4",
        ] {
            assert!(text.contains(figure), "{figure:?} in {text}");
        }
    }
}
