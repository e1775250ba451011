//! The render hook, against a small application on a port of its own that
//! checks every request's signature: send/skip per delivery, entitlement
//! revoked between kick and send, a hook that answers 500, garbage, too slowly
//! or only in part, a hook that is down for a while, an address it supplies that
//! bounced; and A/B variants whose exposures match what the provider accepted,
//! with faults injected.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hmac::{Hmac, Mac};
use hyper::StatusCode;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::VariantConfig;
use mailstream::config::{Config, RenderHookConfig, Secret, VariantsConfig};
use mailstream::http::server::{self, HttpRequest, HttpResponse};
use mailstream::shutdown::{self, Trigger};
use mailstream::tools::emulator::{EmulatorConfig, Faults};
use serde_json::{Value, json};
use sha2::Sha256;

const SECRET: &str = "render-hook-secret-0123";

/// How the application answers its next request.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Answer,
    Down,
    Garbage,
    /// Longer than the hook's timeout.
    Slow,
    /// Only every other delivery.
    Partial,
}

#[derive(Default)]
struct AppState {
    /// Modes for the next requests, in order; then `steady`.
    script: Vec<Mode>,
    steady: Option<Mode>,
    revoked: HashSet<String>,
    /// A variant to choose for subscribers whose id ends in this digit.
    choose_b_for: Option<char>,
    /// An address the provider refuses for subscribers whose id ends in this digit.
    refused_for: Option<char>,
    calls: u64,
    bad_signatures: u64,
    largest_request: usize,
}

#[derive(Clone)]
struct App {
    state: Arc<Mutex<AppState>>,
    url: String,
    _stop: Arc<Trigger>,
}

/// The ten lines the README shows an application, in Rust.
fn verified(req: &HttpRequest) -> bool {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let (timestamp, signature) = (header("mailstream-timestamp"), header("mailstream-signature"));
    let fresh = timestamp.parse::<i64>().is_ok_and(|t| (chrono::Utc::now().timestamp() - t).abs() <= 300);
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(req.body());
    let expected: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    fresh && signature.strip_prefix("v1=").is_some_and(|s| server::same_secret(s, &expected))
}

impl App {
    async fn start(state: AppState) -> App {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/render", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(state));
        let (stop, down) = shutdown::channel();
        let shared = state.clone();
        let handler = move |req: HttpRequest| {
            let state = shared.clone();
            async move { App::answer(&state, req).await }
        };
        tokio::spawn(server::serve(listener, handler, down, server::ListenerLimits::default()));
        App { state, url, _stop: Arc::new(stop) }
    }

