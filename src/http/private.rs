//! The private listener (keep it off the internet): `/metrics` for Prometheus,
//! with the gauges read from Redis refreshed at each scrape, and the delivery log
//! under `/admin` (behind a token).

use std::sync::Arc;
use std::time::Duration;

use crate::http::admin::Admin;
use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::metrics;
use crate::send::ctx::Ctx;

/// How long a scrape waits for Redis before answering with what it has
/// (`mailstream_redis_up 0`): Prometheus's own scrape timeout is 10 s by default.
const REDIS_READ_LIMIT: Duration = Duration::from_secs(5);

/// Serves the private routes on `listener` until `shutdown`.
pub(crate) fn serve(
    ctx: &Arc<Ctx>,
    listener: tokio::net::TcpListener,
    shutdown: crate::shutdown::Shutdown,
) -> impl std::future::Future<Output = ()> + use<> {
    let (ctx, admin) = (ctx.clone(), Arc::new(Admin::new(&ctx.config.http.admin_tokens)));
    let handler = move |req: HttpRequest| {
        let (ctx, admin) = (ctx.clone(), admin.clone());
        async move { route(&ctx, &admin, req).await }
    };
    server::serve(listener, handler, shutdown, server::ListenerLimits::default())
}

async fn route(ctx: &Ctx, admin: &Admin, req: HttpRequest) -> HttpResponse {
    match req.uri().path() {
        p if p == "/admin" || p.starts_with("/admin/") => admin.route(ctx, req).await,
        "/metrics" => {
            if let Err(e) = metrics::refresh(&ctx.metrics, &ctx.store, &ctx.config, REDIS_READ_LIMIT).await {
                ctx.metrics.redis_error("scrape", &e);
            }
            server::text(hyper::StatusCode::OK, ctx.metrics.render())
        }
        _ => server::text(hyper::StatusCode::NOT_FOUND, "not found\n"),
    }
}
