//! The Resend HTTP client: one pooled connection set, a User-Agent and a
//! timeout on every request, `POST /emails/batch` with an Idempotency-Key and
//! permissive validation, and answers turned into per-email results or a
//! classified [`ProviderError`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Deserialize;
use tokio::sync::oneshot;

use hyper_util::client::legacy::connect::HttpInfo;

use super::error::ProviderError;
use crate::config::Secret;
use crate::model::error_name::ErrorName;

/// The User-Agent every request carries (Resend answers 403 without one).
const USER_AGENT: &str = concat!("mailstream/", env!("CARGO_PKG_VERSION"));

/// One email of an accepted batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcceptedEmail {
    /// Accepted; Resend's email id.
    Sent(String),
    /// Refused by permissive validation; always named `validation_error`; what Resend
    /// said of it (addresses masked).
    Invalid(Option<String>),
}

/// Rate-limit facts from a response's headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    pub limit: Option<u32>,
    pub remaining: Option<u32>,
    pub reset: Option<Duration>,
    pub retry_after: Option<Duration>,
}

/// A batch Resend answered with 2xx.
#[derive(Debug, Clone)]
pub struct BatchAccepted {
    /// One result per email, in request order.
    pub items: Vec<AcceptedEmail>,
    pub rate: RateHeaders,
}

/// A pooled Resend client.
#[derive(Clone)]
pub struct Client {
    pub(super) http: reqwest::Client,
    batch_url: String,
    /// `POST /emails`: one email a request, the only endpoint that takes attachments.
    emails_url: String,
    /// The API's root (`https://api.resend.com`), without a trailing slash.
    pub(super) base_url: String,
    pub(super) api_key: Secret,
    /// The connections answers came on (by local address), with when last: a request
    /// on one not seen before is the first on a new connection.
    connections: Arc<Mutex<HashMap<SocketAddr, Instant>>>,
}

/// A connection not used for this long counts as new again. A new connection that got
/// the local port of one used within this time is taken for the old one (its request
/// is stamped once, as on a warm connection): ephemeral ports cycle through tens of
/// thousands, so that needs hundreds of new connections a second.
const CONNECTION_MEMORY: Duration = Duration::from_secs(60);

/// A request body that tells when it is first read: the connection is ready (TCP, and
/// TLS with the real provider) and the request's bytes are going out.
struct OnWire {
    bytes: Option<Bytes>,
    len: u64,
    tell: Option<oneshot::Sender<()>>,
}

impl hyper::body::Body for OnWire {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(tell) = self.tell.take() {
            let _ = tell.send(());
        }
        Poll::Ready(self.bytes.take().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(if self.bytes.is_some() { self.len } else { 0 })
    }
}

impl Client {
    pub fn new(base_url: &str, api_key: Secret, timeout: Duration) -> anyhow::Result<Client> {
        install_crypto_provider();
        let http = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()?;
        Ok(Client {
            http,
            batch_url: format!("{}/emails/batch", base_url.trim_end_matches('/')),
            emails_url: format!("{}/emails", base_url.trim_end_matches('/')),
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
            connections: Arc::default(),
        })
    }

    /// Whether an answer that came on `local` (none: no answer) came on a connection that
    /// had not carried a request before: its request may have waited for the connection
    /// at the far end (a TLS handshake, an accept queue) after its bytes left here.
    fn first_on_its_connection(&self, local: Option<SocketAddr>) -> bool {
        let Some(local) = local else { return true };
        let now = Instant::now();
        let mut seen = self.connections.lock().expect("connections lock");
        if seen.len() > 256 {
            seen.retain(|_, last| now.duration_since(*last) < CONNECTION_MEMORY);
        }
        seen.insert(local, now).is_none_or(|last| now.duration_since(last) >= CONNECTION_MEMORY)
    }

    /// Sends one sealed batch (`count` emails in `body`) with its idempotency key.
    pub async fn send_batch(
        &self,
        idempotency_key: &str,
        body: Bytes,
        count: usize,
    ) -> Result<BatchAccepted, (ProviderError, RateHeaders)> {
        self.send_batch_telling(idempotency_key, body, count, None).await.0
    }

