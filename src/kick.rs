//! The kick: fans a campaign period out over the subscriber registry (or over
//! NDJSON records given with the kick) through enqueue.lua, each (campaign,
//! subscriber, target, period) at most once however often it is kicked. A
//! registry fan-out reads each partition's audience (the entitled, subscribed,
//! unsuppressed subscribers' targets and zones, one hash entry each) and the
//! campaign's opt-outs, never the records themselves, and keeps a record
//! (fanout.lua): one holder at a time, a cursor per partition, so several
//! schedulers fan out once and a crash resumes. A dry run reads the records
//! (why each one is left out) and writes nothing.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use chrono::{DateTime, NaiveTime, Utc};
use chrono_tz::Tz;
use serde::Serialize;

use crate::config::{CampaignConfig, Config};
use crate::db::Store;
use crate::db::scripts::{self, Fanout, FanoutOf, FanoutPage};
use crate::subscribers::{self, Subscriber, Unwanted, field};
use crate::work::{DeliveryRef, delivery_id};

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
    fn add(&mut self, other: &KickReport) {
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
    /// Any period still within the retention (`--allow-any-period`).
    AnyWithinRetention,
}

/// The period a kick is for, judged at `now` (Redis's clock, so two kickers on either
/// side of a period boundary agree): `explicit` if given and allowed, else the current
/// one. A period that started longer than `retention` ago is refused outright: its
/// deliveries' records may have expired, so kicking it again could send twice.
pub fn choose_period(
    campaign: &CampaignConfig,
    explicit: Option<&str>,
    rule: PeriodRule,
    now: DateTime<Utc>,
    retention: std::time::Duration,
) -> anyhow::Result<String> {
    let (kind, tz) = (campaign.period, campaign.tz());
    let current = kind.period_at(now, tz);
    let Some(p) = explicit else { return Ok(current) };
    let Some(start) = kind.start(p, tz) else {
        bail!("--period {p:?} is not a {} period (expected e.g. {current})", kind.name());
    };
    let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    if start + retention <= now {
        bail!(
            "period {p} started more than delivery.retention_days ago: its deliveries' records may have \
             expired, so kicking it again could send twice; refused"
        );
    }
    let near = [kind.previous(&current, tz), Some(current.clone()), kind.next(&current, tz)];
    if rule == PeriodRule::NearNow && !near.iter().flatten().any(|n| n == p) {
        bail!(
            "--period {p} is not the current period ({current}), the one before or the one after; \
             pass --allow-any-period to kick it anyway"
        );
    }
    Ok(p.to_string())
}

/// [`choose_period`] on Redis's clock.
pub async fn period_for(
    store: &Store,
    config: &Config,
    campaign: &CampaignConfig,
    explicit: Option<&str>,
    rule: PeriodRule,
) -> anyhow::Result<String> {
    let now = store.time().await?;
    choose_period(campaign, explicit, rule, now, config.retention())
}

