//! `[templates.NAME]`: a template's minijinja sources (subject, HTML and text, and its
//! Web Push parts), whom its mail is for, and a campaign's A/B variants' parts; compiled
//! once here, so a template that does not compile is a configuration error naming it.
//! Rendering with them is `audience::render`'s.

use std::collections::BTreeMap;

use minijinja::Environment;
use serde::Deserialize;

use crate::model::work::{Audience, Channel};

/// A template: minijinja sources for the subject and the two bodies
/// (`[templates.NAME]` in the config), whom its mail is for, and, for operator mail
/// only, the sender it falls back to once when Resend refuses the first.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    pub subject: String,
    pub html: String,
    pub text: String,
    #[serde(default)]
    pub audience: Audience,
    #[serde(default)]
    pub fallback_from: Option<String>,
    /// A transactional item of this template is a delivery per channel (`email`, `app`),
    /// made by the one ingest step; email alone by default.
    #[serde(default = "email_only")]
    pub channels: Vec<Channel>,
    /// What a campaign of this template sends on the Web Push channel.
    #[serde(default)]
    pub push: Option<PushTemplate>,
}

/// A Web Push notification's parts (`[templates.NAME.push]`): minijinja sources, not
/// escaped (the payload is JSON, which escapes what it must).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushTemplate {
    pub title: String,
    pub body: String,
    /// Where a click on the notification leads (optional).
    #[serde(default)]
    pub url: Option<String>,
}

fn email_only() -> Vec<Channel> {
    vec![Channel::Email]
}

impl TemplateConfig {
    /// A customer template of these parts, by email (templates read from files are).
    pub fn new(subject: String, html: String, text: String) -> TemplateConfig {
        TemplateConfig {
            subject,
            html,
            text,
            audience: Audience::Customers,
            fallback_from: None,
            channels: email_only(),
            push: None,
        }
    }
}

/// An A/B variant of a campaign: a name and the parts it overrides (minijinja
/// sources; a part it leaves out comes from the campaign's template).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantConfig {
    pub name: String,
    /// Relative share of the subscribers (any positive integers).
    pub weight: u32,
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default)]
    pub html: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
}

/// Compiles every template (`[templates.NAME]` of the config, and the files of
/// `templates_dir`) and every campaign variant's parts, given as `(campaign, variants)`.
pub(crate) fn compile<'a>(
    templates: &BTreeMap<String, TemplateConfig>,
    campaigns: impl Iterator<Item = (&'a str, &'a [VariantConfig])>,
) -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    for (name, t) in templates {
        add(&mut env, name, t)?;
    }
    for (campaign, variants) in campaigns {
        for v in variants {
            let parts = [("subject", &v.subject), ("html", &v.html), ("text", &v.text)];
            for (suffix, source) in parts {
                if let Some(source) = source {
                    env.add_template_owned(format!("{campaign}@{}.{suffix}", v.name), source.clone())?;
                }
            }
        }
    }
    Ok(env)
}

/// Checks that a template compiles (used by config validation).
pub fn check(name: &str, t: &TemplateConfig) -> Result<(), String> {
    add(&mut Environment::new(), name, t).map_err(|e| e.to_string())
}

fn add(env: &mut Environment<'static>, name: &str, t: &TemplateConfig) -> Result<(), minijinja::Error> {
    // The suffix picks auto-escaping: `.html` escapes, the others do not.
    let parts = BTreeMap::from([("subject", &t.subject), ("html", &t.html), ("text", &t.text)]);
    for (suffix, source) in parts {
        env.add_template_owned(format!("{name}.{suffix}"), source.clone())?;
    }
    if let Some(push) = &t.push {
        let parts =
            [("push_title", Some(&push.title)), ("push_body", Some(&push.body)), ("push_url", push.url.as_ref())];
        for (suffix, source) in parts {
            if let Some(source) = source {
                env.add_template_owned(format!("{name}.{suffix}"), source.clone())?;
            }
        }
    }
    Ok(())
}
