//! Rendering an email from a campaign's template (minijinja), or from ready
//! content (a transactional send). The HTML body is auto-escaped; subject and
//! text are not. An A/B variant of a campaign overrides any part of its
//! template and is carried as a `variant` tag. The result is the email object
//! of Resend's API, serialized once and sealed byte for byte; the same input
//! renders the same bytes.

use std::collections::BTreeMap;

use minijinja::{Environment, context};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::config::templates::VariantConfig;
use crate::model::work::DeliveryRef;

/// A rendered notification: what the payload carries besides its `tag`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Notification {
    pub title: String,
    pub body: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// The variant `subscriber` gets in `campaign`: stable (a hash of both), in
/// proportion to the weights; `None` without variants.
pub(crate) fn assign<'a>(campaign: &str, subscriber: &str, variants: &'a [VariantConfig]) -> Option<&'a str> {
    let total: u64 = variants.iter().map(|v| u64::from(v.weight)).sum();
    if total == 0 {
        return None;
    }
    let digest = Sha256::digest(format!("{campaign}:{subscriber}").as_bytes());
    let mut point = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes")) % total;
    for v in variants {
        if point < u64::from(v.weight) {
            return Some(&v.name);
        }
        point -= u64::from(v.weight);
    }
    None
}

/// What a template sees about one delivery.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenderInput<'a> {
    pub delivery: &'a DeliveryRef,
    /// The A/B variant (of the delivery's campaign) to render, if any.
    pub variant: Option<&'a str>,
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
struct Tag<'a> {
    pub name: &'static str,
    pub value: std::borrow::Cow<'a, str>,
}

/// One email as Resend's API takes it.
#[derive(Debug, Clone, Serialize)]
struct Email<'a> {
    pub from: &'a str,
    pub to: [&'a str; 1],
    pub subject: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub html: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<&'static str, &'a str>,
    pub tags: Vec<Tag<'a>>,
}

impl<'a> Email<'a> {
    /// The tags mailstream sets (campaign, period, delivery; the variant if any): ids
    /// only, so webhooks can find the delivery again.
    fn tags(d: &'a DeliveryRef, variant: Option<&'a str>) -> Vec<Tag<'a>> {
        let mut tags = vec![
            Tag { name: "campaign", value: d.campaign.as_str().into() },
            Tag { name: "period", value: d.period.as_str().into() },
            Tag { name: "delivery", value: d.tag().into() },
        ];
        tags.extend(variant.map(|v| Tag { name: "variant", value: v.into() }));
        tags
    }
}

/// Ready content of a transactional send (not a template: sent as given).
#[derive(Debug, Clone, Copy)]
pub struct ReadyContent<'a> {
    pub subject: &'a str,
    pub html: Option<&'a str>,
    pub text: Option<&'a str>,
}

/// Compiled templates, by name.
pub(crate) struct Renderer {
    env: Environment<'static>,
}

impl Renderer {
    /// Every template and campaign variant of `config`, compiled.
    pub(crate) fn of(config: &Config) -> Result<Renderer, minijinja::Error> {
        Ok(Renderer { env: config.compiled()? })
    }

    /// `templates` alone, compiled.
    #[cfg(test)]
    pub fn new(templates: &BTreeMap<String, crate::config::TemplateConfig>) -> Result<Renderer, minijinja::Error> {
        Ok(Renderer { env: crate::config::templates::compile(templates, std::iter::empty())? })
    }

    /// A transactional email from ready content.
    pub fn ready(from: &str, to: &str, content: ReadyContent<'_>, delivery: &DeliveryRef) -> String {
        let email = Email {
            from,
            to: [to],
            subject: content.subject.trim().to_string(),
            html: content.html.unwrap_or_default().to_string(),
            text: content.text.unwrap_or_default().to_string(),
            headers: BTreeMap::new(),
            tags: Email::tags(delivery, None),
        };
        serde_json::to_string(&email).expect("an email serializes")
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
        let part = |suffix: &str| {
            let own = input.variant.map(|v| format!("{}@{v}.{suffix}", d.campaign));
            let t = match own.and_then(|name| self.env.get_template(&name).ok()) {
                Some(t) => t,
                None => self.env.get_template(&format!("{template}.{suffix}"))?,
            };
            t.render(&ctx)
        };
        let email = Email {
            from,
            to: [to],
            subject: part("subject")?.trim().to_string(),
            html: part("html")?,
            text: part("text")?,
            headers: input.headers.iter().map(|(name, value)| (*name, value.as_str())).collect(),
            tags: Email::tags(d, input.variant),
        };
        Ok(serde_json::to_string(&email).expect("an email serializes"))
    }
}

