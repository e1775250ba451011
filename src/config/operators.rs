//! `[operators]`: the team's own addresses, the only ones operator mail may go to, and
//! the checks that keep operator mail (and its fallback sender) apart from customer mail.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{CampaignConfig, TemplateConfig};
use crate::model::work::Audience;

/// The team's addresses (`[operators] to`): mail from a template with
/// `audience = "operators"` goes to these and no others.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorsConfig {
    pub to: Vec<String>,
}

impl OperatorsConfig {
    /// Whether `address` is one of the team's (compared as the webhook side compares
    /// addresses: trimmed, case folded).
    pub fn includes(&self, address: &str) -> bool {
        let address = address.trim();
        self.to.iter().any(|a| a.trim().eq_ignore_ascii_case(address))
    }
}

/// The domain of an address, bare or `Name <local@domain>`, lower-cased.
fn domain(address: &str) -> Option<String> {
    let inner = match (address.rfind('<'), address.rfind('>')) {
        (Some(open), Some(close)) if open < close => &address[open + 1..close],
        _ => address,
    };
    let (local, domain) = inner.trim().rsplit_once('@')?;
    (!local.is_empty() && domain.contains('.') && !domain.contains(char::is_whitespace))
        .then(|| domain.to_ascii_lowercase())
}

/// Adds a message, naming its key, for each problem of `[operators]` and of the templates'
/// `audience` and `fallback_from`: only operator templates may fall back, to a sender of
/// another domain than the one refused, and no campaign may mail customers from one.
pub(super) fn validate(config: &super::Config, errors: &mut Vec<String>) {
    check(&config.operators, &config.templates, &config.campaigns, &config.resend.from, errors);
}

fn check(
    operators: &OperatorsConfig,
    templates: &BTreeMap<String, TemplateConfig>,
    campaigns: &[CampaignConfig],
    from: &str,
    errors: &mut Vec<String>,
) {
    for (i, a) in operators.to.iter().enumerate() {
        let plain = !a.contains(|c: char| c.is_whitespace() || c == '<' || c == '>' || c == ',');
        if !plain || domain(a).is_none() {
            errors.push(format!("operators.to[{i}]: must be a plain address such as \"oncall@acme.example\""));
        }
    }
    for (name, t) in templates {
        let at = format!("templates.{name}");
        if t.audience == Audience::Operators && operators.to.is_empty() {
            errors.push(format!(
                "{at}.audience: \"operators\", but [operators] to lists no address: operator mail could go nowhere"
            ));
        }
        let Some(fallback) = &t.fallback_from else { continue };
        if t.audience != Audience::Operators {
            errors.push(format!(
                "{at}.fallback_from: only a template with audience = \"operators\" may name a fallback sender: \
                 customer mail is never sent from a sender it was not meant to come from, and a refused sender \
                 fails it (sender_rejected) so the broken domain is seen"
            ));
            continue;
        }
        match (domain(fallback), domain(from)) {
            (None, _) => errors.push(format!("{at}.fallback_from: must be an address (got {fallback:?})")),
            (Some(f), Some(d)) if f == d => errors.push(format!(
                "{at}.fallback_from: is in the domain of resend.from ({d}): a domain Resend refuses refuses both"
            )),
            _ => {}
        }
    }
    for (i, c) in campaigns.iter().enumerate() {
        if templates.get(&c.template).is_some_and(|t| t.audience == Audience::Operators) {
            errors.push(format!(
                "campaign[{i}].template: {:?} is an operator template (audience = \"operators\"); a campaign \
                 mails subscribers",
                c.template
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operator_template(fallback: Option<&str>) -> TemplateConfig {
        let mut t = TemplateConfig::new("s".into(), "h".into(), "t".into());
        t.audience = Audience::Operators;
        t.fallback_from = fallback.map(str::to_string);
        t
    }

    #[test]
    fn addresses_are_compared_trimmed_and_case_folded() {
        let ops = OperatorsConfig { to: vec!["OnCall@Acme.example".into()] };
        assert!(ops.includes(" oncall@acme.example"));
        assert!(!ops.includes("someone@acme.example"));
        assert_eq!(domain("Acme <a@Mail.Acme.example>").as_deref(), Some("mail.acme.example"));
        assert_eq!(domain("nobody"), None);
    }

    #[test]
    fn a_fallback_sender_is_for_operator_mail_only_and_in_another_domain() {
        let ops = OperatorsConfig { to: vec!["oncall@acme.example".into()] };
        let from = "Acme <digest@acme.example>";
        let check = |templates: BTreeMap<String, TemplateConfig>, ops: &OperatorsConfig| {
            let mut errors = Vec::new();
            super::check(ops, &templates, &[], from, &mut errors);
            errors
        };
        let ok = BTreeMap::from([("alert".to_string(), operator_template(Some("alerts@fallback.example")))]);
        assert!(check(ok.clone(), &ops).is_empty());

        let mut customer = operator_template(Some("alerts@fallback.example"));
        customer.audience = Audience::Customers;
        let errors = check(BTreeMap::from([("receipt".to_string(), customer)]), &ops);
        assert!(errors[0].starts_with("templates.receipt.fallback_from: only a template with audience"), "{errors:?}");

        let same = BTreeMap::from([("alert".to_string(), operator_template(Some("Ops <ops@ACME.example>")))]);
        assert!(check(same, &ops)[0].contains("in the domain of resend.from"));
        let bad = BTreeMap::from([("alert".to_string(), operator_template(Some("nobody")))]);
        assert!(check(bad, &ops)[0].contains("must be an address"));

        let errors = check(ok, &OperatorsConfig::default());
        assert!(errors[0].contains("[operators] to lists no address"), "{errors:?}");
        let errors = check(BTreeMap::new(), &OperatorsConfig { to: vec!["Ops <ops@acme.example>".into()] });
        assert!(errors[0].starts_with("operators.to[0]"), "{errors:?}");
    }
}
