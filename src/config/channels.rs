//! `[channels.app]`: the application channel, a signed POST of each delivery's event to
//! the application (Standard Webhooks); `[channels.push]`: Web Push notifications to the
//! subscribers' browsers; and what a campaign's `channels` need of each.

use std::path::PathBuf;

use serde::Deserialize;

use super::{Config, Secret};
use crate::model::work::Channel;

/// The environment variable holding the application channel's signing secret.
pub(super) const ENV_APP_WEBHOOK_SECRET: &str = "MAILSTREAM_APP_WEBHOOK_SECRET";

/// The environment variable holding the VAPID private key of the Web Push channel.
pub(super) const ENV_VAPID_PRIVATE_KEY: &str = "MAILSTREAM_VAPID_PRIVATE_KEY";

/// `[channels]`: the settings of each channel other than email.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChannelsConfig {
    pub app: Option<AppChannelConfig>,
    pub push: Option<PushChannelConfig>,
}

/// `[channels.push]`: how Web Push notifications are sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushChannelConfig {
    /// The VAPID `sub`: how a push service reaches the sender's operators (`mailto:` or
    /// `https:`).
    pub subject: String,
    /// How long a push service keeps a message for a browser that is offline (`TTL`).
    #[serde(default = "default_ttl_seconds")]
    pub ttl_seconds: u64,
    /// `Urgency`: `very-low`, `low`, `normal` or `high` (a phone on battery may hold the
    /// lower ones back).
    #[serde(default)]
    pub urgency: Urgency,
    /// Per request; a request that takes longer is retried later with the same `Topic`
    /// and payload.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Requests in flight at once, per instance.
    #[serde(default = "default_push_concurrency")]
    pub concurrency: usize,
    /// Requests per second to one push service (an origin, e.g. fcm.googleapis.com), per
    /// instance.
    #[serde(default = "default_per_service")]
    pub requests_per_second_per_service: u32,
    /// A file holding the VAPID private key (the raw P-256 scalar, base64url; `mailstream
    /// vapid-keys` makes one), if not in `MAILSTREAM_VAPID_PRIVATE_KEY` or the credential
    /// `vapid_private_key`.
    #[serde(default)]
    pub vapid_private_key_file: Option<PathBuf>,
    #[serde(skip)]
    pub vapid_private_key: Option<Secret>,
    /// The push services a subscription's endpoint may name: hosts, or `*.` and a domain,
    /// each with an optional `:port`. Unset: the public push services
    /// (`push_endpoint::DEFAULT_ALLOWED_HOSTS`); set, the list replaces them. Plain `http` is
    /// taken only for a loopback host listed with its port (an emulator, a test).
    #[serde(default)]
    pub allowed_hosts: Option<Vec<String>>,
}

impl PushChannelConfig {
    /// The push services its subscriptions may name (checked by `validate`).
    pub fn allowed(&self) -> crate::model::push_endpoint::AllowedHosts {
        match &self.allowed_hosts {
            Some(list) => crate::model::push_endpoint::AllowedHosts::parse(list.iter().map(String::as_str))
                .unwrap_or_else(|_| crate::model::push_endpoint::AllowedHosts::parse([]).expect("an empty list")),
            None => crate::model::push_endpoint::AllowedHosts::default(),
        }
    }

    /// The defaults, naming `subject` and signing with `vapid_private_key`.
    pub fn new(subject: &str, vapid_private_key: Secret) -> PushChannelConfig {
        PushChannelConfig {
            subject: subject.to_string(),
            ttl_seconds: default_ttl_seconds(),
            urgency: Urgency::default(),
            timeout_ms: default_timeout_ms(),
            concurrency: default_push_concurrency(),
            requests_per_second_per_service: default_per_service(),
            vapid_private_key_file: None,
            vapid_private_key: Some(vapid_private_key),
            allowed_hosts: None,
        }
    }
}

/// `Urgency` of a push message (RFC 8030 §5.3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Urgency {
    VeryLow,
    Low,
    #[default]
    Normal,
    High,
}

impl Urgency {
    pub fn as_str(self) -> &'static str {
        match self {
            Urgency::VeryLow => "very-low",
            Urgency::Low => "low",
            Urgency::Normal => "normal",
            Urgency::High => "high",
        }
    }
}

fn default_ttl_seconds() -> u64 {
    86_400
}

fn default_push_concurrency() -> usize {
    32
}

fn default_per_service() -> u32 {
    100
}

/// `[channels.app]`: where the application takes its events, and how they are sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppChannelConfig {
    /// The application's endpoint (http or https).
    pub url: String,
    /// Per request; a request that takes longer is retried later with the same id and body.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Requests in flight at once, per instance.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// A file holding the signing secret (`whsec_<base64>`), if not in
    /// `MAILSTREAM_APP_WEBHOOK_SECRET` or the credential `app_webhook_secret`.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    #[serde(skip)]
    pub secret: Option<Secret>,
}

fn default_timeout_ms() -> u64 {
    5000
}

fn default_concurrency() -> usize {
    16
}

