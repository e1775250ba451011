//! What a config turns on: each feature on or off and where its secret came from
//! (never the value), for the daemon's start-up line and `check-config --json`; and
//! the checks only `run` and `check-config` make, because they are about sending
//! campaigns: one-click unsubscribe.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::{Config, ConfigError, ENV_UNSUBSCRIBE_SECRET};

/// Where a secret came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretSource {
    /// Its environment variable.
    Env,
    /// The file the config names.
    File,
    /// The systemd credential (`$CREDENTIALS_DIRECTORY/<name>`).
    Credential,
}

impl SecretSource {
    fn as_str(self) -> &'static str {
        match self {
            SecretSource::Env => "env",
            SecretSource::File => "file",
            SecretSource::Credential => "credential",
        }
    }
}

/// One feature: on or off, where its secret came from, and a word on how it runs.
#[derive(Debug, Clone, Serialize)]
pub struct Feature {
    pub on: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// Every feature, by name (the keys of `check-config --json`'s `features`).
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct Features(BTreeMap<&'static str, Feature>);

/// How the campaigns' `List-Unsubscribe` works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unsubscribe {
    /// RFC 8058: a signed link the public listener answers, with `List-Unsubscribe-Post`.
    OneClick,
    /// A link to the application's settings page: no one-click.
    SettingsUrl,
    /// No header at all.
    None,
}

impl Config {
    fn unsubscribe_mode(&self) -> Unsubscribe {
        if !self.unsubscribe.secrets.is_empty() {
            Unsubscribe::OneClick
        } else if !self.unsubscribe.settings_url.is_empty() {
            Unsubscribe::SettingsUrl
        } else {
            Unsubscribe::None
        }
    }

    /// What this config turns on.
    pub fn features(&self) -> Features {
        let secret = |name: &str| self.sources.get(name).copied();
        let public = self.http.public_listen.map(|a| a.to_string());
        let private = self.http.metrics_listen.map(|a| a.to_string());
        // The campaigns that use a feature, by name.
        let using = |uses: &dyn Fn(&super::CampaignConfig) -> bool| -> Vec<&str> {
            self.campaigns.iter().filter(|c| uses(c)).map(|c| c.name.as_str()).collect()
        };
        let hooked = using(&|c| c.render_hook.is_some());
        let scheduled = using(&|c| c.schedule.is_some());
        let app = using(&|c| c.channels.contains(&crate::model::work::Channel::App));
        let push = using(&|c| c.channels.contains(&crate::model::work::Channel::Push));
        let feature = |on: bool, secret: Option<SecretSource>, mode: Option<String>| Feature { on, secret, mode };
        let unsubscribe = match self.unsubscribe_mode() {
            Unsubscribe::OneClick => feature(true, secret("unsubscribe_secret"), Some("one_click".into())),
            Unsubscribe::SettingsUrl => feature(true, None, Some("settings_url".into())),
            Unsubscribe::None => feature(false, None, None),
        };
        let webhooks = !self.webhook.secrets.is_empty() && public.is_some();
        let admin = !self.http.admin_tokens.is_empty() && private.is_some();
        let ingest = !self.http.ingest_tokens.is_empty() && public.is_some();
        Features(BTreeMap::from([
            ("resend_api_key", feature(self.resend.api_key.is_some(), secret("resend_api_key"), None)),
            ("metrics", feature(private.is_some(), None, private.clone())),
            ("public_listener", feature(public.is_some(), None, public.clone())),
            ("webhooks", feature(webhooks, secret("webhook_secret"), None)),
            ("unsubscribe", unsubscribe),
            ("admin", feature(admin, secret("admin_token"), None)),
            // A channel is on where a campaign lists it; its mode names those campaigns.
            ("app", feature(!app.is_empty(), secret("app_webhook_secret"), names(&app))),
            ("push", feature(!push.is_empty(), secret("vapid_private_key"), names(&push))),
            ("ingest", feature(ingest, secret("ingest_token"), None)),
            ("render_hook", feature(!hooked.is_empty(), secret("render_hook_secret"), names(&hooked))),
            ("schedules", feature(!scheduled.is_empty(), None, names(&scheduled))),
        ]))
    }

