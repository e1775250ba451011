//! `mailstream demo`: a full weekly run on the embedded default config, with
//! nothing installed but `redis-server`: a private Redis, the Resend emulator
//! in-process, N subscribers, the kick fired twice (the second adds nothing),
//! and the daemon until every delivery is settled. Then a summary, checked.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::config::{Config, Secret};
use crate::emulator::{Emulator, EmulatorConfig, Stats};
use crate::kick;
use crate::redis_server::{RedisOptions, RedisServer};
use crate::shutdown;
use crate::store::{Counts, Store};
use crate::subscribers::{self, Subscriber};
use crate::{Listeners, RunOptions};

/// What the demo is asked to do.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub subscribers: u64,
    pub rps: u32,
    /// Use this Redis (under a fresh key prefix) instead of a private one.
    pub redis_url: Option<String>,
    pub campaign: String,
    /// Print progress lines while running.
    pub progress: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions { subscribers: 5000, rps: 10, redis_url: None, campaign: "weekly_digest".into(), progress: true }
    }
}

/// The demo's findings (`--json` prints this as its last line).
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub subscribers: u64,
    pub period: String,
    pub enqueued: u64,
    pub duplicates_suppressed: u64,
    pub sent: u64,
    pub failed: u64,
    pub skipped: u64,
    pub outcome_unknown: u64,
    pub not_settled: u64,
    pub kick_seconds: f64,
    pub elapsed_seconds: f64,
    pub emails_per_second: f64,
    pub ceiling_emails_per_second: f64,
    pub provider: Stats,
}

impl DemoReport {
    /// Problems that make the run a failure (each one line).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.not_settled > 0 {
            p.push(format!("{} deliveries were not settled", self.not_settled));
        }
        if self.provider.duplicate_sends > 0 {
            p.push(format!("{} emails were sent twice", self.provider.duplicate_sends));
        }
        if self.provider.emails_accepted != self.sent {
            p.push(format!(
                "the provider accepted {} emails but {} deliveries are recorded as sent",
                self.provider.emails_accepted, self.sent
            ));
        }
        if self.duplicates_suppressed != self.enqueued {
            p.push(format!(
                "the second kick should have found all {} deliveries already enqueued, found {}",
                self.enqueued, self.duplicates_suppressed
            ));
        }
        p
    }
}