/// What is wrong with a list of channels at `at` (none, or one listed twice).
fn list_errors(at: &str, channels: &[Channel]) -> Vec<String> {
    let mut out = Vec::new();
    if channels.is_empty() {
        out.push(format!("{at}: name at least one channel (\"email\", \"app\", \"push\")"));
    }
    for (i, channel) in channels.iter().enumerate() {
        if channels[..i].contains(channel) {
            out.push(format!("{at}: \"{channel}\" is listed twice"));
        }
    }
    out
}

/// Adds a message, naming its key, for each thing wrong with the channels a campaign
/// lists and with `[channels.app]`.
pub(super) fn validate(config: &Config, errors: &mut Vec<String>) {
    for (i, c) in config.campaigns.iter().enumerate() {
        errors.extend(list_errors(&format!("campaign[{i}].channels"), &c.channels));
    }
    for (name, t) in &config.templates {
        errors.extend(list_errors(&format!("templates.{name}.channels"), &t.channels));
    }
    let mut check = |ok: bool, message: String| {
        if !ok {
            errors.push(message);
        }
    };
    let mut lists = config.campaigns.iter().map(|c| &c.channels).chain(config.templates.values().map(|t| &t.channels));
    let wants_app = lists.any(|l| l.contains(&Channel::App));
    let wants_push = config.campaigns.iter().any(|c| c.channels.contains(&Channel::Push));
    for (name, t) in &config.templates {
        let at = format!("templates.{name}.channels");
        // Operator mail is for the team: no subscriber's application event.
        check(
            t.audience != crate::model::work::Audience::Operators || t.channels == [Channel::Email],
            format!("{at}: an operator template (audience = \"operators\") goes by email only"),
        );
        // A transactional item names no subscriber whose browsers it could reach.
        check(
            !t.channels.contains(&Channel::Push),
            format!("{at}: \"push\" is for campaigns (a transactional item has no subscriber's browsers)"),
        );
    }
    for (i, c) in config.campaigns.iter().enumerate().filter(|(_, c)| c.channels.contains(&Channel::Push)) {
        let has_push = config.templates.get(&c.template).is_some_and(|t| t.push.is_some());
        check(
            has_push,
            format!(
                "campaign[{i}].channels: \"push\" needs [templates.{}.push] (title, body and optionally url)",
                c.template
            ),
        );
    }
    validate_push(config.channels.push.as_ref(), wants_push, config.delivery.lease_seconds, errors);
    let mut check = |ok: bool, message: String| {
        if !ok {
            errors.push(message);
        }
    };
    let Some(app) = &config.channels.app else {
        check(
            !wants_app,
            "channels.app: a campaign or template lists the channel \"app\", so [channels.app] url is needed".into(),
        );
        return;
    };
    check(
        app.url.starts_with("http://") || app.url.starts_with("https://"),
        format!("channels.app.url: must be an http(s) URL (got {:?})", app.url),
    );
    check(
        (100..=60_000).contains(&app.timeout_ms),
        format!("channels.app.timeout_ms: must be 100..=60000 (got {})", app.timeout_ms),
    );
    // A delivery stays claimed while its request is out: it must end well within the lease.
    check(
        app.timeout_ms + 1000 <= config.delivery.lease_seconds * 1000,
        format!("channels.app.timeout_ms: must be at least 1 s under delivery.lease_seconds (got {})", app.timeout_ms),
    );
    check(
        (1..=256).contains(&app.concurrency),
        format!("channels.app.concurrency: must be 1..=256 (got {})", app.concurrency),
    );
    let key = app.secret.as_ref().and_then(|s| crate::model::svix::SigningKey::parse(s.expose()));
    check(
        key.is_some(),
        format!(
            "channels.app: a signing secret (whsec_<base64>) is needed in {ENV_APP_WEBHOOK_SECRET}, channels.app.secret_file or the credential app_webhook_secret"
        ),
    );
}

