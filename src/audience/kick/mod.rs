//! The kick: fans a campaign period out over the subscriber registry (or over
//! NDJSON records given with the kick) through enqueue.lua, each (campaign,
//! subscriber, target, period) at most once however often it is kicked. A
//! registry fan-out reads each partition's audience (the entitled, subscribed,
//! unsuppressed subscribers' targets and zones, one hash entry each) and the
//! campaign's opt-outs, never the records themselves, and keeps a record
//! (fanout.lua): one holder at a time, a cursor per partition, so several
//! schedulers fan out once and a crash resumes. A dry run reads the records
//! (why each one is left out) and writes nothing.
//!
//! Raw Redis here: one read-only SMISMEMBER over a campaign's opted-out set, pipelined per page.

mod dry_run;
mod fanout;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;

use self::dry_run::read_subscribers;
pub use self::dry_run::{DryRun, KickVerdict, dry_run};
pub(crate) use self::fanout::LocalHour;
pub use self::fanout::fan_out;
use crate::audience::subscribers::{self, Subscriber};
use crate::config::{CampaignConfig, Config};
use crate::model::BadValue;
use crate::model::work::{Channel, delivery_id};
use crate::store::Store;
use crate::store::scripts::{self, Enqueued, Fanout, FanoutOf, KickWindow};

/// Deliveries per enqueue.lua call: large enough to amortize the round trip,
/// small enough that one call never blocks Redis for long.
pub const ENQUEUE_CHUNK: usize = 500;

/// What a kick did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KickReport {
    pub campaign: String,
    pub period: String,
    /// Deliveries enqueued by this kick.
    pub new: u64,
    /// Deliveries that were already enqueued for this period.
    pub duplicates: u64,
    /// Subscribers skipped because they were not entitled or had unsubscribed.
    pub not_eligible: u64,
    /// SSCAN pages read by this run.
    pub scans: u64,
    /// Continued a fan-out that had stopped halfway.
    pub resumed: bool,
    /// Stopped before the end (a test's stop, or another holder took over).
    pub abandoned: bool,
    /// Another holder (named) is fanning this period out: nothing was done.
    pub standby: Option<String>,
    /// The period was already fanned out (a scheduler does not do it again).
    pub already_done: bool,
}

impl KickReport {
    /// Adds what `other` (a kick of another part of the same period) did.
    pub fn add(&mut self, other: &KickReport) {
        self.new += other.new;
        self.duplicates += other.duplicates;
        self.not_eligible += other.not_eligible;
        self.scans += other.scans;
    }
}

/// Which periods a kick may enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PeriodRule {
    /// The current period, the previous or the next one.
    #[default]
    NearNow,
    /// Any period whose kick window is still open (`--allow-any-period`).
    AnyWithinRetention,
}

/// The words `--period` takes beside an explicit period, in the campaign's zone: the
/// period before the current one, the current one, the one after.
pub const PERIOD_WORDS: [&str; 3] = ["previous", "current", "next"];

/// The period a kick is for, judged at `now` (Redis's clock, so two kickers on either
/// side of a period boundary agree): `explicit` if given and allowed, else the current
/// one. Whether it may still be kicked at all is the kick window's to say
/// ([`open_window`]).
fn choose_period(
    campaign: &CampaignConfig,
    explicit: Option<&str>,
    rule: PeriodRule,
    now: DateTime<Utc>,
) -> anyhow::Result<String> {
    let (kind, tz) = (campaign.period, campaign.tz());
    let current = kind.period_at(now, tz);
    let Some(p) = explicit else { return Ok(current) };
    let near = [kind.previous(&current, tz), Some(current.clone()), kind.next(&current, tz)];
    let word = PERIOD_WORDS.iter().position(|w| *w == p);
    if let Some(i) = word {
        return near[i].clone().ok_or_else(|| BadValue(format!("--period {p}: there is none")).into());
    }
    if kind.start(p, tz).is_none() {
        let expected = format!("e.g. {current}, or {}", PERIOD_WORDS.join(", "));
        return Err(BadValue(format!("--period {p:?} is not a {} period ({expected})", kind.name())).into());
    }
    if rule == PeriodRule::NearNow && !near.iter().flatten().any(|n| n == p) {
        return Err(BadValue(format!(
            "--period {p} is not the current period ({current}), the one before or the one after; \
             pass --allow-any-period to kick it anyway"
        ))
        .into());
    }
    Ok(p.to_string())
}

