//! `[channels.app]`: the application channel, a signed POST of each delivery's event to
//! the application (Standard Webhooks), and what a campaign's `channels` need of it.

use std::path::PathBuf;

use serde::Deserialize;

use super::{Config, Secret};
use crate::work::Channel;

/// The environment variable holding the application channel's signing secret.
pub(super) const ENV_APP_WEBHOOK_SECRET: &str = "MAILSTREAM_APP_WEBHOOK_SECRET";

/// `[channels]`: the settings of each channel other than email.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChannelsConfig {
    pub app: Option<AppChannelConfig>,
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
        out.push(format!("{at}: name at least one channel (\"email\", \"app\")"));
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
    for (name, t) in &config.templates {
        let at = format!("templates.{name}.channels");
        // Operator mail is for the team: no subscriber's application event.
        check(
            t.audience != crate::work::Audience::Operators || t.channels == [Channel::Email],
            format!("{at}: an operator template (audience = \"operators\") goes by email only"),
        );
    }
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
    let key = app.secret.as_ref().and_then(|s| crate::svix::SigningKey::parse(s.expose()));
    check(
        key.is_some(),
        format!(
            "channels.app: a signing secret (whsec_<base64>) is needed in {ENV_APP_WEBHOOK_SECRET}, channels.app.secret_file or the credential app_webhook_secret"
        ),
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
}
