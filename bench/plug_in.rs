//! `bench/plug-in [--subscribers N] [--revoked F] [--transactional T] [--json]`:
//! the weekly digest to N subscribers through the render hook of a small
//! application (on loopback, checking every request's signature) that revokes
//! the fraction F of the plans between the kick and the send; T receipts posted
//! to the ingest API (`POST /v1/deliveries`, one per request) spread over the
//! digest's run; A/B variants a and b on. A private Redis (append-only, fsync
//! always) and the emulator at 10 requests/s. Reports what was sent and skipped,
//! each receipt's enqueue → accepted latency (Redis clock, from its record), the
//! exposures per variant beside what the provider accepted, and the hook's view.

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::StatusCode;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, RenderHookConfig, Secret};
use mailstream::http::server::{self, HttpRequest, HttpResponse};
use mailstream::model::work::TRANSACTIONAL;
use mailstream::ops::deliveries::Filter;
use mailstream::store::Store;
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::demo::{Transactional, transactional_latencies};
use mailstream::tools::emulator::{Emulator, EmulatorConfig, Stats};
use mailstream::{Listeners, RunOptions, shutdown};
use serde::Serialize;
use serde_json::json;

const HOOK_SECRET: &str = "bench-render-hook-secret";
const INGEST_TOKEN: &str = "bench-ingest-token-0123";
const RPS: u32 = 10;
/// `redis.partitions` of the run: one Redis, one partition.
const PARTITIONS: u16 = 1;

#[derive(Debug, Serialize)]
struct Report {
    subscribers: u64,
    revoked: u64,
    elapsed_seconds: f64,
    digest_sent: u64,
    digest_skipped_not_entitled: u64,
    digest_skipped_other: u64,
    digest_failed: u64,
    digest_outcome_unknown: u64,
    /// Digest emails sent per second over `rps × 100`, receipts' slots included.
    throughput_ratio: f64,
    transactional: Transactional,
    exposures: BTreeMap<String, u64>,
    provider: Stats,
    hook_requests: u64,
    hook_bad_signatures: u64,
    hook_largest_request: usize,
}

#[derive(Default)]
struct Hook {
    revoked: HashSet<String>,
    requests: u64,
    bad_signatures: u64,
    largest: usize,
}

