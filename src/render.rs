//! Rendering an email from a campaign's template (minijinja). The HTML body is
//! auto-escaped; subject and text are not. The result is the email object of
//! Resend's API, serialized once and sealed byte for byte.

use std::collections::BTreeMap;

use minijinja::{Environment, context};
use serde::{Deserialize, Serialize};

use crate::work::DeliveryRef;

/// A template: minijinja sources for the subject and the two bodies
/// (`[templates.NAME]` in the config).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    pub subject: String,
    pub html: String,
    pub text: String,
}

/// What a template sees about one delivery.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    pub delivery: &'a DeliveryRef,
    pub target: &'a str,
    pub subscriber_id: &'a str,
    /// The subscriber's stored data (a JSON object), if any.
    pub data: &'a serde_json::Value,
    /// Extra headers (List-Unsubscribe and List-Unsubscribe-Post).
    pub headers: &'a [(&'static str, String)],
}

/// A tag on a sent email (ids only, in Resend's tag alphabet): lets webhooks
/// find the delivery again.
#[derive(Debug, Clone, Serialize)]
pub struct Tag<'a> {
    pub name: &'static str,
    pub value: std::borrow::Cow<'a, str>,
}

/// One email as Resend's API takes it.
#[derive(Debug, Clone, Serialize)]
pub struct Email<'a> {
    pub from: &'a str,
    pub to: [&'a str; 1],
    pub subject: String,
    pub html: String,
    pub text: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<&'static str, &'a str>,
    pub tags: [Tag<'a>; 3],
}

/// Compiled templates, by name.
pub struct Renderer {
    env: Environment<'static>,
}

impl Renderer {
    /// Compiles every template (`[templates.NAME]` of the config).
    pub fn new(templates: &BTreeMap<String, TemplateConfig>) -> Result<Renderer, minijinja::Error> {
        let mut env = Environment::new();
        for (name, t) in templates {
            add(&mut env, name, t)?;
        }
        Ok(Renderer { env })
    }

    /// Checks that a template compiles (used by config validation).
    pub fn check(name: &str, t: &TemplateConfig) -> Result<(), String> {
        add(&mut Environment::new(), name, t).map_err(|e| e.to_string())
    }

    /// Renders `template` for one delivery into a serialized Resend email object.
    pub fn render(
        &self,
        template: &str,
        from: &str,
        to: &str,
        input: &RenderInput<'_>,
    ) -> Result<String, minijinja::Error> {
        let empty = serde_json::Value::Object(Default::default());
        let data = if input.data.is_object() { input.data } else { &empty };
        let d = input.delivery;
        let ctx = context! {
            campaign => &d.campaign,
            period => &d.period,
            target => input.target,
            delivery_id => d.id(),
            subscriber => context! { id => input.subscriber_id, data => minijinja::Value::from(minijinja::value::Serde(data)) },
        };
        let part = |suffix: &str| self.env.get_template(&format!("{template}.{suffix}"))?.render(&ctx);
        let email = Email {
            from,
            to: [to],
            subject: part("subject")?.trim().to_string(),
            html: part("html")?,
            text: part("text")?,
            headers: input.headers.iter().map(|(name, value)| (*name, value.as_str())).collect(),
            tags: [
                Tag { name: "campaign", value: d.campaign.as_str().into() },
                Tag { name: "period", value: d.period.as_str().into() },
                Tag { name: "delivery", value: d.tag().into() },
            ],
        };
        Ok(serde_json::to_string(&email).expect("an email serializes"))
    }
}

fn add(env: &mut Environment<'static>, name: &str, t: &TemplateConfig) -> Result<(), minijinja::Error> {
    // The suffix picks auto-escaping: `.html` escapes, the others do not.
    let parts = BTreeMap::from([("subject", &t.subject), ("html", &t.html), ("text", &t.text)]);
    for (suffix, source) in parts {
        env.add_template_owned(format!("{name}.{suffix}"), source.clone())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery() -> DeliveryRef {
        DeliveryRef::new("weekly_digest", "2026-W48", "u42", "team-1")
    }

    fn templates() -> BTreeMap<String, TemplateConfig> {
        let t = TemplateConfig {
            subject: "Digest for {{ target }}, {{ period }}".into(),
            html: "<p>Hello{% if subscriber.data.name %} {{ subscriber.data.name }}{% endif %},</p>".into(),
            text: "Hello{% if subscriber.data.name %} {{ subscriber.data.name }}{% endif %},".into(),
        };
        BTreeMap::from([("digest".to_string(), t)])
    }

    #[test]
    fn renders_with_escaping_in_html_only() {
        let renderer = Renderer::new(&templates()).unwrap();
        let data = serde_json::json!({ "name": "<Ann & Bo>" });
        let d = delivery();
        let input = RenderInput { delivery: &d, target: "team-1", subscriber_id: "u42", data: &data, headers: &[] };
        let json = renderer.render("digest", "a@acme.example", "u42@resend.dev", &input).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["subject"], "Digest for team-1, 2026-W48");
        assert!(v["html"].as_str().unwrap().contains("&lt;Ann &amp; Bo&gt;"), "{v}");
        assert!(v["text"].as_str().unwrap().contains("<Ann & Bo>"), "{v}");
        assert_eq!(v["to"][0], "u42@resend.dev");
        assert_eq!(v["tags"][2]["value"], "weekly__digest_c2026-W48_cu42_cteam-1");
    }

    #[test]
    fn missing_data_renders_without_it() {
        let renderer = Renderer::new(&templates()).unwrap();
        let d = delivery();
        let input =
            RenderInput { delivery: &d, target: "t", subscriber_id: "s", data: &serde_json::Value::Null, headers: &[] };
        let json = renderer.render("digest", "a@b.example", "c@d.example", &input).unwrap();
        assert!(json.contains("Hello,"), "{json}");
    }

    #[test]
    fn broken_template_is_reported() {
        let t = TemplateConfig { subject: "{{ oops".into(), html: String::new(), text: String::new() };
        assert!(Renderer::check("x", &t).is_err());
    }
}
