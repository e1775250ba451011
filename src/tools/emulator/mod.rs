//! A local Resend: `POST /emails` and `POST /emails/batch` with Resend's shapes
//! and rules, `GET /emails/{id}` and `GET /emails` over the emails it accepted, the
//! team's suppression list (`/suppressions…`, seeded by tests through
//! `POST /_emulator/suppressions`), injectable faults, and counters that tests and
//! benchmarks read from `GET /_emulator/stats`. Attachments are validated and counted,
//! never kept (nor a `path` fetched). Nothing here reaches the network. Each concern has a
//! room: the rate window, the idempotency store, the sent emails, the suppression list,
//! faults, validation.

mod accept;
pub mod app;
pub mod emails;
pub mod faults;
pub mod hold;
pub mod idempotency;
pub mod push;
pub mod rate;
pub mod suppressions;
pub mod validate;
pub mod webhooks;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use self::emails::Emails;
use self::faults::FaultState;
pub use self::faults::{Faults, QuotaRefusal, Storm};
use self::idempotency::{IdempotencyStore, Lookup};
use self::rate::{RateInfo, SlidingWindow};
pub use self::suppressions::SuppressionOrigin;
use self::suppressions::Suppressions;
use self::validate::ApiError;
use self::webhooks::Outbox;
pub use self::webhooks::WebhookTarget;
use crate::http::server::{self, HttpRequest, HttpResponse};

/// How the emulator behaves.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmulatorConfig {
    /// Team-wide requests per sliding second; more are answered 429. `None`: no limit.
    pub requests_per_second: Option<u32>,
    /// When set, only this API key is accepted; otherwise any key that looks like
    /// a Resend key (`re_…`). Others get 403 `invalid_api_key`.
    pub api_key: Option<String>,
    /// Seed for fault injection, so a faulty run can be replayed.
    pub seed: u64,
    pub faults: Faults,
    /// Where to send signed webhooks about accepted mail; none when absent.
    pub webhook: Option<WebhookTarget>,
    /// Nothing is read from a new connection for this long: its first request arrives
    /// this much after it was written, as after a slow TLS handshake.
    pub connect_delay_ms: u64,
    /// Keep-alive connections are closed this long after they were opened (after the
    /// request in progress), as the real provider's are; `None`: kept open.
    pub close_idle_after_ms: Option<u64>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            requests_per_second: Some(10),
            api_key: None,
            seed: 1,
            faults: Faults::default(),
            webhook: None,
            connect_delay_ms: 0,
            close_idle_after_ms: None,
        }
    }
}

/// The counters `GET /_emulator/stats` returns.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Stats {
    /// Every request to a sending endpoint, answered or not.
    pub requests: u64,
    /// Emails accepted for sending (replays excluded): the real sends.
    pub emails_accepted: u64,
    /// Real sends of a (recipient, subject) that had already been sent once.
    pub duplicate_sends: u64,
    /// Distinct (recipient, subject) pairs sent.
    pub distinct_sends: u64,
    /// Requests answered 429 `rate_limit_exceeded`.
    pub rate_limited: u64,
    /// The most requests seen in any sliding second.
    pub max_requests_in_1s: u64,
    /// Keyed requests answered from the idempotency store.
    pub replays: u64,
    /// 409 `invalid_idempotent_request` answers (same key, different body).
    pub idempotency_mismatches: u64,
    /// 409 `concurrent_idempotent_requests` answers.
    pub concurrent_conflicts: u64,
    /// Answers refused by permissive validation, counted per email.
    pub invalid_emails: u64,
    /// Injected faults, by kind.
    pub injected_server_errors: u64,
    pub injected_hangs: u64,
    pub quota_refusals: u64,
    /// Webhooks acknowledged by the receiver, retried, and given up on.
    pub webhooks_delivered: u64,
    pub webhooks_retried: u64,
    pub webhooks_failed: u64,
    /// Emails accepted (and in `emails_accepted`) but not delivered, a recipient being on
    /// the suppression list: neither a distinct nor a duplicate send.
    #[serde(default)]
    pub suppressed_sends: u64,
    /// Addresses on the suppression list now.
    #[serde(default)]
    pub suppressions_listed: u64,
    /// Attachments on emails accepted for sending (replays excluded), `path` ones included.
    #[serde(default)]
    pub attachments_accepted: u64,
    /// The decoded bytes of those attachments' `content` (a `path` one adds 0).
    #[serde(default)]
    pub attachment_bytes: u64,
}

