//! The `mailstream` binary as an operator meets it: config errors, an
//! unreachable Redis, a Redis that may lose writes, an unreachable provider,
//! what the README's commands report, signals and restarts (`tests/readme.rs`
//! runs the README's lines as written).

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::cli::*;
use common::{Logged, closed_port, logged_addr};
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::emulator::{EmulatorConfig, Faults};

#[test]
fn check_config_accepts_the_shipped_file() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    // With the secrets the README exports; `--offline` without the Resend key.
    let out = bin().args(["check-config", "--config"]).arg(&path).env("RESEND_API_KEY", "re_x").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout(&out).contains(": ok"));
    let out = bin().args(["check-config", "--offline", "--config"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn bad_config_is_one_clear_error_naming_the_key() {
    let unknown = config_file("unknown.toml", &[("batch_size = 100", "batch_sise = 100")]);
    let out = bin().args(["check-config", "--config"]).arg(&unknown).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "sysexits' EX_CONFIG");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: ") && err.contains("batch_sise"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let nonsense = config_file(
        "nonsense.toml",
        &[("batch_size = 100", "batch_size = 500"), ("time_zone = \"Asia/Tokyo\"", "time_zone = \"Asia/Tokio\"")],
    );
    let out = bin().args(["check-config", "--config"]).arg(&nonsense).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "sysexits' EX_CONFIG");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resend.batch_size") && err.contains("campaign[0].time_zone"), "{err}");

    let out = bin().args(["check-config", "--config", "/nonexistent/mailstream.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "sysexits' EX_CONFIG");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0].matches("No such file").count(), 1, "said once: {lines:?}");
    assert!(lines[0].starts_with("error: the config file: cannot read /nonexistent/mailstream.toml"), "{lines:?}");
}

#[tokio::test]
async fn unreachable_redis_is_one_clear_error() {
    let (_reserved, port) = closed_port();
    let path = config_file("noredis.toml", &[]);
    let out = bin()
        .args(["kick", "--campaign", "weekly_digest", "--config"])
        .arg(&path)
        .env("MAILSTREAM_REDIS_URL", format!("redis://127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "sysexits' EX_UNAVAILABLE");
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("error: cannot reach Redis at redis://127.0.0.1:"), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_lose_writes_is_refused_unless_relaxed() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let strict = config_file("strict.toml", &[ANY_METRICS_PORT]);
    let out = run(&strict, &redis.url(), &["run"], "");
    assert_eq!(out.status.code(), Some(78), "a configuration refusal: {}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    let last: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).expect("the last log line is JSON");
    let said = last["message"].as_str().unwrap();
    assert!(said.contains("appendonly no") && said.contains("redis.durability = \"relaxed\""), "{err}");

    // The same Redis with append-only persistence and fsync always is accepted.
    let durable = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await.unwrap();
    let mut daemon = bin();
    daemon.arg("run").arg("--config").arg(&strict).env("MAILSTREAM_REDIS_URL", durable.url());
    daemon.env("RESEND_API_KEY", "re_cli_test").stdout(Stdio::null());
    let daemon = Logged::spawn(&mut daemon);
    let running = daemon.line_with("mailstream running", Duration::from_secs(60)).await;
    daemon.signal("TERM");
    let (code, lines) = daemon.wait().await;
    assert!(running.is_some(), "{lines:#?}");
    assert_eq!(code, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_and_kick_from_the_command_line() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let path = config_file("kick.toml", &[]);
    let url = redis.url();
    let out = run(
        &path,
        &url,
        &["subscribe", "--id", "u1", "--email", "a@acme.example", "--target", "t1", "--target", "t2"],
        "",
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ndjson = "{\"id\":\"u2\",\"email\":\"b@acme.example\"}\n{\"id\":\"u3\",\"email\":\"c@acme.example\",\"entitled\":false}\n";
    let out = run(&path, &url, &["subscribe", "--ndjson", "-"], ndjson);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let out = run(&path, &url, &["kick", "--campaign", "weekly_digest"], "");
    assert!(stdout(&out).contains("3 new, 0 duplicates, 1 not eligible"), "{}", stdout(&out));
    let out = run(&path, &url, &["kick", "--campaign", "weekly_digest"], "");
    assert!(stdout(&out).contains("0 new, 3 duplicates"));

    // An audience on stdin: upserted, then only those are enqueued.
    let out = run(
        &path,
        &url,
        &["kick", "--campaign", "weekly_digest", "--audience", "-"],
        "{\"id\":\"u4\",\"email\":\"d@acme.example\"}\n{\"id\":\"u2\",\"email\":\"b@acme.example\"}\n",
    );
    assert!(stdout(&out).contains("1 new, 1 duplicates"), "{}", stdout(&out));

    // A failed export is not a silent success: refused input data (65).
    let out = run(&path, &url, &["kick", "--campaign", "weekly_digest", "--audience", "-"], "");
    assert_eq!(out.status.code(), Some(65));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is empty"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&path, &url, &["kick", "--campaign", "weekly_digest", "--audience", "-", "--allow-empty"], "");
    assert!(out.status.success() && stdout(&out).contains("0 new"), "{}", stdout(&out));

    let out = run(&path, &url, &["kick", "--campaign", "weekly_digest", "--period", "2026-48"], "");
    assert_eq!(out.status.code(), Some(64), "a malformed period is a bad value");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a week period"));
    let out = run(
        &path,
        &url,
        &["kick", "--campaign", "weekly_digest", "--audience", "-"],
        "{\"id\":\"u5\",\"email\":\"secret@person.example\",\"x\":1}\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1") && !err.contains("secret@person"), "{err}");
    // An address mistaken for an id is not echoed back.
    let out = run(
        &path,
        &url,
        &["kick", "--campaign", "weekly_digest", "--audience", "-"],
        "{\"id\":\"ann@person.example\",\"email\":\"ann@person.example\"}\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("subscriber id must be") && !err.contains("ann@person"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_periods_are_checked_against_redis_time_and_the_retention() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let path = config_file("periods.toml", &[]);
    let url = redis.url();
    run(&path, &url, &["subscribe", "--id", "u1", "--email", "a@acme.example"], "");
    let now = chrono::Utc::now().with_timezone(&chrono_tz::Asia::Tokyo);
    let week = |days: i64| {
        let w = (now + chrono::Duration::days(days)).iso_week();
        format!("{}-W{:02}", w.year(), w.week())
    };
    // The next week is fine; three weeks ahead needs saying so; ten weeks back is refused outright.
    let out = run(&path, &url, &["kick", "--campaign", "weekly_digest", "--period", &week(7)], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&path, &url, &["kick", "--campaign", "weekly_digest", "--period", &week(21)], "");
    assert_eq!(out.status.code(), Some(64), "a period far from now without the flag is a bad value");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-any-period"));
    let out =
        run(&path, &url, &["kick", "--campaign", "weekly_digest", "--period", &week(21), "--allow-any-period"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Ten weeks back: its kick window (35 days from its start) has ended. Refused with 64, and
    // nothing is written (not even the fan-out's record), with or without --dry-run.
    let keys = || async {
        let mut conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
        let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
        keys.sort();
        keys
    };
    let before = keys().await;
    for dry in [false, true] {
        let mut args = vec!["kick", "--campaign", "weekly_digest", "--allow-any-period", "--json"];
        let old = week(-70);
        args.extend(["--period", &old]);
        if dry {
            args.push("--dry-run");
        }
        let out = run(&path, &url, &args, "");
        assert_eq!(out.status.code(), Some(64), "dry run {dry}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("the period {old}'s dedup has expired (kept until "))
                && err.contains("could send twice"),
            "{err}"
        );
        assert_eq!(keys().await, before, "dry run {dry}: nothing written");
    }
}

use chrono::Datelike;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_commands_do_what_the_readme_says() {
    let mut world = common::World::new().await;
    let config = EmulatorConfig { api_key: Some("re_right".into()), ..Default::default() };
    let (_emulator, _stop) = world.emulator(config).await;
    let base_url = format!("base_url = \"{}\"", world.config.resend.base_url);
    let path = config_file(
        "readme.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            TEST_REDIS,
            ANY_METRICS_PORT,
            ("partitions = 1", "partitions = 2"),
        ],
    );
    let url = world.redis.url();

    assert!(run(&path, &url, &["check-config"], "").status.success());
    assert!(
        run(&path, &url, &["subscribe", "--id", "u42", "--email", "ann@acme.example", "--target", "team-7"], "")
            .status
            .success()
    );
    assert!(run(&path, &url, &["subscribe", "--id", "u42", "--entitled", "false"], "").status.success());
    let ndjson = std::env::temp_dir().join(format!("mailstream-readme-{}.ndjson", std::process::id()));
    std::fs::write(&ndjson, "{\"id\":\"u43\",\"email\":\"delivered+u43@resend.dev\",\"targets\":[\"team-7\"],\"entitled\":true,\"subscribed\":true,\"data\":{\"name\":\"Ann\"}}\n").unwrap();
    assert!(run(&path, &url, &["subscribe", "--ndjson", ndjson.to_str().unwrap()], "").status.success());
    let schedule = run(&path, &url, &["schedule", "--next", "3", "--json"], "");
    let said = String::from_utf8_lossy(&schedule.stderr);
    assert!(said.contains("no campaign has a schedule"), "the tests' config has none: {said}");
    assert_eq!(stdout(&schedule).trim(), "{\"campaigns\":[]}", "with --json, stdout is the object alone");
    let shipped = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let fires = run(&shipped, &url, &["schedule", "--next", "3", "--json"], "");
    let json: serde_json::Value = serde_json::from_str(&stdout(&fires)).unwrap();
    let first = &json["campaigns"][0]["fires"][0];
    assert!(first["local"].as_str().unwrap().ends_with("T09:00:00+09:00"), "{json}");
    assert!(first["utc"].as_str().unwrap().ends_with("T00:00:00+00:00"), "{json}");
    let dry = run(&path, &url, &["kick", "--campaign", "weekly_digest", "--dry-run"], "");
    assert!(
        stdout(&dry).contains("nothing written") && stdout(&dry).contains("1 deliveries would be new"),
        "{}",
        stdout(&dry)
    );
    assert!(stdout(&dry).contains("not eligible, not_entitled: 1"), "{}", stdout(&dry));
    let preview = run(&path, &url, &["preview", "--campaign", "weekly_digest", "--subscriber", "u43"], "");
    assert!(stdout(&preview).contains("subject: Your weekly digest"), "{}", stdout(&preview));
    let not_entitled = run(&path, &url, &["preview", "--campaign", "weekly_digest", "--subscriber", "u42"], "");
    let refusal = String::from_utf8_lossy(&not_entitled.stderr);
    assert!(refusal.contains("would not be sent: not_entitled") && not_entitled.stdout.is_empty(), "{refusal}");
    let kicked = run(&path, &url, &["kick", "--campaign", "weekly_digest"], "");
    assert!(stdout(&kicked).contains("1 new"), "{}", stdout(&kicked));

    // The daemon, with the wrong API key: every delivery becomes a dead letter.
    let mut daemon = bin();
    daemon.arg("run").arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", &url);
    daemon.env("RESEND_API_KEY", "re_wrong").stdout(Stdio::null());
    let daemon = Logged::spawn(&mut daemon);
    let failed = common::eventually(Duration::from_secs(60), || {
        let store = world.store.clone();
        async move { store.counts(common::CAMPAIGN, &current_week()).await.ok().filter(|c| c.failed == 1) }
    })
    .await;
    daemon.signal("TERM");
    let (code, lines) = daemon.wait().await;
    assert!(failed.is_some(), "{lines:#?}");
    assert_eq!(code, Some(0));

    let list = run(&path, &url, &["dead-letters", "list"], "");
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    let listed = stdout(&list);
    assert!(listed.contains("error=invalid_api_key") && listed.contains("attempts=1"), "{listed}");
    let id = listed.split_whitespace().nth(1).unwrap().to_string();
    // Every delivery failed (the wrong key): the objective is breached, exit 3.
    let slo = run(&path, &url, &["slo"], "");
    assert_eq!(slo.status.code(), Some(3), "{}", stdout(&slo));
    assert!(stdout(&slo).contains("objective breached"), "{}", stdout(&slo));
    let log = run(
        &path,
        &url,
        &["deliveries", "--campaign", "weekly_digest", "--status", "failed", "--status", "outcome_unknown"],
        "",
    );
    assert!(stdout(&log).contains("failed  invalid_api_key"), "{}", stdout(&log));
    let mine = run(&path, &url, &["deliveries", "--subscriber", "u42", "--json"], "");
    assert!(mine.status.success() && stdout(&mine).is_empty(), "u42 is not entitled: never enqueued");
    let kicked = run(&path, &url, &["deliveries", "--subscriber", "u43", "--json"], "");
    assert!(stdout(&kicked).contains("\"address\":\"d***@resend.dev\""), "{}", stdout(&kicked));
    assert!(run(&path, &url, &["dead-letters", "list", "--unknown"], "").status.success());
    let retried = run(&path, &url, &["dead-letters", "retry", &id], "");
    assert!(stdout(&retried).contains("requeued"), "{}", stdout(&retried));
    let again = run(&path, &url, &["dead-letters", "retry", "--allow-unknown", &id], "");
    assert_eq!(again.status.code(), Some(1), "pending now: not requeued again");
    assert!(stdout(&run(&path, &url, &["resume"], "")).contains("sending was not paused"));
    let quiet = run(&path, &url, &["slo", "--campaign", "weekly_digest", "--period", "2026-W48", "--json"], "");
    assert_eq!(quiet.status.code(), Some(0), "a period with nothing in it: {}", stdout(&quiet));
    let zoned = run(
        &path,
        &url,
        &["subscribe", "--id", "u44", "--email", "bo@acme.example", "--time-zone", "Europe/Berlin"],
        "",
    );
    assert!(zoned.status.success());
    let current = run(&path, &url, &["upgrade"], "");
    assert!(stdout(&current).contains("nothing to upgrade"), "{}", stdout(&current));
    // A deployment of key layout 2 is refused, with what to do, until it is upgraded.
    let mut conn = world.store.conn().await.unwrap();
    let _: () =
        redis::cmd("HSET").arg(world.store.keys.meta()).arg("layout").arg(2).query_async(&mut conn).await.unwrap();
    let refused = run(&path, &url, &["resume"], "");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("mailstream upgrade"), "{refused:?}");
    let upgraded = run(&path, &url, &["upgrade"], "");
    assert!(stdout(&upgraded).contains("built the kick's audience: "), "{}", stdout(&upgraded));
    assert!(stdout(&upgraded).contains("upgraded from key layout 2 to 8"), "{}", stdout(&upgraded));
    assert!(run(&path, &url, &["resume"], "").status.success());
    // Layout 5 (email only) needs nothing moved: an email delivery's keys are unchanged.
    let _: () =
        redis::cmd("HSET").arg(world.store.keys.meta()).arg("layout").arg(5).query_async(&mut conn).await.unwrap();
    assert!(!run(&path, &url, &["resume"], "").status.success(), "layout 5 is refused until upgraded");
    let upgraded = run(&path, &url, &["upgrade"], "");
    assert!(stdout(&upgraded).contains("upgraded from key layout 5 to 8"), "{}", stdout(&upgraded));
    assert!(!stdout(&upgraded).contains("audience"), "{}", stdout(&upgraded));
    assert!(run(&path, &url, &["resume"], "").status.success());
    // Layout 6 (settled records kept whole) needs nothing moved either: they are read as
    // they are until they expire, and the dedup still finds them.
    let _: () =
        redis::cmd("HSET").arg(world.store.keys.meta()).arg("layout").arg(6).query_async(&mut conn).await.unwrap();
    let refused = run(&path, &url, &["resume"], "");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("key layout 6"), "{refused:?}");
    let upgraded = run(&path, &url, &["upgrade"], "");
    assert!(stdout(&upgraded).contains("upgraded from key layout 6 to 8"), "{}", stdout(&upgraded));
    assert!(run(&path, &url, &["resume"], "").status.success());
    // With --json: one object on stdout, the lines for people on stderr.
    let _: () =
        redis::cmd("HSET").arg(world.store.keys.meta()).arg("layout").arg(6).query_async(&mut conn).await.unwrap();
    let upgraded = run(&path, &url, &["upgrade", "--json"], "");
    let report: serde_json::Value = serde_json::from_str(&stdout(&upgraded)).expect("one JSON object");
    assert_eq!(report, serde_json::json!({"upgraded_from": 6, "layout": 8, "audience_subscribers": null}));
    assert!(String::from_utf8_lossy(&upgraded.stderr).contains("upgraded from key layout 6 to 8"));
    let again = run(&path, &url, &["upgrade", "--json"], "");
    let report: serde_json::Value = serde_json::from_str(&stdout(&again)).expect("one JSON object");
    assert_eq!(report["upgraded_from"], serde_json::Value::Null, "{report}");
    let _ = std::fs::remove_file(ndjson);
}

/// The weekly digest's period now.
fn current_week() -> String {
    let w = chrono::Utc::now().with_timezone(&chrono_tz::Asia::Tokyo).iso_week();
    format!("{}-W{:02}", w.year(), w.week())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_provider_is_reported_once_and_loses_nothing() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let (_reserved, closed) = closed_port();
    let base_url = format!("base_url = \"http://127.0.0.1:{closed}\"");
    let path = config_file(
        "noprovider.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            ANY_METRICS_PORT,
            TEST_REDIS,
            ("retry_base_ms = 1000", "retry_base_ms = 20"),
            ("retry_max_ms = 300000", "retry_max_ms = 40"),
        ],
    );
    let url = redis.url();
    assert!(run(&path, &url, &["subscribe", "--id", "u1", "--email", "delivered@resend.dev"], "").status.success());
    assert!(run(&path, &url, &["kick", "--campaign", "weekly_digest"], "").status.success());

    let mut daemon = bin();
    daemon.arg("run").arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", &url);
    daemon.env("RESEND_API_KEY", "re_cli_test").stdout(Stdio::null());
    let daemon = Logged::spawn(&mut daemon);
    let line = daemon.line_with("metrics listening", Duration::from_secs(60)).await.expect("metrics address logged");
    let scrape = format!("http://{}/metrics", logged_addr(&line));
    mailstream::resend::client::install_crypto_provider();
    let http = reqwest::Client::builder().build().unwrap();
    // Far more retries than any attempt budget: nothing fails, it waits.
    let tried = common::eventually(Duration::from_secs(60), || {
        let (http, scrape) = (http.clone(), scrape.clone());
        async move {
            let text = http.get(&scrape).send().await.ok()?.text().await.ok()?;
            let line = text
                .lines()
                .find(|l| l.starts_with("mailstream_provider_requests_total{") && l.contains("connection_failed"))?;
            let n: f64 = line.rsplit(' ').next()?.parse().ok()?;
            (n >= 30.0).then_some(())
        }
    })
    .await;
    daemon.signal("TERM");
    let (code, lines) = daemon.wait().await;
    assert!(tried.is_some(), "the daemon kept retrying: {lines:#?}");
    assert_eq!(code, Some(0), "graceful stop on SIGTERM");
    // Down after three refusals, then probed once a second: one line says so.
    let reports: Vec<&String> = lines.iter().filter(|l| l.contains("Resend is down")).collect();
    assert_eq!(reports.len(), 1, "one clear line, not one per retry: {lines:#?}");
    assert!(!lines.iter().any(|l| l.contains("panicked")));

    // Nothing was lost or failed: the delivery is still waiting, sealed, for the provider.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let batches: Vec<String> = redis::cmd("KEYS").arg("mailstream:*:batch:*").query_async(&mut conn).await.unwrap();
    assert_eq!(batches.len(), 1);
    let failed: Vec<String> = redis::cmd("KEYS").arg("mailstream:*:dead").query_async(&mut conn).await.unwrap();
    assert!(failed.is_empty(), "no dead letter: {failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_then_a_restart_sends_each_once_without_waiting_a_lease() {
    let mut world = common::World::new().await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let base_url = format!("base_url = \"{}\"", world.config.resend.base_url);
    let path = config_file(
        "sigterm.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            ("timeout_seconds = 30", "timeout_seconds = 2"),
            ("lease_seconds = 15", "lease_seconds = 60"),
            ("partitions = 1", "partitions = 2"),
            ANY_METRICS_PORT,
            TEST_REDIS,
        ],
    );
    world.subscribers(3000).await;
    world.kick().await;
    let spawn = || {
        let mut cmd = bin();
        cmd.arg("run").arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", world.redis.url());
        cmd.env("RESEND_API_KEY", "re_cli_test").stdout(Stdio::null());
        Logged::spawn(&mut cmd)
    };

    let first = spawn();
    let store = world.store.clone();
    let midway = common::eventually(Duration::from_secs(60), || {
        let store = store.clone();
        async move { store.counts(common::CAMPAIGN, &common::PERIOD).await.ok().filter(|c| c.sent >= 1000) }
    })
    .await;
    assert!(midway.is_some());
    first.signal("TERM");
    let (code, lines) = first.wait().await;
    assert_eq!(code, Some(0), "graceful exit: {lines:#?}");
    let after_stop = world.counts().await;
    assert!(after_stop.sent < 3000, "stopped mid-run: {after_stop:?}");

    // What the first instance claimed was handed back: the next one starts at once,
    // not after the 60 s lease.
    let restarted = Instant::now();
    let second = spawn();
    let counts = world.settled(Duration::from_secs(50)).await;
    let took = restarted.elapsed();
    second.signal("TERM");
    let (code, _) = second.wait().await;
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_secs(50), "no lease wait");
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (3000, 0, 0));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (3000, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_and_loses_nothing() {
    let mut world = common::World::new().await;
    // Every request hangs 20 s, so a graceful stop would have to wait for them.
    let faults = Faults { hang: 1.0, hang_ms: 20_000, ..Default::default() };
    let (_emulator, _stop) = world.emulator(EmulatorConfig { faults, ..Default::default() }).await;
    let base_url = format!("base_url = \"{}\"", world.config.resend.base_url);
    let path = config_file(
        "twice.toml",
        &[("base_url = \"https://api.resend.com\"", &base_url), ANY_METRICS_PORT, TEST_REDIS],
    );
    world.subscribers(300).await;
    world.kick().await;
    let mut cmd = bin();
    cmd.arg("run").arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", world.redis.url());
    cmd.env("RESEND_API_KEY", "re_cli_test").stdout(Stdio::null());
    let daemon = Logged::spawn(&mut cmd);
    let store = world.store.clone();
    let on_the_wire = common::eventually(Duration::from_secs(60), || {
        let store = store.clone();
        async move {
            let mut conn = store.conn().await.ok()?;
            let mut sending = 0;
            for key in store.scan("mailstream:*:batch:*").await.ok()? {
                let state: Option<String> =
                    redis::cmd("HGET").arg(&key).arg("state").query_async(&mut conn).await.ok()?;
                sending += usize::from(state.as_deref() == Some("sending"));
            }
            (sending > 0).then_some(())
        }
    })
    .await;
    assert!(on_the_wire.is_some(), "a batch is on the wire");
    daemon.signal("TERM");
    daemon.line_with("shutting down", Duration::from_secs(30)).await.expect("the first signal was taken");
    daemon.signal("TERM");
    let (code, lines) = daemon.wait().await;
    // 130 is the immediate exit; a graceful one (after the hung requests) would be 0.
    assert_eq!(code, Some(130), "{lines:#?}");
    // The batches on the wire stay sealed for the next instance: nothing was dropped.
    let counts = world.counts().await;
    assert_eq!(counts.settled(), 0);
    let mut conn = world.store.conn().await.unwrap();
    let mut sealed = 0u64;
    for p in 0..world.store.keys.partitions() {
        let n: u64 = redis::cmd("ZCARD").arg(world.store.keys.batches(p)).query_async(&mut conn).await.unwrap();
        sealed += n;
    }
    assert!(sealed > 0);
}

/// Runs `cmd`, feeds it `stdin`, reads one line of its stdout and closes the pipe, as
/// `| head -1` does; then waits. The exit status, that line, and stderr.
fn read_one_line_and_close(
    mut cmd: std::process::Command,
    stdin: String,
) -> (std::process::ExitStatus, String, String) {
    use std::io::{BufRead, Read, Write};
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    // The reader is gone: the rest of the output meets a closed pipe.
    let status = child.wait().unwrap();
    feeder.join().unwrap();
    (status, first, errors.join().unwrap())
}

/// A command whose output is bigger than a pipe's buffer (64 KiB), so it is still
/// writing when its reader has gone, run with the test's Redis and config.
fn piped(config: &std::path::Path, redis: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = bin();
    cmd.args(args).arg("--config").arg(config).env("MAILSTREAM_REDIS_URL", redis).env("RESEND_API_KEY", "re_cli_test");
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_closes_stdout_ends_a_read_only_command_quietly_and_a_writing_one_finishes() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let url = redis.url();
    let scheduled = ("time_zone = \"Asia/Tokyo\"", "time_zone = \"Asia/Tokyo\"\nschedule = \"0 9 * * MON\"");
    let path = config_file("pipes.toml", &[TEST_REDIS, scheduled]);
    let n = 1500;
    let ndjson: String = (0..n).map(|i| format!("{{\"id\":\"p{i}\",\"email\":\"p{i}@acme.example\"}}\n")).collect();
    let out = run(&path, &url, &["subscribe", "--ndjson", "-"], &ndjson);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&path, &url, &["kick", "--campaign", "weekly_digest"], "");
    assert!(stdout(&out).contains(&format!("{n} new")), "{}", stdout(&out));
    let mut config = mailstream::config::Config::load(&path).unwrap();
    config.redis.url = mailstream::config::Secret::new(url.clone());
    let store = mailstream::store::Store::open(&config).await.unwrap();
    for i in 0..n {
        let email = format!("gone{i}@acme.example");
        let act = mailstream::audience::suppression::Act::Suppress(mailstream::model::outcome::Why::Bounced);
        mailstream::audience::suppression::apply(&store, &config, &email, act, None).await.unwrap();
    }

    let limit = n.to_string();
    let read_only: [&[&str]; 5] = [
        &["deliveries", "--json", "--limit", &limit],
        &["deliveries", "--limit", &limit],
        &["suppressions", "list", "--json"],
        &["suppressions", "list"],
        &["schedule", "--next", "3000"],
    ];
    for args in read_only {
        let (status, first, errors) = read_one_line_and_close(piped(&path, &url, args), String::new());
        assert!(!first.is_empty(), "{args:?}: a first line");
        assert_eq!(status.code(), Some(0), "{args:?} ends with 0 when its reader goes: {errors}");
        assert!(errors.trim().is_empty(), "{args:?} ends quietly: {errors}");
    }

    // A command that writes: every item is enqueued though nobody read past the first
    // result line, and it says so on stderr.
    let items: String = (0..n)
        .map(|i| format!("{{\"idempotency_key\":\"pipe-{i}\",\"to\":\"delivered@resend.dev\",\"subject\":\"s\",\"text\":\"t\"}}\n"))
        .collect();
    let (status, first, errors) =
        read_one_line_and_close(piped(&path, &url, &["enqueue", "--ndjson", "-"]), items.clone());
    assert!(first.contains("accepted"), "{first}");
    assert_eq!(status.code(), Some(0), "{errors}");
    assert!(errors.contains("stdout was closed") && !errors.contains("panicked"), "{errors}");
    let again = run(&path, &url, &["enqueue", "--ndjson", "-", "--json"], &items);
    let report: serde_json::Value = serde_json::from_str(stdout(&again).lines().last().unwrap()).unwrap();
    assert_eq!((report["accepted"].as_u64(), report["duplicates"].as_u64()), (Some(0), Some(n as u64)), "all went in");
}

/// Every line a command prints goes through `cli::out`, which a closed pipe cannot panic.
#[test]
fn nothing_prints_to_stdout_but_through_the_one_writer() {
    let mut found = Vec::new();
    let mut dirs = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (n, line) in text.lines().enumerate() {
                    let code = line.split("//").next().unwrap();
                    let bare = code.replace("eprintln!", "").replace("eprint!", "");
                    if bare.contains("println!") || bare.contains("print!(") {
                        found.push(format!("{}:{}", path.display(), n + 1));
                    }
                }
            }
        }
    }
    assert!(found.is_empty(), "print to stdout through cli::out (outln!): {found:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_read_or_maintain_refuse_a_prefix_with_no_deployment_and_write_nothing() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let url = redis.url();
    let path = config_file("fresh.toml", &[TEST_REDIS]);
    let commands: [&[&str]; 9] = [
        &["deliveries"],
        &["dead-letters", "list"],
        &["dead-letters", "retry", "weekly_digest:2026-W48:u1:default"],
        &["suppressions", "list"],
        &["resume"],
        &["upgrade"],
        &["preview", "--campaign", "weekly_digest", "--subscriber", "u1"],
        &["kick", "--campaign", "weekly_digest", "--dry-run"],
        &["deliveries", "--json"],
    ];
    let mut conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    for args in commands {
        let out = run(&path, &url, args, "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {err}");
        assert!(err.contains("no deployment under prefix mailstream"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", stdout(&out));
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
        assert!(keys.is_empty(), "{args:?} wrote {keys:?}");
    }
    // A command that creates a deployment still does, and then they read it.
    let out = run(&path, &url, &["subscribe", "--id", "u1", "--email", "a@acme.example"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&path, &url, &["deliveries"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
