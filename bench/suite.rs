//! `bench/run [--quick] [--json]`: every measure in one sitting, each a ratio to a
//! reference measured in the same run, written to `bench/RESULTS.md`.
//!
//! 1. Delivery throughput against the ceiling (rps × 100): the daemon as a process
//!    of its own against a private durable Redis and the emulator at 10 requests/s;
//!    its peak RSS and CPU time; the naive design (one email per request) beside it.
//! 2. Fan-out: `kick` over the registry, against `redis-benchmark` running
//!    mailstream's own enqueue.lua (as many deliveries a call as the kick sends,
//!    pipelined) on the same Redis, and against BullMQ `addBulk` with a `jobId`
//!    (bench/bullmq).
//! 3. Rate-limit accuracy: the most requests in any sliding second, mailstream's and
//!    a BullMQ worker's with `limiter {max: 10, duration: 1000}`.
//! 4. Redis memory per pending delivery (used_memory delta after the kick) and per
//!    settled one, against BullMQ's per job.
//! 5. Webhook ingestion (bench/webhooks, a short run), against `redis-benchmark -t set`
//!    on the same fsync-always Redis.
//! 6. Headroom (bench/headroom): the same sending at 10, 25, 50, 100 and 200
//!    requests/s, one daemon and two (`--quick`: 50 requests/s, one daemon, 3 s).
//! 7. Scale: Redis bytes per delivery pending and settled, and daemon CPU per 10,000
//!    emails, at 10,000, 100,000 and 1,000,000 deliveries (`--quick`: 1,000, 3,000 and
//!    10,000), the emulator without a rate limit, so each run measures cost, not pace.
//!
//! Full: 50,000 deliveries sent, 1,000,000 subscribers kicked (5 repetitions; the
//! kick's ratio is the median of each kick over the redis-benchmark run right after
//! it, on the same Redis), BullMQ 300,000. `--quick` (CI, so the harness cannot rot): 5,000, 50,000 (1), 20,000.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::audience::kick;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, EXAMPLE, Secret};
use mailstream::model::work::{Channel, Lane};
use mailstream::store::Store;
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::emulator::{Emulator, EmulatorConfig};
use serde::Serialize;
use serde_json::Value;

const RPS: u32 = 10;
const CAMPAIGN: &str = "weekly_digest";
/// The partition count of every run here: one Redis, so one partition (a request carries
/// one partition's batch; each partition ends a run on a partial batch of its own).
const PARTITIONS: u16 = 1;

struct Sizes {
    scale: [u64; 3],
    sent: u64,
    naive: u64,
    kicked: u64,
    repetitions: usize,
    webhook_seconds: u64,
}

#[derive(Debug, Default, Serialize)]
struct Results {
    quick: bool,
    /// `redis.partitions` of every run.
    partitions: u16,
    // 1. throughput and footprint
    deliveries: u64,
    sent: u64,
    /// Emails accepted per second from the first request to the last, over rps × 100.
    throughput_ratio: f64,
    /// The same from the daemon process's start (start-up included).
    throughput_ratio_from_start: f64,
    rate_limited: u64,
    duplicate_sends: u64,
    worst_second_requests: u64,
    naive_emails_per_second: f64,
    naive_ratio_to_ceiling: f64,
    daemon_peak_rss_mib: f64,
    cpu_seconds_per_10k_emails: f64,
    // 2. fan-out
    kicked: u64,
    kick_per_second: f64,
    kick_per_second_runs: Vec<f64>,
    redis_ceiling_per_second: f64,
    redis_ceiling_runs: Vec<f64>,
    /// A 5,000-delivery run's ratio (the full run only; `--quick`'s main run is that size).
    small_run_deliveries: u64,
    small_run_throughput_ratio: f64,
    /// Each kick over the redis-benchmark run right after it, on the same Redis.
    kick_ratio_runs: Vec<f64>,
    /// The median of `kick_ratio_runs` (paired: both see the same Redis and machine state).
    kick_ratio_to_redis_ceiling: f64,
    /// Where Redis spent the first kick's time (INFO commandstats).
    kick_profile: String,
    bullmq_add_per_second: f64,
    kick_ratio_to_bullmq: f64,
    // 3. rate limit
    bullmq_worst_second_requests: u64,
    // 4. memory
    redis_bytes_per_delivery: f64,
    redis_bytes_per_settled_delivery: f64,
    /// The delivery log's newest-first index (`recent`): bytes per settlement it holds
    /// (MEMORY USAGE over ZCARD, every partition), and its total.
    recent_index_bytes_per_delivery: f64,
    recent_index_bytes: u64,
    bullmq_bytes_per_job: f64,
    // 5. webhooks
    webhook_events_per_second: f64,
    webhook_p99_ms: f64,
    webhook_reference_set_per_second: f64,
    webhook_ratio_to_reference: f64,
    // 6. headroom: bench/headroom's points as it prints them
    headroom: Vec<Value>,
    // 7. scale
    scale: Vec<ScalePoint>,
    machine: BTreeMap<String, String>,
    seconds: f64,
}

