//! A channel that is down must delay no email (`bench/channels --app-outage-seconds S`,
//! `bench/chaos --push-outage-seconds S`; `[--subscribers N] [--rps R] [--json]`). Two
//! runs of the weekly digest on one Redis (`appendfsync always`), each with its own
//! emulator at R requests/s and the daemon in-process: email alone, then email and the
//! other channel with its far end (the application endpoint, or the push service with a
//! browser subscription per subscriber) answering 503 for the first S seconds of the run
//! (every delivery of it is put off and asked again meanwhile). Each run's email
//! throughput is measured from the first email sent to the last, as a ratio to the
//! provider's ceiling; then the second run waits for every delivery of the other
//! channel. Exits non-zero when the two ratios differ by more than 0.02, anything was
//! sent twice, or anything was left unsettled.
//!
//! `--push-slow-ms MS` runs the push service slow instead of down: every answer held back
//! MS after its request, for as long as the email is going (then at once, so the rest of
//! the push deliveries settle). With the default push concurrency and `--pool-size 12`,
//! the email must keep at least 0.9 of its pace alone (`email_kept`): a sender that held a
//! pooled Redis connection while it waited would starve it.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{AppChannelConfig, Config, PushChannelConfig, Secret};
use mailstream::model::webpush::VapidKey;
use mailstream::model::work::Channel;
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::store::{Counts, Store};
use mailstream::tools::emulator::app::AppEndpoint;
use mailstream::tools::emulator::push::PushService;
use mailstream::tools::emulator::{Emulator, EmulatorConfig};
use serde::Serialize;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub struct Options {
    pub subscribers: u64,
    pub outage_seconds: u64,
    pub rps: u32,
    /// The channel beside email (`App` or `Push`).
    pub channel: Channel,
    /// Push only: each answer held back this long (ms) while the email goes (0: none).
    pub slow_ms: u64,
    /// `redis.pool_size` of both runs (`None`: the shipped one).
    pub pool_size: Option<usize>,
}

/// The far end of the channel beside email, and how the daemon reaches it.
enum Far {
    App(AppEndpoint, String),
    /// The push service, and the VAPID key pair (private, public).
    Push(PushService, String, String),
}

impl Far {
    fn set_down(&self, down: bool) {
        match self {
            Far::App(a, _) => a.set_down(down),
            Far::Push(p, ..) => p.set_down(down),
        }
    }

    fn set_slow(&self, ms: u64) {
        if let Far::Push(p, ..) = self {
            p.set_slow(ms);
        }
    }

    /// (sent twice, refused while down, refused as forged or malformed, what it saw).
    fn stats(&self) -> (u64, u64, u64, serde_json::Value) {
        match self {
            Far::App(a, _) => {
                let s = a.stats();
                (s.duplicates, s.refused_while_down, s.rejected, serde_json::to_value(s).expect("json"))
            }
            Far::Push(p, ..) => {
                let s = p.stats();
                (s.duplicates, s.refused_while_down, s.rejected + s.malformed, serde_json::to_value(s).expect("json"))
            }
        }
    }
}

/// One run's email figures.
#[derive(Debug, Clone, Serialize)]
struct EmailRun {
    sent: u64,
    failed: u64,
    /// First email sent to the last.
    seconds: f64,
    emails_per_second: f64,
    ratio: f64,
    duplicate_sends: u64,
}

/// The other channel in the second run.
#[derive(Debug, Clone, Serialize)]
struct OtherRun {
    sent: u64,
    failed: u64,
    skipped: u64,
    not_settled: u64,
    /// From the far end coming back to the last delivery settled.
    seconds_after_outage: f64,
    /// Sent twice: an event id taken twice, or a notification tag shown twice.
    duplicates: u64,
    refused_while_down: u64,
    /// Requests the far end refused as forged or malformed.
    refused_as_bad: u64,
    /// What the far end saw.
    far_end: serde_json::Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    subscribers: u64,
    rps: u32,
    ceiling_emails_per_second: f64,
    channel: Channel,
    outage_seconds: u64,
    /// Push answers held back this long while the email went (ms).
    slow_ms: u64,
    pool_size: usize,
    email_only: EmailRun,
    with_outage: EmailRun,
    /// with_outage.ratio - email_only.ratio.
    ratio_difference: f64,
    /// with_outage.ratio / email_only.ratio: the share of its pace the email kept.
    email_kept: f64,
    other: OtherRun,
}

