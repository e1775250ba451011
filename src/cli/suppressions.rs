//! `mailstream suppressions`: list, add and lift address suppressions, and mirror Resend's
//! own suppression list (`sync`).

use crate::audience::suppression::{Act, apply, list};
use crate::config::Config;
use crate::model::outcome::Why;
use crate::store::Store;
use crate::store::scripts::Suppressed;

/// `mailstream suppressions`.
#[derive(clap::Subcommand)]
pub enum SuppressionsCommand {
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
        /// The address (hashed before it is stored).
        #[arg(long)]
        email: String,
        /// One JSON object on stdout: `{"suppressed": true, "already": bool}`.
        #[arg(long)]
        json: bool,
    },
    /// Lift an address's suppression (its subscribers stay unsubscribed until re-subscribed).
    Remove {
        /// The address (hashed, as stored).
        #[arg(long)]
        email: String,
        /// One JSON object on stdout: `{"lifted": true}`.
        #[arg(long)]
        json: bool,
    },
    /// Mirror Resend's own suppression list: suppress what it lists (as `provider_suppressed`)
    /// and lift Resend's suppressions it no longer lists; resumes an interrupted sync.
    Sync {
        /// Walk the whole list and say what would change; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// A JSON object as the last line on stdout: `{"added", "lifted", "unchanged", "pages"}`.
        #[arg(long)]
        json: bool,
    },
}

/// Lists, adds or lifts suppressions.
pub async fn command(config: &Config, command: SuppressionsCommand) -> anyhow::Result<std::process::ExitCode> {
    match command {
        SuppressionsCommand::List { email, json } => {
            let store = Store::open_deployed(config).await?;
            let entries = list(&store, email.as_deref()).await?;
            for e in &entries {
                if json {
                    crate::cli::outln!("{}", serde_json::to_string(e)?)?;
                } else {
                    let at = chrono::DateTime::from_timestamp_millis(e.at_ms as i64).unwrap_or_default();
                    let event = if e.event.is_empty() { String::new() } else { format!("  event={}", e.event) };
                    crate::cli::outln!(
                        "{}  {}  reason={}  source={}{event}",
                        at.format("%Y-%m-%dT%H:%M:%SZ"),
                        e.address_hash,
                        e.reason,
                        e.source
                    )?;
                }
            }
            if !json {
                eprintln!("{} suppressed", entries.len());
            }
        }
        SuppressionsCommand::Add { email, json } => {
            check_email(&email)?;
            let store = Store::open(config).await?;
            let state = apply(&store, config, &email, Act::Suppress(Why::Manual), None).await?;
            let out = crate::cli::Report { json };
            let already = state == Suppressed::Already;
            out.line(if already { "already suppressed" } else { "suppressed" });
            out.object(&serde_json::json!({ "suppressed": true, "already": already }))?;
        }
        SuppressionsCommand::Remove { email, json } => {
            let store = Store::open(config).await?;
            apply(&store, config, &email, Act::Lift, None).await?;
            let out = crate::cli::Report { json };
            out.line("suppression lifted");
            out.object(&serde_json::json!({ "lifted": true }))?;
        }
        SuppressionsCommand::Sync { dry_run, json } => {
            let store = if dry_run { Store::open_deployed(config).await? } else { Store::open(config).await? };
            let r = crate::ops::suppression_sync::sync(&store, config, dry_run).await?;
            let out = crate::cli::Report { json };
            let would = if dry_run { "would be " } else { "" };
            out.line(format!(
                "{} {would}added, {} {would}lifted, {} unchanged, in {} page(s) of Resend's suppression list",
                r.added, r.lifted, r.unchanged, r.pages
            ));
            out.object(&serde_json::to_value(r)?)?;
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `--email` passes the address rule, before anything is written (the refusal never
/// echoes it).
fn check_email(email: &str) -> Result<(), crate::cli::BadValue> {
    crate::model::address::check(email).map_err(|why| crate::cli::BadValue(format!("--email: the address {why}")))
}
