//! `[http]`, `[webhook]` and `[unsubscribe]`: the listeners, their tokens, and the
//! public endpoints Resend's webhooks and one-click unsubscribes arrive at.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::Secret;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Where `/metrics` listens (private: metrics and admin); absent means none.
    pub metrics_listen: Option<SocketAddr>,
    /// Where the public endpoints listen (Resend's webhooks, one-click unsubscribe,
    /// the ingest API); absent means none. Put it behind your TLS proxy.
    pub public_listen: Option<SocketAddr>,
    /// Largest request body the public listener reads (413 beyond).
    pub public_max_body_bytes: usize,
    /// Requests per second one client address may make to the public listener (429
    /// beyond, with `retry-after`), so a flood of forged requests cannot starve Redis.
    pub public_requests_per_second_per_source: u32,
    /// How long a public request may take, head to answer.
    pub public_timeout_ms: u64,
    /// A file holding the token(s) for the admin pages on the private listener
    /// (`/admin`); `MAILSTREAM_ADMIN_TOKEN` or the systemd credential `admin_token`
    /// work too. `NAME:TOKEN` names a token in the log of admin actions (else it is
    /// `#1`, `#2`, … by position). Without one the admin pages are not served.
    pub admin_token_file: Option<PathBuf>,
    #[serde(skip)]
    pub admin_tokens: Vec<Secret>,
    /// How long a sign-in to the admin pages lasts (a session kept in Redis; the cookie
    /// holds only its random id). Signing out ends it sooner.
    pub admin_session_hours: u64,
    /// The ingest API (`POST /v1/deliveries` on the public listener) needs a bearer
    /// token of at least 16 characters: `MAILSTREAM_INGEST_TOKEN`, this file, or the
    /// credential `ingest_token`. Without one the API is off (404).
    pub ingest_token_file: Option<PathBuf>,
    #[serde(skip)]
    pub ingest_tokens: Vec<Secret>,
    /// How long `run` keeps trying a listen address that is in use (an instance still
    /// draining holds it) before it gives up (exit 69).
    pub bind_retry_seconds: u64,
}

/// Resend's webhooks: where their signing secret comes from and how events act.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// A file holding the signing secret(s) (`whsec_…`, several separated by
    /// whitespace while rotating; the first is current). `MAILSTREAM_WEBHOOK_SECRET`
    /// or the systemd credential `webhook_secret` work too.
    pub secret_file: Option<PathBuf>,
    /// The secrets, from the environment, the file or the credential (never the config).
    #[serde(skip)]
    pub secrets: Vec<Secret>,
    /// How long an event id is remembered (longer than Svix's retries, about 28 h).
    pub seen_ttl_hours: u64,
    /// Transient (or undetermined) bounces of one address within the window that
    /// suppress it.
    pub transient_bounces_to_suppress: u32,
    pub transient_bounce_window_days: u64,
}

/// RFC 8058 one-click unsubscribe.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UnsubscribeConfig {
    /// The public URL the listener is reached at: emails carry
    /// `List-Unsubscribe: <{base_url}/u/TOKEN>` (HTTPS in production).
    pub base_url: String,
    /// Where `List-Unsubscribe` points when no secret is set (the application's
    /// settings page): then there is no one-click unsubscribe.
    pub settings_url: String,
    /// A file holding the token secret(s) (several separated by whitespace while
    /// rotating; the first signs). `MAILSTREAM_UNSUBSCRIBE_SECRET` or the systemd
    /// credential `unsubscribe_secret` work too. Its presence turns one-click on.
    pub secret_file: Option<PathBuf>,
    #[serde(skip)]
    pub secrets: Vec<Secret>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            metrics_listen: Some(([127, 0, 0, 1], 9464).into()),
            public_listen: None,
            public_max_body_bytes: 1024 * 1024,
            public_requests_per_second_per_source: 5000,
            public_timeout_ms: 10_000,
            admin_token_file: None,
            admin_tokens: Vec::new(),
            admin_session_hours: 8,
            ingest_token_file: None,
            ingest_tokens: Vec::new(),
            bind_retry_seconds: 10,
        }
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            secret_file: None,
            secrets: Vec::new(),
            seen_ttl_hours: 168,
            transient_bounces_to_suppress: 3,
            transient_bounce_window_days: 7,
        }
    }
}

impl Default for UnsubscribeConfig {
    fn default() -> Self {
        UnsubscribeConfig {
            base_url: "http://127.0.0.1:8080".into(),
            settings_url: String::new(),
            secret_file: None,
            secrets: Vec::new(),
        }
    }
}

