//! Configuration: serde structs with defaults in one place, one validation pass
//! that names the offending key, secrets that never print, and the environment
//! overrides for secrets (`RESEND_API_KEY`, `MAILSTREAM_REDIS_URL`).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono_tz::Tz;
use serde::Deserialize;

use crate::period::PeriodKind;
pub use crate::render::TemplateConfig;

/// The documented example config, shipped inside the binary (the demo runs on it).
pub const EXAMPLE: &str = include_str!("../config.toml");

/// Environment variable that overrides `resend.api_key`.
pub const ENV_API_KEY: &str = "RESEND_API_KEY";
/// Environment variable that overrides `redis.url`.
pub const ENV_REDIS_URL: &str = "MAILSTREAM_REDIS_URL";
/// Environment variable holding the webhook signing secret(s).
pub const ENV_WEBHOOK_SECRET: &str = "MAILSTREAM_WEBHOOK_SECRET";
/// Environment variable holding the unsubscribe token secret(s).
pub const ENV_UNSUBSCRIBE_SECRET: &str = "MAILSTREAM_UNSUBSCRIBE_SECRET";
/// Environment variable holding the admin token(s) of the private listener.
pub const ENV_ADMIN_TOKEN: &str = "MAILSTREAM_ADMIN_TOKEN";
/// The bearer token of the ingest API (`POST /v1/deliveries`).
pub const ENV_INGEST_TOKEN: &str = "MAILSTREAM_INGEST_TOKEN";
/// The secret render-hook requests are signed with.
pub const ENV_RENDER_HOOK_SECRET: &str = "MAILSTREAM_RENDER_HOOK_SECRET";

/// Everything `mailstream` reads from its config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub redis: RedisConfig,
    #[serde(default)]
    pub resend: ResendConfig,
    #[serde(default)]
    pub delivery: DeliveryConfig,
    #[serde(default)]
    pub http: HttpConfig,
    #[serde(default)]
    pub webhook: WebhookConfig,
    #[serde(default)]
    pub unsubscribe: UnsubscribeConfig,
    #[serde(default)]
    pub slo: SloConfig,
    #[serde(default)]
    pub log: LogConfig,
    #[serde(default, rename = "campaign")]
    pub campaigns: Vec<CampaignConfig>,
    #[serde(default)]
    pub templates: BTreeMap<String, TemplateConfig>,
    /// A folder of `NAME.subject`, `NAME.html` and `NAME.text` files, each set a
    /// template called NAME beside the inline ones (relative to the config file).
    #[serde(default)]
    pub templates_dir: Option<PathBuf>,
    #[serde(default)]
    pub render_hook: RenderHookSecret,
}

/// The secret every render hook's requests are signed with (HMAC-SHA256): from
/// `MAILSTREAM_RENDER_HOOK_SECRET`, `secret_file` or the credential `render_hook_secret`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RenderHookSecret {
    pub secret_file: Option<PathBuf>,
    #[serde(skip)]
    pub secret: Option<Secret>,
}

/// A campaign's render hook: an endpoint of the application that, at send time,
/// says per delivery what to send (address, data, variant) or why to skip it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenderHookConfig {
    pub url: String,
    /// Per request; a request that takes longer is retried, then deferred.
    #[serde(default = "default_hook_timeout_ms")]
    pub timeout_ms: u64,
    /// Quick retries within one attempt before the deliveries are deferred.
    #[serde(default = "default_hook_retries")]
    pub retries: u32,
}

fn default_hook_timeout_ms() -> u64 {
    3000
}

fn default_hook_retries() -> u32 {
    1
}

/// A campaign's A/B test: off unless `enabled`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantsConfig {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub arms: Vec<crate::render::VariantConfig>,
}

