//! A registry fan-out: one task per partition, a page of its audience at a time,
//! each page enqueued and then recorded with the cursor after it (fanout.lua), so a
//! run that stops resumes with the next page; and the local-hour release times.
//!
//! Raw Redis here: the fan-out's read-only pages of the audience index (HSCAN) and existence
//! checks; each page is written by fanout.lua.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use chrono::{DateTime, NaiveTime, Utc};
use chrono_tz::Tz;

use super::{FANOUT_LEASE_MS, FanoutOptions, KickReport, enqueue, opted_out};
use crate::audience::subscribers;
use crate::config::{CampaignConfig, Config};
use crate::model::work::{Channel, delivery_id};
use crate::store::Store;
use crate::store::scripts::{self, FanoutOf, FanoutPage, KickWindow};

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
        channels: c.channels.clone(),
        owner: owner.to_string(),
        retention: config.retention().as_secs(),
        window: super::window_for(store, config, c, period).await?,
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
pub(crate) struct LocalHour {
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
    pub(crate) fn release_ms(&self, zone: Option<&str>) -> u64 {
        let tz = zone.and_then(|z| z.parse::<Tz>().ok()).unwrap_or(self.default_tz);
        crate::model::period::release_at(self.at, tz, self.from, self.until).timestamp_millis().max(0) as u64
    }
}

/// One fan-out run, shared by its partition tasks.
struct Job {
    store: Store,
    campaign: String,
    period: String,
    /// The campaign's channels: a delivery each per target.
    channels: Vec<Channel>,
    owner: String,
    retention: u64,
    /// The period's kick window (enqueue.lua refuses the page once it has ended).
    window: KickWindow,
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
        let audience = keys.audience(p);
        let opt_outs: Vec<String> =
            self.channels.iter().map(|&c| keys.channel_opted_out(p, &self.campaign, c)).collect();
        let mut pipe = redis::pipe();
        pipe.scard(keys.subscribers(p)).hlen(&audience);
        opt_outs.iter().for_each(|key| {
            pipe.exists(key);
        });
        // SCARD, HLEN, then EXISTS per opt-out set: every reply an integer.
        let counted: Vec<u64> = pipe.query_async(&mut conn).await.context("counting subscribers")?;
        let (all, mailed) = (counted[0], counted[1]);
        // Read page by page only where someone opted out (looked at once per partition).
        let opt_outs: Vec<Option<String>> =
            opt_outs.into_iter().zip(&counted[2..]).map(|(key, &exists)| (exists > 0).then_some(key)).collect();
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
                let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
                let off = opted_out(&mut conn, &opt_outs, &ids).await?;
                let mut items = Vec::with_capacity(entries.len() * self.channels.len());
                for (i, (id, entry)) in entries.iter().enumerate() {
                    // Left out when every channel of the campaign is off for them.
                    if off.iter().all(|o| o[i]) {
                        page.not_eligible += 1;
                        continue;
                    }
                    let (targets, zone) = subscribers::read_audience_entry(entry);
                    let targets: Vec<&str> = targets.collect();
                    let release = self.release.map_or(0, |r| r.release_ms(zone));
                    for (c, &channel) in self.channels.iter().enumerate() {
                        if !off[c][i] {
                            let id = |t: &&str| delivery_id(&self.campaign, &self.period, id, t, channel);
                            items.extend(targets.iter().map(|t| (id(t), release, channel)));
                        }
                    }
                }
                enqueue(store, p, (&self.campaign, &self.period), items, (self.retention, self.window), &mut page)
                    .await?;
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
    conn: &mut crate::store::conn::Conn,
    key: &str,
    cursor: u64,
) -> anyhow::Result<(u64, Vec<(String, String)>)> {
    let page = redis::cmd("HSCAN").arg(key).arg(cursor).arg("COUNT").arg(1000).query_async(conn).await;
    page.context("scanning the audience")
}
