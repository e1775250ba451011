//! A small HTTP/1.1 server on hyper: serve a handler on a bound listener until
//! shutdown, then give open connections a moment to finish. Used by the
//! emulator and `/metrics`; handlers are plain async functions, testable alone.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::shutdown::Shutdown;

/// What handlers receive: the request head and its whole body.
pub type HttpRequest = Request<Bytes>;
/// What handlers return.
pub type HttpResponse = Response<Full<Bytes>>;

/// When a request's head arrived (before its body was read), as a request extension.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arrived(pub std::time::Instant);

/// A larger body limit for the requests it names from their head alone (an ingest request
/// with its token, which may carry attachments), read before any byte of the body.
pub type LargerBody = Arc<BodyLimitOf>;

/// What tells a request's body limit from its head.
pub type BodyLimitOf = dyn Fn(&hyper::http::request::Parts) -> Option<usize> + Send + Sync;

/// How a listener treats its requests.
#[derive(Clone)]
pub struct ListenerLimits {
    /// Largest body read (413 beyond).
    pub max_body: usize,
    /// A larger limit for some requests, told by their head; `None`: `max_body` for all.
    pub larger_body: Option<LargerBody>,
    /// Longest a request may take, head to answer (408 after the head, 503 after).
    pub timeout: Duration,
    /// Requests per second one client address may make (429 beyond); `None`: no limit.
    pub per_source: Option<std::num::NonZeroU32>,
    /// How long open connections get to finish after shutdown.
    pub drain: Duration,
    /// Nothing is read from a new connection for this long (the emulator's stand-in for
    /// a slow TLS handshake: its first request arrives this much later).
    pub first_read_delay: Duration,
    /// A connection is closed this long after it was opened, once its current request
    /// is answered (as servers close keep-alive connections); `None`: kept open.
    pub connection_lifetime: Option<Duration>,
}

impl Default for ListenerLimits {
    /// For private listeners (metrics) and the emulator: a full batch of 100 large
    /// emails fits easily.
    fn default() -> Self {
        ListenerLimits {
            max_body: 16 * 1024 * 1024,
            larger_body: None,
            timeout: Duration::from_secs(120),
            per_source: None,
            drain: Duration::from_secs(1),
            first_read_delay: Duration::ZERO,
            connection_lifetime: None,
        }
    }
}

/// A listen address still in use after `http.bind_retry_seconds`: the CLI exits 69.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AddressInUse(pub String);

/// Binds `http.<which>_listen` if one is configured, and logs the address bound (port 0
/// picks a free one). An address in use (an instance still draining holds it) is tried
/// again every 250 ms for `retry`, then refused with [`AddressInUse`]; any other refusal
/// (a port the user may not bind, an address not on this host) is a config error.
pub async fn bind(
    addr: Option<std::net::SocketAddr>,
    which: &str,
    retry: Duration,
) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = addr else { return Ok(None) };
    let deadline = tokio::time::Instant::now() + retry;
    let mut said = false;
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => break listener,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(AddressInUse(format!(
                        "cannot listen on http.{which}_listen {addr}: still in use after {}s \
                         (http.bind_retry_seconds): is another mailstream running?",
                        retry.as_secs()
                    ))
                    .into());
                }
                if !std::mem::replace(&mut said, true) {
                    tracing::warn!(%addr, "http.{which}_listen is in use; trying again for {}s", retry.as_secs());
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => {
                let message = format!("http.{which}_listen: cannot listen on {addr}: {e}");
                return Err(crate::config::ConfigError::Invalid(vec![message]).into());
            }
        }
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "{which} listening");
    }
    Ok(Some(listener))
}

type SourceLimiter = governor::DefaultKeyedRateLimiter<std::net::IpAddr>;