fn main() -> ExitCode {
    let (mut quick, mut json) = (false, false);
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "--json" => json = true,
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other} (bench/run [--quick] [--json])");
                return ExitCode::from(2);
            }
        }
    }
    let sizes = if quick {
        Sizes {
            scale: [1_000, 3_000, 10_000],
            sent: 5_000,
            naive: 30,
            kicked: 50_000,
            repetitions: 1,
            webhook_seconds: 3,
        }
    } else {
        Sizes {
            scale: [10_000, 100_000, 1_000_000],
            sent: 50_000,
            naive: 100,
            kicked: 1_000_000,
            repetitions: 5,
            webhook_seconds: 10,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    match runtime.block_on(run(quick, &sizes)) {
        Ok(r) if std::env::var_os("BENCH_ONLY").is_some() => {
            // One part only: RESULTS.md keeps the last whole run.
            println!("{}", serde_json::to_string(&r).expect("serializes"));
            ExitCode::SUCCESS
        }
        Ok(r) => {
            let md = results_md(&r, &sizes);
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/RESULTS.md");
            if let Err(e) = std::fs::write(&path, md) {
                eprintln!("cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            eprintln!("wrote {}", path.display());
            if json {
                println!("{}", serde_json::to_string(&r).expect("serializes"));
            }
            let ok = r.sent == r.deliveries && r.duplicate_sends == 0 && r.rate_limited == 0;
            if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(quick: bool, sizes: &Sizes) -> anyhow::Result<Results> {
    let started = Instant::now();
    let mut r = Results { quick, partitions: PARTITIONS, machine: machine(), ..Default::default() };
    eprintln!("partitions: {PARTITIONS} (redis.partitions of every run)");
    let dir = std::env::temp_dir().join(format!("mailstream-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    // BENCH_ONLY=throughput|fan-out|bullmq|webhooks|headroom runs one part (while profiling).
    let only = std::env::var("BENCH_ONLY").ok();
    let part = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if part("throughput") {
        eprintln!("== 1. throughput: {} deliveries at {RPS} requests/s, the daemon as a process", sizes.sent);
        throughput(&dir, sizes.sent, 100, &mut r).await?;
        eprintln!(
            "   {:.3} of the ceiling, {} rate-limited, {} duplicates, worst second {}, peak RSS {:.1} MiB, {:.2} CPU s per 10k",
            r.throughput_ratio,
            r.rate_limited,
            r.duplicate_sends,
            r.worst_second_requests,
            r.daemon_peak_rss_mib,
            r.cpu_seconds_per_10k_emails
        );
        // The tail: at the end of a run every partition holds a partial batch of its own.
        let small = if quick { None } else { Some(5_000) };
        if let Some(n) = small {
            let mut tail = Results::default();
            eprintln!("== 1a. throughput: {n} deliveries (the tail's share)");
            throughput(&dir, n, 100, &mut tail).await?;
            eprintln!("   {:.3} of the ceiling, {} rate-limited", tail.throughput_ratio, tail.rate_limited);
            r.small_run_deliveries = n;
            r.small_run_throughput_ratio = tail.throughput_ratio;
            r.rate_limited += tail.rate_limited;
            r.duplicate_sends += tail.duplicate_sends;
            r.worst_second_requests = r.worst_second_requests.max(tail.worst_second_requests);
        }
        let mut naive = Results::default();
        eprintln!("== 1b. the naive design: one email per request, {} deliveries", sizes.naive);
        throughput(&dir, sizes.naive, 1, &mut naive).await?;
        r.naive_emails_per_second = naive.throughput_ratio * f64::from(RPS) * 100.0;
        r.naive_ratio_to_ceiling = r.naive_emails_per_second / (f64::from(RPS) * 100.0);
        eprintln!(
            "   {:.1} emails/s ({:.4} of the batched ceiling)",
            r.naive_emails_per_second, r.naive_ratio_to_ceiling
        );
    }
    if part("fan-out") {
        eprintln!("== 2. fan-out: {} subscribers, {} repetition(s)", sizes.kicked, sizes.repetitions);
        fan_out(sizes, &mut r).await?;
        eprintln!(
            "   kick {:.0}/s, redis-benchmark enqueue.lua {:.0}/s ({:.2}), {:.0} bytes per pending delivery",
            r.kick_per_second, r.redis_ceiling_per_second, r.kick_ratio_to_redis_ceiling, r.redis_bytes_per_delivery
        );
    }
    if part("bullmq") {
        eprintln!("== 3. BullMQ (bench/bullmq, {})", if quick { "quick" } else { "full" });
        bullmq(quick, &mut r).await?;
        r.kick_ratio_to_bullmq = r.kick_per_second / r.bullmq_add_per_second.max(1e-9);
        eprintln!(
            "   addBulk {:.0}/s (mailstream {:.1}x), worst second {}, {:.0} bytes per job",
            r.bullmq_add_per_second, r.kick_ratio_to_bullmq, r.bullmq_worst_second_requests, r.bullmq_bytes_per_job
        );
    }
    if part("webhooks") {
        eprintln!("== 4. webhooks ({} s)", sizes.webhook_seconds);
        webhooks(sizes.webhook_seconds, &mut r)?;
        eprintln!("   {:.0} verified events/s, p99 {:.2} ms", r.webhook_events_per_second, r.webhook_p99_ms);
    }
    if part("headroom") {
        eprintln!("== 5. headroom");
        headroom(quick, &mut r)?;
    }
    if part("scale") {
        for n in sizes.scale {
            eprintln!("== 6. scale: {n} deliveries, the emulator without a rate limit");
            let point = scale(&dir, n).await?;
            eprintln!(
                "   {:.0} B per pending delivery, {:.0} B per settled one, {:.3} CPU s per 10k emails; settled by family {:.0?}",
                point.pending_bytes, point.settled_bytes, point.cpu_seconds_per_10k, point.settled_by_family
            );
            r.scale.push(point);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    r.seconds = started.elapsed().as_secs_f64();
    Ok(r)
}

/// The shipped config for `redis` and `emulator`, kicked by hand, `batch` emails per request.
/// The pacing guard on loopback, where the emulator is a few hundred µs away (the
/// shipped 20 ms is for a provider across the internet; `resend.pacing_guard_ms`).
const GUARD_MS: u64 = 5;

fn config_text(redis: &str, emulator: &str, batch: usize) -> String {
    let mut text = EXAMPLE.replacen("schedule = \"0 9 * * MON\"", "", 1);
    for (from, to) in [
        ("url = \"redis://127.0.0.1:6379\"".to_string(), format!("url = \"{redis}\"")),
        ("base_url = \"https://api.resend.com\"".into(), format!("base_url = \"{emulator}\"")),
        ("batch_size = 100".into(), format!("batch_size = {batch}")),
        ("partitions = 1".into(), format!("partitions = {PARTITIONS}")),
        ("metrics_listen = \"127.0.0.1:9464\"".into(), "metrics_listen = \"127.0.0.1:0\"".into()),
        ("pacing_guard_ms = 20".into(), format!("pacing_guard_ms = {GUARD_MS}")),
    ] {
        assert!(text.contains(&from), "config.toml lost {from}");
        text = text.replacen(&from, &to, 1);
    }
    text
}

/// Redis's `used_memory` less what running the scripts costs whatever the data: their
/// cache (`used_memory_scripts`, ~220 KB) and the Lua heap (`used_memory_vm_eval`, ~750 KB
/// after a run, garbage-collected), which a run that loads them mid-way (the daemon's
/// start, the kick's first call) would otherwise charge to its deliveries.
async fn used_memory(store: &Store) -> anyhow::Result<u64> {
    let mut conn = store.conn().await?;
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut conn).await?;
    let field = |name: &str| -> Option<u64> {
        info.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')).and_then(|v| v.trim().parse().ok())
    };
    let used = field("used_memory").context("INFO memory has no used_memory")?;
    let scripts = field("used_memory_scripts").unwrap_or(0) + field("used_memory_vm_eval").unwrap_or(0);
    Ok(used.saturating_sub(scripts))
}

/// The newest-first index's bytes (MEMORY USAGE, every partition) and bytes per entry.
async fn recent_index(store: &Store) -> anyhow::Result<(u64, f64)> {
    let mut conn = store.conn().await?;
    let (mut bytes, mut entries) = (0u64, 0u64);
    for p in 0..store.keys.partitions() {
        let key = store.keys.recent(p);
        let used: Option<u64> =
            redis::cmd("MEMORY").arg("USAGE").arg(&key).arg("SAMPLES").arg(0).query_async(&mut conn).await?;
        let held: u64 = redis::cmd("ZCARD").arg(&key).query_async(&mut conn).await?;
        (bytes, entries) = (bytes + used.unwrap_or(0), entries + held);
    }
    Ok((bytes, bytes as f64 / entries.max(1) as f64))
}

/// (peak RSS in KiB, CPU seconds) of a running process, from /proc.
fn footprint(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((hwm, ticks as f64 / hz))
}

/// One size of the scale run.
#[derive(Debug, Default, Serialize)]
struct ScalePoint {
    deliveries: u64,
    /// Redis used_memory after the kick, less before it, per delivery.
    pending_bytes: f64,
    /// The same once every delivery is settled (the daemon stopped).
    settled_bytes: f64,
    /// The daemon's CPU (user + system) per 10,000 emails sent, start to stop.
    cpu_seconds_per_10k: f64,
    sent: u64,
    seconds: f64,
    /// Where the settled bytes are, by key family (`d`, `settled`, `stream`, `recent`,
    /// ...; MEMORY USAGE of every key but the registry's), bytes per delivery.
    settled_by_family: BTreeMap<String, f64>,
}

/// The release daemon on `config`, logging to `log` (at `BENCH_DAEMON_LOG`, warn unless
/// set), as a process of its own.
fn daemon(config: &Path, log: &Path) -> anyhow::Result<Child> {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_mailstream"));
    Command::new(&binary)
        .args(["run", "--config"])
        .arg(config)
        .env("RESEND_API_KEY", "re_bench")
        .env("MAILSTREAM_UNSUBSCRIBE_SECRET", "unsubscribe-secret-of-the-bench")
        .env("MAILSTREAM_LOG", std::env::var("BENCH_DAEMON_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))
}

/// Waits (two minutes at most) for the steady state of a settled period: the daemon's
/// reclaimer trims from the streams what every group has acknowledged (every tenth pass).
async fn trimmed(store: &Store) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while stream_entries(store).await? > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Entries in every stream of every partition (XLEN).
async fn stream_entries(store: &Store) -> anyhow::Result<u64> {
    let mut conn = store.conn().await?;
    let mut n = 0;
    for p in 0..store.keys.partitions() {
        for lane in [Lane::Digest, Lane::Transactional, Lane::App] {
            let len: u64 = redis::cmd("XLEN").arg(store.keys.lane_stream(p, lane)).query_async(&mut conn).await?;
            n += len;
        }
    }
    Ok(n)
}

/// MEMORY USAGE of every key of the deployment but the subscribers' registry, summed by
/// family (the first name after the partition's tag: `d`, `settled`, `stream`, ...).
async fn memory_by_family(store: &Store) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut conn = store.conn().await?;
    let mut out = BTreeMap::new();
    for key in store.scan(&format!("{}:*", store.keys.prefix())).await? {
        let family = key.split_once("}:").map_or("(global)", |(_, rest)| rest.split(':').next().unwrap_or(""));
        if matches!(family, "subscriber" | "subscribers" | "audience" | "addr") {
            continue;
        }
        let used: Option<u64> =
            redis::cmd("MEMORY").arg("USAGE").arg(&key).arg("SAMPLES").arg(0).query_async(&mut conn).await?;
        *out.entry(family.to_string()).or_default() += used.unwrap_or(0);
    }
    Ok(out)
}

/// Kicks `n` deliveries and sends them through a daemon process, the emulator and the
/// limiter set far above what one daemon sends (1,000 requests/s), on a Redis that keeps
/// nothing on disk: what a delivery costs in memory and CPU at this size.
async fn scale(dir: &Path, n: u64) -> anyhow::Result<ScalePoint> {
    let redis = RedisServer::start(RedisOptions::default()).await?;
    let emulator = Emulator::new(EmulatorConfig { requests_per_second: None, ..Default::default() });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await?;
    let config_path = dir.join("config-scale.toml");
    let text = config_text(&redis.url(), &emulator_url, 100)
        .replacen("requests_per_second = 10\n", "requests_per_second = 1000\n", 1)
        .replacen("durability = \"strict\"", "durability = \"relaxed\"", 1);
    anyhow::ensure!(
        text.contains("requests_per_second = 1000\n") && text.contains("\"relaxed\""),
        "config.toml changed"
    );
    std::fs::write(&config_path, text)?;
    let mut config = Config::load(&config_path)?;
    config.resend.api_key = Some(Secret::new("re_bench"));
    let store = Store::open(&config).await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(100_000) {
        let subs: Vec<Subscriber> = chunk.iter().map(|&i| Subscriber::synthetic(i)).collect();
        subscribers::upsert(&store, &subs).await?;
    }
    let campaign = config.campaign(CAMPAIGN).context("weekly_digest")?.clone();
    let period = kick::period_for(&store, &campaign, None, kick::PeriodRule::NearNow).await?;
    let before = used_memory(&store).await?;
    kick::kick_registry(&store, &config, CAMPAIGN, &period).await?;
    let pending = used_memory(&store).await?;

    let mut daemon = daemon(&config_path, &dir.join("daemon-scale.log"))?;
    let pid = daemon.id();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(600 + n / 500);
    let mut cpu = 0.0;
    let counts = loop {
        let c = store.counts(CAMPAIGN, &period).await.unwrap_or_default();
        cpu = footprint(pid).map_or(cpu, |(_, s)| s);
        if c.settled() >= c.enqueued || Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    trimmed(&store).await?;
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = daemon.wait();
    let settled = used_memory(&store).await?;
    let by_family = memory_by_family(&store).await?;
    stop_emulator.trigger();
    let _ = emulator_task.await;
    anyhow::ensure!(counts.sent == n, "{} of {n} sent", counts.sent);
    Ok(ScalePoint {
        deliveries: n,
        pending_bytes: pending.saturating_sub(before) as f64 / n as f64,
        settled_bytes: settled.saturating_sub(before) as f64 / n as f64,
        cpu_seconds_per_10k: cpu / counts.sent.max(1) as f64 * 10_000.0,
        sent: counts.sent,
        seconds,
        settled_by_family: by_family.into_iter().map(|(k, b)| (k, b as f64 / n as f64)).collect(),
    })
}

/// Sends `n` deliveries through a daemon process at RPS requests/s of `batch` emails.
async fn throughput(dir: &Path, n: u64, batch: usize, r: &mut Results) -> anyhow::Result<()> {
    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
    let emulator = Emulator::new(EmulatorConfig { requests_per_second: Some(RPS), ..Default::default() });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await?;
    let config_path = dir.join(format!("config-{batch}.toml"));
    std::fs::write(&config_path, config_text(&redis.url(), &emulator_url, batch))?;
    let mut config = Config::load(&config_path)?;
    config.resend.api_key = Some(Secret::new("re_bench"));
    let store = Store::open(&config).await?;
    let subs: Vec<Subscriber> = (0..n).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subs).await?;
    drop(subs);
    let campaign = config.campaign(CAMPAIGN).context("weekly_digest")?.clone();
    let period = kick::period_for(&store, &campaign, None, kick::PeriodRule::NearNow).await?;
    let before = used_memory(&store).await?;
    kick::kick_registry(&store, &config, CAMPAIGN, &period).await?;

    let mut daemon = daemon(&config_path, &dir.join(format!("daemon-{batch}.log")))?;
    let pid = daemon.id();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120 + n * 3 / (u64::from(RPS) * batch as u64).max(1));
    let mut last = None;
    let counts = loop {
        let c = store.counts(CAMPAIGN, &period).await.unwrap_or_default();
        last = footprint(pid).or(last);
        if c.settled() >= c.enqueued || Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let elapsed = started.elapsed().as_secs_f64();
    trimmed(&store).await?;
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
    let _ = daemon.wait();
    let after = used_memory(&store).await?;
    (r.recent_index_bytes, r.recent_index_bytes_per_delivery) = recent_index(&store).await?;
    stop_emulator.trigger();
    let _ = emulator_task.await;
    let stats = emulator.stats();
    let ceiling = f64::from(RPS) * 100.0;
    // The sending window: first acceptance to last, plus the last request's own slot.
    let times: Vec<Instant> = emulator.send_times_matching("").into_values().flatten().collect();
    let window = match (times.iter().min(), times.iter().max()) {
        (Some(first), Some(last)) => (*last - *first).as_secs_f64() + 1.0 / f64::from(RPS),
        _ => elapsed,
    };
    let sizes: Vec<usize> = emulator.seen().iter().filter(|s| s.status == 200).map(|s| s.emails).collect();
    let partial: Vec<String> =
        sizes.iter().enumerate().filter(|(_, n)| **n < batch).map(|(i, n)| format!("#{i}:{n}")).collect();
    eprintln!("   {} requests; partial batches (request:emails): {}", sizes.len(), partial.join(" "));
    r.deliveries = counts.enqueued;
    r.sent = counts.sent;
    r.throughput_ratio = stats.emails_accepted as f64 / window / ceiling;
    r.throughput_ratio_from_start = stats.emails_accepted as f64 / elapsed / ceiling;
    r.rate_limited = stats.rate_limited;
    r.duplicate_sends = stats.duplicate_sends;
    r.worst_second_requests = stats.max_requests_in_1s;
    r.redis_bytes_per_settled_delivery = after.saturating_sub(before) as f64 / n.max(1) as f64;
    if let Some((hwm_kib, cpu)) = last {
        r.daemon_peak_rss_mib = hwm_kib as f64 / 1024.0;
        r.cpu_seconds_per_10k_emails = cpu / counts.sent.max(1) as f64 * 10_000.0;
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `kick` over the registry vs redis-benchmark running enqueue.lua, on one Redis.
async fn fan_out(sizes: &Sizes, r: &mut Results) -> anyhow::Result<()> {
    let redis = RedisServer::start(RedisOptions::default()).await?;
    let mut config = Config::example();
    config.campaigns.iter_mut().for_each(|c| c.schedule = None);
    config.redis.url = Secret::new(redis.url());
    config.redis.partitions = PARTITIONS;
    config.redis.durability = mailstream::config::Durability::Relaxed;
    let store = Store::open(&config).await?;
    let subs: Vec<Subscriber> = (0..sizes.kicked).map(Subscriber::synthetic).collect();
    for chunk in subs.chunks(100_000) {
        subscribers::upsert(&store, chunk).await?;
    }
    drop(subs);
    // Weeks of next year: their kick windows are open (they have not started).
    let year = chrono::Datelike::year(&chrono::Utc::now()) + 1;
    for rep in 0..sizes.repetitions {
        let period = format!("{year}-W{}", 10 + rep);
        let before = used_memory(&store).await?;
        let mut conn = store.conn().await?;
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await?;
        let cpu_before = footprint(std::process::id()).map_or(0.0, |(_, cpu)| cpu);
        let t = Instant::now();
        let report = kick::kick_registry(&store, &config, CAMPAIGN, &period).await?;
        let took = t.elapsed().as_secs_f64();
        let kick_cpu = footprint(std::process::id()).map_or(0.0, |(_, cpu)| cpu) - cpu_before;
        let rate = report.new as f64 / took;
        // Where Redis spent its time during the kick.
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await?;
        let top: Vec<String> = stats
            .lines()
            .filter_map(|l| {
                let name = l.strip_prefix("cmdstat_")?.split(':').next()?;
                let usec: f64 = l.split("usec=").nth(1)?.split(',').next()?.parse().ok()?;
                (usec > 1e5).then(|| format!("{name} {:.2} s", usec / 1e6))
            })
            .collect();
        // Redis 7 counts the commands a script calls on their own too (hsetnx, xadd inside
        // evalsha): evalsha is the enqueue script's whole time, hscan the audience read.
        let profile = format!(
            "kick took {took:.2} s ({kick_cpu:.2} CPU s in the kick); Redis time by command: {}",
            top.join(", ")
        );
        eprintln!("   {profile}");
        if rep == 0 {
            r.kick_profile = profile;
        }
        anyhow::ensure!(report.new == sizes.kicked, "kick enqueued {} of {}", report.new, sizes.kicked);
        if rep == 0 {
            r.redis_bytes_per_delivery = used_memory(&store).await?.saturating_sub(before) as f64 / report.new as f64;
        }
        r.kick_per_second_runs.push(rate);
        let ceiling = redis_benchmark(&store, &redis, sizes.kicked, rep).await?;
        r.redis_ceiling_runs.push(ceiling);
        r.kick_ratio_runs.push(rate / ceiling.max(1e-9));
        eprintln!("   run {}: kick {rate:.0}/s, redis-benchmark {ceiling:.0}/s", rep + 1);
    }
    r.kicked = sizes.kicked;
    r.kick_per_second = median(&r.kick_per_second_runs);
    r.redis_ceiling_per_second = median(&r.redis_ceiling_runs);
    r.kick_ratio_to_redis_ceiling = median(&r.kick_ratio_runs);
    Ok(())
}

/// enqueue.lua run by redis-benchmark, as many new deliveries a call as the kick sends
/// ([`kick::ENQUEUE_CHUNK`]; random ids in one partition's slot), 16 calls pipelined on
/// each of 4 connections; deliveries/s.
async fn redis_benchmark(store: &Store, redis: &RedisServer, deliveries: u64, rep: usize) -> anyhow::Result<f64> {
    let mut conn = store.conn().await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(format!("{}{}", mailstream::store::scripts::PRELUDE, include_str!("../lua/enqueue.lua")))
        .query_async(&mut conn)
        .await?;
    let keys = &store.keys;
    let period = format!("{}-W{}", chrono::Datelike::year(&chrono::Utc::now()) + 1, 40 + rep);
    let campaign = Config::example().campaign(CAMPAIGN).context("the example campaign")?.clone();
    let window = kick::window_of(&campaign, &period, 7_776_000)?;
    let chunk = kick::ENQUEUE_CHUNK;
    let calls = (deliveries / chunk as u64).max(100);
    let port = redis.port().to_string();
    let mut args: Vec<String> = vec![
        "-h".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port,
        "-n".into(),
        calls.to_string(),
        "-c".into(),
        "4".into(),
        "-P".into(),
        "16".into(),
        "-r".into(),
        // redis-benchmark's key space is an int: 10^9 random ids per placeholder.
        "1000000000".into(),
        "--csv".into(),
        "EVALSHA".into(),
        sha,
        (2 + 3 * Channel::ALL.len() + chunk).to_string(),
        keys.periods(0),
        keys.audience(0),
    ];
    // Every channel's stream, counts and due set, as the kick passes them (email's used).
    for channel in Channel::ALL {
        let lane = Lane::of(CAMPAIGN, channel);
        args.push(keys.lane_stream(0, lane));
        args.push(keys.channel_counts(0, CAMPAIGN, &period, channel));
        args.push(keys.lane_due(0, lane));
    }
    let ids: Vec<String> = (0..chunk).map(|i| format!("{CAMPAIGN}:{period}:b{i}-__rand_int__:team-1")).collect();
    args.extend(ids.iter().map(|id| keys.delivery(0, id)));
    args.push("7776000".into());
    args.push(format!("{CAMPAIGN}:{period}"));
    args.push(keys.delivery(0, "").len().to_string());
    args.push("0".into());
    args.push(Channel::ALL.len().to_string());
    args.push(window.start_ms.to_string());
    args.push(window.window_secs.to_string());
    // Each item's channel: email (1).
    args.extend((0..chunk).map(|_| "1".to_string()));
    let out = Command::new("redis-benchmark").args(&args).output().context("running redis-benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // --csv: "test","rps",...; the second field of the last line is calls per second.
    let calls_per_second: f64 = text
        .lines()
        .last()
        .and_then(|l| l.split(',').nth(1))
        .map(|v| v.trim_matches('"'))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("redis-benchmark printed no rate: {text}{}", String::from_utf8_lossy(&out.stderr)))?;
    Ok(calls_per_second * chunk as f64)
}

/// bench/bullmq/run.sh on a private Redis (npm installs BullMQ into bench/bullmq on first use).
async fn bullmq(quick: bool, r: &mut Results) -> anyhow::Result<()> {
    let redis = RedisServer::start(RedisOptions::default()).await?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/bullmq/run.sh");
    let mut cmd = Command::new(script);
    cmd.arg(redis.url());
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.stderr(Stdio::inherit()).output().context("running bench/bullmq/run.sh (needs node and npm)")?;
    anyhow::ensure!(out.status.success(), "bench/bullmq/run.sh failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.lines().last().unwrap_or("")).context("bench/bullmq printed no JSON")?;
    let num = |path: &[&str]| path.iter().fold(&v, |v, k| &v[*k]).as_f64();
    r.bullmq_add_per_second = num(&["enqueue", "jobs_per_second"]).context("bench/bullmq: enqueue rate")?;
    // The worst of its steady run and of the boundary probe (a burst added just before
    // its fixed window turns over).
    let steady = num(&["limiter", "worst_second"]).context("bench/bullmq: limiter worst second")?;
    let probe = num(&["limiter", "boundary_probe", "worst_second"]).unwrap_or(0.0);
    r.bullmq_worst_second_requests = steady.max(probe) as u64;
    r.bullmq_bytes_per_job = num(&["memory", "bytes_per_waiting_job"]).context("bench/bullmq: memory")?;
    Ok(())
}

/// bench/webhooks for `seconds`.
fn webhooks(seconds: u64, r: &mut Results) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/webhooks");
    let out = Command::new(script)
        .args(["--seconds", &seconds.to_string(), "--json"])
        .stderr(Stdio::inherit())
        .output()
        .context("running bench/webhooks")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.lines().last().unwrap_or("")).context("bench/webhooks printed no JSON")?;
    r.webhook_events_per_second = v["events_per_second"].as_f64().unwrap_or(0.0);
    r.webhook_p99_ms = v["p99_ms"].as_f64().unwrap_or(0.0);
    r.webhook_reference_set_per_second = v["reference_set_per_second"].as_f64().unwrap_or(0.0);
    r.webhook_ratio_to_reference = v["ratio_to_reference"].as_f64().unwrap_or(0.0);
    Ok(())
}

/// bench/headroom: every rate with one daemon and two (`quick`: 50 requests/s, one, 3 s).
fn headroom(quick: bool, r: &mut Results) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/headroom");
    let mut cmd = Command::new(script);
    if quick {
        cmd.args(["--rates", "50", "--daemons", "1", "--seconds", "3"]);
    }
    let out = cmd.arg("--json").stderr(Stdio::inherit()).output().context("running bench/headroom")?;
    anyhow::ensure!(out.status.success(), "bench/headroom failed");
    let text = String::from_utf8_lossy(&out.stdout);
    r.headroom = serde_json::from_str(text.lines().last().unwrap_or("")).context("bench/headroom printed no JSON")?;
    Ok(())
}

fn machine() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find_map(|l| l.strip_prefix("model name")).map(|l| l.trim_start_matches([' ', '\t', ':']));
    m.insert("cpu".into(), model.unwrap_or("?").to_string());
    m.insert("cores".into(), std::thread::available_parallelism().map(|n| n.get().to_string()).unwrap_or_default());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:")).map(str::trim).unwrap_or("?");
    m.insert("memory".into(), total.to_string());
    let version = |cmd: &str, arg: &str| {
        Command::new(cmd)
            .arg(arg)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|_| "not found".into())
    };
    m.insert("redis".into(), version("redis-server", "--version"));
    m.insert("node".into(), version("node", "--version"));
    m.insert(
        "load_average_at_start".into(),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string(),
    );
    m.insert("date".into(), chrono::Utc::now().to_rfc3339());
    m
}

fn results_md(r: &Results, s: &Sizes) -> String {
    let target = |ok: bool| if ok { "met" } else { "**missed**" };
    let runs = |v: &[f64]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ");
    let spread = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::MAX, 0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        if v.len() > 1 { format!("{lo:.0}–{hi:.0}") } else { "one run".into() }
    };
    let machine: Vec<String> = r.machine.iter().map(|(k, v)| format!("- {k}: {v}")).collect();
    let small = if r.small_run_deliveries > 0 {
        format!(
            "| the same at {} deliveries (the tail: each partition's last partial batch, shared) | {:.0} emails/s | ceiling {:.0} | {:.3} | ≥ 0.95 ({}) |\n",
            r.small_run_deliveries,
            r.small_run_throughput_ratio * f64::from(RPS) * 100.0,
            f64::from(RPS) * 100.0,
            r.small_run_throughput_ratio,
            target(r.small_run_throughput_ratio >= 0.95)
        )
    } else {
        String::new()
    };
    format!(
        "# Benchmark results\n\n\
Written by `bench/run{quick}` ({secs:.0} s). Every figure is from this one sitting; each is\n\
set against a reference measured in the same run, since absolute times drift on a\n\
shared machine. The method of each measure is in `bench/suite.rs`; `bench/README.md`\n\
keeps earlier runs.\n\n\
## Machine\n\n{machine}\n\n\
## Results\n\n\
| measure | mailstream | reference (same run) | ratio | target |\n|---|---|---|---|---|\n\
| delivery throughput, {sent} deliveries at {rps} requests/s, first request to last, pacing guard {GUARD_MS} ms a second (loopback) | {tput:.0} emails/s | ceiling {ceiling:.0} emails/s (rps × 100) | {tr:.3} | ≥ {tt} ({tm}) |\n\
| the same from the daemon's start (process start-up, Redis checks, script loading included) | | | {trs:.3} | |\n\
{small}\
| the naive design (1 email per request, same limiter), {naive} deliveries | {ne:.1} emails/s | ceiling {ceiling:.0} | {nr:.4} | contrast |\n\
| rate-limited answers / duplicate real sends | {rl} / {dup} | 0 / 0 | | 0 ({rlm}) |\n\
| worst sliding second (configured {rps}/s) | {ws} requests | BullMQ `limiter {{max: 10, duration: 1000}}`: {bws} | | ≤ {rps} ({wsm}) |\n\
| fan-out: `kick` of {kicked} subscribers (median of {reps}: {kruns}; spread {kspread}) | {kps:.0} deliveries/s | redis-benchmark, enqueue.lua, {chunk} per call (as the kick), P16 × 4: {rc:.0}/s (runs {rruns}) | {kr:.2} (median of the paired ratios {kratios}) | ≥ 0.7 ({krm}) |\n\
| where the kick's time goes (first run, `INFO commandstats`) | {kprof} | | | |\n\
| fan-out vs BullMQ `addBulk` with `jobId` | {kps:.0}/s | {bq:.0} jobs/s | {kb:.1}× | ≥ 4× ({kbm}) |\n\
| Redis memory per pending delivery (used_memory delta after the kick) | {bpd:.0} B | BullMQ per job: {bbj:.0} B | {mr:.2} | ≤ 225 B ({bpm}) |\n\
| Redis memory per settled delivery (after sending, before the retention expires) | {bps:.0} B | BullMQ per job: {bbj:.0} B | {sr:.2} | ≤ 120 B ({bsm}) |\n\
| of which the delivery log's newest-first index (`recent`, at most {keep} per partition: {rit:.1} MiB at most here) | {rib:.0} B per delivery it holds | | | |\n\
| daemon peak RSS sending at the ceiling | {rss:.1} MiB | | | ≤ 64 MiB ({rssm}) |\n\
| daemon CPU per 10,000 emails | {cpu:.2} s | | | ≤ 2 s ({cpum}) |\n\
| webhook ingestion ({ws_s} s, 32 connections, fsync always) | {wh:.0} verified events/s, p99 {whp:.2} ms | `redis-benchmark -c 32 -t set`, same Redis: {whr:.0}/s | {whq:.2} | ≥ 0.5, p99 < 10 ms ({whm}) |\n\
{headroom}\n\
{scale}\n\
Sizes: {sent} deliveries sent (durable Redis: append-only, fsync always; the daemon as a\n\
process of its own, RSS and CPU from /proc), {kicked} subscribers kicked on a Redis without\n\
persistence (the same one redis-benchmark runs on), BullMQ's sizes as `bench/bullmq/run.sh{quick}`.\n\
Memory after the retention expires is the baseline again: every record and key expires.\n",
        quick = if r.quick { " --quick" } else { "" },
        secs = r.seconds,
        machine = machine.join("\n"),
        sent = r.deliveries,
        rps = RPS,
        tput = r.throughput_ratio * f64::from(RPS) * 100.0,
        ceiling = f64::from(RPS) * 100.0,
        tr = r.throughput_ratio,
        trs = r.throughput_ratio_from_start,
        tt = if s.sent >= 50_000 { "0.97" } else { "0.95" },
        tm = target(r.throughput_ratio >= if s.sent >= 50_000 { 0.97 } else { 0.95 }),
        naive = s.naive,
        ne = r.naive_emails_per_second,
        nr = r.naive_ratio_to_ceiling,
        rl = r.rate_limited,
        dup = r.duplicate_sends,
        rlm = target(r.rate_limited == 0 && r.duplicate_sends == 0),
        ws = r.worst_second_requests,
        bws = r.bullmq_worst_second_requests,
        wsm = target(r.worst_second_requests <= u64::from(RPS)),
        kicked = r.kicked,
        reps = s.repetitions,
        kruns = runs(&r.kick_per_second_runs),
        kspread = spread(&r.kick_per_second_runs),
        kps = r.kick_per_second,
        rc = r.redis_ceiling_per_second,
        rruns = runs(&r.redis_ceiling_runs),
        kr = r.kick_ratio_to_redis_ceiling,
        kratios = r.kick_ratio_runs.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", "),
        kprof = r.kick_profile,
        chunk = kick::ENQUEUE_CHUNK,
        krm = target(r.kick_ratio_to_redis_ceiling >= 0.7),
        bq = r.bullmq_add_per_second,
        kb = r.kick_ratio_to_bullmq,
        kbm = target(r.kick_ratio_to_bullmq >= 4.0),
        bpd = r.redis_bytes_per_delivery,
        bbj = r.bullmq_bytes_per_job,
        mr = r.redis_bytes_per_delivery / r.bullmq_bytes_per_job.max(1e-9),
        bpm = target(r.redis_bytes_per_delivery <= 225.0),
        bps = r.redis_bytes_per_settled_delivery,
        sr = r.redis_bytes_per_settled_delivery / r.bullmq_bytes_per_job.max(1e-9),
        bsm = target(r.redis_bytes_per_settled_delivery <= 120.0),
        rib = r.recent_index_bytes_per_delivery,
        keep = mailstream::store::keys::RECENT_KEEP,
        rit = r.recent_index_bytes_per_delivery
            * (mailstream::store::keys::RECENT_KEEP * usize::from(PARTITIONS)) as f64
            / 1_048_576.0,
        rss = r.daemon_peak_rss_mib,
        rssm = target(r.daemon_peak_rss_mib <= 64.0),
        cpu = r.cpu_seconds_per_10k_emails,
        cpum = target(r.cpu_seconds_per_10k_emails <= 2.0),
        ws_s = s.webhook_seconds,
        wh = r.webhook_events_per_second,
        whp = r.webhook_p99_ms,
        whr = r.webhook_reference_set_per_second,
        whq = r.webhook_ratio_to_reference,
        whm = target(r.webhook_ratio_to_reference >= 0.5 && r.webhook_p99_ms < 10.0),
        headroom = headroom_rows(&r.headroom),
        scale = scale_rows(&r.scale),
    )
}

/// The scale points as a table of their own, with how far each is from the others.
fn scale_rows(points: &[ScalePoint]) -> String {
    if points.is_empty() {
        return String::new();
    }
    let spread = |f: &dyn Fn(&ScalePoint) -> f64| {
        let (lo, hi) = points.iter().map(f).fold((f64::MAX, 0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
        (hi - lo) / lo.max(1e-9)
    };
    let mut out = String::from(
        "\n| scale (the emulator without a rate limit) | pending B/delivery | settled B/delivery | daemon CPU s per 10k emails | seconds |\n|---|---|---|---|---|\n",
    );
    for p in points {
        out.push_str(&format!(
            "| {} deliveries | {:.0} | {:.0} | {:.3} | {:.1} |\n",
            p.deliveries, p.pending_bytes, p.settled_bytes, p.cpu_seconds_per_10k, p.seconds
        ));
    }
    out.push_str(&format!(
        "| largest over smallest, less 1 (target: each within 10 %) | {:.0} % | {:.0} % | {:.0} % | |\n",
        spread(&|p| p.pending_bytes) * 100.0,
        spread(&|p| p.settled_bytes) * 100.0,
        spread(&|p| p.cpu_seconds_per_10k) * 100.0
    ));
    out
}

/// The headroom points as table rows (the target is the one at 50 requests/s, one daemon).
fn headroom_rows(points: &[Value]) -> String {
    let num = |p: &Value, k: &str| p[k].as_f64().unwrap_or(0.0);
    points
        .iter()
        .map(|p| {
            let (rps, daemons, ratio) = (num(p, "rps"), num(p, "daemons"), num(p, "ratio"));
            let target = match (rps as u32, daemons as u32) {
                (50, 1) => format!("≥ 0.95 ({})", if ratio >= 0.95 { "met" } else { "**missed**" }),
                _ => String::new(),
            };
            format!(
                "| headroom: {daemons} daemon(s), {rps} requests/s, {} partitions, {} deliveries; CPU per second: Redis {:.2}, daemons {:.2}, emulator {:.2} | {:.0} emails/s | ceiling {:.0} | {ratio:.3} | {target} |\n",
                num(p, "partitions"),
                num(p, "deliveries"),
                num(p, "redis_cpu"),
                num(p, "daemon_cpu"),
                num(p, "emulator_cpu"),
                num(p, "emails_per_second"),
                num(p, "ceiling"),
            )
        })
        .collect()
}
