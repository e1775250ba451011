//! The `mailstream` command: argument parsing, logging and signal wiring only;
//! the work is in the library.

use std::io::{IsTerminal, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use mailstream::config::{Config, LogConfig, LogFormat};
use mailstream::db::Store;
use mailstream::db::scripts::Suppressed;
use mailstream::dead_letters;
use mailstream::deliveries;
use mailstream::demo::{self, DemoOptions};
use mailstream::emulator::{Emulator, EmulatorConfig};
use mailstream::ingest;
use mailstream::kick;
use mailstream::outcome::Requeue;
use mailstream::shutdown::{self, Shutdown, Trigger};
use mailstream::subscribers::{self, Subscriber};
use mailstream::suppression;

#[derive(Parser)]
#[command(
    name = "mailstream",
    version,
    about = "Delivers scheduled and transactional email through Resend, exactly once in effect, on Redis Streams."
)]
struct Cli {
    /// Config file (see the shipped config.toml); accepted before or after the command.
    #[arg(long, short, global = true, env = "MAILSTREAM_CONFIG", default_value = "/etc/mailstream/config.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: read, batch, send, settle, recover; stop on SIGTERM or SIGINT.
    Run,
    /// Validate a config file and exit.
    CheckConfig,
    /// Add or update subscribers in the registry.
    Subscribe {
        /// Subscriber id (an id, not an address).
        #[arg(long, required_unless_present = "ndjson")]
        id: Option<String>,
        #[arg(long, required_unless_present = "ndjson")]
        email: Option<String>,
        /// Target ids (repeat); one delivery per target and period.
        #[arg(long = "target")]
        targets: Vec<String>,
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        entitled: bool,
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        subscribed: bool,
        /// The subscriber's IANA time zone (for campaigns delivered at a local hour).
        #[arg(long)]
        time_zone: Option<String>,
        /// Read NDJSON subscriber records from this file, or `-` for stdin.
        #[arg(long, conflicts_with_all = ["id", "email"])]
        ndjson: Option<String>,
    },
    /// Enqueue a transactional send (a receipt, a reset) in the lane that overtakes
    /// campaigns; at most once per idempotency key. One from flags, or NDJSON items.
    Enqueue {
        /// The caller's idempotency key: the same key enqueues once within the retention.
        #[arg(long = "key", required_unless_present = "ndjson")]
        key: Option<String>,
        /// The recipient's address (kept in the delivery's record only)...
        #[arg(long)]
        to: Option<String>,
        /// ...or a subscriber id of the registry.
        #[arg(long)]
        subscriber: Option<String>,
        /// A template of the config...
        #[arg(long)]
        template: Option<String>,
        /// ...or ready content: a subject and html and/or text.
        #[arg(long)]
        subject: Option<String>,
        #[arg(long)]
        html: Option<String>,
        #[arg(long)]
        text: Option<String>,
        /// Template data, a JSON object.
        #[arg(long)]
        data: Option<String>,
        /// Read NDJSON items (the ingest API's item shape) from this file, or `-` for stdin.
        #[arg(long, conflicts_with_all = ["key", "to", "subscriber", "template", "subject", "html", "text", "data"])]
        ndjson: Option<String>,
        /// One JSON object on the last line.
        #[arg(long)]
        json: bool,
    },
    /// Enqueue a campaign period for every eligible subscriber (at most once each).
    Kick {
        #[arg(long)]
        campaign: String,
        /// Period such as 2026-W48; default: the current one in the campaign's time zone.
        #[arg(long)]
        period: Option<String>,
        /// `-`: fan out over NDJSON subscriber records on stdin (upserted first) instead of the registry.
        #[arg(long)]
        audience: Option<String>,
        /// Allow a `--period` other than the current, previous or next one (still within the retention).
        #[arg(long)]
        allow_any_period: bool,
        /// Accept an empty `--audience` (otherwise an error: an empty export usually means a failed one).
        #[arg(long)]
        allow_empty: bool,
        /// Write nothing: print how many deliveries would be new, already enqueued, not
        /// eligible (by reason), and per release hour for a local-hour campaign.
        #[arg(long, conflicts_with = "audience")]
        dry_run: bool,
        /// One JSON object on the last line (and no progress display).
        #[arg(long)]
        json: bool,
    },
    /// The next fires of every scheduled campaign, in its zone and in UTC, with the period each kicks.
    Schedule {
        #[arg(long, default_value_t = 5)]
        next: usize,
        /// One JSON object on the last line.
        #[arg(long)]
        json: bool,
    },
    /// Render the exact email a delivery would be sealed as now, without enqueuing anything.
    Preview {
        #[arg(long)]
        campaign: String,
        #[arg(long)]
        subscriber: String,
        /// The subscriber's target (default: their first).
        #[arg(long)]
        target: Option<String>,
        /// Default: the current period.
        #[arg(long)]
        period: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: PreviewFormat,
    },
    /// Look at and requeue deliveries that failed (or whose outcome is unknown).
    DeadLetters {
        #[command(subcommand)]
        action: DeadLetterAction,
    },
    /// The delivery log: who got what, and why not (addresses masked).
    Deliveries {
        #[arg(long)]
        campaign: Option<String>,
        #[arg(long)]
        period: Option<String>,
        #[arg(long)]
        subscriber: Option<String>,
        /// pending, processing, sealed, sent, skipped, failed, outcome_unknown or unknown; repeat for several.
        #[arg(long = "status")]
        statuses: Vec<String>,
        /// Settled at or after: an RFC 3339 time or a span before now (90s, 30m, 2h, 7d).
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Continue where the previous page ended (printed after it).
        #[arg(long)]
        cursor: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// End a quota pause now, on every instance (it also ends when the quota renews).
    Resume,
    /// Moves a deployment of an earlier key layout (2 or 3) to this version's: from 2 it
    /// builds the kick's audience index from the subscriber records. Stop every instance
    /// first.
    Upgrade,
    /// Look at, add and lift address suppressions (bounces, complaints, by hand).
    Suppressions {
        #[command(subcommand)]
        action: SuppressionAction,
    },
    /// Report the delivery SLO per campaign period (failure rate against slo.failure_rate,
    /// outcome unknown, stuck). Exit 0: within; 3: objective breached (a warning; stuck
    /// alone counts); 4: could not evaluate (Redis unreachable, no such campaign).
    Slo {
        #[arg(long)]
        campaign: Option<String>,
        #[arg(long)]
        period: Option<String>,
        /// End with one JSON object on the last line.
        #[arg(long)]
        json: bool,
    },
    /// Run the Resend emulator.
    Emulator {
        #[arg(long, default_value = "127.0.0.1:3030")]
        listen: SocketAddr,
        /// Team rate limit (requests per sliding second), 0 for none; overrides the
        /// settings file (default 10).
        #[arg(long)]
        rps: Option<u32>,
        /// TOML file with emulator settings and faults (see EmulatorConfig).
        #[arg(long)]
        settings: Option<PathBuf>,
    },
    /// A full weekly run on the embedded default: private Redis, emulator, N subscribers.
    Demo {
        #[arg(long, default_value_t = 5000)]
        subscribers: u64,
        #[arg(long, default_value_t = 10)]
        rps: u32,
        /// End with one JSON line of results.
        #[arg(long)]
        json: bool,
        /// Use this Redis (under a fresh key prefix) instead of starting a private one.
        #[arg(long)]
        redis_url: Option<String>,
        /// Let the daemon's scheduler kick: the campaign is scheduled a minute ahead.
        #[arg(long)]
        scheduled: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PreviewFormat {
    /// Subject, headers and the text part.
    Text,
    /// The HTML part.
    Html,
    /// The email object exactly as it would be sealed.
    Json,
}

#[derive(Subcommand)]
enum SuppressionAction {
    /// Every suppression, oldest first (addresses are kept as salted hashes), or one address's.
    List {
        /// Only this address (it is hashed, not stored).
        #[arg(long)]
        email: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Suppress an address by hand: its subscribers are marked suppressed and unsubscribed.
    Add {
        #[arg(long)]
        email: String,
    },
    /// Lift an address's suppression (its subscribers stay unsubscribed until re-subscribed).
    Remove {
        #[arg(long)]
        email: String,
    },
}

#[derive(Subcommand)]
enum DeadLetterAction {
    /// The newest dead letters, oldest first, with each delivery's state now.
    List {
        /// List deliveries whose outcome is unknown instead of failed ones.
        #[arg(long)]
        unknown: bool,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Requeue deliveries by id: pending again, attempts reset, a new stream entry.
    Retry {
        #[arg(required = true)]
        ids: Vec<String>,
        /// Also requeue outcome_unknown deliveries (check in Resend first that they were not sent).
        #[arg(long)]
        allow_unknown: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon logs as its config says; the other commands print for people and
    // log only warnings.
    // `run` reads its config once, here, and keeps it.
    let (log, preloaded) = match cli.command {
        Command::Run => match Config::load(&cli.config) {
            Ok(config) => (config.log.clone(), Some(config)),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        },
        Command::Emulator { .. } => (LogConfig::default(), None),
        _ => (LogConfig { level: "warn".into(), format: LogFormat::Text }, None),
    };
    if let Err(e) = mailstream::logging::init(&log, std::io::stderr, std::io::stderr().is_terminal()) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.config, cli.command, preloaded)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<mailstream::config::ConfigError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn dispatch(path: PathBuf, command: Command, preloaded: Option<Config>) -> anyhow::Result<ExitCode> {
    let load = || Config::load(&path);
    match command {
        Command::Run => {
            let config = match preloaded {
                Some(config) => config,
                None => load()?,
            };
            let listeners = mailstream::Listeners::bind(&config).await?;
            let shutdown = signals()?;
            mailstream::run(config, listeners, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig => {
            let config = load()?;
            println!(
                "{}: ok ({} campaigns, {} partitions, {} requests/s, Resend API key {})",
                path.display(),
                config.campaigns.len(),
                config.redis.partitions,
                config.resend.requests_per_second,
                if config.resend.api_key.is_some() { "set" } else { "NOT set (RESEND_API_KEY)" }
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Subscribe { id, email, targets, entitled, subscribed, time_zone, ndjson } => {
            let config = load()?;
            let list = match ndjson {
                Some(source) => subscribers::parse_ndjson(&read_source(&source)?)?,
                None => vec![Subscriber {
                    id: id.unwrap_or_default(),
                    email: email.unwrap_or_default(),
                    targets,
                    entitled,
                    subscribed,
                    data: None,
                    time_zone,
                }],
            };
            let store = Store::open(&config).await?;
            subscribers::upsert(&store, &list).await?;
            println!("{} subscribers written", list.len());
            Ok(ExitCode::SUCCESS)
        }
        Command::Enqueue { key, to, subscriber, template, subject, html, text, data, ndjson, json } => {
            let config = load()?;
            let items: Vec<serde_json::Value> = match ndjson {
                Some(source) => read_source(&source)?
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| !l.trim().is_empty())
                    .map(|(n, l)| serde_json::from_str(l).with_context(|| format!("line {}: not JSON", n + 1)))
                    .collect::<anyhow::Result<_>>()?,
                None => {
                    let data: Option<serde_json::Value> =
                        data.map(|d| serde_json::from_str(&d).context("--data: not JSON")).transpose()?;
                    let mut item = serde_json::json!({ "idempotency_key": key, "to": to, "subscriber": subscriber,
                        "template": template, "subject": subject, "html": html, "text": text, "data": data });
                    item.as_object_mut().expect("an object").retain(|_, v| !v.is_null());
                    vec![item]
                }
            };
            anyhow::ensure!(
                items.len() <= ingest::MAX_ITEMS * 100,
                "at most {} items per call",
                ingest::MAX_ITEMS * 100
            );
            let store = Store::open(&config).await?;
            let mut results = Vec::with_capacity(items.len());
            let mut items = items.into_iter().peekable();
            while items.peek().is_some() {
                let chunk: Vec<_> = items.by_ref().take(ingest::MAX_ITEMS).collect();
                let offset = results.len();
                for mut r in ingest::enqueue(&store, &config, chunk).await? {
                    r.shift(offset);
                    results.push(r);
                }
            }
            let refused = results.iter().filter(|r| r.is_refused()).count();
            for r in &results {
                match (json, r.is_refused()) {
                    (false, _) => println!("{}", serde_json::to_string(r)?),
                    (true, true) => eprintln!("{}", serde_json::to_string(r)?),
                    (true, false) => {}
                }
            }
            let accepted = results.iter().filter(|r| matches!(r, ingest::ItemResult::Accepted { .. })).count();
            let duplicates = results.iter().filter(|r| matches!(r, ingest::ItemResult::Duplicate { .. })).count();
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "accepted": accepted, "duplicates": duplicates, "refused": refused, "results": results })
                );
            } else {
                println!("{accepted} accepted, {duplicates} duplicates, {refused} refused");
            }
            Ok(if refused == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        Command::Kick { campaign, period, audience: source, allow_any_period, allow_empty, dry_run, json } => {
            let config = load()?;
            let c = config
                .campaign(&campaign)
                .with_context(|| format!("no [[campaign]] named {campaign:?} in the config"))?;
            let list = match source {
                Some(source) => {
                    let list = subscribers::parse_ndjson(&read_source(&source)?)?;
                    if list.is_empty() && !allow_empty {
                        anyhow::bail!(
                            "the audience on {source} is empty (a failed export?); nothing was enqueued. \
                             Pass --allow-empty if an empty audience is expected"
                        );
                    }
                    Some(list)
                }
                None => None,
            };
            let store = Store::open(&config).await?;
            let rule = if allow_any_period { kick::PeriodRule::AnyWithinRetention } else { kick::PeriodRule::NearNow };
            let period = kick::period_for(&store, &config, c, period.as_deref(), rule).await?;
            if dry_run {
                let d = kick::dry_run(&store, &config, &campaign, &period).await?;
                println!(
                    "dry run, nothing written: campaign {} period {}: {} subscribers; {} deliveries would be new, {} already enqueued",
                    d.campaign, d.period, d.subscribers, d.new, d.already_enqueued
                );
                for (why, n) in &d.not_eligible {
                    println!("  not eligible, {why}: {n}");
                }
                for (hour, n) in &d.by_release_hour {
                    println!("  released at {hour}: {n}");
                }
                if json {
                    println!("{}", serde_json::to_string(&d)?);
                }
                return Ok(ExitCode::SUCCESS);
            }
            let report = match list {
                Some(list) => kick::kick_list(&store, &config, &campaign, &period, &list).await?,
                None => {
                    let scanned = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
                    let options = kick::FanoutOptions { scanned: Some(scanned.clone()), ..Default::default() };
                    let shown = (!json).then(|| progress::show(&store, scanned));
                    let report = kick::kick_registry_with(&store, &config, &campaign, &period, &options).await;
                    if let Some(shown) = shown {
                        shown.finish().await;
                    }
                    report?
                }
            };
            if let Some(holder) = &report.standby {
                println!(
                    "campaign {} period {}: being kicked by {holder}; standing by",
                    report.campaign, report.period
                );
            } else {
                let resumed = if report.resumed { " (resumed where a stopped kick left off)" } else { "" };
                println!(
                    "campaign {} period {}: {} new, {} duplicates, {} not eligible{resumed}",
                    report.campaign, report.period, report.new, report.duplicates, report.not_eligible
                );
            }
            if json {
                println!("{}", serde_json::to_string(&report)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::DeadLetters { action } => {
            let config = load()?;
            let store = Store::open(&config).await?;
            match action {
                DeadLetterAction::List { unknown, limit, json } => {
                    let kind = if unknown { dead_letters::Kind::OutcomeUnknown } else { dead_letters::Kind::Failed };
                    let entries = dead_letters::list(&store, kind, limit).await?;
                    for d in &entries {
                        if json {
                            println!("{}", serde_json::to_string(d)?);
                        } else {
                            let at = chrono::DateTime::from_timestamp_millis(d.at_ms as i64).unwrap_or_default();
                            println!(
                                "{}  {}  error={}  attempts={}  now={}",
                                at.format("%Y-%m-%dT%H:%M:%SZ"),
                                d.delivery,
                                d.error,
                                d.attempts,
                                d.state_now
                            );
                        }
                    }
                    if !json {
                        eprintln!("{} entries", entries.len());
                    }
                }
                DeadLetterAction::Retry { ids, allow_unknown } => {
                    let results = dead_letters::retry(&store, &ids, allow_unknown).await?;
                    let mut refused = 0;
                    for (id, result) in &results {
                        println!("{id}: {result}");
                        refused += usize::from(*result != Requeue::Requeued);
                    }
                    if refused > 0 {
                        return Ok(ExitCode::FAILURE);
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Deliveries { campaign, period, subscriber, statuses, since, limit, cursor, json } => {
            let config = load()?;
            let store = Store::open(&config).await?;
            let since = since.map(|s| deliveries::parse_since(&s, chrono::Utc::now())).transpose()?;
            let filter = deliveries::Filter { campaign, period, subscriber, statuses, since, limit };
            let page = deliveries::page(&store, &filter, cursor.as_deref()).await?;
            for r in &page.rows {
                if json {
                    println!("{}", serde_json::to_string(r)?);
                } else {
                    let events: Vec<&str> = r.events.keys().map(String::as_str).collect();
                    println!(
                        "{}  {}  {}  {}  requests={}  settled={}  events={}",
                        r.id,
                        r.status,
                        r.why.as_deref().unwrap_or("-"),
                        r.address.as_deref().unwrap_or("-"),
                        r.sends,
                        r.settled_at.as_deref().unwrap_or("-"),
                        if events.is_empty() { "-".to_string() } else { events.join(",") },
                    );
                }
            }
            match &page.next {
                Some(next) => eprintln!("{} shown; more with --cursor {next}", page.rows.len()),
                None => eprintln!("{} shown; no more", page.rows.len()),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Resume => {
            let config = load()?;
            let store = Store::open(&config).await?;
            let was = mailstream::pause::Pause::resume(&store).await?;
            println!("{}", if was { "sending resumed" } else { "sending was not paused" });
            Ok(ExitCode::SUCCESS)
        }
        Command::Upgrade => {
            let config = load()?;
            let store = Store::connect(&config).await?;
            store.check_version().await?;
            let upgraded = store
                .upgrade_layout(async |store: &Store| {
                    let n = mailstream::subscribers::build_audience(store).await?;
                    println!("built the kick's audience: {n} subscribers entitled, subscribed and not suppressed");
                    Ok(())
                })
                .await?;
            if let Some(from) = upgraded {
                println!("upgraded from key layout {from} to {}", mailstream::db::keys::LAYOUT);
            } else {
                println!("nothing to upgrade: key layout {}", mailstream::db::keys::LAYOUT);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Suppressions { action } => {
            let config = load()?;
            let store = Store::open(&config).await?;
            match action {
                SuppressionAction::List { email, json } => {
                    let entries = suppression::list(&store, email.as_deref()).await?;
                    for e in &entries {
                        if json {
                            println!("{}", serde_json::to_string(e)?);
                        } else {
                            let at = chrono::DateTime::from_timestamp_millis(e.at_ms as i64).unwrap_or_default();
                            let event = if e.event.is_empty() { String::new() } else { format!("  event={}", e.event) };
                            println!(
                                "{}  {}  reason={}  source={}{event}",
                                at.format("%Y-%m-%dT%H:%M:%SZ"),
                                e.address_hash,
                                e.reason,
                                e.source
                            );
                        }
                    }
                    if !json {
                        eprintln!("{} suppressed", entries.len());
                    }
                }
                SuppressionAction::Add { email } => {
                    let act = suppression::Act::Suppress(suppression::Why::Manual);
                    let state = suppression::apply(&store, &config, &email, act, None).await?;
                    println!("{}", if state == Suppressed::Already { "already suppressed" } else { "suppressed" });
                }
                SuppressionAction::Remove { email } => {
                    suppression::apply(&store, &config, &email, suppression::Act::Lift, None).await?;
                    println!("suppression lifted");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Schedule { next, json } => {
            let config = load()?;
            let now = chrono::Utc::now();
            let mut campaigns = Vec::new();
            for c in &config.campaigns {
                let Some(schedule) = mailstream::schedule::Schedule::of(c)? else { continue };
                let fires = schedule.fires(c, now, next);
                println!("{} ({}, {}): {}", c.name, c.time_zone, c.schedule.as_deref().unwrap_or(""), c.period.name());
                for f in &fires {
                    println!("  {}  {}  period {}", f.local, f.utc, f.period);
                }
                campaigns.push(serde_json::json!({"name": c.name, "time_zone": c.time_zone, "fires": fires}));
            }
            if campaigns.is_empty() {
                println!("no campaign has a schedule");
            }
            if json {
                println!("{}", serde_json::json!({ "campaigns": campaigns }));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Preview { campaign, subscriber, target, period, format } => {
            let config = load()?;
            let c = config.campaign(&campaign).with_context(|| format!("no campaign {campaign:?} in the config"))?;
            let store = Store::open(&config).await?;
            let period =
                kick::period_for(&store, &config, c, period.as_deref(), kick::PeriodRule::AnyWithinRetention).await?;
            let target = match target {
                Some(t) => t,
                None => subscribers::first_target(&store, &subscriber).await?,
            };
            let delivery = mailstream::work::DeliveryRef::new(&campaign, &period, &subscriber, &target);
            let email = match mailstream::consumer::preview(&store, &config, &delivery).await? {
                Ok(json) => json,
                Err(reason) => {
                    println!("{} would not be sent: {}", delivery.id(), reason.as_str());
                    return Ok(ExitCode::FAILURE);
                }
            };
            let value: serde_json::Value = serde_json::from_str(&email)?;
            match format {
                PreviewFormat::Json => println!("{email}"),
                PreviewFormat::Html => println!("{}", value["html"].as_str().unwrap_or("")),
                PreviewFormat::Text => {
                    println!("delivery: {}", delivery.id());
                    for field in ["from", "subject"] {
                        println!("{field}: {}", value[field].as_str().unwrap_or(""));
                    }
                    println!("to: {}", value["to"]);
                    if let Some(headers) = value["headers"].as_object() {
                        for (k, v) in headers {
                            println!("{k}: {}", v.as_str().unwrap_or(""));
                        }
                    }
                    println!("\n{}", value["text"].as_str().unwrap_or(""));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Slo { campaign, period, json } => {
            let config = load()?;
            let report = async {
                let store = Store::open(&config).await?;
                mailstream::slo::evaluate(&store, &config, campaign.as_deref(), period.as_deref()).await
            };
            match report.await {
                Ok(report) => {
                    print!("{}", mailstream::slo::render(&report));
                    if json {
                        println!("{}", serde_json::to_string(&report)?);
                    }
                    Ok(ExitCode::from(report.exit_code()))
                }
                Err(e) => {
                    eprintln!("error: the SLO could not be evaluated: {e:#}");
                    Ok(ExitCode::from(mailstream::slo::EXIT_UNEVALUATED))
                }
            }
        }
        Command::Emulator { listen, rps, settings } => {
            let mut emulator_config = match settings {
                Some(path) => {
                    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                    toml::from_str::<EmulatorConfig>(&text).with_context(|| format!("{}", path.display()))?
                }
                None => EmulatorConfig::default(),
            };
            if let Some(rps) = rps {
                emulator_config.requests_per_second = (rps > 0).then_some(rps);
            }
            let listener =
                tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
            tracing::info!(%listen, rps = ?emulator_config.requests_per_second, "Resend emulator listening");
            Emulator::new(emulator_config).serve(listener, signals()?).await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { subscribers, rps, json, redis_url, scheduled } => {
            let opts = DemoOptions { subscribers, rps, redis_url, scheduled, ..Default::default() };
            let mut out = std::io::stdout();
            let report = demo::run(&opts, &mut out).await?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            }
            Ok(if report.problems().is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

/// How far a kick has got: a bar on a terminal, a line every few seconds otherwise.
mod progress {
    use std::io::IsTerminal;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use mailstream::db::Store;

    /// Kicks over fewer subscribers than this show nothing.
    const SHOW_FROM: u64 = 5000;

    pub struct Shown(Option<(tokio::task::JoinHandle<()>, tokio::sync::oneshot::Sender<()>)>);

    impl Shown {
        pub async fn finish(self) {
            if let Some((task, stop)) = self.0 {
                let _ = stop.send(());
                let _ = task.await;
            }
        }
    }

    /// Shows `scanned` against the registry's size until finished.
    pub fn show(store: &Store, scanned: Arc<AtomicU64>) -> Shown {
        let store = store.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let Ok(total) = store.subscriber_count().await else { return };
            if total < SHOW_FROM {
                return;
            }
            let terminal = std::io::stderr().is_terminal();
            let bar = terminal.then(|| {
                let bar = indicatif::ProgressBar::new(total);
                let style = indicatif::ProgressStyle::with_template(
                    "kick [{bar:40}] {pos}/{len} subscribers, {per_sec}, ETA {eta}",
                );
                bar.set_style(style.unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()).progress_chars("=> "));
                bar
            });
            let started = Instant::now();
            let every = if terminal { Duration::from_millis(100) } else { Duration::from_secs(5) };
            loop {
                let done = tokio::select! {
                    _ = &mut stopped => true,
                    _ = tokio::time::sleep(every) => false,
                };
                let n = scanned.load(Ordering::Relaxed);
                match &bar {
                    Some(bar) => bar.set_position(n),
                    None if !done => {
                        let rate = n as f64 / started.elapsed().as_secs_f64().max(0.001);
                        let eta = total.saturating_sub(n) as f64 / rate.max(1.0);
                        eprintln!("kick: {n}/{total} subscribers ({rate:.0}/s, ETA {eta:.0} s)");
                    }
                    None => {}
                }
                if done {
                    if let Some(bar) = bar {
                        bar.finish_and_clear();
                    }
                    return;
                }
            }
        });
        Shown(Some((task, stop)))
    }
}

/// Reads a file, or stdin for `-`.
fn read_source(source: &str) -> anyhow::Result<String> {
    if source == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading stdin")?;
        Ok(text)
    } else {
        std::fs::read_to_string(Path::new(source)).with_context(|| format!("reading {source}"))
    }
}

/// SIGTERM or SIGINT begins a graceful shutdown; a second one exits at once
/// (leases and sealed batches make that safe: the next instance recovers).
fn signals() -> anyhow::Result<Shutdown> {
    use tokio::signal::unix::{SignalKind, signal};
    let (trigger, shutdown): (Trigger, Shutdown) = shutdown::channel();
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            seen += 1;
            if seen == 1 {
                tracing::warn!("shutting down: finishing in-flight requests (signal again to exit now)");
                trigger.trigger();
            } else {
                tracing::warn!("exiting now; unfinished work stays leased or sealed for the next instance");
                std::process::exit(130);
            }
        }
    });
    Ok(shutdown)
}
