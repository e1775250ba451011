//! A push service (RFC 8030) and the browsers behind it, for the Web Push channel (what
//! the demo, the tests and the chaos bench point subscriptions at). It hands out
//! subscriptions as a browser's `pushManager.subscribe` would (`POST /subscriptions`
//! with the application server key, or [`PushService::subscribe`]); it takes
//! `POST /push/<n>` the way a push service does: the VAPID token must verify against its
//! `k=` key, be for this origin and unexpired, and `k=` must be the key the subscription
//! was made with; `TTL` is required, `Urgency` and `Topic` are checked; the payload must
//! be at most 4096 bytes and decrypt with the subscription's keys. It stores each
//! encrypted payload per subscription, holds a message until its browser takes it (a
//! newer message with the same `Topic` replaces one it still holds), and counts what each
//! browser was shown per (subscription, tag): the same tag twice is a duplicate. Faults:
//! every n-th subscription gone (410), the service down (503), the next n requests
//! throttled (429 with `Retry-After`), answers held back past the client's timeout,
//! requests held unanswered until released (`holds`, by request path), browsers offline
//! (messages held).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use hyper::{Method, StatusCode};
use p256::SecretKey;

use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::model::webpush::{self as crypto, b64_decode, new_secret, public_b64};

/// What the push service and its browsers saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PushStats {
    /// Subscriptions handed out.
    pub subscriptions: u64,
    /// Requests of any kind to a subscription.
    pub received: u64,
    /// Messages taken (201).
    pub created: u64,
    /// Refused for their VAPID token or key (401, 403).
    pub rejected: u64,
    /// Refused as malformed (400, 415) or too large (413).
    pub malformed: u64,
    /// Answered 410 (a gone subscription).
    pub gone: u64,
    /// Answered 404 (no such subscription).
    pub not_found: u64,
    /// Answered 429.
    pub throttled: u64,
    /// Answered 503 while down.
    pub refused_while_down: u64,
    /// Held messages replaced by a newer one with the same `Topic`.
    pub replaced: u64,
    /// Notifications shown by browsers.
    pub shown: u64,
    /// Notifications shown again with a tag the browser had shown already.
    pub duplicates: u64,
}

/// One browser's private key (base64url scalar), auth secret, and each encrypted payload it
/// was sent with the `Authorization` header it came with.
pub type PushTaken = (String, [u8; 16], Vec<(Vec<u8>, String)>);

/// One subscription: the browser's keys, and what reached it.
struct Browser {
    /// The endpoint's last segment: a push service's endpoints are capability URLs.
    token: String,
    secret: SecretKey,
    auth: [u8; 16],
    /// The application server key it was made with (`k=` must be it).
    server_key: String,
    gone: bool,
    /// Encrypted payloads taken, in order, with the `Authorization` each came with.
    stored: Vec<(Vec<u8>, String)>,
    /// Messages held for the browser: (topic, tag).
    held: Vec<(Option<String>, String)>,
    /// Tag → times shown.
    shown: HashMap<String, u64>,
}

#[derive(Default)]
struct PushInbox {
    stats: PushStats,
    browsers: Vec<Browser>,
}

/// The push service; clones share it.
#[derive(Clone)]
pub struct PushService {
    state: Arc<Mutex<PushInbox>>,
    origin: Arc<Mutex<String>>,
    down: Arc<AtomicBool>,
    offline: Arc<AtomicBool>,
    gone_every: Arc<AtomicU64>,
    throttle: Arc<Mutex<(u64, u64)>>,
    /// Each answer is held back this long (ms) after the request was handled: a client
    /// that gives up sooner never hears that its message was taken.
    slow_ms: Arc<AtomicU64>,
    /// Requests held unanswered until released, by path (`/push/<n>/<token>`).
    pub holds: super::hold::Holds,
}

impl Default for PushService {
    fn default() -> Self {
        PushService::new()
    }
}

impl PushService {
    pub fn new() -> PushService {
        PushService {
            state: Arc::default(),
            origin: Arc::default(),
            down: Arc::default(),
            offline: Arc::default(),
            gone_every: Arc::default(),
            throttle: Arc::default(),
            slow_ms: Arc::default(),
            holds: super::hold::Holds::default(),
        }
    }

    /// While true, every request is answered 503.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// While true, browsers take nothing: messages are held (and replaced by topic).
    pub fn set_offline(&self, offline: bool) {
        self.offline.store(offline, Ordering::SeqCst);
        if !offline {
            self.show();
        }
    }

    /// Every `n`-th subscription handed out from now on is gone: answered 410 (0: none).
    pub fn set_gone_every(&self, n: u64) {
        self.gone_every.store(n, Ordering::SeqCst);
    }

    /// The next `n` requests are answered 429 with `Retry-After: seconds`.
    pub fn throttle(&self, n: u64, seconds: u64) {
        *self.throttle.lock().expect("throttle") = (n, seconds);
    }