fn main() -> ExitCode {
    let (mut subscribers, mut revoked, mut transactional, mut json) = (10_000u64, 0.1f64, 100u64, false);
    let mut with_hook = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_default();
        match arg.as_str() {
            "--subscribers" => subscribers = value().parse().expect("--subscribers needs a number"),
            "--revoked" => revoked = value().parse().expect("--revoked needs a fraction"),
            "--transactional" => transactional = value().parse().expect("--transactional needs a number"),
            "--json" => json = true,
            // For comparison: revocations written to the registry, no hook asked.
            "--no-hook" => with_hook = false,
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    match runtime.block_on(run(subscribers, revoked, transactional, with_hook)) {
        Ok(r) => {
            let t = &r.transactional;
            eprintln!(
                "digest: {} subscribers, {} sent, {} skipped not_entitled ({} revoked), {} skipped otherwise, {} failed, {} outcome unknown in {:.1} s ({:.3} of the ceiling)",
                r.subscribers,
                r.digest_sent,
                r.digest_skipped_not_entitled,
                r.revoked,
                r.digest_skipped_other,
                r.digest_failed,
                r.digest_outcome_unknown,
                r.elapsed_seconds,
                r.throughput_ratio
            );
            eprintln!(
                "transactional: {}/{} sent during the digest; enqueue to accepted p50 {} ms, p99 {} ms, max {} ms",
                t.sent, t.enqueued, t.p50_latency_ms, t.p99_latency_ms, t.max_latency_ms
            );
            eprintln!(
                "variants: exposures {:?}; provider accepted {} emails ({} of them receipts), {} duplicate sends, {} rate-limited, at most {} requests in a second",
                r.exposures,
                r.provider.emails_accepted,
                t.sent,
                r.provider.duplicate_sends,
                r.provider.rate_limited,
                r.provider.max_requests_in_1s
            );
            eprintln!(
                "render hook: {} requests (at most {} deliveries each), {} with a bad signature",
                r.hook_requests, r.hook_largest_request, r.hook_bad_signatures
            );
            if json {
                println!("{}", serde_json::to_string(&r).expect("serializes"));
            }
            let exposed: u64 = r.exposures.values().sum();
            let ok = r.digest_skipped_not_entitled == r.revoked
                && t.sent == t.enqueued
                && exposed + t.sent == r.provider.emails_accepted
                && r.provider.duplicate_sends == 0
                && r.hook_bad_signatures == 0;
            if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The application's render hook: checks the signature, skips revoked plans.
async fn answer(hook: &Mutex<Hook>, req: HttpRequest) -> HttpResponse {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let timestamp: i64 = header("mailstream-timestamp").parse().unwrap_or(0);
    let good = header("mailstream-signature")
        == mailstream::audience::render_hook::sign(HOOK_SECRET, timestamp, req.body())
        && (chrono::Utc::now().timestamp() - timestamp).abs() <= 300;
    let body: serde_json::Value = serde_json::from_slice(req.body()).unwrap_or_default();
    let asked = body["deliveries"].as_array().cloned().unwrap_or_default();
    let mut h = hook.lock().expect("hook lock");
    h.requests += 1;
    h.largest = h.largest.max(asked.len());
    if !good {
        h.bad_signatures += 1;
        return server::text(StatusCode::UNAUTHORIZED, "bad signature\n");
    }
    let answers: Vec<serde_json::Value> = asked
        .iter()
        .map(|d| {
            let (id, sub) = (d["delivery"].as_str().unwrap_or(""), d["subscriber"].as_str().unwrap_or(""));
            if h.revoked.contains(sub) {
                json!({"delivery": id, "skip": "not_entitled"})
            } else {
                json!({"delivery": id, "send": {"to": format!("delivered+{sub}@resend.dev"),
                    "data": {"highlights": ["3 new issues", "1 release"]}}})
            }
        })
        .collect();
    server::json(StatusCode::OK, &json!({ "deliveries": answers }))
}

async fn run(n: u64, revoked_share: f64, receipts: u64, with_hook: bool) -> anyhow::Result<Report> {
    eprintln!("partitions: {PARTITIONS}");
    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
    let hook = Arc::new(Mutex::new(Hook::default()));
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook_url = format!("http://{}/mailstream/render", app.local_addr()?);
    let (stop_app, app_down) = shutdown::channel();
    let shared = hook.clone();
    let handler = move |req| {
        let hook = shared.clone();
        async move { answer(&hook, req).await }
    };
    tokio::spawn(server::serve(app, handler, app_down, server::ListenerLimits::default()));

    let emulator = Emulator::new(EmulatorConfig { requests_per_second: Some(RPS), ..Default::default() });
    let (emulator_url, stop_emulator, _task) = emulator.spawn_local().await?;

    let mut config = Config::example();
    config.redis.url = Secret::new(redis.url());
    config.redis.partitions = PARTITIONS;
    config.resend.base_url = emulator_url;
    config.resend.api_key = Some(Secret::new("re_bench_key"));
    config.resend.requests_per_second = RPS;
    config.http.metrics_listen = None;
    config.http.ingest_tokens = vec![Secret::new(INGEST_TOKEN)];
    config.render_hook.secret = Some(Secret::new(HOOK_SECRET));
    let c = &mut config.campaigns[0];
    c.schedule = None;
    c.render_hook = with_hook.then_some(RenderHookConfig { url: hook_url, timeout_ms: 3000, retries: 1 });
    c.variants.enabled = true;
    config.validate()?;
    let campaign = config.campaigns[0].clone();

    let store = Store::open(&config).await?;
    let subs: Vec<Subscriber> = (0..n).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subs).await?;
    let period = mailstream::audience::kick::period_for(
        &store,
        &campaign,
        None,
        mailstream::audience::kick::PeriodRule::NearNow,
    )
    .await?;
    mailstream::audience::kick::kick_registry(&store, &config, &campaign.name, &period).await?;
    // Between the kick and the send, the application revokes a share of the plans.
    let every = (1.0 / revoked_share.max(1e-9)).round().max(1.0) as usize;
    let revoked: HashSet<String> = subs.iter().step_by(every).map(|s| s.id.clone()).collect();
    let revoked_count = revoked.len() as u64;
    if !with_hook {
        let mut changed: Vec<Subscriber> = subs.iter().filter(|s| revoked.contains(&s.id)).cloned().collect();
        changed.iter_mut().for_each(|s| s.entitled = false);
        subscribers::upsert(&store, &changed).await?;
    }
    hook.lock().expect("hook lock").revoked = revoked;

    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let ingest_url = format!("http://{}/v1/deliveries", public.local_addr()?);
    let (stop, down) = shutdown::channel();
    let listeners = Listeners { metrics: None, public: Some(public) };
    let daemon = tokio::spawn(mailstream::run_with(config.clone(), listeners, down, RunOptions::default()));
    let started = Instant::now();
    let day = store.time().await?.format("%Y-%m-%d").to_string();

    mailstream::resend::client::install_crypto_provider();
    let client = reqwest::Client::new();
    let expected = n as f64 / (f64::from(RPS) * 100.0);
    let spacing = Duration::from_secs_f64(expected * 0.8 / receipts.max(1) as f64);
    let mut posted = Vec::new();
    let deadline = started + Duration::from_secs_f64(expected * 4.0 + 120.0);
    loop {
        let counts = store.counts(&campaign.name, &period).await?;
        let digest_done = counts.settled() >= counts.enqueued;
        if (posted.len() as u64) < receipts && !digest_done && started.elapsed() >= spacing * posted.len() as u32 {
            let key = format!("bench-receipt-{}", posted.len());
            let item = json!({"idempotency_key": key, "to": format!("delivered+{key}@resend.dev"),
                "subject": "Your receipt", "text": "Thank you for your order."});
            let at = store.time().await?.timestamp_millis();
            let r = client
                .post(&ingest_url)
                .bearer_auth(INGEST_TOKEN)
                .body(json!({ "deliveries": [item] }).to_string())
                .send()
                .await?;
            anyhow::ensure!(r.status() == 202, "the ingest API answered {}", r.status());
            posted.push((key, at));
            continue;
        }
        // The receipts' counts matter only once the digest is done.
        let all_done = digest_done && store.counts(TRANSACTIONAL, &day).await?.settled() >= posted.len() as u64;
        if all_done || Instant::now() > deadline || daemon.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.trigger();
    daemon.await??;
    stop_emulator.trigger();
    stop_app.trigger();

    let counts = store.counts(&campaign.name, &period).await?;
    let transactional = transactional_latencies(&store, &day, &posted).await?;
    let exposures = store.exposures(&campaign.name, &period).await?;
    let skipped = Filter {
        campaign: Some(campaign.name.clone()),
        period: Some(period.clone()),
        statuses: vec!["skipped".into()],
        limit: 1000,
        ..Default::default()
    };
    let rows = mailstream::ops::deliveries::every(&store, &skipped).await?;
    let not_entitled = rows.iter().filter(|r| r.why.as_deref() == Some("not_entitled")).count() as u64;
    let h = hook.lock().expect("hook lock");
    Ok(Report {
        subscribers: n,
        revoked: revoked_count,
        elapsed_seconds: elapsed,
        digest_sent: counts.sent,
        digest_skipped_not_entitled: not_entitled,
        digest_skipped_other: counts.skipped - not_entitled,
        digest_failed: counts.failed,
        digest_outcome_unknown: counts.outcome_unknown,
        throughput_ratio: counts.sent as f64 / elapsed / (f64::from(RPS) * 100.0),
        transactional,
        exposures,
        provider: emulator.stats(),
        hook_requests: h.requests,
        hook_bad_signatures: h.bad_signatures,
        hook_largest_request: h.largest,
    })
}
