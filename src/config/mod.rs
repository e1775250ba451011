//! Configuration: serde structs with defaults in one place, one validation pass
//! that names the offending key, secrets that never print, and the environment
//! overrides for secrets (`RESEND_API_KEY`, `MAILSTREAM_REDIS_URL`). Each section
//! lives in its own file with the checks of its own settings.

mod attachments;
mod campaign;
mod channels;
mod delivery;
mod features;
mod http;
mod log;
mod operators;
mod problems;
mod redis;
mod resend;
mod slo;
mod subscribers;
pub mod templates;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use self::attachments::{AttachmentsConfig, RESEND_MAX_BYTES};
pub use self::campaign::{CampaignConfig, RenderHookConfig, RenderHookSecret, VariantsConfig};
pub use self::channels::{AppChannelConfig, ChannelsConfig, PushChannelConfig, Urgency};
pub use self::delivery::DeliveryConfig;
pub use self::features::{Feature, Features, NO_API_KEY, SecretSource};
pub use self::http::{HttpConfig, UnsubscribeConfig, WebhookConfig};
pub use self::log::{LogConfig, LogFormat};
pub use self::operators::OperatorsConfig;
pub use self::problems::Problem;
pub use self::redis::{Durability, RedisConfig};
pub use self::resend::{LimiterMode, ResendConfig};
pub use self::slo::{SloConfig, SloReportConfig};
pub use self::subscribers::SubscribersConfig;
pub use self::templates::{TemplateConfig, VariantConfig};

/// The documented example config, shipped inside the binary (the demo runs on it).
pub const EXAMPLE: &str = include_str!("../../config.toml");

/// Environment variable that overrides `resend.api_key`.
const ENV_API_KEY: &str = "RESEND_API_KEY";
/// Environment variable that overrides `redis.url`.
const ENV_REDIS_URL: &str = "MAILSTREAM_REDIS_URL";
/// Environment variable holding the webhook signing secret(s).
const ENV_WEBHOOK_SECRET: &str = "MAILSTREAM_WEBHOOK_SECRET";
/// Environment variable holding the unsubscribe token secret(s).
const ENV_UNSUBSCRIBE_SECRET: &str = "MAILSTREAM_UNSUBSCRIBE_SECRET";
/// Environment variable holding the admin token(s) of the private listener.
const ENV_ADMIN_TOKEN: &str = "MAILSTREAM_ADMIN_TOKEN";
/// The bearer token of the ingest API (`POST /v1/deliveries`).
const ENV_INGEST_TOKEN: &str = "MAILSTREAM_INGEST_TOKEN";
/// The secret render-hook requests are signed with.
const ENV_RENDER_HOOK_SECRET: &str = "MAILSTREAM_RENDER_HOOK_SECRET";

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
    pub attachments: AttachmentsConfig,
    #[serde(default)]
    pub http: HttpConfig,
    #[serde(default)]
    pub webhook: WebhookConfig,
    #[serde(default)]
    pub unsubscribe: UnsubscribeConfig,
    #[serde(default)]
    pub slo: SloConfig,
    #[serde(default)]
    pub operators: OperatorsConfig,
    #[serde(default)]
    pub subscribers: SubscribersConfig,
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
    #[serde(default)]
    pub channels: ChannelsConfig,
    /// Where each secret that is set came from, by its credential name.
    #[serde(skip)]
    pub sources: BTreeMap<&'static str, SecretSource>,
}

/// A config problem, naming the key it is about.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // Not `source`: the message already says it, and a source would print it twice.
    #[error("{key}: cannot read {path}: {cause}")]
    Read { key: String, path: PathBuf, cause: std::io::Error },
    #[error("{0}")]
    Parse(String),
    /// A TOML syntax or type error, at its line, on the key it names.
    #[error("{}:{}: {}{message}", path.display(), line.map_or("?".into(), |l| l.to_string()), key.as_ref().map(|k| format!("{k}: ")).unwrap_or_default())]
    Syntax { path: PathBuf, line: Option<usize>, key: Option<String>, message: String },
    #[error("invalid config:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

