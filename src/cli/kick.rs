//! `mailstream kick`: the registry or an NDJSON audience, a dry run, and how far a
//! long kick has got.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::audience::kick::{self, FanoutOptions, PeriodRule};
use crate::config::Config;
use crate::store::Store;

/// Enqueue a campaign period for every eligible subscriber (at most once each).
#[derive(clap::Args)]
pub struct Args {
    /// The campaign (as named in the config).
    #[arg(long)]
    campaign: String,
    /// Period such as 2026-W48, or previous, current or next (in the campaign's time
    /// zone); default: the current one.
    #[arg(long)]
    period: Option<String>,
    /// `-`: fan out over NDJSON subscriber records on stdin (upserted first) instead of the registry.
    #[arg(long)]
    audience: Option<String>,
    /// Allow a `--period` other than the current, previous or next one (while its kick window is open).
    #[arg(long)]
    allow_any_period: bool,
    /// Accept an empty `--audience` (otherwise an error: an empty export usually means a failed one).
    #[arg(long)]
    allow_empty: bool,
    /// Write nothing: print how many deliveries would be new, already enqueued, not
    /// eligible (by reason), and per release hour for a local-hour campaign.
    #[arg(long, conflicts_with = "audience")]
    pub(crate) dry_run: bool,
    /// One JSON object on stdout (the lines for people go to stderr; no progress display).
    #[arg(long)]
    json: bool,
}

/// Kicks (or dry-runs) the campaign period `args` name and prints what happened.
pub async fn command(config: &Config, args: Args) -> anyhow::Result<ExitCode> {
    let Args { campaign, period, audience, allow_any_period, allow_empty, dry_run, json } = args;
    let c = config
        .campaign(&campaign)
        .ok_or_else(|| crate::cli::BadValue(format!("no [[campaign]] named {campaign:?} in the config")))?;
    // An audience is checked whole, and never held whole, before anything is written.
    let max_data_bytes = config.subscribers.max_data_bytes;
    let list = match audience {
        Some(source) => {
            let input = crate::cli::ndjson::Input::open(&source)?;
            let count = input.check_records(max_data_bytes)?;
            if count == 0 && !allow_empty {
                return Err(crate::model::BadData(format!(
                    "the audience on {source} is empty (a failed export?); nothing was enqueued. \
                     Pass --allow-empty if an empty audience is expected"
                ))
                .into());
            }
            Some((input, count))
        }
        None => None,
    };
    // The period is judged before anything is written: a refused kick leaves a fresh
    // prefix as it was.
    let reader = if dry_run { Store::open_deployed(config).await? } else { Store::open_read(config).await? };
    let rule = if allow_any_period { PeriodRule::AnyWithinRetention } else { PeriodRule::NearNow };
    let period = kick::period_for(&reader, c, period.as_deref(), rule).await?;
    let store = if dry_run { reader } else { Store::open(config).await? };
    let out = crate::cli::Report { json };
    if dry_run {
        let d = kick::dry_run(&store, config, &campaign, &period).await?;
        out.line(format_args!(
            "dry run, nothing written: campaign {} period {}: {} subscribers; {} deliveries would be new, {} already enqueued",
            d.campaign, d.period, d.subscribers, d.new, d.already_enqueued
        ));
        if d.by_channel.len() > 1 {
            for (channel, n) in &d.by_channel {
                out.line(format_args!("  {channel}: {} new, {} already enqueued", n.new, n.duplicates));
            }
        }
        for (why, n) in &d.not_eligible {
            out.line(format_args!("  not eligible, {why}: {n}"));
        }
        for (hour, n) in &d.by_release_hour {
            out.line(format_args!("  released at {hour}: {n}"));
        }
        out.object(&d)?;
        return Ok(ExitCode::SUCCESS);
    }
    let report = match list {
        Some((input, count)) => {
            // A batch at a time: each upserted, then its eligible subscribers enqueued.
            let mut total =
                kick::KickReport { campaign: campaign.clone(), period: period.clone(), ..Default::default() };
            input
                .in_batches(max_data_bytes, count, "kick", async |batch| {
                    total.add(&kick::kick_list(&store, config, &campaign, &period, batch).await?);
                    Ok(())
                })
                .await?;
            total
        }
        None => {
            let scanned = Arc::new(AtomicU64::new(0));
            let options = FanoutOptions { scanned: Some(scanned.clone()), ..Default::default() };
            let shown = (!json).then(|| progress::show(&store, scanned));
            let report = kick::kick_registry_with(&store, config, &campaign, &period, &options).await;
            if let Some(shown) = shown {
                shown.finish().await;
            }
            report?
        }
    };
    if let Some(holder) = &report.standby {
        out.line(format_args!(
            "campaign {} period {}: being kicked by {holder}; standing by",
            report.campaign, report.period
        ));
    } else {
        let resumed = if report.resumed { " (resumed where a stopped kick left off)" } else { "" };
        out.line(format_args!(
            "campaign {} period {}: {} new, {} duplicates, {} not eligible{resumed}",
            report.campaign, report.period, report.new, report.duplicates, report.not_eligible
        ));
    }
    out.object(&report)?;
    Ok(ExitCode::SUCCESS)
}

/// How far a kick has got: a bar on a terminal, a line every few seconds otherwise.
mod progress {
    use std::io::IsTerminal;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use crate::store::Store;

    /// Kicks over fewer subscribers than this show nothing.
    const SHOW_FROM: u64 = 5000;

    pub(crate) struct Shown(Option<(tokio::task::JoinHandle<()>, tokio::sync::oneshot::Sender<()>)>);

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
