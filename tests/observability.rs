//! Seeing it rot: the metric families and their labels (pinned), every declared
//! series present after a faulty run, `promtool check metrics` on a real scrape,
//! gauges read from Redis at scrape time, the stuck scan, `mailstream slo` and its
//! exit codes, and a real Prometheus computing the failure-rate rule from a scrape
//! to the same number `mailstream slo --json` reports.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::audience::tokens::Tokens;
use mailstream::config::{EXAMPLE, Secret};
use mailstream::model::work::{Channel, DeliveryRef};
use mailstream::send::stuck::{self, StuckKind, StuckLimits};
use mailstream::store::scripts;
use mailstream::tools::emulator::{EmulatorConfig, Faults, Storm, WebhookTarget};
use mailstream::{Listeners, RunOptions};

const SETTLE: Duration = Duration::from_secs(120);
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const INGEST_TOKEN: &str = "an-ingest-token-of-16+";

/// Every family a daemon exports and its label names (histograms without `le`).
const FAMILIES: &[(&str, &[&str])] = &[
    ("mailstream_admin_actions_total", &["operation", "result"]),
    ("mailstream_app_requests_total", &["status_class"]),
    ("mailstream_backlog", &["kind", "partition"]),
    ("mailstream_batch_emails", &[]),
    ("mailstream_batch_retries_total", &["error"]),
    ("mailstream_build_info", &["version"]),
    ("mailstream_ceiling_emails_per_second", &[]),
    ("mailstream_dead_letters", &["kind"]),
    ("mailstream_deliveries_total", &["campaign", "channel", "outcome", "reason"]),
    ("mailstream_durability_relaxed", &[]),
    ("mailstream_ingest_items_total", &["result"]),
    ("mailstream_limiter_pacing_alone", &[]),
    ("mailstream_limiter_wait_seconds", &[]),
    ("mailstream_period_deliveries", &["campaign", "period", "channel", "state"]),
    ("mailstream_partition_unreplicated", &["partition"]),
    ("mailstream_period_duplicates", &["campaign", "period"]),
    ("mailstream_provider_down", &[]),
    ("mailstream_provider_request_duration_seconds", &["endpoint", "status_class"]),
    ("mailstream_provider_requests_total", &["action", "endpoint", "result", "status_class"]),
    ("mailstream_push_endpoints_refused_total", &["reason"]),
    ("mailstream_push_requests_total", &["status_class"]),
    ("mailstream_push_subscriptions_removed_total", &[]),
    ("mailstream_records_lost_total", &[]),
    ("mailstream_redis_errors_total", &["op"]),
    ("mailstream_redis_up", &[]),
    ("mailstream_request_slots_given_back_total", &["reason"]),
    ("mailstream_render_hook_deferred_total", &["campaign"]),
    ("mailstream_render_hook_requests_total", &["campaign", "result"]),
    ("mailstream_schedule_fires_total", &["campaign", "result"]),
    ("mailstream_schedule_last_fire_timestamp_seconds", &["campaign"]),
    ("mailstream_schedule_next_fire_timestamp_seconds", &["campaign"]),
    ("mailstream_sender_fallbacks_total", &["template"]),
    ("mailstream_sending_paused", &[]),
    ("mailstream_slo_failure_rate_objective", &[]),
    ("mailstream_slo_stuck_after_seconds", &[]),
    ("mailstream_stuck_deliveries", &["campaign", "kind"]),
    ("mailstream_suppressions_total", &["reason"]),
    ("mailstream_unreplicated_batches_total", &["partition"]),
    ("mailstream_unsubscribes_total", &["source"]),
    ("mailstream_variant_exposures", &["campaign", "period", "variant"]),
    ("mailstream_webhook_events_total", &["type"]),
    ("mailstream_webhook_requests_total", &["result"]),
    ("process_cpu_seconds_total", &[]),
    ("process_max_fds", &[]),
    ("process_open_fds", &[]),
    ("process_resident_memory_bytes", &[]),
    ("process_start_time_seconds", &[]),
    ("process_virtual_memory_bytes", &[]),
];

