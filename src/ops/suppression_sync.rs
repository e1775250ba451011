//! `mailstream suppressions sync`: Resend's own suppression list mirrored into mailstream's.
//! It walks `GET /suppressions` oldest first, each request paced by the team-wide limiter the
//! daemons use (Resend counts every request of the team). An address on the list that
//! mailstream does not suppress is suppressed as `provider_suppressed`, source `provider`,
//! cascading as a bounce does; once the walk completes, a suppression of Resend's made before
//! the sync began whose address the walk did not see is lifted (never an operator's, a
//! bounce's or a complaint's). The cursor and counts are kept after each page, so an
//! interrupted sync resumes where it stopped; `--dry-run` walks the whole list from the
//! start and writes nothing. No address reaches a log line or Redis in the clear.
//!
//! Raw Redis here: the sync's own cursor hash and its set of seen address hashes, read and
//! written a page at a time (suppressions themselves go through `audience::suppression`).

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use crate::audience::suppression::{self, Act};
use crate::config::{Config, ConfigError};
use crate::model::outcome::Why;
use crate::resend::{Client, ListedSuppression, ProviderError};
use crate::send::limiter::Limiter;
use crate::store::Store;
use crate::store::keys::Address;
use crate::store::scripts::Suppressed;

/// What a sync did, over all of its runs (a resumed sync counts from its start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SyncReport {
    /// Addresses on Resend's list that mailstream suppressed now.
    pub added: u64,
    /// Suppressions of Resend's that are no longer on its list, lifted.
    pub lifted: u64,
    /// Addresses on the list that mailstream already suppressed (for any reason).
    pub unchanged: u64,
    /// Pages read.
    pub pages: u64,
}

/// Resend or the way to it did not answer usefully, after retries (exit 69).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProviderUnreachable(pub String);

/// Entries a page asks for: Resend's most.
const PAGE: u32 = 100;

/// Tries of one page that got no answer or a 5xx before the sync stops (resumable).
const TRIES: u32 = 5;

/// 429s in a row on one page before the sync stops: another sender holds the team's rate.
const MOST_429S: u32 = 30;

/// Mirrors Resend's suppression list (see the module header); `dry_run` writes nothing.
pub async fn sync(store: &Store, config: &Config, dry_run: bool) -> anyhow::Result<SyncReport> {
    let r = &config.resend;
    let key = r.api_key.clone().ok_or_else(|| ConfigError::Invalid(vec![crate::config::NO_API_KEY.into()]))?;
    let client = Client::new(&r.base_url, key, Duration::from_secs(r.timeout_seconds))?;
    // A dry run writes nothing to Redis, not even a slot of the shared limiter: it paces
    // itself alone, at the configured rate (a sync is a hundred requests for 10,000).
    let limiter = if dry_run {
        let guard = Duration::from_millis(r.pacing_guard_ms);
        Limiter::Process(crate::send::limiter::LocalPacer::new(r.requests_per_second, guard))
    } else {
        Limiter::from_config(config, store)
    };
    let pacing = Pacing { limiter, book: tokio::sync::Mutex::new(()) };
    let mut walk = if dry_run { Walk::fresh(store).await? } else { Walk::resumed_or_fresh(store).await? };
    let mut seen_here: HashSet<String> = HashSet::new();
    if walk.resumed {
        tracing::info!(pages = walk.report.pages, "resuming an interrupted suppressions sync");
    }

    loop {
        let page = pacing.page(&client, walk.after.as_deref()).await?;
        walk.report.pages += 1;
        let listed: Vec<(&ListedSuppression, Address)> = page
            .data
            .iter()
            .filter(|s| crate::model::address::check(&s.email).is_ok())
            .map(|s| (s, store.keys.address(&s.email)))
            .collect();
        let skipped = page.data.len() - listed.len();
        if skipped > 0 {
            tracing::warn!(skipped, "entries of Resend's list that are no address, left alone");
        }
        let suppressed = already_suppressed(store, listed.iter().map(|(_, a)| a)).await?;
        // The first page of a resumed sync may have been suppressed halfway when it stopped
        // (a record written, its cascade not done): those already suppressed are suppressed
        // again, which finishes a cascade and changes nothing else.
        let finish_halfway = std::mem::take(&mut walk.resumed);
        let mut to_add = Vec::new();
        for ((s, _), already) in listed.iter().zip(&suppressed) {
            if *already && finish_halfway {
                to_add.push(s.email.clone());
            } else if *already {
                walk.report.unchanged += 1;
            } else if dry_run {
                walk.report.added += 1;
            } else {
                to_add.push(s.email.clone());
            }
        }
        for state in add_all(store, config, to_add).await? {
            match state {
                Suppressed::New => walk.report.added += 1,
                _ => walk.report.unchanged += 1,
            }
        }
        let hashes: Vec<String> = listed.iter().map(|(_, a)| a.hash.clone()).collect();
        if let Some(last) = page.data.last() {
            walk.after = Some(last.id.clone());
        }
        if dry_run {
            seen_here.extend(hashes);
        } else {
            walk.save(store, &hashes).await?;
        }
        if !page.has_more || page.data.is_empty() {
            break;
        }
    }
    walk.report.lifted = lift_the_gone(store, config, walk.started_ms, dry_run, &seen_here).await?;
    if !dry_run {
        walk.finish(store).await?;
    }
    tracing::info!(
        added = walk.report.added,
        lifted = walk.report.lifted,
        unchanged = walk.report.unchanged,
        pages = walk.report.pages,
        dry_run,
        "suppressions sync done"
    );
    Ok(walk.report)
}