/// `choose_period` on Redis's clock.
pub async fn period_for(
    store: &Store,
    campaign: &CampaignConfig,
    explicit: Option<&str>,
    rule: PeriodRule,
) -> anyhow::Result<String> {
    let now = store.time().await?;
    choose_period(campaign, explicit, rule, now)
}

/// A kick refused because its period's kick window has ended: the traces its dedup reads
/// may have expired, so it could send twice. Nothing was written. (A usage error: the
/// CLI exits 64.)
#[derive(Debug, thiserror::Error)]
#[error(
    "the period {period}'s dedup has expired (kept until {kept_until}): kicking it again could send twice; refused"
)]
pub struct PeriodClosed {
    pub period: String,
    /// When the window ended (RFC 3339, UTC).
    pub kept_until: String,
}

/// `campaign`'s `period` kick window with a retention of `window_secs`: the numbers
/// enqueue.lua judges a kick by (its start on the calendar, in the campaign's zone).
pub fn window_of(campaign: &CampaignConfig, period: &str, window_secs: u64) -> anyhow::Result<KickWindow> {
    let start = campaign
        .period
        .start(period, campaign.tz())
        .with_context(|| format!("{period:?} is not a {} period", campaign.period.name()))?;
    Ok(KickWindow { start_ms: start.timestamp_millis().max(0) as u64, window_secs })
}

/// `campaign`'s `period` kick window on this deployment (its retention:
/// `Store::kick_window_secs`).
pub async fn window_for(
    store: &Store,
    config: &Config,
    campaign: &CampaignConfig,
    period: &str,
) -> anyhow::Result<KickWindow> {
    window_of(campaign, period, store.kick_window_secs(config).await?)
}

/// [`window_for`], checked open on Redis's clock by the rule enqueue.lua applies
/// (window.lua, which writes nothing), with the moment it ends (Redis-clock ms): a kick asks
/// before it writes anything, so one refused with [`PeriodClosed`] leaves Redis as it was.
pub async fn open_window(
    store: &Store,
    config: &Config,
    campaign: &CampaignConfig,
    period: &str,
) -> anyhow::Result<(KickWindow, u64)> {
    let window = window_for(store, config, campaign, period).await?;
    let mut conn = store.conn().await?;
    match scripts::kick_window(&mut conn, window).await.context("window.lua")? {
        Ok(ends_ms) => Ok((window, ends_ms)),
        Err(ends_ms) => Err(closed(period, ends_ms).into()),
    }
}

/// The refusal of a kick of `period`, whose window ended at `kick_until_ms`.
fn closed(period: &str, kick_until_ms: u64) -> PeriodClosed {
    PeriodClosed { period: period.to_string(), kept_until: rfc3339_ms(kick_until_ms) }
}