impl Config {
    /// The push services a Web Push subscription's endpoint may name: `[channels.push]`'s
    /// `allowed_hosts`, or the public push services when it is not set (or there is no
    /// `[channels.push]`: a subscription registered before the channel is turned on).
    pub fn push_allowed_hosts(&self) -> crate::model::push_endpoint::AllowedHosts {
        self.channels.push.as_ref().map(|p| p.allowed()).unwrap_or_default()
    }

    /// Reads, parses, applies environment overrides and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            key: "the config file".into(),
            path: path.to_owned(),
            cause,
        })?;
        let mut config: Config = toml::from_str(&text).map_err(|e| problems::syntax(path, &text, &e))?;
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
    fn load_templates(&mut self, dir: &Path) -> Result<(), ConfigError> {
        let unreadable =
            |path: &Path, cause| ConfigError::Read { key: "templates_dir".into(), path: path.to_owned(), cause };
        let entries = std::fs::read_dir(dir).map_err(|cause| unreadable(dir, cause))?;
        let mut parts: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let mut errors = Vec::new();
        for entry in entries {
            let path = entry.map_err(|cause| unreadable(dir, cause))?.path();
            let (Some(name), Some(suffix)) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()).filter(|s| ["subject", "html", "text"].contains(s)),
            ) else {
                continue;
            };
            let source = std::fs::read_to_string(&path).map_err(|cause| unreadable(&path, cause))?;
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
            let t = TemplateConfig::new(take("subject"), take("html"), take("text"));
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
    fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(url) = env(ENV_REDIS_URL).filter(|v| !v.is_empty()) {
            self.redis.url = Secret::new(url);
        }
        let credentials = env("CREDENTIALS_DIRECTORY").map(PathBuf::from);
        let mut sources = BTreeMap::new();
        let mut read = |var: &str,
                        (key, file): (&str, &Option<PathBuf>),
                        credential: &'static str|
         -> Result<Option<String>, ConfigError> {
            if let Some(value) = env(var).filter(|v| !v.trim().is_empty()) {
                sources.insert(credential, SecretSource::Env);
                return Ok(Some(value));
            }
            let (path, source, key) = match (file, &credentials) {
                (Some(file), _) => (file.clone(), SecretSource::File, key.to_string()),
                (None, Some(dir)) if dir.join(credential).exists() => {
                    (dir.join(credential), SecretSource::Credential, format!("the credential {credential}"))
                }
                _ => return Ok(None),
            };
            let text = std::fs::read_to_string(&path).map_err(|cause| ConfigError::Read { key, path, cause })?;
            // An empty file turns its feature off (systemd needs every listed credential to exist).
            if text.trim().is_empty() {
                return Ok(None);
            }
            sources.insert(credential, source);
            Ok(Some(text))
        };
        if let Some(key) = read(ENV_API_KEY, ("resend.api_key_file", &self.resend.api_key_file), "resend_api_key")? {
            self.resend.api_key = Some(Secret::new(key.trim()));
        }
        let list = |text: Option<String>| -> Vec<Secret> {
            text.map(|t| t.split_whitespace().map(Secret::new).collect()).unwrap_or_default()
        };
        let webhook = ("webhook.secret_file", &self.webhook.secret_file);
        self.webhook.secrets = list(read(ENV_WEBHOOK_SECRET, webhook, "webhook_secret")?);
        let unsubscribe = ("unsubscribe.secret_file", &self.unsubscribe.secret_file);
        self.unsubscribe.secrets = list(read(ENV_UNSUBSCRIBE_SECRET, unsubscribe, "unsubscribe_secret")?);
        let admin = ("http.admin_token_file", &self.http.admin_token_file);
        self.http.admin_tokens = list(read(ENV_ADMIN_TOKEN, admin, "admin_token")?);
        let ingest = ("http.ingest_token_file", &self.http.ingest_token_file);
        self.http.ingest_tokens = list(read(ENV_INGEST_TOKEN, ingest, "ingest_token")?);
        let hook = ("render_hook.secret_file", &self.render_hook.secret_file);
        self.render_hook.secret =
            read(ENV_RENDER_HOOK_SECRET, hook, "render_hook_secret")?.map(|s| Secret::new(s.trim()));
        if let Some(app) = &mut self.channels.app {
            let file = ("channels.app.secret_file", &app.secret_file);
            app.secret =
                read(channels::ENV_APP_WEBHOOK_SECRET, file, "app_webhook_secret")?.map(|s| Secret::new(s.trim()));
        }
        if let Some(push) = &mut self.channels.push {
            let file = ("channels.push.vapid_private_key_file", &push.vapid_private_key_file);
            push.vapid_private_key =
                read(channels::ENV_VAPID_PRIVATE_KEY, file, "vapid_private_key")?.map(|s| Secret::new(s.trim()));
        }
        self.sources = sources;
        Ok(())
    }

    /// One pass over every setting; every problem found is reported, each naming its key.
    /// Each section checks its own settings, in the order the messages have always
    /// come in; the checks that need two sections are here.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        self.redis.validate(&mut errors);
        if self.redis.response_timeout_ms <= self.delivery.block_ms {
            errors.push(format!(
                "redis.response_timeout_ms: must exceed delivery.block_ms ({}), or blocking reads time out (got {})",
                self.delivery.block_ms, self.redis.response_timeout_ms
            ));
        }
        self.resend.validate(&mut errors);
        self.delivery.validate(&mut errors);
        self.attachments.validate(&mut errors);
        self.subscribers.validate(&mut errors);
        self.log.validate(&mut errors);
        self.http.validate_admin_tokens(&mut errors);
        slo::validate(self, &mut errors);
        self.http.validate(&mut errors);
        self.webhook.validate(&mut errors);
        self.unsubscribe.validate(&mut errors);
        campaign::validate(&self.campaigns, &self.delivery, &self.templates, &mut errors);
        operators::validate(self, &mut errors);
        for (name, t) in &self.templates {
            if let Err(e) = templates::check(name, t) {
                errors.push(format!("templates.{name}: {e}"));
            }
        }
        // The templates were compiled one by one above; the variants' parts alone here.
        let arms = self.campaigns.iter().map(|c| (c.name.as_str(), c.variants.arms.as_slice()));
        if let Err(e) = templates::compile(&BTreeMap::new(), arms) {
            errors.push(format!("variants: {e}"));
        }
        campaign::validate_hook_secret(self, ENV_RENDER_HOOK_SECRET, &mut errors);
        channels::validate(self, &mut errors);
        self.http.validate_ingest_tokens(&mut errors);
        if errors.is_empty() { Ok(()) } else { Err(ConfigError::Invalid(errors)) }
    }

    /// The templates and every campaign's variants, compiled.
    pub(crate) fn compiled(&self) -> Result<minijinja::Environment<'static>, minijinja::Error> {
        let campaigns = self.campaigns.iter().map(|c| (c.name.as_str(), c.variants.arms.as_slice()));
        templates::compile(&self.templates, campaigns)
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

