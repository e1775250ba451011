//! The `mailstream` binary as an operator meets it: config errors, an
//! unreachable Redis, an unreachable provider, subscribe and kick.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use mailstream::config::EXAMPLE;
use mailstream::redis_server::{RedisOptions, RedisServer, free_port};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mailstream"));
    cmd.env_remove("RESEND_API_KEY")
        .env_remove("MAILSTREAM_REDIS_URL")
        .env_remove("MAILSTREAM_CONFIG")
        .env_remove("MAILSTREAM_LOG");
    cmd
}

/// The shipped config with some lines replaced, written to a scratch file.
fn config_file(name: &str, replace: &[(&str, &str)]) -> PathBuf {
    let mut text = EXAMPLE.to_string();
    for (from, to) in replace {
        assert!(text.contains(from), "config.toml has no {from:?}");
        text = text.replacen(from, to, 1);
    }
    let dir = std::env::temp_dir().join(format!("mailstream-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().map(str::to_string).collect()
}

#[test]
fn check_config_accepts_the_shipped_file() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let out = bin().args(["check-config", "--config"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(": ok"));
}

#[test]
fn bad_config_is_one_clear_error_naming_the_key() {
    let unknown = config_file("unknown.toml", &[("batch_size = 100", "batch_sise = 100")]);
    let out = bin().args(["check-config", "--config"]).arg(&unknown).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: ") && err.contains("batch_sise"), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    let nonsense = config_file(
        "nonsense.toml",
        &[("batch_size = 100", "batch_size = 500"), ("time_zone = \"Asia/Tokyo\"", "time_zone = \"Asia/Tokio\"")],
    );
    let out = bin().args(["check-config", "--config"]).arg(&nonsense).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resend.batch_size") && err.contains("campaign[0].time_zone"), "{err}");

    let out = bin().args(["check-config", "--config", "/nonexistent/mailstream.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr_lines(&out).len(), 1, "{:?}", stderr_lines(&out));
}

#[test]
fn unreachable_redis_is_one_clear_error() {
    let port = free_port().unwrap();
    let path = config_file("noredis.toml", &[]);
    let out = bin()
        .args(["kick", "--campaign", "weekly_digest", "--config"])
        .arg(&path)
        .env("MAILSTREAM_REDIS_URL", format!("redis://127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let lines = stderr_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("error: cannot reach Redis at redis://127.0.0.1:"), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_and_kick_from_the_command_line() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let path = config_file("kick.toml", &[]);
    let run = |args: &[&str], stdin: Option<&str>| {
        let mut cmd = bin();
        cmd.args(args)
            .arg("--config")
            .arg(&path)
            .env("MAILSTREAM_REDIS_URL", redis.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    };
    let out = run(&["subscribe", "--id", "u1", "--email", "a@acme.example", "--target", "t1", "--target", "t2"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ndjson = "{\"id\":\"u2\",\"email\":\"b@acme.example\"}\n{\"id\":\"u3\",\"email\":\"c@acme.example\",\"entitled\":false}\n";
    let out = run(&["subscribe", "--ndjson", "-"], Some(ndjson));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let out = run(&["kick", "--campaign", "weekly_digest", "--period", "2026-W48"], None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("3 new, 0 duplicates, 1 not eligible"), "{stdout}");
    let out = run(&["kick", "--campaign", "weekly_digest", "--period", "2026-W48"], None);
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 new, 3 duplicates"));

    // An audience on stdin: upserted, then only those are enqueued.
    let out = run(
        &["kick", "--campaign", "weekly_digest", "--period", "2026-W48", "--audience", "-"],
        Some("{\"id\":\"u4\",\"email\":\"d@acme.example\"}\n{\"id\":\"u2\",\"email\":\"b@acme.example\"}\n"),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 new, 1 duplicates"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = run(&["kick", "--campaign", "weekly_digest", "--period", "2026-48"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a week period"));
    let out = run(
        &["kick", "--campaign", "weekly_digest", "--audience", "-"],
        Some("{\"id\":\"u5\",\"email\":\"secret@person.example\",\"x\":1}\n"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1") && !err.contains("secret@person"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_provider_is_reported_once_and_loses_nothing() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let (closed, metrics) = (free_port().unwrap(), free_port().unwrap());
    let base_url = format!("base_url = \"http://127.0.0.1:{closed}\"");
    let metrics_listen = format!("metrics_listen = \"127.0.0.1:{metrics}\"");
    let path = config_file(
        "noprovider.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            ("metrics_listen = \"127.0.0.1:9464\"", &metrics_listen),
            ("retry_base_ms = 1000", "retry_base_ms = 20"),
            ("retry_max_ms = 300000", "retry_max_ms = 40"),
            ("max_attempts = 8", "max_attempts = 100"),
        ],
    );
    let env = |cmd: &mut Command| {
        cmd.arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", redis.url()).env("RESEND_API_KEY", "re_cli_test");
    };
    let mut subscribe = bin();
    subscribe.args(["subscribe", "--id", "u1", "--email", "delivered@resend.dev"]);
    env(&mut subscribe);
    assert!(subscribe.output().unwrap().status.success());
    let mut kick = bin();
    kick.args(["kick", "--campaign", "weekly_digest"]);
    env(&mut kick);
    assert!(kick.output().unwrap().status.success());

    let mut daemon = bin();
    daemon.arg("run").stderr(Stdio::piped()).stdout(Stdio::null());
    env(&mut daemon);
    let child = daemon.spawn().unwrap();
    // Wait until the daemon has tried (and failed) several times.
    let scrape = format!("http://127.0.0.1:{metrics}/metrics");
    mailstream::resend::client::install_crypto_provider();
    let http = reqwest::Client::builder().build().unwrap();
    let tried = common::eventually(Duration::from_secs(30), || {
        let (http, scrape) = (http.clone(), scrape.clone());
        async move {
            let text = http.get(&scrape).send().await.ok()?.text().await.ok()?;
            let line = text
                .lines()
                .find(|l| l.starts_with("mailstream_provider_requests_total{") && l.contains("connection_failed"))?;
            let n: f64 = line.rsplit(' ').next()?.parse().ok()?;
            (n >= 5.0).then_some(())
        }
    })
    .await;
    send_signal(child.id(), "TERM");
    let out = child.wait_with_output().unwrap();
    assert!(tried.is_some(), "the daemon kept retrying");
    assert!(out.status.success(), "graceful stop on SIGTERM");
    let lines = stderr_lines(&out);
    let reports: Vec<&String> = lines.iter().filter(|l| l.contains("Resend is unreachable")).collect();
    assert_eq!(reports.len(), 1, "one clear line, not one per retry: {lines:#?}");
    assert!(!lines.iter().any(|l| l.contains("panicked")));

    // Nothing was lost: the delivery is still waiting, sealed, for the provider.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let batches: Vec<String> = redis::cmd("KEYS").arg("mailstream:*:batch:*").query_async(&mut conn).await.unwrap();
    assert_eq!(batches.len(), 1);
}

/// Sends a signal with kill(1) (no libc dependency for one call).
fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().unwrap();
    assert!(status.success());
}

/// A daemon process on `config`, with logs captured.
fn spawn_daemon(config: &std::path::Path, redis_url: &str) -> std::process::Child {
    bin()
        .arg("run")
        .arg("--config")
        .arg(config)
        .env("MAILSTREAM_REDIS_URL", redis_url)
        .env("RESEND_API_KEY", "re_cli_test")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_then_a_restart_sends_each_once() {
    let mut world = common::World::new().await;
    let (emulator, _stop) = world.emulator(mailstream::emulator::EmulatorConfig::default()).await;
    let base_url = format!("base_url = \"{}\"", world.config.resend.base_url);
    let path = config_file(
        "sigterm.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            ("timeout_seconds = 30", "timeout_seconds = 1"),
            ("lease_seconds = 60", "lease_seconds = 6"),
            ("partitions = 4", "partitions = 2"),
            ("metrics_listen = \"127.0.0.1:9464\"", "# no metrics"),
        ],
    );
    world.subscribers(3000).await;
    world.kick().await;

    let first = spawn_daemon(&path, &world.redis.url());
    let store = world.store.clone();
    let midway = common::eventually(Duration::from_secs(30), || {
        let store = store.clone();
        async move { store.counts(common::CAMPAIGN, common::PERIOD).await.ok().filter(|c| c.sent >= 1000) }
    })
    .await;
    assert!(midway.is_some());
    send_signal(first.id(), "TERM");
    let out = tokio::task::spawn_blocking(move || first.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "graceful exit: {}", String::from_utf8_lossy(&out.stderr));
    let after_stop = world.counts().await;
    assert!(after_stop.sent < 3000, "stopped mid-run: {after_stop:?}");

    let second = spawn_daemon(&path, &world.redis.url());
    let counts = world.settled(Duration::from_secs(90)).await;
    send_signal(second.id(), "TERM");
    let out = tokio::task::spawn_blocking(move || second.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success());
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (3000, 0, 0));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (3000, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_and_loses_nothing() {
    let mut world = common::World::new().await;
    // Every request hangs 20 s, so a graceful stop would have to wait for them.
    let faults = mailstream::emulator::Faults { hang: 1.0, hang_ms: 20_000, ..Default::default() };
    let (_emulator, _stop) =
        world.emulator(mailstream::emulator::EmulatorConfig { faults, ..Default::default() }).await;
    let base_url = format!("base_url = \"{}\"", world.config.resend.base_url);
    let path = config_file(
        "twice.toml",
        &[("base_url = \"https://api.resend.com\"", &base_url), ("metrics_listen = \"127.0.0.1:9464\"", "# none")],
    );
    world.subscribers(300).await;
    world.kick().await;
    let daemon = spawn_daemon(&path, &world.redis.url());
    let store = world.store.clone();
    let sealed = common::eventually(Duration::from_secs(30), || {
        let store = store.clone();
        async move {
            let mut conn = store.conn().await.ok()?;
            let n: u64 = redis::cmd("ZCARD").arg(store.keys.batches(0)).query_async(&mut conn).await.ok()?;
            (n > 0).then_some(())
        }
    })
    .await;
    assert!(sealed.is_some(), "a batch is on the wire");
    send_signal(daemon.id(), "TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    send_signal(daemon.id(), "TERM");
    let out = tokio::task::spawn_blocking(move || daemon.wait_with_output()).await.unwrap().unwrap();
    // 130 is the immediate exit; a graceful one (after the hung requests) would be 0.
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
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
