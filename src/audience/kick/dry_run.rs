//! Judging subscriber records as a kick does (the records, not the audience index),
//! and the dry run that reports what a kick would do without writing anything.
//!
//! Raw Redis here: the dry run's read-only pipelines over subscriber and delivery records; it
//! writes nothing.

use std::collections::{BTreeMap, HashSet};

use anyhow::Context;
use chrono::DateTime;
use serde::Serialize;

use super::LocalHour;
use crate::audience::subscribers::{self, Unwanted, field};
use crate::config::Config;
use crate::model::work::{Channel, DeliveryRef};
use crate::store::Store;

/// What the kick makes of one subscriber record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KickVerdict {
    Eligible { targets: Vec<String>, zone: Option<String> },
    NotEligible(Unwanted),
}

/// Reads subscribers `ids` of partition `p` and judges each for `campaign`
/// (entitled, subscribed, not suppressed, not opted out). Checked here to keep the
/// ineligible out of the streams, and checked again at send time, which is what
/// guarantees it.
pub(super) async fn read_subscribers(
    conn: &mut crate::store::conn::Conn,
    store: &Store,
    p: u16,
    campaign: &str,
    ids: &[String],
) -> anyhow::Result<Vec<KickVerdict>> {
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
    type KickRow = (Option<String>, Option<String>, Option<String>, Option<String>, Option<String>, Option<String>);
    let rows: Vec<KickRow> = pipe.query_async(conn).await?;
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
                Some(why) => KickVerdict::NotEligible(why),
                None => KickVerdict::Eligible {
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
    /// Deliveries a kick would enqueue now, summed over the campaign's channels (as the
    /// kick counts them).
    pub new: u64,
    /// Deliveries already enqueued for the period, summed over the channels.
    pub already_enqueued: u64,
    /// The same count under the kick's own name for it.
    pub duplicates: u64,
    /// `new` and `duplicates` per channel of the campaign (`email`, `app`, `push`).
    pub by_channel: BTreeMap<&'static str, ChannelCounts>,
    /// Subscribers left out, by reason.
    pub not_eligible: BTreeMap<&'static str, u64>,
    /// For a local-hour campaign: new deliveries by release hour (UTC, RFC 3339).
    pub by_release_hour: BTreeMap<String, u64>,
    /// The end of the period's kick window (RFC 3339, UTC): a kick after it is refused.
    pub kick_window_ends: String,
}

/// One channel's share of a dry run.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct ChannelCounts {
    pub new: u64,
    pub duplicates: u64,
}

/// Reads the registry as a kick of `period` would, and writes nothing; refused as the kick
/// would be once the period's kick window has ended (`super::PeriodClosed`).
pub async fn dry_run(store: &Store, config: &Config, campaign: &str, period: &str) -> anyhow::Result<DryRun> {
    let c = config.campaign(campaign).with_context(|| format!("no campaign {campaign:?} in the config"))?;
    let (_, ends_ms) = super::open_window(store, config, c, period).await?;
    let release = LocalHour::of(c, store.time().await?, period)?;
    let mut out = DryRun {
        campaign: campaign.to_string(),
        period: period.to_string(),
        kick_window_ends: super::rfc3339_ms(ends_ms),
        by_channel: c.channels.iter().map(|ch| (ch.as_str(), ChannelCounts::default())).collect(),
        ..Default::default()
    };
    let mut conn = store.conn().await?;
    for p in 0..store.keys.partitions() {
        let mut cursor = 0u64;
        let mut seen = HashSet::new();
        loop {
            let (next, ids) = subscribers::registry_page(&mut conn, store, p, cursor).await?;
            let ids: Vec<String> = ids.into_iter().filter(|id| seen.insert(id.clone())).collect();
            out.subscribers += ids.len() as u64;
            let verdicts = read_subscribers(&mut conn, store, p, campaign, &ids).await?;
            // A delivery per target and channel not opted out of, as the kick enqueues.
            let sets: Vec<Option<String>> = c
                .channels
                .iter()
                .map(|&ch| (ch != Channel::Email).then(|| store.keys.channel_opted_out(p, campaign, ch)))
                .collect();
            let off = super::opted_out(&mut conn, &sets, &ids).await?;
            let mut wanted = Vec::new();
            for (i, (id, verdict)) in ids.iter().zip(verdicts).enumerate() {
                match verdict {
                    KickVerdict::Eligible { targets, zone } => {
                        let release = release.map(|r| r.release_ms(zone.as_deref()));
                        let on = c.channels.iter().enumerate().filter(|(k, _)| !off[*k][i]).map(|(_, &ch)| ch);
                        for ch in on {
                            wanted.extend(
                                targets.iter().map(|t| (DeliveryRef::new(campaign, period, id, t).on(ch), release)),
                            );
                        }
                    }
                    KickVerdict::NotEligible(why) => *out.not_eligible.entry(why.as_str()).or_default() += 1,
                }
            }
            if !wanted.is_empty() {
                let mut pipe = redis::pipe();
                for (d, _) in &wanted {
                    pipe.cmd("EXISTS").arg(store.keys.delivery(p, &d.id()));
                }
                let mut exists: Vec<bool> = pipe.query_async(&mut conn).await?;
                // Settled sent or skipped: kept compactly, without a record.
                let recordless: Vec<usize> = (0..wanted.len()).filter(|&i| !exists[i]).collect();
                let refs: Vec<DeliveryRef> = recordless.iter().map(|&i| wanted[i].0.clone()).collect();
                let kept = crate::store::history::lookup(&mut conn, &store.keys, p, &refs).await?;
                for (i, entry) in recordless.into_iter().zip(kept) {
                    exists[i] = entry.is_some();
                }
                for ((d, release), exists) in wanted.iter().zip(exists) {
                    let counts = out.by_channel.entry(d.channel.as_str()).or_default();
                    if exists {
                        counts.duplicates += 1;
                        out.already_enqueued += 1;
                        out.duplicates += 1;
                        continue;
                    }
                    counts.new += 1;
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
