//! `bench/webhooks [--seconds S] [--connections C] [--pending] [--json]`: the daemon
//! (the release binary, as a process of its own) with its public listener on
//! loopback and a private Redis (append-only, fsync always); `C` keep-alive
//! connections post signed `email.delivered` events, each about a real
//! delivery and with its own event id, for `S` seconds. As in production, the
//! events are about emails already sent: the daemon first sends the period's
//! 20,000 emails to the emulator (no rate limit), so each delivery is settled and
//! kept compactly, and an event is counted in the hour's tally. With `--pending`
//! sending is paused instead and the events are about deliveries not yet sent,
//! each written on its record too (a case Resend does not produce, kept to compare).
//! Either way the daemon's only work meanwhile is the webhooks. Reports verified
//! events per second, latency percentiles and errors, and the reference the
//! storage sets: `redis-benchmark -c C -t set` against the same Redis right
//! before and right after (one fsynced write per request, as an event's is; the mean
//! of the two), and their ratio. The load generator writes prepared requests on raw
//! keep-alive connections, as wrk would, so it takes little of the two cores.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, Secret};
use mailstream::model::svix::SigningKey;
use mailstream::model::work::DeliveryRef;
use mailstream::store::Store;
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::emulator::{Emulator, EmulatorConfig};
use serde::Serialize;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
/// `redis.partitions` of the run: one Redis, one partition.
const PARTITIONS: u16 = 1;
const DELIVERIES: u64 = 20_000;

#[derive(Debug, Serialize)]
struct Report {
    seconds: f64,
    connections: usize,
    events: u64,
    events_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    errors: u64,
    daemon_verified: u64,
    /// `redis-benchmark -c <connections> -t set` on the same Redis, right before and right
    /// after (their mean).
    reference_set_per_second: f64,
    ratio_to_reference: f64,
}

