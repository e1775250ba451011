//! `POST /v1/deliveries`: transactional sends from the application. A bearer
//! token (`MAILSTREAM_INGEST_TOKEN`, `http.ingest_token_file` or the credential
//! `ingest_token`; without one the API is off: 404). The body is
//! `{"deliveries": [item, ...]}` with at most 1,000 items (see `crate::audience::ingest`
//! for an item). A body that is not such JSON is refused whole (400), too many
//! items or too many bytes too (413), a missing or wrong token too (401). Then
//! each item is checked and enqueued on its own: 202 when every item was
//! accepted (or was a duplicate of one accepted before), 207 when some were
//! refused, with one result per item, in order, naming the field and why.
//!
//! `POST /v1/push-subscriptions` (the same token): a browser's Web Push subscription for a
//! subscriber, `{"subscriber": "u42", "subscription": <PushSubscription.toJSON()>}`. 201
//! with the subscription's id (a hash of its endpoint; registering it again replaces its
//! keys); 400 when it is not one, naming the field and never quoting it; 404 when the
//! subscriber is not in the registry; 409 when it has as many subscriptions as it may.

use std::sync::Arc;

use hyper::{Method, StatusCode};
use serde_json::json;

use crate::audience::ingest::{self, ItemResult, MAX_ITEMS};
use crate::config::{Config, Secret};
use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::metrics::Metrics;
use crate::send::ctx::Ctx;
use crate::store::Store;

pub const PATH: &str = "/v1/deliveries";

/// What a 429 for pending attachments says to wait: about the time a receipt takes to go.
const RETRY_LATER_SECONDS: u64 = 10;
pub const PUSH_PATH: &str = "/v1/push-subscriptions";

pub(crate) struct Ingest {
    tokens: Vec<Secret>,
    store: Store,
    config: Config,
    metrics: Arc<Metrics>,
}

impl Ingest {
    pub fn new(ctx: &Ctx) -> Ingest {
        Ingest {
            tokens: ctx.config.http.ingest_tokens.clone(),
            store: ctx.store.clone(),
            config: ctx.config.clone(),
            metrics: ctx.metrics.clone(),
        }
    }

    pub async fn handle(&self, req: HttpRequest) -> HttpResponse {
        if let Some(refused) = self.admit(&req) {
            return refused;
        }
        if req.uri().path() == PUSH_PATH {
            return self.push_subscription(&req).await;
        }
        self.deliveries(&req).await
    }

    /// The token and the method, checked: `Some` refusal, or `None` to go on.
    fn admit(&self, req: &HttpRequest) -> Option<HttpResponse> {
        if self.tokens.is_empty() {
            return Some(server::text(
                StatusCode::NOT_FOUND,
                "the ingest API is off: set MAILSTREAM_INGEST_TOKEN, http.ingest_token_file or the ingest_token credential\n",
            ));
        }
        let presented = server::bearer(req);
        if !self.tokens.iter().any(|t| server::same_secret(presented, t.expose())) {
            return Some(refuse(StatusCode::UNAUTHORIZED, "a valid bearer token is required"));
        }
        if req.method() != Method::POST {
            return Some(refuse(StatusCode::METHOD_NOT_ALLOWED, "use POST"));
        }
        None
    }

