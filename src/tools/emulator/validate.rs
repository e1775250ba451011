//! Resend's rules for a request, as far as mailstream relies on them: the
//! headers (User-Agent, an API key that looks like one), the email object
//! (`from`, `to`, `subject`, batch-only restrictions, refused test domains),
//! and errors written the way Resend writes them.

use hyper::StatusCode;
use serde_json::{Value, json};

use super::faults::Faults;
use crate::http::server::{self, HttpRequest, HttpResponse};

/// A refusal, written the way Resend writes errors.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub name: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, name: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::from_u16(status).expect("valid status"), name, message: message.into() }
    }

    /// 429 `rate_limit_exceeded`: over the team's requests per second.
    pub fn rate_limited() -> ApiError {
        ApiError::new(
            429,
            "rate_limit_exceeded",
            "Too many requests. You can only make a limited number of requests per second.",
        )
    }

    pub fn concurrent() -> ApiError {
        ApiError::new(
            409,
            "concurrent_idempotent_requests",
            "Same idempotency key used while the original request is still in progress.",
        )
    }

    /// `{statusCode, name, message}`, with `retry-after` when given.
    pub fn response(&self, retry_after: Option<u64>) -> HttpResponse {
        let body = json!({ "statusCode": self.status.as_u16(), "name": self.name, "message": self.message });
        let mut response = server::json(self.status, &body);
        if let Some(after) = retry_after {
            response.headers_mut().insert("retry-after", after.into());
        }
        response
    }
}

/// Whether `key` looks like a Resend API key: `re_` and a plain token.
fn looks_like_a_key(key: &str) -> bool {
    key.len() > 3
        && key.len() <= 128
        && key.starts_with("re_")
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A field that takes one address or several, as an array (empty when absent).
pub(super) fn addresses(field: Option<&Value>) -> Vec<String> {
    match field {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    }
}

/// The User-Agent and the API key: `allowed`, when given, is the one key
/// accepted; otherwise any key that looks like a Resend key (`re_…`) is.
pub(crate) fn check_headers(req: &HttpRequest, allowed: Option<&str>) -> Result<(), ApiError> {
    let h = req.headers();
    if h.get(hyper::header::USER_AGENT).is_none_or(|v| v.is_empty()) {
        return Err(ApiError::new(403, "missing_user_agent", "A User-Agent header is required."));
    }
    let token = Some(crate::http::server::bearer(req)).filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err(ApiError::new(401, "missing_api_key", "Missing API key in the authorization header."));
    };
    let ok = match allowed {
        Some(want) => token == want,
        None => looks_like_a_key(token),
    };
    if ok { Ok(()) } else { Err(ApiError::new(403, "invalid_api_key", "API key is invalid.")) }
}

/// The recipients and subject of an email that passed validation.
pub(crate) struct Recipients {
    pub to: Vec<String>,
    pub subject: String,
}

/// Resend's per-email rules.
pub(crate) fn email(email: &Value, batch: bool, faults: &Faults) -> Result<Recipients, ApiError> {
    let missing =
        |field: &str| ApiError::new(422, "missing_required_field", format!("The `{field}` field is missing."));
    let obj =
        email.as_object().ok_or_else(|| ApiError::new(422, "validation_error", "Each email must be an object."))?;
    let from = obj.get("from").and_then(Value::as_str).ok_or_else(|| missing("from"))?;
    let from_addr = bare_address(from);
    if !is_address(from_addr) {
        return Err(ApiError::new(422, "invalid_from_address", "Invalid `from` field."));
    }
    let from_domain = from_addr.rsplit('@').next().unwrap_or("");
    if faults.rejected_sender_domains.iter().any(|d| d.eq_ignore_ascii_case(from_domain)) {
        return Err(ApiError::new(
            403,
            "validation_error",
            format!("The {from_domain} domain is not verified. Please, add and verify your domain."),
        ));
    }
    let to = addresses(obj.get("to"));
    if to.is_empty() {
        return Err(missing("to"));
    }
    if to.len() > 50 {
        return Err(ApiError::new(422, "validation_error", "The `to` field holds at most 50 addresses."));
    }
    for addr in &to {
        let bare = bare_address(addr);
        if !is_address(bare) {
            return Err(ApiError::new(
                422,
                "validation_error",
                "Invalid `to` field. The email address needs to follow the `email@example.com` or `Name <email@example.com>` format.",
            ));
        }
        let domain = bare.rsplit('@').next().unwrap_or("").to_ascii_lowercase();
        if domain == "example.com" || domain == "test.com" {
            return Err(ApiError::new(
                422,
                "validation_error",
                format!("The {domain} domain is not allowed. Use resend.dev test addresses instead."),
            ));
        }
    }
    let subject = obj.get("subject").and_then(Value::as_str).ok_or_else(|| missing("subject"))?;
    if batch && (obj.contains_key("attachments") || obj.contains_key("scheduled_at")) {
        return Err(ApiError::new(
            422,
            "validation_error",
            "`attachments` and `scheduled_at` are not supported in batch emails.",
        ));
    }
    Ok(Recipients {
        to: to.iter().map(|a| bare_address(a).to_ascii_lowercase()).collect(),
        subject: subject.to_string(),
    })
}

/// `Name <a@b>` → `a@b`.
pub(crate) fn bare_address(s: &str) -> &str {
    match (s.rfind('<'), s.rfind('>')) {
        (Some(open), Some(close)) if open < close => s[open + 1..close].trim(),
        _ => s.trim(),
    }
}

/// Whether `s` is a bare address (`local@domain.tld`, no spaces).
pub(crate) fn is_address(s: &str) -> bool {
    match s.split_once('@') {
        Some((local, domain)) => {
            !local.is_empty()
                && domain.contains('.')
                && !domain.starts_with('.')
                && !domain.ends_with('.')
                && !s.contains(char::is_whitespace)
                && !domain.contains('@')
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_look_like_resend_keys() {
        assert!(looks_like_a_key("re_123abc_XYZ"));
        for bad in ["None", "re_", "sk_live_1", "re_has space", ""] {
            assert!(!looks_like_a_key(bad), "{bad}");
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(bare_address("Acme <a@acme.example>"), "a@acme.example");
        assert!(is_address("a@b.example"));
        assert!(!is_address("a@b") && !is_address("@b.example") && !is_address("a b@c.example"));
    }
}
