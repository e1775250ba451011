//! `mailstream demo`: a full weekly run on the embedded default, with a private Redis and the emulator.

use crate::tools::demo::{DemoOptions, channels, run};

/// `mailstream demo`.
#[derive(clap::Args)]
pub struct Args {
    /// How many subscribers the weekly run mails.
    #[arg(long, default_value_t = 5000)]
    subscribers: u64,
    /// The emulated provider's rate limit, and the daemon's pace (requests per second).
    #[arg(long, default_value_t = 10)]
    rps: u32,
    /// One JSON object of results on stdout (the progress goes to stderr).
    #[arg(long)]
    json: bool,
    /// Use this Redis (under a fresh key prefix) instead of starting a private one.
    #[arg(long)]
    redis_url: Option<String>,
    /// Let the daemon's scheduler kick: the campaign is scheduled a minute ahead.
    #[arg(long)]
    scheduled: bool,
    /// The campaign's channels, comma-separated (`email,app`): the application channel
    /// posts each delivery's event to a small endpoint that verifies its signature and
    /// counts duplicate ids; the summary gains a line per channel (`channels` in JSON).
    #[arg(long)]
    channels: Option<String>,
}

/// Runs the demo on stdout; exit 1 if it found a problem.
pub async fn command(args: Args) -> anyhow::Result<std::process::ExitCode> {
    let Args { subscribers, rps, json, redis_url, scheduled, channels } = args;
    let channels = channels
        .map(|c| channels::parse(&c))
        .transpose()
        .map_err(|e| crate::cli::BadValue(format!("--channels: {e}")))?;
    let opts = DemoOptions { subscribers, rps, redis_url, scheduled, channels, ..Default::default() };
    // With --json, stdout holds the one object and the progress goes to stderr.
    let report =
        if json { run(&opts, &mut std::io::stderr()).await? } else { run(&opts, &mut std::io::stdout()).await? };
    crate::cli::Report { json }.object(&report)?;
    Ok(if report.problems().is_empty() { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE })
}