/// The values a label may take, where they come from a closed set.
const CLOSED_LABELS: &[(&str, &[&str])] = &[
    ("outcome", &["sent", "skipped", "failed", "outcome_unknown"]),
    ("status_class", &["2xx", "3xx", "4xx", "5xx", "other", "none"]),
    ("action", &["none", "retryable", "quota_exhausted", "sender_rejected", "fatal"]),
    ("endpoint", &["emails_batch"]),
    ("state", &["enqueued", "pending", "sent", "failed", "skipped", "outcome_unknown"]),
    (
        "kind",
        &[
            "stream_length",
            "unread",
            "unacked",
            "sealed_batches",
            "due_batches",
            "scheduled",
            "transactional_unread",
            "transactional_unacked",
            "failed",
            "unknown",
            "unclaimed",
            "lease_expired",
            "past_deadline",
        ],
    ),
    ("campaign", &["weekly_digest", "transactional"]),
    ("variant", &["a", "b"]),
    ("operation", &["retry", "retry_period", "lift"]),
];

/// Families only a campaign with a render hook exports; `tests/render_hook.rs`
/// checks them on a daemon that has one.
pub const HOOK_FAMILIES: &[&str] = &["mailstream_render_hook_deferred_total", "mailstream_render_hook_requests_total"];

/// Families only a daemon with the application or the push channel exports;
/// `tests/channels.rs` and `tests/push.rs` check them on one.
const CHANNEL_FAMILIES: &[&str] =
    &["mailstream_app_requests_total", "mailstream_push_endpoints_refused_total", "mailstream_push_requests_total"];

/// One sample of a scrape: family, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the text exposition into samples, naming each by its family (a
/// histogram's `_bucket`, `_sum` and `_count` belong to it; `le` is dropped).
fn samples(text: &str) -> Vec<Sample> {
    let histograms: BTreeSet<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.strip_suffix(" histogram")).collect();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (head, value) = line.rsplit_once(' ').expect("a sample line");
        let (name, labels) = match head.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').expect("closing brace"))),
            None => (head, BTreeMap::new()),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| histograms.contains(f)))
            .unwrap_or(name);
        let mut labels = labels;
        labels.remove("le");
        out.push((family.to_string(), labels, value.parse().unwrap_or(f64::NAN)));
    }
    out
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| c)),
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(name.trim_start_matches(',').to_string(), value);
        rest = &after[end..];
    }
    out
}

fn value(samples: &[Sample], family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(f, l, _)| f == family && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, _, v)| *v)
}

async fn scrape(url: &str) -> String {
    mailstream::resend::client::install_crypto_provider();
    reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap()
}

/// A tool the test needs, or a clear message of how to get it.
fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("{name} is needed for this test: apt-get install prometheus (.ci/run installs it)"))
}

