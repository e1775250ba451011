//! `mailstream demo`: a full weekly run on the embedded default config, with
//! nothing installed but `redis-server`: a private Redis, the Resend emulator
//! in-process, N subscribers, the kick fired twice (the second adds nothing), or
//! with `--scheduled` fired by the daemon's scheduler a minute ahead, and the
//! daemon until every delivery is settled. Then a summary, checked. With
//! `--channels email,app` the campaign goes out on each channel (`channels.rs`).
//!
//! Raw Redis here: the demo's read-only look at its kick's fan-out record, to show it.

pub(crate) mod channels;
mod world;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Datelike, Timelike};
use serde::Serialize;

use crate::audience::kick;
use crate::audience::subscribers::{self, Subscriber};
use crate::config::Config;
use crate::shutdown;
use crate::store::{Counts, Store};
use crate::tools::emulator::Stats;
use crate::{Listeners, RunOptions};
use world::World;

/// What the demo is asked to do.
#[derive(Debug, Clone)]
pub(crate) struct DemoOptions {
    pub subscribers: u64,
    pub rps: u32,
    /// Use this Redis (under a fresh key prefix) instead of a private one.
    pub redis_url: Option<String>,
    pub campaign: String,
    /// Print progress lines while running.
    pub progress: bool,
    /// Leave the kick to the daemon's scheduler: the campaign is scheduled for the
    /// next minute (at least 15 s away) and the demo waits for the fire.
    pub scheduled: bool,
    /// `--channels`: the campaign's channels, and a report per channel (`None`: the
    /// campaign as configured, email, and no per-channel report).
    pub channels: Option<Vec<crate::model::work::Channel>>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            subscribers: 5000,
            rps: 10,
            redis_url: None,
            campaign: "weekly_digest".into(),
            progress: true,
            scheduled: false,
            channels: None,
        }
    }
}

/// The demo's findings (what `--json` prints).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DemoReport {
    pub subscribers: u64,
    pub period: String,
    pub enqueued: u64,
    /// Offers of an already enqueued delivery by the second kick (none with `--scheduled`).
    pub duplicates_suppressed: u64,
    /// The kick was fired by the daemon's scheduler: the runs of the period's fan-out.
    pub scheduled_fanouts: Option<u64>,
    pub sent: u64,
    pub failed: u64,
    pub skipped: u64,
    pub outcome_unknown: u64,
    pub not_settled: u64,
    pub kick_seconds: f64,
    pub elapsed_seconds: f64,
    /// Until the last email was settled: with other channels the run goes on after it.
    pub email_seconds: f64,
    pub emails_per_second: f64,
    pub ceiling_emails_per_second: f64,
    pub provider: Stats,
    /// The webhooks the daemon's public listener took.
    pub webhooks: WebhookTally,
    /// Addresses suppressed by those webhooks, by reason.
    pub suppressed: BTreeMap<String, u64>,
    /// Receipts sent through the transactional lane while the digest drained.
    pub transactional: Transactional,
    /// With `--channels`: what each channel came to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<BTreeMap<String, channels::ChannelReport>>,
}

/// The transactional sends of the run and how long each took from enqueue to the
/// provider's acceptance (settled), on Redis's clock.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Transactional {
    pub enqueued: u64,
    pub sent: u64,
    pub p50_latency_ms: u64,
    pub p99_latency_ms: u64,
    pub max_latency_ms: u64,
}

/// Receipts the demo sends while the digest drains.
const TRANSACTIONAL_SENDS: u64 = 20;

/// Webhook requests, as the daemon counted them.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct WebhookTally {
    pub received: u64,
    pub verified: u64,
    pub rejected: u64,
    pub duplicates: u64,
}

/// Every `BOUNCES_EVERY`-th subscriber's address bounces, every `COMPLAINS_EVERY`-th complains.
const BOUNCES_EVERY: u64 = 97;
const COMPLAINS_EVERY: u64 = 251;