    /// [`Client::send_batch`], telling `on_wire` when the request's bytes can go out (its
    /// body is first read, on a ready connection). Also says whether the request was the
    /// first on its connection (or got no answer), so its arrival may have been later.
    pub async fn send_batch_telling(
        &self,
        idempotency_key: &str,
        body: Bytes,
        count: usize,
        on_wire: Option<oneshot::Sender<()>>,
    ) -> (Result<BatchAccepted, (ProviderError, RateHeaders)>, bool) {
        // A sealed body of one email with attachments goes to `POST /emails` as that email
        // (the batch endpoint refuses attachments): the same bytes every time, under the
        // same key, so Resend's idempotency holds as for a batch.
        let single = (count == 1).then(|| only_email_with_attachments(&body)).flatten();
        let alone = single.is_some();
        let (url, body) = match single {
            Some(email) => (&self.emails_url, email),
            None => (&self.batch_url, body),
        };
        let len = body.len() as u64;
        let mut request = self
            .http
            .post(url)
            .bearer_auth(self.api_key.expose())
            .header("Idempotency-Key", idempotency_key)
            .header("Content-Type", "application/json");
        if !alone {
            request = request.header("x-batch-validation", "permissive");
        }
        let sent = request.body(reqwest::Body::wrap(OnWire { bytes: Some(body), len, tell: on_wire })).send().await;
        let local = sent.as_ref().ok().and_then(|r| r.extensions().get::<HttpInfo>()).map(HttpInfo::local_addr);
        let first = self.first_on_its_connection(local);
        (read_batch(sent, count, alone).await, first)
    }
}

/// The one email of a sealed body `[email]`, when it carries attachments.
fn only_email_with_attachments(body: &Bytes) -> Option<Bytes> {
    let inner = body.strip_prefix(b"[")?.strip_suffix(b"]")?;
    let email = std::str::from_utf8(inner).ok()?;
    (email.starts_with('{') && crate::model::work::carries_attachments(email)).then(|| body.slice(1..body.len() - 1))
}

/// What the answer to a batch request says: per-email results, or the classified error.
async fn read_batch(
    sent: reqwest::Result<reqwest::Response>,
    count: usize,
    single: bool,
) -> Result<BatchAccepted, (ProviderError, RateHeaders)> {
    let response = sent.map_err(|e| (transport_error(&e), RateHeaders::default()))?;
    let status = response.status().as_u16();
    let rate = rate_headers(response.headers());
    let bytes = response.bytes().await.map_err(|e| (transport_error(&e), rate))?;
    if (200..300).contains(&status) {
        let items = if single {
            serde_json::from_slice::<IdBody>(&bytes).ok().map(|b| vec![AcceptedEmail::Sent(b.id)])
        } else {
            parse_batch_success(&bytes, count)
        };
        match items {
            Some(items) => Ok(BatchAccepted { items, rate }),
            None => Err((ProviderError::local(ErrorName::UnexpectedResponse, true), rate)),
        }
    } else {
        let body: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_default();
        let retry_after = rate.retry_after.or(if status == 429 { rate.reset } else { None });
        Err((
            ProviderError::from_response(
                status,
                body.name.as_deref(),
                body.message.as_deref().unwrap_or(""),
                retry_after,
            ),
            rate,
        ))
    }
}

/// reqwest is built without a default crypto provider (aws-lc needs cmake);
/// this installs ring, once per process, before any client is built.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub(super) fn transport_error(e: &reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::local(ErrorName::Timeout, true)
    } else if e.is_connect() {
        ProviderError::local(ErrorName::ConnectionFailed, false)
    } else {
        ProviderError::local(ErrorName::ConnectionError, true)
    }
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ErrorBody {
    pub name: Option<String>,
    pub message: Option<String>,
}

#[derive(Debug, Deserialize)]
struct BatchBody {
    #[serde(default)]
    data: Vec<Option<IdBody>>,
    #[serde(default)]
    errors: Vec<IndexError>,
}

