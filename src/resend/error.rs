//! Classifying Resend's errors into what to do next. By error *name* first (the
//! same name appears under several statuses, and docs and SDK disagree on some
//! statuses); the status only decides for names we do not know.

use std::time::Duration;

use crate::model::error_name::ErrorName;
use crate::model::names::names;

names! {
    /// What the caller does with a failed request.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Action {
        /// Try again later with the same key and body.
        Retryable = "retryable",
        /// A daily or monthly quota is used up: pause all sending until it renews.
        QuotaExhausted = "quota_exhausted",
        /// The sender (from address or its domain) was refused.
        SenderRejected = "sender_rejected",
        /// Retrying cannot help.
        Fatal = "fatal",
    }
}

/// Decides the action for an error `name` and `status` (the message only tells
/// whether a `validation_error` is about the sender).
fn classify(name: &ErrorName, status: Option<u16>, message: &str) -> Action {
    use ErrorName as N;
    match name {
        N::RateLimitExceeded
        | N::ApplicationError
        | N::InternalServerError
        | N::ConcurrentIdempotentRequests
        | N::Timeout
        | N::ConnectionFailed
        | N::ConnectionError => Action::Retryable,
        N::DailyQuotaExceeded | N::MonthlyQuotaExceeded => Action::QuotaExhausted,
        N::InvalidFromAddress => Action::SenderRejected,
        N::ValidationError if status == Some(403) || is_about_sender(message) => Action::SenderRejected,
        N::ValidationError
        | N::InvalidIdempotencyKey
        | N::InvalidIdempotentRequest
        | N::MissingApiKey
        | N::RestrictedApiKey
        | N::InvalidApiKey
        | N::NotFound
        | N::MethodNotAllowed
        | N::InvalidAttachment
        | N::InvalidAccess
        | N::InvalidParameter
        | N::InvalidRegion
        | N::MissingRequiredField
        | N::SecurityError
        | N::UnexpectedResponse => Action::Fatal,
        // Unknown or missing names: only the status can tell.
        N::Http(_) | N::Other(_) => match status {
            Some(429) | Some(500..=599) => Action::Retryable,
            _ => Action::Fatal,
        },
    }
}

/// Whether a validation message is about the sender (`from`, its domain).
fn is_about_sender(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("`from`") || m.contains("from address") || m.contains("domain") || m.contains("sender")
}

/// A request that did not deliver its batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name} ({}, status {status:?})", action.as_str())]
pub struct ProviderError {
    pub action: Action,
    /// Resend's error name, or one of mailstream's for failures without an answer.
    pub name: ErrorName,
    pub status: Option<u16>,
    /// From `retry-after` (or `ratelimit-reset` on a 429).
    pub retry_after: Option<Duration>,
    /// Whether the provider may have processed the request (so a resend must reuse the key):
    /// a 5xx may come after the email left; any other answer is about this request.
    pub maybe_sent: bool,
    /// What Resend said (its `message`), addresses masked, at most `SAID_MAX` characters:
    /// `validation_error` alone does not say that the sender's domain was refused.
    pub said: Option<String>,
}

/// The longest message kept of an answer.
const SAID_MAX: usize = 300;

/// What is kept of a provider's message: addresses masked, at most `SAID_MAX`
/// characters, `None` when it says nothing.
pub(crate) fn said(message: &str) -> Option<String> {
    Some(mask_addresses(message.trim()).chars().take(SAID_MAX).collect::<String>()).filter(|s| !s.is_empty())
}

/// An address as logs and pages show one: its first character and its domain
/// (`a***@acme.example`).
pub(crate) fn mask(address: &str) -> String {
    match address.split_once('@') {
        Some((local, domain)) => format!("{}***@{domain}", local.chars().next().unwrap_or('*')),
        None => "***".to_string(),
    }
}