/// A made-up subscriber; a few have Resend's test addresses that bounce or complain.
fn demo_subscriber(i: u64) -> Subscriber {
    let mut s = Subscriber::synthetic(i);
    if i % BOUNCES_EVERY == BOUNCES_EVERY - 1 {
        s.email = format!("bounced+{}@resend.dev", s.id);
    } else if i % COMPLAINS_EVERY == COMPLAINS_EVERY - 1 {
        s.email = format!("complained+{}@resend.dev", s.id);
    }
    s
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
        if self.provider.emails_accepted != self.sent + self.transactional.sent {
            p.push(format!(
                "the provider accepted {} emails but {} deliveries are recorded as sent",
                self.provider.emails_accepted,
                self.sent + self.transactional.sent
            ));
        }
        if self.transactional.sent != self.transactional.enqueued {
            p.push(format!(
                "{} of {} transactional sends were sent",
                self.transactional.sent, self.transactional.enqueued
            ));
        }
        if self.webhooks.rejected > 0 {
            p.push(format!("{} webhook requests were rejected", self.webhooks.rejected));
        }
        if let Some(runs) = self.scheduled_fanouts.filter(|&runs| runs != 1) {
            p.push(format!("the scheduled period was fanned out {runs} times, not once"));
        }
        // Every channel's deliveries are offered again by the second kick.
        let enqueued = self.channels.as_ref().map_or(self.enqueued, |c| c.values().map(|r| r.enqueued).sum());
        if self.scheduled_fanouts.is_none() && self.duplicates_suppressed != enqueued {
            p.push(format!(
                "the second kick should have found all {} deliveries already enqueued, found {}",
                enqueued, self.duplicates_suppressed
            ));
        }
        p.extend(self.channels.as_ref().map(channels::problems).unwrap_or_default());
        p
    }
}

