//! `bench/multi-instance [--instances N] [--cluster [--replicas R [--kill-primary]]]
//! [--deliveries D] [--rps R] [--batch-size N] [--no-kill] [--connect-delay-ms MS]
//! [--close-idle-after-ms MS] [--json]`:
//! several daemons as separate processes against one Redis (or a private
//! 3-primary cluster with `--cluster`, with `--replicas` replicas per primary and
//! `redis.wait_replicas` as many) and one emulator limited to `--rps` requests
//! per sliding second; one instance is killed with SIGKILL once a third is sent.
//! With `--kill-primary` no instance is killed; two runs, each on a fresh cluster, kill
//! a primary once a third is sent: `kill_limiter_primary` the one serving the shared
//! limiter's key, `kill_other_primary` one serving none of the shared keys (limiter,
//! provider, meta). Its replica is promoted, and the old node comes back as a replica
//! 60 s later. Each reports, from the **kill** to the last send of the partitions on
//! surviving primaries: their emails over that span times the ceiling
//! (`unaffected_ratio`), the longest interval without a provider request
//! (`longest_gap_seconds`), the requests made (`slots_used`) and the request slots
//! the daemons gave back, by reason (`slots_given_back`, from their metrics).
//! Then the emulator's counts: the worst sliding second, 429s, duplicate real
//! sends, and throughput against the ceiling. First, the cost of the shared
//! limiter: its script called 100 times a second.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::audience::kick;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, EXAMPLE, Secret};
use mailstream::store::Store;
use mailstream::store::redis_server::{RedisCluster, RedisOptions, RedisServer};
use mailstream::tools::emulator::{Emulator, EmulatorConfig};
use serde::Serialize;

struct Options {
    instances: u32,
    cluster: bool,
    /// Replicas per primary on the cluster; `redis.wait_replicas` is set to as many.
    replicas: usize,
    kill_primary: bool,
    deliveries: u64,
    rps: u32,
    kill_one: bool,
    json: bool,
    /// The emulator reads nothing from a new connection for this long (a slow TLS handshake).
    connect_delay_ms: u64,
    /// The emulator closes connections this long after they opened.
    close_idle_after_ms: Option<u64>,
    /// `resend.batch_size` (the shipped config's when not given).
    batch_size: Option<usize>,
}

/// Which primary `--kill-primary` kills.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// The one serving `CLUSTER KEYSLOT <prefix>:limiter`.
    Limiter,
    /// One serving none of the shared keys (limiter, provider, meta).
    Other,
}

/// One kill, measured from the kill to the last send of the partitions on surviving primaries.
#[derive(Debug, Clone, Serialize)]
struct KillReport {
    affected_partitions: Vec<u16>,
    unaffected_ratio: f64,
    longest_gap_seconds: f64,
    slots_used: u64,
    slots_given_back: BTreeMap<String, u64>,
    /// Spells without the shared limiter the daemons began from the kill on (calls to it
    /// given up after their patience): one or so each while its node fails over, and none
    /// after, unless something holds the connection to its node.
    limiter_unanswered: u64,
    failover_seconds: f64,
    duplicate_real_sends: u64,
    rate_limited: u64,
    worst_second_requests: u64,
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
    replicas: usize,
    /// With `--kill-primary`: the partitions on the killed primary.
    affected_partitions: Vec<u16>,
    /// From the kill to the promotion of its replica.
    failover_seconds: Option<f64>,
    /// The partitions on other primaries: emails they sent from the promotion to their
    /// last send, per second, over the ceiling.
    unaffected_ratio: Option<f64>,
    /// With `--kill-primary`: emails sent in each second from the kill, as [other
    /// partitions, the killed primary's].
    per_second_after_kill: Vec<[u64; 2]>,
    /// `resend.batch_size` of the run.
    batch_size: usize,
    /// With `--kill-primary`: the run that killed the limiter's primary (its figures
    /// are also the top level's, but for the counts, summed over both runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    kill_limiter_primary: Option<KillReport>,
    /// With `--kill-primary`: the run that killed a primary serving no shared key.
    #[serde(skip_serializing_if = "Option::is_none")]
    kill_other_primary: Option<KillReport>,
}

/// How long after the promotion the killed primary comes back (as a replica).
const REJOIN_AFTER: Duration = Duration::from_secs(60);

/// Where [`given_back`] counts the limiter's calls given up.
const LIMITER_UNANSWERED: &str = "limiter";

/// The least `unaffected_ratio` a run with `--kill-primary` passes with.
const UNAFFECTED_TARGET: f64 = 0.85;

