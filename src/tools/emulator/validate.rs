//! Resend's rules for a request, as far as mailstream relies on them: the
//! headers (User-Agent, an API key that looks like one), the email object
//! (`from`, `to`, `subject`, batch-only restrictions, refused test domains),
//! attachments (each a `filename` and base64 `content` or a `path` to fetch, at most
//! 40 MB of encoded content an email, none in a batch), and errors written the way
//! Resend writes them.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
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

/// A list endpoint's `limit`: 1 to `most`, else 422 as Resend answers it.
pub(crate) fn list_limit(value: &str, most: usize) -> Result<usize, ApiError> {
    let message = format!("The `limit` must be a number between 1 and {most}.");
    value.parse().ok().filter(|n| (1..=most).contains(n)).ok_or_else(|| ApiError::new(422, "validation_error", message))
}

/// The recipients and subject of an email that passed validation, and what it attaches.
pub(crate) struct Recipients {
    pub to: Vec<String>,
    pub subject: String,
    /// Its attachments, `path` ones included.
    pub attachments: u64,
    /// The decoded bytes of their `content` (a `path` one counts 0: nothing is fetched).
    pub attachment_bytes: u64,
}

/// The most base64 an email's attachments may hold, all `content` strings together
/// (Resend's "40MB" after encoding, read as decimal megabytes: a client under it is
/// under Resend's limit whichever way Resend counts).
pub(crate) const MAX_ATTACHED: usize = 40_000_000;

/// Refuses a batch any of whose emails carries attachments: Resend's batch endpoint does
/// not take them, and refuses the whole request (permissive validation or not) rather
/// than sending the emails without their files. An `attachments` that is null or an
/// empty array attaches nothing, so it passes.
pub(crate) fn batch_without_attachments(emails: &[Value]) -> Result<(), ApiError> {
    let carries = |e: &Value| match e.get("attachments") {
        None | Some(Value::Null) => false,
        Some(Value::Array(items)) => !items.is_empty(),
        Some(_) => true,
    };
    if emails.iter().any(carries) {
        return Err(ApiError::new(422, "validation_error", "Attachments are not supported in the batch endpoint."));
    }
    Ok(())
}

/// An email's `attachments` (absent or null: none), as (count, decoded bytes). Messages
/// name the attachment by index and never quote its content.
fn attachments(field: Option<&Value>) -> Result<(u64, u64), ApiError> {
    let invalid = |message: String| ApiError::new(422, "validation_error", message);
    let items = match field {
        None | Some(Value::Null) => return Ok((0, 0)),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid("The `attachments` field must be an array.".into())),
    };
    // The shape of every item first, then the size, then the base64: an oversized email
    // is refused before megabytes are decoded.
    let mut contents = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let item = item.as_object().ok_or_else(|| invalid(format!("`attachments[{i}]` must be an object.")))?;
        let present = |name: &str| item.get(name).filter(|v| !v.is_null());
        if present("filename").and_then(Value::as_str).is_none_or(str::is_empty) {
            return Err(invalid(format!("`attachments[{i}].filename` is missing or empty.")));
        }
        for name in ["content_type", "content_id"] {
            if present(name).is_some_and(|v| !v.is_string()) {
                return Err(invalid(format!("`attachments[{i}].{name}` must be a string.")));
            }
        }
        let content = present("content");
        let path = present("path");
        if path.is_some_and(|p| p.as_str().is_none_or(str::is_empty)) {
            return Err(invalid(format!("`attachments[{i}].path` must be a URL.")));
        }
        match content {
            Some(Value::String(c)) => contents.push((i, c.as_str())),
            Some(_) => return Err(not_base64(i)),
            None if path.is_some() => {}
            None => return Err(invalid(format!("`attachments[{i}]` needs a `content` or a `path`."))),
        }
    }
    let encoded: usize = contents.iter().map(|(_, c)| c.len()).sum();
    if encoded > MAX_ATTACHED {
        return Err(invalid(format!(
            "The email is too large: its attachments come to {encoded} bytes after base64 encoding, \
             above the limit of 40 MB ({MAX_ATTACHED} bytes)."
        )));
    }
    let mut bytes = 0;
    for (i, content) in contents {
        bytes += decoded_len(content).ok_or_else(|| not_base64(i))?;
    }
    Ok((items.len() as u64, bytes))
}

/// The refusal of attachment `i`'s `content`: not a string of standard, padded base64.
fn not_base64(i: usize) -> ApiError {
    ApiError::new(
        422,
        "validation_error",
        format!("`attachments[{i}].content` is not valid base64 (the standard alphabet, padded)."),
    )
}

