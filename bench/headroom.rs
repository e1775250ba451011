//! `bench/headroom [--rates 10,25,50,100,200] [--daemons 1,2] [--seconds S]
//! [--partitions P] [--account R] [--perf] [--json]`: how far past Resend's default 10 requests/s
//! one Redis goes. For each number of daemons and each rate: a private Redis
//! (append-only, fsync always), the emulator at that rate (in this process),
//! `rate × 100 × S` deliveries kicked, then the daemons (the release binary, as
//! processes of their own) send them all. Reports emails/s from the first
//! request to the last against the ceiling (rate × 100), and where the cores
//! went meanwhile: Redis's CPU and its busiest commands (`INFO commandstats`),
//! the daemons' CPU, and this process's (the emulator's). `--profile` also records
//! the first daemon with `perf` and prints where its CPU went, and Redis's time by
//! script (every call in the slow log, its threshold at 0). `--account R` gives the
//! emulator a team limit of R requests/s below the configured rate (a 5/s account that
//! mailstream was configured at 10 for): the ceiling is then R × 100, and the 429s are
//! what learning the real limit from the first answers cost.

#[path = "process.rs"]
mod process;

use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::audience::kick;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, Secret};
use mailstream::store::Store;
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::emulator::{Emulator, EmulatorConfig};
use serde::Serialize;

const CAMPAIGN: &str = "weekly_digest";

struct Options {
    rates: Vec<u32>,
    daemons: Vec<u32>,
    seconds: f64,
    partitions: u16,
    /// The emulator's team limit when it is below the configured rate.
    account: Option<u32>,
    profile: bool,
    json: bool,
}

#[derive(Debug, Serialize)]
struct Point {
    rps: u32,
    /// The account's real limit (the emulator's), when below `rps`.
    account: Option<u32>,
    partitions: u16,
    daemons: u32,
    ceiling: f64,
    deliveries: u64,
    emails_per_second: f64,
    ratio: f64,
    rate_limited: u64,
    duplicate_sends: u64,
    /// First request to last.
    sending_seconds: f64,
    /// CPU seconds per second of sending: Redis, the daemons together, the emulator
    /// (this process), out of the machine's cores.
    redis_cpu: f64,
    daemon_cpu: f64,
    emulator_cpu: f64,
    /// Redis's busiest commands while sending (µs of Redis time per email).
    redis_us_per_email: Vec<(String, f64)>,
}

fn list<T: std::str::FromStr>(v: Option<String>, what: &str) -> Vec<T> {
    v.unwrap_or_default()
        .split(',')
        .map(|x| x.trim().parse().unwrap_or_else(|_| panic!("{what}: bad number {x}")))
        .collect()
}