/// How long a fan-out's holder keeps its record without recording a page.
const FANOUT_LEASE_MS: u64 = 30_000;

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
pub async fn kick_registry_with(
    store: &Store,
    config: &Config,
    campaign: &str,
    period: &str,
    options: &FanoutOptions,
) -> anyhow::Result<KickReport> {
    let owner = crate::ctx::owner_name("kick");
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
pub async fn acquire(store: &Store, config: &Config, run: FanoutOf<'_>, restart: bool) -> anyhow::Result<Fanout> {
    let mut conn = store.conn().await?;
    let retention = config.retention().as_secs();
    scripts::fanout_acquire(&mut conn, &store.keys, run, FANOUT_LEASE_MS, restart, retention)
        .await
        .context("fanout.lua")
}

/// Fans out a period whose record `owner` acquired, from `cursors` (one per
/// partition; `None`: finished), and marks it done at the end.
pub async fn fan_out(
    store: &Store,
    config: &Config,
    run: FanoutOf<'_>,
    resumed: bool,
    cursors: Vec<Option<u64>>,
    options: &FanoutOptions,
) -> anyhow::Result<KickReport> {
    let FanoutOf { campaign, period, owner } = run;
    let c = config.campaign(campaign).with_context(|| format!("no campaign {campaign:?} in the config"))?;
    let mut report =
        KickReport { campaign: campaign.to_string(), period: period.to_string(), resumed, ..Default::default() };
    let release = LocalHour::of(c, store.time().await?, period)?;
    let job = Arc::new(Job {
        store: store.clone(),
        campaign: campaign.to_string(),
        period: period.to_string(),
        owner: owner.to_string(),
        retention: config.retention().as_secs(),
        release,
        options: options.clone(),
        pages: AtomicU64::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (p, cursor) in cursors.into_iter().enumerate() {
        if let Some(cursor) = cursor {
            let job = job.clone();
            tasks.spawn(async move { job.partition(p as u16, cursor).await });
        }
    }
    let mut complete = true;
    while let Some(done) = tasks.join_next().await {
        let part = done.context("kick task panicked")??;
        complete &= part.complete;
        report.add(&part.report);
    }
    if complete {
        let mut conn = store.conn().await?;
        scripts::fanout_finish(&mut conn, &store.keys, run).await.context("fanout.lua")?;
    } else {
        report.abandoned = true;
    }
    Ok(report)
}

/// Each delivery's release time for a campaign sent at its recipients' local hour.
#[derive(Debug, Clone, Copy)]
pub struct LocalHour {
    pub at: NaiveTime,
    /// For subscribers without a (valid) zone of their own.
    pub default_tz: Tz,
    /// The kick's time, or the period's start if later.
    pub from: DateTime<Utc>,
    /// The period's end: a local hour beyond it is released at once.
    pub until: DateTime<Utc>,
}

impl LocalHour {
    /// The release rule of `campaign` for `period` kicked at `now` (None: at once).
    pub fn of(campaign: &CampaignConfig, now: DateTime<Utc>, period: &str) -> anyhow::Result<Option<LocalHour>> {
        let Some(at) = campaign.deliver_at_local.as_deref() else { return Ok(None) };
        let at = crate::config::parse_local_time(at).context("deliver_at_local")?;
        let (kind, tz) = (campaign.period, campaign.tz());
        let start = kind.start(period, tz).with_context(|| format!("period {period} has no start"))?;
        let until = kind
            .next(period, tz)
            .and_then(|next| kind.start(&next, tz))
            .with_context(|| format!("period {period} has no end"))?;
        // Not before the kick (nothing is released before it is enqueued), nor before
        // the period starts (a period kicked ahead of time).
        Ok(Some(LocalHour { at, default_tz: tz, from: now.max(start), until }))
    }

    /// When a subscriber in `zone` (an IANA name, or none) gets theirs, in ms.
    pub fn release_ms(&self, zone: Option<&str>) -> u64 {
        let tz = zone.and_then(|z| z.parse::<Tz>().ok()).unwrap_or(self.default_tz);
        crate::period::release_at(self.at, tz, self.from, self.until).timestamp_millis().max(0) as u64
    }
}

/// One fan-out run, shared by its partition tasks.
struct Job {
    store: Store,
    campaign: String,
    period: String,
    owner: String,
    retention: u64,
    release: Option<LocalHour>,
    options: FanoutOptions,
    /// Pages recorded by this run, all partitions.
    pages: AtomicU64,
}

/// What a partition task did, and whether it reached the end of its partition.
struct PartitionRun {
    report: KickReport,
    complete: bool,
}

impl Job {
    /// Fans partition `p` out from `cursor`, a page of its audience at a time: each page
    /// is enqueued, then recorded with the cursor after it, so a run that stops resumes
    /// with the next page. The next page is read while this one is enqueued.
    async fn partition(&self, p: u16, cursor: u64) -> anyhow::Result<PartitionRun> {
        let (store, keys) = (&self.store, &self.store.keys);
        let mut conn = store.conn().await?;
        let mut report = KickReport::default();
        let (audience, opt_outs) = (keys.audience(p), keys.opted_out(p, &self.campaign));
        let (all, mailed, opted_out): (u64, u64, bool) = redis::pipe()
            .scard(keys.subscribers(p))
            .hlen(&audience)
            .exists(&opt_outs)
            .query_async(&mut conn)
            .await
            .context("counting subscribers")?;
        // The registry's subscribers outside the audience (not entitled, unsubscribed,
        // suppressed), counted once, when a partition is begun.
        let mut left_out = if cursor == 0 { all.saturating_sub(mailed) } else { 0 };
        // The audience is read on a connection of its own, while the other enqueues.
        let mut reader = store.conn().await?;
        let mut page = scan_audience(&mut reader, &audience, cursor).await?;
        loop {
            if self.options.stop_after_pages.is_some_and(|n| self.pages.load(Ordering::SeqCst) >= n) {
                return Ok(PartitionRun { report, complete: false });
            }
            let (next, entries) = page;
            report.scans += 1;
            let at = (next != 0).then_some(next);
            let prefetch = async {
                match at {
                    Some(next) => scan_audience(&mut reader, &audience, next).await.map(Some),
                    None => Ok(None),
                }
            };
            let work = async {
                // HSCAN may return an entry twice while the hash grows: enqueue.lua enqueues it
                // once, and the second is counted a duplicate (no set of every id is kept).
                let left = std::mem::take(&mut left_out);
                let scanned = entries.len() as u64 + left;
                let mut page = KickReport { not_eligible: left, ..Default::default() };
                let off: Vec<bool> = if opted_out && !entries.is_empty() {
                    let mut cmd = redis::cmd("SMISMEMBER");
                    cmd.arg(&opt_outs);
                    entries.iter().for_each(|(id, _)| {
                        cmd.arg(id);
                    });
                    cmd.query_async(&mut conn).await.context("reading opt-outs")?
                } else {
                    vec![false; entries.len()]
                };
                let mut items = Vec::with_capacity(entries.len());
                for ((id, entry), off) in entries.iter().zip(off) {
                    if off {
                        page.not_eligible += 1;
                        continue;
                    }
                    let (targets, zone) = subscribers::read_audience_entry(entry);
                    let release = self.release.map_or(0, |r| r.release_ms(zone));
                    items.extend(targets.map(|t| (delivery_id(&self.campaign, &self.period, id, t), release)));
                }
                enqueue(store, p, (&self.campaign, &self.period), items, self.retention, &mut page).await?;
                if let Some(progress) = &self.options.scanned {
                    // The left-out count as well, so a progress display reaches the registry's size.
                    progress.fetch_add(scanned, Ordering::Relaxed);
                }
                let recorded =
                    FanoutPage { new: page.new, duplicates: page.duplicates, not_eligible: page.not_eligible, scanned };
                let (campaign, period) = (self.campaign.as_str(), self.period.as_str());
                let run = FanoutOf { campaign, period, owner: &self.owner };
                let held = scripts::fanout_progress(&mut conn, keys, run, FANOUT_LEASE_MS, p, at, recorded)
                    .await
                    .context("fanout.lua")?;
                anyhow::Ok((page, held))
            };
            let (fetched, done) = tokio::join!(prefetch, work);
            let (done, held) = done?;
            self.pages.fetch_add(1, Ordering::SeqCst);
            report.add(&done);
            if !held {
                tracing::warn!(
                    campaign = self.campaign,
                    period = self.period,
                    partition = p,
                    "another holder took over this fan-out; leaving it"
                );
                return Ok(PartitionRun { report, complete: false });
            }
            match fetched? {
                Some(next_page) => page = next_page,
                None => return Ok(PartitionRun { report, complete: true }),
            }
        }
    }
}

/// One HSCAN page of a partition's audience: (next cursor, (id, entry) pairs).
async fn scan_audience(
    conn: &mut crate::db::conn::Conn,
    key: &str,
    cursor: u64,
) -> anyhow::Result<(u64, Vec<(String, String)>)> {
    let page = redis::cmd("HSCAN").arg(key).arg(cursor).arg("COUNT").arg(1000).query_async(conn).await;
    page.context("scanning the audience")
}

/// Which campaign period a kick enqueues, and when its deliveries are released.
struct Target<'a> {
    campaign: &'a str,
    period: &'a str,
    release: Option<LocalHour>,
}

/// Enqueues a delivery per target of each eligible subscriber of `ids` (partition
/// `p`), at its release time, adding what happened to `report`.
async fn enqueue_eligible(
    conn: &mut crate::db::conn::Conn,
    store: &Store,
    p: u16,
    target: &Target<'_>,
    ids: &[String],
    retention: u64,
    report: &mut KickReport,
) -> anyhow::Result<()> {
    let verdicts = read_subscribers(conn, store, p, target.campaign, ids).await?;
    let mut items = Vec::new();
    for (id, verdict) in ids.iter().zip(verdicts) {
        match verdict {
            Verdict::Eligible { targets, zone } => {
                let at = target.release.map_or(0, |r| r.release_ms(zone.as_deref()));
                items.extend(targets.iter().map(|t| (delivery_id(target.campaign, target.period, id, t), at)));
            }
            Verdict::NotEligible(_) => report.not_eligible += 1,
        }
    }
    enqueue(store, p, (target.campaign, target.period), items, retention, report).await
}

/// Enqueues `items` (ids of deliveries of one campaign period in partition `p`, and
/// their release times) through enqueue.lua, [`ENQUEUE_CHUNK`] a call, the calls at
/// once on connections of their own (so Redis always has the next one), adding what
/// happened to `report`.
async fn enqueue(
    store: &Store,
    p: u16,
    (campaign, period): (&str, &str),
    items: Vec<(String, u64)>,
    retention: u64,
    report: &mut KickReport,
) -> anyhow::Result<()> {
    let mut calls = tokio::task::JoinSet::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let chunk: Vec<(String, u64)> = items.by_ref().take(ENQUEUE_CHUNK).collect();
        let (store, campaign, period) = (store.clone(), campaign.to_string(), period.to_string());
        calls.spawn(async move {
            let mut conn = store.conn().await?;
            let added = scripts::enqueue_ids(&mut conn, &store.keys, p, &campaign, &period, &chunk, retention)
                .await
                .context("enqueue.lua")?;
            // Counted enqueued (and the fan-out's cursor moved past it) only once it would
            // survive a failover.
            store.durable(&mut conn, &store.keys.stream(p)).await?;
            anyhow::Ok(added)
        });
    }
    while let Some(added) = calls.join_next().await {
        let added = added.context("enqueue task panicked")??;
        let new = added.iter().filter(|&&a| a).count() as u64;
        report.new += new;
        report.duplicates += added.len() as u64 - new;
    }
    Ok(())
}

/// What the kick makes of one subscriber record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Eligible { targets: Vec<String>, zone: Option<String> },
    NotEligible(Unwanted),
}