/// Runs the demo, writing progress and the summary to `out`.
pub async fn run(opts: &DemoOptions, out: &mut (dyn Write + Send)) -> anyhow::Result<DemoReport> {
    let mut config = Config::example();
    // Kept until the end of the run: dropping it stops the private Redis.
    let mut _private_redis = None;
    match &opts.redis_url {
        Some(url) => {
            config.redis.url = Secret::new(url.clone());
            config.redis.prefix = format!("mailstream-demo-{}", crate::id::new_id().to_ascii_lowercase());
            // Someone else's Redis, for a demo: run on it whatever its persistence.
            config.redis.durability = crate::config::Durability::Relaxed;
        }
        None => {
            // Durable as production should be: append-only, fsync on every write.
            let server = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
            config.redis.url = Secret::new(server.url());
            _private_redis = Some(server);
        }
    }

    let emulator = Emulator::new(EmulatorConfig { requests_per_second: Some(opts.rps), ..Default::default() });
    let (emulator_url, stop_emulator, emulator_task) = emulator.spawn_local().await.context("starting the emulator")?;

    config.resend.base_url = emulator_url.clone();
    config.resend.api_key = Some(Secret::new("re_demo_key"));
    config.resend.requests_per_second = opts.rps;
    config.http.metrics_listen = None;
    config.validate()?;
    let campaign = config
        .campaign(&opts.campaign)
        .with_context(|| format!("no campaign {:?} in the embedded config", opts.campaign))?
        .clone();

    let store = Store::open(&config).await?;
    let period = kick::period_for(&store, &config, &campaign, None, kick::PeriodRule::NearNow).await?;
    writeln!(
        out,
        "mailstream demo: {} subscribers, campaign {} period {}, {} requests/s x {} emails per batch",
        opts.subscribers, campaign.name, period, opts.rps, config.resend.batch_size
    )?;
    writeln!(out, "  redis {}   resend emulator {emulator_url}", config.redis.url.redacted_url())?;

    let subscribers: Vec<Subscriber> = (0..opts.subscribers).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subscribers).await?;
    drop(subscribers);

    let kicked = Instant::now();
    let first = kick::kick_registry(&store, &config, &campaign.name, &period).await?;
    let kick_seconds = kicked.elapsed().as_secs_f64();
    writeln!(out, "  kick 1: {} new, {} duplicates ({kick_seconds:.2} s)", first.new, first.duplicates)?;
    let second = kick::kick_registry(&store, &config, &campaign.name, &period).await?;
    writeln!(out, "  kick 2: {} new, {} duplicates", second.new, second.duplicates)?;

    let (stop, down) = shutdown::channel();
    let started = Instant::now();
    let daemon = tokio::spawn(crate::run_with(
        config.clone(),
        Listeners::default(),
        down,
        RunOptions { metrics: Some(Arc::new(crate::metrics::Metrics::new())), ..Default::default() },
    ));

    let ceiling = f64::from(opts.rps) * config.resend.batch_size as f64;
    let expected = first.new as f64 / ceiling;
    let deadline = Duration::from_secs_f64(expected * 3.0 + 60.0);
    let mut last_print = Instant::now();
    let mut counts;
    loop {
        counts = store.counts(&campaign.name, &period).await?;
        if counts.settled() >= counts.enqueued || started.elapsed() > deadline || daemon.is_finished() {
            break;
        }
        if opts.progress && last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            progress(out, started, &counts, &emulator.stats())?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.trigger();
    match daemon.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.context("the daemon stopped")),
        Err(e) => return Err(anyhow::anyhow!("the daemon panicked: {e}")),
    }
    stop_emulator.trigger();
    let _ = emulator_task.await;
    let counts = store.counts(&campaign.name, &period).await.unwrap_or(counts);
    if opts.redis_url.is_some() {
        // Someone else's Redis: take the demo's keys (addresses included) away again.
        let removed = store.delete_all().await?;
        writeln!(out, "  removed the demo's {removed} keys (prefix {}) from that Redis", config.redis.prefix)?;
    }

    let report = DemoReport {
        subscribers: opts.subscribers,
        period,
        enqueued: counts.enqueued,
        duplicates_suppressed: second.duplicates,
        sent: counts.sent,
        failed: counts.failed,
        skipped: counts.skipped,
        outcome_unknown: counts.outcome_unknown,
        not_settled: counts.enqueued.saturating_sub(counts.settled()),
        kick_seconds,
        elapsed_seconds: elapsed,
        // Sent only: a skipped delivery costs the provider nothing and is not throughput.
        emails_per_second: counts.sent as f64 / elapsed.max(1e-9),
        ceiling_emails_per_second: ceiling,
        provider: emulator.stats(),
    };
    summary(out, &report)?;
    Ok(report)
}

fn progress(out: &mut (dyn Write + Send), started: Instant, c: &Counts, s: &Stats) -> std::io::Result<()> {
    let t = started.elapsed().as_secs_f64();
    writeln!(
        out,
        "  [{t:5.1}s] sent {}/{}  failed {}  skipped {}  {:.0} emails/s  provider: {} requests, {} rate-limited",
        c.sent,
        c.enqueued,
        c.failed,
        c.skipped,
        c.sent as f64 / t.max(1e-9),
        s.requests,
        s.rate_limited
    )
}

fn summary(out: &mut (dyn Write + Send), r: &DemoReport) -> std::io::Result<()> {
    writeln!(out, "done in {:.2} s", r.elapsed_seconds)?;
    writeln!(
        out,
        "  deliveries: {} enqueued, {} duplicates suppressed, {} sent, {} failed, {} skipped, {} outcome unknown, {} not settled",
        r.enqueued, r.duplicates_suppressed, r.sent, r.failed, r.skipped, r.outcome_unknown, r.not_settled
    )?;
    writeln!(
        out,
        "  throughput: {:.0} emails/s of a {:.0} emails/s ceiling ({:.1}%)",
        r.emails_per_second,
        r.ceiling_emails_per_second,
        100.0 * r.emails_per_second / r.ceiling_emails_per_second
    )?;
    let p = &r.provider;
    writeln!(
        out,
        "  provider: {} requests, {} emails accepted, {} duplicate sends, {} rate-limited, at most {} requests in any second",
        p.requests, p.emails_accepted, p.duplicate_sends, p.rate_limited, p.max_requests_in_1s
    )?;
    let problems = r.problems();
    if problems.is_empty() {
        writeln!(out, "  every delivery was settled, and none was sent twice")?;
    }
    for problem in problems {
        writeln!(out, "  PROBLEM: {problem}")?;
    }
    Ok(())
}
