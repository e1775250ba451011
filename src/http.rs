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
pub struct Arrived(pub std::time::Instant);

/// Largest request body accepted (a full batch of 100 large emails fits easily).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Binds `addr` if one is configured (`key` names the setting in errors).
pub async fn bind(addr: Option<std::net::SocketAddr>, key: &str) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = addr else { return Ok(None) };
    let listener = TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {key} {addr}: {e}"))?;
    Ok(Some(listener))
}

/// Serves `handler` on `listener` until `shutdown`, then drains for at most `drain`.
pub async fn serve<H, F>(listener: TcpListener, handler: H, mut shutdown: Shutdown, drain: Duration)
where
    H: Fn(HttpRequest) -> F + Send + Sync + 'static,
    F: Future<Output = HttpResponse> + Send + 'static,
{
    let handler = Arc::new(handler);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.wait() => break,
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
        let handler = handler.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let handler = handler.clone();
            async move { Ok::<_, Infallible>(handle(req, &*handler).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(drain, graceful.shutdown()).await;
}

async fn handle<H, F>(req: Request<Incoming>, handler: &H) -> HttpResponse
where
    H: Fn(HttpRequest) -> F,
    F: Future<Output = HttpResponse>,
{
    let arrived = Arrived(std::time::Instant::now());
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(arrived);
    match Limited::new(body, MAX_BODY).collect().await {
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

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<Bytes>) -> HttpResponse {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, "text/plain; charset=utf-8".parse().expect("static header"));
    response
}