/// Runs the demo, writing progress and the summary to `out`.
pub(crate) async fn run(opts: &DemoOptions, out: &mut (dyn Write + Send)) -> anyhow::Result<DemoReport> {
    let mut world = World::new(opts).await?;
    let store = Store::open(&world.config).await?;
    let campaign = world.campaign.clone();
    let period = kick::period_for(&store, &campaign, None, kick::PeriodRule::NearNow).await?;
    writeln!(
        out,
        "mailstream demo: {} subscribers, campaign {} period {}, {} requests/s x {} emails per batch",
        opts.subscribers, campaign.name, period, opts.rps, world.config.resend.batch_size
    )?;
    writeln!(out, "  redis {}   resend emulator {}", world.config.redis.url.redacted_url(), world.emulator_url)?;

    // A few are Resend's test addresses that bounce or complain: their webhooks suppress them.
    let subscribers: Vec<Subscriber> = (0..opts.subscribers).map(demo_subscriber).collect();
    subscribers::upsert(&store, &subscribers).await?;
    let push_registered = world.ends.subscribe(&store, subscribers.iter().map(|s| s.id.clone())).await?;
    drop(subscribers);

    let (stop, down) = shutdown::channel();
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let public = world.public.take().expect("bound once");
    let start = |config: Config| {
        let options = RunOptions { metrics: Some(metrics.clone()), ..Default::default() };
        tokio::spawn(crate::run_with(config, Listeners { metrics: None, public: Some(public) }, down, options))
    };
    let kicked = if opts.scheduled {
        scheduled_kick(out, &store, &mut world.config, &campaign, &period, start).await?
    } else {
        let kicked = Instant::now();
        let first = kick::kick_registry(&store, &world.config, &campaign.name, &period).await?;
        let kick_seconds = kicked.elapsed().as_secs_f64();
        writeln!(out, "  kick 1: {} new, {} duplicates ({kick_seconds:.2} s)", first.new, first.duplicates)?;
        let second = kick::kick_registry(&store, &world.config, &campaign.name, &period).await?;
        writeln!(out, "  kick 2: {} new, {} duplicates", second.new, second.duplicates)?;
        let daemon = start(world.config.clone());
        Kicked { first, second, kick_seconds, started: Instant::now(), daemon, scheduled_fanouts: None }
    };
    let drove = drive(opts, out, &store, &world, &period, &kicked).await?;
    // The webhooks about the last batches are still on their way: wait for them.
    let expected_events = drove.counts.sent + opts.subscribers.div_ceil(COMPLAINS_EVERY);
    let webhooks_due = Instant::now() + Duration::from_secs(20);
    while Instant::now() < webhooks_due {
        let s = world.emulator.stats();
        if s.webhooks_delivered + s.webhooks_failed >= expected_events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.trigger();
    match kicked.daemon.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.context("the daemon stopped")),
        Err(e) => return Err(anyhow::anyhow!("the daemon panicked: {e}")),
    }
    let ceiling = world.ceiling();
    world.stop_emulator.trigger();
    let _ = world.emulator_task.await;
    let (app_end, push_service) =
        (world.ends.app.as_ref().map(|a| a.server.clone()), world.ends.push.as_ref().map(|p| p.server.clone()));
    world.ends.stop().await;
    let app_stats = app_end.map(|a| a.stats());
    let push_run = push_service.map(|p| channels::PushRun { registered: push_registered, stats: p.stats() });
    let counts = store.counts(&campaign.name, &period).await.unwrap_or(drove.counts);
    let by_channel = match &opts.channels {
        Some(list) => {
            let at = (campaign.name.as_str(), period.as_str());
            let stats = world.emulator.stats();
            Some(channels::report(&store, at, list, &stats, app_stats.as_ref(), push_run.as_ref()).await?)
        }
        None => None,
    };
    let transactional = transactional_latencies(&store, &drove.tx_day, &drove.posted).await?;
    if opts.redis_url.is_some() {
        // Someone else's Redis: take the demo's keys (addresses included) away again.
        let removed = store.delete_all().await?;
        writeln!(out, "  removed the demo's {removed} keys (prefix {}) from that Redis", world.config.redis.prefix)?;
    }

    let report = DemoReport {
        subscribers: opts.subscribers,
        period,
        enqueued: counts.enqueued,
        duplicates_suppressed: kicked.second.duplicates,
        scheduled_fanouts: kicked.scheduled_fanouts,
        sent: counts.sent,
        failed: counts.failed,
        skipped: counts.skipped,
        outcome_unknown: counts.outcome_unknown,
        not_settled: counts.enqueued.saturating_sub(counts.settled()),
        kick_seconds: kicked.kick_seconds,
        elapsed_seconds: drove.elapsed,
        email_seconds: drove.email_seconds,
        // Sent only: a skipped delivery costs the provider nothing and is not throughput.
        emails_per_second: counts.sent as f64 / drove.email_seconds.max(1e-9),
        ceiling_emails_per_second: ceiling,
        provider: world.emulator.stats(),
        webhooks: {
            let w = |result| metrics.webhook_requests(result);
            let (verified, duplicates, rejected, invalid) =
                (w("verified"), w("duplicate"), w("rejected"), w("invalid"));
            WebhookTally { received: verified + duplicates + rejected + invalid, verified, rejected, duplicates }
        },
        suppressed: metrics.suppressions_by_reason(),
        transactional,
        channels: by_channel,
    };
    summary(out, &report)?;
    Ok(report)
}

/// How the campaign period was kicked, and the daemon sending it.
struct Kicked {
    first: kick::KickReport,
    second: kick::KickReport,
    kick_seconds: f64,
    /// When sending began (the daemon started, or the scheduler fired).
    started: Instant,
    daemon: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// With `--scheduled`: how many runs the scheduler's fan-out took.
    scheduled_fanouts: Option<u64>,
}