fn main() -> ExitCode {
    let (mut seconds, mut connections, mut json, mut pending) = (10u64, 32usize, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => seconds = args.next().and_then(|v| v.parse().ok()).expect("--seconds needs a number"),
            "--connections" => {
                connections = args.next().and_then(|v| v.parse().ok()).expect("--connections needs a number")
            }
            "--json" => json = true,
            "--pending" => pending = true,
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    match runtime.block_on(run(seconds, connections, pending)) {
        Ok(r) => {
            eprintln!(
                "{} events in {:.1} s over {} connections: {:.0} verified events/s, p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms, {} errors",
                r.events, r.seconds, r.connections, r.events_per_second, r.p50_ms, r.p99_ms, r.max_ms, r.errors
            );
            eprintln!(
                "reference: redis-benchmark -c {} -t set, fsync always: {:.0} writes/s; ratio {:.2}",
                r.connections, r.reference_set_per_second, r.ratio_to_reference
            );
            if json {
                println!("{}", serde_json::to_string(&r).expect("serializes"));
            }
            if r.errors == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(seconds: u64, connections: usize, pending: bool) -> anyhow::Result<Report> {
    let about = if pending { "not yet sent (--pending)" } else { "sent and settled" };
    eprintln!("partitions: {PARTITIONS}; the events are about deliveries {about}");
    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
    let mut config = Config::example();
    config.campaigns.iter_mut().for_each(|c| c.schedule = None);
    config.redis.url = Secret::new(redis.url());
    config.redis.partitions = PARTITIONS;
    let store = Store::open(&config).await?;
    let subs: Vec<Subscriber> = (0..DELIVERIES).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subs).await?;
    let campaign = config.campaigns[0].clone();
    let period = mailstream::audience::kick::period_for(&store, &campaign, None, Default::default()).await?;
    let period = period.as_str();
    mailstream::audience::kick::kick_registry(&store, &config, &campaign.name, period).await?;
    if pending {
        // Sending paused: the daemon's only work is the webhooks.
        let until = std::time::SystemTime::now() + Duration::from_secs(3600);
        mailstream::send::pause::Pause::default().begin(&store, until, "daily_quota_exceeded").await?;
    }
    // The emulator without a rate limit: the period is sent before the events start.
    let emulator = Emulator::new(EmulatorConfig { requests_per_second: None, ..Default::default() });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await?;

    let dir = std::env::temp_dir().join(format!("mailstream-webhooks-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("config.toml");
    let text = mailstream::config::EXAMPLE
        .replacen("schedule = \"0 9 * * MON\"", "", 1)
        .replacen("url = \"redis://127.0.0.1:6379\"", &format!("url = \"{}\"", redis.url()), 1)
        .replacen("partitions = 1", &format!("partitions = {PARTITIONS}"), 1)
        .replacen(
            "metrics_listen = \"127.0.0.1:9464\"",
            "metrics_listen = \"127.0.0.1:0\"\npublic_listen = \"127.0.0.1:0\"",
            1,
        )
        .replacen("public_requests_per_second_per_source = 5000", "public_requests_per_second_per_source = 1000000", 1)
        .replacen("base_url = \"https://api.resend.com\"", &format!("base_url = \"{emulator_url}\""), 1)
        .replacen("requests_per_second = 10\n", "requests_per_second = 1000\n", 1);
    anyhow::ensure!(
        text.contains("public_listen = \"127.0.0.1:0\"")
            && text.contains("= 1000000")
            && text.contains(&emulator_url)
            && text.contains("requests_per_second = 1000\n"),
        "config.toml changed shape"
    );
    std::fs::write(&config_path, text)?;
    let log = dir.join("daemon.log");
    let mut daemon = Command::new(PathBuf::from(env!("CARGO_BIN_EXE_mailstream")))
        .arg("run")
        .arg("--config")
        .arg(&config_path)
        .env("RESEND_API_KEY", "re_bench")
        .env("MAILSTREAM_WEBHOOK_SECRET", SECRET)
        .env("MAILSTREAM_UNSUBSCRIBE_SECRET", "unsubscribe-secret-of-the-bench")
        .env("MAILSTREAM_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let url = match wait_for_public(&log).await {
        Ok(url) => url,
        Err(e) => {
            // Not left running behind a failed benchmark.
            let _ = daemon.kill();
            let _ = daemon.wait();
            return Err(e);
        }
    };
    if !pending {
        let deadline = Instant::now() + Duration::from_secs(300);
        let counts = loop {
            let c = store.counts(&campaign.name, period).await.unwrap_or_default();
            if (c.enqueued > 0 && c.settled() >= c.enqueued) || Instant::now() > deadline {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if counts.sent != DELIVERIES {
            let _ = daemon.kill();
            let _ = daemon.wait();
            anyhow::bail!("{} of {DELIVERIES} sent before the events", counts.sent);
        }
    }

    // Every request made before the clock starts: bodies, ids, signatures.
    let key = SigningKey::parse(SECRET).expect("a key");
    let make = |n: u64| {
        let s = Subscriber::synthetic(n % DELIVERIES);
        let d = DeliveryRef::new(&campaign.name, period, &s.id, &s.targets_or_default()[0]);
        let body = serde_json::json!({"type": "email.delivered", "created_at": "2026-11-30T00:00:00Z",
            "data": {"email_id": format!("e{n}"), "to": [s.email], "tags": {"delivery": d.tag()}}})
        .to_string();
        (format!("msg_bench_{n}"), body)
    };
    // Signed before the clock starts, with one timestamp (well inside the five minutes
    // the daemon allows), so the clock measures the daemon, not the client's set-up.
    let ts = chrono::Utc::now().timestamp();
    let addr = url.trim_start_matches("http://").split('/').next().unwrap_or_default().to_string();
    // Enough for 40,000 events a second; the deadline ends the run first.
    let per_worker = 40_000 * seconds as usize / connections.max(1) + 100;
    // Each request as the bytes that go on the wire: the load generator does no work per
    // request but a write and a read (as wrk or redis-benchmark), so on two shared cores
    // the run measures the daemon rather than an HTTP client library.
    let prepared: Vec<Vec<Vec<u8>>> = (0..connections)
        .map(|w| {
            (0..per_worker as u64)
                .map(|i| make(i * connections as u64 + w as u64))
                .map(|(id, body)| {
                    let sig = key.sign(&id, ts, body.as_bytes());
                    format!(
                        "POST /webhooks/resend HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
                         svix-id: {id}\r\nsvix-timestamp: {ts}\r\nsvix-signature: {sig}\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .into_bytes()
                })
                .collect()
        })
        .collect();
    // The storage's pace moves with the disk from one minute to the next: measured right
    // before the events and right after, and the two averaged.
    let reference_before = reference_set(redis.port(), connections)?;
    let mut streams = Vec::new();
    for _ in 0..connections {
        let s = tokio::net::TcpStream::connect(&addr).await?;
        s.set_nodelay(true)?;
        streams.push(s);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut workers = tokio::task::JoinSet::new();
    for (requests, stream) in prepared.into_iter().zip(streams) {
        workers.spawn(async move {
            let mut conn = RawHttp { stream, buf: Vec::with_capacity(4096) };
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            for request in requests {
                if Instant::now() >= deadline {
                    break;
                }
                let t = Instant::now();
                let ok = match conn.post(&request).await {
                    Ok(status) => (200..300).contains(&status),
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                };
                latencies.push(t.elapsed());
                errors += u64::from(!ok);
            }
            (latencies, errors)
        });
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    while let Some(done) = workers.join_next().await {
        let (l, e) = done?;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| latencies.get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)));
    let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let _ = Command::new("kill").arg("-TERM").arg(daemon.id().to_string()).status();
    let _ = daemon.wait();
    stop_emulator.trigger();
    let _ = emulator_task.await;
    // What the daemon itself counted as verified (event.lua's hourly tallies).
    let tallies = mailstream::store::scripts::webhook_events_last_24h(&store).await?;
    let verified = tallies.get("delivered").copied().unwrap_or(0);
    let reference = (reference_before + reference_set(redis.port(), connections)?) / 2.0;
    let events_per_second = (latencies.len() as u64 - errors) as f64 / elapsed;
    Ok(Report {
        reference_set_per_second: reference,
        ratio_to_reference: events_per_second / reference.max(1e-9),
        seconds: elapsed,
        connections,
        events: latencies.len() as u64,
        events_per_second,
        p50_ms: ms(at(0.5)),
        p99_ms: ms(at(0.99)),
        max_ms: ms(latencies.last()),
        errors,
        daemon_verified: verified,
    })
}

/// One keep-alive HTTP/1.1 connection that writes a prepared request and reads its whole
/// answer (head, then `content-length` bytes of body).
struct RawHttp {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl RawHttp {
    /// Sends `request`, returns the answer's status code.
    async fn post(&mut self, request: &[u8]) -> anyhow::Result<u16> {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(request).await?;
        self.buf.clear();
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end])?;
                let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).context("a status line")?;
                let length: usize = head
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, v)| v.trim().parse().ok())
                    .context("a content-length")?;
                while self.buf.len() < end + 4 + length {
                    self.read_more().await?;
                }
                anyhow::ensure!(self.buf.len() == end + 4 + length, "one answer per request");
                return Ok(status);
            }
            self.read_more().await?;
        }
    }

    async fn read_more(&mut self) -> anyhow::Result<()> {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the daemon closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

/// `redis-benchmark -c connections -t set` on `port` (append-only, fsync always): SETs/s.
fn reference_set(port: u16, connections: usize) -> anyhow::Result<f64> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-c", &connections.to_string()])
        .args(["-n", "100000", "-t", "set", "--csv"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // --csv: "test","rps",...; the second field of the last line.
    text.lines()
        .last()
        .and_then(|l| l.split(',').nth(1))
        .map(|v| v.trim_matches('"'))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("redis-benchmark printed no rate: {text}"))
}

/// The public listener's URL, from the daemon's log.
async fn wait_for_public(log: &std::path::Path) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // One JSON object per line (the log format off a terminal).
        let listening = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["message"] == "public listening");
        if let Some(line) = listening {
            let addr = line["addr"].as_str().ok_or_else(|| anyhow::anyhow!("no addr in {line}"))?;
            return Ok(format!("http://{addr}/webhooks/resend"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("the daemon did not start listening; see {}", log.display())
}