impl HttpConfig {
    /// How long an admin session lasts (`admin_session_hours`).
    pub(crate) fn admin_session(&self) -> Duration {
        Duration::from_secs(self.admin_session_hours * 3600)
    }

    /// Adds a message for each limit of the public listener that is wrong.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        let mut check = |ok: bool, message: String| {
            if !ok {
                errors.push(message);
            }
        };
        let h = self;
        check(
            h.bind_retry_seconds <= 600,
            format!("http.bind_retry_seconds: must be 0..=600 (got {})", h.bind_retry_seconds),
        );
        check(
            (1024..=64 * 1024 * 1024).contains(&h.public_max_body_bytes),
            format!("http.public_max_body_bytes: must be 1024..=67108864 (got {})", h.public_max_body_bytes),
        );
        check(
            (1..=168).contains(&h.admin_session_hours),
            format!("http.admin_session_hours: must be 1..=168 (got {})", h.admin_session_hours),
        );
        check(
            h.public_requests_per_second_per_source >= 1,
            "http.public_requests_per_second_per_source: must be at least 1".into(),
        );
        check(
            (100..=600_000).contains(&h.public_timeout_ms),
            format!("http.public_timeout_ms: must be 100..=600000 (got {})", h.public_timeout_ms),
        );
    }

    /// Adds a message if an admin token is too short to resist guessing (`NAME:TOKEN`
    /// names the token in the log of admin actions; the token is what follows the colon).
    pub(super) fn validate_admin_tokens(&self, errors: &mut Vec<String>) {
        let token = |t: &Secret| t.expose().split_once(':').map_or(t.expose().len(), |(_, token)| token.len());
        if !self.admin_tokens.iter().all(|t| token(t) >= 16) {
            errors.push("http.admin_token_file: each admin token must be at least 16 characters".into());
        }
    }

    /// Adds a message for each ingest token too short to resist guessing.
    pub(super) fn validate_ingest_tokens(&self, errors: &mut Vec<String>) {
        for (i, t) in self.ingest_tokens.iter().enumerate() {
            if t.expose().len() < 16 {
                errors.push(format!("ingest token #{}: must be at least 16 characters", i + 1));
            }
        }
    }
}

impl WebhookConfig {
    /// How long an event id is remembered (`seen_ttl_hours`).
    pub(crate) fn seen_ttl(&self) -> Duration {
        Duration::from_secs(self.seen_ttl_hours * 3600)
    }

    /// How far back transient bounces count toward suppression (`transient_bounce_window_days`).
    pub(crate) fn transient_bounce_window(&self) -> Duration {
        Duration::from_secs(self.transient_bounce_window_days * 86_400)
    }

    /// Adds a message, naming its key, for each setting of `[webhook]` that is wrong.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        let mut check = |ok: bool, message: String| {
            if !ok {
                errors.push(message);
            }
        };
        let w = self;
        for (i, secret) in w.secrets.iter().enumerate() {
            check(
                crate::model::svix::SigningKey::parse(secret.expose()).is_some(),
                format!("webhook secret #{}: must be whsec_ followed by base64", i + 1),
            );
        }
        check(
            w.seen_ttl_hours >= 30,
            format!(
                "webhook.seen_ttl_hours: must be at least 30, longer than Svix's retries (got {})",
                w.seen_ttl_hours
            ),
        );
        check(
            w.transient_bounces_to_suppress >= 1 && (1..=365).contains(&w.transient_bounce_window_days),
            "webhook.transient_bounces_to_suppress must be at least 1 and transient_bounce_window_days 1..=365".into(),
        );
    }
}

impl UnsubscribeConfig {
    /// Adds a message, naming its key, for each setting of `[unsubscribe]` that is wrong.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        let mut check = |ok: bool, message: String| {
            if !ok {
                errors.push(message);
            }
        };
        let u = self;
        check(
            u.base_url.starts_with("http://") || u.base_url.starts_with("https://"),
            format!("unsubscribe.base_url: must be an http(s) URL (got {:?})", u.base_url),
        );
        check(
            u.settings_url.is_empty()
                || u.settings_url.starts_with("http://")
                || u.settings_url.starts_with("https://"),
            format!("unsubscribe.settings_url: must be an http(s) URL (got {:?})", u.settings_url),
        );
        for (i, secret) in u.secrets.iter().enumerate() {
            check(
                secret.expose().len() >= 16,
                format!("unsubscribe secret #{}: must be at least 16 characters", i + 1),
            );
        }
    }
}
