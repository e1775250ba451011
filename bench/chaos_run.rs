//! The chaos run shared by `bench/chaos` and its short version in the tests:
//! N deliveries against the emulator with 5xx, hangs and a 429 storm, while
//! `kill -9` hits the daemon process K times (restarting it each time) and Redis
//! (append-only) is killed and restarted once. Then it counts, from Redis and
//! from the emulator, what was sent, failed, unknown, never settled, and sent twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::config::{Config, EXAMPLE, Secret};
use mailstream::emulator::{Emulator, EmulatorConfig, Faults, Storm};
use mailstream::kick;
use mailstream::redis_server::{RedisOptions, RedisServer};
use mailstream::store::Store;
use mailstream::subscribers::{self, Subscriber};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub deliveries: u64,
    pub kills: u32,
    pub redis_restarts: u32,
    pub rps: u32,
    pub seed: u64,
    /// The `mailstream` binary to run as the daemon.
    pub binary: PathBuf,
    /// Print progress lines.
    pub verbose: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    pub deliveries: u64,
    pub sent: u64,
    pub failed: u64,
    pub failed_reasons: BTreeMap<String, u64>,
    pub outcome_unknown: u64,
    pub unknown_reasons: BTreeMap<String, u64>,
    pub skipped: u64,
    pub never_settled: u64,
    /// Real (non-replayed) sends the emulator accepted.
    pub real_sends: u64,
    /// Real sends beyond the first, per recipient and period.
    pub duplicate_real_sends: u64,
    /// Deliveries recorded as sent whose recipient the emulator never saw.
    pub sent_without_a_real_send: u64,
    pub kills: u32,
    pub redis_restarts: u32,
    pub elapsed_seconds: f64,
    pub provider_requests: u64,
    pub injected_server_errors: u64,
    pub injected_hangs: u64,
    pub rate_limited: u64,
    pub replays: u64,
    pub concurrent_conflicts: u64,
}

impl ChaosReport {
    /// The conditions a chaos run must meet.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.duplicate_real_sends > 0 {
            p.push(format!("{} duplicate real sends", self.duplicate_real_sends));
        }
        if self.never_settled > 0 {
            p.push(format!("{} deliveries never settled", self.never_settled));
        }
        if self.sent_without_a_real_send > 0 {
            p.push(format!("{} deliveries recorded as sent without a real send", self.sent_without_a_real_send));
        }
        if self.sent > self.real_sends {
            p.push(format!("{} recorded as sent but only {} real sends", self.sent, self.real_sends));
        }
        p
    }
}

fn say(opts: &ChaosOptions, line: &str) {
    if opts.verbose {
        eprintln!("{line}");
    }
}

fn config_text(redis_url: &str, emulator_url: &str, rps: u32) -> String {
    let mut text = EXAMPLE.to_string();
    for (from, to) in [
        ("url = \"redis://127.0.0.1:6379\"".to_string(), format!("url = \"{redis_url}\"")),
        ("base_url = \"https://api.resend.com\"".into(), format!("base_url = \"{emulator_url}\"")),
        ("requests_per_second = 10".into(), format!("requests_per_second = {rps}")),
        ("timeout_seconds = 30".into(), "timeout_seconds = 2".into()),
        ("lease_seconds = 60".into(), "lease_seconds = 7".into()),
        ("max_attempts = 8".into(), "max_attempts = 30".into()),
        ("retry_base_ms = 1000".into(), "retry_base_ms = 200".into()),
        ("retry_max_ms = 300000".into(), "retry_max_ms = 3000".into()),
        ("metrics_listen = \"127.0.0.1:9464\"".into(), "# metrics_listen: none".into()),
    ] {
        assert!(text.contains(&from), "config.toml lost {from}");
        text = text.replacen(&from, &to, 1);
    }
    text
}

fn spawn_daemon(binary: &Path, config: &Path, log: &Path) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    Command::new(binary)
        .arg("run")
        .arg("--config")
        .arg(config)
        .env("RESEND_API_KEY", "re_chaos")
        .env("MAILSTREAM_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))
}