/// The longest `longest_gap_seconds` a run with `--kill-primary` passes with.
const LONGEST_GAP_TARGET: f64 = 2.0;

/// The two kills' runs as one report: the limiter's run at the top level, with the
/// counts summed over both (and the worst second the worse of the two).
fn both_kills(mut limiter: Report, other: Report) -> Report {
    limiter.deliveries += other.deliveries;
    limiter.sent += other.sent;
    limiter.failed += other.failed;
    limiter.outcome_unknown += other.outcome_unknown;
    limiter.never_settled += other.never_settled;
    limiter.requests += other.requests;
    limiter.rate_limited += other.rate_limited;
    limiter.duplicate_real_sends += other.duplicate_real_sends;
    limiter.worst_second_requests = limiter.worst_second_requests.max(other.worst_second_requests);
    limiter.kill_other_primary = other.kill_other_primary;
    limiter
}

fn main() -> ExitCode {
    let mut o = Options {
        instances: 3,
        cluster: false,
        replicas: 0,
        kill_primary: false,
        deliveries: 30_000,
        rps: 10,
        kill_one: true,
        json: false,
        connect_delay_ms: 0,
        close_idle_after_ms: None,
        batch_size: None,
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
            "--replicas" => o.replicas = number("--replicas") as usize,
            "--kill-primary" => o.kill_primary = true,
            "--connect-delay-ms" => o.connect_delay_ms = number("--connect-delay-ms"),
            "--close-idle-after-ms" => o.close_idle_after_ms = Some(number("--close-idle-after-ms")),
            "--batch-size" => o.batch_size = Some(number("--batch-size") as usize),
            "--no-kill" => o.kill_one = false,
            "--json" => o.json = true,
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    if o.kill_primary {
        if !o.cluster || o.replicas == 0 {
            eprintln!("--kill-primary needs --cluster and --replicas 1 or more");
            return ExitCode::from(2);
        }
        o.kill_one = false;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let result = if o.kill_primary {
        runtime.block_on(async {
            let limiter = run(&o, Some(Kill::Limiter)).await?;
            let other = run(&o, Some(Kill::Other)).await?;
            anyhow::Ok(both_kills(limiter, other))
        })
    } else {
        runtime.block_on(run(&o, None))
    };
    match result {
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
            for (name, kill) in [("limiter's", &report.kill_limiter_primary), ("another", &report.kill_other_primary)] {
                if let Some(k) = kill {
                    eprintln!(
                        "{name} primary killed (partition(s) {:?}): replica promoted after {:.1} s; from the kill, the \
                         other partitions sent {:.3} of the ceiling, longest gap {:.2} s, {} requests, slots given \
                         back {:?}, {} spells without the limiter",
                        k.affected_partitions,
                        k.failover_seconds,
                        k.unaffected_ratio,
                        k.longest_gap_seconds,
                        k.slots_used,
                        k.slots_given_back,
                        k.limiter_unanswered
                    );
                }
            }
            if o.json {
                println!("{}", serde_json::to_string(&report).expect("serializes"));
            }
            let kills = [&report.kill_limiter_primary, &report.kill_other_primary];
            let ok =
                report.duplicate_real_sends == 0
                    && report.never_settled == 0
                    && report.rate_limited == 0
                    && kills.iter().copied().flatten().all(|k| {
                        k.unaffected_ratio >= UNAFFECTED_TARGET && k.longest_gap_seconds <= LONGEST_GAP_TARGET
                    });
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

async fn run(o: &Options, kill: Option<Kill>) -> anyhow::Result<Report> {
    let (calls, p50, p99, per_call) = limiter_cost().await?;

    let mut redis = if o.cluster {
        Redis::Cluster(RedisCluster::start_with(true, o.replicas).await?)
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
    let run_name = kill.map_or("run".to_string(), |k| format!("{k:?}").to_lowercase());
    let dir = std::env::temp_dir().join(format!("mailstream-multi-{}-{run_name}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("config.toml");
    let partitions = if o.cluster { CLUSTER_PARTITIONS } else { 1 };
    let mut text = config_text(&redis.url(), &emulator_url, o.rps, o.cluster, partitions);
    if o.replicas > 0 {
        text = text.replacen("wait_replicas = 0", &format!("wait_replicas = {}", o.replicas), 1);
    }
    if let Some(n) = o.batch_size {
        let shipped = format!("batch_size = {}", Config::example().resend.batch_size);
        assert!(text.contains(&shipped), "config.toml lost {shipped}");
        text = text.replacen(&shipped, &format!("batch_size = {n}"), 1);
    }
    std::fs::write(&config_path, text)?;
    let mut config = Config::load(&config_path)?;
    config.resend.api_key = Some(Secret::new("re_multi"));
    let store = Store::open(&config).await?;
    let subscribers: Vec<Subscriber> = (0..o.deliveries).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subscribers).await?;
    let campaign = config.campaign("weekly_digest").context("weekly_digest")?.clone();
    let period = kick::period_for(&store, &campaign, None, kick::PeriodRule::NearNow).await?;
    kick::kick_registry(&store, &config, &campaign.name, &period).await?;

    let binary = PathBuf::from(env!("CARGO_BIN_EXE_mailstream"));
    let started = Instant::now();
    let mut daemons: Vec<Child> = (0..o.instances)
        .map(|i| spawn_daemon(&binary, &config_path, &dir.join(format!("daemon-{i}.log")), i))
        .collect::<anyhow::Result<_>>()?;
    let mut killed = 0;
    // With --kill-primary: the killed node, when, when its replica took over, whether it is back.
    let mut primary_killed: Option<(usize, Instant, Instant, bool)> = None;
    let (mut affected, mut failover_seconds) = (Vec::new(), None);
    let mut given_back_at_kill = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(300 + o.deliveries / 20);
    let counts = loop {
        let c = store.counts(&campaign.name, &period).await.unwrap_or_default();
        if c.settled() >= c.enqueued || Instant::now() > deadline {
            break c;
        }
        if let (Some(kill), None, Redis::Cluster(cluster)) = (kill, primary_killed, &mut redis)
            && c.sent * 3 >= c.enqueued
        {
            let mut primary_of = Vec::new();
            for p in 0..partitions {
                primary_of.push(cluster.primary_of(cluster.slot_of(&store.keys.batches(p)).await?).await?);
            }
            let node = target(cluster, &store, kill, &primary_of).await?;
            affected = (0..partitions).filter(|&p| primary_of[usize::from(p)] == node).collect();
            given_back_at_kill = given_back(&dir, o.instances).await;
            let at = Instant::now();
            eprintln!(
                "  [{:5.1}s] kill -9 the {kill:?} primary (partition(s) {affected:?})",
                started.elapsed().as_secs_f64()
            );
            cluster.kill_primary(node).await?;
            failover_seconds = Some(at.elapsed().as_secs_f64());
            eprintln!("  [{:5.1}s] its replica is promoted", started.elapsed().as_secs_f64());
            primary_killed = Some((node, at, Instant::now(), false));
        }
        if let (Some((node, at, promoted, false)), Redis::Cluster(cluster)) = (primary_killed, &mut redis)
            && promoted.elapsed() >= REJOIN_AFTER
        {
            cluster.rejoin(node).await?;
            eprintln!("  [{:5.1}s] the old primary is back, as a replica", started.elapsed().as_secs_f64());
            primary_killed = Some((node, at, promoted, true));
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
    let given_back_at_end =
        if primary_killed.is_some() { given_back(&dir, o.instances).await } else { BTreeMap::new() };
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
    let in_affected = |to: &str| {
        let id = to.trim_start_matches("delivered+").split('@').next().unwrap_or_default();
        affected.contains(&store.keys.partition_of(id))
    };
    // From the kill to the last send of the partitions on surviving primaries.
    let kill_report = primary_killed.map(|(_, killed_at, _, _)| {
        let unaffected =
            sends.iter().filter(|(to, _)| !in_affected(to)).flat_map(|(_, at)| at.iter().filter(|&&t| t >= killed_at));
        let (n, last) = unaffected.fold((0u64, killed_at), |(n, last), &t| (n + 1, last.max(t)));
        let mut requests: Vec<Instant> =
            emulator.seen().iter().map(|s| s.at).filter(|&t| t >= killed_at && t <= last).collect();
        requests.sort_unstable();
        let longest_gap = std::iter::once(killed_at)
            .chain(requests.iter().copied())
            .chain(std::iter::once(last))
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .fold(0.0, f64::max);
        let since_kill = |key: &str| {
            given_back_at_end
                .get(key)
                .copied()
                .unwrap_or(0)
                .saturating_sub(given_back_at_kill.get(key).copied().unwrap_or(0))
        };
        let limiter_unanswered = since_kill(LIMITER_UNANSWERED);
        let slots_given_back = given_back_at_end
            .iter()
            .filter(|(reason, _)| reason.as_str() != LIMITER_UNANSWERED)
            .map(|(reason, &n)| {
                (reason.clone(), n.saturating_sub(given_back_at_kill.get(reason).copied().unwrap_or(0)))
            })
            .filter(|&(_, n)| n > 0)
            .collect();
        KillReport {
            affected_partitions: affected.clone(),
            unaffected_ratio: n as f64 / (last - killed_at).as_secs_f64().max(f64::EPSILON) / ceiling,
            longest_gap_seconds: longest_gap,
            slots_used: requests.len() as u64,
            slots_given_back,
            limiter_unanswered,
            failover_seconds: failover_seconds.unwrap_or_default(),
            duplicate_real_sends,
            rate_limited: stats.rate_limited,
            worst_second_requests: stats.max_requests_in_1s,
        }
    });
    let unaffected_ratio = kill_report.as_ref().map(|k| k.unaffected_ratio);
    // Emails per second from the kill: [other partitions, the killed primary's].
    let mut per_second_after_kill: Vec<[u64; 2]> = Vec::new();
    if let Some((_, killed_at, _, _)) = primary_killed {
        for (to, at) in &sends {
            for t in at.iter().filter(|&&t| t >= killed_at) {
                let s = (*t - killed_at).as_secs() as usize;
                if per_second_after_kill.len() <= s {
                    per_second_after_kill.resize(s + 1, [0, 0]);
                }
                per_second_after_kill[s][usize::from(in_affected(to))] += 1;
            }
        }
    }
    let batch_size = config.resend.batch_size;
    Ok(Report {
        batch_size,
        kill_limiter_primary: kill_report.clone().filter(|_| matches!(kill, Some(Kill::Limiter))),
        kill_other_primary: kill_report.filter(|_| matches!(kill, Some(Kill::Other))),
        replicas: o.replicas,
        affected_partitions: affected,
        failover_seconds,
        unaffected_ratio,
        per_second_after_kill,
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

/// The primary `kill` names: the one serving the limiter's key, or one serving none of
/// the shared keys (the one with the most partitions, when several do).
async fn target(cluster: &RedisCluster, store: &Store, kill: Kill, primary_of: &[usize]) -> anyhow::Result<usize> {
    let k = &store.keys;
    let limiter = cluster.primary_of(cluster.slot_of(&k.limiter()).await?).await?;
    if let Kill::Limiter = kill {
        return Ok(limiter);
    }
    let mut shared = vec![limiter];
    for key in [k.provider(), k.meta()] {
        shared.push(cluster.primary_of(cluster.slot_of(&key).await?).await?);
    }
    let mut candidates: Vec<usize> = cluster.primaries().await?;
    candidates.retain(|node| !shared.contains(node));
    candidates.sort_by_key(|&node| std::cmp::Reverse(primary_of.iter().filter(|&&p| p == node).count()));
    candidates.first().copied().context("every primary serves a shared key: no other primary to kill")
}

/// The request slots the daemons gave back so far, by reason, and (under `"limiter"`)
/// the spells without the shared limiter they began: its calls given up after their
/// patience (summed over their metrics; a daemon whose endpoint does not answer counts nothing).
async fn given_back(dir: &Path, instances: u32) -> BTreeMap<String, u64> {
    mailstream::resend::client::install_crypto_provider();
    let mut total = BTreeMap::new();
    for i in 0..instances {
        let log = std::fs::read_to_string(dir.join(format!("daemon-{i}.log"))).unwrap_or_default();
        let Some(addr) = log.lines().filter(|l| l.contains("metrics listening")).find_map(|l| {
            l.split("127.0.0.1:").nth(1).map(|rest| rest.chars().take_while(char::is_ascii_digit).collect::<String>())
        }) else {
            continue;
        };
        let Ok(text) = async { reqwest::get(format!("http://127.0.0.1:{addr}/metrics")).await?.text().await }.await
        else {
            continue;
        };
        for line in text.lines() {
            let reason = if line.starts_with("mailstream_request_slots_given_back_total{") {
                line.split("reason=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("?")
            } else if line.starts_with("mailstream_redis_errors_total{op=\"limiter\"}") {
                LIMITER_UNANSWERED
            } else {
                continue;
            };
            let n: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            *total.entry(reason.to_string()).or_insert(0) += n as u64;
        }
    }
    total
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
    // A rate well above the calls' so that a call takes a slot (the write the sender
    // makes) even when Redis runs two of them closer together than they were sent (an
    // fsync delayed the first); one that finds none costs the same and is timed alike.
    let limiter = mailstream::send::limiter::Shared::new(store.clone(), 1000, Duration::ZERO);
    let mut conn = store.conn().await?;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut conn).await?;
    let mut rtts = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    // A tick missed under load is not made up with a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..1000 {
        tick.tick().await;
        let t = Instant::now();
        limiter.probe().await?;
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