/// An accepted email: its id, the email as sent, and the reason it was not delivered
/// when a recipient is on the suppression list.
type Accepted = (String, Value, Option<&'static str>);

/// What one request came to: the answer, the rate facts, a hang, the emails accepted.
type Decided = (Result<Value, ApiError>, RateInfo, Option<Duration>, Vec<Accepted>);

/// A sending request's outcome, and the quota's usage after it (header name, emails).
struct Processed {
    result: Result<Value, ApiError>,
    rate: RateInfo,
    hang: Option<Duration>,
    accepted: Vec<Accepted>,
    quota: Option<(&'static str, u64)>,
}

/// One request as the emulator saw it (kept for tests and benchmarks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub idempotency_key: Option<String>,
    /// Emails in the body (0 when it was not a JSON array or object).
    pub emails: usize,
    /// The `campaign` tag of the first email (which lane a batch came from).
    pub campaign: Option<String>,
    pub status: u16,
    /// Its answer was held past the client's patience (an injected hang).
    pub hung: bool,
    /// When its head arrived.
    pub at: Instant,
}

/// Real sends the emulator makes room for at once (about 10 MB): a map that grows
/// rehashes every entry under the lock, and at 57,344 a stall of milliseconds delayed the
/// next request's head past the sender's pacing guard, so a request sent inside the rate
/// limit was counted in the same second as one sent a second later, and refused 429 (the
/// headroom run at 50 requests/s, request 624 of 1,000). Resend does not stall so.
const SENDS_PRESIZED: usize = 1 << 17;

/// The largest request body read (413 beyond): above the listener's usual 16 MB, so that an
/// email near Resend's 40 MB of attachments, with its html besides, reaches validation and
/// is answered there (accepted, or 422 past the limit) as Resend answers it.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Requests remembered by [`Emulator::seen`]; older ones are forgotten.
const SEEN_LIMIT: usize = 100_000;

struct Inner {
    stats: Stats,
    seen: VecDeque<Seen>,
    window: SlidingWindow,
    idempotency: IdempotencyStore,
    faults: FaultState,
    emails: Emails,
    suppressions: Suppressions,
    /// When each real send of (recipient, subject) happened.
    sends: HashMap<(String, String), Vec<Instant>>,
    rng: StdRng,
}

/// A Resend emulator. Clone it to share state (a restart keeps the idempotency store).
#[derive(Clone)]
pub struct Emulator {
    config: Arc<EmulatorConfig>,
    inner: Arc<Mutex<Inner>>,
    outbox: Option<Arc<Outbox>>,
}

impl Emulator {
    pub fn new(config: EmulatorConfig) -> Emulator {
        Emulator {
            inner: Arc::new(Mutex::new(Inner {
                stats: Stats::default(),
                seen: VecDeque::new(),
                window: SlidingWindow::default(),
                idempotency: IdempotencyStore::default(),
                faults: FaultState::new(Instant::now()),
                emails: Emails::default(),
                suppressions: Suppressions::default(),
                sends: HashMap::with_capacity(SENDS_PRESIZED),
                rng: StdRng::seed_from_u64(config.seed),
            })),
            outbox: config.webhook.clone().map(|t| Arc::new(Outbox::new(t))),
            config: Arc::new(config),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("emulator lock")
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        let inner = self.lock();
        let mut stats = Stats {
            max_requests_in_1s: inner.window.max_in_1s,
            suppressions_listed: inner.suppressions.len() as u64,
            ..inner.stats.clone()
        };
        if let Some(outbox) = &self.outbox {
            let c = &outbox.counters;
            let get = |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
            (stats.webhooks_delivered, stats.webhooks_retried, stats.webhooks_failed) =
                (get(&c.delivered), get(&c.retried), get(&c.failed));
        }
        stats
    }

    /// Starts a new quota window now (the provider's daily quota renewed).
    pub fn renew_quota(&self) {
        self.lock().faults.renew(Instant::now());
    }

    /// Removes the quota from now on (the team moved to a larger plan).
    pub fn lift_quota(&self) {
        self.lock().faults.lift();
    }

    /// The emails accepted so far (the newest `GET /emails` keeps), oldest first, as
    /// `GET /emails/{id}` shows each.
    pub fn accepted(&self) -> Vec<Value> {
        self.lock().emails.all()
    }

    /// Lists `email` (trimmed, lowercased) on the suppression list as `origin`, without a
    /// webhook (as `POST /_emulator/suppressions` does); its entry's id, the existing one
    /// if it was listed already.
    ///
    /// # Panics
    /// If `email` is not an address.
    pub fn suppress(&self, email: &str, origin: SuppressionOrigin) -> String {
        self.lock().suppressions.seed(email, origin).unwrap_or_else(|e| panic!("not suppressed: {}", e.message))
    }

    /// The suppression list as (address, origin), oldest first.
    pub fn suppression_list(&self) -> Vec<(String, String)> {
        self.lock().suppressions.all()
    }

    /// The requests seen so far to the sending endpoints, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.iter().cloned().collect()
    }

    /// Real sends of each recipient for subjects containing `needle` (a period, say).
    pub fn sends_matching(&self, needle: &str) -> HashMap<String, u32> {
        self.send_times_matching(needle).into_iter().map(|(to, at)| (to, at.len() as u32)).collect()
    }

    /// When each recipient was really sent a subject containing `needle`.
    pub fn send_times_matching(&self, needle: &str) -> HashMap<String, Vec<Instant>> {
        let inner = self.lock();
        let mut out: HashMap<String, Vec<Instant>> = HashMap::new();
        for ((to, subject), at) in &inner.sends {
            if subject.contains(needle) {
                out.entry(to.clone()).or_default().extend(at);
            }
        }
        out
    }

    /// Serves on a fresh loopback port in the background (the demo, tests and
    /// benchmarks); returns the base URL, the trigger that stops it, and the task.
    pub async fn spawn_local(
        &self,
    ) -> std::io::Result<(String, crate::shutdown::Trigger, tokio::task::JoinHandle<()>)> {
        self.spawn_at("127.0.0.1:0".parse().expect("an address")).await
    }

    /// [`Emulator::spawn_local`] on a given address (the same port again after an
    /// outage: the state, idempotency store included, is kept).
    pub async fn spawn_at(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<(String, crate::shutdown::Trigger, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop, down) = crate::shutdown::channel();
        Ok((url, stop, tokio::spawn(self.clone().serve(listener, down))))
    }

    /// Serves until `shutdown`.
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: crate::shutdown::Shutdown) {
        let limits = server::ListenerLimits {
            first_read_delay: Duration::from_millis(self.config.connect_delay_ms),
            connection_lifetime: self.config.close_idle_after_ms.map(Duration::from_millis),
            max_body: MAX_BODY,
            ..server::ListenerLimits::default()
        };
        let handler = move |req| {
            let emulator = self.clone();
            async move { emulator.handle(req).await }
        };
        server::serve(listener, handler, shutdown, limits).await
    }

    /// Answers one request (the routes).
    pub async fn handle(&self, req: HttpRequest) -> HttpResponse {
        let path = req.uri().path().to_string();
        match (req.method(), path.as_str()) {
            (&Method::GET, "/_emulator/stats") => {
                server::json(StatusCode::OK, &serde_json::to_value(self.stats()).expect("stats serialize"))
            }
            (&Method::POST, "/_emulator/suppressions") => match self.lock().suppressions.seed_all(req.body()) {
                Ok(body) => server::json(StatusCode::OK, &body),
                Err(e) => e.response(None),
            },
            (&Method::POST, "/emails") => self.send(req, false).await,
            (&Method::POST, "/emails/batch") => self.send(req, true).await,
            (&Method::GET, "/emails") => self.read(&req, None),
            (&Method::GET, "/suppressions") => {
                self.counted(&req, |inner| Ok((inner.suppressions.list(req.uri().query())?, Vec::new())))
            }
            (&Method::POST, "/suppressions") => self.counted(&req, |inner| inner.suppressions.add(req.body())),
            (&Method::POST, "/suppressions/batch/add") => {
                self.counted(&req, |inner| inner.suppressions.batch_add(req.body()))
            }
            (&Method::POST, "/suppressions/batch/remove") => {
                self.counted(&req, |inner| inner.suppressions.batch_remove(req.body()))
            }
            (
                _,
                "/emails"
                | "/emails/batch"
                | "/suppressions"
                | "/suppressions/batch/add"
                | "/suppressions/batch/remove"
                | "/_emulator/suppressions",
            ) => ApiError::new(405, "method_not_allowed", "Method not allowed").response(None),
            (method, path) => match (item(path, "/emails/"), item(path, "/suppressions/")) {
                (Some(id), _) if method == Method::GET => self.read(&req, Some(id)),
                (_, Some(key)) if method == Method::GET => {
                    let key = suppressions::decode_segment(key);
                    self.counted(&req, |inner| Ok((inner.suppressions.get(&key)?, Vec::new())))
                }
                (_, Some(key)) if method == Method::DELETE => {
                    let key = suppressions::decode_segment(key);
                    self.counted(&req, |inner| inner.suppressions.delete(&key))
                }
                (Some(_), _) | (_, Some(_)) => {
                    ApiError::new(405, "method_not_allowed", "Method not allowed").response(None)
                }
                (None, None) => {
                    ApiError::new(404, "not_found", "The requested endpoint does not exist.").response(None)
                }
            },
        }
    }

    /// `GET /emails/{id}` (`id`) or `GET /emails`: the same key and team rate limit
    /// as sending (Resend counts every request), then the emails kept.
    fn read(&self, req: &HttpRequest, id: Option<&str>) -> HttpResponse {
        self.counted(req, |inner| {
            let body = match id {
                Some(id) => inner.emails.get(id)?,
                None => inner.emails.list(req.uri().query())?,
            };
            Ok((body, Vec::new()))
        })
    }

    /// A request to an endpoint other than sending (reading emails, the suppression
    /// list): the key, and the team rate limit (Resend counts every request, and one
    /// over it is answered 429 with its headers), then `act` under the lock. The
    /// webhooks its change leads to are posted once the lock is released.
    fn counted(
        &self,
        req: &HttpRequest,
        act: impl FnOnce(&mut Inner) -> Result<suppressions::Changed, ApiError>,
    ) -> HttpResponse {
        let mut inner = self.lock();
        let rate = inner.window.arrive(arrival(req), self.config.requests_per_second);
        let result = match validate::check_headers(req, self.config.api_key.as_deref()) {
            Err(e) => Err(e),
            Ok(()) if rate.limited => {
                inner.stats.rate_limited += 1;
                Err(ApiError::rate_limited())
            }
            Ok(()) => act(&mut inner),
        };
        drop(inner);
        let mut response = match result {
            Ok((body, events)) => {
                if let Some(outbox) = &self.outbox {
                    for event in events {
                        outbox.post_event(event);
                    }
                }
                server::json(StatusCode::OK, &body)
            }
            Err(e) => e.response(rate.retry_after),
        };
        rate.write(response.headers_mut());
        response
    }

    async fn send(&self, req: HttpRequest, batch: bool) -> HttpResponse {
        let Processed { result, rate, hang, accepted, quota } = self.process(&req, batch);
        self.remember(&req, &result, hang.is_some());
        if let Some(outbox) = &self.outbox {
            for (id, email, suppressed) in &accepted {
                outbox.accepted(id, email, *suppressed);
            }
        }
        let mut response = match result {
            Ok(body) => server::json(StatusCode::OK, &body),
            Err(e) => e.response(rate.retry_after),
        };
        rate.write(response.headers_mut());
        if let Some((header, used)) = quota {
            response.headers_mut().insert(header, used.into());
        }
        if let Some(hang) = hang {
            // The answer (the email left, or it was refused) arrives after the client gave up.
            tokio::time::sleep(hang).await;
        }
        response
    }

    /// Everything but the (async) hang and the webhooks, under the lock.
    fn process(&self, req: &HttpRequest, batch: bool) -> Processed {
        let now = arrival(req);
        let mut inner = self.lock();
        let (result, rate, hang, accepted) = self.decide(&mut inner, req, batch, now);
        let quota = inner.faults.quota_used(now, &self.config.faults);
        let quota = quota.map(|used| (self.config.faults.quota_refusal.header(), used));
        Processed { result, rate, hang, accepted, quota }
    }

    /// The answer, the rate facts, the hang, and the emails accepted (id, email).
    fn decide(&self, inner: &mut Inner, req: &HttpRequest, batch: bool, now: Instant) -> Decided {
        inner.stats.requests += 1;
        let mut rate = inner.window.arrive(now, self.config.requests_per_second);

        if let Err(e) = validate::check_headers(req, self.config.api_key.as_deref()) {
            return (Err(e), rate, None, Vec::new());
        }
        let faults = &self.config.faults;
        let storm = inner.faults.in_storm(now, inner.stats.requests, faults);
        if rate.limited || storm.is_some() {
            inner.stats.rate_limited += 1;
            if let Some(after) = storm {
                rate.retry_after = Some(after);
            }
            return (Err(ApiError::rate_limited()), rate, None, Vec::new());
        }
        let key = match req.headers().get("idempotency-key").map(|v| v.to_str().map(str::to_string)) {
            None => None,
            Some(Ok(k)) if (1..=256).contains(&k.len()) => Some(k),
            Some(_) => {
                let e = ApiError::new(400, "invalid_idempotency_key", "The key must be between 1-256 chars.");
                return (Err(e), rate, None, Vec::new());
            }
        };
        let body = req.body().clone();
        if let Some(key) = &key {
            match inner.idempotency.lookup(key, &body, now) {
                Lookup::Fresh => {}
                Lookup::InFlight => {
                    inner.stats.concurrent_conflicts += 1;
                    return (Err(ApiError::concurrent()), rate, None, Vec::new());
                }
                Lookup::Replay(response) => {
                    inner.stats.replays += 1;
                    let value = serde_json::from_slice(&response).expect("stored JSON");
                    return (Ok(value), rate, None, Vec::new());
                }
                Lookup::Mismatch => {
                    inner.stats.idempotency_mismatches += 1;
                    let message = "Same idempotency key used with a different request payload.";
                    return (Err(ApiError::new(409, "invalid_idempotent_request", message)), rate, None, Vec::new());
                }
            }
        }

        if key.is_some() && inner.rng.random_bool(faults.concurrent.clamp(0.0, 1.0)) {
            inner.stats.concurrent_conflicts += 1;
            return (Err(ApiError::concurrent()), rate, None, Vec::new());
        }
        if inner.rng.random_bool(faults.server_error.clamp(0.0, 1.0)) {
            inner.stats.injected_server_errors += 1;
            let e = if inner.rng.random_bool(0.5) {
                ApiError::new(500, "internal_server_error", "An unexpected error occurred.")
            } else {
                ApiError::new(503, "service_unavailable", "Service temporarily unavailable.")
            };
            return (Err(e), rate, None, Vec::new());
        }

        let (result, accepted) = match inner.accept(&body, batch, req, faults, now) {
            Ok((value, accepted)) => (Ok(value), accepted),
            Err(e) => (Err(e), Vec::new()),
        };
        let hang = match &result {
            Ok(_) if inner.rng.random_bool(faults.hang.clamp(0.0, 1.0)) => {
                inner.stats.injected_hangs += 1;
                Some(Duration::from_millis(faults.hang_ms))
            }
            Err(e) if e.status == 403 && inner.rng.random_bool(faults.hang_refusals.clamp(0.0, 1.0)) => {
                inner.stats.injected_hangs += 1;
                Some(Duration::from_millis(faults.hang_ms))
            }
            _ => None,
        };
        if let (Some(key), Ok(value)) = (key, &result) {
            let ready_at = now + hang.unwrap_or_default();
            inner.idempotency.store(key, body, Bytes::from(value.to_string()), now, ready_at);
        }
        (result, rate, hang, accepted)
    }

    fn remember(&self, req: &HttpRequest, result: &Result<Value, ApiError>, hung: bool) {
        let body = serde_json::from_slice::<Value>(req.body()).unwrap_or_default();
        let emails = match &body {
            Value::Array(items) => items.len(),
            Value::Object(_) => 1,
            _ => 0,
        };
        let first = if body.is_array() { &body[0] } else { &body };
        let campaign = first["tags"].as_array().and_then(|tags| {
            tags.iter().find(|t| t["name"] == "campaign").and_then(|t| t["value"].as_str()).map(str::to_string)
        });
        let seen = Seen {
            idempotency_key: req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string),
            emails,
            campaign,
            status: result.as_ref().map_or_else(|e| e.status.as_u16(), |_| 200),
            hung,
            at: arrival(req),
        };
        let mut inner = self.lock();
        if inner.seen.len() == SEEN_LIMIT {
            inner.seen.pop_front();
        }
        inner.seen.push_back(seen);
    }
}

/// The item a path names under `prefix` (`/emails/{id}`): one non-empty segment.
fn item<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix).filter(|id| !id.is_empty() && !id.contains('/'))
}

/// When the request's head arrived: the rate limit counts requests then, as a
/// provider's edge would.
fn arrival(req: &HttpRequest) -> Instant {
    req.extensions().get::<server::Arrived>().map_or_else(Instant::now, |a| a.0)
}