impl Report {
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let channel = self.channel;
        if self.slow_ms > 0 {
            if self.email_kept < 0.9 {
                p.push(format!("the email kept {:.3} of its pace with {channel} slow", self.email_kept));
            }
        } else if self.ratio_difference.abs() > 0.02 {
            p.push(format!("the email throughput ratio moved by {:.3} with {channel} down", self.ratio_difference));
        }
        for (name, run) in [("email only", &self.email_only), ("with the other channel down", &self.with_outage)] {
            if run.sent != self.subscribers || run.failed > 0 || run.duplicate_sends > 0 {
                p.push(format!("{name}: {} sent, {} failed, {} sent twice", run.sent, run.failed, run.duplicate_sends));
            }
        }
        let a = &self.other;
        if a.sent != self.subscribers || a.not_settled > 0 || a.duplicates > 0 || a.refused_as_bad > 0 {
            p.push(format!(
                "{channel}: {} sent, {} not settled, {} sent twice, {} refused as forged or malformed",
                a.sent, a.not_settled, a.duplicates, a.refused_as_bad
            ));
        }
        if self.outage_seconds > 0 && a.refused_while_down == 0 {
            p.push(format!("{channel}'s outage refused nothing: the run did not show what it is for"));
        }
        p
    }

    /// The one line without `--json`.
    pub fn line(&self) -> String {
        if self.slow_ms > 0 {
            return format!(
                "email alone {:.3} of the ceiling, with {} answering in {} ms (pool {}) {:.3}: {:.3} kept; {}: {} sent, {} sent twice",
                self.email_only.ratio,
                self.channel,
                self.slow_ms,
                self.pool_size,
                self.with_outage.ratio,
                self.email_kept,
                self.channel,
                self.other.sent,
                self.other.duplicates
            );
        }
        format!(
            "email alone {:.3} of the ceiling, with {} down {} s {:.3} (difference {:+.3}); {}: {} sent, {} sent twice",
            self.email_only.ratio,
            self.channel,
            self.outage_seconds,
            self.with_outage.ratio,
            self.ratio_difference,
            self.channel,
            self.other.sent,
            self.other.duplicates
        )
    }
}

