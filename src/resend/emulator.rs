//! A local Resend: `POST /emails` and `POST /emails/batch` with Resend's shapes
//! and rules (100-email batches, strict/permissive validation, idempotency with
//! replay and both 409s, the team rate limit with no burst and its headers,
//! User-Agent required, quotas), injectable faults, and counters that tests and
//! benchmarks read from `GET /_emulator/stats`. Nothing here reaches the network.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::http::{self, HttpRequest, HttpResponse};
use crate::id::new_uuid;

/// Idempotency keys are kept this long, as Resend does.
const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);

/// How the emulator behaves.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmulatorConfig {
    /// Team-wide requests per sliding second; more are answered 429. `None`: no limit.
    pub requests_per_second: Option<u32>,
    /// When set, only this API key is accepted (403 `invalid_api_key` otherwise).
    pub api_key: Option<String>,
    /// Seed for fault injection, so a faulty run can be replayed.
    pub seed: u64,
    pub faults: Faults,
}

/// Injected faults. Fractions are per request, in 0..=1.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Answer 500 `internal_server_error` or 503 without processing.
    pub server_error: f64,
    /// Process the request, then hold the answer for `hang_ms` (longer than the
    /// client's timeout: the email is sent, the response is lost).
    pub hang: f64,
    pub hang_ms: u64,
    /// Answer 409 `concurrent_idempotent_requests` to a keyed request without processing.
    pub concurrent: f64,
    /// 429 storms: after `after_requests` requests, every request for `duration_ms` is refused.
    pub storms: Vec<Storm>,
    /// Accept this many emails, then answer 429 `daily_quota_exceeded` until `quota_reset_ms` passes.
    pub quota_after_emails: Option<u64>,
    pub quota_reset_ms: Option<u64>,
    /// Senders (`from` domains) refused with 403 `validation_error` (an unverified domain).
    pub rejected_sender_domains: Vec<String>,
}

/// One 429 storm.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storm {
    pub after_requests: u64,
    pub duration_ms: u64,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig { requests_per_second: Some(10), api_key: None, seed: 1, faults: Faults::default() }
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
}

/// A keyed request's answer. Until `ready_at` (a hung request still "running")
/// the same key gets 409 `concurrent_idempotent_requests`.
struct Stored {
    body: Bytes,
    response: Bytes,
    at: Instant,
    ready_at: Instant,
}

/// One request as the emulator saw it (kept for tests and benchmarks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub idempotency_key: Option<String>,
    /// Emails in the body (0 when it was not a JSON array or object).
    pub emails: usize,
    pub status: u16,
}

/// Requests remembered by [`Emulator::seen`]; older ones are forgotten.
const SEEN_LIMIT: usize = 100_000;

struct Inner {
    stats: Stats,
    seen: VecDeque<Seen>,
    arrivals: VecDeque<Instant>,
    idempotency: HashMap<String, Stored>,
    sends: HashMap<(String, String), u32>,
    rng: StdRng,
    quota_used: u64,
    quota_since: Instant,
    storm_until: Option<Instant>,
    storms_started: usize,
}

/// A Resend emulator. Clone it to share state (a restart keeps the idempotency store).
#[derive(Clone)]
pub struct Emulator {
    config: Arc<EmulatorConfig>,
    inner: Arc<Mutex<Inner>>,
}

/// A refusal, written the way Resend writes errors.
struct ApiError {
    status: StatusCode,
    name: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: u16, name: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::from_u16(status).expect("valid status"), name, message: message.into() }
    }
}

impl Emulator {
    pub fn new(config: EmulatorConfig) -> Emulator {
        let now = Instant::now();
        Emulator {
            inner: Arc::new(Mutex::new(Inner {
                stats: Stats::default(),
                seen: VecDeque::new(),
                arrivals: VecDeque::new(),
                idempotency: HashMap::new(),
                sends: HashMap::new(),
                rng: StdRng::seed_from_u64(config.seed),
                quota_used: 0,
                quota_since: now,
                storm_until: None,
                storms_started: 0,
            })),
            config: Arc::new(config),
        }
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        self.inner.lock().expect("emulator lock").stats.clone()
    }

    /// Starts a new quota window now (the provider's daily quota renewed).
    pub fn renew_quota(&self) {
        let mut inner = self.inner.lock().expect("emulator lock");
        inner.quota_used = 0;
        inner.quota_since = Instant::now();
    }