/// A Redis-clock time in ms as RFC 3339 (UTC, seconds).
pub(crate) fn rfc3339_ms(ms: u64) -> String {
    let at = DateTime::from_timestamp_millis(ms as i64).unwrap_or_default();
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// How long a fan-out's holder keeps its record without recording a page.
pub(super) const FANOUT_LEASE_MS: u64 = 30_000;

/// Test and progress hooks of a fan-out.
#[derive(Clone, Default)]
pub struct FanoutOptions {
    /// Subscribers scanned so far, for a progress display.
    pub scanned: Option<Arc<AtomicU64>>,
    /// Stop after this many pages in all, as a crash would (tests of resuming).
    pub stop_after_pages: Option<u64>,
}

/// Fans `campaign` out over the whole registry for `period`, as an operator's kick:
/// through the period's fan-out record, so a kick already running elsewhere is left
/// to finish (`standby`), one that died halfway is resumed, and a finished one is
/// done again (new subscribers get theirs; the rest are duplicates).
pub async fn kick_registry(store: &Store, config: &Config, campaign: &str, period: &str) -> anyhow::Result<KickReport> {
    kick_registry_with(store, config, campaign, period, &FanoutOptions::default()).await
}

/// [`kick_registry`] with options (progress, a stop for tests).
pub(crate) async fn kick_registry_with(
    store: &Store,
    config: &Config,
    campaign: &str,
    period: &str,
    options: &FanoutOptions,
) -> anyhow::Result<KickReport> {
    let owner = crate::model::id::owner_name("kick");
    kick_with(store, config, FanoutOf { campaign, period, owner: &owner }, true, options).await
}

/// [`kick_registry`] as `owner`; `restart` says whether a finished fan-out is done
/// again (an operator's kick) or left alone (a scheduler's).
pub async fn kick_with(
    store: &Store,
    config: &Config,
    run: FanoutOf<'_>,
    restart: bool,
    options: &FanoutOptions,
) -> anyhow::Result<KickReport> {
    let mut report =
        KickReport { campaign: run.campaign.to_string(), period: run.period.to_string(), ..Default::default() };
    let c = config
        .campaign(run.campaign)
        .ok_or_else(|| BadValue(format!("no campaign {:?} in the config", run.campaign)))?;
    open_window(store, config, c, run.period).await?;
    match acquire(store, config, run, restart).await? {
        Fanout::Acquired { resumed, cursors } => fan_out(store, config, run, resumed, cursors, options).await,
        Fanout::Held { owner } => {
            report.standby = Some(owner);
            Ok(report)
        }
        Fanout::Done => {
            report.already_done = true;
            Ok(report)
        }
    }
}

/// Takes the period's fan-out record for `owner` (see [`kick_with`]).
pub(crate) async fn acquire(
    store: &Store,
    config: &Config,
    run: FanoutOf<'_>,
    restart: bool,
) -> anyhow::Result<Fanout> {
    let mut conn = store.conn().await?;
    let retention = config.retention().as_secs();
    scripts::fanout_acquire(&mut conn, &store.keys, run, FANOUT_LEASE_MS, restart, retention)
        .await
        .context("fanout.lua")
}

/// Which campaign period a kick enqueues, on which channels, and when its deliveries
/// are released.
struct Target<'a> {
    campaign: &'a str,
    period: &'a str,
    channels: &'a [Channel],
    release: Option<LocalHour>,
    window: KickWindow,
}

/// Enqueues a delivery per target of each eligible subscriber of `ids` (partition
/// `p`), at its release time, adding what happened to `report`.
async fn enqueue_eligible(
    conn: &mut crate::store::conn::Conn,
    store: &Store,
    p: u16,
    target: &Target<'_>,
    ids: &[String],
    retention: u64,
    report: &mut KickReport,
) -> anyhow::Result<()> {
    let verdicts = read_subscribers(conn, store, p, target.campaign, ids).await?;
    let mut items = Vec::new();
    // Email's own opt-out is in the verdict; each other channel's is its set's.
    let sets: Vec<Option<String>> = target
        .channels
        .iter()
        .map(|&c| (c != Channel::Email).then(|| store.keys.channel_opted_out(p, target.campaign, c)))
        .collect();
    let off = opted_out(conn, &sets, ids).await?;
    for (i, (id, verdict)) in ids.iter().zip(verdicts).enumerate() {
        match verdict {
            KickVerdict::Eligible { targets, zone } => {
                let at = target.release.map_or(0, |r| r.release_ms(zone.as_deref()));
                for (c, &channel) in target.channels.iter().enumerate() {
                    if !off[c][i] {
                        let id = |t: &String| delivery_id(target.campaign, target.period, id, t, channel);
                        items.extend(targets.iter().map(|t| (id(t), at, channel)));
                    }
                }
            }
            KickVerdict::NotEligible(_) => report.not_eligible += 1,
        }
    }
    enqueue(store, p, (target.campaign, target.period), items, (retention, target.window), report).await
}