/// The bytes `content` decodes to when it is standard, padded base64; `None` otherwise.
/// Decoded a slice at a time into a small buffer: only validity and length are wanted, not
/// a copy of the file.
fn decoded_len(content: &str) -> Option<u64> {
    const CHUNK: usize = 4 * 1024;
    let bytes = content.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = [0u8; CHUNK / 4 * 3];
    let last = bytes.len().div_ceil(CHUNK).saturating_sub(1);
    let mut total = 0u64;
    for (n, chunk) in bytes.chunks(CHUNK).enumerate() {
        // Each slice decodes alone, so padding ending a slice that is not the last would
        // pass: it is padding in the middle of the content.
        if n != last && chunk.contains(&b'=') {
            return None;
        }
        total += STANDARD.decode_slice(chunk, &mut out).ok()? as u64;
    }
    Some(total)
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
    // A batch's attachments were refused for the whole request (`batch_without_attachments`);
    // any left attach nothing.
    if batch && obj.contains_key("scheduled_at") {
        return Err(ApiError::new(422, "validation_error", "`scheduled_at` is not supported in batch emails."));
    }
    let (attachments, attachment_bytes) = if batch { (0, 0) } else { attachments(obj.get("attachments"))? };
    Ok(Recipients {
        to: to.iter().map(|a| bare_address(a).to_ascii_lowercase()).collect(),
        subject: subject.to_string(),
        attachments,
        attachment_bytes,
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

    fn with_attachments(attachments: Value) -> Value {
        json!({"from": "a@acme.example", "to": "u@resend.dev", "subject": "s", "attachments": attachments})
    }

    /// The message of the refusal of a single email with these attachments.
    fn refused(attachments: Value) -> String {
        let e = email(&with_attachments(attachments), false, &Faults::default()).err().expect("refused");
        assert_eq!((e.status.as_u16(), e.name), (422, "validation_error"));
        e.message
    }

    #[test]
    fn attachments_are_counted_with_their_decoded_bytes() {
        let faults = Faults::default();
        let files = json!([
            {"filename": "a.txt", "content": STANDARD.encode(b"hello"), "content_type": "text/plain"},
            {"filename": "b.pdf", "path": "https://files.acme.example/b.pdf"},
            {"filename": "c.png", "content": STANDARD.encode([0u8; 4]), "content_id": "logo", "path": null},
            {"filename": "empty", "content": ""},
        ]);
        let r = email(&with_attachments(files), false, &faults).unwrap();
        assert_eq!((r.attachments, r.attachment_bytes), (4, 9), "a path counts, with 0 bytes");
        for none in [json!(null), json!([])] {
            let r = email(&with_attachments(none), false, &faults).unwrap();
            assert_eq!((r.attachments, r.attachment_bytes), (0, 0));
        }
    }

    #[test]
    fn bad_attachments_are_refused_by_name_without_their_content() {
        let content = STANDARD.encode(b"secret");
        let cases = [
            (json!({"filename": "a"}), "The `attachments` field must be an array."),
            (json!(["a"]), "`attachments[0]` must be an object."),
            (json!([{"content": content}]), "`attachments[0].filename` is missing or empty."),
            (json!([{"filename": "", "content": content}]), "`attachments[0].filename` is missing or empty."),
            (json!([{"filename": 7, "content": content}]), "`attachments[0].filename` is missing or empty."),
            (json!([{"filename": "a"}]), "`attachments[0]` needs a `content` or a `path`."),
            (json!([{"filename": "a", "content": null}]), "`attachments[0]` needs a `content` or a `path`."),
            (json!([{"filename": "a", "path": ""}]), "`attachments[0].path` must be a URL."),
            (
                json!([{"filename": "a", "content": content, "content_type": 1}]),
                "`attachments[0].content_type` must be a string.",
            ),
            (
                json!([{"filename": "a", "content": [1, 2]}]),
                "`attachments[0].content` is not valid base64 (the standard alphabet, padded).",
            ),
        ];
        for (attachments, message) in cases {
            assert_eq!(refused(attachments.clone()), message, "{attachments}");
        }
        let ok = json!({"filename": "ok", "content": content});
        for bad in ["c2VjcmV", "c2VjcmV0!!!!", "c2V cmV0", "c2VjcmV0IQ", "c2V_cmV0", "AB==AAAA", "QR=="] {
            let message = refused(json!([ok, {"filename": "bad", "content": bad}]));
            assert_eq!(message, "`attachments[1].content` is not valid base64 (the standard alphabet, padded).");
        }
    }

    #[test]
    fn decoding_checks_padding_across_its_slices() {
        let file: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let encoded = STANDARD.encode(&file);
        assert_eq!(decoded_len(&encoded), Some(10_000));
        // Padding that ends the first 4 KB slice is in the middle of the content.
        let mut early = STANDARD.encode(&file[..3071]);
        assert!(early.ends_with('=') && early.len() == 4096);
        early.push_str(&STANDARD.encode(b"more"));
        assert_eq!(decoded_len(&early), None);
        assert_eq!(decoded_len(""), Some(0));
    }

    #[test]
    fn an_email_over_40_mb_of_encoded_attachments_is_refused() {
        let faults = Faults::default();
        let half = "A".repeat(MAX_ATTACHED / 2);
        let at_limit = json!([{"filename": "a", "content": half}, {"filename": "b", "content": half}]);
        let r = email(&with_attachments(at_limit), false, &faults).unwrap();
        assert_eq!((r.attachments, r.attachment_bytes), (2, MAX_ATTACHED as u64 / 4 * 3));
        let over = json!([{"filename": "a", "content": half}, {"filename": "b", "content": format!("{half}AAAA")}]);
        let message = refused(over);
        assert!(message.contains("40000004 bytes") && message.contains("40 MB"), "{message}");
    }

    #[test]
    fn a_batch_carrying_attachments_is_refused_whole() {
        let plain = json!({"from": "a@acme.example", "to": "u@resend.dev", "subject": "s"});
        let file = json!([{"filename": "a", "path": "https://files.acme.example/a"}]);
        let e = batch_without_attachments(&[plain.clone(), with_attachments(file)]).unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.name, e.message.as_str()),
            (422, "validation_error", "Attachments are not supported in the batch endpoint.")
        );
        assert!(batch_without_attachments(&[with_attachments(json!("x"))]).is_err());
        let nothing = [plain, with_attachments(json!([])), with_attachments(json!(null))];
        assert!(batch_without_attachments(&nothing).is_ok(), "nothing attached");
    }
}