#[derive(Debug, Deserialize)]
struct IdBody {
    id: String,
}

#[derive(Debug, Deserialize)]
struct IndexError {
    index: usize,
    #[serde(default)]
    message: Option<String>,
}

/// Maps a batch answer to per-email results. Resend lists ids in request order and
/// reports refused emails by index; `data` may either skip refused emails or hold
/// a placeholder for them, so both readings are accepted. `None` if it cannot match.
fn parse_batch_success(bytes: &[u8], count: usize) -> Option<Vec<AcceptedEmail>> {
    let body: BatchBody = serde_json::from_slice(bytes).ok()?;
    let mut refused: Vec<Option<Option<String>>> = vec![None; count];
    for e in &body.errors {
        *refused.get_mut(e.index)? = Some(e.message.as_deref().and_then(super::error::said));
    }
    let refused_n = refused.iter().filter(|r| r.is_some()).count();
    if body.data.len() == count {
        // Aligned by index.
        return body
            .data
            .into_iter()
            .zip(refused)
            .map(|(item, refused)| match (item, refused) {
                (_, Some(said)) => Some(AcceptedEmail::Invalid(said)),
                (Some(IdBody { id }), None) => Some(AcceptedEmail::Sent(id)),
                (None, None) => None,
            })
            .collect();
    }
    if body.data.len() + refused_n != count {
        return None;
    }
    let mut ids = body.data.into_iter();
    refused
        .into_iter()
        .map(|r| match r {
            Some(said) => Some(AcceptedEmail::Invalid(said)),
            None => ids.next().flatten().map(|b| AcceptedEmail::Sent(b.id)),
        })
        .collect()
}

pub(super) fn rate_headers(h: &HeaderMap) -> RateHeaders {
    let num = |name: &str| -> Option<u64> {
        h.get(name).and_then(|v: &HeaderValue| v.to_str().ok()).and_then(|s| s.trim().parse().ok())
    };
    RateHeaders {
        limit: num("ratelimit-limit").map(|n| n as u32),
        remaining: num("ratelimit-remaining").map(|n| n as u32),
        reset: num("ratelimit-reset").map(Duration::from_secs),
        retry_after: num("retry-after").map(Duration::from_secs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_single_email_with_attachments_goes_to_emails_as_itself() {
        let email =
            crate::model::work::with_attachments(r#"{"to":"a@b.example"}"#, r#"[{"filename":"x","content":""}]"#);
        let body = Bytes::from(format!("[{email}]"));
        assert_eq!(only_email_with_attachments(&body).as_deref(), Some(email.as_bytes()));
        assert_eq!(only_email_with_attachments(&Bytes::from_static(br#"[{"to":"a@b.example"}]"#)), None);
    }

    #[test]
    fn batch_answers_both_readings() {
        let skipped =
            br#"{"data":[{"id":"a"},{"id":"c"}],"errors":[{"index":1,"message":"The `to` field is missing."}]}"#;
        assert_eq!(
            parse_batch_success(skipped, 3).unwrap(),
            vec![
                AcceptedEmail::Sent("a".into()),
                AcceptedEmail::Invalid(Some("The `to` field is missing.".into())),
                AcceptedEmail::Sent("c".into())
            ]
        );
        let aligned =
            br#"{"data":[{"id":"a"},null,{"id":"c"}],"errors":[{"index":1,"message":"The `to` field is missing."}]}"#;
        assert_eq!(parse_batch_success(aligned, 3), parse_batch_success(skipped, 3));
        assert_eq!(parse_batch_success(br#"{"data":[{"id":"a"}]}"#, 1).unwrap(), vec![AcceptedEmail::Sent("a".into())]);
    }

    #[test]
    fn unmatched_batch_answers_are_refused() {
        assert!(parse_batch_success(br#"{"data":[{"id":"a"}]}"#, 2).is_none());
        assert!(parse_batch_success(br#"{"data":[],"errors":[{"index":5,"message":"x"}]}"#, 1).is_none());
        assert!(parse_batch_success(b"not json", 1).is_none());
    }
}