/// Reads subscribers `ids` of partition `p` and judges each for `campaign`
/// (entitled, subscribed, not suppressed, not opted out). Checked here to keep the
/// ineligible out of the streams, and checked again at send time, which is what
/// guarantees it.
async fn read_subscribers(
    conn: &mut crate::db::conn::Conn,
    store: &Store,
    p: u16,
    campaign: &str,
    ids: &[String],
) -> anyhow::Result<Vec<Verdict>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    let opted_out = field::opted_out(campaign);
    for id in ids {
        let fields =
            [field::TARGETS, field::ENTITLED, field::SUBSCRIBED, field::SUPPRESSED, &opted_out, field::TIME_ZONE];
        pipe.cmd("HMGET").arg(store.keys.subscriber(p, id)).arg(&fields);
    }
    type Row = (Option<String>, Option<String>, Option<String>, Option<String>, Option<String>, Option<String>);
    let rows: Vec<Row> = pipe.query_async(conn).await?;
    Ok(rows
        .into_iter()
        .map(|(targets, entitled, subscribed, suppressed, off, zone)| {
            let why = Unwanted::of(
                entitled.is_some() || subscribed.is_some(),
                subscribers::is_set(entitled.as_deref()),
                subscribers::is_set(subscribed.as_deref()),
                suppressed.is_some(),
                off.is_some(),
            );
            match why {
                Some(why) => Verdict::NotEligible(why),
                None => Verdict::Eligible {
                    targets: subscribers::targets(targets.as_deref()).map(str::to_string).collect(),
                    zone,
                },
            }
        })
        .collect())
}