/// Per opt-out set (`None`: none to read), which of `ids` are in it: the sets read in one
/// round trip.
pub(super) async fn opted_out(
    conn: &mut crate::store::conn::Conn,
    sets: &[Option<String>],
    ids: &[impl redis::ToRedisArgs],
) -> anyhow::Result<Vec<Vec<bool>>> {
    let mut pipe = redis::pipe();
    for key in sets.iter().flatten() {
        pipe.cmd("SMISMEMBER").arg(key).arg(ids);
    }
    let mut read: std::vec::IntoIter<Vec<bool>> = if ids.is_empty() || sets.iter().all(Option::is_none) {
        Vec::new().into_iter()
    } else {
        pipe.query_async::<Vec<Vec<bool>>>(conn).await.context("reading opt-outs")?.into_iter()
    };
    Ok(sets
        .iter()
        .map(|set| set.as_ref().and_then(|_| read.next()).unwrap_or_else(|| vec![false; ids.len()]))
        .collect())
}

/// Enqueues `items` (ids of deliveries of one campaign period in partition `p`, their
/// release times and channels) through enqueue.lua, [`ENQUEUE_CHUNK`] a call, the calls at
/// once on connections of their own (so Redis always has the next one), adding what
/// happened to `report`; refused with [`PeriodClosed`] once the period's kick window has
/// ended.
pub(super) async fn enqueue(
    store: &Store,
    p: u16,
    (campaign, period): (&str, &str),
    items: Vec<(String, u64, Channel)>,
    (retention, window): (u64, KickWindow),
    report: &mut KickReport,
) -> anyhow::Result<()> {
    let mut calls = tokio::task::JoinSet::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let chunk: Vec<(String, u64, Channel)> = items.by_ref().take(ENQUEUE_CHUNK).collect();
        let (store, campaign, period) = (store.clone(), campaign.to_string(), period.to_string());
        calls.spawn(async move {
            let mut conn = store.waited_conn().await?;
            let added =
                scripts::enqueue_ids(&mut conn, &store.keys, p, (&campaign, &period), &chunk, retention, window)
                    .await
                    .context("enqueue.lua")?;
            // Counted enqueued (and the fan-out's cursor moved past it) only once it would
            // survive a failover.
            store.durable(&mut conn, &store.keys.stream(p)).await?;
            anyhow::Ok(added)
        });
    }
    while let Some(added) = calls.join_next().await {
        let added = match added.context("enqueue task panicked")?? {
            Enqueued::Added(added) => added,
            Enqueued::Closed { kick_until_ms } => return Err(closed(period, kick_until_ms).into()),
        };
        let new = added.iter().filter(|&&a| a).count() as u64;
        report.new += new;
        report.duplicates += added.len() as u64 - new;
    }
    Ok(())
}