/// Serves `handler` on `listener` until `shutdown`, then drains for at most `limits.drain`.
pub async fn serve<H, F>(listener: TcpListener, handler: H, mut shutdown: Shutdown, limits: ListenerLimits)
where
    H: Fn(HttpRequest) -> F + Send + Sync + 'static,
    F: Future<Output = HttpResponse> + Send + 'static,
{
    let handler = Arc::new(handler);
    let graceful = GracefulShutdown::new();
    let sources: Option<Arc<SourceLimiter>> =
        limits.per_source.map(|n| Arc::new(governor::RateLimiter::keyed(governor::Quota::per_second(n))));
    let mut forget = tokio::time::interval(Duration::from_secs(60));
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.wait() => break,
            _ = forget.tick() => {
                // Client addresses not seen for a while are forgotten (bounded memory).
                if let Some(s) = &sources {
                    s.retain_recent();
                }
                continue;
            }
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (handler, sources, larger) = (handler.clone(), sources.clone(), limits.larger_body.clone());
        let (timeout, max_body) = (limits.timeout, limits.max_body);
        let service = service_fn(move |req: Request<Incoming>| {
            let (handler, sources, larger) = (handler.clone(), sources.clone(), larger.clone());
            async move {
                if let Some(refused) = sources.as_deref().and_then(|s| over_limit(s, peer.ip())) {
                    return Ok::<_, Infallible>(refused);
                }
                let answer = tokio::time::timeout(timeout, handle(req, &*handler, max_body, larger.as_deref()));
                Ok::<_, Infallible>(
                    answer.await.unwrap_or_else(|_| text(StatusCode::SERVICE_UNAVAILABLE, "request took too long\n")),
                )
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.timeout)
            .serve_connection(TokioIo::new(stream), service);
        let delay = limits.first_read_delay;
        if let Some(lifetime) = limits.connection_lifetime {
            // Not watched for shutdown: it closes on its own within its lifetime.
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = tokio::time::sleep(lifetime) => conn.as_mut().graceful_shutdown(),
                }
                let _ = conn.await;
            });
            continue;
        }
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.drain, graceful.shutdown()).await;
}

/// 429 with `retry-after` when `ip` is over its quota.
fn over_limit(sources: &SourceLimiter, ip: std::net::IpAddr) -> Option<HttpResponse> {
    use governor::clock::Clock;
    let not_until = sources.check_key(&ip).err()?;
    let wait = not_until.wait_time_from(governor::clock::DefaultClock::default().now());
    let mut response = text(StatusCode::TOO_MANY_REQUESTS, "too many requests from this address\n");
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    response.headers_mut().insert(hyper::header::RETRY_AFTER, secs.max(1).into());
    Some(response)
}

async fn handle<H, F>(
    req: Request<Incoming>,
    handler: &H,
    max_body: usize,
    larger: Option<&BodyLimitOf>,
) -> HttpResponse
where
    H: Fn(HttpRequest) -> F,
    F: Future<Output = HttpResponse>,
{
    let arrived = Arrived(std::time::Instant::now());
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(arrived);
    let max_body = larger.and_then(|l| l(&parts)).map_or(max_body, |n| n.max(max_body));
    match Limited::new(body, max_body).collect().await {
        Ok(collected) => handler(Request::from_parts(parts, collected.to_bytes())).await,
        Err(_) => text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large or unreadable\n"),
    }
}

/// A JSON response.
pub fn json(status: StatusCode, value: &serde_json::Value) -> HttpResponse {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, "application/json".parse().expect("static header"));
    response
}

/// A JSON response from its text.
pub fn json_text(status: StatusCode, body: impl Into<Bytes>) -> HttpResponse {
    typed(status, body.into(), "application/json")
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> HttpResponse {
    typed(status, body.into(), "text/plain; charset=utf-8")
}

/// An HTML response.
pub fn html(status: StatusCode, body: impl Into<Bytes>) -> HttpResponse {
    typed(status, body.into(), "text/html; charset=utf-8")
}

fn typed(status: StatusCode, body: Bytes, content_type: &'static str) -> HttpResponse {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response
}

/// `s` safe inside HTML text and attribute values.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether `presented` equals `known`, in time that does not depend on where they
/// differ (both are MACed with a key of `known`'s, then compared by `verify_slice`).
pub fn same_secret(presented: &str, known: &str) -> bool {
    use hmac::{Hmac, Mac};
    let mac = |s: &str| {
        let mut m = Hmac::<sha2::Sha256>::new_from_slice(known.as_bytes()).expect("HMAC takes any key length");
        m.update(s.as_bytes());
        m
    };
    !presented.is_empty() && mac(presented).verify_slice(&mac(known).finalize().into_bytes()).is_ok()
}

/// The token of an `Authorization: Bearer <token>` header, or "".
pub(crate) fn bearer(req: &HttpRequest) -> &str {
    let header = req.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    bearer_token(header).unwrap_or("")
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is matched
/// case-insensitively (RFC 9110 §11.1: `bearer re_…` is the same credential).
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer re_1", "bearer re_1", "BEARER re_1", "bEaReR  re_1 "] {
            assert_eq!(bearer_token(value), Some("re_1"), "{value:?}");
        }
        for value in ["Basic re_1", "Bearerre_1", "Bearer ", "Bearer", "re_1", ""] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }
}
