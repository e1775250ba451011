//! Dead letters, for the operator: deliveries that failed (or whose outcome is
//! unknown) are listed from their partitions' streams, with the error name and
//! the delivery's current state, and can be requeued by id.

use anyhow::Context;
use redis::streams::StreamRangeReply;
use serde::Serialize;

use crate::db::Store;
use crate::db::scripts;
use crate::outcome::Requeue;
use crate::work::DeliveryRef;

/// One listed entry (ids and names only: no addresses).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeadLetter {
    /// When it was recorded, milliseconds since the epoch (from the entry id).
    pub at_ms: u64,
    pub partition: u16,
    pub delivery: String,
    pub error: String,
    pub attempts: String,
    /// The delivery's state now (it may have been requeued and sent since).
    pub state_now: String,
}

/// Which stream to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Failed,
    OutcomeUnknown,
}

/// The newest `limit` entries of every partition, oldest first.
pub async fn list(store: &Store, kind: Kind, limit: usize) -> anyhow::Result<Vec<DeadLetter>> {
    let mut conn = store.conn().await?;
    let mut out = Vec::new();
    for p in 0..store.keys.partitions() {
        let stream = match kind {
            Kind::Failed => store.keys.dead(p),
            Kind::OutcomeUnknown => store.keys.unknown(p),
        };
        let reply: StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(&stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("reading {stream}"))?;
        let mut pipe = redis::pipe();
        for e in &reply.ids {
            let id: String = e.get("delivery").unwrap_or_default();
            pipe.hget(store.keys.delivery(p, &id), "state");
        }
        // (a dead letter's delivery id names its record in the same partition)
        let states: Vec<Option<String>> =
            if reply.ids.is_empty() { Vec::new() } else { pipe.query_async(&mut conn).await? };
        for (e, state) in reply.ids.iter().zip(states) {
            out.push(DeadLetter {
                at_ms: e.id.split('-').next().and_then(|ms| ms.parse().ok()).unwrap_or(0),
                partition: p,
                delivery: e.get("delivery").unwrap_or_default(),
                error: e.get("error").unwrap_or_default(),
                attempts: e.get("attempts").unwrap_or_default(),
                state_now: state.unwrap_or_else(|| "expired".into()),
            });
        }
    }
    out.sort_by_key(|d| d.at_ms);
    let skip = out.len().saturating_sub(limit);
    Ok(out.split_off(skip))
}

/// Requeues deliveries by id (`campaign:period:subscriber:target`); returns what
/// became of each (an id that names no delivery is `Missing`).
pub async fn retry(store: &Store, ids: &[String], allow_unknown: bool) -> anyhow::Result<Vec<(String, Requeue)>> {
    let mut conn = store.conn().await?;
    let mut out = Vec::new();
    for id in ids {
        let result = match DeliveryRef::parse(id) {
            Some(d) => {
                let p = store.keys.partition_of(d.home());
                scripts::requeue(&mut conn, &store.keys, p, &d, allow_unknown)
                    .await
                    .with_context(|| format!("requeue of {id}"))?
            }
            None => Requeue::Missing,
        };
        out.push((id.clone(), result));
    }
    Ok(out)
}

/// `mailstream dead-letters`.
#[derive(clap::Subcommand)]
pub enum Command {
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
pub async fn command(config: &crate::config::Config, command: Command) -> anyhow::Result<std::process::ExitCode> {
    match command {
        Command::List { unknown, limit, json } => {
            let store = Store::open_read(config).await?;
            let kind = if unknown { Kind::OutcomeUnknown } else { Kind::Failed };
            let entries = list(&store, kind, limit).await?;
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
        Command::Retry { ids, allow_unknown, json } => {
            let store = Store::open(config).await?;
            let results = retry(&store, &ids, allow_unknown).await?;
            let out = crate::cli::Report { json };
            let mut refused = 0;
            for (id, result) in &results {
                out.line(format_args!("{id}: {result}"));
                refused += usize::from(*result != Requeue::Requeued);
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