impl Renderer {
    /// Renders `template`'s push parts for one delivery (the same context as an email's,
    /// without a variant).
    pub fn render_push(
        &self,
        template: &str,
        d: &DeliveryRef,
        data: &serde_json::Value,
    ) -> Result<Notification, minijinja::Error> {
        let empty = serde_json::Value::Object(Default::default());
        let data = if data.is_object() { data } else { &empty };
        let ctx = context! {
            campaign => &d.campaign,
            period => &d.period,
            target => &d.target,
            delivery_id => d.id(),
            subscriber => context! { id => &d.subscriber, data => minijinja::Value::from(minijinja::value::Serde(data)) },
        };
        let part = |suffix: &str| self.env.get_template(&format!("{template}.{suffix}"))?.render(&ctx);
        let url = match self.env.get_template(&format!("{template}.push_url")) {
            Ok(t) => Some(t.render(&ctx)?.trim().to_string()).filter(|u| !u.is_empty()),
            Err(_) => None,
        };
        Ok(Notification {
            title: part("push_title")?.trim().to_string(),
            body: part("push_body")?.trim().to_string(),
            url,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::templates::{self, TemplateConfig};

    fn delivery() -> DeliveryRef {
        DeliveryRef::new("weekly_digest", "2026-W48", "u42", "team-1")
    }

    fn templates() -> BTreeMap<String, TemplateConfig> {
        let t = TemplateConfig::new(
            "Digest for {{ target }}, {{ period }}".into(),
            "<p>Hello{% if subscriber.data.name %} {{ subscriber.data.name }}{% endif %},</p>".into(),
            "Hello{% if subscriber.data.name %} {{ subscriber.data.name }}{% endif %},".into(),
        );
        BTreeMap::from([("digest".to_string(), t)])
    }

    #[test]
    fn renders_with_escaping_in_html_only() {
        let renderer = Renderer::new(&templates()).unwrap();
        let data = serde_json::json!({ "name": "<Ann & Bo>" });
        let d = delivery();
        let input = RenderInput {
            delivery: &d,
            variant: None,
            target: "team-1",
            subscriber_id: "u42",
            data: &data,
            headers: &[],
        };
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
        let input = RenderInput {
            delivery: &d,
            variant: None,
            target: "t",
            subscriber_id: "s",
            data: &serde_json::Value::Null,
            headers: &[],
        };
        let json = renderer.render("digest", "a@b.example", "c@d.example", &input).unwrap();
        assert!(json.contains("Hello,"), "{json}");
    }

    fn arm(name: &str, weight: u32, subject: Option<&str>) -> VariantConfig {
        VariantConfig { name: name.into(), weight, subject: subject.map(str::to_string), html: None, text: None }
    }

    #[test]
    fn variants_follow_their_weights_and_stay_put() {
        let arms = [arm("a", 50, None), arm("b", 30, None), arm("c", 20, None)];
        let mut counts = BTreeMap::new();
        for i in 0..10_000 {
            *counts.entry(assign("weekly_digest", &format!("user-{i:06}"), &arms).unwrap()).or_insert(0u32) += 1;
        }
        // Within 2 percentage points of each weight over 10,000 subscribers (a binomial
        // standard deviation here is at most 0.5 points).
        for (name, share) in [("a", 5000), ("b", 3000), ("c", 2000)] {
            assert!(counts[name].abs_diff(share) <= 200, "{counts:?}");
        }
        assert_eq!(assign("weekly_digest", "user-000001", &arms), assign("weekly_digest", "user-000001", &arms));
        assert_eq!(assign("weekly_digest", "u", &[]), None);
    }

    #[test]
    fn a_variant_overrides_only_its_parts_and_is_tagged() {
        let campaigns = [("weekly_digest", &[arm("b", 1, Some("B {{ period }}"))][..])];
        let renderer = Renderer { env: templates::compile(&templates(), campaigns.into_iter()).unwrap() };
        let d = DeliveryRef::new("weekly_digest", "2026-W48", "u42", "team-1");
        let data = serde_json::json!({ "name": "Ann" });
        let input = |variant| RenderInput {
            delivery: &d,
            variant,
            target: "team-1",
            subscriber_id: "u42",
            data: &data,
            headers: &[],
        };
        let b: serde_json::Value =
            serde_json::from_str(&renderer.render("digest", "a@b.example", "c@d.example", &input(Some("b"))).unwrap())
                .unwrap();
        assert_eq!(b["subject"], "B 2026-W48");
        assert!(b["html"].as_str().unwrap().contains("Hello Ann"));
        assert_eq!(b["tags"][3], serde_json::json!({"name": "variant", "value": "b"}));
        let plain = renderer.render("digest", "a@b.example", "c@d.example", &input(None)).unwrap();
        assert!(!plain.contains("variant"), "{plain}");
        assert_eq!(
            plain,
            renderer.render("digest", "a@b.example", "c@d.example", &input(None)).unwrap(),
            "deterministic"
        );
    }

    #[test]
    fn ready_content_is_sent_as_given() {
        let d = DeliveryRef::new("transactional", "2026-11-30", "-", "order-1");
        let json = Renderer::ready(
            "a@b.example",
            "c@d.example",
            ReadyContent { subject: " Receipt {{ x }} ", html: None, text: Some("t") },
            &d,
        );
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (v["subject"].as_str(), v["text"].as_str(), v["html"].as_str()),
            (Some("Receipt {{ x }}"), Some("t"), None)
        );
        assert_eq!(v["tags"][0]["value"], "transactional");
    }

    #[test]
    fn broken_template_is_reported() {
        let t = TemplateConfig::new("{{ oops".into(), String::new(), String::new());
        assert!(templates::check("x", &t).is_err());
    }

    #[test]
    fn the_shipped_template_renders() {
        let config = crate::config::Config::example();
        let renderer = Renderer::new(&config.templates).unwrap();
        let d = DeliveryRef::new("weekly_digest", "2026-W48", "u42", "team-1");
        let data = serde_json::json!({ "name": "Ann" });
        let input = RenderInput {
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
}
