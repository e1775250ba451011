//! `bench/multi-instance [--instances N] [--cluster] [--deliveries D] [--rps R] [--no-kill]
//! [--connect-delay-ms MS] [--close-idle-after-ms MS] [--json]`:
//! several daemons as separate processes against one Redis (or a private
//! 3-primary cluster with `--cluster`) and one emulator limited to `--rps`
//! requests per sliding second; one instance is killed with SIGKILL once a
//! third is sent. Then the emulator's counts: the worst sliding second, 429s,
//! duplicate real sends, and throughput against the ceiling. First, the cost
//! of the shared limiter: its script called 100 times a second.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::config::{Config, EXAMPLE, Secret};
use mailstream::db::Store;
use mailstream::emulator::{Emulator, EmulatorConfig};
use mailstream::kick;
use mailstream::redis_server::{RedisCluster, RedisOptions, RedisServer};
use mailstream::subscribers::{self, Subscriber};
use serde::Serialize;

struct Options {
    instances: u32,
    cluster: bool,
    deliveries: u64,
    rps: u32,
    kill_one: bool,
    json: bool,
    /// The emulator reads nothing from a new connection for this long (a slow TLS handshake).
    connect_delay_ms: u64,
    /// The emulator closes connections this long after they opened.
    close_idle_after_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Report {
    instances: u32,
    cluster: bool,
    /// `redis.partitions`: 1 on one Redis, [`CLUSTER_PARTITIONS`] on the cluster.
    partitions: u16,
    deliveries: u64,
    sent: u64,
    failed: u64,
    outcome_unknown: u64,
    never_settled: u64,
    worst_second_requests: u64,
    rate_limited: u64,
    requests: u64,
    elapsed_seconds: f64,
    throughput_ratio: f64,
    duplicate_real_sends: u64,
    killed_instances: u32,
    limiter_calls_per_second: u32,
    limiter_round_trip_p50_us: u64,
    limiter_round_trip_p99_us: u64,
    limiter_redis_us_per_call: f64,
    connect_delay_ms: u64,
    close_idle_after_ms: Option<u64>,
}

fn main() -> ExitCode {
    let mut o = Options {
        instances: 3,
        cluster: false,
        deliveries: 30_000,
        rps: 10,
        kill_one: true,
        json: false,
        connect_delay_ms: 0,
        close_idle_after_ms: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> u64 {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--instances" => o.instances = number("--instances") as u32,
            "--deliveries" => o.deliveries = number("--deliveries"),
            "--rps" => o.rps = number("--rps") as u32,
            "--cluster" => o.cluster = true,
            "--connect-delay-ms" => o.connect_delay_ms = number("--connect-delay-ms"),
            "--close-idle-after-ms" => o.close_idle_after_ms = Some(number("--close-idle-after-ms")),
            "--no-kill" => o.kill_one = false,
            "--json" => o.json = true,
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    match runtime.block_on(run(&o)) {
        Ok(report) => {
            eprintln!(
                "{} instances{}, {} partition(s): {} of {} sent, worst second {} requests, {} rate-limited, {} duplicate real sends, \
                 {:.3} of the ceiling, {} killed",
                report.instances,
                if report.cluster { " on a 3-primary cluster" } else { "" },
                report.partitions,
                report.sent,
                report.deliveries,
                report.worst_second_requests,
                report.rate_limited,
                report.duplicate_real_sends,
                report.throughput_ratio,
                report.killed_instances
            );
            eprintln!(
                "shared limiter at {}/s: round trip p50 {} µs, p99 {} µs; Redis {:.1} µs per call",
                report.limiter_calls_per_second,
                report.limiter_round_trip_p50_us,
                report.limiter_round_trip_p99_us,
                report.limiter_redis_us_per_call
            );
            if o.json {
                println!("{}", serde_json::to_string(&report).expect("serializes"));
            }
            let ok = report.duplicate_real_sends == 0 && report.never_settled == 0 && report.rate_limited == 0;
            if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The Redis the run uses: one server or a cluster (kept alive by holding it).
enum Redis {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Redis {
    fn url(&self) -> String {
        match self {
            Redis::Single(s) => s.url(),
            Redis::Cluster(c) => c.url(),
        }
    }
}

async fn run(o: &Options) -> anyhow::Result<Report> {
    let (calls, p50, p99, per_call) = limiter_cost().await?;

    let redis = if o.cluster {
        Redis::Cluster(RedisCluster::start(true).await?)
    } else {
        Redis::Single(RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?)
    };
    let emulator = Emulator::new(EmulatorConfig {
        requests_per_second: Some(o.rps),
        connect_delay_ms: o.connect_delay_ms,
        close_idle_after_ms: o.close_idle_after_ms,
        ..Default::default()
    });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await?;
    let dir = std::env::temp_dir().join(format!("mailstream-multi-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("config.toml");
    let partitions = if o.cluster { CLUSTER_PARTITIONS } else { 1 };
    std::fs::write(&config_path, config_text(&redis.url(), &emulator_url, o.rps, o.cluster, partitions))?;
    let mut config = Config::load(&config_path)?;
    config.resend.api_key = Some(Secret::new("re_multi"));
    let store = Store::open(&config).await?;
    let subscribers: Vec<Subscriber> = (0..o.deliveries).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subscribers).await?;
    let campaign = config.campaign("weekly_digest").context("weekly_digest")?.clone();
    let period = kick::period_for(&store, &config, &campaign, None, kick::PeriodRule::NearNow).await?;
    kick::kick_registry(&store, &config, &campaign.name, &period).await?;

    let binary = PathBuf::from(env!("CARGO_BIN_EXE_mailstream"));
    let started = Instant::now();
    let mut daemons: Vec<Child> = (0..o.instances)
        .map(|i| spawn_daemon(&binary, &config_path, &dir.join(format!("daemon-{i}.log")), i))
        .collect::<anyhow::Result<_>>()?;
    let mut killed = 0;
    let deadline = Instant::now() + Duration::from_secs(300 + o.deliveries / 20);
    let counts = loop {
        let c = store.counts(&campaign.name, &period).await.unwrap_or_default();
        if c.settled() >= c.enqueued || Instant::now() > deadline {
            break c;
        }
        if o.kill_one && killed == 0 && c.sent * 3 >= c.enqueued {
            daemons[0].kill()?;
            let _ = daemons[0].wait();
            killed = 1;
            eprintln!(
                "  [{:5.1}s] kill -9 instance 0 (sent {}/{})",
                started.elapsed().as_secs_f64(),
                c.sent,
                c.enqueued
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let elapsed = started.elapsed().as_secs_f64();
    for (i, d) in daemons.iter_mut().enumerate() {
        if i > 0 || killed == 0 {
            let _ = Command::new("kill").arg("-TERM").arg(d.id().to_string()).stderr(Stdio::null()).status();
        }
        let _ = d.wait();
    }
    stop_emulator.trigger();
    let _ = emulator_task.await;
    let stats = emulator.stats();
    let sends = emulator.send_times_matching(&period);
    let duplicate_real_sends = sends.values().map(|at| at.len().saturating_sub(1) as u64).sum();
    let ceiling = f64::from(o.rps) * 100.0;
    Ok(Report {
        connect_delay_ms: o.connect_delay_ms,
        close_idle_after_ms: o.close_idle_after_ms,
        instances: o.instances,
        cluster: o.cluster,
        partitions,
        deliveries: counts.enqueued,
        sent: counts.sent,
        failed: counts.failed,
        outcome_unknown: counts.outcome_unknown,
        never_settled: counts.enqueued.saturating_sub(counts.settled()),
        worst_second_requests: stats.max_requests_in_1s,
        rate_limited: stats.rate_limited,
        requests: stats.requests,
        elapsed_seconds: elapsed,
        throughput_ratio: counts.sent as f64 / elapsed / ceiling,
        duplicate_real_sends,
        killed_instances: killed,
        limiter_calls_per_second: calls,
        limiter_round_trip_p50_us: p50,
        limiter_round_trip_p99_us: p99,
        limiter_redis_us_per_call: per_call,
    })
}

/// The shared limiter's cost: its script called 100 times a second for 10 s on a
/// private Redis (append-only, fsync always, as in production), each call timed
/// from the client, and Redis's own time per call from `INFO commandstats`.
async fn limiter_cost() -> anyhow::Result<(u32, u64, u64, f64)> {
    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
    let mut config = Config::example();
    config.campaigns.iter_mut().for_each(|c| c.schedule = None);
    config.redis.url = Secret::new(redis.url());
    config.redis.partitions = 1;
    let store = Store::open(&config).await?;
    // A rate above the calls' so that every call takes a slot (the write the sender makes).
    let limiter = mailstream::limiter::Shared::new(store.clone(), 200, Duration::ZERO);
    let mut conn = store.conn().await?;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await?;
    let mut rtts = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    for _ in 0..1000 {
        tick.tick().await;
        let t = Instant::now();
        anyhow::ensure!(limiter.probe().await?, "every call takes a slot");
        rtts.push(t.elapsed().as_micros() as u64);
    }
    rtts.sort_unstable();
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await?;
    let per_call = info
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("usec_per_call=").nth(1)?.split(',').next()?.parse::<f64>().ok())
        .fold(0.0, f64::max);
    Ok((100, rtts[rtts.len() / 2], rtts[rtts.len() * 99 / 100], per_call))
}

/// Partitions on the 3-primary cluster: spread over its primaries (the tail costs at most
/// 3 extra requests a run).
const CLUSTER_PARTITIONS: u16 = 4;

fn config_text(redis_url: &str, emulator_url: &str, rps: u32, cluster: bool, partitions: u16) -> String {
    // The benchmark kicks by hand; the shipped schedule would fire by the wall clock.
    let mut text = EXAMPLE.replacen("schedule = \"0 9 * * MON\"", "", 1);
    for (from, to) in [
        ("url = \"redis://127.0.0.1:6379\"".to_string(), format!("url = \"{redis_url}\"\ncluster = {cluster}")),
        ("base_url = \"https://api.resend.com\"".into(), format!("base_url = \"{emulator_url}\"")),
        ("requests_per_second = 10".into(), format!("requests_per_second = {rps}")),
        ("partitions = 1".into(), format!("partitions = {partitions}")),
        ("timeout_seconds = 30".into(), "timeout_seconds = 5".into()),
        ("metrics_listen = \"127.0.0.1:9464\"".into(), "metrics_listen = \"127.0.0.1:0\"".into()),
    ] {
        assert!(text.contains(&from), "config.toml lost {from}");
        text = text.replacen(&from, &to, 1);
    }
    text
}

fn spawn_daemon(binary: &Path, config: &Path, log: &Path, instance: u32) -> anyhow::Result<Child> {
    let log = std::fs::File::create(log)?;
    Command::new(binary)
        .arg("run")
        .arg("--config")
        .arg(config)
        .env("RESEND_API_KEY", "re_multi")
        .env("MAILSTREAM_UNSUBSCRIBE_SECRET", "unsubscribe-secret-of-the-bench")
        .env("MAILSTREAM_INSTANCE", instance.to_string())
        .env("MAILSTREAM_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))
}
