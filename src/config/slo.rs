//! `[slo]`: the objectives delivery is judged by.

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
}

impl Default for SloConfig {
    fn default() -> Self {
        SloConfig { failure_rate: 0.01, stuck_after_seconds: 3600 }
    }
}

impl SloConfig {
    /// Adds a message, naming its key, for each objective of `[slo]` that is out of range.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
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
    }
}
