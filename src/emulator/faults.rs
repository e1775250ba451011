//! Faults the emulator can inject, from its settings: 5xx answers, hangs that
//! process a request and answer too late, 409s, 429 storms, a quota that runs
//! out, senders whose domain is not verified. Seeded, so a faulty run replays.

use std::time::{Duration, Instant};

use serde::Deserialize;

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
    /// Accept this many emails, then answer 429 `daily_quota_exceeded` until `quota_reset_ms` passes.
    pub quota_after_emails: Option<u64>,
    pub quota_reset_ms: Option<u64>,
    /// Senders (`from` domains) refused with 403 `validation_error` (an unverified domain).
    pub rejected_sender_domains: Vec<String>,
}

/// One 429 storm.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storm {
    pub after_requests: u64,
    pub duration_ms: u64,
}

/// Where the storms and the quota stand.
pub struct FaultState {
    storm_until: Option<Instant>,
    storms_started: usize,
    quota_used: u64,
    quota_since: Instant,
}

impl FaultState {
    pub fn new(now: Instant) -> FaultState {
        FaultState { storm_until: None, storms_started: 0, quota_used: 0, quota_since: now }
    }

    /// How much longer the current 429 storm lasts, if one is on (`requests`: seen so far).
    pub fn in_storm(&mut self, now: Instant, requests: u64, faults: &Faults) -> Option<Duration> {
        if let Some(storm) = faults.storms.get(self.storms_started)
            && requests > storm.after_requests
        {
            self.storms_started += 1;
            self.storm_until = Some(now + Duration::from_millis(storm.duration_ms));
        }
        self.storm_until.and_then(|until| until.checked_duration_since(now)).filter(|d| !d.is_zero())
    }

    /// Takes `emails` from the quota; `false` when they do not fit (nothing is taken).
    pub fn take_quota(&mut self, emails: u64, now: Instant, faults: &Faults) -> bool {
        let Some(quota) = faults.quota_after_emails else { return true };
        if faults.quota_reset_ms.is_some_and(|ms| now.duration_since(self.quota_since) >= Duration::from_millis(ms)) {
            self.renew(now);
        }
        if self.quota_used + emails > quota {
            return false;
        }
        self.quota_used += emails;
        true
    }

    /// A new quota window starts now.
    pub fn renew(&mut self, now: Instant) {
        self.quota_used = 0;
        self.quota_since = now;
    }
}