    /// The requests seen so far to the sending endpoints, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        self.inner.lock().expect("emulator lock").seen.iter().cloned().collect()
    }

    /// Real sends of each recipient for subjects containing `needle` (a period, say).
    pub fn sends_matching(&self, needle: &str) -> HashMap<String, u32> {
        let inner = self.inner.lock().expect("emulator lock");
        let mut out = HashMap::new();
        for ((to, subject), n) in &inner.sends {
            if subject.contains(needle) {
                *out.entry(to.clone()).or_insert(0) += n;
            }
        }
        out
    }

    /// Serves on a fresh loopback port in the background (the demo, tests and
    /// benchmarks); returns the base URL, the trigger that stops it, and the task.
    pub async fn spawn_local(
        &self,
    ) -> std::io::Result<(String, crate::shutdown::Trigger, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop, down) = crate::shutdown::channel();
        Ok((url, stop, tokio::spawn(self.clone().serve(listener, down))))
    }

    /// Serves until `shutdown`.
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: crate::shutdown::Shutdown) {
        http::serve(
            listener,
            move |req| {
                let emulator = self.clone();
                async move { emulator.handle(req).await }
            },
            shutdown,
            Duration::from_secs(1),
        )
        .await
    }

    /// Answers one request.
    pub async fn handle(&self, req: HttpRequest) -> HttpResponse {
        let path = req.uri().path().to_string();
        match (req.method(), path.as_str()) {
            (&Method::GET, "/_emulator/stats") => {
                http::json(StatusCode::OK, &serde_json::to_value(self.stats()).expect("stats serialize"))
            }
            (&Method::POST, "/emails") => self.send(req, false).await,
            (&Method::POST, "/emails/batch") => self.send(req, true).await,
            (_, "/emails" | "/emails/batch") => {
                error_response(&ApiError::new(405, "method_not_allowed", "Method not allowed"), None)
            }
            _ => error_response(&ApiError::new(404, "not_found", "The requested endpoint does not exist."), None),
        }
    }

    async fn send(&self, req: HttpRequest, batch: bool) -> HttpResponse {
        let (result, rate, hang) = self.process(&req, batch);
        self.remember(&req, &result);
        let mut response = match result {
            Ok(body) => http::json(StatusCode::OK, &body),
            Err(e) => error_response(&e, rate.retry_after),
        };
        rate.write(response.headers_mut());
        if let Some(hang) = hang {
            // The email left; the answer arrives after the client gave up.
            tokio::time::sleep(hang).await;
        }
        response
    }

    /// Everything but the (async) hang, under the lock.
    fn process(&self, req: &HttpRequest, batch: bool) -> (Result<Value, ApiError>, RateInfo, Option<Duration>) {
        // The rate limit counts requests when their head arrives, as a provider's edge would.
        let now = req.extensions().get::<http::Arrived>().map_or_else(Instant::now, |a| a.0);
        let mut inner = self.inner.lock().expect("emulator lock");
        let inner = &mut *inner;
        inner.stats.requests += 1;
        let rate = inner.arrive(now, self.config.requests_per_second);

        if let Err(e) = self.check_headers(req) {
            return (Err(e), rate, None);
        }
        let storm = inner.in_storm(now, &self.config.faults);
        if rate.limited || storm.is_some() {
            inner.stats.rate_limited += 1;
            let mut rate = rate;
            if let Some(left) = storm {
                rate.retry_after = Some(left.as_millis().div_ceil(1000).max(1) as u64);
            }
            return (
                Err(ApiError::new(
                    429,
                    "rate_limit_exceeded",
                    "Too many requests. You can only make a limited number of requests per second.",
                )),
                rate,
                None,
            );
        }
        let key = match req.headers().get("idempotency-key").map(|v| v.to_str().map(str::to_string)) {
            None => None,
            Some(Ok(k)) if (1..=256).contains(&k.len()) => Some(k),
            Some(_) => {
                return (
                    Err(ApiError::new(400, "invalid_idempotency_key", "The key must be between 1-256 chars.")),
                    rate,
                    None,
                );
            }
        };
        let body = req.body().clone();
        if let Some(key) = &key {
            inner.idempotency.retain(|_, s| now.duration_since(s.at) <= IDEMPOTENCY_TTL);
            match inner.idempotency.get(key) {
                Some(stored) if now < stored.ready_at => {
                    inner.stats.concurrent_conflicts += 1;
                    return (Err(concurrent()), rate, None);
                }
                Some(Stored { body: original, response, .. }) => {
                    if *original == body {
                        inner.stats.replays += 1;
                        let value = serde_json::from_slice(response).expect("stored JSON");
                        return (Ok(value), rate, None);
                    }
                    inner.stats.idempotency_mismatches += 1;
                    return (
                        Err(ApiError::new(
                            409,
                            "invalid_idempotent_request",
                            "Same idempotency key used with a different request payload.",
                        )),
                        rate,
                        None,
                    );
                }
                None => {}
            }
        }

        let faults = &self.config.faults;
        if key.is_some() && inner.rng.random_bool(faults.concurrent.clamp(0.0, 1.0)) {
            inner.stats.concurrent_conflicts += 1;
            return (Err(concurrent()), rate, None);
        }
        if inner.rng.random_bool(faults.server_error.clamp(0.0, 1.0)) {
            inner.stats.injected_server_errors += 1;
            let e = if inner.rng.random_bool(0.5) {
                ApiError::new(500, "internal_server_error", "An unexpected error occurred.")
            } else {
                ApiError::new(503, "service_unavailable", "Service temporarily unavailable.")
            };
            return (Err(e), rate, None);
        }

        let result = inner.accept(&body, batch, req, faults, now);
        let hang = match &result {
            Ok(_) if inner.rng.random_bool(faults.hang.clamp(0.0, 1.0)) => {
                inner.stats.injected_hangs += 1;
                Some(Duration::from_millis(faults.hang_ms))
            }
            _ => None,
        };
        if let (Some(key), Ok(value)) = (key, &result) {
            let response = Bytes::from(value.to_string());
            let ready_at = now + hang.unwrap_or_default();
            inner.idempotency.insert(key, Stored { body, response, at: now, ready_at });
        }
        (result, rate, hang)
    }

    fn remember(&self, req: &HttpRequest, result: &Result<Value, ApiError>) {
        let emails = match serde_json::from_slice::<Value>(req.body()) {
            Ok(Value::Array(items)) => items.len(),
            Ok(Value::Object(_)) => 1,
            _ => 0,
        };
        let seen = Seen {
            idempotency_key: req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string),
            emails,
            status: result.as_ref().map_or_else(|e| e.status.as_u16(), |_| 200),
        };
        let mut inner = self.inner.lock().expect("emulator lock");
        if inner.seen.len() == SEEN_LIMIT {
            inner.seen.pop_front();
        }
        inner.seen.push_back(seen);
    }

    fn check_headers(&self, req: &HttpRequest) -> Result<(), ApiError> {
        let h = req.headers();
        if h.get(hyper::header::USER_AGENT).is_none_or(|v| v.is_empty()) {
            return Err(ApiError::new(403, "missing_user_agent", "A User-Agent header is required."));
        }
        let token = h
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|t| !t.is_empty());
        match (token, &self.config.api_key) {
            (None, _) => Err(ApiError::new(401, "missing_api_key", "Missing API key in the authorization header.")),
            (Some(t), Some(want)) if t != want => Err(ApiError::new(403, "invalid_api_key", "API key is invalid.")),
            _ => Ok(()),
        }
    }
}