    /// What `run` and `check-config` refuse beyond [`Config::validate`]: a campaign
    /// with no unsubscribe link at all, unless it says `one_click_unsubscribe = false`.
    /// Returns the warnings: a link that is not https, a link that is not one-click.
    pub fn check_sending(&self) -> Result<Vec<String>, ConfigError> {
        let mode = self.unsubscribe_mode();
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        for (i, c) in self.campaigns.iter().enumerate() {
            if c.one_click_unsubscribe && mode == Unsubscribe::None {
                errors.push(format!(
                    "campaign[{i}] ({}): its emails would carry no List-Unsubscribe header: Gmail and Yahoo \
                     require one-click unsubscribe on bulk mail (since February 2024). Set the unsubscribe \
                     secret ({ENV_UNSUBSCRIBE_SECRET}, unsubscribe.secret_file or the credential \
                     unsubscribe_secret) for one-click, or unsubscribe.settings_url; or, for mail that is \
                     not bulk, set one_click_unsubscribe = false on the campaign",
                    c.name
                ));
            }
        }
        let wants = self.campaigns.iter().any(|c| c.one_click_unsubscribe);
        match mode {
            Unsubscribe::OneClick if !self.unsubscribe.base_url.starts_with("https://") => warnings.push(format!(
                "unsubscribe.base_url: {:?} is not https; mail clients may not offer one-click unsubscribe \
                 over plain http (put the public listener behind your TLS proxy)",
                self.unsubscribe.base_url
            )),
            Unsubscribe::SettingsUrl if wants => {
                if !self.unsubscribe.settings_url.starts_with("https://") {
                    warnings
                        .push(format!("unsubscribe.settings_url: {:?} is not https", self.unsubscribe.settings_url));
                }
                warnings.push(
                    "unsubscribe: settings_url is a link, not one-click unsubscribe (RFC 8058), which Gmail \
                     and Yahoo require on bulk mail; set an unsubscribe secret for one-click"
                        .into(),
                );
            }
            _ => {}
        }
        if self.resend.requests_per_second > RESEND_DEFAULT_RATE {
            warnings.push(format!(
                "resend.requests_per_second: {} is above Resend's default limit of {RESEND_DEFAULT_RATE} requests/s \
                 per team: the account's limit must have been raised. If it was not, the first answers' \
                 ratelimit-limit lowers the rate team-wide, after at most one second's excess is refused with \
                 429 and sent again (docs/resend.md)",
                self.resend.requests_per_second
            ));
        }
        if errors.is_empty() { Ok(warnings) } else { Err(ConfigError::Invalid(errors)) }
    }

    /// What `run` refuses of the config beyond the file itself: [`Config::check_sending`]'s
    /// refusals and the secrets it needs to start (the Resend API key). `check-config`
    /// checks this too, but with `--offline`.
    pub fn check_run(&self) -> Result<Vec<String>, ConfigError> {
        let (warnings, mut errors) = match self.check_sending() {
            Ok(warnings) => (warnings, Vec::new()),
            Err(ConfigError::Invalid(errors)) => (Vec::new(), errors),
            Err(e) => return Err(e),
        };
        if self.resend.api_key.is_none() {
            errors.push(NO_API_KEY.into());
        }
        if errors.is_empty() { Ok(warnings) } else { Err(ConfigError::Invalid(errors)) }
    }
}

/// Resend's default request rate per team (its docs, 2026; raised on request).
pub const RESEND_DEFAULT_RATE: u32 = 5;

/// What `run` says when no Resend API key is set.
pub const NO_API_KEY: &str =
    "resend.api_key: no Resend API key: set RESEND_API_KEY, resend.api_key_file or the credential resend_api_key";

fn names(list: &[&str]) -> Option<String> {
    (!list.is_empty()).then(|| list.join(","))
}

/// One line: `webhooks=on(env) unsubscribe=one_click(file) admin=off …`.
impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, feature)) in self.0.iter().enumerate() {
            let state = match (&feature.mode, feature.on) {
                (Some(mode), true) => mode.as_str(),
                (None, true) => "on",
                (_, false) => "off",
            };
            let space = if i == 0 { "" } else { " " };
            match feature.secret.filter(|_| feature.on) {
                Some(source) => write!(f, "{space}{name}={state}({})", source.as_str())?,
                None => write!(f, "{space}{name}={state}")?,
            }
        }
        Ok(())
    }
}