async fn bound() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_run_exports_every_declared_family_with_pinned_labels() {
    let mut world = World::with(Default::default(), |c| {
        c.webhook.secrets = vec![Secret::new(SECRET)];
        c.unsubscribe.secrets = vec![Secret::new("an-unsubscribe-secret")];
        c.resend.batch_size = 10;
        // A schedule whose last fire (three hours ago) is past its catch-up window: missed.
        c.campaigns[0].schedule = Some(daily_three_hours_ago());
        c.campaigns[0].catch_up_hours = 1;
        c.campaigns[0].variants.enabled = true;
        c.http.ingest_tokens = vec![Secret::new(INGEST_TOKEN)];
    })
    .await;
    let (public, public_url) = bound().await;
    let (metrics_listener, metrics_url) = bound().await;
    let faults = Faults {
        server_error: 0.2,
        storms: vec![Storm { after_requests: 2, duration_ms: 300, retry_after_seconds: Some(1) }],
        ..Default::default()
    };
    let webhook = Some(WebhookTarget { url: format!("{public_url}/webhooks/resend"), secret: SECRET.into() });
    let (emulator, _stop) =
        world.emulator(EmulatorConfig { requests_per_second: None, faults, webhook, ..Default::default() }).await;
    let mut subs: Vec<Subscriber> = (0..60).map(subscriber).collect();
    subs[3].email = "bounced+u3@resend.dev".into();
    subs[4].email = "complained+u4@resend.dev".into();
    subs[5].email = "someone@example.com".into(); // Resend refuses example.com with 422
    subscribers::upsert(&world.store, &subs).await.unwrap();
    // Last week's period, by hand: the schedule's missed fire is this week's, never kicked.
    let kicked = week(-1);
    let kick = || mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &kicked);
    kick().await.unwrap();
    kick().await.unwrap(); // duplicates
    // A deployment that first ran a day ago: the fire three hours ago is its to miss.
    let day_ago = world.store.time().await.unwrap().timestamp_millis() - 86_400_000;
    let mut conn = world.store.conn().await.unwrap();
    let meta = world.store.keys.meta();
    let _: () = redis::cmd("HSET").arg(&meta).arg("first_run_ms").arg(day_ago).query_async(&mut conn).await.unwrap();
    let listeners = Listeners { metrics: Some(metrics_listener), public: Some(public) };
    let daemon = Daemon::start_listening(world.config.clone(), RunOptions::default(), listeners);
    let settled = eventually(SETTLE, || async {
        let c = world.store.counts(CAMPAIGN, &kicked).await.ok()?;
        (c.enqueued > 0 && c.settled() >= c.enqueued).then_some(c)
    })
    .await
    .expect("settled");
    assert_eq!(settled.failed, 1, "{settled:?}");
    // Two receipts through the ingest API, one of them twice, and one refused.
    let receipt = |key: &str| serde_json::json!({"idempotency_key": key, "to": "delivered@resend.dev", "subject": "r", "text": "t"});
    let body =
        serde_json::json!({"deliveries": [receipt("r1"), receipt("r2"), receipt("r1"), {"idempotency_key": "r3"}]});
    let r = reqwest::Client::new()
        .post(format!("{public_url}/v1/deliveries"))
        .bearer_auth(INGEST_TOKEN)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 207);
    // One-click unsubscribe, and the webhooks the emulator posts back.
    let token = Tokens::new(&world.config.unsubscribe.secrets).make(&subs[7].id, CAMPAIGN).unwrap();
    let r = reqwest::Client::new()
        .post(format!("{public_url}/u/{token}"))
        .body("List-Unsubscribe=One-Click")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let all_in = eventually(Duration::from_secs(60), || {
        let stats = emulator.stats();
        async move { (stats.webhooks_delivered >= 59).then_some(()) }
    })
    .await;
    assert!(all_in.is_some(), "{:?}", emulator.stats());

    let text = scrape(&metrics_url).await;
    let samples = samples(&text);
    // Fresh at scrape time: what Redis holds now, including a kick made elsewhere.
    let period =
        |state: &str| value(&samples, "mailstream_period_deliveries", &[("period", &kicked), ("state", state)]);
    assert_eq!(period("enqueued"), Some(60.0));
    assert_eq!(period("failed"), Some(1.0));
    assert_eq!(period("pending"), Some(0.0));
    assert_eq!(value(&samples, "mailstream_period_duplicates", &[("period", &kicked)]), Some(60.0));
    assert_eq!(value(&samples, "mailstream_backlog", &[("partition", "0"), ("kind", "unacked")]), Some(0.0));
    assert_eq!(value(&samples, "mailstream_dead_letters", &[("kind", "failed")]), Some(1.0));
    assert_eq!(value(&samples, "mailstream_redis_up", &[]), Some(1.0));
    assert_eq!(value(&samples, "mailstream_stuck_deliveries", &[("kind", "unclaimed")]), Some(0.0));
    assert_eq!(value(&samples, "mailstream_schedule_fires_total", &[("result", "missed")]), Some(1.0));

    // Redis gone: the scrape still answers, says so, and counts the error.
    let World { redis, .. } = world;
    drop(redis);
    let text_down = scrape(&metrics_url).await;
    let down = self::samples(&text_down);
    assert_eq!(value(&down, "mailstream_redis_up", &[]), Some(0.0));
    assert!(value(&down, "mailstream_redis_errors_total", &[("op", "scrape")]).is_some_and(|n| n >= 1.0));
    daemon.stop.trigger();
    daemon.task.abort();

    let mut found: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (family, labels, _) in samples.iter().chain(&down) {
        found.entry(family.clone()).or_default().extend(labels.keys().cloned());
        for (label, allowed) in CLOSED_LABELS {
            if let Some(v) = labels.get(*label) {
                assert!(allowed.contains(&v.as_str()), "{family}: {label}={v:?} is not one of {allowed:?}");
            }
        }
    }
    let pinned: BTreeMap<String, BTreeSet<String>> = FAMILIES
        .iter()
        .filter(|(f, _)| !HOOK_FAMILIES.contains(f) && !CHANNEL_FAMILIES.contains(f))
        .map(|(f, labels)| (f.to_string(), labels.iter().map(|l| l.to_string()).collect()))
        .collect();
    assert_eq!(found, pinned, "every declared family, with exactly its labels, and no other");
    assert!(!text.contains('@') && !text_down.contains('@'), "no address in any label");

    // Prometheus's own linter on the real scrape.
    let mut promtool = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stuck_scan_finds_unclaimed_expired_and_overdue_work_and_clears_once_settled() {
    let mut world = World::with(Default::default(), |c| c.redis.partitions = 1).await;
    world.store.ensure_groups(&world.config.redis.group).await.unwrap();
    let keys = world.store.keys.clone();
    let mut conn = world.store.conn().await.unwrap();
    // Three deliveries sealed into a batch whose holder died (their entries read too).
    let (_batch, sealed) = sealed_batch(&world, 3, "a-dead-holder", false).await;
    read_as_gone(&mut conn, &world, 3).await;
    // Five more, enqueued; one of them read and claimed by a holder that vanished.
    let more: Vec<Subscriber> =
        (0..).map(subscriber).filter(|s| keys.partition_of(&s.id) == 0).skip(3).take(5).collect();
    subscribers::upsert(&world.store, &more).await.unwrap();
    let items: Vec<DeliveryRef> = more.iter().map(delivery_of).collect();
    added(scripts::enqueue(&mut conn, &keys, 0, &items, 3600, window(&world.config, &PERIOD)).await.unwrap());
    read_as_gone(&mut conn, &world, 1).await;
    let claimed = scripts::claim(&mut conn, &keys, 0, &[items[0].id().as_str()], "a-vanished-holder", 1).await.unwrap();
    assert!(matches!(claimed[0], scripts::Claim::Claimed { .. }));
    // And a receipt in the transactional lane that nobody reads.
    let receipt = serde_json::json!({"idempotency_key": "stuck-receipt", "to": "delivered@resend.dev", "subject": "s", "text": "t"});
    mailstream::audience::ingest::enqueue(&world.store, &world.config, vec![receipt]).await.unwrap();
    let day = world.store.time().await.unwrap().format("%Y-%m-%d").to_string();

    // With the configured limits (stuck after an hour, 48 h deadline) nothing is stuck yet.
    let tally = stuck::look_everywhere(&world.store, &world.config).await.unwrap();
    assert!(tally.is_empty(), "{tally:?}");
    // With tight limits each kind is found, and only it.
    let tight = StuckLimits { stuck_after_ms: 1, lease_ms: 1, deadline_ms: 1, maybe_sent_deadline_ms: 1 };
    let look = |store: mailstream::store::Store| async move {
        let mut tally = stuck::Tally::new();
        stuck::look(&store, "mailstream", 0, &tight, &mut tally).await.unwrap();
        tally
    };
    let mut want: stuck::Tally =
        [(StuckKind::Unclaimed, 4), (StuckKind::LeaseExpired, 1), (StuckKind::PastDeadline, sealed.len() as u64)]
            .into_iter()
            .map(|(k, n)| ((CAMPAIGN.to_string(), PERIOD.to_string(), Channel::Email, k), n))
            .collect();
    want.insert(("transactional".to_string(), day.clone(), Channel::Email, StuckKind::Unclaimed), 1);
    let found = eventually(Duration::from_secs(10), || {
        let store = world.store.clone();
        let want = want.clone();
        async move { Some(look(store).await).filter(|t| *t == want) }
    })
    .await;
    assert!(found.is_some(), "wanted {want:?}, found {:?}", look(world.store.clone()).await);

    // A daemon settles everything; then nothing is stuck, even by the tight limits.
    let (_emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let daemon = world.daemon();
    world.settled(SETTLE).await;
    let cleared = eventually(Duration::from_secs(30), || {
        let store = world.store.clone();
        async move { Some(look(store).await).filter(|t| t.is_empty()) }
    })
    .await;
    let rendered = daemon.metrics.render();
    daemon.stop().await;
    assert!(cleared.is_some(), "{:?}", look(world.store.clone()).await);
    assert!(rendered.contains("mailstream_stuck_deliveries{campaign=\"weekly_digest\",kind=\"unclaimed\"} 0"));
}

/// Reads `n` entries of partition 0 as a consumer that then vanishes.
async fn read_as_gone(conn: &mut mailstream::store::Conn, world: &World, n: usize) {
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(&world.config.redis.group)
        .arg("gone")
        .arg("COUNT")
        .arg(n)
        .arg("STREAMS")
        .arg(world.store.keys.stream(0))
        .arg(">")
        .query_async(conn)
        .await
        .unwrap();
}

/// The shipped config for this world's Redis (relaxed durability, its partitions).
fn config_file(world: &World, dir: &Path, replace: &[(&str, &str)]) -> PathBuf {
    let mut text = EXAMPLE.replacen("durability = \"strict\"", "durability = \"relaxed\"", 1).replacen(
        "partitions = 1",
        &format!("partitions = {}", world.config.redis.partitions),
        1,
    );
    for (from, to) in replace {
        assert!(text.contains(from), "config.toml has no {from:?}");
        text = text.replacen(from, to, 1);
    }
    let path = dir.join(format!("config-{}.toml", replace.len()));
    std::fs::write(&path, text).unwrap();
    path
}

/// `mailstream slo ARGS --json` against `redis`: the exit code and the JSON report.
fn slo(config: &Path, redis: &str, args: &[&str]) -> (i32, Option<serde_json::Value>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mailstream"))
        .arg("slo")
        .args(args)
        .arg("--json")
        .arg("--config")
        .arg(config)
        .env("MAILSTREAM_REDIS_URL", redis)
        .env_remove("MAILSTREAM_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let json = stdout.lines().last().and_then(|l| serde_json::from_str(l).ok());
    (out.status.code().unwrap_or(-1), json, format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
}

/// A world where period `PERIOD` sent everything and `2026-W49` failed one of 20.
async fn a_week_sent_and_a_week_with_a_failure()
-> (World, mailstream::tools::emulator::Emulator, mailstream::shutdown::Trigger) {
    let mut world = World::new().await;
    let (emulator, stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let mut subs = world.subscribers(20).await;
    world.kick().await;
    let daemon = world.daemon();
    world.settled(SETTLE).await;
    subs[2].email = "someone@example.com".into(); // Resend refuses example.com with 422
    subscribers::upsert(&world.store, &subs[2..3]).await.unwrap();
    mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(1)).await.unwrap();
    let store = world.store.clone();
    let done = eventually(SETTLE, || {
        let store = store.clone();
        async move {
            let c = store.counts(CAMPAIGN, &week(1)).await.ok()?;
            (c.enqueued == 20 && c.settled() == 20).then_some(c)
        }
    })
    .await;
    daemon.stop().await;
    assert_eq!(done.map(|c| (c.sent, c.failed)), Some((19, 1)));
    (world, emulator, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_exits_0_within_3_when_breached_or_stuck_and_4_when_it_cannot_evaluate() {
    let (world, _emulator, _stop) = a_week_sent_and_a_week_with_a_failure().await;
    let dir = tempdir("slo");
    let config = config_file(&world, &dir, &[]);
    let redis = world.redis.url();

    let (code, report, out) = slo(&config, &redis, &["--campaign", CAMPAIGN, "--period", &PERIOD]);
    assert_eq!(code, 0, "{out}");
    let r = &report.unwrap()["periods"][0];
    assert_eq!((r["sent"].as_u64(), r["failure_rate"].as_f64()), (Some(20), Some(0.0)), "{out}");
    assert!(out.contains("within objectives"), "{out}");

    let (code, report, out) = slo(&config, &redis, &["--period", &week(1)]);
    assert_eq!(code, 3, "{out}");
    let r = &report.unwrap()["periods"][0];
    assert_eq!(r["failure_rate"].as_f64(), Some(1.0 / 20.0));
    assert_eq!(r["breached"], serde_json::json!(["failure_rate"]));
    // Without filters: every period in the retention, the worst decides.
    let (code, report, out) = slo(&config, &redis, &[]);
    assert_eq!((code, report.unwrap()["periods"].as_array().map(Vec::len)), (3, Some(2)), "{out}");

    // Stuck alone: a period enqueued with no daemon running, unread past stuck_after.
    let stuck_config = config_file(&world, &dir, &[("stuck_after_seconds = 3600", "stuck_after_seconds = 1")]);
    mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(2)).await.unwrap();
    let found = eventually(Duration::from_secs(30), || {
        let (config, redis) = (stuck_config.clone(), redis.clone());
        async move {
            let (code, report, _) = slo(&config, &redis, &["--period", &week(2), "--campaign", CAMPAIGN]);
            // Until all 20 have aged past the second: on a busy machine the kick's
            // partitions are enqueued far enough apart for one to age first.
            let all = report.as_ref().is_some_and(|r| r["periods"][0]["stuck"]["unclaimed"].as_u64() == Some(20));
            (code == 3 && all).then_some(report)
        }
    })
    .await;
    let r = found.flatten().expect("the unread period is reported stuck")["periods"][0].clone();
    assert_eq!(r["breached"], serde_json::json!(["stuck"]));
    assert_eq!((r["stuck"]["unclaimed"].as_u64(), r["failure_rate"].is_null()), (Some(20), true));

    // Could not evaluate: Redis unreachable, or a campaign nobody heard of.
    let (_socket, port) = closed_port();
    let (code, _, out) = slo(&config, &format!("redis://127.0.0.1:{port}"), &[]);
    assert_eq!(code, 4, "{out}");
    assert!(out.contains("could not be evaluated"), "{out}");
    let (code, _, out) = slo(&config, &redis, &["--campaign", "no_such_campaign"]);
    assert_eq!(code, 4, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_computes_the_failure_rate_that_slo_reports() {
    let prometheus = tool("prometheus");
    let (world, _emulator, _stop) = a_week_sent_and_a_week_with_a_failure().await;
    let (metrics_listener, metrics_url) = bound().await;
    let listeners = Listeners { metrics: Some(metrics_listener), public: None };
    let daemon = Daemon::start_listening(world.config.clone(), RunOptions::default(), listeners);

    // Prometheus on loopback: a 1 s scrape of this daemon and the shipped rules,
    // evaluated every second instead of every minute.
    let dir = tempdir("prometheus");
    let rules = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/rules.yml")).unwrap();
    assert!(rules.contains("interval: 1m"));
    std::fs::write(dir.join("rules.yml"), rules.replace("interval: 1m", "interval: 1s")).unwrap();
    let target = metrics_url.trim_start_matches("http://");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n\
         scrape_configs:\n  - job_name: mailstream\n    static_configs:\n      - targets: [\"{target}\"]\n"
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = mailstream::store::redis_server::free_port().unwrap();
    let mut server = Command::new(prometheus)
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("prometheus starts");
    let _kill = KillOnDrop(&mut server);
    let query = format!(
        "http://127.0.0.1:{port}/api/v1/query?query=mailstream:failure_rate:period%7Bperiod%3D%22{}%22%7D",
        week(1)
    );
    let from_prometheus = eventually(Duration::from_secs(120), || {
        let query = query.clone();
        async move {
            let body: serde_json::Value = reqwest::get(&query).await.ok()?.json().await.ok()?;
            let result = body["data"]["result"].as_array()?.first()?.clone();
            result["value"][1].as_str()?.parse::<f64>().ok()
        }
    })
    .await
    .expect("Prometheus evaluated mailstream:failure_rate:period from its scrapes");
    daemon.stop().await;

    let config = config_file(&world, &dir, &[]);
    let (code, report, out) = slo(&config, &world.redis.url(), &["--campaign", CAMPAIGN, "--period", &week(1)]);
    assert_eq!(code, 3, "{out}");
    let from_slo = report.unwrap()["periods"][0]["failure_rate"].as_f64().unwrap();
    println!("mailstream:failure_rate:period from Prometheus = {from_prometheus}; mailstream slo --json = {from_slo}");
    assert_eq!(from_prometheus, from_slo);
}

struct KillOnDrop<'a>(&'a mut std::process::Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mailstream-{name}-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64
}

#[test]
fn the_dashboard_and_the_rules_name_only_series_that_exist() {
    let root = env!("CARGO_MANIFEST_DIR");
    let rules = std::fs::read_to_string(format!("{root}/dashboards/rules.yml")).unwrap();
    let dashboard = std::fs::read_to_string(format!("{root}/dashboards/mailstream.json")).unwrap();
    let _: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let recorded: BTreeSet<String> =
        rules.lines().filter_map(|l| l.trim().strip_prefix("- record: ")).map(|r| r.trim().to_string()).collect();
    let known: BTreeSet<&str> = FAMILIES.iter().map(|(f, _)| *f).collect();
    let mut named = BTreeSet::new();
    for text in [&rules, &dashboard] {
        let mut rest = text.as_str();
        while let Some(at) = rest.find(['m', 'p']) {
            rest = &rest[at..];
            let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            let word = &rest[..len];
            let series = ["mailstream_", "mailstream:", "process_"].iter().any(|p| word.starts_with(p));
            if series && !word.ends_with(':') && !word.ends_with('_') && word.len() > "mailstream:".len() {
                named.insert(word.to_string());
            }
            rest = &rest[len.max(1)..];
        }
    }
    assert!(named.len() > 20, "{named:?}");
    for name in &named {
        let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        assert!(
            known.contains(family) || known.contains(name.as_str()) || recorded.contains(name),
            "dashboards/ names {name}, which mailstream does not export and no rule records"
        );
    }
}