impl VariantsConfig {
    /// The variants in use (none while not enabled).
    pub fn active(&self) -> &[crate::render::VariantConfig] {
        if self.enabled { &self.arms } else { &[] }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://[:password@]host:port[/db]`; overridden by `MAILSTREAM_REDIS_URL`.
    /// With `cluster`, any node of the cluster (a seed).
    pub url: Secret,
    /// Redis Cluster: commands are routed by their keys' hash slots (every script
    /// touches one slot, so the same scripts run unchanged).
    pub cluster: bool,
    /// More cluster nodes to start from, should `url`'s node be down at start.
    pub cluster_seeds: Vec<Secret>,
    /// First component of every key.
    pub prefix: String,
    /// Number of partitions (streams). Fixed for the life of a deployment. A request
    /// carries one partition's batch, so each partition ends a run on a partial batch of
    /// its own: 1 on a single Redis; on a cluster, enough to spread over the primaries
    /// (the tail costs at most `partitions - 1` extra requests a run).
    pub partitions: u16,
    /// Consumer group shared by every instance of this deployment.
    pub group: String,
    /// Connections in the pool; each partition reader holds one.
    pub pool_size: usize,
    /// How long one Redis command may take before it is an error.
    pub response_timeout_ms: u64,
    /// Replicas that must acknowledge a sealed batch (WAIT) before its request
    /// leaves; 0 relies on the primary's own persistence (appendfsync always).
    pub wait_replicas: u32,
    /// `strict`: refuse to run on a Redis that may lose an acknowledged write
    /// (no `appendfsync always`, too few replicas for `wait_replicas`); `relaxed`:
    /// run anyway, with a warning and the `mailstream_durability_relaxed` gauge.
    pub durability: Durability,
}

/// How sure mailstream must be that Redis keeps what it acknowledged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    #[default]
    Strict,
    Relaxed,
}

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
    /// A file holding the token(s) for the delivery log on the private listener
    /// (`/admin`); `MAILSTREAM_ADMIN_TOKEN` or the systemd credential `admin_token`
    /// work too. Without one the delivery log is not served.
    pub admin_token_file: Option<PathBuf>,
    #[serde(skip)]
    pub admin_tokens: Vec<Secret>,
    /// The ingest API (`POST /v1/deliveries` on the public listener) needs a bearer
    /// token of at least 16 characters: `MAILSTREAM_INGEST_TOKEN`, this file, or the
    /// credential `ingest_token`. Without one the API is off (404).
    pub ingest_token_file: Option<PathBuf>,
    #[serde(skip)]
    pub ingest_tokens: Vec<Secret>,
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

/// How the daemon logs (to stderr; journald keeps it under systemd).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `error`, `warn`, `info`, `debug` or `trace`, or a tracing filter such as
    /// `info,mailstream::dispatch=debug`; `MAILSTREAM_LOG` overrides it.
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into(), format: LogFormat::Auto }
    }
}

/// One JSON object per line, or lines for people.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Text on a terminal, JSON otherwise (under systemd, in a container).
    #[default]
    Auto,
    Json,
    Text,
}

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

/// One campaign: what to send, and how its period is counted.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CampaignConfig {
    pub name: String,
    pub template: String,
    #[serde(default)]
    pub period: PeriodKind,
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
    /// Overrides `resend.from` for this campaign.
    #[serde(default)]
    pub from: Option<String>,
    /// A cron expression (`minute hour day month weekday`, e.g. `0 9 * * MON`) in the
    /// campaign's `time_zone`: `mailstream run` kicks the period of each fire.
    #[serde(default)]
    pub schedule: Option<String>,
    /// A fire missed while no daemon ran is still kicked this long after its time;
    /// later, it is logged and counted as missed.
    #[serde(default = "default_catch_up_hours")]
    pub catch_up_hours: u64,
    /// `HH:MM`: each delivery is released at this hour in its subscriber's
    /// `time_zone` (the campaign's when the subscriber has none), the first such
    /// time at or after the kick, within the period.
    #[serde(default)]
    pub deliver_at_local: Option<String>,
    #[serde(default)]
    pub render_hook: Option<RenderHookConfig>,
    #[serde(default)]
    pub variants: VariantsConfig,
}

