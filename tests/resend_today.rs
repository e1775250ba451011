//! Resend as it is today (docs/resend.md): its own suppression list mirrored through its
//! signed `suppression.*` webhooks and `suppressions sync` (seeded, paged, resumed, dry),
//! a 5 requests/s account under a config of 10, and failures and delays after a 200,
//! each against the emulator over real HTTP and a real Redis.

mod common;

use std::time::Duration;

use common::cli::{ANY_METRICS_PORT, TEST_REDIS, config_file, run, stdout};
use common::*;
use mailstream::audience::subscribers::Subscriber;
use mailstream::audience::suppression::{self, Act};
use mailstream::config::{Config, Secret};
use mailstream::model::outcome::Why;
use mailstream::model::svix::SigningKey;
use mailstream::ops::suppression_sync;
use mailstream::tools::emulator::{EmulatorConfig, SuppressionOrigin, WebhookTarget};
use mailstream::{Listeners, RunOptions};
use serde_json::{Value, json};

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

fn listening(c: &mut Config) {
    c.webhook.secrets = vec![Secret::new(SECRET)];
}

fn http() -> reqwest::Client {
    mailstream::resend::client::install_crypto_provider();
    reqwest::Client::builder().user_agent("resend-today-test").build().unwrap()
}

/// A daemon with a public listener of its own; returns it and the listener's URL.
async fn daemon_with_public(config: &Config) -> (Daemon, String) {
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", public.local_addr().unwrap());
    let listeners = Listeners { metrics: None, public: Some(public) };
    (Daemon::start_listening(config.clone(), RunOptions::default(), listeners), url)
}