/// Where a sync is: its cursor, when it began (Redis time), its counts so far.
struct Walk {
    after: Option<String>,
    started_ms: u64,
    report: SyncReport,
    resumed: bool,
}

impl Walk {
    async fn fresh(store: &Store) -> anyhow::Result<Walk> {
        let started_ms = store.time().await?.timestamp_millis().max(0) as u64;
        Ok(Walk { after: None, started_ms, report: SyncReport::default(), resumed: false })
    }

    /// The interrupted sync kept in Redis, or a new one (recorded before its first page).
    async fn resumed_or_fresh(store: &Store) -> anyhow::Result<Walk> {
        let mut conn = store.conn().await?;
        let kept: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(store.keys.suppressions_sync()).query_async(&mut conn).await?;
        let number = |f: &str| kept.get(f).and_then(|v| v.parse::<u64>().ok());
        if let Some(started_ms) = number("started_ms") {
            let report = SyncReport {
                added: number("added").unwrap_or(0),
                lifted: 0,
                unchanged: number("unchanged").unwrap_or(0),
                pages: number("pages").unwrap_or(0),
            };
            let after = kept.get("after").filter(|a| !a.is_empty()).cloned();
            return Ok(Walk { after, started_ms, report, resumed: true });
        }
        let walk = Walk::fresh(store).await?;
        let _: () = redis::cmd("DEL").arg(store.keys.suppressions_sync_seen()).query_async(&mut conn).await?;
        let _: () = redis::cmd("HSET")
            .arg(store.keys.suppressions_sync())
            .arg("started_ms")
            .arg(walk.started_ms)
            .query_async(&mut conn)
            .await?;
        Ok(walk)
    }

    /// Keeps a page's address hashes, then the cursor past it and the counts: a sync stopped
    /// before this reads the page again (each of its steps happens once all the same).
    async fn save(&self, store: &Store, hashes: &[String]) -> anyhow::Result<()> {
        let mut conn = store.conn().await?;
        if !hashes.is_empty() {
            let _: () =
                redis::cmd("SADD").arg(store.keys.suppressions_sync_seen()).arg(hashes).query_async(&mut conn).await?;
        }
        let r = &self.report;
        let _: () = redis::cmd("HSET")
            .arg(store.keys.suppressions_sync())
            .arg("after")
            .arg(self.after.as_deref().unwrap_or(""))
            .arg("added")
            .arg(r.added)
            .arg("unchanged")
            .arg(r.unchanged)
            .arg("pages")
            .arg(r.pages)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn finish(&self, store: &Store) -> anyhow::Result<()> {
        let mut conn = store.conn().await?;
        for key in [store.keys.suppressions_sync(), store.keys.suppressions_sync_seen()] {
            let _: () = redis::cmd("DEL").arg(key).query_async(&mut conn).await?;
        }
        Ok(())
    }
}

/// Whether each address has a suppression record now (of any reason).
async fn already_suppressed<'a>(
    store: &Store,
    addresses: impl Iterator<Item = &'a Address>,
) -> anyhow::Result<Vec<bool>> {
    let cmds: Vec<redis::Cmd> =
        addresses.map(|a| redis::cmd("EXISTS").arg(store.keys.suppression(a)).clone()).collect();
    if cmds.is_empty() {
        return Ok(Vec::new());
    }
    Ok(store.conn().await?.each(&cmds).await?)
}