/// Parses a cron expression (5 fields, or 6 with seconds first); an error says, in
/// our words, which field is wrong and what it takes.
pub(crate) fn parse_cron(expr: &str) -> anyhow::Result<croner::Cron> {
    let parse = |e: &str| <croner::Cron as std::str::FromStr>::from_str(e);
    let whole = match parse(expr) {
        Ok(cron) => return Ok(cron),
        Err(e) => e,
    };
    let fields: Vec<&str> = expr.split_whitespace().collect();
    const FIVE: [(&str, &str); 5] = [
        ("minute", "0-59"),
        ("hour", "0-23"),
        ("day of month", "1-31"),
        ("month", "1-12 or JAN-DEC"),
        ("weekday", "0-7 or SUN-SAT"),
    ];
    let named: Vec<(&str, &str)> = match fields.len() {
        5 => FIVE.to_vec(),
        6 => std::iter::once(("second", "0-59")).chain(FIVE).collect(),
        n => anyhow::bail!(
            "a schedule has 5 fields (minute hour day-of-month month weekday), or 6 with seconds first; this has {n}"
        ),
    };
    // The first field that is wrong on its own, the others kept at `*`.
    for (i, (name, range)) in named.iter().enumerate() {
        let mut alone = vec!["*"; fields.len()];
        alone[i] = fields[i];
        if parse(&alone.join(" ")).is_err() {
            anyhow::bail!(
                "the {name} field {:?} is not valid: it takes {range}, a range (a-b), a list (a,b), a step (*/n) or *",
                fields[i]
            );
        }
    }
    tracing::debug!(%whole, "cron expression refused");
    anyhow::bail!("the fields are valid one by one but not together (a day that never comes?)")
}

