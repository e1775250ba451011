//! `[resend]`: the provider's endpoint, key and sender, and how fast and in what
//! batches requests go to it.

use std::path::PathBuf;

use serde::Deserialize;

use super::Secret;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResendConfig {
    pub base_url: String,
    /// Overridden by `RESEND_API_KEY`. Prefer the environment or `api_key_file`.
    pub api_key: Option<Secret>,
    /// A file holding the API key (a systemd credential, say).
    pub api_key_file: Option<PathBuf>,
    /// Default sender, `Name <address>` or a bare address.
    pub from: String,
    /// Team-wide request rate. Resend has documented 2, then 5; the mission asks for 10.
    pub requests_per_second: u32,
    /// Emails folded into one `POST /emails/batch` (Resend's maximum is 100).
    pub batch_size: usize,
    /// Per-request timeout; a timed-out request is retried with the same key and body.
    pub timeout_seconds: u64,
    /// Requests in flight at once (pacing is the limiter's job; this bounds latency spikes).
    pub max_in_flight: usize,
    /// How much longer than a second each sliding second of `requests_per_second`
    /// requests is kept, absorbing jitter between leaving and arriving so the provider
    /// never counts more in a second; paid once a second, not once a request.
    pub pacing_guard_ms: u64,
    /// Where the request slots live: `redis` (shared by every instance) or `process`.
    pub limiter: LimiterMode,
    /// The provider is down, team-wide, after this many failures that say nothing about
    /// a batch (no connection, a timeout, a 5xx) with no success between them, ...
    pub down_after_failures: u32,
    /// ... the first and the last within this many seconds, and at least one probe interval
    /// apart (a burst of faults within less is not an outage).
    pub down_window_seconds: u64,
    /// While it is down, one request (a real waiting batch) probes it this often.
    pub probe_interval_seconds: u64,
}

/// Where the team-wide request pacing is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LimiterMode {
    /// In Redis (limiter.lua), shared by every instance: one round trip per request.
    #[default]
    Redis,
    /// In this process: for a single instance that wants no Redis round trip.
    Process,
}

impl Default for ResendConfig {
    fn default() -> Self {
        ResendConfig {
            base_url: "https://api.resend.com".into(),
            api_key: None,
            api_key_file: None,
            from: String::new(),
            requests_per_second: 10,
            batch_size: 100,
            timeout_seconds: 30,
            max_in_flight: 32,
            pacing_guard_ms: 20,
            limiter: LimiterMode::Redis,
            down_after_failures: 3,
            down_window_seconds: 10,
            probe_interval_seconds: 1,
        }
    }
}

impl ResendConfig {
    /// Adds a message, naming its key, for each setting of `[resend]` that is wrong.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        let mut check = |ok: bool, message: String| {
            if !ok {
                errors.push(message);
            }
        };
        let s = self;
        check(
            s.base_url.starts_with("http://") || s.base_url.starts_with("https://"),
            format!("resend.base_url: must be an http(s) URL (got {:?})", s.base_url),
        );
        check(
            s.from.contains('@'),
            format!("resend.from: must be an address such as \"Acme <digest@acme.example>\" (got {:?})", s.from),
        );
        check(
            (1..=1000).contains(&s.requests_per_second),
            format!("resend.requests_per_second: must be 1..=1000 (got {})", s.requests_per_second),
        );
        check(
            (1..=100).contains(&s.batch_size),
            format!("resend.batch_size: must be 1..=100, Resend's batch limit (got {})", s.batch_size),
        );
        check(
            (1..=600).contains(&s.timeout_seconds),
            format!("resend.timeout_seconds: must be 1..=600 (got {})", s.timeout_seconds),
        );
        check(s.max_in_flight >= 1, "resend.max_in_flight: must be at least 1".into());
        check(
            (2..=100).contains(&s.down_after_failures),
            format!("resend.down_after_failures: must be 2..=100 (got {})", s.down_after_failures),
        );
        check(
            (1..=600).contains(&s.down_window_seconds),
            format!("resend.down_window_seconds: must be 1..=600 (got {})", s.down_window_seconds),
        );
        check(
            (1..=60).contains(&s.probe_interval_seconds),
            format!("resend.probe_interval_seconds: must be 1..=60 (got {})", s.probe_interval_seconds),
        );
        check(
            s.pacing_guard_ms <= 1000,
            format!("resend.pacing_guard_ms: must be at most 1000 (got {})", s.pacing_guard_ms),
        );
        if let Some(key) = &s.api_key {
            check(
                !key.expose().is_empty() && !key.expose().chars().any(char::is_whitespace),
                "resend.api_key: must be one word without spaces".into(),
            );
        }
    }
}
