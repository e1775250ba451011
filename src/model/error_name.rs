//! Resend's error names, as it writes them and as mailstream stores and labels them: every
//! name Resend documents, the names given to failures that never reached an answer,
//! `http_<status>` for an answer without a usable name, and whatever Resend may add.
//! What to do about each is `resend::error`'s business.

/// Every error name Resend documents, the names mailstream gives to failures
/// that never reached an answer, `http_<status>` for an answer without a usable
/// name, and whatever else Resend may add (kept as text, labelled `other`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ErrorName {
    InvalidIdempotencyKey,
    ValidationError,
    MissingApiKey,
    RestrictedApiKey,
    InvalidApiKey,
    NotFound,
    MethodNotAllowed,
    InvalidIdempotentRequest,
    ConcurrentIdempotentRequests,
    InvalidAttachment,
    InvalidFromAddress,
    InvalidAccess,
    InvalidParameter,
    InvalidRegion,
    MissingRequiredField,
    RateLimitExceeded,
    DailyQuotaExceeded,
    MonthlyQuotaExceeded,
    SecurityError,
    ApplicationError,
    InternalServerError,
    /// The request did not complete within `resend.timeout_seconds`.
    Timeout,
    /// No connection could be made: nothing was sent.
    ConnectionFailed,
    /// The connection broke after the request may have been written.
    ConnectionError,
    /// A 2xx answer that could not be matched to the request.
    UnexpectedResponse,
    /// An answer with this status and no usable name.
    Http(u16),
    /// A name Resend did not document when this was written.
    Other(String),
}

impl ErrorName {
    pub(crate) const KNOWN: [ErrorName; 25] = [
        ErrorName::InvalidIdempotencyKey,
        ErrorName::ValidationError,
        ErrorName::MissingApiKey,
        ErrorName::RestrictedApiKey,
        ErrorName::InvalidApiKey,
        ErrorName::NotFound,
        ErrorName::MethodNotAllowed,
        ErrorName::InvalidIdempotentRequest,
        ErrorName::ConcurrentIdempotentRequests,
        ErrorName::InvalidAttachment,
        ErrorName::InvalidFromAddress,
        ErrorName::InvalidAccess,
        ErrorName::InvalidParameter,
        ErrorName::InvalidRegion,
        ErrorName::MissingRequiredField,
        ErrorName::RateLimitExceeded,
        ErrorName::DailyQuotaExceeded,
        ErrorName::MonthlyQuotaExceeded,
        ErrorName::SecurityError,
        ErrorName::ApplicationError,
        ErrorName::InternalServerError,
        ErrorName::Timeout,
        ErrorName::ConnectionFailed,
        ErrorName::ConnectionError,
        ErrorName::UnexpectedResponse,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            ErrorName::InvalidIdempotencyKey => "invalid_idempotency_key",
            ErrorName::ValidationError => "validation_error",
            ErrorName::MissingApiKey => "missing_api_key",
            ErrorName::RestrictedApiKey => "restricted_api_key",
            ErrorName::InvalidApiKey => "invalid_api_key",
            ErrorName::NotFound => "not_found",
            ErrorName::MethodNotAllowed => "method_not_allowed",
            ErrorName::InvalidIdempotentRequest => "invalid_idempotent_request",
            ErrorName::ConcurrentIdempotentRequests => "concurrent_idempotent_requests",
            ErrorName::InvalidAttachment => "invalid_attachment",
            ErrorName::InvalidFromAddress => "invalid_from_address",
            ErrorName::InvalidAccess => "invalid_access",
            ErrorName::InvalidParameter => "invalid_parameter",
            ErrorName::InvalidRegion => "invalid_region",
            ErrorName::MissingRequiredField => "missing_required_field",
            ErrorName::RateLimitExceeded => "rate_limit_exceeded",
            ErrorName::DailyQuotaExceeded => "daily_quota_exceeded",
            ErrorName::MonthlyQuotaExceeded => "monthly_quota_exceeded",
            ErrorName::SecurityError => "security_error",
            ErrorName::ApplicationError => "application_error",
            ErrorName::InternalServerError => "internal_server_error",
            ErrorName::Timeout => "timeout",
            ErrorName::ConnectionFailed => "connection_failed",
            ErrorName::ConnectionError => "connection_error",
            ErrorName::UnexpectedResponse => "unexpected_response",
            ErrorName::Http(status) => HTTP_NAMES.get(usize::from(*status)).map_or("http_other", |s| s.as_str()),
            ErrorName::Other(name) => name,
        }
    }

    /// A bounded metric label: an undocumented name is `other`.
    pub fn label(&self) -> &str {
        match self {
            ErrorName::Other(_) => "other",
            known => known.as_str(),
        }
    }

    /// The name `s` (as Resend wrote it, or as stored in Redis).
    pub fn parse(s: &str) -> ErrorName {
        if let Some(known) = ErrorName::KNOWN.into_iter().find(|n| n.as_str() == s) {
            return known;
        }
        match s.strip_prefix("http_").and_then(|n| n.parse::<u16>().ok()) {
            Some(status) if (100..600).contains(&status) => ErrorName::Http(status),
            _ => ErrorName::Other(s.to_string()),
        }
    }

    /// The name of an error answer: its body's name if it is short and plain, else `http_<status>`.
    pub(crate) fn from_answer(name: Option<&str>, status: u16) -> ErrorName {
        match name {
            Some(n) if !n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') => {
                ErrorName::parse(n)
            }
            _ => ErrorName::Http(status),
        }
    }
}

impl std::fmt::Display for ErrorName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `http_100` … `http_599`, built once so `as_str` can lend them.
static HTTP_NAMES: std::sync::LazyLock<Vec<String>> =
    std::sync::LazyLock::new(|| (0..600).map(|s| format!("http_{s}")).collect());
