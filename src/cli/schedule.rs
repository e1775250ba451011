//! `mailstream schedule`: the next fires of every scheduled campaign, in its zone and in UTC.

use chrono::Utc;

use crate::ops::schedule::Schedule;

/// `mailstream schedule`.
#[derive(clap::Args)]
pub struct Args {
    /// How many fires to show per campaign.
    #[arg(long, default_value_t = 5)]
    next: usize,
    /// One JSON object on stdout (the lines for people go to stderr).
    #[arg(long)]
    json: bool,
}

/// Prints the next fires of every scheduled campaign, in its zone and in UTC.
pub fn command(config: &crate::config::Config, args: Args) -> anyhow::Result<std::process::ExitCode> {
    let now = Utc::now();
    let out = crate::cli::Report { json: args.json };
    let mut campaigns = Vec::new();
    for c in &config.campaigns {
        let Some(schedule) = Schedule::of(c)? else { continue };
        let fires = schedule.fires(c, now, args.next);
        out.line(format_args!(
            "{} ({}, {}): {}",
            c.name,
            c.time_zone,
            c.schedule.as_deref().unwrap_or(""),
            c.period.name()
        ));
        for f in &fires {
            out.line(format_args!("  {}  {}  period {}", f.local, f.utc, f.period));
        }
        campaigns.push(serde_json::json!({"name": c.name, "time_zone": c.time_zone, "fires": fires}));
    }
    if campaigns.is_empty() {
        out.line("no campaign has a schedule");
    }
    out.object(&serde_json::json!({ "campaigns": campaigns }))?;
    Ok(std::process::ExitCode::SUCCESS)
}
