//! The public listener, apart from the private metrics listener: Resend's
//! webhooks (`webhook.rs`), RFC 8058 one-click unsubscribe (`unsubscribe.rs`)
//! and the ingest API for transactional sends (`ingest.rs`). It keeps answering
//! while sending is paused or draining, so maintenance loses no events.

pub mod ingest;
pub mod unsubscribe;
pub mod webhook;

use std::time::Duration;

use hyper::StatusCode;

use self::unsubscribe::Ask;
use self::webhook::Webhooks;
use crate::audience::tokens::Tokens;
use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::model::work::Channel;
use crate::send::ctx::Ctx;
use crate::store::scripts;

/// Serves the public routes on `listener` until `shutdown`, with the limits the
/// config sets (body size, requests per second per client address, timeout).
pub(crate) fn serve(
    ctx: &Ctx,
    listener: tokio::net::TcpListener,
    shutdown: crate::shutdown::Shutdown,
) -> impl std::future::Future<Output = ()> + use<> {
    let routes = std::sync::Arc::new(Public::new(ctx));
    let h = &ctx.config.http;
    // A request to the ingest API with its token may carry attachments: its body may be as
    // large as one delivery's attachments allow, plus 64 KiB. It stays bounded: only a caller
    // holding the token gets it (told from the head, before a byte of the body is read), at
    // most `public_requests_per_second_per_source` a second, each within `public_timeout_ms`.
    let (tokens, larger) = (h.ingest_tokens.clone(), ctx.config.attachments.ingest_body_bytes());
    let larger_body: server::LargerBody = std::sync::Arc::new(move |head: &hyper::http::request::Parts| {
        let header = head.headers.get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok())?;
        let presented = server::bearer_token(header)?;
        let ours = tokens.iter().any(|t| server::same_secret(presented, t.expose()));
        (ours && head.method == hyper::Method::POST && head.uri.path() == ingest::PATH).then_some(larger)
    });
    let limits = server::ListenerLimits {
        max_body: h.public_max_body_bytes,
        larger_body: Some(larger_body),
        timeout: Duration::from_millis(h.public_timeout_ms),
        per_source: std::num::NonZeroU32::new(h.public_requests_per_second_per_source),
        drain: Duration::from_secs(5),
        ..Default::default()
    };
    let handler = move |req| {
        let routes = routes.clone();
        async move { routes.handle(req).await }
    };
    server::serve(listener, handler, shutdown, limits)
}

/// What the public listener serves.
struct Public {
    webhooks: Webhooks,
    ingest: ingest::Ingest,
    tokens: Tokens,
    store: crate::store::Store,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl Public {
    pub fn new(ctx: &Ctx) -> Public {
        Public {
            webhooks: Webhooks::new(&ctx.config, ctx.store.clone(), ctx.metrics.clone()),
            ingest: ingest::Ingest::new(ctx),
            tokens: Tokens::new(&ctx.config.unsubscribe.secrets),
            store: ctx.store.clone(),
            metrics: ctx.metrics.clone(),
        }
    }

    /// Answers one request.
    pub async fn handle(&self, req: HttpRequest) -> HttpResponse {
        let path = req.uri().path();
        if path == webhook::PATH {
            return self.webhooks.handle(req).await;
        }
        if path == ingest::PATH || path == ingest::PUSH_PATH {
            return self.ingest.handle(req).await;
        }
        if path.starts_with(crate::audience::tokens::PATH) {
            return self.unsubscribe(&req).await;
        }
        if path == "/healthz" {
            return server::text(StatusCode::OK, "ok\n");
        }
        server::text(StatusCode::NOT_FOUND, "not found\n")
    }

    async fn unsubscribe(&self, req: &HttpRequest) -> HttpResponse {
        match unsubscribe::ask(&self.tokens, req) {
            Ask::Confirm { campaign, .. } => unsubscribe::confirm_page(&campaign),
            Ask::Unsubscribe { subscriber, campaign } => {
                let result = async {
                    let mut conn = self.store.waited_conn().await?;
                    let keys = &self.store.keys;
                    let changed = scripts::opt_out(&mut conn, keys, &subscriber, &campaign, Channel::Email).await?;
                    // Confirmed only once a failover cannot take it back.
                    let p = keys.partition_of(&subscriber);
                    self.store.durable(&mut conn, &keys.subscriber(p, &subscriber)).await?;
                    anyhow::Ok(changed)
                };
                match result.await {
                    Ok(Some(true)) => {
                        self.metrics.unsubscribed("one_click", &campaign);
                        unsubscribe::done_page()
                    }
                    // Already off, or the subscriber is gone: either way, no more mail.
                    Ok(_) => unsubscribe::done_page(),
                    Err(e) => {
                        self.metrics.redis_error("unsubscribe", &e);
                        server::text(StatusCode::SERVICE_UNAVAILABLE, "try again in a moment\n")
                    }
                }
            }
            Ask::Refuse(status) => unsubscribe::refusal(status),
        }
    }
}
