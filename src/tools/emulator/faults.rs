//! Faults the emulator can inject, from its settings: 5xx answers, hangs that
//! process a request and answer too late, 409s, 429 storms, a quota that runs
//! out (refused as `daily_quota_exceeded` or `monthly_quota_exceeded`), senders
//! whose domain is not verified. Seeded, so a faulty run replays.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::validate::ApiError;

/// Injected faults. Fractions are per request, in 0..=1.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Answer 500 `internal_server_error` or 503 without processing.
    pub server_error: f64,
    /// Process the request, then hold the answer for `hang_ms` (longer than the
    /// client's timeout: the email is sent, the response is lost).
    pub hang: f64,
    pub hang_ms: u64,
    /// Answer 409 `concurrent_idempotent_requests` to a keyed request without processing.
    pub concurrent: f64,
    /// 429 storms: after `after_requests` requests, every request for `duration_ms` is refused.
    pub storms: Vec<Storm>,
    /// Accept this many emails, then answer 429 `quota_refusal` until `quota_reset_ms` passes.
    pub quota_after_emails: Option<u64>,
    pub quota_reset_ms: Option<u64>,
    /// Which quota that is, by the name of its refusal: `daily_quota_exceeded` (the default)
    /// or `monthly_quota_exceeded`.
    pub quota_refusal: QuotaRefusal,
    /// Senders (`from` domains) refused with 403 `validation_error` (an unverified domain).
    pub rejected_sender_domains: Vec<String>,
    /// Hold the answer of such a refusal for `hang_ms` (the client times out, so it
    /// cannot know the request was refused).
    pub hang_refusals: f64,
}

/// A quota's refusal, by the name Resend gives it. Every answer to a sending request
/// carries the emails used so far in the quota's header, as Resend's does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum QuotaRefusal {
    /// 429 `daily_quota_exceeded`; usage in `x-resend-daily-quota`.
    #[default]
    #[serde(rename = "daily_quota_exceeded")]
    Daily,
    /// 429 `monthly_quota_exceeded`; usage in `x-resend-monthly-quota`.
    #[serde(rename = "monthly_quota_exceeded")]
    Monthly,
}

impl QuotaRefusal {
    /// The 429 answer, with the message Resend writes.
    pub(crate) fn error(self) -> ApiError {
        match self {
            QuotaRefusal::Daily => {
                ApiError::new(429, "daily_quota_exceeded", "You have reached your daily email sending quota.")
            }
            QuotaRefusal::Monthly => {
                ApiError::new(429, "monthly_quota_exceeded", "You have reached your monthly email sending quota.")
            }
        }
    }

    /// The response header that carries the quota's usage.
    pub(crate) fn header(self) -> &'static str {
        match self {
            QuotaRefusal::Daily => "x-resend-daily-quota",
            QuotaRefusal::Monthly => "x-resend-monthly-quota",
        }
    }
}

/// One 429 storm.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storm {
    pub after_requests: u64,
    pub duration_ms: u64,
    /// The `retry-after` each refusal carries; by default the time the storm has left.
    /// (Another service of the team hammering the limit looks like `1`: try again next second.)
    #[serde(default)]
    pub retry_after_seconds: Option<u64>,
}

/// Where the storms and the quota stand.
pub(crate) struct FaultState {
    storm_until: Option<Instant>,
    storm_retry_after: Option<u64>,
    storms_started: usize,
    quota_used: u64,
    quota_since: Instant,
    /// The quota no longer applies (the team upgraded its plan).
    quota_lifted: bool,
}

impl FaultState {
    pub fn new(now: Instant) -> FaultState {
        FaultState {
            storm_until: None,
            storm_retry_after: None,
            storms_started: 0,
            quota_used: 0,
            quota_since: now,
            quota_lifted: false,
        }
    }

    /// The `retry-after` (seconds) of a refusal if a 429 storm is on now (`requests`: seen so far).
    pub(crate) fn in_storm(&mut self, now: Instant, requests: u64, faults: &Faults) -> Option<u64> {
        if let Some(storm) = faults.storms.get(self.storms_started)
            && requests > storm.after_requests
        {
            self.storms_started += 1;
            self.storm_until = Some(now + Duration::from_millis(storm.duration_ms));
            self.storm_retry_after = storm.retry_after_seconds;
        }
        let left = self.storm_until.and_then(|until| until.checked_duration_since(now)).filter(|d| !d.is_zero())?;
        Some(self.storm_retry_after.unwrap_or_else(|| left.as_millis().div_ceil(1000).max(1) as u64))
    }

    /// Takes `emails` from the quota; `false` when they do not fit (nothing is taken).
    pub(crate) fn take_quota(&mut self, emails: u64, now: Instant, faults: &Faults) -> bool {
        let Some(quota) = faults.quota_after_emails.filter(|_| !self.quota_lifted) else { return true };
        if faults.quota_reset_ms.is_some_and(|ms| now.duration_since(self.quota_since) >= Duration::from_millis(ms)) {
            self.renew(now);
        }
        if self.quota_used + emails > quota {
            return false;
        }
        self.quota_used += emails;
        true
    }

    /// Emails taken from the quota in its current window; `None` when there is no quota.
    pub(crate) fn quota_used(&self, now: Instant, faults: &Faults) -> Option<u64> {
        faults.quota_after_emails.filter(|_| !self.quota_lifted)?;
        let renewed =
            faults.quota_reset_ms.is_some_and(|ms| now.duration_since(self.quota_since) >= Duration::from_millis(ms));
        Some(if renewed { 0 } else { self.quota_used })
    }

    /// A new quota window starts now.
    pub fn renew(&mut self, now: Instant) {
        self.quota_used = 0;
        self.quota_since = now;
    }

    /// No quota from now on.
    pub fn lift(&mut self) {
        self.quota_lifted = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_refusal_is_named_in_the_settings() {
        let faults: Faults =
            toml::from_str("quota_after_emails = 3\nquota_refusal = \"monthly_quota_exceeded\"").unwrap();
        assert_eq!(faults.quota_refusal, QuotaRefusal::Monthly);
        assert_eq!(faults.quota_refusal.error().name, "monthly_quota_exceeded");
        assert_eq!(toml::from_str::<Faults>("").unwrap().quota_refusal, QuotaRefusal::Daily);
        assert!(toml::from_str::<Faults>("quota_refusal = \"hourly\"").is_err());
    }

    #[test]
    fn quota_usage_counts_what_fits_and_restarts_with_the_window() {
        let faults = Faults { quota_after_emails: Some(3), quota_reset_ms: Some(1000), ..Default::default() };
        let t0 = Instant::now();
        let mut state = FaultState::new(t0);
        assert!(state.take_quota(2, t0, &faults));
        assert!(!state.take_quota(2, t0, &faults), "two more do not fit");
        assert_eq!(state.quota_used(t0, &faults), Some(2));
        assert_eq!(state.quota_used(t0 + Duration::from_secs(1), &faults), Some(0), "a new window");
        state.lift();
        assert_eq!(state.quota_used(t0, &faults), None);
        assert_eq!(FaultState::new(t0).quota_used(t0, &Faults::default()), None);
    }
}
