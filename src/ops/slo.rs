//! The delivery SLO, as the seed system decided it: per campaign period, failure
//! rate = failed / (sent + failed) (skipped and pending outside the denominator;
//! outcome_unknown reported beside it), judged against `slo.failure_rate`; stuck
//! deliveries are a separate signal. `mailstream slo` prints this for a nightly
//! job and exits `EXIT_WITHIN` (0), `EXIT_BREACHED` (3) or `EXIT_UNEVALUATED` (4).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::Config;
use crate::model::work::Channel;
use crate::send::stuck::{self, StuckKind};
use crate::store::{Counts, PeriodFigures, Store};

/// Every period within its objectives and nothing stuck.
const EXIT_WITHIN: u8 = 0;
/// A failure rate above its objective, or stuck deliveries: a warning to look at,
/// not a failure of the check itself.
const EXIT_BREACHED: u8 = 3;
/// The SLO could not be evaluated (Redis unreachable, no such campaign).
pub(crate) const EXIT_UNEVALUATED: u8 = 4;

/// One campaign period's standing.
#[derive(Debug, Clone, Serialize)]
pub struct PeriodReport {
    pub campaign: String,
    pub period: String,
    /// Each channel of a period is judged on its own (`email`, `app`).
    pub channel: Channel,
    pub enqueued: u64,
    pub sent: u64,
    pub failed: u64,
    pub skipped: u64,
    pub outcome_unknown: u64,
    pub pending: u64,
    /// Operator mail whose sender was refused and that was sealed again from its
    /// fallback sender, whatever came of it (a warning: a sender's domain is refused).
    pub fallbacks: u64,
    /// Emails the provider accepted and then failed (`email.failed`), on their own line:
    /// they are counted `sent` above, so the failure rate of decided outcomes is unchanged.
    pub provider_failed: u64,
    /// Those by the provider's reason.
    pub provider_failed_by_reason: BTreeMap<String, u64>,
    /// Emails the provider reported delayed after accepting them.
    pub delivery_delayed: u64,
    /// `None` while nothing is sent or failed.
    pub failure_rate: Option<f64>,
    /// Stuck deliveries by kind (unclaimed, lease_expired, past_deadline).
    pub stuck: BTreeMap<&'static str, u64>,
    /// What is wrong: `failure_rate`, `stuck` (empty: within its objectives).
    pub breached: Vec<&'static str>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SloReport {
    pub objective: f64,
    pub stuck_after_seconds: u64,
    pub periods: Vec<PeriodReport>,
    /// `within` or `breached`.
    pub status: &'static str,
}

impl SloReport {
    pub(crate) fn exit_code(&self) -> u8 {
        if self.status == "within" { EXIT_WITHIN } else { EXIT_BREACHED }
    }
}

/// Judges one period's counts and stuck tally.
fn judge(
    (campaign, period, channel): (&str, &str, Channel),
    f: &PeriodFigures,
    stuck: BTreeMap<&'static str, u64>,
    objective: f64,
) -> PeriodReport {
    let c = &f.counts;
    let failure_rate = c.failure_rate();
    let mut breached = Vec::new();
    if failure_rate.is_some_and(|r| r > objective) {
        breached.push("failure_rate");
    }
    if stuck.values().any(|&n| n > 0) {
        breached.push("stuck");
    }
    PeriodReport {
        campaign: campaign.to_string(),
        period: period.to_string(),
        channel,
        enqueued: c.enqueued,
        sent: c.sent,
        failed: c.failed,
        skipped: c.skipped,
        outcome_unknown: c.outcome_unknown,
        pending: c.pending(),
        fallbacks: c.fallbacks,
        provider_failed: c.provider_failed,
        provider_failed_by_reason: f.provider_failed_by_reason.clone(),
        delivery_delayed: c.delivery_delayed,
        failure_rate,
        stuck,
        breached,
    }
}

/// Evaluates every period within the retention (or only `campaign`'s, or only
/// `period`), from the counts in Redis and one look for stuck deliveries.
pub async fn evaluate(
    store: &Store,
    config: &Config,
    campaign: Option<&str>,
    period: Option<&str>,
) -> anyhow::Result<SloReport> {
    let mut periods: Vec<(String, String)> = store.periods().await?;
    if let Some(c) = campaign {
        anyhow::ensure!(
            config.campaign(c).is_some() || periods.iter().any(|(pc, _)| pc == c),
            "no campaign {c:?} in the config or in Redis"
        );
        periods.retain(|(pc, _)| pc == c);
    }
    if let Some(p) = period {
        periods.retain(|(_, pp)| pp == p);
        // A period asked for by name is reported even if nothing was enqueued for it.
        if let Some(c) = campaign.filter(|_| periods.is_empty()) {
            periods.push((c.to_string(), p.to_string()));
        }
    }
    let tally = stuck::look_everywhere(store, config).await?;
    let objective = config.slo.failure_rate;
    let mut reports = Vec::new();
    for (c, p) in periods {
        for channel in Channel::ALL {
            let figures = store.period_figures(&c, &p, channel).await?;
            // Email always; another channel once the period has any of it.
            if channel != Channel::Email && figures.counts == Counts::default() {
                continue;
            }
            let stuck: BTreeMap<&'static str, u64> = StuckKind::ALL
                .iter()
                .map(|&k| (k.as_str(), tally.get(&(c.clone(), p.clone(), channel, k)).copied().unwrap_or(0)))
                .collect();
            reports.push(judge((&c, &p, channel), &figures, stuck, objective));
        }
    }
    let status = if reports.iter().all(|r| r.breached.is_empty()) { "within" } else { "breached" };
    Ok(SloReport { objective, stuck_after_seconds: config.stuck_after().as_secs(), periods: reports, status })
}