    /// Answers are held back `ms` after each request is handled (0: at once).
    pub fn set_slow(&self, ms: u64) {
        self.slow_ms.store(ms, Ordering::SeqCst);
    }

    /// Where it serves (`http://127.0.0.1:PORT`) once spawned; its host and port are what
    /// `channels.push.allowed_hosts` lists for it.
    pub fn origin(&self) -> String {
        self.origin.lock().expect("origin").clone()
    }

    /// Its host and port, as `channels.push.allowed_hosts` lists a loopback push service.
    pub fn allowed_host(&self) -> String {
        self.origin().trim_start_matches("http://").to_string()
    }

    pub fn stats(&self) -> PushStats {
        self.state.lock().expect("push state").stats
    }

    /// A new subscription for an application whose server key is `server_key`, as a
    /// browser's `PushSubscription.toJSON()` gives it. Serve first: the endpoint names
    /// this service's address.
    pub fn subscribe(&self, server_key: &str) -> serde_json::Value {
        let secret = new_secret();
        let auth: [u8; 16] = rand::random();
        let keys = serde_json::json!({
            "p256dh": public_b64(&secret.public_key()),
            "auth": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(auth),
        });
        let mut s = self.state.lock().expect("push state");
        s.stats.subscriptions += 1;
        let every = self.gone_every.load(Ordering::SeqCst);
        let gone = every > 0 && s.stats.subscriptions.is_multiple_of(every);
        let n = s.browsers.len();
        let token: String = rand::random::<[u8; 12]>().iter().map(|b| format!("{b:02x}")).collect();
        s.browsers.push(Browser {
            token: token.clone(),
            secret,
            auth,
            server_key: server_key.to_string(),
            gone,
            stored: Vec::new(),
            held: Vec::new(),
            shown: HashMap::new(),
        });
        let origin = self.origin.lock().expect("origin").clone();
        serde_json::json!({ "endpoint": format!("{origin}/push/{n}/{token}"), "expirationTime": null, "keys": keys })
    }

    /// The request path of subscription `endpoint`: what [`PushService::holds`] keys on.
    pub fn path_of(endpoint: &str) -> &str {
        endpoint.find("/push/").map_or(endpoint, |at| &endpoint[at..])
    }

    /// The browser an endpoint (or its path) names.
    fn browser_of(endpoint: &str) -> Option<(usize, &str)> {
        let rest = &endpoint[endpoint.find("/push/")? + "/push/".len()..];
        let (n, token) = rest.split_once('/')?;
        Some((n.parse().ok()?, token))
    }

    /// Makes subscription `endpoint` gone: answered 410 from now on.
    pub fn make_gone(&self, endpoint: &str) {
        if let Some((n, _)) = Self::browser_of(endpoint)
            && let Some(b) = self.state.lock().expect("push state").browsers.get_mut(n)
        {
            b.gone = true;
        }
    }

    /// What a test needs to check one subscription's messages on its own: its private key
    /// (base64url scalar), its auth secret, and each encrypted payload taken with its
    /// `Authorization` header.
    pub fn taken(&self, endpoint: &str) -> Option<PushTaken> {
        let (n, _) = Self::browser_of(endpoint)?;
        let s = self.state.lock().expect("push state");
        let b = s.browsers.get(n)?;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        Some((b64.encode(b.secret.to_bytes()), b.auth, b.stored.clone()))
    }

    /// Tags shown per subscription (by endpoint index), how often each.
    pub fn shown(&self, endpoint: &str) -> HashMap<String, u64> {
        let n = Self::browser_of(endpoint).map(|(n, _)| n);
        let s = self.state.lock().expect("push state");
        n.and_then(|n| s.browsers.get(n)).map(|b| b.shown.clone()).unwrap_or_default()
    }

    /// Browsers that are online take what is held for them.
    pub fn show(&self) {
        if self.offline.load(Ordering::SeqCst) {
            return;
        }
        let mut s = self.state.lock().expect("push state");
        let PushInbox { stats, browsers } = &mut *s;
        for b in browsers.iter_mut() {
            for (_, tag) in b.held.drain(..) {
                let times = b.shown.entry(tag).or_default();
                *times += 1;
                stats.shown += 1;
                if *times > 1 {
                    stats.duplicates += 1;
                }
            }
        }
    }