/// Schedules the campaign at the next whole minute at least 15 s away, starts the
/// daemon (`start`) and waits for its scheduler's fan-out to be done.
async fn scheduled_kick(
    out: &mut (dyn Write + Send),
    store: &Store,
    config: &mut Config,
    campaign: &crate::config::CampaignConfig,
    period: &str,
    start: impl FnOnce(Config) -> tokio::task::JoinHandle<anyhow::Result<()>>,
) -> anyhow::Result<Kicked> {
    // The next whole minute at least 15 s away, as a daily cron in the campaign's zone.
    let now = store.time().await?;
    let mut fire = now + chrono::Duration::seconds(75);
    fire = fire
        - chrono::Duration::seconds(i64::from(fire.second()))
        - chrono::Duration::nanoseconds(fire.nanosecond().into());
    let local = fire.with_timezone(&campaign.tz());
    // Yearly (this date), so its previous fire is a year back, beyond the retention.
    let cron = format!("{} {} {} {} *", local.minute(), local.hour(), local.day(), local.month());
    for c in config.campaigns.iter_mut().filter(|c| c.name == campaign.name) {
        c.schedule = Some(cron.clone());
    }
    writeln!(
        out,
        "  schedule \"{cron}\" ({}): the daemon's scheduler fires at {} ({} UTC); waiting",
        campaign.time_zone,
        local.format("%H:%M:%S %Z"),
        fire.format("%H:%M:%S")
    )?;
    let daemon = start(config.clone());
    let fanout = store.keys.fanout(&campaign.name, period);
    let mut conn = store.conn().await?;
    let waited = Instant::now();
    loop {
        let state: Option<String> = redis::cmd("HGET").arg(&fanout).arg("state").query_async(&mut conn).await?;
        if state.as_deref() == Some("done") || daemon.is_finished() || waited.elapsed() > Duration::from_secs(150) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let record: BTreeMap<String, String> = redis::cmd("HGETALL").arg(&fanout).query_async(&mut conn).await?;
    let field = |f: &str| record.get(f).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let took = field("done_ms").saturating_sub(field("started_ms"));
    let started_at = chrono::DateTime::from_timestamp_millis(field("started_ms") as i64).unwrap_or_default();
    writeln!(
        out,
        "  the scheduler fired at {} UTC: {} new in {took} ms (fan-out record: state {}, runs {})",
        started_at.format("%H:%M:%S%.3f"),
        field("new"),
        record.get("state").map_or("-", String::as_str),
        field("runs")
    )?;
    Ok(Kicked {
        first: kick::KickReport { new: field("new"), ..Default::default() },
        second: kick::KickReport::default(),
        kick_seconds: took as f64 / 1000.0,
        started: Instant::now(),
        daemon,
        scheduled_fanouts: Some(field("runs")),
    })
}

/// What sending the period came to, once every delivery settled (or the deadline passed).
struct Drove {
    counts: Counts,
    /// The day the receipts were enqueued under, and each receipt's key and when it was posted.
    tx_day: String,
    posted: Vec<(String, i64)>,
    elapsed: f64,
    email_seconds: f64,
}

/// Watches the daemon send the period, posting receipts through the transactional lane
/// spread over the digest's expected run, until everything is settled.
async fn drive(
    opts: &DemoOptions,
    out: &mut (dyn Write + Send),
    store: &Store,
    world: &World,
    period: &str,
    kicked: &Kicked,
) -> anyhow::Result<Drove> {
    let (config, campaign, started) = (&world.config, &world.campaign.name, kicked.started);
    let tx_day = store.time().await?.format("%Y-%m-%d").to_string();
    let expected = kicked.first.new as f64 / world.ceiling();
    let deadline = Duration::from_secs_f64(expected * 3.0 + 60.0);
    let mut last_print = Instant::now();
    let mut counts;
    // Receipts through the transactional lane, spread over the digest's expected run.
    let every = Duration::from_secs_f64((expected / (TRANSACTIONAL_SENDS + 2) as f64).max(0.05));
    let mut receipts = 0u64;
    let mut posted: Vec<(String, i64)> = Vec::new();
    let mut email_done: Option<f64> = None;
    loop {
        counts = store.counts(campaign, period).await?;
        let email_settled = counts.settled() >= counts.enqueued;
        if email_settled && email_done.is_none() {
            email_done = Some(started.elapsed().as_secs_f64());
        }
        let digest_done = email_settled && channels::others_settled(store, campaign, period, &world.channels).await?;
        if receipts < TRANSACTIONAL_SENDS && !digest_done && started.elapsed() >= every * (receipts as u32 + 1) {
            let item = serde_json::json!({
                "idempotency_key": format!("demo-receipt-{receipts}"),
                "to": format!("delivered+receipt-{receipts}@resend.dev"),
                "subject": "Your receipt",
                "text": "Thank you for your order.",
            });
            posted.push((format!("demo-receipt-{receipts}"), store.time().await?.timestamp_millis()));
            crate::audience::ingest::enqueue(store, config, vec![item]).await?;
            receipts += 1;
        }
        // The receipts' counts matter only once the digest is done.
        let all_done =
            digest_done && store.counts(crate::model::work::TRANSACTIONAL, &tx_day).await?.settled() >= receipts;
        if all_done || started.elapsed() > deadline || kicked.daemon.is_finished() {
            break;
        }
        if opts.progress && last_print.elapsed() >= Duration::from_secs(1) {
            last_print = Instant::now();
            progress(out, started, email_done, &counts, &world.emulator.stats())?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(Drove { counts, tx_day, posted, elapsed, email_seconds: email_done.unwrap_or(elapsed) })
}

/// Transactional sends to inline addresses enqueued on `day` under these keys, each with
/// when it was posted (Redis-clock ms, read just before): how many were sent, and their
/// post → accepted latencies (to when each settled, as the delivery log reads it).
pub async fn transactional_latencies(
    store: &Store,
    day: &str,
    posted: &[(String, i64)],
) -> anyhow::Result<Transactional> {
    let mut latencies = Vec::new();
    for (k, from) in posted {
        let d = crate::model::work::DeliveryRef::new(crate::model::work::TRANSACTIONAL, day, "-", k);
        let Some(found) = crate::ops::deliveries::get(store, &d.id()).await? else { continue };
        let to = found.fields.get("settled_ms").and_then(|ms| ms.parse::<i64>().ok());
        if let (true, Some(to)) = (found.row.status == "sent", to) {
            latencies.push(to.saturating_sub(*from).max(0) as u64);
        }
    }
    latencies.sort_unstable();
    let at = |q: f64| latencies.get(((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied();
    Ok(Transactional {
        enqueued: posted.len() as u64,
        sent: latencies.len() as u64,
        p50_latency_ms: at(0.5).unwrap_or(0),
        p99_latency_ms: at(0.99).unwrap_or(0),
        max_latency_ms: latencies.last().copied().unwrap_or(0),
    })
}

/// A progress line; once the email is settled (`email_done`, seconds), its rate stays
/// what it was then while the other channels finish.
fn progress(
    out: &mut (dyn Write + Send),
    started: Instant,
    email_done: Option<f64>,
    c: &Counts,
    s: &Stats,
) -> std::io::Result<()> {
    let t = started.elapsed().as_secs_f64();
    let rate = c.sent as f64 / email_done.unwrap_or(t).max(1e-9);
    let after = if email_done.is_some() { "  (email settled; the other channels finish)" } else { "" };
    writeln!(
        out,
        "  [{t:5.1}s] sent {}/{}  failed {}  skipped {}  {rate:.0} emails/s  provider: {} requests, {} rate-limited{after}",
        c.sent, c.enqueued, c.failed, c.skipped, s.requests, s.rate_limited
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
        "  throughput: {:.0} emails/s of a {:.0} emails/s ceiling ({:.1}%), the email settled in {:.2} s",
        r.emails_per_second,
        r.ceiling_emails_per_second,
        100.0 * r.emails_per_second / r.ceiling_emails_per_second,
        r.email_seconds
    )?;
    let p = &r.provider;
    writeln!(
        out,
        "  provider: {} requests, {} emails accepted, {} duplicate sends, {} rate-limited, at most {} requests in any second",
        p.requests, p.emails_accepted, p.duplicate_sends, p.rate_limited, p.max_requests_in_1s
    )?;
    let t = &r.transactional;
    writeln!(
        out,
        "  transactional: {} receipts sent during the digest of {} enqueued; enqueue to accepted p50 {} ms, p99 {} ms, max {} ms",
        t.sent, t.enqueued, t.p50_latency_ms, t.p99_latency_ms, t.max_latency_ms
    )?;
    let w = &r.webhooks;
    let suppressed: Vec<String> = r.suppressed.iter().map(|(why, n)| format!("{n} {why}")).collect();
    writeln!(
        out,
        "  webhooks: {} received, {} verified, {} rejected, {} duplicates; suppressed: {}",
        w.received,
        w.verified,
        w.rejected,
        w.duplicates,
        if suppressed.is_empty() { "none".to_string() } else { suppressed.join(", ") }
    )?;
    if let Some(c) = &r.channels {
        channels::summary(out, c)?;
    }
    let problems = r.problems();
    if problems.is_empty() {
        writeln!(out, "  every delivery was settled, and none was sent twice")?;
    }
    for problem in problems {
        writeln!(out, "  PROBLEM: {problem}")?;
    }
    Ok(())
}
