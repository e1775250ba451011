//! The chaos run shared by `bench/chaos` and its short version in the tests:
//! N deliveries against the emulator with 5xx, hangs and a 429 storm, while
//! `kill -9` hits the daemon process K times (restarting it each time), Redis
//! (append-only) is killed and restarted, Resend becomes unreachable for a
//! while (an outage), and a quota pause during which a fraction of subscribers
//! unsubscribe. Then it counts, from Redis and from the emulator, what was
//! sent, failed, unknown, never settled, sent twice, or sent after an unsubscribe.

#[path = "process.rs"]
mod process;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::audience::kick;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, Secret};
use mailstream::ops::deliveries::Filter;
use mailstream::send::pause::Pause;
use mailstream::shutdown::Trigger;
use mailstream::store::Store;
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::emulator::{Emulator, EmulatorConfig, Faults, Storm};
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
    /// Resend unreachable (connection refused) for this long, once a fifth is sent.
    pub outage_seconds: u64,
    /// A quota pause once half is sent, during which this fraction of all subscribers
    /// unsubscribe (0: no pause).
    pub pause_with_unsubscribes: f64,
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
    pub skipped_reasons: BTreeMap<String, u64>,
    pub never_settled: u64,
    /// Real (non-replayed) sends the emulator accepted.
    pub real_sends: u64,
    /// Real sends beyond the first, per recipient and period.
    pub duplicate_real_sends: u64,
    /// Deliveries recorded as sent whose recipient the emulator never saw.
    pub sent_without_a_real_send: u64,
    pub kills: u32,
    pub redis_restarts: u32,
    pub outage_seconds: u64,
    /// The retry backoff's cap the daemon ran with (the shipped one).
    pub retry_max_ms: u64,
    /// From Resend's return after the outage to the last settlement (0: no outage).
    pub recovery_seconds: f64,
    pub unsubscribed_during_pause: u64,
    /// Real sends to a subscriber after their unsubscribe was written.
    pub sent_after_unsubscribe: u64,
    pub elapsed_seconds: f64,
    /// From the last kill -9 to the last delivery settled.
    pub seconds_from_last_kill_to_settled: f64,
    pub provider_requests: u64,
    pub injected_server_errors: u64,
    pub injected_hangs: u64,
    pub rate_limited: u64,
    pub quota_refusals: u64,
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
        if self.sent_after_unsubscribe > 0 {
            p.push(format!("{} real sends after an unsubscribe", self.sent_after_unsubscribe));
        }
        p
    }
}

fn say(opts: &ChaosOptions, line: &str) {
    if opts.verbose {
        eprintln!("{line}");
    }
}

/// `redis.partitions` of the run: one Redis, one partition.
const PARTITIONS: u16 = 1;

fn config_text(redis_url: &str, emulator_url: &str, rps: u32) -> String {
    let more = [
        ("requests_per_second = 10", format!("requests_per_second = {rps}")),
        ("partitions = 1", format!("partitions = {PARTITIONS}")),
    ];
    process::config_text(redis_url, emulator_url, &more)
}

fn spawn_daemon(binary: &Path, config: &Path, log: &Path) -> anyhow::Result<Child> {
    process::spawn_daemon(binary, config, log, "re_chaos")
}

/// The emulator, which can be taken off the network and brought back on the same port.
struct Provider {
    emulator: Emulator,
    addr: std::net::SocketAddr,
    running: Option<(Trigger, tokio::task::JoinHandle<()>)>,
}

impl Provider {
    async fn stop(&mut self) {
        if let Some((stop, task)) = self.running.take() {
            stop.trigger();
            let _ = task.await;
        }
    }

    async fn start(&mut self) -> anyhow::Result<()> {
        // The port was just released; another process may hold it a moment (TIME_WAIT is fine).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.emulator.spawn_at(self.addr).await {
                Ok((_, stop, task)) => {
                    self.running = Some((stop, task));
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).context("restarting the emulator on its port"),
            }
        }
    }
}

/// Where the scripted troubles stand.
#[derive(Default)]
struct Script {
    kills: u32,
    next_kill: Option<Instant>,
    last_kill: Option<Instant>,
    redis_restarts: u32,
    outage: Option<Instant>,
    outage_done: bool,
    back_at: Option<Instant>,
    pause_seen: Option<Instant>,
    pause_done: bool,
    unsubscribed: HashMap<String, Instant>,
}

