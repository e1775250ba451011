//! `[delivery]`: leases, retries, how long records live, and the windows inside which
//! a sealed batch may still be sent.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// How long a claimed delivery or a sealed batch belongs to its holder without a
    /// heartbeat; a live holder renews it every third of it, so it can be short and a
    /// killed instance's work resumes within about a lease.
    pub lease_seconds: u64,
    /// How long delivery records and dedup keys live; must outlive the longest period.
    pub retention_days: u64,
    /// Stream entries read per XREADGROUP.
    pub read_count: usize,
    /// How long one XREADGROUP blocks waiting for entries.
    pub block_ms: u64,
    /// Claims of one delivery without it being sealed (a delivery that crashes
    /// whoever renders it) before it is failed, `too_many_attempts`.
    pub max_claims: u32,
    /// First retry delay; doubled per attempt, with jitter.
    pub retry_base_ms: u64,
    /// Longest retry delay.
    pub retry_max_ms: u64,
    /// A sealed batch older than this is never resent blind (Resend keeps keys 24 h).
    pub resend_window_hours: u64,
    /// A batch no request of which can have been processed (connection refused, 429,
    /// quota) is retried until this long after it was first sealed, then `failed`, `expired`.
    pub deadline_hours: u64,
    /// A batch that may have been sent is retried (same key, same body) until this long
    /// after it was sealed, then `outcome_unknown`; well inside the resend window.
    pub maybe_sent_deadline_hours: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            lease_seconds: 15,
            retention_days: 35,
            read_count: 100,
            block_ms: 1000,
            max_claims: 10,
            retry_base_ms: 1000,
            retry_max_ms: 300_000,
            resend_window_hours: 23,
            deadline_hours: 48,
            maybe_sent_deadline_hours: 6,
        }
    }
}

impl DeliveryConfig {
    /// How long after sealing a batch may still be resent (`resend_window_hours`).
    pub(crate) fn resend_window(&self) -> Duration {
        Duration::from_secs(self.resend_window_hours * 3600)
    }

    /// How long after first sealing an unsent batch is retried (`deadline_hours`).
    pub fn deadline(&self) -> Duration {
        Duration::from_secs(self.deadline_hours * 3600)
    }

    /// How long after sealing a maybe-sent batch is retried (`maybe_sent_deadline_hours`).
    pub(crate) fn maybe_sent_deadline(&self) -> Duration {
        Duration::from_secs(self.maybe_sent_deadline_hours * 3600)
    }

    /// Adds a message, naming its key, for each setting of `[delivery]` that is wrong.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        let mut check = |ok: bool, message: String| {
            if !ok {
                errors.push(message);
            }
        };
        let d = self;
        check(
            (3..=600).contains(&d.lease_seconds),
            format!(
                "delivery.lease_seconds: must be 3..=600; live holders renew every third of it (got {})",
                d.lease_seconds
            ),
        );
        check(
            (1..=3650).contains(&d.retention_days),
            format!("delivery.retention_days: must be 1..=3650 (got {})", d.retention_days),
        );
        check(
            (1..=10_000).contains(&d.read_count),
            format!("delivery.read_count: must be 1..=10000 (got {})", d.read_count),
        );
        check((1..=60_000).contains(&d.block_ms), format!("delivery.block_ms: must be 1..=60000 (got {})", d.block_ms));
        check(
            (1..=100).contains(&d.max_claims),
            format!("delivery.max_claims: must be 1..=100 (got {})", d.max_claims),
        );
        check(
            d.retry_base_ms >= 1 && d.retry_base_ms <= d.retry_max_ms,
            format!(
                "delivery.retry_base_ms: must be at least 1 and at most delivery.retry_max_ms (got {} and {})",
                d.retry_base_ms, d.retry_max_ms
            ),
        );
        check(
            (1..=23).contains(&d.resend_window_hours),
            format!(
                "delivery.resend_window_hours: must be 1..=23, under Resend's 24 h idempotency window (got {})",
                d.resend_window_hours
            ),
        );
        check(
            d.maybe_sent_deadline_hours >= 1 && d.maybe_sent_deadline_hours < d.resend_window_hours,
            format!(
                "delivery.maybe_sent_deadline_hours: must be at least 1 and below delivery.resend_window_hours ({}), \
                 so a maybe-sent batch is never resent after the provider forgot its key (got {})",
                d.resend_window_hours, d.maybe_sent_deadline_hours
            ),
        );
        check(
            (1..=24 * 30).contains(&d.deadline_hours) && d.deadline_hours * 3600 < d.retention_days * 86_400,
            format!(
                "delivery.deadline_hours: must be 1..=720 and shorter than delivery.retention_days (got {})",
                d.deadline_hours
            ),
        );
    }
}
