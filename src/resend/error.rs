//! Classifying Resend's errors into what to do next. By error *name* first (the
//! same name appears under several statuses, and docs and SDK disagree on some
//! statuses); the status only decides for names we do not know.

use std::time::Duration;

/// What the caller does with a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Try again later with the same key and body.
    Retryable,
    /// A daily or monthly quota is used up: pause all sending until it renews.
    QuotaExhausted,
    /// The sender (from address or its domain) was refused.
    SenderRejected,
    /// Retrying cannot help.
    Fatal,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retryable => "retryable",
            Action::QuotaExhausted => "quota_exhausted",
            Action::SenderRejected => "sender_rejected",
            Action::Fatal => "fatal",
        }
    }
}

/// Names mailstream gives to failures that never reached a Resend answer.
pub mod local {
    /// The request did not complete within `resend.timeout_seconds`.
    pub const TIMEOUT: &str = "timeout";
    /// No connection could be made: nothing was sent.
    pub const CONNECT: &str = "connection_failed";
    /// The connection broke after the request may have been written.
    pub const TRANSPORT: &str = "connection_error";
    /// A 2xx answer that could not be matched to the request.
    pub const UNEXPECTED: &str = "unexpected_response";
}

/// Decides the action for an error `name` (if the body had one) and `status`.
pub fn classify(name: Option<&str>, status: Option<u16>, message: &str) -> Action {
    match name {
        Some(
            "rate_limit_exceeded"
            | "application_error"
            | "internal_server_error"
            | "concurrent_idempotent_requests"
            | local::TIMEOUT
            | local::CONNECT
            | local::TRANSPORT,
        ) => Action::Retryable,
        Some("daily_quota_exceeded" | "monthly_quota_exceeded") => Action::QuotaExhausted,
        Some("invalid_from_address") => Action::SenderRejected,
        Some("validation_error") if status == Some(403) || is_about_sender(message) => Action::SenderRejected,
        Some(
            "validation_error"
            | "invalid_idempotency_key"
            | "invalid_idempotent_request"
            | "missing_api_key"
            | "restricted_api_key"
            | "invalid_api_key"
            | "not_found"
            | "method_not_allowed"
            | "invalid_attachment"
            | "invalid_access"
            | "invalid_parameter"
            | "invalid_region"
            | "missing_required_field"
            | "security_error"
            | local::UNEXPECTED,
        ) => Action::Fatal,
        // Unknown or missing names: only the status can tell.
        _ => match status {
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
    /// Resend's error name, or one of [`local`]'s. Bounded: safe as a metric label.
    pub name: String,
    pub status: Option<u16>,
    /// From `retry-after` (or `ratelimit-reset` on a 429).
    pub retry_after: Option<Duration>,
    /// Whether the provider may have processed the request (so a resend must reuse the key).
    pub maybe_sent: bool,
}

impl ProviderError {
    /// An error answered by Resend with a JSON body (or without one).
    pub fn from_response(status: u16, name: Option<&str>, message: &str, retry_after: Option<Duration>) -> Self {
        let action = classify(name, Some(status), message);
        ProviderError {
            action,
            name: bounded_name(name, status),
            status: Some(status),
            retry_after,
            // A 5xx may come after the email left; anything else is an answer about this request.
            maybe_sent: status >= 500 || name == Some("concurrent_idempotent_requests"),
        }
    }

    /// A failure with no answer from Resend.
    pub fn local(name: &'static str, maybe_sent: bool) -> Self {
        ProviderError {
            action: classify(Some(name), None, ""),
            name: name.to_string(),
            status: None,
            retry_after: None,
            maybe_sent,
        }
    }
}

/// Error names become metric labels and log fields: keep them short and plain, or
/// fall back to `http_<status>`.
fn bounded_name(name: Option<&str>, status: u16) -> String {
    match name {
        Some(n) if !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') => {
            n.to_string()
        }
        _ => format!("http_{status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(classify(Some(name), Some(status), "x"), want, "{status} {name}");
        }
    }

    #[test]
    fn name_wins_over_status() {
        // A known fatal name under a 5xx stays fatal; a retryable name under 400 stays retryable.
        assert_eq!(classify(Some("invalid_api_key"), Some(503), ""), Action::Fatal);
        assert_eq!(classify(Some("rate_limit_exceeded"), Some(400), ""), Action::Retryable);
    }

    #[test]
    fn validation_error_about_the_sender() {
        let msg = "The `from` field must be a valid email address";
        assert_eq!(classify(Some("validation_error"), Some(422), msg), Action::SenderRejected);
        let msg = "The acme.example domain is not verified.";
        assert_eq!(classify(Some("validation_error"), Some(422), msg), Action::SenderRejected);
        let msg = "The `to` field is missing.";
        assert_eq!(classify(Some("validation_error"), Some(422), msg), Action::Fatal);
    }

    #[test]
    fn unknown_names_fall_back_to_status() {
        assert_eq!(classify(Some("brand_new_error"), Some(429), ""), Action::Retryable);
        assert_eq!(classify(Some("brand_new_error"), Some(502), ""), Action::Retryable);
        assert_eq!(classify(Some("brand_new_error"), Some(418), ""), Action::Fatal);
        assert_eq!(classify(Some("brand_new_error"), None, ""), Action::Fatal);
        assert_eq!(classify(None, Some(503), ""), Action::Retryable);
        assert_eq!(classify(None, Some(400), ""), Action::Fatal);
        assert_eq!(classify(None, None, ""), Action::Fatal);
    }

    #[test]
    fn local_failures_are_retryable() {
        for name in [local::TIMEOUT, local::CONNECT, local::TRANSPORT] {
            assert_eq!(ProviderError::local(name, true).action, Action::Retryable);
        }
        assert_eq!(ProviderError::local(local::UNEXPECTED, true).action, Action::Fatal);
    }

    #[test]
    fn names_stay_bounded() {
        let e = ProviderError::from_response(502, Some("<html>Bad Gateway</html>"), "", None);
        assert_eq!(e.name, "http_502");
        assert!(e.maybe_sent);
        let e = ProviderError::from_response(422, Some("validation_error"), "", None);
        assert!(!e.maybe_sent);
    }
}