/// What a kick would do, found without writing anything.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DryRun {
    pub campaign: String,
    pub period: String,
    pub subscribers: u64,
    /// Deliveries a kick would enqueue now.
    pub new: u64,
    /// Deliveries already enqueued for the period.
    pub already_enqueued: u64,
    /// Subscribers left out, by reason.
    pub not_eligible: BTreeMap<&'static str, u64>,
    /// For a local-hour campaign: new deliveries by release hour (UTC, RFC 3339).
    pub by_release_hour: BTreeMap<String, u64>,
}

/// Reads the registry as a kick of `period` would, and writes nothing.
pub async fn dry_run(store: &Store, config: &Config, campaign: &str, period: &str) -> anyhow::Result<DryRun> {
    let c = config.campaign(campaign).with_context(|| format!("no campaign {campaign:?} in the config"))?;
    let release = LocalHour::of(c, store.time().await?, period)?;
    let mut out = DryRun { campaign: campaign.to_string(), period: period.to_string(), ..Default::default() };
    let mut conn = store.conn().await?;
    for p in 0..store.keys.partitions() {
        let mut cursor = 0u64;
        let mut seen = HashSet::new();
        loop {
            let (next, ids) = subscribers::registry_page(&mut conn, store, p, cursor).await?;
            let ids: Vec<String> = ids.into_iter().filter(|id| seen.insert(id.clone())).collect();
            out.subscribers += ids.len() as u64;
            let verdicts = read_subscribers(&mut conn, store, p, campaign, &ids).await?;
            let mut wanted = Vec::new();
            for (id, verdict) in ids.iter().zip(verdicts) {
                match verdict {
                    Verdict::Eligible { targets, zone } => {
                        let release = release.map(|r| r.release_ms(zone.as_deref()));
                        wanted.extend(targets.iter().map(|t| (DeliveryRef::new(campaign, period, id, t), release)));
                    }
                    Verdict::NotEligible(why) => *out.not_eligible.entry(why.as_str()).or_default() += 1,
                }
            }
            if !wanted.is_empty() {
                let mut pipe = redis::pipe();
                for (d, _) in &wanted {
                    pipe.cmd("EXISTS").arg(store.keys.delivery(p, &d.id()));
                }
                let exists: Vec<bool> = pipe.query_async(&mut conn).await?;
                for ((_, release), exists) in wanted.iter().zip(exists) {
                    if exists {
                        out.already_enqueued += 1;
                        continue;
                    }
                    out.new += 1;
                    if let Some(ms) = release {
                        let hour =
                            DateTime::from_timestamp_millis(*ms as i64 / 3_600_000 * 3_600_000).unwrap_or_default();
                        *out.by_release_hour.entry(hour.format("%Y-%m-%dT%H:00:00Z").to_string()).or_default() += 1;
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    Ok(out)
}

/// Upserts NDJSON subscriber records, then enqueues `campaign` for the eligible ones only.
pub async fn kick_list(
    store: &Store,
    config: &Config,
    campaign: &str,
    period: &str,
    subscribers: &[Subscriber],
) -> anyhow::Result<KickReport> {
    subscribers::upsert(store, subscribers).await?;
    let mut by_partition: Vec<Vec<String>> = vec![Vec::new(); usize::from(store.keys.partitions())];
    for s in subscribers {
        by_partition[usize::from(store.keys.partition_of(&s.id))].push(s.id.clone());
    }
    let mut report = KickReport { campaign: campaign.to_string(), period: period.to_string(), ..Default::default() };
    let mut conn = store.conn().await?;
    let retention = config.retention().as_secs();
    let c = config.campaign(campaign).with_context(|| format!("no campaign {campaign:?} in the config"))?;
    let release = LocalHour::of(c, store.time().await?, period)?;
    for (p, ids) in by_partition.iter().enumerate() {
        // As written a moment ago, suppressions and opt-outs included.
        for chunk in ids.chunks(ENQUEUE_CHUNK) {
            let target = Target { campaign, period, release };
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

    const RETENTION: std::time::Duration = std::time::Duration::from_secs(35 * 86_400);

    #[test]
    fn the_period_follows_the_clock_it_is_given() {
        // Two kickers reading one clock on either side of Monday 00:00 JST agree on
        // whichever side that clock is: the clock is Redis's, shared by both.
        let c = campaign();
        let before = at("2026-11-29T14:59:59Z");
        let after = at("2026-11-29T15:00:00Z");
        assert_eq!(choose_period(&c, None, PeriodRule::NearNow, before, RETENTION).unwrap(), "2026-W48");
        assert_eq!(choose_period(&c, None, PeriodRule::NearNow, after, RETENTION).unwrap(), "2026-W49");
    }

    #[test]
    fn explicit_periods_are_limited_to_near_now_unless_asked() {
        let (c, now) = (campaign(), at("2026-11-30T03:00:00Z"));
        for ok in ["2026-W48", "2026-W49", "2026-W50"] {
            assert_eq!(choose_period(&c, Some(ok), PeriodRule::NearNow, now, RETENTION).unwrap(), ok);
        }
        let far = choose_period(&c, Some("2026-W46"), PeriodRule::NearNow, now, RETENTION).unwrap_err();
        assert!(far.to_string().contains("--allow-any-period"), "{far}");
        assert!(choose_period(&c, Some("2026-W46"), PeriodRule::AnyWithinRetention, now, RETENTION).is_ok());
        assert!(choose_period(&c, Some("2027-W10"), PeriodRule::AnyWithinRetention, now, RETENTION).is_ok());
    }

    #[test]
    fn a_period_older_than_the_retention_is_refused_outright() {
        let (c, now) = (campaign(), at("2026-11-30T03:00:00Z"));
        let old = choose_period(&c, Some("2026-W40"), PeriodRule::AnyWithinRetention, now, RETENTION).unwrap_err();
        assert!(old.to_string().contains("refused"), "{old}");
        let bad = choose_period(&c, Some("2025-W53"), PeriodRule::AnyWithinRetention, now, RETENTION).unwrap_err();
        assert!(bad.to_string().contains("is not a week period"), "{bad}");
    }
}