/// POSTs `body` to the daemon's webhook endpoint signed as event `id`; the status.
async fn post_event(url: &str, id: &str, body: &Value) -> u16 {
    let ts = chrono::Utc::now().timestamp();
    let body = body.to_string();
    let sig = SigningKey::parse(SECRET).unwrap().sign(id, ts, body.as_bytes());
    http()
        .post(format!("{url}/webhooks/resend"))
        .header("svix-id", id)
        .header("svix-timestamp", ts.to_string())
        .header("svix-signature", sig)
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The suppression of `email` (reason, source), if any.
async fn suppressed(world: &World, email: &str) -> Option<(String, String)> {
    let listed = suppression::list(&world.store, Some(email)).await.unwrap();
    listed.first().map(|e| (e.reason.clone(), e.source.clone()))
}

fn suppression_event(kind: &str, email: &str, origin: &str) -> Value {
    json!({"type": kind, "created_at": "2026-12-06T00:00:00.000Z",
           "data": {"id": "9a1c", "email": email, "origin": origin, "source_id": null,
                    "created_at": "2026-12-06T00:00:00.000Z"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suppression_removed_lifts_resends_own_suppression_and_no_one_elses() {
    let world = World::with(Default::default(), listening).await;
    let subs = world.subscribers(6).await;
    let (daemon, url) = daemon_with_public(&world.config).await;
    let [provider, via_send, operator, complaint] = [0, 1, 2, 3].map(|i| subs[i].email.clone());
    // Resend lists two addresses (one through its list's webhook, one as a send it dropped);
    // an operator suppressed a third, a complaint a fourth.
    assert_eq!(
        post_event(&url, "msg_added_1", &suppression_event("suppression.added", &provider, "bounce")).await,
        200
    );
    let dropped = json!({"type": "email.suppressed", "data": {"email_id": "e", "to": [via_send],
                         "suppressed": {"reason": "previous_bounce"}}});
    assert_eq!(post_event(&url, "msg_dropped_1", &dropped).await, 200);
    let manual = Act::Suppress(Why::Manual);
    suppression::apply(&world.store, &world.config, &operator, manual, None).await.unwrap();
    let complained = json!({"type": "email.complained", "data": {"email_id": "e", "to": [complaint]}});
    assert_eq!(post_event(&url, "msg_complained_1", &complained).await, 200);
    assert_eq!(suppressed(&world, &provider).await, Some(("provider_suppressed".into(), "provider".into())));
    assert_eq!(suppressed(&world, &via_send).await, Some(("provider_suppressed".into(), "webhook".into())));
    // The kick leaves all four out.
    let kicked = world.kick().await;
    assert_eq!((kicked.new, kicked.not_eligible), (2, 4), "{kicked:?}");

    // Resend takes every one of them off its list.
    for (n, email) in [&provider, &via_send, &operator, &complaint].iter().enumerate() {
        let removed = suppression_event("suppression.removed", email, "manual");
        assert_eq!(post_event(&url, &format!("msg_removed_{n}"), &removed).await, 200);
    }
    // A repeat of an event changes nothing more.
    let again = suppression_event("suppression.removed", &operator, "manual");
    assert_eq!(post_event(&url, "msg_removed_2", &again).await, 200);
    let metrics = daemon.metrics.clone();
    daemon.stop().await;
    assert_eq!(suppressed(&world, &provider).await, None, "Resend's own, lifted");
    assert_eq!(suppressed(&world, &via_send).await, None, "Resend's own (a dropped send), lifted");
    assert_eq!(suppressed(&world, &operator).await, Some(("manual".into(), "operator".into())), "an operator's stays");
    assert_eq!(suppressed(&world, &complaint).await.map(|s| s.0), Some("complained".into()), "a complaint's stays");
    assert_eq!(metrics.webhook_requests("verified") + metrics.webhook_requests("duplicate"), 8);
    // Lifted in every partition's gate list too: the two lifted addresses are not
    // suppressed at the last gate, the other two still are.
    let mut conn = world.store.conn().await.unwrap();
    for (email, want) in [(&provider, false), (&via_send, false), (&operator, true), (&complaint, true)] {
        let a = world.store.keys.address(email);
        for p in 0..world.store.keys.partitions() {
            let there: bool = redis::cmd("HEXISTS")
                .arg(world.store.keys.suppressed(p))
                .arg(&a.hash)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(there, want, "partition {p}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_delays_after_a_200_are_recorded_counted_by_reason_and_reported() {
    let world = World::with(Default::default(), |c| {
        listening(c);
        c.http.admin_tokens = vec![Secret::new("an-admin-token-for-tests")];
    })
    .await;
    let subs = world.subscribers(4).await;
    world.kick().await;
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let private = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", public.local_addr().unwrap());
    let admin = format!("http://{}/admin/overview", private.local_addr().unwrap());
    let listeners = Listeners { metrics: Some(private), public: Some(public) };
    let daemon = Daemon::start_listening(world.config.clone(), RunOptions::default(), listeners);
    // No Resend answers (base_url is a closed port): the deliveries keep their records.
    let failed = |s: &Subscriber, reason: &str| {
        json!({"type": "email.failed", "data": {"email_id": "e", "to": [s.email], "tags": {"delivery": delivery_of(s).tag()},
               "failed": {"reason": reason}}})
    };
    assert_eq!(post_event(&url, "msg_f0", &failed(&subs[0], "reached_daily_quota")).await, 200);
    assert_eq!(post_event(&url, "msg_f0", &failed(&subs[0], "reached_daily_quota")).await, 200, "a repeat");
    assert_eq!(post_event(&url, "msg_f1", &failed(&subs[1], "reached_daily_quota")).await, 200);
    // Free text is no reason to count: it could hold an address.
    assert_eq!(post_event(&url, "msg_f2", &failed(&subs[2], "Mailbox of ann@x.example is full")).await, 200);
    let delayed = json!({"type": "email.delivery_delayed", "data": {"email_id": "e", "to": [subs[3].email],
                         "tags": {"delivery": delivery_of(&subs[3]).tag()}}});
    assert_eq!(post_event(&url, "msg_d3", &delayed).await, 200);
    // The admin overview's period row says it in its own column.
    let page = http().get(&admin).bearer_auth("an-admin-token-for-tests").send().await.unwrap().text().await.unwrap();
    let cell = page.split("class=\"after-acceptance\"").nth(1).unwrap_or_default().split("</td>").next().unwrap();
    assert!(
        cell.contains("3 failed")
            && cell.contains("reached_daily_quota 2")
            && cell.contains("other 1")
            && cell.contains("1 delayed"),
        "{cell}"
    );
    daemon.stop().await;

    let record = delivery(&world.store, &delivery_of(&subs[0]).id()).await;
    assert_eq!(record.get("provider_failed_reason").map(String::as_str), Some("reached_daily_quota"), "{record:?}");
    assert!(record.contains_key("ev_failed"));
    let figures = world.store.period_figures(CAMPAIGN, &PERIOD, mailstream::model::work::Channel::Email).await.unwrap();
    assert_eq!((figures.counts.provider_failed, figures.counts.delivery_delayed), (3, 1));
    assert_eq!(figures.provider_failed_by_reason, [("reached_daily_quota".into(), 2), ("other".into(), 1)].into());
    assert!(!format!("{figures:?}{record:?}").contains('@'), "no address kept");

    // `deliveries` shows it; the SLO report has its own line and keeps the rate as defined.
    let filter = mailstream::ops::deliveries::Filter {
        campaign: Some(CAMPAIGN.into()),
        period: Some(PERIOD.clone()),
        subscriber: Some(subs[0].id.clone()),
        statuses: vec![],
        since: None,
        limit: 10,
    };
    let page = mailstream::ops::deliveries::page(&world.store, &filter, None).await.unwrap();
    assert_eq!(page.rows[0].provider_failed.as_deref(), Some("reached_daily_quota"));
    let report = mailstream::ops::slo::evaluate(&world.store, &world.config, Some(CAMPAIGN), None).await.unwrap();
    let period = report.periods.iter().find(|p| p.period == *PERIOD).unwrap();
    assert_eq!((period.provider_failed, period.delivery_delayed, period.failed), (3, 1, 0));
    let text = mailstream::ops::slo::render(&report);
    assert!(
        text.contains("after the provider accepted them: 3 failed (other 1, reached_daily_quota 2), 1 delayed"),
        "{text}"
    );
}

#[test]
fn check_config_warns_above_resends_default_rate() {
    let warnings = |rate: &str| -> Vec<String> {
        let path = config_file(&format!("rate-{rate}.toml"), &[("requests_per_second = 10", rate)]);
        let out =
            common::cli::bin().args(["check-config", "--offline", "--json", "--config"]).arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
        report["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_string()).collect()
    };
    let above = warnings("requests_per_second = 10");
    assert!(above.iter().any(|w| w.contains("Resend's default limit of 5") && w.contains("raised")), "{above:?}");
    let at = warnings("requests_per_second = 5");
    assert!(!at.iter().any(|w| w.contains("default limit")), "{at:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_per_second_account_configured_at_ten_loses_at_most_one_seconds_excess() {
    let mut world = World::with(Default::default(), |c| {
        c.resend.requests_per_second = 10;
        c.resend.batch_size = 10;
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: Some(5), ..Default::default() }).await;
    world.subscribers(300).await;
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(Duration::from_secs(120)).await;
    daemon.stop().await;
    let stats = emulator.stats();
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (300, 0, 0), "{counts:?}");
    assert_eq!(stats.duplicate_sends, 0);
    assert_eq!(stats.distinct_sends, 300);
    // Before the first answer says 5, at most 10 requests leave in a second: at most 5 refused.
    assert!(stats.rate_limited <= 5, "{stats:?}");
    let mut conn = world.store.conn().await.unwrap();
    let rps: Option<u32> =
        redis::cmd("HGET").arg(world.store.keys.limiter()).arg("rps").query_async(&mut conn).await.unwrap();
    assert_eq!(rps, Some(5), "the team's limit adopted in the shared limiter");
}

/// The last stdout line of a `--json` command, parsed.
fn last_json(out: &std::process::Output) -> Value {
    let text = stdout(out);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|_| panic!("a JSON last line: {text}\n{}", String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_mirrors_a_seeded_list_lifts_what_resend_forgot_and_a_dry_run_writes_nothing() {
    let mut world = World::new().await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let api = world.config.resend.base_url.clone();
    let base_url = format!("base_url = \"{api}\"");
    let path = config_file(
        "sync.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            TEST_REDIS,
            ANY_METRICS_PORT,
            ("partitions = 1", "partitions = 2"),
        ],
    );
    let url = world.redis.url();
    let listed = ["ann@acme.example", "bob@other.example", "cid@third.example"];
    let seed = json!([{"email": listed[0], "origin": "bounce"}, {"email": listed[1], "origin": "complaint"},
                      {"email": listed[2]}]);
    let seeded = http().post(format!("{api}/_emulator/suppressions")).json(&seed).send().await.unwrap();
    assert_eq!(seeded.status(), 200);

    // A dry run says what would change and writes nothing, its cursor included.
    let keys_before = dbsize(&world).await;
    let dry = run(&path, &url, &["suppressions", "sync", "--dry-run", "--json"], "");
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    assert_eq!(last_json(&dry), json!({"added": 3, "lifted": 0, "unchanged": 0, "pages": 1}));
    assert_eq!(dbsize(&world).await, keys_before, "a dry run writes nothing");

    let synced = run(&path, &url, &["suppressions", "sync", "--json"], "");
    assert!(synced.status.success(), "{}", String::from_utf8_lossy(&synced.stderr));
    assert_eq!(last_json(&synced), json!({"added": 3, "lifted": 0, "unchanged": 0, "pages": 1}));
    let said = format!("{}{}", stdout(&synced), String::from_utf8_lossy(&synced.stderr));
    assert!(listed.iter().all(|a| !said.contains(a)), "no address in what it says: {said}");
    for address in listed {
        let found = run(&path, &url, &["suppressions", "list", "--email", address, "--json"], "");
        let entry = last_json(&found);
        assert_eq!(
            (entry["reason"].as_str(), entry["source"].as_str()),
            (Some("provider_suppressed"), Some("provider"))
        );
    }
    // Nothing changed: a second sync finds all three suppressed.
    let again = run(&path, &url, &["suppressions", "sync", "--json"], "");
    assert_eq!(last_json(&again), json!({"added": 0, "lifted": 0, "unchanged": 3, "pages": 1}));

    // An operator's suppression Resend never had, and Resend forgetting one of its own.
    assert!(run(&path, &url, &["suppressions", "add", "--email", "dan@acme.example"], "").status.success());
    let removed = http()
        .delete(format!("{api}/suppressions/{}", listed[1].replace('@', "%40")))
        .bearer_auth("re_cli_test")
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let dry = run(&path, &url, &["suppressions", "sync", "--dry-run", "--json"], "");
    assert_eq!(last_json(&dry), json!({"added": 0, "lifted": 1, "unchanged": 2, "pages": 1}));
    let lifted = run(&path, &url, &["suppressions", "sync", "--json"], "");
    assert_eq!(last_json(&lifted), json!({"added": 0, "lifted": 1, "unchanged": 2, "pages": 1}));
    let gone = run(&path, &url, &["suppressions", "list", "--email", listed[1], "--json"], "");
    assert_eq!(stdout(&gone).trim(), "", "lifted");
    let kept = run(&path, &url, &["suppressions", "list", "--email", "dan@acme.example", "--json"], "");
    assert_eq!(last_json(&kept)["source"], "operator", "an operator's stays");
    assert_eq!(emulator.suppression_list().len(), 2);
    let mut conn = world.store.conn().await.unwrap();
    let left: u64 = redis::cmd("EXISTS")
        .arg(world.store.keys.suppressions_sync())
        .arg(world.store.keys.suppressions_sync_seen())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "a completed sync leaves no cursor behind");
}

async fn dbsize(world: &World) -> u64 {
    let mut conn = world.store.conn().await.unwrap();
    redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_of_ten_thousand_goes_in_pages_and_resumes_where_it_stopped() {
    let mut world = World::new().await;
    let (emulator, _stop) =
        world.emulator(EmulatorConfig { requests_per_second: Some(50), ..Default::default() }).await;
    world.config.resend.requests_per_second = 50;
    for i in 0..10_000 {
        emulator.suppress(&format!("listed-{i:05}@person.example"), SuppressionOrigin::Bounce);
    }
    // Stopped (as by a crash) once three pages are kept...
    let (store, config) = (world.store.clone(), world.config.clone());
    let first = tokio::spawn(async move { suppression_sync::sync(&store, &config, false).await });
    let kept = eventually(Duration::from_secs(120), || {
        let store = world.store.clone();
        async move {
            let mut conn = store.conn().await.ok()?;
            let pages: Option<u64> = redis::cmd("HGET")
                .arg(store.keys.suppressions_sync())
                .arg("pages")
                .query_async(&mut conn)
                .await
                .ok()?;
            pages.filter(|&p| p >= 3)
        }
    })
    .await;
    first.abort();
    let _ = first.await;
    assert!(kept.is_some(), "three pages kept");
    // ...it resumes from its cursor, not from the start.
    let report = suppression_sync::sync(&world.store, &world.config, false).await.unwrap();
    assert_eq!(report.pages, 100, "{report:?}");
    assert_eq!(report.added + report.unchanged, 10_000, "{report:?}");
    assert!(report.added >= 9_900, "{report:?}");
    assert_eq!(report.lifted, 0);
    let all = suppression::list(&world.store, None).await.unwrap();
    assert_eq!(all.len(), 10_000);
    assert!(all.iter().all(|e| e.reason == "provider_suppressed" && e.source == "provider"));
    // Every one is in every partition's list the last gate reads.
    let mut conn = world.store.conn().await.unwrap();
    for p in 0..world.store.keys.partitions() {
        let n: u64 = redis::cmd("HLEN").arg(world.store.keys.suppressed(p)).query_async(&mut conn).await.unwrap();
        assert_eq!(n, 10_000, "partition {p}");
    }
    assert_eq!(emulator.stats().rate_limited, 0, "paced by the team's limiter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resends_list_reaches_the_daemon_through_its_webhooks_and_a_send_to_it_is_not_made() {
    let mut world = World::with(Default::default(), listening).await;
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", public.local_addr().unwrap());
    let target = WebhookTarget { url: format!("{url}/webhooks/resend"), secret: SECRET.into() };
    let (emulator, _stop) = world.emulator(EmulatorConfig { webhook: Some(target), ..Default::default() }).await;
    let api = world.config.resend.base_url.clone();
    let subs = world.subscribers(20).await;
    let listeners = Listeners { metrics: None, public: Some(public) };
    let daemon = Daemon::start_listening(world.config.clone(), RunOptions::default(), listeners);
    // Resend's list gains an address through its API (another product of the team, say).
    let added = http()
        .post(format!("{api}/suppressions"))
        .bearer_auth("re_test_key")
        .json(&json!({"email": subs[4].email}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 200);
    let mirrored = eventually(Duration::from_secs(30), || async {
        suppressed(&world, &subs[4].email).await.filter(|(reason, _)| reason == "provider_suppressed")
    })
    .await;
    assert_eq!(mirrored.map(|m| m.1), Some("provider".into()));
    // This week's digest leaves the address out: no slot spent on a send Resend would drop.
    world.kick().await;
    let counts = world.settled(Duration::from_secs(120)).await;
    assert_eq!((counts.sent, counts.enqueued), (19, 19), "{counts:?}");
    assert_eq!(emulator.stats().suppressed_sends, 0);
    // Resend forgets it: lifted here too.
    let removed = http()
        .delete(format!("{api}/suppressions/{}", subs[4].email.replace('@', "%40")))
        .bearer_auth("re_test_key")
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let lifted = eventually(Duration::from_secs(30), || async {
        suppressed(&world, &subs[4].email).await.is_none().then_some(())
    })
    .await;
    daemon.stop().await;
    assert!(lifted.is_some(), "suppression.removed lifted Resend's own suppression");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_new_event_type_signed_by_svixs_own_library_has_its_effect() {
    let world = World::with(Default::default(), listening).await;
    let subs = world.subscribers(3).await;
    world.kick().await;
    let (daemon, url) = daemon_with_public(&world.config).await;
    let tag = |s: &Subscriber| json!({"delivery": delivery_of(s).tag()});
    let events = [
        ("msg_lib_added", suppression_event("suppression.added", &subs[0].email, "complaint")),
        (
            "msg_lib_failed",
            json!({"type": "email.failed", "data": {"email_id": "e", "to": [subs[1].email],
            "tags": tag(&subs[1]), "failed": {"reason": "suspended_domain"}}}),
        ),
        (
            "msg_lib_delayed",
            json!({"type": "email.delivery_delayed", "data": {"email_id": "e", "to": [subs[2].email],
            "tags": tag(&subs[2])}}),
        ),
        ("msg_lib_removed", suppression_event("suppression.removed", &subs[0].email, "complaint")),
    ];
    let mut after_added = None;
    for (id, body) in &events {
        let body = body.to_string();
        let ts = chrono::Utc::now().timestamp();
        let status = http()
            .post(format!("{url}/webhooks/resend"))
            .header("svix-id", *id)
            .header("svix-timestamp", ts.to_string())
            .header("svix-signature", svix_signed(SECRET, id, ts, &body))
            .body(body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200, "{id}");
        if *id == "msg_lib_added" {
            after_added = Some(suppressed(&world, &subs[0].email).await);
        }
    }
    let metrics = daemon.metrics.clone();
    daemon.stop().await;
    assert_eq!(metrics.webhook_requests("verified"), 4, "{}", metrics.render());
    assert_eq!(after_added, Some(Some(("provider_suppressed".into(), "provider".into()))));
    assert_eq!(suppressed(&world, &subs[0].email).await, None, "removed again");
    let figures = world.store.period_figures(CAMPAIGN, &PERIOD, mailstream::model::work::Channel::Email).await.unwrap();
    assert_eq!((figures.counts.provider_failed, figures.counts.delivery_delayed), (1, 1));
    assert_eq!(figures.provider_failed_by_reason, [("suspended_domain".into(), 1)].into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_says_what_it_was_told_of_the_rate_once_and_warns_at_start() {
    let redis =
        mailstream::store::redis_server::RedisServer::start(Default::default()).await.expect("redis-server starts");
    let (emulator, api, _stop) =
        start_emulator(EmulatorConfig { requests_per_second: Some(5), ..Default::default() }).await;
    let base_url = format!("base_url = \"{api}\"");
    let path = config_file(
        "five.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            TEST_REDIS,
            ANY_METRICS_PORT,
            ("batch_size = 100", "batch_size = 1"),
        ],
    );
    let url = redis.url();
    for i in 0..6 {
        let (id, email) = (format!("u{i}"), format!("delivered+u{i}@resend.dev"));
        assert!(run(&path, &url, &["subscribe", "--id", &id, "--email", &email], "").status.success());
    }
    assert!(run(&path, &url, &["kick", "--campaign", "weekly_digest"], "").status.success());
    let mut daemon = common::cli::bin();
    daemon.arg("run").arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", &url);
    daemon.env("RESEND_API_KEY", "re_cli_test").stdout(std::process::Stdio::null());
    let daemon = Logged::spawn(&mut daemon);
    let sent = eventually(Duration::from_secs(60), || {
        let n = emulator.stats().distinct_sends;
        async move { (n >= 6).then_some(n) }
    })
    .await;
    daemon.signal("TERM");
    let (code, lines) = daemon.wait().await;
    assert_eq!((sent, code), (Some(6), Some(0)), "{lines:#?}");
    assert!(emulator.stats().requests >= 6);
    let told: Vec<&String> = lines.iter().filter(|l| l.contains("the provider's rate limit, first seen")).collect();
    assert_eq!(told.len(), 1, "once, however many answers said it: {lines:#?}");
    let said = |field: &str, n: u32| {
        told[0].contains(&format!("\"{field}\":{n}")) || told[0].contains(&format!("{field}={n}"))
    };
    assert!(said("ratelimit_limit", 5) && said("configured", 10), "{}", told[0]);
    assert!(lines.iter().any(|l| l.contains("Resend's default limit of 5")), "the warning at start: {lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_resend_refuses_or_does_not_answer_exits_as_the_contract_says() {
    let world = World::new().await;
    let url = world.redis.url();
    // A key Resend refuses: configuration, 78.
    let (_emulator, api, _stop) =
        start_emulator(EmulatorConfig { api_key: Some("re_right".into()), ..Default::default() }).await;
    let base_url = format!("base_url = \"{api}\"");
    let path = config_file(
        "sync-refused.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            TEST_REDIS,
            ANY_METRICS_PORT,
            ("partitions = 1", "partitions = 2"),
        ],
    );
    let refused = run(&path, &url, &["suppressions", "sync", "--json"], "");
    assert_eq!(refused.status.code(), Some(78), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("resend.api_key"));
    assert!(stdout(&refused).is_empty(), "no result on stdout");
    // Nothing listening: unavailable, 69, and the sync is kept to resume.
    let (_socket, port) = closed_port();
    let base_url = format!("base_url = \"http://127.0.0.1:{port}\"");
    let path = config_file(
        "sync-down.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            TEST_REDIS,
            ANY_METRICS_PORT,
            ("partitions = 1", "partitions = 2"),
        ],
    );
    let down = run(&path, &url, &["suppressions", "sync", "--json"], "");
    assert_eq!(down.status.code(), Some(69), "{}", String::from_utf8_lossy(&down.stderr));
    let mut conn = world.store.conn().await.unwrap();
    let kept: bool =
        redis::cmd("EXISTS").arg(world.store.keys.suppressions_sync()).query_async(&mut conn).await.unwrap();
    assert!(kept, "the interrupted sync is kept to resume");
}