fn default_catch_up_hours() -> u64 {
    6
}

fn default_time_zone() -> String {
    "Asia/Tokyo".to_string()
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: Secret::new("redis://127.0.0.1:6379"),
            cluster: false,
            cluster_seeds: Vec::new(),
            prefix: "mailstream".into(),
            partitions: 1,
            group: "mailstream".into(),
            pool_size: 32,
            response_timeout_ms: 10_000,
            wait_replicas: 0,
            durability: Durability::Strict,
        }
    }
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
        }
    }
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
            ingest_token_file: None,
            ingest_tokens: Vec::new(),
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

/// A config problem, naming the key it is about.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // Not `source`: the message already says it, and a source would print it twice.
    #[error("cannot read {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{0}")]
    Parse(String),
    #[error("invalid config:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

impl Config {
    /// Reads, parses, applies environment overrides and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read { path: path.to_owned(), cause })?;
        let mut config = Config::parse(&text).map_err(|e| ConfigError::Parse(format!("{}: {e}", path.display())))?;
        if let Some(dir) = config.templates_dir.clone() {
            let dir = if dir.is_relative() { path.parent().unwrap_or(Path::new(".")).join(dir) } else { dir };
            config.load_templates(&dir)?;
        }
        config.apply_env(|name| std::env::var(name).ok())?;
        config.validate()?;
        Ok(config)
    }

    /// Adds the templates of `dir` (`NAME.subject`, `NAME.html`, `NAME.text`, all three
    /// per name), each compiled here so an error names its file and line.
    pub fn load_templates(&mut self, dir: &Path) -> Result<(), ConfigError> {
        let entries = std::fs::read_dir(dir).map_err(|cause| ConfigError::Read { path: dir.to_owned(), cause })?;
        let mut parts: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let mut errors = Vec::new();
        for entry in entries {
            let path = entry.map_err(|cause| ConfigError::Read { path: dir.to_owned(), cause })?.path();
            let (Some(name), Some(suffix)) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()).filter(|s| ["subject", "html", "text"].contains(s)),
            ) else {
                continue;
            };
            let source =
                std::fs::read_to_string(&path).map_err(|cause| ConfigError::Read { path: path.clone(), cause })?;
            let mut env = minijinja::Environment::new();
            if let Err(e) = env.add_template_owned(format!("{name}.{suffix}"), source.clone()) {
                let line = e.line().map(|l| format!(":{l}")).unwrap_or_default();
                errors.push(format!("{}{line}: {}", path.display(), e.detail().unwrap_or(&e.to_string())));
            }
            parts.entry(name.to_string()).or_default().insert(suffix.to_string(), source);
        }
        for (name, mut p) in parts {
            let missing: Vec<&str> = ["subject", "html", "text"].into_iter().filter(|s| !p.contains_key(*s)).collect();
            if !missing.is_empty() {
                errors.push(format!("{}: template {name:?} has no {}", dir.display(), missing.join(", ")));
                continue;
            }
            if self.templates.contains_key(&name) {
                errors.push(format!("{}: template {name:?} is also defined in [templates]", dir.display()));
                continue;
            }
            let mut take = |s: &str| p.remove(s).unwrap_or_default();
            let t = TemplateConfig { subject: take("subject"), html: take("html"), text: take("text") };
            self.templates.insert(name, t);
        }
        if errors.is_empty() { Ok(()) } else { Err(ConfigError::Invalid(errors)) }
    }

    /// Parses TOML without validating or reading the environment.
    pub fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }

    /// The embedded example config, validated (what `demo` starts from).
    pub fn example() -> Config {
        let config = Config::parse(EXAMPLE).expect("the shipped config.toml parses");
        config.validate().expect("the shipped config.toml is valid");
        config
    }

    /// Takes secrets from the environment (or `api_key_file`), which win over the file.
    /// Each secret comes from, in order: its environment variable, the file the config
    /// names, or the systemd credential of that name (`$CREDENTIALS_DIRECTORY/<name>`).
    pub fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(url) = env(ENV_REDIS_URL).filter(|v| !v.is_empty()) {
            self.redis.url = Secret::new(url);
        }
        let credentials = env("CREDENTIALS_DIRECTORY").map(PathBuf::from);
        let read = |var: &str, file: &Option<PathBuf>, credential: &str| -> Result<Option<String>, ConfigError> {
            if let Some(value) = env(var).filter(|v| !v.trim().is_empty()) {
                return Ok(Some(value));
            }
            let path = match (file, &credentials) {
                (Some(file), _) => file.clone(),
                (None, Some(dir)) if dir.join(credential).exists() => dir.join(credential),
                _ => return Ok(None),
            };
            let text = std::fs::read_to_string(&path).map_err(|cause| ConfigError::Read { path, cause })?;
            Ok(Some(text))
        };
        if let Some(key) = read(ENV_API_KEY, &self.resend.api_key_file, "resend_api_key")? {
            self.resend.api_key = Some(Secret::new(key.trim()));
        }
        let list = |text: Option<String>| -> Vec<Secret> {
            text.map(|t| t.split_whitespace().map(Secret::new).collect()).unwrap_or_default()
        };
        self.webhook.secrets = list(read(ENV_WEBHOOK_SECRET, &self.webhook.secret_file, "webhook_secret")?);
        self.unsubscribe.secrets =
            list(read(ENV_UNSUBSCRIBE_SECRET, &self.unsubscribe.secret_file, "unsubscribe_secret")?);
        self.http.admin_tokens = list(read(ENV_ADMIN_TOKEN, &self.http.admin_token_file, "admin_token")?);
        self.http.ingest_tokens = list(read(ENV_INGEST_TOKEN, &self.http.ingest_token_file, "ingest_token")?);
        self.render_hook.secret = read(ENV_RENDER_HOOK_SECRET, &self.render_hook.secret_file, "render_hook_secret")?
            .map(|s| Secret::new(s.trim()));
        Ok(())
    }

    /// One pass over every setting; every problem found is reported, each naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        let mut check = |ok: bool, message: String| {
            if !ok {
                errors.push(message);
            }
        };
        let r = &self.redis;
        check(
            r.url.expose().starts_with("redis://") || r.url.expose().starts_with("rediss://"),
            format!("redis.url: must start with redis:// or rediss:// (got {})", r.url.redacted_url()),
        );
        check(is_name(&r.prefix), format!("redis.prefix: use letters, digits, '_', '-' or '.' (got {:?})", r.prefix));
        for seed in &r.cluster_seeds {
            check(
                seed.expose().starts_with("redis://") || seed.expose().starts_with("rediss://"),
                format!(
                    "redis.cluster_seeds: each must start with redis:// or rediss:// (got {})",
                    seed.redacted_url()
                ),
            );
        }
        check(r.cluster || r.cluster_seeds.is_empty(), "redis.cluster_seeds: given but redis.cluster is false".into());
        check((1..=1024).contains(&r.partitions), format!("redis.partitions: must be 1..=1024 (got {})", r.partitions));
        check(!r.group.is_empty(), "redis.group: must not be empty".into());
        check(
            r.pool_size as u32 > 2 * u32::from(r.partitions) + 4,
            format!(
                "redis.pool_size: must exceed 2 x redis.partitions + 4, as each partition keeps a connection per \
                 lane (digest, transactional) for its blocking reads, and claims take others (got {} for {} partitions)",
                r.pool_size, r.partitions
            ),
        );
        check(
            r.response_timeout_ms > self.delivery.block_ms,
            format!(
                "redis.response_timeout_ms: must exceed delivery.block_ms ({}), or blocking reads time out (got {})",
                self.delivery.block_ms, r.response_timeout_ms
            ),
        );

        let s = &self.resend;
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
            s.pacing_guard_ms <= 1000,
            format!("resend.pacing_guard_ms: must be at most 1000 (got {})", s.pacing_guard_ms),
        );
        if let Some(key) = &s.api_key {
            check(
                !key.expose().is_empty() && !key.expose().chars().any(char::is_whitespace),
                "resend.api_key: must be one word without spaces".into(),
            );
        }

        let d = &self.delivery;
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

        check(
            tracing_subscriber::EnvFilter::try_new(&self.log.level).is_ok(),
            format!("log.level: not a level or filter (got {:?})", self.log.level),
        );
        check(
            self.http.admin_tokens.iter().all(|t| t.expose().len() >= 16),
            "http.admin_token_file: each admin token must be at least 16 characters".into(),
        );
        let slo = &self.slo;
        check(
            (0.0..1.0).contains(&slo.failure_rate),
            format!("slo.failure_rate: must be at least 0 and below 1 (got {})", slo.failure_rate),
        );
        check(
            (1..=7 * 86_400).contains(&slo.stuck_after_seconds),
            format!("slo.stuck_after_seconds: must be 1..=604800 (got {})", slo.stuck_after_seconds),
        );

        let h = &self.http;
        check(
            (1024..=64 * 1024 * 1024).contains(&h.public_max_body_bytes),
            format!("http.public_max_body_bytes: must be 1024..=67108864 (got {})", h.public_max_body_bytes),
        );
        check(
            h.public_requests_per_second_per_source >= 1,
            "http.public_requests_per_second_per_source: must be at least 1".into(),
        );
        check(
            (100..=600_000).contains(&h.public_timeout_ms),
            format!("http.public_timeout_ms: must be 100..=600000 (got {})", h.public_timeout_ms),
        );
        let w = &self.webhook;
        for (i, secret) in w.secrets.iter().enumerate() {
            check(
                crate::svix::SigningKey::parse(secret.expose()).is_some(),
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
        let u = &self.unsubscribe;
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

        let mut names = std::collections::BTreeSet::new();
        for (i, c) in self.campaigns.iter().enumerate() {
            let at = format!("campaign[{i}]");
            check(
                is_tag_value(&c.name),
                format!("{at}.name: use ASCII letters, digits, '_' or '-' (got {:?})", c.name),
            );
            check(names.insert(c.name.as_str()), format!("{at}.name: {:?} is defined twice", c.name));
            check(
                c.name != crate::work::TRANSACTIONAL,
                format!("{at}.name: {:?} is reserved for transactional sends", c.name),
            );
            if let Some(hook) = &c.render_hook {
                check(
                    hook.url.starts_with("http://") || hook.url.starts_with("https://"),
                    format!("{at}.render_hook.url: must be an http(s) URL (got {:?})", hook.url),
                );
                check(
                    (100..=60_000).contains(&hook.timeout_ms),
                    format!("{at}.render_hook.timeout_ms: must be 100..=60000 (got {})", hook.timeout_ms),
                );
                check(hook.retries <= 10, format!("{at}.render_hook.retries: must be 0..=10 (got {})", hook.retries));
                // The deliveries stay claimed while the hook is asked: the asking must end
                // well within their lease, or another instance would take them over.
                check(
                    (hook.timeout_ms + 1000) * (u64::from(hook.retries) + 1) <= d.lease_seconds * 1000,
                    format!(
                        "{at}.render_hook: (timeout_ms + 1000) x (retries + 1) must fit in delivery.lease_seconds ({} s)",
                        d.lease_seconds
                    ),
                );
            }
            let mut arms = std::collections::BTreeSet::new();
            for (j, v) in c.variants.arms.iter().enumerate() {
                check(
                    is_tag_value(&v.name) && v.name.len() <= 64,
                    format!("{at}.variants.arms[{j}].name: use ASCII letters, digits, '_' or '-' (got {:?})", v.name),
                );
                check(
                    arms.insert(v.name.as_str()),
                    format!("{at}.variants.arms[{j}].name: {:?} is defined twice", v.name),
                );
                check(v.weight > 0, format!("{at}.variants.arms[{j}].weight: must be at least 1"));
            }
            check(!c.variants.enabled || !c.variants.arms.is_empty(), format!("{at}.variants: enabled without arms"));
            check(
                self.templates.contains_key(&c.template),
                format!("{at}.template: no [templates.{}] is defined", c.template),
            );
            check(
                c.time_zone.parse::<Tz>().is_ok(),
                format!("{at}.time_zone: unknown time zone {:?} (use an IANA name such as Asia/Tokyo)", c.time_zone),
            );
            if let Some(from) = &c.from {
                check(from.contains('@'), format!("{at}.from: must be an address (got {from:?})"));
            }
            if let Some(expr) = &c.schedule {
                let parsed = parse_cron(expr);
                check(
                    parsed.is_ok(),
                    format!(
                        "{at}.schedule: {} (got {expr:?}; e.g. \"0 9 * * MON\")",
                        parsed.err().map(|e| e.to_string()).unwrap_or_default()
                    ),
                );
            }
            check(
                (1..=24 * 7).contains(&c.catch_up_hours),
                format!("{at}.catch_up_hours: must be 1..=168 (got {})", c.catch_up_hours),
            );
            if let Some(at_local) = &c.deliver_at_local {
                check(
                    parse_local_time(at_local).is_some(),
                    format!("{at}.deliver_at_local: must be HH:MM, 00:00 to 23:59 (got {at_local:?})"),
                );
            }
            check(
                d.retention_days * 86_400 > c.period.max_length_seconds(),
                format!(
                    "delivery.retention_days: must outlive a {} period of campaign {:?}, or its dedup keys expire inside the period",
                    c.period.name(),
                    c.name
                ),
            );
        }
        for (name, t) in &self.templates {
            if let Err(e) = crate::render::Renderer::check(name, t) {
                errors.push(format!("templates.{name}: {e}"));
            }
        }
        // The templates were compiled one by one above; the variants' parts alone here.
        let arms = self.campaigns.iter().map(|c| (c.name.as_str(), c.variants.arms.as_slice()));
        if let Err(e) = crate::render::Renderer::with_variants(&BTreeMap::new(), arms) {
            errors.push(format!("variants: {e}"));
        }
        if self.campaigns.iter().any(|c| c.render_hook.is_some()) {
            let ok = self.render_hook.secret.as_ref().is_some_and(|s| s.expose().len() >= 16);
            errors.extend((!ok).then(|| {
                format!("render_hook: a campaign has a render hook, so a secret of at least 16 characters is needed ({ENV_RENDER_HOOK_SECRET}, render_hook.secret_file or the credential render_hook_secret)")
            }));
        }
        for (i, t) in self.http.ingest_tokens.iter().enumerate() {
            if t.expose().len() < 16 {
                errors.push(format!("ingest token #{}: must be at least 16 characters", i + 1));
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(ConfigError::Invalid(errors)) }
    }

    /// The templates and every campaign's variants, compiled.
    pub fn renderer(&self) -> Result<crate::render::Renderer, minijinja::Error> {
        let campaigns = self.campaigns.iter().map(|c| (c.name.as_str(), c.variants.arms.as_slice()));
        crate::render::Renderer::with_variants(&self.templates, campaigns)
    }

    /// The campaign called `name`.
    pub fn campaign(&self, name: &str) -> Option<&CampaignConfig> {
        self.campaigns.iter().find(|c| c.name == name)
    }

    pub fn lease(&self) -> Duration {
        Duration::from_secs(self.delivery.lease_seconds)
    }

    /// How long an unread delivery waits before it counts as stuck.
    pub fn stuck_after(&self) -> Duration {
        Duration::from_secs(self.slo.stuck_after_seconds)
    }

    /// How often a live holder renews its leases (and rereads the shared pause).
    pub fn heartbeat(&self) -> Duration {
        (self.lease() / 3).min(Duration::from_secs(1))
    }

    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.delivery.retention_days * 86_400)
    }
}