/// Suppresses a page's new addresses as Resend's, at once; what each came to.
async fn add_all(store: &Store, config: &Config, emails: Vec<String>) -> anyhow::Result<Vec<Suppressed>> {
    let mut tasks = tokio::task::JoinSet::new();
    for email in emails {
        let (store, config) = (store.clone(), config.clone());
        tasks.spawn(async move { suppression::apply(&store, &config, &email, Act::ProviderAdd, None).await });
    }
    let mut out = Vec::new();
    while let Some(done) = tasks.join_next().await {
        out.push(done.context("a suppression task")??);
    }
    Ok(out)
}

/// Lifts (or, in a dry run, counts) each suppression of Resend's made before the sync began
/// whose address the walk did not see on Resend's list.
async fn lift_the_gone(
    store: &Store,
    config: &Config,
    started_ms: u64,
    dry_run: bool,
    seen_here: &HashSet<String>,
) -> anyhow::Result<u64> {
    let candidates: Vec<String> = suppression::list(store, None)
        .await?
        .into_iter()
        .filter(|e| e.reason == Why::ProviderSuppressed.as_str() && e.at_ms < started_ms)
        .map(|e| e.address_hash)
        .collect();
    let seen: Vec<bool> = if candidates.is_empty() {
        Vec::new()
    } else if dry_run {
        candidates.iter().map(|h| seen_here.contains(h)).collect()
    } else {
        let cmds: Vec<redis::Cmd> = candidates
            .iter()
            .map(|h| redis::cmd("SISMEMBER").arg(store.keys.suppressions_sync_seen()).arg(h).clone())
            .collect();
        store.conn().await?.each(&cmds).await?
    };
    let mut lifted = 0;
    for (hash, seen) in candidates.iter().zip(seen) {
        if seen {
            continue;
        }
        if dry_run {
            lifted += 1;
            continue;
        }
        let address = store.keys.address_of_hash(hash).context("a suppression record named by no address hash")?;
        if suppression::apply_to(store, config, address, Act::ProviderLift, None).await? == Suppressed::Removed {
            lifted += 1;
        }
    }
    Ok(lifted)
}

/// The team's request pacing, as the daemons take it.
struct Pacing {
    limiter: Limiter,
    book: tokio::sync::Mutex<()>,
}

impl Pacing {
    /// One page, at a slot of the team-wide limiter: retried after a 429 (pausing every
    /// instance as the daemon does), a 5xx or no answer (with backoff, [`TRIES`] times).
    async fn page(&self, client: &Client, after: Option<&str>) -> anyhow::Result<crate::resend::SuppressionPage> {
        let (_trigger, mut shutdown) = crate::shutdown::channel();
        let (mut failures, mut limited) = (0u32, 0u32);
        loop {
            let slot = match self.limiter.take(Duration::from_secs(3600), &mut shutdown, &self.book, || {}).await {
                Ok(slot) => slot,
                Err(_) => anyhow::bail!("no request slot from the team-wide limiter"),
            };
            let answer = client.suppressions_page(after, PAGE).await;
            self.limiter.departed(slot).await;
            let (error, rate) = match answer {
                Ok((page, rate)) => {
                    self.limiter.observe(&rate).await;
                    return Ok(page);
                }
                Err(e) => e,
            };
            self.limiter.observe(&rate).await;
            match error.status {
                Some(429) => {
                    limited += 1;
                    if limited >= MOST_429S {
                        return Err(unreachable(&error, "kept answering 429 rate_limit_exceeded").into());
                    }
                    self.limiter.pause_for(error.retry_after.unwrap_or(Duration::from_secs(1))).await;
                }
                Some(401 | 403) => {
                    return Err(ConfigError::Invalid(vec![format!(
                        "resend.api_key: Resend refused it for the suppression list ({} {})",
                        error.status.unwrap_or(0),
                        error.name
                    )])
                    .into());
                }
                Some(status) if status < 500 => {
                    anyhow::bail!(
                        "Resend refused the suppression list request: {status} {} (its Suppressions API may not be \
                         enabled for this team)",
                        error.name
                    );
                }
                _ => {
                    failures += 1;
                    if failures >= TRIES {
                        return Err(unreachable(&error, "did not answer").into());
                    }
                    tokio::time::sleep(Duration::from_millis(500) * 2u32.pow(failures - 1)).await;
                }
            }
        }
    }
}

fn unreachable(error: &ProviderError, what: &str) -> ProviderUnreachable {
    ProviderUnreachable(format!(
        "Resend {what} ({}); the sync stopped and resumes from its last page when run again",
        error.name
    ))
}