/// Runs the chaos scenario and reports; the caller judges with [`ChaosReport::problems`].
pub async fn chaos(opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    say(opts, &format!("partitions: {PARTITIONS}"));
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;

    // The emulator lives here, outside the daemon, so it outlives every kill.
    let quota = (opts.pause_with_unsubscribes > 0.0).then_some(opts.deliveries / 2);
    let emulator = Emulator::new(EmulatorConfig {
        requests_per_second: Some(opts.rps),
        seed: opts.seed,
        faults: Faults {
            server_error: 0.05,
            hang: 0.02,
            hang_ms: 3000,
            storms: vec![Storm { after_requests: 30, duration_ms: 3000, retry_after_seconds: None }],
            quota_after_emails: quota,
            ..Default::default()
        },
        ..Default::default()
    });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await?;
    let addr = emulator_url.trim_start_matches("http://").parse()?;
    let mut provider = Provider { emulator: emulator.clone(), addr, running: Some((stop_emulator, emulator_task)) };

    let dir = std::env::temp_dir().join(format!("mailstream-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("config.toml");
    let log_path = dir.join("daemon.log");
    let _ = std::fs::remove_file(&log_path);
    std::fs::write(&config_path, config_text(&redis.url(), &emulator_url, opts.rps))?;
    let mut config = Config::load(&config_path)?;
    config.resend.api_key = Some(Secret::new("re_chaos"));

    let store = Store::open(&config).await?;
    let subscribers: Vec<Subscriber> = (0..opts.deliveries).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subscribers).await?;
    let campaign = config.campaign("weekly_digest").context("weekly_digest campaign")?.clone();
    let period = kick::period_for(&store, &campaign, None, kick::PeriodRule::NearNow).await?;
    let kicked = kick::kick_registry(&store, &config, &campaign.name, &period).await?;
    say(opts, &format!("chaos: {} deliveries enqueued for {period}; logs in {}", kicked.new, log_path.display()));

    let started = Instant::now();
    let at = || started.elapsed().as_secs_f64();
    let mut daemon = spawn_daemon(&opts.binary, &config_path, &log_path)?;
    let mut script = Script { next_kill: Some(Instant::now() + Duration::from_millis(700)), ..Default::default() };
    let deadline = Instant::now() + Duration::from_secs(600 + opts.outage_seconds + opts.deliveries / 50);
    let mut last_print = Instant::now();
    let counts = loop {
        let c = store.counts(&campaign.name, &period).await.unwrap_or_default();
        let troubles_over = script.kills >= opts.kills
            && (opts.outage_seconds == 0 || script.outage_done)
            && (quota.is_none() || script.pause_done);
        if (troubles_over && c.settled() >= c.enqueued) || Instant::now() > deadline {
            break c;
        }
        // kill -9, at random moments, until K are done; Redis restarted midway.
        if script.kills < opts.kills && script.next_kill.is_some_and(|t| Instant::now() >= t) {
            daemon.kill().context("kill -9 the daemon")?;
            let _ = daemon.wait();
            script.kills += 1;
            script.last_kill = Some(Instant::now());
            say(opts, &format!("  [{:5.1}s] kill -9 #{} (sent {}/{})", at(), script.kills, c.sent, c.enqueued));
            daemon = spawn_daemon(&opts.binary, &config_path, &log_path)?;
            if script.redis_restarts < opts.redis_restarts && script.kills == (opts.kills / 2).max(1) {
                // While the new daemon starts: it must reconnect and reload scripts.
                tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
                redis.restart().await?;
                script.redis_restarts += 1;
                say(opts, &format!("  [{:5.1}s] redis restarted (append-only)", at()));
            }
            script.next_kill = Some(Instant::now() + Duration::from_millis(rng.random_range(700..2500)));
        }
        // The outage: Resend unreachable (connection refused) once a fifth is sent.
        if opts.outage_seconds > 0 && !script.outage_done {
            match script.outage {
                None if c.sent * 5 >= c.enqueued => {
                    provider.stop().await;
                    script.outage = Some(Instant::now());
                    say(opts, &format!("  [{:5.1}s] Resend unreachable for {} s", at(), opts.outage_seconds));
                }
                Some(since) if since.elapsed() >= Duration::from_secs(opts.outage_seconds) => {
                    provider.start().await?;
                    script.outage_done = true;
                    script.back_at = Some(Instant::now());
                    say(opts, &format!("  [{:5.1}s] Resend reachable again", at()));
                }
                _ => {}
            }
        }
        // The quota pause: once it is on, a fraction of all subscribers unsubscribe;
        // a few seconds later the quota renews and an operator resumes.
        if quota.is_some() && !script.pause_done {
            match script.pause_seen {
                None if is_paused(&store).await => {
                    script.pause_seen = Some(Instant::now());
                    let n = (opts.deliveries as f64 * opts.pause_with_unsubscribes).round() as usize;
                    let mut leaving: Vec<Subscriber> = Vec::new();
                    for s in &subscribers {
                        if leaving.len() < n && rng.random_bool(opts.pause_with_unsubscribes.clamp(0.0, 1.0)) {
                            leaving.push(Subscriber { subscribed: false, ..s.clone() });
                        }
                    }
                    subscribers::upsert(&store, &leaving).await?;
                    let written = Instant::now();
                    script.unsubscribed.extend(leaving.iter().map(|s| (s.email.clone(), written)));
                    say(opts, &format!("  [{:5.1}s] quota pause: {} subscribers unsubscribed", at(), leaving.len()));
                }
                Some(since) if since.elapsed() >= Duration::from_secs(3) => {
                    emulator.renew_quota();
                    Pause::resume(&store).await?;
                    script.pause_done = true;
                    say(opts, &format!("  [{:5.1}s] quota renewed, sending resumed", at()));
                }
                _ => {}
            }
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = Instant::now();
            say(opts, &format!("  [{:5.1}s] sent {}/{}, settled {}", at(), c.sent, c.enqueued, c.settled()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let settled_at = Instant::now();
    let elapsed = started.elapsed().as_secs_f64();
    send_term(&mut daemon);
    provider.stop().await;

    // Reasons, from the delivery log (records and settled history).
    let mut reasons: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut sent_recipients = Vec::new();
    let every = Filter { period: Some(period.clone()), limit: 1000, ..Default::default() };
    for r in mailstream::ops::deliveries::every(&store, &every).await? {
        let why = r.why.clone().unwrap_or_else(|| "?".into());
        match r.status.as_str() {
            "sent" => sent_recipients.push(format!("delivered+{}@resend.dev", r.subscriber)),
            state @ ("failed" | "outcome_unknown" | "skipped") => {
                *reasons.entry(state.to_string()).or_default().entry(why).or_insert(0) += 1
            }
            _ => {}
        }
    }
    let sends = emulator.send_times_matching(&period);
    let real_sends: u64 = sends.values().map(|at| at.len() as u64).sum();
    let duplicate_real_sends: u64 = sends.values().map(|at| at.len().saturating_sub(1) as u64).sum();
    let sent_without_a_real_send = sent_recipients.iter().filter(|r| !sends.contains_key(*r)).count() as u64;
    let sent_after_unsubscribe = script
        .unsubscribed
        .iter()
        .map(|(email, when)| sends.get(email).map_or(0, |at| at.iter().filter(|t| *t > when).count() as u64))
        .sum();
    let stats = emulator.stats();
    let _ = std::fs::remove_file(&config_path);
    let mut take = |state: &str| reasons.remove(state).unwrap_or_default();
    Ok(ChaosReport {
        deliveries: counts.enqueued,
        sent: counts.sent,
        failed: counts.failed,
        failed_reasons: take("failed"),
        outcome_unknown: counts.outcome_unknown,
        unknown_reasons: take("outcome_unknown"),
        skipped: counts.skipped,
        skipped_reasons: take("skipped"),
        never_settled: counts.enqueued.saturating_sub(counts.settled()),
        real_sends,
        duplicate_real_sends,
        sent_without_a_real_send,
        kills: script.kills,
        redis_restarts: script.redis_restarts,
        outage_seconds: if script.outage_done { opts.outage_seconds } else { 0 },
        retry_max_ms: config.delivery.retry_max_ms,
        recovery_seconds: script.back_at.map_or(0.0, |b| settled_at.saturating_duration_since(b).as_secs_f64()),
        unsubscribed_during_pause: script.unsubscribed.len() as u64,
        sent_after_unsubscribe,
        elapsed_seconds: elapsed,
        seconds_from_last_kill_to_settled: script
            .last_kill
            .map_or(0.0, |k| settled_at.saturating_duration_since(k).as_secs_f64()),
        provider_requests: stats.requests,
        injected_server_errors: stats.injected_server_errors,
        injected_hangs: stats.injected_hangs,
        rate_limited: stats.rate_limited,
        quota_refusals: stats.quota_refusals,
        replays: stats.replays,
        concurrent_conflicts: stats.concurrent_conflicts,
    })
}

/// Whether any partition holds the shared quota pause.
async fn is_paused(store: &Store) -> bool {
    let pause = Pause::default();
    pause.refresh(store).await.is_ok() && pause.is_paused()
}

fn send_term(child: &mut Child) {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();
}