    /// `POST /v1/push-subscriptions` (see the module doc).
    async fn push_subscription(&self, req: &HttpRequest) -> HttpResponse {
        use crate::audience::subscribers::push::{self as subscriptions, Subscription};
        let Ok(serde_json::Value::Object(mut body)) = serde_json::from_slice::<serde_json::Value>(req.body()) else {
            return refuse(StatusCode::BAD_REQUEST, "the body must be JSON: {\"subscriber\", \"subscription\"}");
        };
        let Some(serde_json::Value::String(subscriber)) = body.remove("subscriber") else {
            return refuse(StatusCode::BAD_REQUEST, "subscriber: a subscriber id is needed");
        };
        if subscriber.is_empty() || subscriber.contains(':') || subscriber.len() > 256 {
            return refuse(StatusCode::BAD_REQUEST, "subscriber: not a subscriber id");
        }
        let allowed = self.config.push_allowed_hosts();
        let s = match Subscription::register_value(body.remove("subscription").unwrap_or_default(), &allowed) {
            Ok(s) => s,
            Err(e) => return refuse(StatusCode::BAD_REQUEST, &e),
        };
        match subscriptions::add(&self.store, &subscriber, &s).await {
            Ok(sid) => server::json(StatusCode::CREATED, &json!({ "subscription": sid })),
            Err(e) if e.to_string().contains("is not in the registry") => {
                refuse(StatusCode::NOT_FOUND, "subscriber: not in the registry")
            }
            Err(e) if e.to_string().contains("push subscriptions already") => refuse(
                StatusCode::CONFLICT,
                &format!("subscriber: at most {} push subscriptions", subscriptions::MAX_PER_SUBSCRIBER),
            ),
            Err(e) => {
                self.metrics.redis_error("push_subscription", &e);
                refuse(StatusCode::SERVICE_UNAVAILABLE, "could not register it for certain now; try again")
            }
        }
    }

    /// The deliveries of one request.
    async fn deliveries(&self, req: &HttpRequest) -> HttpResponse {
        let items = match serde_json::from_slice::<serde_json::Value>(req.body()) {
            Ok(serde_json::Value::Object(mut body)) => match body.remove("deliveries") {
                Some(serde_json::Value::Array(items)) => items,
                _ => return refuse(StatusCode::BAD_REQUEST, "the body must be {\"deliveries\": [...]}"),
            },
            _ => return refuse(StatusCode::BAD_REQUEST, "the body must be JSON: {\"deliveries\": [...]}"),
        };
        if items.len() > MAX_ITEMS {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, &format!("at most {MAX_ITEMS} deliveries per request"));
        }
        if items.is_empty() {
            return refuse(StatusCode::BAD_REQUEST, "no deliveries");
        }
        // A file for Resend to fetch is a caller's mistake, not one item's: nothing is taken.
        if let Some(field) = ingest::remote_path(&items) {
            return refuse(StatusCode::BAD_REQUEST, &format!("{field}: {}", ingest::REMOTE_PATH));
        }
        let results = match ingest::enqueue(&self.store, &self.config, items).await {
            Ok(results) => results,
            Err(e) => {
                self.metrics.redis_error("ingest", &e);
                return refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "could not enqueue for certain now; try again (the same idempotency keys enqueue each item once)",
                );
            }
        };
        let count = |f: fn(&ItemResult) -> bool| results.iter().filter(|r| f(r)).count();
        let accepted = count(|r| matches!(r, ItemResult::Accepted { .. }));
        let duplicates = count(|r| matches!(r, ItemResult::Duplicate { .. }));
        let conflicts = count(|r| matches!(r, ItemResult::Conflict { .. }));
        let invalid = count(|r| matches!(r, ItemResult::Invalid { .. }));
        let unknown = count(|r| matches!(r, ItemResult::Refused { .. }));
        let later = count(|r| matches!(r, ItemResult::RetryLater { .. }));
        let counted = [
            ("accepted", accepted),
            ("duplicate", duplicates),
            ("conflict", conflicts),
            ("invalid", invalid),
            ("refused", unknown),
            ("retry_later", later),
        ];
        for (result, n) in counted {
            if n > 0 {
                self.metrics.ingested(result, n as u64);
            }
        }
        let refused = conflicts + invalid + unknown + later;
        let status = match (refused, later) {
            (0, _) => StatusCode::ACCEPTED,
            // Attachments wait past the partition's limit: the same request again later
            // enqueues what is left (what was accepted now is a duplicate then).
            (_, 1..) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::MULTI_STATUS,
        };
        let mut response = server::json(
            status,
            &json!({
                "accepted": accepted,
                "duplicates": duplicates,
                "refused": refused,
                "results": results,
            }),
        );
        if later > 0 {
            response.headers_mut().insert(hyper::header::RETRY_AFTER, RETRY_LATER_SECONDS.into());
        }
        response
    }
}

fn refuse(status: StatusCode, error: &str) -> HttpResponse {
    server::json(status, &json!({ "error": error }))
}