/// Upserts NDJSON subscriber records, then enqueues `campaign` for the eligible ones only.
pub async fn kick_list(
    store: &Store,
    config: &Config,
    campaign: &str,
    period: &str,
    subscribers: &[Subscriber],
) -> anyhow::Result<KickReport> {
    let c = config.campaign(campaign).with_context(|| format!("no campaign {campaign:?} in the config"))?;
    let (window, _) = open_window(store, config, c, period).await?;
    subscribers::upsert(store, subscribers).await?;
    let mut by_partition: Vec<Vec<String>> = vec![Vec::new(); usize::from(store.keys.partitions())];
    for s in subscribers {
        by_partition[usize::from(store.keys.partition_of(&s.id))].push(s.id.clone());
    }
    let mut report = KickReport { campaign: campaign.to_string(), period: period.to_string(), ..Default::default() };
    let mut conn = store.conn().await?;
    let retention = config.retention().as_secs();
    let release = LocalHour::of(c, store.time().await?, period)?;
    for (p, ids) in by_partition.iter().enumerate() {
        // As written a moment ago, suppressions and opt-outs included.
        for chunk in ids.chunks(ENQUEUE_CHUNK) {
            let target = Target { campaign, period, channels: &c.channels, release, window };
            enqueue_eligible(&mut conn, store, p as u16, &target, chunk, retention, &mut report).await?;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn campaign() -> CampaignConfig {
        crate::config::Config::example().campaigns[0].clone()
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn the_period_follows_the_clock_it_is_given() {
        // Two kickers reading one clock on either side of Monday 00:00 JST agree on
        // whichever side that clock is: the clock is Redis's, shared by both.
        let c = campaign();
        let before = at("2026-11-29T14:59:59Z");
        let after = at("2026-11-29T15:00:00Z");
        assert_eq!(choose_period(&c, None, PeriodRule::NearNow, before).unwrap(), "2026-W48");
        assert_eq!(choose_period(&c, None, PeriodRule::NearNow, after).unwrap(), "2026-W49");
    }

    #[test]
    fn explicit_periods_are_limited_to_near_now_unless_asked() {
        let (c, now) = (campaign(), at("2026-11-30T03:00:00Z"));
        for ok in ["2026-W48", "2026-W49", "2026-W50"] {
            assert_eq!(choose_period(&c, Some(ok), PeriodRule::NearNow, now).unwrap(), ok);
        }
        let far = choose_period(&c, Some("2026-W46"), PeriodRule::NearNow, now).unwrap_err();
        assert!(far.to_string().contains("--allow-any-period"), "{far}");
        assert!(choose_period(&c, Some("2026-W46"), PeriodRule::AnyWithinRetention, now).is_ok());
        assert!(choose_period(&c, Some("2027-W10"), PeriodRule::AnyWithinRetention, now).is_ok());
    }

    #[test]
    fn the_period_words_name_the_periods_around_now_in_the_campaign_s_zone() {
        // Monday 00:30 JST, still Sunday in UTC: "current" is Tokyo's week.
        let (c, now) = (campaign(), at("2026-11-29T15:30:00Z"));
        let named: Vec<String> =
            PERIOD_WORDS.iter().map(|w| choose_period(&c, Some(w), PeriodRule::NearNow, now).unwrap()).collect();
        assert_eq!(named, ["2026-W48", "2026-W49", "2026-W50"]);
        let bad = choose_period(&c, Some("last"), PeriodRule::NearNow, now).unwrap_err();
        assert!(
            bad.downcast_ref::<BadValue>().is_some() && bad.to_string().contains("previous, current, next"),
            "{bad}"
        );
    }

    #[test]
    fn a_malformed_period_is_refused_and_any_real_one_is_left_to_the_window() {
        let (c, now) = (campaign(), at("2026-11-30T03:00:00Z"));
        let bad = choose_period(&c, Some("2025-W53"), PeriodRule::AnyWithinRetention, now).unwrap_err();
        assert!(bad.to_string().contains("is not a week period"), "{bad}");
        // Old or not: whether it may be kicked is the kick window's to say, on Redis.
        assert!(choose_period(&c, Some("2026-W40"), PeriodRule::AnyWithinRetention, now).is_ok());
    }

    #[test]
    fn a_window_starts_at_the_period_s_first_local_midnight() {
        // 2026-W49 starts Monday 2026-11-30 00:00 in Tokyo, 2026-11-29T15:00Z.
        let w = window_of(&campaign(), "2026-W49", 35 * 86_400).unwrap();
        assert_eq!(w.start_ms, at("2026-11-29T15:00:00Z").timestamp_millis() as u64);
        assert_eq!(w.window_secs, 35 * 86_400);
        assert!(window_of(&campaign(), "2026-12", 1).is_err());
        assert_eq!(rfc3339_ms(w.start_ms), "2026-11-29T15:00:00Z");
    }
}