    async fn answer(state: &Mutex<AppState>, req: HttpRequest) -> HttpResponse {
        let ok = verified(&req);
        let body: Value = serde_json::from_slice(req.body()).unwrap_or_default();
        let asked = body["deliveries"].as_array().cloned().unwrap_or_default();
        let (mode, revoked, choose_b, refused) = {
            let mut s = state.lock().unwrap();
            s.calls += 1;
            s.bad_signatures += u64::from(!ok);
            s.largest_request = s.largest_request.max(asked.len());
            let mode = if s.script.is_empty() { s.steady.unwrap_or(Mode::Answer) } else { s.script.remove(0) };
            (mode, s.revoked.clone(), s.choose_b_for, s.refused_for)
        };
        if !ok {
            return server::text(StatusCode::UNAUTHORIZED, "bad signature\n");
        }
        match mode {
            Mode::Down => return server::text(StatusCode::INTERNAL_SERVER_ERROR, "down\n"),
            Mode::Garbage => return server::text(StatusCode::OK, "<html>surprise</html>"),
            Mode::Slow => tokio::time::sleep(Duration::from_millis(1500)).await,
            Mode::Answer | Mode::Partial => {}
        }
        let answers: Vec<Value> = asked
            .iter()
            .enumerate()
            .filter(|(i, _)| mode != Mode::Partial || i % 2 == 0)
            .map(|(_, d)| {
                let (id, sub) = (d["delivery"].as_str().unwrap(), d["subscriber"].as_str().unwrap());
                if revoked.contains(sub) {
                    return json!({"delivery": id, "skip": "not_entitled"});
                }
                let variant = choose_b.filter(|c| sub.ends_with(*c)).map(|_| "b");
                let to = match refused.filter(|c| sub.ends_with(*c)) {
                    Some(_) => format!("app-{sub}@example.com"),
                    None => format!("delivered+app-{sub}@resend.dev"),
                };
                json!({"delivery": id, "send": {"to": to, "data": {"name": "from the app"}, "variant": variant}})
            })
            .collect();
        server::json(StatusCode::OK, &json!({ "deliveries": answers }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, AppState> {
        self.state.lock().unwrap()
    }
}

fn with_hook(app: &App) -> impl FnOnce(&mut Config) + '_ {
    move |c: &mut Config| {
        c.redis.partitions = 1;
        c.render_hook.secret = Some(Secret::new(SECRET));
        c.campaigns[0].render_hook = Some(RenderHookConfig { url: app.url.clone(), timeout_ms: 500, retries: 0 });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_decides_at_send_time_and_revoked_entitlements_get_nothing() {
    let app = App::start(AppState::default()).await;
    let mut world = World::with(Default::default(), with_hook(&app)).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(200).await;
    world.kick().await;
    // Between the kick and the send, the application revokes 10 % of the plans.
    app.state().revoked = subs.iter().step_by(10).map(|s| s.id.clone()).collect();
    let daemon = world.daemon();
    let counts = world.settled(Duration::from_secs(60)).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped, counts.failed), (180, 20, 0), "{counts:?}");
    let sends = emulator.sends_matching("");
    assert_eq!(sends.len(), 180);
    assert!(sends.keys().all(|to| to.starts_with("delivered+app-")), "the hook's address is used");
    for s in subs.iter().step_by(10) {
        let d = delivery(&world.store, &delivery_of(s).id()).await;
        assert_eq!((d["state"].as_str(), d["reason"].as_str()), ("skipped", "not_entitled"));
    }
    let state = app.state();
    assert_eq!(state.bad_signatures, 0);
    assert!(
        state.largest_request <= 100 && state.calls >= 2,
        "{} calls, largest {}",
        state.calls,
        state.largest_request
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_the_hook_supplies_is_checked_against_suppressions() {
    let app = App::start(AppState::default()).await;
    let mut world = World::with(Default::default(), with_hook(&app)).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(20).await;
    // The application keeps answering with an address that bounced for good; no
    // subscriber in the registry has it, so only the address itself can tell.
    let bounced: Vec<String> = subs.iter().step_by(5).map(|s| format!("delivered+app-{}@resend.dev", s.id)).collect();
    for (i, address) in bounced.iter().enumerate() {
        let act = mailstream::audience::suppression::Act::Suppress(mailstream::model::outcome::Why::Bounced);
        let event = format!("evt-{i}");
        mailstream::audience::suppression::apply(&world.store, &world.config, address, act, Some(&event))
            .await
            .unwrap();
    }
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(Duration::from_secs(60)).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped, counts.failed), (16, 4, 0), "{counts:?}");
    let sends = emulator.sends_matching("");
    for (s, address) in subs.iter().step_by(5).zip(&bounced) {
        assert!(!sends.contains_key(address), "{address} bounced and was mailed");
        let d = delivery(&world.store, &delivery_of(s).id()).await;
        assert_eq!((d["state"].as_str(), d["reason"].as_str()), ("skipped", "suppressed"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_fails_answers_garbage_is_slow_or_answers_in_part_delays_mail_and_fails_none() {
    use Mode::*;
    let script = vec![Down, Garbage, Slow, Partial, Down, Partial, Garbage];
    let app = App::start(AppState { script, ..Default::default() }).await;
    let mut world = World::with(Default::default(), with_hook(&app)).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(150).await;
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(Duration::from_secs(90)).await;
    let metrics = daemon.metrics.render();
    daemon.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.skipped), (150, 0, 0), "{counts:?}");
    assert_eq!((emulator.stats().emails_accepted, emulator.stats().duplicate_sends), (150, 0));
    assert!(app.state().script.is_empty(), "every bad answer was given");
    // The hook's families (tests/observability.rs pins the others), with their labels.
    for result in ["ok", "status", "garbage", "unreachable"] {
        let series = format!("mailstream_render_hook_requests_total{{campaign=\"weekly_digest\",result=\"{result}\"}}");
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
    assert!(metrics.contains("mailstream_render_hook_deferred_total{campaign=\"weekly_digest\"}"), "{metrics}");
    let deferred = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mailstream_render_hook_deferred_total{campaign=\"weekly_digest\"} "))
        .and_then(|n| n.trim().parse::<f64>().ok());
    assert!(deferred.is_some_and(|n| n > 0.0), "deliveries were put off, not failed: {metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_down_for_a_while_delays_every_delivery_and_all_are_sent_when_it_returns() {
    let app = App::start(AppState { steady: Some(Mode::Down), ..Default::default() }).await;
    let mut world = World::with(Default::default(), with_hook(&app)).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(60).await;
    world.kick().await;
    let daemon = world.daemon();
    // Down until every delivery has been put off at least three times.
    let store = world.store.clone();
    eventually(Duration::from_secs(60), || {
        let store = store.clone();
        async move {
            let all = deliveries(&store).await;
            let waits = |r: &std::collections::HashMap<String, String>| {
                r.get("hook_waits").and_then(|w| w.parse::<u32>().ok()).unwrap_or(0)
            };
            all.iter().all(|(_, r)| waits(r) >= 3).then_some(())
        }
    })
    .await
    .expect("deliveries are put off while the hook is down");
    assert_eq!(emulator.stats().emails_accepted, 0, "nothing is sent without the hook's answer");
    assert_eq!(world.counts().await.settled(), 0, "nothing failed");
    app.state().steady = Some(Mode::Answer);
    let counts = world.settled(Duration::from_secs(60)).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.failed), (60, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposures_equal_accepted_sends_per_variant_with_faults() {
    let app = App::start(AppState { choose_b_for: Some('7'), refused_for: Some('3'), ..Default::default() }).await;
    let mut world = World::with(Default::default(), |c| {
        with_hook(&app)(c);
        let arm = |name: &str, weight, subject: Option<&str>| VariantConfig {
            name: name.into(),
            weight,
            subject: subject.map(str::to_string),
            html: None,
            text: None,
        };
        c.campaigns[0].variants = VariantsConfig {
            enabled: true,
            arms: vec![arm("a", 1, None), arm("b", 1, Some("B: your week, {{ period }}"))],
        };
    })
    .await;
    let faults = Faults { server_error: 0.3, hang: 0.1, hang_ms: 2500, ..Default::default() };
    let (emulator, _stop) =
        world.emulator(EmulatorConfig { faults, requests_per_second: None, ..Default::default() }).await;
    // 300 subscribers; the provider refuses the tenth the application gives an
    // example.com address (failed: never an exposure); 5xx and lost answers are retried.
    let subs: Vec<Subscriber> = (0..300).map(subscriber).collect();
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(Duration::from_secs(120)).await;
    daemon.stop().await;
    let mut exposed_records: BTreeMap<String, u64> = BTreeMap::new();
    for (_, r) in deliveries(&world.store).await {
        if r.get("state").map(String::as_str) == Some("sent") {
            *exposed_records.entry(r.get("variant").cloned().unwrap_or_default()).or_default() += 1;
        }
    }
    let mut conn = world.store.conn().await.unwrap();
    let hash: BTreeMap<String, u64> =
        redis::cmd("HGETALL").arg(world.store.keys.counts(0, CAMPAIGN, &PERIOD)).query_async(&mut conn).await.unwrap();
    let exposed = |v: &str| hash.get(&format!("exposed:{v}")).copied().unwrap_or(0);
    let stats = emulator.stats();
    assert_eq!(stats.duplicate_sends, 0);
    assert_eq!(exposed("a") + exposed("b"), stats.emails_accepted, "exposures = accepted: {hash:?}");
    assert_eq!(exposed("a") + exposed("b"), counts.sent);
    assert_eq!(counts.failed, 30, "{counts:?}");
    assert_eq!((exposed("a"), exposed("b")), (exposed_records["a"], exposed_records["b"]));
    // The hook chose b for ids ending in 7; the rest split by the stable hash.
    for s in subs.iter().filter(|s| s.id.ends_with('7')) {
        let d = delivery(&world.store, &delivery_of(s).id()).await;
        if d["state"] == "sent" {
            assert_eq!(d["variant"], "b");
        }
    }
    let b_subjects = emulator.sends_matching("B: your week");
    assert_eq!(b_subjects.len() as u64, exposed("b"), "variant b's subject was sent exactly to its exposures");
}
