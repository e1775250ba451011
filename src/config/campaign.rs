//! `[[campaign]]` and `[render_hook]`: what each campaign sends and when, its render
//! hook and A/B variants, and the secret every render hook's requests are signed with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use chrono_tz::Tz;
use serde::Deserialize;

use super::{DeliveryConfig, Secret, TemplateConfig, is_tag_value, parse_cron, parse_local_time};
use crate::model::period::PeriodKind;

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
    pub arms: Vec<super::VariantConfig>,
}

impl VariantsConfig {
    /// The variants in use (none while not enabled).
    pub fn active(&self) -> &[super::VariantConfig] {
        if self.enabled { &self.arms } else { &[] }
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
    /// Bulk mail needs a way out in one click (Gmail's and Yahoo's rules): `run` and
    /// `check-config` refuse this campaign while the config sets no unsubscribe secret
    /// and no `unsubscribe.settings_url`, unless this is false (mail that is not bulk).
    #[serde(default = "crate::config::yes")]
    pub one_click_unsubscribe: bool,
    /// Where each subscriber's target gets this campaign: a delivery per channel
    /// (`email`, `app`), each claimed, sent and settled on its own. Email alone by default.
    #[serde(default = "default_channels")]
    pub channels: Vec<crate::model::work::Channel>,
}

fn default_channels() -> Vec<crate::model::work::Channel> {
    vec![crate::model::work::Channel::Email]
}

/// A campaign with a render hook needs the secret its requests are signed with.
pub(super) fn validate_hook_secret(config: &super::Config, env: &str, errors: &mut Vec<String>) {
    if config.campaigns.iter().any(|c| c.render_hook.is_some()) {
        let ok = config.render_hook.secret.as_ref().is_some_and(|s| s.expose().len() >= 16);
        errors.extend((!ok).then(|| {
            format!("render_hook: a campaign has a render hook, so a secret of at least 16 characters is needed ({env}, render_hook.secret_file or the credential render_hook_secret)")
        }));
    }
}

fn default_catch_up_hours() -> u64 {
    6
}

fn default_time_zone() -> String {
    "Asia/Tokyo".to_string()
}

impl CampaignConfig {
    /// The campaign's time zone (validated when the config was loaded).
    pub fn tz(&self) -> Tz {
        self.time_zone.parse().unwrap_or(chrono_tz::Asia::Tokyo)
    }
}

/// Adds a message, naming its key, for each thing wrong with a campaign: its own
/// settings, and what it needs of the rest (a name no other campaign has, a defined
/// template, a hook that answers within `delivery.lease_seconds`, a period that
/// `delivery.retention_days` outlives). One campaign at a time, so that each
/// campaign's messages come out together, in the order they always have.
pub(super) fn validate(
    campaigns: &[CampaignConfig],
    d: &DeliveryConfig,
    templates: &BTreeMap<String, TemplateConfig>,
    errors: &mut Vec<String>,
) {
    let mut check = |ok: bool, message: String| {
        if !ok {
            errors.push(message);
        }
    };
    let mut names = BTreeSet::new();
    for (i, c) in campaigns.iter().enumerate() {
        let at = format!("campaign[{i}]");
        check(is_tag_value(&c.name), format!("{at}.name: use ASCII letters, digits, '_' or '-' (got {:?})", c.name));
        check(names.insert(c.name.as_str()), format!("{at}.name: {:?} is defined twice", c.name));
        check(
            c.name != crate::model::work::TRANSACTIONAL,
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
        let mut arms = BTreeSet::new();
        for (j, v) in c.variants.arms.iter().enumerate() {
            check(
                is_tag_value(&v.name) && v.name.len() <= 64,
                format!("{at}.variants.arms[{j}].name: use ASCII letters, digits, '_' or '-' (got {:?})", v.name),
            );
            check(arms.insert(v.name.as_str()), format!("{at}.variants.arms[{j}].name: {:?} is defined twice", v.name));
            check(v.weight > 0, format!("{at}.variants.arms[{j}].weight: must be at least 1"));
        }
        check(!c.variants.enabled || !c.variants.arms.is_empty(), format!("{at}.variants: enabled without arms"));
        check(templates.contains_key(&c.template), format!("{at}.template: no [templates.{}] is defined", c.template));
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
}
