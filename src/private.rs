//! The private listener (keep it off the internet): `/metrics` for Prometheus.

use crate::ctx::Ctx;
use crate::http;

/// Serves the private routes on `listener` until `shutdown`.
pub fn serve(
    ctx: &Ctx,
    listener: tokio::net::TcpListener,
    shutdown: crate::shutdown::Shutdown,
) -> impl std::future::Future<Output = ()> + use<> {
    let metrics = ctx.metrics.clone();
    let handler = move |req: http::HttpRequest| std::future::ready(metrics.handle(&req));
    http::serve(listener, handler, shutdown, http::Limits::default())
}