    /// Serves on a free loopback port, browsers taking their messages every 20 ms:
    /// (origin, stop, task).
    pub async fn spawn_local(
        &self,
    ) -> std::io::Result<(String, crate::shutdown::Trigger, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let origin = format!("http://{}", listener.local_addr()?);
        *self.origin.lock().expect("origin") = origin.clone();
        let (stop, down) = crate::shutdown::channel();
        let this = self.clone();
        let handler = move |req: HttpRequest| {
            let this = this.clone();
            async move {
                this.holds.pass(req.uri().path()).await;
                let answer = this.handle(req);
                let slow = this.slow_ms.load(Ordering::SeqCst);
                if slow > 0 {
                    tokio::time::sleep(Duration::from_millis(slow)).await;
                }
                answer
            }
        };
        let browsers = self.clone();
        let task = tokio::spawn(async move {
            let shows = async {
                loop {
                    browsers.show();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::select! {
                _ = server::serve(listener, handler, down, server::ListenerLimits::default()) => {}
                _ = shows => {}
            }
            browsers.show();
        });
        Ok((origin, stop, task))
    }

    /// Answers one request.
    pub fn handle(&self, req: HttpRequest) -> HttpResponse {
        let path = req.uri().path();
        if path == "/subscriptions" && req.method() == Method::POST {
            let key = serde_json::from_slice::<serde_json::Value>(req.body())
                .ok()
                .and_then(|v| v["application_server_key"].as_str().map(str::to_string));
            return match key {
                Some(key) if b64_decode(&key).is_some() => server::json(StatusCode::CREATED, &self.subscribe(&key)),
                _ => server::text(StatusCode::BAD_REQUEST, "send {\"application_server_key\": \"<base64url>\"}"),
            };
        }
        let Some((n, token)) = Self::browser_of(path) else {
            return server::text(StatusCode::NOT_FOUND, "no such route");
        };
        if req.method() != Method::POST {
            return server::text(StatusCode::METHOD_NOT_ALLOWED, "use POST");
        }
        let origin = self.origin.lock().expect("origin").clone();
        let mut s = self.state.lock().expect("push state");
        s.stats.received += 1;
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let PushInbox { stats, browsers } = &mut *s;
        let Some(b) = browsers.get_mut(n).filter(|b| b.token == token) else {
            stats.not_found += 1;
            return server::text(StatusCode::NOT_FOUND, "no such subscription");
        };
        if self.down.load(Ordering::SeqCst) {
            stats.refused_while_down += 1;
            return server::text(StatusCode::SERVICE_UNAVAILABLE, "down");
        }
        {
            let mut t = self.throttle.lock().expect("throttle");
            if t.0 > 0 {
                t.0 -= 1;
                stats.throttled += 1;
                let mut r = server::text(StatusCode::TOO_MANY_REQUESTS, "slow down");
                r.headers_mut().insert("retry-after", t.1.into());
                return r;
            }
        }
        let vapid = match crypto::verify_vapid(&header("authorization").unwrap_or_default()) {
            Ok(v) => v,
            Err(why) => {
                stats.rejected += 1;
                return server::text(StatusCode::UNAUTHORIZED, why);
            }
        };
        let now = chrono::Utc::now().timestamp();
        if vapid.audience != origin || vapid.expires <= now || vapid.expires > now + 86_400 {
            stats.rejected += 1;
            return server::text(StatusCode::UNAUTHORIZED, "the token is not for this origin, or expired, or too long");
        }
        if vapid.key != b.server_key {
            stats.rejected += 1;
            return server::text(StatusCode::FORBIDDEN, "k= is not the key this subscription was made with");
        }
        if b.gone {
            stats.gone += 1;
            return server::text(StatusCode::GONE, "this subscription has expired or was unsubscribed");
        }
        let ttl_ok = header("ttl").is_some_and(|t| t.parse::<u64>().is_ok());
        let urgency_ok = header("urgency").is_none_or(|u| ["very-low", "low", "normal", "high"].contains(&u.as_str()));
        let topic = header("topic");
        let topic_ok = topic.as_ref().is_none_or(|t| {
            !t.is_empty() && t.len() <= 32 && t.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        });
        if !(ttl_ok && urgency_ok && topic_ok) || header("content-encoding").as_deref() != Some("aes128gcm") {
            stats.malformed += 1;
            return server::text(
                StatusCode::BAD_REQUEST,
                "TTL, Urgency, Topic or Content-Encoding is not as RFC 8030/8291 say",
            );
        }
        if req.body().len() > 4096 {
            stats.malformed += 1;
            return server::text(StatusCode::PAYLOAD_TOO_LARGE, "at most 4096 bytes");
        }
        let tag = crypto::decrypt(req.body(), &b.secret, &b.auth)
            .ok()
            .and_then(|plain| serde_json::from_slice::<serde_json::Value>(&plain).ok())
            .and_then(|v| v["tag"].as_str().map(str::to_string));
        let Some(tag) = tag else {
            stats.malformed += 1;
            return server::text(StatusCode::BAD_REQUEST, "the payload does not decrypt to a notification with a tag");
        };
        b.stored.push((req.body().to_vec(), header("authorization").unwrap_or_default()));
        match b.held.iter_mut().find(|(t, _)| t.is_some() && *t == topic) {
            Some(held) => {
                held.1 = tag;
                stats.replaced += 1;
            }
            None => b.held.push((topic, tag)),
        }
        stats.created += 1;
        let mut r = server::text(StatusCode::CREATED, "");
        r.headers_mut().insert("location", format!("/m/{n}/{}", b.stored.len()).parse().expect("a header value"));
        r
    }
}