fn main() -> ExitCode {
    let mut o = Options {
        rates: vec![10, 25, 50, 100, 200],
        daemons: vec![1, 2],
        seconds: 20.0,
        partitions: 4,
        account: None,
        profile: false,
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rates" => o.rates = list(args.next(), "--rates"),
            "--daemons" => o.daemons = list(args.next(), "--daemons"),
            "--seconds" => o.seconds = args.next().and_then(|v| v.parse().ok()).expect("--seconds needs a number"),
            "--partitions" => {
                o.partitions = args.next().and_then(|v| v.parse().ok()).expect("--partitions needs a number")
            }
            "--account" => {
                o.account = Some(args.next().and_then(|v| v.parse().ok()).expect("--account needs a number"))
            }
            "--profile" => o.profile = true,
            "--json" => o.json = true,
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    eprintln!("partitions: {} (redis.partitions of every run), {} s of sending at each rate", o.partitions, o.seconds);
    let mut points = Vec::new();
    for &daemons in &o.daemons {
        for &rps in &o.rates {
            match runtime.block_on(point(&o, daemons, rps)) {
                Ok(p) => {
                    eprintln!(
                        "{} daemon(s), {:3} requests/s{}: {:7.0} emails/s, {:.3} of the ceiling ({} rate-limited, {} duplicates); \
                         CPU per second: Redis {:.2}, daemons {:.2}, emulator {:.2}; Redis µs per email: {}",
                        p.daemons,
                        p.rps,
                        p.account.map(|a| format!(" on a {a}/s account")).unwrap_or_default(),
                        p.emails_per_second,
                        p.ratio,
                        p.rate_limited,
                        p.duplicate_sends,
                        p.redis_cpu,
                        p.daemon_cpu,
                        p.emulator_cpu,
                        p.redis_us_per_email
                            .iter()
                            .map(|(c, us)| format!("{c} {us:.1}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    points.push(p);
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    if o.json {
        println!("{}", serde_json::to_string(&points).expect("serializes"));
    }
    ExitCode::SUCCESS
}

/// Redis's user + system CPU seconds so far, and its command stats (name, µs).
async fn redis_usage(store: &Store) -> anyhow::Result<(f64, Vec<(String, f64)>)> {
    let mut conn = store.conn().await?;
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
    let field = |name: &str| -> f64 {
        info.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    };
    let cpu = field("used_cpu_user:") + field("used_cpu_sys:");
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await?;
    let commands = stats
        .lines()
        .filter_map(|l| {
            let name = l.strip_prefix("cmdstat_")?.split(':').next()?;
            let usec: f64 = l.split("usec=").nth(1)?.split(',').next()?.parse().ok()?;
            Some((name.to_string(), usec))
        })
        .collect();
    Ok((cpu, commands))
}

/// With `start`, logs every command from now on; else reads the log: (script or
/// command, calls, µs), the busiest first.
async fn slowlog(store: &Store, start: bool) -> anyhow::Result<Vec<(String, u64, f64)>> {
    let mut conn = store.conn().await?;
    if start {
        let _: () =
            redis::cmd("CONFIG").arg("SET").arg("slowlog-max-len").arg(1_000_000).query_async(&mut conn).await?;
        let _: () = redis::cmd("SLOWLOG").arg("RESET").query_async(&mut conn).await?;
        let _: () =
            redis::cmd("CONFIG").arg("SET").arg("slowlog-log-slower-than").arg(0).query_async(&mut conn).await?;
        return Ok(Vec::new());
    }
    let _: () = redis::cmd("CONFIG").arg("SET").arg("slowlog-log-slower-than").arg(-1).query_async(&mut conn).await?;
    let names: std::collections::HashMap<String, String> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/lua"))?
            .filter_map(|e| {
                let path = e.ok()?.path();
                let name = path.file_stem()?.to_str()?.to_string();
                let source = std::fs::read_to_string(&path).ok()?;
                let script = redis::Script::new(&format!("{}{source}", mailstream::store::scripts::PRELUDE));
                Some((script.get_hash().to_string(), name))
            })
            .collect();
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query_async(&mut conn).await?;
    let mut by: std::collections::HashMap<String, (u64, f64)> = std::collections::HashMap::new();
    for entry in entries {
        let redis::Value::Array(fields) = entry else { continue };
        let us: i64 = fields.get(2).and_then(|v| redis::from_redis_value(v.clone()).ok()).unwrap_or(0);
        let args: Vec<String> = fields.get(3).and_then(|v| redis::from_redis_value(v.clone()).ok()).unwrap_or_default();
        let command = args.first().map(|c| c.to_lowercase()).unwrap_or_default();
        let name = match (command.as_str(), args.get(1)) {
            ("evalsha", Some(sha)) => names.get(sha).cloned().unwrap_or_else(|| format!("evalsha {sha:.8}")),
            _ => command,
        };
        let e = by.entry(name).or_default();
        *e = (e.0 + 1, e.1 + us as f64);
    }
    let mut by: Vec<(String, u64, f64)> = by.into_iter().map(|(n, (c, us))| (n, c, us)).collect();
    by.sort_by(|a, b| b.2.total_cmp(&a.2));
    Ok(by)
}

/// A process's user + system CPU seconds, from /proc.
fn cpu_of(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, s)| s.split_whitespace().collect()).unwrap_or_default();
    let ticks: u64 = fields.get(11..13).map_or(0, |t| t.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz
}

async fn point(o: &Options, daemons: u32, rps: u32) -> anyhow::Result<Point> {
    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
    let limit = o.account.unwrap_or(rps).min(rps);
    let emulator = Emulator::new(EmulatorConfig { requests_per_second: Some(limit), ..Default::default() });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await?;
    let dir = std::env::temp_dir().join(format!("mailstream-headroom-{}-{daemons}-{rps}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("config.toml");
    let text = process::config_text(
        &redis.url(),
        &emulator_url,
        &[
            ("requests_per_second = 10", format!("requests_per_second = {rps}")),
            ("partitions = 1", format!("partitions = {}", o.partitions)),
            // On loopback the emulator is a few hundred µs away (as bench/run).
            ("pacing_guard_ms = 20", "pacing_guard_ms = 5".into()),
        ],
    );
    std::fs::write(&config_path, text)?;
    let mut config = Config::load(&config_path)?;
    config.resend.api_key = Some(Secret::new("re_headroom"));
    let store = Store::open(&config).await?;
    let ceiling = f64::from(limit) * 100.0;
    let n = (ceiling * o.seconds) as u64;
    for start in (0..n).step_by(100_000) {
        let subs: Vec<Subscriber> = (start..n.min(start + 100_000)).map(Subscriber::synthetic).collect();
        subscribers::upsert(&store, &subs).await?;
    }
    let campaign = config.campaign(CAMPAIGN).context("weekly_digest")?.clone();
    let period = kick::period_for(&store, &campaign, None, kick::PeriodRule::NearNow).await?;
    kick::kick_registry(&store, &config, CAMPAIGN, &period).await?;
    let mut conn = store.conn().await?;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await?;
    let (redis_cpu_before, _) = redis_usage(&store).await?;
    let own_before = cpu_of(std::process::id());

    let binary = PathBuf::from(env!("CARGO_BIN_EXE_mailstream"));
    let mut children: Vec<Child> = (0..daemons)
        .map(|i| {
            process::spawn_instance(&binary, &config_path, &dir.join(format!("daemon-{i}.log")), "re_headroom", i + 1)
        })
        .collect::<anyhow::Result<_>>()?;
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let perf_data = dir.join("perf.data");
    if o.profile {
        slowlog(&store, true).await?;
    }
    let mut perf = if o.profile {
        Some(
            Command::new("perf")
                .args(["record", "-F", "499", "-g", "-o"])
                .arg(&perf_data)
                .args(["-p", &pids[0].to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting perf (Debian package linux-perf)")?,
        )
    } else {
        None
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(120) + Duration::from_secs_f64(o.seconds * 4.0);
    let mut daemon_cpu = vec![0.0; pids.len()];
    loop {
        let c = store.counts(CAMPAIGN, &period).await.unwrap_or_default();
        for (cpu, pid) in daemon_cpu.iter_mut().zip(&pids) {
            *cpu = cpu_of(*pid).max(*cpu);
        }
        if c.settled() >= c.enqueued {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "{} of {} settled by the deadline", c.settled(), c.enqueued);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let own = cpu_of(std::process::id()) - own_before;
    let (redis_cpu_after, commands) = redis_usage(&store).await?;
    if let Some(perf) = perf.as_mut() {
        let _ = Command::new("kill").arg("-INT").arg(perf.id().to_string()).status();
        let _ = perf.wait();
    }
    for child in &mut children {
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let _ = child.wait();
    }
    stop_emulator.trigger();
    let _ = emulator_task.await;
    if o.profile {
        let by_script = slowlog(&store, false).await?;
        let requests = emulator.stats().requests.max(1) as f64;
        eprintln!("Redis time by script or command (calls per request, µs per call, µs per email):");
        for (name, calls, us) in by_script.iter().take(14) {
            eprintln!(
                "  {name:12} {:6.2} {:8.1} {:6.1}",
                *calls as f64 / requests,
                us / *calls as f64,
                us / (requests * 100.0)
            );
        }
        let report = Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "--sort",
                "dso,symbol",
                "--percent-limit",
                "1.5",
                "-g",
                "none",
                "-i",
            ])
            .arg(&perf_data)
            .output()
            .context("perf report")?;
        eprintln!("{}", String::from_utf8_lossy(&report.stdout));
    }
    let stats = emulator.stats();
    let seen = emulator.seen();
    let refused: Vec<String> =
        seen.iter().enumerate().filter(|(_, s)| s.status == 429).map(|(i, _)| format!("#{i}")).collect();
    if !refused.is_empty() {
        eprintln!("   rate-limited: request {} of {}", refused.join(", "), seen.len());
    }
    let times: Vec<Instant> = emulator.send_times_matching("").into_values().flatten().collect();
    let window = match (times.iter().min(), times.iter().max()) {
        (Some(first), Some(last)) => (*last - *first).as_secs_f64() + 1.0 / f64::from(limit),
        _ => started.elapsed().as_secs_f64(),
    };
    let emails = stats.emails_accepted as f64;
    let mut busiest: Vec<(String, f64)> =
        commands.into_iter().map(|(c, us)| (c, us / emails.max(1.0))).filter(|(_, us)| *us >= 0.5).collect();
    busiest.sort_by(|a, b| b.1.total_cmp(&a.1));
    busiest.truncate(6);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Point {
        rps,
        account: o.account.filter(|&a| a < rps),
        partitions: o.partitions,
        daemons,
        ceiling,
        deliveries: n,
        emails_per_second: emails / window,
        ratio: emails / window / ceiling,
        rate_limited: stats.rate_limited,
        duplicate_sends: stats.duplicate_sends,
        sending_seconds: window,
        redis_cpu: (redis_cpu_after - redis_cpu_before) / window,
        daemon_cpu: daemon_cpu.iter().sum::<f64>() / window,
        emulator_cpu: own / window,
        redis_us_per_email: busiest,
    })
}