fn concurrent() -> ApiError {
    ApiError::new(
        409,
        "concurrent_idempotent_requests",
        "Same idempotency key used while the original request is still in progress.",
    )
}

/// Rate-limit facts for one request.
#[derive(Debug, Clone, Copy)]
struct RateInfo {
    limited: bool,
    limit: Option<u32>,
    remaining: u32,
    reset_secs: u64,
    retry_after: Option<u64>,
}

impl RateInfo {
    fn write(&self, headers: &mut hyper::HeaderMap) {
        if let Some(limit) = self.limit {
            let mut set = |name: &'static str, value: u64| {
                headers.insert(name, value.into());
            };
            set("ratelimit-limit", u64::from(limit));
            set("ratelimit-remaining", u64::from(self.remaining));
            set("ratelimit-reset", self.reset_secs);
            if let Some(after) = self.retry_after {
                set("retry-after", after);
            }
        }
    }
}

impl Inner {
    /// Records an arrival in the sliding second and decides whether it is over the limit.
    fn arrive(&mut self, now: Instant, limit: Option<u32>) -> RateInfo {
        let second = Duration::from_secs(1);
        while self.arrivals.front().is_some_and(|&t| now.duration_since(t) >= second) {
            self.arrivals.pop_front();
        }
        // Heads are stamped before bodies are read, so arrivals may be handled out of order.
        let at = self.arrivals.iter().rposition(|&t| t <= now).map_or(0, |i| i + 1);
        self.arrivals.insert(at, now);
        let in_window = self.arrivals.iter().filter(|&&t| t <= now).count() as u64;
        self.stats.max_requests_in_1s = self.stats.max_requests_in_1s.max(in_window);
        let oldest = *self.arrivals.front().expect("just inserted");
        let reset_secs = (second.saturating_sub(now.duration_since(oldest)).as_millis() as u64).div_ceil(1000).max(1);
        match limit {
            Some(limit) => {
                let limited = in_window > u64::from(limit);
                RateInfo {
                    limited,
                    limit: Some(limit),
                    remaining: u32::try_from(u64::from(limit).saturating_sub(in_window)).unwrap_or(0),
                    reset_secs,
                    retry_after: limited.then_some(reset_secs),
                }
            }
            None => RateInfo { limited: false, limit: None, remaining: 0, reset_secs, retry_after: None },
        }
    }