/// What is wrong with `[channels.push]` (needed when a campaign lists `push`).
fn validate_push(push: Option<&PushChannelConfig>, wanted: bool, lease_seconds: u64, errors: &mut Vec<String>) {
    let mut check = |ok: bool, message: String| {
        if !ok {
            errors.push(message);
        }
    };
    let Some(push) = push else {
        check(!wanted, "channels.push: a campaign lists the channel \"push\", so [channels.push] is needed".into());
        return;
    };
    check(
        push.subject.starts_with("mailto:") || push.subject.starts_with("https://"),
        format!("channels.push.subject: must be a mailto: or https: contact (got {:?})", push.subject),
    );
    check(
        push.ttl_seconds <= 2_419_200,
        format!("channels.push.ttl_seconds: at most 2419200 (4 weeks; got {})", push.ttl_seconds),
    );
    check(
        (100..=60_000).contains(&push.timeout_ms) && push.timeout_ms + 1000 <= lease_seconds * 1000,
        format!(
            "channels.push.timeout_ms: must be 100..=60000 and at least 1 s under delivery.lease_seconds (got {})",
            push.timeout_ms
        ),
    );
    if let Some(list) = &push.allowed_hosts
        && let Err(e) = crate::model::push_endpoint::AllowedHosts::parse(list.iter().map(String::as_str))
    {
        check(false, format!("channels.push.allowed_hosts: {e}"));
    }
    check(
        (1..=1024).contains(&push.concurrency),
        format!("channels.push.concurrency: must be 1..=1024 (got {})", push.concurrency),
    );
    check(
        (1..=100_000).contains(&push.requests_per_second_per_service),
        format!(
            "channels.push.requests_per_second_per_service: must be 1..=100000 (got {})",
            push.requests_per_second_per_service
        ),
    );
    let key = push.vapid_private_key.as_ref();
    check(
        key.is_some(),
        format!(
            "channels.push: a VAPID private key (a P-256 scalar, base64url) is needed in {ENV_VAPID_PRIVATE_KEY}, channels.push.vapid_private_key_file or the credential vapid_private_key (mailstream vapid-keys makes one)"
        ),
    );
    // Never quoted: it is the key, or something put where the key belongs.
    check(
        key.is_none_or(|k| crate::model::webpush::VapidKey::parse(k.expose()).is_some()),
        "channels.push: the VAPID private key given is not one (a P-256 scalar: 32 bytes, base64url; mailstream \
         vapid-keys makes one)"
            .to_string(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(config: &Config) -> Vec<String> {
        let mut errors = Vec::new();
        validate(config, &mut errors);
        errors
    }

    #[test]
    fn the_application_channel_needs_its_endpoint_and_a_secret() {
        let mut config = Config::example();
        assert!(errors(&config).is_empty(), "the shipped config sends email only");
        config.campaigns[0].channels = vec![Channel::Email, Channel::App, Channel::App];
        let found = errors(&config);
        assert!(found.iter().any(|e| e.contains("\"app\" is listed twice")), "{found:?}");
        assert!(found.iter().any(|e| e.starts_with("channels.app: a campaign or template")), "{found:?}");
        config.campaigns[0].channels = vec![Channel::App];
        let app = AppChannelConfig {
            url: "ftp://app.example".into(),
            timeout_ms: 20_000,
            concurrency: 0,
            secret_file: None,
            secret: Some(Secret::new("not a whsec secret!")),
        };
        config.channels.app = Some(app.clone());
        let found = errors(&config);
        for key in [
            "channels.app.url",
            "channels.app.timeout_ms",
            "channels.app.concurrency",
            "channels.app: a signing secret",
        ] {
            assert!(found.iter().any(|e| e.starts_with(key)), "{key}: {found:?}");
        }
        assert!(found.iter().all(|e| !e.contains("not a whsec")), "the secret is never shown: {found:?}");
        config.channels.app = Some(AppChannelConfig {
            url: "https://app.example/events".into(),
            timeout_ms: 5000,
            concurrency: 16,
            secret: Some(Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")),
            ..app
        });
        assert!(errors(&config).is_empty(), "{:?}", errors(&config));
        config.templates.get_mut("new_lead").unwrap().channels = vec![Channel::Email, Channel::App];
        let found = errors(&config);
        assert!(found.iter().any(|e| e.starts_with("templates.new_lead.channels: an operator template")), "{found:?}");
    }

    #[test]
    fn the_push_channel_needs_its_section_and_a_key_it_never_quotes() {
        let mut config = Config::example();
        config.campaigns[0].channels = vec![Channel::Email, Channel::Push];
        let found = errors(&config);
        assert!(found.iter().any(|e| e.starts_with("channels.push: a campaign lists")), "{found:?}");
        let garbage = "not-a-key-but-a-secret-all-the-same";
        config.channels.push = Some(PushChannelConfig {
            subject: "ops@example.com".into(),
            ttl_seconds: 3_000_000,
            timeout_ms: 15_000,
            concurrency: 0,
            requests_per_second_per_service: 0,
            ..PushChannelConfig::new("mailto:ops@example.com", Secret::new(garbage))
        });
        let found = errors(&config);
        for key in [
            "channels.push.subject",
            "channels.push.ttl_seconds",
            "channels.push.timeout_ms",
            "channels.push.concurrency",
            "channels.push.requests_per_second_per_service",
            "channels.push: the VAPID private key given is not one",
        ] {
            assert!(found.iter().any(|e| e.starts_with(key)), "{key}: {found:?}");
        }
        assert!(found.iter().all(|e| !e.contains(garbage)), "the key is never shown: {found:?}");
        let (private, _) = crate::model::webpush::VapidKey::generate();
        config.channels.push = Some(PushChannelConfig::new("mailto:ops@example.com", Secret::new(private)));
        assert!(errors(&config).is_empty(), "{:?}", errors(&config));
        let features = serde_json::to_value(config.features()).unwrap();
        assert_eq!((&features["push"]["on"], &features["push"]["mode"]), (&true.into(), &"weekly_digest".into()));
        assert_eq!(features["app"]["on"], false, "{features}");
        config.channels.push.as_mut().unwrap().vapid_private_key = None;
        let found = errors(&config);
        assert!(found.iter().any(|e| e.starts_with("channels.push: a VAPID private key") && e.contains("is needed")));
    }
}