/// serde's default for a flag that is on unless a record or config says otherwise.
pub(crate) fn yes() -> bool {
    true
}

/// `HH:MM`, a wall-clock time.
pub(crate) fn parse_local_time(s: &str) -> Option<chrono::NaiveTime> {
    chrono::NaiveTime::parse_from_str(s.trim(), "%H:%M").ok()
}

/// Names used inside Redis keys and as Resend tag values: ASCII letters, digits, `_`, `-`.
pub(crate) fn is_tag_value(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Subscriber and target ids, and the key prefix: tag characters plus `.`.
pub(crate) fn is_name(s: &str) -> bool {
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
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// For URLs: the URL with any password replaced by `***`.
    pub(crate) fn redacted_url(&self) -> String {
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
        // EXAMPLE is include_str!("../../config.toml"): the file is found at compile time or
        // the crate does not build; this asserts it also holds a campaign.
        let config = Config::example();
        assert!(EXAMPLE.contains("[[campaign]]"));
        assert!(config.campaign("weekly_digest").is_some());
        assert_eq!(config.resend.requests_per_second, 10);
        assert_eq!(config.resend.batch_size, 100);
    }

    #[test]
    fn hours_and_days_become_durations() {
        let config = Config::example();
        assert_eq!(config.delivery.resend_window(), Duration::from_secs(23 * 3600));
        assert_eq!(config.delivery.deadline(), Duration::from_secs(48 * 3600));
        assert_eq!(config.delivery.maybe_sent_deadline(), Duration::from_secs(6 * 3600));
        assert_eq!(config.webhook.seen_ttl(), Duration::from_secs(168 * 3600));
        assert_eq!(config.webhook.transient_bounce_window(), Duration::from_secs(7 * 86_400));
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
        std::fs::write(dir.join("invoice.subject"), "Receipt {{ subscriber.data.order }}").unwrap();
        std::fs::write(dir.join("invoice.html"), "<p>Thanks</p>").unwrap();
        std::fs::write(dir.join("invoice.text"), "Thanks").unwrap();
        std::fs::write(dir.join("README.md"), "not a template").unwrap();
        let mut config = Config::example();
        config.load_templates(&dir).unwrap();
        assert!(config.templates.contains_key("invoice") && config.templates.contains_key("weekly_digest"));
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
    fn the_shipped_template_files_compile_beside_the_inline_ones() {
        let mut config = Config::example();
        config.load_templates(&Path::new(env!("CARGO_MANIFEST_DIR")).join("templates")).unwrap();
        for name in ["weekly_digest", "receipt", "password_reset", "weekly_highlights", "order_shipped"] {
            assert!(config.templates.contains_key(name), "{name}");
        }
        config.validate().unwrap();
        config.compiled().unwrap();
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