    /// How much longer the current 429 storm lasts, if one is on.
    fn in_storm(&mut self, now: Instant, faults: &Faults) -> Option<Duration> {
        if let Some(storm) = faults.storms.get(self.storms_started)
            && self.stats.requests > storm.after_requests
        {
            self.storms_started += 1;
            self.storm_until = Some(now + Duration::from_millis(storm.duration_ms));
        }
        self.storm_until.and_then(|until| until.checked_duration_since(now)).filter(|d| !d.is_zero())
    }

    /// Validates and "sends" a request's emails.
    fn accept(
        &mut self,
        body: &[u8],
        batch: bool,
        req: &HttpRequest,
        faults: &Faults,
        now: Instant,
    ) -> Result<Value, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|_| ApiError::new(400, "validation_error", "Request body is not valid JSON."))?;
        let emails: Vec<Value> = if batch {
            match value {
                Value::Array(items) => items,
                _ => return Err(ApiError::new(422, "validation_error", "The batch must be a JSON array of emails.")),
            }
        } else {
            vec![value]
        };
        if batch && emails.len() > 100 {
            return Err(ApiError::new(422, "validation_error", "Too many emails: a batch holds at most 100."));
        }
        if batch && emails.is_empty() {
            return Err(ApiError::new(422, "validation_error", "The batch is empty."));
        }
        let permissive = batch
            && req
                .headers()
                .get("x-batch-validation")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"permissive"));

        let checked: Vec<Result<Recipients, ApiError>> = emails.iter().map(|e| validate(e, batch, faults)).collect();
        if !permissive && let Some(Err(first)) = checked.iter().find(|c| c.is_err()) {
            return Err(ApiError::new(first.status.as_u16(), first.name, first.message.clone()));
        }
        let valid = checked.iter().filter(|c| c.is_ok()).count() as u64;
        if let Some(quota) = faults.quota_after_emails {
            if faults.quota_reset_ms.is_some_and(|ms| now.duration_since(self.quota_since) >= Duration::from_millis(ms))
            {
                self.quota_used = 0;
                self.quota_since = now;
            }
            if self.quota_used + valid > quota {
                self.stats.quota_refusals += 1;
                return Err(ApiError::new(
                    429,
                    "daily_quota_exceeded",
                    "You have reached your daily email sending quota.",
                ));
            }
            self.quota_used += valid;
        }

        let mut data = Vec::new();
        let mut errors = Vec::new();
        for (index, c) in checked.into_iter().enumerate() {
            match c {
                Ok(recipients) => {
                    for to in recipients.to {
                        self.record_send(to, recipients.subject.clone());
                    }
                    self.stats.emails_accepted += 1;
                    data.push(json!({ "id": new_uuid() }));
                }
                Err(e) => {
                    self.stats.invalid_emails += 1;
                    errors.push(json!({ "index": index, "message": e.message }));
                }
            }
        }
        if !batch {
            return Ok(data.pop().expect("one email"));
        }
        let mut out = json!({ "data": data });
        if permissive && !errors.is_empty() {
            out["errors"] = Value::Array(errors);
        }
        Ok(out)
    }

    fn record_send(&mut self, to: String, subject: String) {
        let n = self.sends.entry((to, subject)).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.stats.distinct_sends += 1;
        } else {
            self.stats.duplicate_sends += 1;
        }
    }
}

struct Recipients {
    to: Vec<String>,
    subject: String,
}

/// Resend's per-email rules, as far as mailstream relies on them.
fn validate(email: &Value, batch: bool, faults: &Faults) -> Result<Recipients, ApiError> {
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
    let to: Vec<String> = match obj.get("to") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        _ => return Err(missing("to")),
    };
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
fn bare_address(s: &str) -> &str {
    match (s.rfind('<'), s.rfind('>')) {
        (Some(open), Some(close)) if open < close => s[open + 1..close].trim(),
        _ => s.trim(),
    }
}

fn is_address(s: &str) -> bool {
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

fn error_response(e: &ApiError, retry_after: Option<u64>) -> HttpResponse {
    let mut response =
        http::json(e.status, &json!({ "statusCode": e.status.as_u16(), "name": e.name, "message": e.message }));
    if let Some(after) = retry_after {
        response.headers_mut().insert("retry-after", after.into());
    }
    response
}
