//! A small application endpoint for the application channel (what the demo, the
//! tests and the chaos bench point `[channels.app] url` at): it verifies each request's
//! Standard Webhooks signature, takes each event id once (as an application that dedups
//! on `webhook-id` does), counts an id taken a second time as a duplicate, and answers
//! what it is told to: normally 200; while `down`, 503; every `gone_every`-th new id, 410;
//! the next n requests 429 with `Retry-After` (`throttle`); requests held unanswered until
//! released (`holds`, by `webhook-id`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hyper::StatusCode;

use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::model::svix::{self, SigningKey};

/// What the endpoint saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AppStats {
    /// Requests of any kind.
    pub received: u64,
    /// Requests whose signature did not verify (answered 401).
    pub rejected: u64,
    /// Distinct event ids taken (answered 2xx).
    pub taken: u64,
    /// Requests of an id already taken (answered 200 again, and counted).
    pub duplicates: u64,
    /// Ids answered 410.
    pub gone: u64,
    /// Requests answered 503 while down.
    pub refused_while_down: u64,
    /// Requests answered 429.
    pub throttled: u64,
}

/// A taken event as it arrived: its `webhook-*` and content-type headers, and its body.
pub type AppTaken = (Vec<(String, String)>, Vec<u8>);

#[derive(Default)]
struct AppInbox {
    stats: AppStats,
    /// Event id → how often it was taken.
    taken: HashMap<String, u64>,
    /// Ids seen at all (for `gone_every`), in order of first sight.
    first_seen: u64,
    gone: std::collections::HashSet<String>,
    /// Each taken event's body, by id (what a test reads back).
    bodies: HashMap<String, AppTaken>,
}

/// The endpoint; clones share it.
#[derive(Clone)]
pub struct AppEndpoint {
    key: SigningKey,
    state: Arc<Mutex<AppInbox>>,
    down: Arc<AtomicBool>,
    gone_every: Arc<AtomicU64>,
    /// (requests left to answer 429, their `Retry-After` in seconds).
    throttle: Arc<Mutex<(u64, u64)>>,
    /// Requests held unanswered until released, by `webhook-id` (the delivery id).
    pub holds: super::hold::Holds,
}

impl AppEndpoint {
    /// An endpoint verifying with `secret` (`whsec_<base64>`).
    pub fn new(secret: &str) -> anyhow::Result<AppEndpoint> {
        let key = SigningKey::parse(secret).ok_or_else(|| anyhow::anyhow!("not a whsec_ secret"))?;
        Ok(AppEndpoint {
            key,
            state: Arc::default(),
            down: Arc::default(),
            gone_every: Arc::new(AtomicU64::new(0)),
            throttle: Arc::default(),
            holds: super::hold::Holds::default(),
        })
    }

    /// While true, every request is answered 503 (the application is down).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Every `n`-th new id is answered 410 (0: none).
    pub fn set_gone_every(&self, n: u64) {
        self.gone_every.store(n, Ordering::SeqCst);
    }

    /// The next `n` requests are answered 429 with `Retry-After: seconds`.
    pub fn throttle(&self, n: u64, seconds: u64) {
        *self.throttle.lock().expect("throttle") = (n, seconds);
    }

    pub fn stats(&self) -> AppStats {
        self.state.lock().expect("endpoint state").stats
    }

    /// The headers and body of the taken event `id`.
    pub fn taken(&self, id: &str) -> Option<AppTaken> {
        self.state.lock().expect("endpoint state").bodies.get(id).cloned()
    }

    /// Every taken event id.
    pub fn taken_ids(&self) -> Vec<String> {
        self.state.lock().expect("endpoint state").taken.keys().cloned().collect()
    }

    /// Serves on a free loopback port: (url, stop, task).
    pub async fn spawn_local(
        &self,
    ) -> std::io::Result<(String, crate::shutdown::Trigger, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/events", listener.local_addr()?);
        let (stop, down) = crate::shutdown::channel();
        let this = self.clone();
        let handler = move |req: HttpRequest| {
            let this = this.clone();
            async move {
                let id = req.headers().get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                this.holds.pass(&id).await;
                this.handle(req)
            }
        };
        Ok((url, stop, tokio::spawn(server::serve(listener, handler, down, server::ListenerLimits::default()))))
    }

    /// Answers one request.
    pub fn handle(&self, req: HttpRequest) -> HttpResponse {
        let mut s = self.state.lock().expect("endpoint state");
        s.stats.received += 1;
        let Some(signed) = svix::Signed::from_headers(req.headers()) else {
            s.stats.rejected += 1;
            return server::text(StatusCode::UNAUTHORIZED, "no signature");
        };
        let now = chrono::Utc::now().timestamp();
        if svix::verify(std::slice::from_ref(&self.key), &signed, req.body(), now).is_err() {
            s.stats.rejected += 1;
            return server::text(StatusCode::UNAUTHORIZED, "bad signature");
        }
        let id = signed.id.to_string();
        if self.down.load(Ordering::SeqCst) {
            s.stats.refused_while_down += 1;
            return server::text(StatusCode::SERVICE_UNAVAILABLE, "down");
        }
        {
            let mut t = self.throttle.lock().expect("throttle");
            if t.0 > 0 {
                t.0 -= 1;
                s.stats.throttled += 1;
                let mut r = server::text(StatusCode::TOO_MANY_REQUESTS, "slow down");
                r.headers_mut().insert("retry-after", t.1.into());
                return r;
            }
        }
        if s.gone.contains(&id) {
            return server::text(StatusCode::GONE, "gone");
        }
        if !s.taken.contains_key(&id) {
            s.first_seen += 1;
            let every = self.gone_every.load(Ordering::SeqCst);
            if every > 0 && s.first_seen.is_multiple_of(every) {
                s.stats.gone += 1;
                s.gone.insert(id);
                return server::text(StatusCode::GONE, "gone");
            }
        }
        let times = s.taken.entry(id.clone()).or_default();
        *times += 1;
        if *times > 1 {
            s.stats.duplicates += 1;
        } else {
            s.stats.taken += 1;
            let headers = req
                .headers()
                .iter()
                .filter(|(name, _)| name.as_str().starts_with("webhook-") || name.as_str() == "content-type")
                .map(|(name, v)| (name.to_string(), v.to_str().unwrap_or_default().to_string()))
                .collect();
            s.bodies.insert(id, (headers, req.body().to_vec()));
        }
        server::text(StatusCode::OK, "ok")
    }
}
