//! `mailstream dead-letters`: list the failed (or outcome unknown) deliveries, requeue some by id.

use crate::model::outcome::Requeue;
use crate::ops::dead_letters::{DeadLetterKind, list, retry};
use crate::store::Store;

/// `mailstream dead-letters`.
#[derive(clap::Subcommand)]
pub enum DeadLettersCommand {
    /// The newest dead letters, oldest first, with each delivery's state now.
    List {
        /// List deliveries whose outcome is unknown instead of failed ones.
        #[arg(long)]
        unknown: bool,
        /// At most this many (the newest).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Requeue deliveries by id: pending again, attempts reset, a new stream entry.
    Retry {
        /// Delivery ids, as `list` prints them.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Also requeue outcome_unknown deliveries (check in Resend first that they were not sent).
        #[arg(long)]
        allow_unknown: bool,
        /// One JSON object on stdout: each id's result and how many were refused.
        #[arg(long)]
        json: bool,
    },
}

/// Lists or requeues dead letters; exit 1 if a requeue was refused.
pub async fn command(
    config: &crate::config::Config,
    command: DeadLettersCommand,
) -> anyhow::Result<std::process::ExitCode> {
    match command {
        DeadLettersCommand::List { unknown, limit, json } => {
            let store = Store::open_deployed(config).await?;
            let kind = if unknown { DeadLetterKind::OutcomeUnknown } else { DeadLetterKind::Failed };
            let entries = list(&store, kind, limit).await?;
            for d in &entries {
                if json {
                    crate::cli::outln!("{}", serde_json::to_string(d)?)?;
                } else {
                    let at = chrono::DateTime::from_timestamp_millis(d.at_ms as i64).unwrap_or_default();
                    crate::cli::outln!(
                        "{}  {}  error={}  attempts={}  now={}",
                        at.format("%Y-%m-%dT%H:%M:%SZ"),
                        d.delivery,
                        d.error,
                        d.attempts,
                        d.state_now
                    )?;
                }
            }
            if !json {
                eprintln!("{} entries", entries.len());
            }
        }
        DeadLettersCommand::Retry { ids, allow_unknown, json } => {
            // Every id is a delivery id before anything is read or written.
            if let Some(bad) = ids.iter().find(|id| crate::model::work::DeliveryRef::parse(id).is_none()) {
                let bad: String = bad.chars().take(64).collect();
                let why = format!("{bad:?} is not a delivery id (campaign:period:subscriber:target)");
                return Err(crate::cli::BadValue(why).into());
            }
            let store = Store::open_deployed(config).await?;
            let results = retry(&store, &ids, allow_unknown).await?;
            let out = crate::cli::Report { json };
            let mut refused = 0;
            for (id, result) in &results {
                if *result == Requeue::Requeued {
                    out.line(format_args!("{id}: {result}"));
                } else {
                    // A refusal: on stderr, with or without --json.
                    eprintln!("{id}: {result}");
                    refused += 1;
                }
            }
            let results: Vec<_> = results
                .iter()
                .map(|(id, r)| match r {
                    Requeue::Refused(state) => {
                        serde_json::json!({ "id": id, "result": "refused", "state": state.as_str() })
                    }
                    other => serde_json::json!({ "id": id, "result": other.to_string() }),
                })
                .collect();
            out.object(&serde_json::json!({ "results": results, "refused": refused }))?;
            if refused > 0 {
                return Ok(std::process::ExitCode::FAILURE);
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