/// Runs the chaos scenario and reports; the caller judges with [`ChaosReport::problems`].
pub async fn chaos(opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut redis = RedisServer::start(RedisOptions { appendonly: true }).await?;

    // The emulator lives here, outside the daemon, so it outlives every kill.
    let emulator = Emulator::new(EmulatorConfig {
        requests_per_second: Some(opts.rps),
        seed: opts.seed,
        faults: Faults {
            server_error: 0.05,
            hang: 0.02,
            hang_ms: 3000,
            storms: vec![Storm { after_requests: 30, duration_ms: 3000 }],
            ..Default::default()
        },
        ..Default::default()
    });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await?;

    let dir = std::env::temp_dir().join(format!("mailstream-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("config.toml");
    let log_path = dir.join("daemon.log");
    let _ = std::fs::remove_file(&log_path);
    std::fs::write(&config_path, config_text(&redis.url(), &emulator_url, opts.rps))?;
    let mut config = Config::load(&config_path)?;
    config.resend.api_key = Some(Secret::new("re_chaos"));

    let store = Store::connect(&config).await?;
    let subscribers: Vec<Subscriber> = (0..opts.deliveries).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subscribers).await?;
    let campaign = config.campaign("weekly_digest").context("weekly_digest campaign")?.clone();
    let period = kick::period_for(&campaign, None)?;
    let kick = kick::kick_registry(&store, &config, &campaign.name, &period).await?;
    say(opts, &format!("chaos: {} deliveries enqueued for {period}; logs in {}", kick.new, log_path.display()));

    let started = Instant::now();
    let mut daemon = spawn_daemon(&opts.binary, &config_path, &log_path)?;
    let mut kills = 0;
    let mut redis_restarts = 0;
    let restart_redis_after = (opts.kills / 2).max(1);
    while kills < opts.kills {
        tokio::time::sleep(Duration::from_millis(rng.random_range(700..2500))).await;
        let counts = store.counts(&campaign.name, &period).await.unwrap_or_default();
        daemon.kill().context("kill -9 the daemon")?;
        let _ = daemon.wait();
        kills += 1;
        say(
            opts,
            &format!(
                "  [{:5.1}s] kill -9 #{kills} (sent {}/{})",
                started.elapsed().as_secs_f64(),
                counts.sent,
                counts.enqueued
            ),
        );
        if redis_restarts < opts.redis_restarts && kills == restart_redis_after {
            // Restart Redis while the daemon is up, so it must reconnect and reload scripts.
            daemon = spawn_daemon(&opts.binary, &config_path, &log_path)?;
            tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
            redis.restart().await?;
            redis_restarts += 1;
            say(opts, &format!("  [{:5.1}s] redis restarted (append-only)", started.elapsed().as_secs_f64()));
            continue;
        }
        daemon = spawn_daemon(&opts.binary, &config_path, &log_path)?;
    }

    // Let the last instance finish everything (leases of the killed ones expire first).
    let deadline = Instant::now() + Duration::from_secs(600 + opts.deliveries / 50);
    let mut last = Instant::now();
    let counts = loop {
        let c = store.counts(&campaign.name, &period).await.unwrap_or_default();
        if c.settled() >= c.enqueued || Instant::now() > deadline {
            break c;
        }
        if last.elapsed() >= Duration::from_secs(5) {
            last = Instant::now();
            say(
                opts,
                &format!(
                    "  [{:5.1}s] sent {}/{}, settled {}",
                    started.elapsed().as_secs_f64(),
                    c.sent,
                    c.enqueued,
                    c.settled()
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let elapsed = started.elapsed().as_secs_f64();
    send_term(&mut daemon);
    stop_emulator.trigger();
    let _ = emulator_task.await;

    // Reasons, from the delivery records themselves.
    let mut failed_reasons = BTreeMap::new();
    let mut unknown_reasons = BTreeMap::new();
    let mut sent_recipients = Vec::new();
    let mut conn = store.conn().await?;
    for p in 0..store.keys.partitions() {
        let keys = store.scan(&format!("{}*", store.keys.delivery(p, ""))).await?;
        for chunk in keys.chunks(1000) {
            let mut pipe = redis::pipe();
            for key in chunk {
                pipe.cmd("HMGET").arg(key).arg(&["state", "error", "subscriber"]);
            }
            let rows: Vec<(Option<String>, Option<String>, Option<String>)> = pipe.query_async(&mut conn).await?;
            for (state, error, subscriber) in rows {
                let error = error.unwrap_or_else(|| "?".into());
                match state.as_deref() {
                    Some("failed") => *failed_reasons.entry(error).or_insert(0) += 1,
                    Some("outcome_unknown") => *unknown_reasons.entry(error).or_insert(0) += 1,
                    Some("sent") => {
                        sent_recipients.push(format!("delivered+{}@resend.dev", subscriber.unwrap_or_default()))
                    }
                    _ => {}
                }
            }
        }
    }
    let sends = emulator.sends_matching(&period);
    let real_sends: u64 = sends.values().map(|&n| u64::from(n)).sum();
    let duplicate_real_sends: u64 = sends.values().map(|&n| u64::from(n.saturating_sub(1))).sum();
    let sent_without_a_real_send = sent_recipients.iter().filter(|r| !sends.contains_key(*r)).count() as u64;
    let stats = emulator.stats();
    let _ = std::fs::remove_file(&config_path);
    Ok(ChaosReport {
        deliveries: counts.enqueued,
        sent: counts.sent,
        failed: counts.failed,
        failed_reasons,
        outcome_unknown: counts.outcome_unknown,
        unknown_reasons,
        skipped: counts.skipped,
        never_settled: counts.enqueued.saturating_sub(counts.settled()),
        real_sends,
        duplicate_real_sends,
        sent_without_a_real_send,
        kills,
        redis_restarts,
        elapsed_seconds: elapsed,
        provider_requests: stats.requests,
        injected_server_errors: stats.injected_server_errors,
        injected_hangs: stats.injected_hangs,
        rate_limited: stats.rate_limited,
        replays: stats.replays,
        concurrent_conflicts: stats.concurrent_conflicts,
    })
}

fn send_term(child: &mut Child) {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
}