/// Polls until `done` holds, or `within` passes.
async fn until<F, Fut>(within: Duration, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + within;
    while !done().await? {
        anyhow::ensure!(Instant::now() < deadline, "not done within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One run: its own prefix, emulator and (with `far`) the other channel's far end.
async fn run(
    opts: &Options,
    redis: &RedisServer,
    name: &str,
    far: Option<&Far>,
) -> anyhow::Result<(EmailRun, Option<OtherRun>)> {
    let emulator = Emulator::new(EmulatorConfig { requests_per_second: Some(opts.rps), ..Default::default() });
    let (emulator_url, stop_emulator, _) = emulator.spawn_local().await?;
    let mut config = Config::example();
    config.redis.url = Secret::new(redis.url());
    config.redis.prefix = format!("bench-channels-{name}");
    config.resend.base_url = emulator_url;
    config.resend.api_key = Some(Secret::new("re_bench_channels"));
    config.resend.requests_per_second = opts.rps;
    config.http.metrics_listen = None;
    if let Some(n) = opts.pool_size {
        config.redis.pool_size = n;
    }
    config.unsubscribe.secrets = vec![Secret::new("an-unsubscribe-secret-of-16+")];
    for c in &mut config.campaigns {
        c.schedule = None;
        if far.is_some() {
            c.channels = vec![Channel::Email, opts.channel];
        }
    }
    match far {
        Some(Far::App(_, url)) => {
            config.channels.app = Some(AppChannelConfig {
                url: url.to_string(),
                timeout_ms: 5000,
                concurrency: 16,
                secret_file: None,
                secret: Some(Secret::new(SECRET)),
            })
        }
        Some(Far::Push(service, private, _)) => {
            config.channels.push = Some(PushChannelConfig {
                allowed_hosts: Some(vec![service.allowed_host()]),
                ttl_seconds: 3600,
                requests_per_second_per_service: 100_000,
                ..PushChannelConfig::new("mailto:ops@example.com", Secret::new(private.clone()))
            })
        }
        None => {}
    }
    config.validate()?;
    let store = Store::connect(&config).await?;
    let subs: Vec<Subscriber> = (0..opts.subscribers).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subs).await?;
    if let Some(Far::Push(service, _, public)) = far {
        let items: Vec<_> = subs
            .iter()
            .map(|s| {
                (
                    s.id.clone(),
                    mailstream::audience::subscribers::push::Subscription::from_value(service.subscribe(public))
                        .expect("well-formed"),
                )
            })
            .collect();
        mailstream::audience::subscribers::push::add_many(&store, &items).await?;
    }
    let campaign = config.campaigns[0].name.clone();
    let period = mailstream::audience::kick::period_for(&store, &config.campaigns[0], None, Default::default()).await?;
    mailstream::audience::kick::kick_registry(&store, &config, &campaign, &period).await?;

    let (stop, down) = mailstream::shutdown::channel();
    let daemon = tokio::spawn(mailstream::run_with(config.clone(), Default::default(), down, Default::default()));
    let started = Instant::now();
    if let Some(far) = far {
        far.set_down(opts.outage_seconds > 0);
        far.set_slow(opts.slow_ms);
    }
    let outage = Duration::from_secs(opts.outage_seconds);
    let counts = |channel| {
        let (store, campaign, period) = (store.clone(), campaign.clone(), period.clone());
        async move { store.channel_counts(&campaign, &period, channel).await }
    };
    let expected = opts.subscribers as f64 / (f64::from(opts.rps) * 100.0);
    let within = Duration::from_secs_f64(expected * 3.0 + 120.0);
    let mut first: Option<Instant> = None;
    let deadline = Instant::now() + within;
    loop {
        if let Some(far) = far.filter(|_| started.elapsed() >= outage) {
            far.set_down(false);
        }
        let c: Counts = counts(Channel::Email).await?;
        if c.sent > 0 && first.is_none() {
            first = Some(Instant::now());
        }
        if c.settled() >= c.enqueued && c.enqueued > 0 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the emails were not settled within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    // The slow spell lasts as long as the email: the rest of the other channel goes at once.
    if let Some(far) = far {
        far.set_slow(0);
    }
    let email = counts(Channel::Email).await?;
    let ceiling = f64::from(opts.rps) * 100.0;
    let emails_per_second = email.sent as f64 / seconds.max(1e-9);
    let email_run = EmailRun {
        sent: email.sent,
        failed: email.failed,
        seconds,
        emails_per_second,
        ratio: emails_per_second / ceiling,
        duplicate_sends: emulator.stats().duplicate_sends,
    };
    let other_run = match far {
        None => None,
        Some(far) => {
            let outage_ends = started + outage;
            let within = Duration::from_secs(opts.outage_seconds + 600);
            let settled = until(within, || async {
                if started.elapsed() >= outage {
                    far.set_down(false);
                }
                let c = counts(opts.channel).await?;
                Ok(c.settled() >= c.enqueued && c.enqueued > 0)
            })
            .await;
            let c = counts(opts.channel).await?;
            if let Err(e) = settled {
                eprintln!("the {} deliveries: {e}", opts.channel);
            }
            if let Far::Push(service, ..) = far {
                service.show();
            }
            let (duplicates, refused_while_down, refused_as_bad, far_end) = far.stats();
            Some(OtherRun {
                sent: c.sent,
                failed: c.failed,
                skipped: c.skipped,
                not_settled: c.pending(),
                seconds_after_outage: Instant::now().saturating_duration_since(outage_ends).as_secs_f64(),
                duplicates,
                refused_while_down,
                refused_as_bad,
                far_end,
            })
        }
    };
    stop.trigger();
    daemon.await.context("the daemon panicked")??;
    stop_emulator.trigger();
    Ok((email_run, other_run))
}

pub async fn bench(opts: &Options) -> anyhow::Result<Report> {
    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
    eprintln!("run 1: email alone, {} subscribers at {} requests/s", opts.subscribers, opts.rps);
    let (email_only, _) = run(opts, &redis, "email", None).await?;
    eprintln!("  {:.0} emails/s ({:.3} of the ceiling)", email_only.emails_per_second, email_only.ratio);
    let (far, stop_far) = match opts.channel {
        Channel::App => {
            let endpoint = AppEndpoint::new(SECRET)?;
            let (url, stop, _) = endpoint.spawn_local().await?;
            (Far::App(endpoint, url), stop)
        }
        Channel::Push => {
            let service = PushService::new();
            let (_, stop, _) = service.spawn_local().await?;
            let (private, key) = VapidKey::generate();
            (Far::Push(service, private, key.public), stop)
        }
        Channel::Email => anyhow::bail!("the channel beside email is app or push"),
    };
    if opts.slow_ms > 0 {
        eprintln!("run 2: email and the {} channel, each of its answers {} ms late", opts.channel, opts.slow_ms);
    } else {
        eprintln!("run 2: email and the {} channel, its far end down for {} s", opts.channel, opts.outage_seconds);
    }
    let (with_outage, other) = run(opts, &redis, opts.channel.as_str(), Some(&far)).await?;
    stop_far.trigger();
    let other = other.expect("the second run has the other channel");
    eprintln!(
        "  {:.0} emails/s ({:.3} of the ceiling); {}: {} sent, {} refused while down, {:.1} s after it came back",
        with_outage.emails_per_second,
        with_outage.ratio,
        opts.channel,
        other.sent,
        other.refused_while_down,
        other.seconds_after_outage
    );
    Ok(Report {
        subscribers: opts.subscribers,
        rps: opts.rps,
        ceiling_emails_per_second: f64::from(opts.rps) * 100.0,
        channel: opts.channel,
        outage_seconds: opts.outage_seconds,
        slow_ms: opts.slow_ms,
        pool_size: opts.pool_size.unwrap_or(Config::example().redis.pool_size),
        ratio_difference: with_outage.ratio - email_only.ratio,
        email_kept: with_outage.ratio / email_only.ratio.max(1e-9),
        email_only,
        with_outage,
        other,
    })
}

/// Runs the bench on `opts` and prints its report: the exit code.
pub fn main_with(opts: &Options, json: bool) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let report = match runtime.block_on(bench(opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let problems = report.problems();
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    if json {
        println!("{}", serde_json::to_string(&report).expect("report serializes"));
    } else {
        println!("{}", report.line());
    }
    if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