/// The report for people, one line per period.
pub fn render(report: &SloReport) -> String {
    let pct = |r: f64| format!("{:.2}%", r * 100.0);
    let mut out = format!(
        "mailstream slo: failure rate at most {} per campaign period; stuck after {} s\n",
        pct(report.objective),
        report.stuck_after_seconds
    );
    for r in &report.periods {
        let rate = r.failure_rate.map_or("n/a (nothing sent or failed yet)".to_string(), pct);
        let stuck: u64 = r.stuck.values().sum();
        let verdict =
            if r.breached.is_empty() { "ok".to_string() } else { format!("BREACHED: {}", r.breached.join(", ")) };
        // Email's line as it always was; another channel's names it.
        let channel = if r.channel == Channel::Email { String::new() } else { format!(" ({})", r.channel) };
        out += &format!(
            "  {} {}{channel}: failure rate {rate} ({} failed / {} sent+failed), {} outcome unknown, {} skipped, \
             {} pending, {stuck} stuck  {verdict}\n",
            r.campaign,
            r.period,
            r.failed,
            r.sent + r.failed,
            r.outcome_unknown,
            r.skipped,
            r.pending,
        );
        if r.fallbacks > 0 {
            out += &format!("    fell back to a fallback sender: {} (a sender's domain is refused)\n", r.fallbacks);
        }
        if r.provider_failed > 0 || r.delivery_delayed > 0 {
            let reasons: Vec<String> = r.provider_failed_by_reason.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let reasons = if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join(", ")) };
            out += &format!(
                "    after the provider accepted them: {} failed{reasons}, {} delayed (counted sent above)\n",
                r.provider_failed, r.delivery_delayed
            );
        }
        if stuck > 0 {
            let kinds: Vec<String> = r.stuck.iter().filter(|(_, n)| **n > 0).map(|(k, n)| format!("{k} {n}")).collect();
            out += &format!("    stuck: {}\n", kinds.join(", "));
        }
    }
    if report.periods.is_empty() {
        out += "  no campaign period within the retention\n";
    }
    out += if report.status == "within" { "within objectives\n" } else { "objective breached\n" };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(sent: u64, failed: u64, skipped: u64, unknown: u64, enqueued: u64) -> PeriodFigures {
        let counts = Counts { enqueued, sent, failed, skipped, outcome_unknown: unknown, ..Default::default() };
        PeriodFigures { counts, ..Default::default() }
    }

    #[test]
    fn the_rate_is_failed_over_sent_plus_failed_only() {
        let r = judge(("c", "p", Channel::Email), &counts(98, 2, 500, 7, 700), Default::default(), 0.01);
        assert_eq!(r.failure_rate, Some(0.02));
        assert_eq!(r.breached, ["failure_rate"]);
        assert_eq!(r.pending, 700 - 98 - 2 - 500 - 7);
        let ok = judge(("c", "p", Channel::Email), &counts(99, 1, 0, 50, 150), Default::default(), 0.01);
        assert!(ok.breached.is_empty(), "exactly at the objective is within it");
    }

    #[test]
    fn nothing_decided_is_within_and_stuck_alone_breaches() {
        let none = judge(("c", "p", Channel::Email), &counts(0, 0, 10, 0, 10), Default::default(), 0.01);
        assert_eq!((none.failure_rate, none.breached.len()), (None, 0));
        let stuck = judge(("c", "p", Channel::Email), &counts(10, 0, 0, 0, 11), [("unclaimed", 1)].into(), 0.01);
        assert_eq!(stuck.breached, ["stuck"]);
    }

    #[test]
    fn failures_after_acceptance_have_their_own_line_and_leave_the_rate_alone() {
        let mut f = counts(100, 0, 0, 0, 100);
        f.counts.provider_failed = 3;
        f.counts.delivery_delayed = 2;
        f.provider_failed_by_reason = [("reached_daily_quota".to_string(), 3)].into();
        let r = judge(("c", "p", Channel::Email), &f, Default::default(), 0.01);
        assert_eq!((r.failure_rate, r.breached.len()), (Some(0.0), 0), "decided outcomes as defined");
        let report = SloReport { objective: 0.01, stuck_after_seconds: 60, periods: vec![r], status: "within" };
        let text = render(&report);
        assert!(
            text.contains("after the provider accepted them: 3 failed (reached_daily_quota 3), 2 delayed"),
            "{text}"
        );
        let quiet = render(&SloReport {
            periods: vec![judge(("c", "p", Channel::Email), &counts(1, 0, 0, 0, 1), Default::default(), 0.01)],
            ..report
        });
        assert!(!quiet.contains("after the provider"), "{quiet}");
    }
}