impl CampaignConfig {
    /// The campaign's time zone (validated when the config was loaded).
    pub fn tz(&self) -> Tz {
        self.time_zone.parse().unwrap_or(chrono_tz::Asia::Tokyo)
    }
}

/// Parses a cron expression (5 fields, or 6 with seconds first).
pub fn parse_cron(expr: &str) -> anyhow::Result<croner::Cron> {
    <croner::Cron as std::str::FromStr>::from_str(expr).map_err(|e| anyhow::anyhow!("{e}"))
}

/// `HH:MM`, a wall-clock time.
pub fn parse_local_time(s: &str) -> Option<chrono::NaiveTime> {
    chrono::NaiveTime::parse_from_str(s.trim(), "%H:%M").ok()
}

/// Names used inside Redis keys and as Resend tag values: ASCII letters, digits, `_`, `-`.
pub fn is_tag_value(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Subscriber and target ids, and the key prefix: tag characters plus `.`.
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// A value that must not reach a log line: `Debug` and `Display` print `***`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// For URLs: the URL with any password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        let s = &self.0;
        match (s.find("://"), s.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => format!("{}***{}", &s[..scheme + 3], &s[at..]),
            _ => s.clone(),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_example_parses_and_validates() {
        // EXAMPLE is include_str!("../config.toml"): the file is found at compile time or
        // the crate does not build; this asserts it also holds a campaign.
        let config = Config::example();
        assert!(EXAMPLE.contains("[[campaign]]"));
        assert!(config.campaign("weekly_digest").is_some());
        assert_eq!(config.resend.requests_per_second, 10);
        assert_eq!(config.resend.batch_size, 100);
    }

    #[test]
    fn the_shipped_template_renders() {
        let config = Config::example();
        let renderer = crate::render::Renderer::new(&config.templates).unwrap();
        let d = crate::work::DeliveryRef::new("weekly_digest", "2026-W48", "u42", "team-1");
        let data = serde_json::json!({ "name": "Ann" });
        let input = crate::render::RenderInput {
            delivery: &d,
            variant: None,
            target: "team-1",
            subscriber_id: "u42",
            data: &data,
            headers: &[],
        };
        let json = renderer.render("weekly_digest", "a@acme.example", "u42@resend.dev", &input).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["subject"], "Your weekly digest for team-1, 2026-W48");
        assert!(v["html"].as_str().unwrap().contains("Hello Ann,"), "{v}");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::parse("[resend]\nrequests_per_secnd = 5\n").unwrap_err();
        assert!(err.contains("requests_per_secnd"), "{err}");
    }

    #[test]
    fn nonsense_values_are_named() {
        let mut config = Config::example();
        config.resend.batch_size = 250;
        config.resend.requests_per_second = 0;
        config.campaigns[0].time_zone = "Mars/Olympus".into();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("resend.batch_size"), "{err}");
        assert!(err.contains("resend.requests_per_second"), "{err}");
        assert!(err.contains("campaign[0].time_zone"), "{err}");
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("mailstream-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn templates_load_from_a_folder_and_a_broken_one_names_its_file_and_line() {
        let dir = temp_dir("templates");
        std::fs::write(dir.join("receipt.subject"), "Receipt {{ subscriber.data.order }}").unwrap();
        std::fs::write(dir.join("receipt.html"), "<p>Thanks</p>").unwrap();
        std::fs::write(dir.join("receipt.text"), "Thanks").unwrap();
        std::fs::write(dir.join("README.md"), "not a template").unwrap();
        let mut config = Config::example();
        config.load_templates(&dir).unwrap();
        assert!(config.templates.contains_key("receipt") && config.templates.contains_key("weekly_digest"));
        config.validate().unwrap();

        std::fs::write(dir.join("broken.subject"), "s").unwrap();
        std::fs::write(dir.join("broken.html"), "<p>\n{% if %}\n").unwrap();
        std::fs::write(dir.join("broken.text"), "t").unwrap();
        std::fs::write(dir.join("half.subject"), "s").unwrap();
        let err = Config::example().load_templates(&dir).unwrap_err().to_string();
        assert!(err.contains("broken.html:2"), "{err}");
        assert!(err.contains("template \"half\" has no html, text"), "{err}");
        let mut clash = Config::example();
        std::fs::remove_file(dir.join("broken.html")).unwrap();
        std::fs::remove_file(dir.join("half.subject")).unwrap();
        for part in ["subject", "html", "text"] {
            std::fs::write(dir.join(format!("weekly_digest.{part}")), "x").unwrap();
        }
        std::fs::write(dir.join("broken.html"), "ok").unwrap();
        let err = clash.load_templates(&dir).unwrap_err().to_string();
        assert!(err.contains("\"weekly_digest\" is also defined in [templates]"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_shipped_template_files_compile() {
        let mut config = Config::example();
        config.templates.clear();
        config.load_templates(&Path::new(env!("CARGO_MANIFEST_DIR")).join("templates")).unwrap();
        assert!(config.templates.contains_key("weekly_digest"));
        config.renderer().unwrap();
    }

    #[test]
    fn render_hooks_need_a_secret_and_variants_need_arms() {
        let mut config = Config::example();
        config.campaigns[0].render_hook =
            Some(RenderHookConfig { url: "http://127.0.0.1:1/render".into(), timeout_ms: 1000, retries: 1 });
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("MAILSTREAM_RENDER_HOOK_SECRET"), "{err}");
        config.render_hook.secret = Some(Secret::new("0123456789abcdef"));
        config.validate().unwrap();
        config.campaigns[0].variants.enabled = true;
        config.validate().unwrap();
        config.campaigns[0].variants.arms.clear();
        assert!(config.validate().unwrap_err().to_string().contains("enabled without arms"));
        config.campaigns[0].name = "transactional".into();
        assert!(config.validate().unwrap_err().to_string().contains("reserved"));
    }

    #[test]
    fn missing_template_is_named() {
        let mut config = Config::example();
        config.campaigns[0].template = "nope".into();
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("[templates.nope]"), "{err}");
    }

    #[test]
    fn environment_overrides_secrets() {
        let mut config = Config::example();
        config
            .apply_env(|name| match name {
                ENV_API_KEY => Some("re_from_env".into()),
                ENV_REDIS_URL => Some("redis://:hunter2@10.0.0.1:6380".into()),
                _ => None,
            })
            .unwrap();
        assert_eq!(config.resend.api_key.as_ref().unwrap().expose(), "re_from_env");
        let debug = format!("{config:?}");
        assert!(!debug.contains("re_from_env") && !debug.contains("hunter2"), "{debug}");
        assert_eq!(config.redis.url.redacted_url(), "redis://***@10.0.0.1:6380");
    }

    #[test]
    fn the_ingest_token_and_the_hook_secret_come_from_credentials() {
        let dir = temp_dir("credentials");
        std::fs::write(dir.join("ingest_token"), "tok-0123456789abcdef\n").unwrap();
        std::fs::write(dir.join("render_hook_secret"), "hook-0123456789abcdef\n").unwrap();
        let mut config = Config::example();
        let credentials = dir.to_string_lossy().to_string();
        config.apply_env(|name| (name == "CREDENTIALS_DIRECTORY").then(|| credentials.clone())).unwrap();
        assert_eq!(config.http.ingest_tokens[0].expose(), "tok-0123456789abcdef");
        assert_eq!(config.render_hook.secret.as_ref().unwrap().expose(), "hook-0123456789abcdef");
        let debug = format!("{config:?}");
        assert!(!debug.contains("tok-0123") && !debug.contains("hook-0123"), "{debug}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