/// `text` with every address in it masked ([`mask`]).
pub(crate) fn mask_addresses(text: &str) -> String {
    let separator = |c: char| c.is_whitespace() || "<>\"'(),;[]`".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        match word.split_once('@') {
            Some((_, domain)) if !domain.is_empty() => out.push_str(&mask(word)),
            _ => out.push_str(word),
        }
        word.clear();
    };
    for c in text.chars() {
        if separator(c) {
            flush(&mut word, &mut out);
            out.push(c);
        } else {
            word.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

impl ProviderError {
    /// Whether it says the provider, not this batch, is in trouble: no connection, no
    /// answer in time, a broken one, or a 5xx (a run of these puts the provider down).
    pub(crate) fn says_provider_down(&self) -> bool {
        self.is_connection() || self.name == ErrorName::Timeout || self.status.is_some_and(|s| s >= 500)
    }

    /// A connection that could not be made, or broke: no batch can have caused it.
    pub(crate) fn is_connection(&self) -> bool {
        matches!(self.name, ErrorName::ConnectionFailed | ErrorName::ConnectionError)
    }

    /// An error answered by Resend with a JSON body (or without one).
    pub(crate) fn from_response(status: u16, name: Option<&str>, message: &str, retry_after: Option<Duration>) -> Self {
        let name = ErrorName::from_answer(name, status);
        ProviderError {
            action: classify(&name, Some(status), message),
            maybe_sent: status >= 500 || name == ErrorName::ConcurrentIdempotentRequests,
            name,
            status: Some(status),
            retry_after,
            said: said(message),
        }
    }

    /// A failure with no answer from Resend.
    pub fn local(name: ErrorName, maybe_sent: bool) -> Self {
        ProviderError {
            action: classify(&name, None, ""),
            name,
            status: None,
            retry_after: None,
            maybe_sent,
            said: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Classifies as an answer would: a name if there is one, else only the status.
    fn class(name: Option<&str>, status: Option<u16>, message: &str) -> Action {
        let name = name.map_or(ErrorName::Http(status.unwrap_or(0)), ErrorName::parse);
        classify(&name, status, message)
    }

    #[test]
    fn what_resend_said_is_kept_with_every_address_masked() {
        let e = ProviderError::from_response(
            422,
            Some("validation_error"),
            "Invalid `to` field: ann.b@acme.example, <bo@x.example>. The acme.example domain is not verified.",
            None,
        );
        let said = e.said.unwrap();
        assert_eq!(
            said,
            "Invalid `to` field: a***@acme.example, <b***@x.example>. The acme.example domain is not verified."
        );
        let long = ProviderError::from_response(422, Some("validation_error"), &"x".repeat(1000), None);
        assert_eq!(long.said.unwrap().len(), SAID_MAX);
        assert_eq!(ProviderError::from_response(500, None, " ", None).said, None);
    }

    /// Every (status, name) of RESEND.md's table, and what it must become.
    #[test]
    fn every_documented_name() {
        let table: &[(u16, &str, Action)] = &[
            (400, "invalid_idempotency_key", Action::Fatal),
            (400, "validation_error", Action::Fatal),
            (401, "missing_api_key", Action::Fatal),
            (401, "restricted_api_key", Action::Fatal),
            (401, "validation_error", Action::Fatal),
            (403, "invalid_api_key", Action::Fatal),
            (403, "validation_error", Action::SenderRejected),
            (404, "not_found", Action::Fatal),
            (405, "method_not_allowed", Action::Fatal),
            (409, "invalid_idempotent_request", Action::Fatal),
            (409, "concurrent_idempotent_requests", Action::Retryable),
            (422, "invalid_attachment", Action::Fatal),
            (422, "invalid_from_address", Action::SenderRejected),
            (403, "invalid_from_address", Action::SenderRejected),
            (422, "invalid_access", Action::Fatal),
            (422, "invalid_parameter", Action::Fatal),
            (422, "invalid_region", Action::Fatal),
            (422, "missing_required_field", Action::Fatal),
            (429, "rate_limit_exceeded", Action::Retryable),
            (429, "daily_quota_exceeded", Action::QuotaExhausted),
            (429, "monthly_quota_exceeded", Action::QuotaExhausted),
            (451, "security_error", Action::Fatal),
            (500, "application_error", Action::Retryable),
            (500, "internal_server_error", Action::Retryable),
        ];
        for &(status, name, want) in table {
            assert_eq!(class(Some(name), Some(status), "x"), want, "{status} {name}");
        }
    }

    #[test]
    fn name_wins_over_status() {
        // A known fatal name under a 5xx stays fatal; a retryable name under 400 stays retryable.
        assert_eq!(class(Some("invalid_api_key"), Some(503), ""), Action::Fatal);
        assert_eq!(class(Some("rate_limit_exceeded"), Some(400), ""), Action::Retryable);
    }

    #[test]
    fn validation_error_about_the_sender() {
        let msg = "The `from` field must be a valid email address";
        assert_eq!(class(Some("validation_error"), Some(422), msg), Action::SenderRejected);
        let msg = "The acme.example domain is not verified.";
        assert_eq!(class(Some("validation_error"), Some(422), msg), Action::SenderRejected);
        let msg = "The `to` field is missing.";
        assert_eq!(class(Some("validation_error"), Some(422), msg), Action::Fatal);
    }

    #[test]
    fn unknown_names_fall_back_to_status() {
        assert_eq!(class(Some("brand_new_error"), Some(429), ""), Action::Retryable);
        assert_eq!(class(Some("brand_new_error"), Some(502), ""), Action::Retryable);
        assert_eq!(class(Some("brand_new_error"), Some(418), ""), Action::Fatal);
        assert_eq!(class(Some("brand_new_error"), None, ""), Action::Fatal);
        assert_eq!(class(None, Some(503), ""), Action::Retryable);
        assert_eq!(class(None, Some(400), ""), Action::Fatal);
        assert_eq!(class(None, None, ""), Action::Fatal);
    }

    #[test]
    fn local_failures_are_retryable() {
        for name in [ErrorName::Timeout, ErrorName::ConnectionFailed, ErrorName::ConnectionError] {
            assert_eq!(ProviderError::local(name, true).action, Action::Retryable);
        }
        assert_eq!(ProviderError::local(ErrorName::UnexpectedResponse, true).action, Action::Fatal);
    }

    #[test]
    fn names_stay_bounded() {
        let e = ProviderError::from_response(502, Some("<html>Bad Gateway</html>"), "", None);
        assert_eq!(e.name, ErrorName::Http(502));
        assert_eq!(e.name.as_str(), "http_502");
        assert!(e.maybe_sent);
        let e = ProviderError::from_response(422, Some("validation_error"), "", None);
        assert!(!e.maybe_sent);
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_labelled_other() {
        for name in ErrorName::KNOWN {
            assert_eq!(ErrorName::parse(name.as_str()), name);
        }
        assert_eq!(ErrorName::parse("http_503"), ErrorName::Http(503));
        let new = ErrorName::parse("brand_new_error");
        assert_eq!((new.as_str(), new.label()), ("brand_new_error", "other"));
    }
}
