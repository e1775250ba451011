//! `mailstream deliveries`: the delivery log, a page at a time, for people or as JSON lines.

use chrono::Utc;

use crate::ops::deliveries::{Filter, page, parse_since};
use crate::store::Store;

/// `mailstream deliveries`: the delivery log, a page at a time.
#[derive(clap::Args)]
pub struct Args {
    /// Only this campaign's deliveries (`transactional` for the transactional lane).
    #[arg(long)]
    campaign: Option<String>,
    /// Only this period (such as 2026-W48).
    #[arg(long)]
    period: Option<String>,
    /// Only this subscriber's deliveries.
    #[arg(long)]
    subscriber: Option<String>,
    /// pending, processing, sealed, sent, skipped, failed, outcome_unknown or unknown; repeat for several.
    #[arg(long = "status")]
    statuses: Vec<String>,
    /// Settled at or after: an RFC 3339 time or a span before now (90s, 30m, 2h, 7d).
    #[arg(long)]
    since: Option<String>,
    /// At most this many rows on the page.
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Continue where the previous page ended (printed after it).
    #[arg(long)]
    cursor: Option<String>,
    /// One JSON object per line on stdout (the cursor line goes to stderr).
    #[arg(long)]
    json: bool,
}

/// Prints one page of the log and, on stderr, the cursor of the next.
pub async fn command(config: &crate::config::Config, args: Args) -> anyhow::Result<std::process::ExitCode> {
    let Args { campaign, period, subscriber, statuses, since, limit, cursor, json } = args;
    let store = Store::open_deployed(config).await?;
    let since = since.map(|s| parse_since(&s, Utc::now())).transpose()?;
    let filter = Filter { campaign, period, subscriber, statuses, since, limit };
    let page = page(&store, &filter, cursor.as_deref()).await?;
    for r in &page.rows {
        if json {
            crate::cli::outln!("{}", serde_json::to_string(r)?)?;
        } else {
            let events: Vec<String> = r
                .events
                .keys()
                .map(|k| match (k.as_str(), &r.provider_failed) {
                    ("failed", Some(reason)) => format!("failed({reason})"),
                    _ => k.clone(),
                })
                .collect();
            crate::cli::outln!(
                "{}  {}  {}  {}  requests={}  settled={}  events={}",
                r.id,
                r.status,
                r.why.as_deref().unwrap_or("-"),
                r.address.as_deref().unwrap_or("-"),
                r.sends,
                r.settled_at.as_deref().unwrap_or("-"),
                if events.is_empty() { "-".to_string() } else { events.join(",") },
            )?;
        }
    }
    match &page.next {
        Some(next) => eprintln!("{} shown; more with --cursor {next}", page.rows.len()),
        None => eprintln!("{} shown; no more", page.rows.len()),
    }
    Ok(std::process::ExitCode::SUCCESS)
}
