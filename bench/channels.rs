//! `bench/channels [--subscribers N] [--app-outage-seconds S] [--rps R] [--json]`:
//! an application that is down must delay no email. Two runs of the weekly digest on one
//! Redis (`appendfsync always`), each with its own emulator at R requests/s and the
//! daemon in-process: email alone, then email and the application channel with the
//! application endpoint answering 503 for the first S seconds of the run (every event
//! is put off and asked again meanwhile). Each run's email throughput is measured from
//! the first email sent to the last, as a ratio to the provider's ceiling; then the
//! second run waits for every event. Exits non-zero when the two ratios differ by more
//! than 0.02, an email or an event was sent twice, or anything was left unsettled.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use mailstream::config::{AppChannelConfig, Config, Secret};
use mailstream::db::{Counts, Store};
use mailstream::emulator::app::{AppEndpoint, AppStats};
use mailstream::emulator::{Emulator, EmulatorConfig};
use mailstream::redis_server::{RedisOptions, RedisServer};
use mailstream::subscribers::{self, Subscriber};
use mailstream::work::Channel;
use serde::Serialize;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

struct Options {
    subscribers: u64,
    outage_seconds: u64,
    rps: u32,
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

/// The application channel in the second run.
#[derive(Debug, Clone, Serialize)]
struct AppRun {
    sent: u64,
    failed: u64,
    not_settled: u64,
    /// From the endpoint coming back to the last event settled.
    seconds_after_outage: f64,
    endpoint: AppStats,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    subscribers: u64,
    rps: u32,
    ceiling_emails_per_second: f64,
    app_outage_seconds: u64,
    email_only: EmailRun,
    with_app_outage: EmailRun,
    /// with_app_outage.ratio - email_only.ratio.
    ratio_difference: f64,
    app: AppRun,
}

impl Report {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.ratio_difference.abs() > 0.02 {
            p.push(format!(
                "the email throughput ratio moved by {:.3} with the application down",
                self.ratio_difference
            ));
        }
        for (name, run) in [("email only", &self.email_only), ("with the application down", &self.with_app_outage)] {
            if run.sent != self.subscribers || run.failed > 0 || run.duplicate_sends > 0 {
                p.push(format!("{name}: {} sent, {} failed, {} sent twice", run.sent, run.failed, run.duplicate_sends));
            }
        }
        let a = &self.app;
        if a.sent != self.subscribers || a.not_settled > 0 || a.endpoint.duplicates > 0 || a.endpoint.rejected > 0 {
            p.push(format!(
                "application: {} sent, {} not settled, {} taken twice, {} signatures rejected",
                a.sent, a.not_settled, a.endpoint.duplicates, a.endpoint.rejected
            ));
        }
        if self.app_outage_seconds > 0 && a.endpoint.refused_while_down == 0 {
            p.push("the application's outage refused nothing: the run did not show what it is for".into());
        }
        p
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

/// One run: its own prefix, emulator and (with `app`) application endpoint.
async fn run(
    opts: &Options,
    redis: &RedisServer,
    name: &str,
    app: Option<&AppEndpoint>,
    app_url: Option<&str>,
) -> anyhow::Result<(EmailRun, Option<AppRun>)> {
    let emulator = Emulator::new(EmulatorConfig { requests_per_second: Some(opts.rps), ..Default::default() });
    let (emulator_url, stop_emulator, _) = emulator.spawn_local().await?;
    let mut config = Config::example();
    config.redis.url = Secret::new(redis.url());
    config.redis.prefix = format!("bench-channels-{name}");
    config.resend.base_url = emulator_url;
    config.resend.api_key = Some(Secret::new("re_bench_channels"));
    config.resend.requests_per_second = opts.rps;
    config.http.metrics_listen = None;
    config.unsubscribe.secrets = vec![Secret::new("an-unsubscribe-secret-of-16+")];
    for c in &mut config.campaigns {
        c.schedule = None;
        if let Some(url) = app_url {
            c.channels = vec![Channel::Email, Channel::App];
            config.channels.app = Some(AppChannelConfig {
                url: url.to_string(),
                timeout_ms: 5000,
                concurrency: 16,
                secret_file: None,
                secret: Some(Secret::new(SECRET)),
            });
        }
    }
    config.validate()?;
    let store = Store::connect(&config).await?;
    let subs: Vec<Subscriber> = (0..opts.subscribers).map(Subscriber::synthetic).collect();
    subscribers::upsert(&store, &subs).await?;
    let campaign = config.campaigns[0].name.clone();
    let period = mailstream::kick::period_for(&store, &config, &config.campaigns[0], None, Default::default()).await?;
    mailstream::kick::kick_registry(&store, &config, &campaign, &period).await?;

    let (stop, down) = mailstream::shutdown::channel();
    let daemon = tokio::spawn(mailstream::run_with(config.clone(), Default::default(), down, Default::default()));
    let started = Instant::now();
    if let Some(app) = app {
        app.set_down(opts.outage_seconds > 0);
        let (app, outage) = (app.clone(), Duration::from_secs(opts.outage_seconds));
        tokio::spawn(async move {
            tokio::time::sleep(outage).await;
            app.set_down(false);
        });
    }
    let counts = |channel| {
        let (store, campaign, period) = (store.clone(), campaign.clone(), period.clone());
        async move { store.channel_counts(&campaign, &period, channel).await }
    };
    let expected = opts.subscribers as f64 / (f64::from(opts.rps) * 100.0);
    let within = Duration::from_secs_f64(expected * 3.0 + 120.0);
    let mut first: Option<Instant> = None;
    let deadline = Instant::now() + within;
    loop {
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
    let app_run = match app {
        None => None,
        Some(app) => {
            let outage_ends = started + Duration::from_secs(opts.outage_seconds);
            let within = Duration::from_secs(opts.outage_seconds + 600);
            let settled = until(within, || async {
                let c = counts(Channel::App).await?;
                Ok(c.settled() >= c.enqueued && c.enqueued > 0)
            })
            .await;
            let c = counts(Channel::App).await?;
            if let Err(e) = settled {
                eprintln!("the application's events: {e}");
            }
            Some(AppRun {
                sent: c.sent,
                failed: c.failed,
                not_settled: c.pending(),
                seconds_after_outage: Instant::now().saturating_duration_since(outage_ends).as_secs_f64(),
                endpoint: app.stats(),
            })
        }
    };
    stop.trigger();
    daemon.await.context("the daemon panicked")??;
    stop_emulator.trigger();
    Ok((email_run, app_run))
}

async fn bench(opts: &Options) -> anyhow::Result<Report> {
    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await?;
    eprintln!("run 1: email alone, {} subscribers at {} requests/s", opts.subscribers, opts.rps);
    let (email_only, _) = run(opts, &redis, "email", None, None).await?;
    eprintln!("  {:.0} emails/s ({:.3} of the ceiling)", email_only.emails_per_second, email_only.ratio);
    let endpoint = AppEndpoint::new(SECRET)?;
    let (url, stop_app, _) = endpoint.spawn_local().await?;
    eprintln!("run 2: email and the application channel, the application down for {} s", opts.outage_seconds);
    let (with_app_outage, app) = run(opts, &redis, "app", Some(&endpoint), Some(&url)).await?;
    stop_app.trigger();
    let app = app.expect("the second run has the application channel");
    eprintln!(
        "  {:.0} emails/s ({:.3} of the ceiling); events: {} sent, {} refused while down, {:.1} s after it came back",
        with_app_outage.emails_per_second,
        with_app_outage.ratio,
        app.sent,
        app.endpoint.refused_while_down,
        app.seconds_after_outage
    );
    Ok(Report {
        subscribers: opts.subscribers,
        rps: opts.rps,
        ceiling_emails_per_second: f64::from(opts.rps) * 100.0,
        app_outage_seconds: opts.outage_seconds,
        ratio_difference: with_app_outage.ratio - email_only.ratio,
        email_only,
        with_app_outage,
        app,
    })
}

fn main() -> ExitCode {
    let mut opts = Options { subscribers: 60_000, outage_seconds: 60, rps: 10 };
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--subscribers" => opts.subscribers = value("--subscribers"),
            "--app-outage-seconds" => opts.outage_seconds = value("--app-outage-seconds"),
            "--rps" => opts.rps = value("--rps") as u32,
            "--json" => json = true,
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let report = match runtime.block_on(bench(&opts)) {
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
        println!(
            "email alone {:.3} of the ceiling, with the application down {} s {:.3} (difference {:+.3}); events: {} sent, {} taken twice",
            report.email_only.ratio,
            report.app_outage_seconds,
            report.with_app_outage.ratio,
            report.ratio_difference,
            report.app.sent,
            report.app.endpoint.duplicates
        );
    }
    if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
