//! Stuck deliveries, found from what Redis already indexes (never a keyspace
//! scan), one partition at a time: entries enqueued longer than
//! `slo.stuck_after_seconds` ago and still unread by the group; claims whose lease
//! ran out a whole lease ago with nobody taking them over; members of sealed
//! batches past their deadline and still unsettled. Each look reads at most
//! `LIMIT` of each kind per partition, so the counts saturate there.
//!
//! The reclaimer looks on its tick (for `/metrics`); `mailstream slo` looks once.

use std::collections::BTreeMap;

use redis::aio::ConnectionLike;

use crate::config::Config;
use crate::model::names::names;
use crate::model::work::{Channel, DeliveryRef, Lane};
use crate::store::Store;
use crate::store::records;
use crate::store::streams::{self, StreamEntry};

/// Most deliveries of one kind counted per partition per look.
const LIMIT: usize = 1000;

names! {
    /// How a delivery is stuck.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub enum StuckKind {
        /// Enqueued long ago and never read by any instance.
        Unclaimed = "unclaimed",
        /// Claimed, and its lease ran out a whole lease ago without a takeover.
        LeaseExpired = "lease_expired",
        /// Sealed into a batch that is past its deadline and not settled.
        PastDeadline = "past_deadline",
    }
}

/// The limits a look applies, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct StuckLimits {
    pub stuck_after_ms: u64,
    pub lease_ms: u64,
    pub deadline_ms: u64,
    pub maybe_sent_deadline_ms: u64,
}

impl StuckLimits {
    fn from_config(config: &Config) -> StuckLimits {
        StuckLimits {
            stuck_after_ms: crate::model::ms(config.stuck_after()),
            lease_ms: crate::model::ms(config.lease()),
            deadline_ms: crate::model::ms(config.delivery.deadline()),
            maybe_sent_deadline_ms: crate::model::ms(config.delivery.maybe_sent_deadline()),
        }
    }
}

/// Stuck deliveries counted by (campaign, period, kind).
pub type Tally = BTreeMap<(String, String, Channel, StuckKind), u64>;

/// The `tally`'s counts by (campaign, kind), every kind of each of `campaigns` included
/// (0 when none is stuck), as the metrics export them.
pub fn by_campaign<'a>(
    tally: &'a Tally,
    campaigns: impl Iterator<Item = &'a str>,
) -> BTreeMap<(&'a str, &'static str), u64> {
    let mut by = BTreeMap::new();
    for campaign in campaigns {
        for kind in StuckKind::ALL {
            by.insert((campaign, kind.as_str()), 0);
        }
    }
    for ((campaign, _, _, kind), n) in tally {
        *by.entry((campaign.as_str(), kind.as_str())).or_default() += n;
    }
    by
}

/// Adds what a look at partition `p` finds to `tally`.
pub async fn look(store: &Store, group: &str, p: u16, limits: &StuckLimits, tally: &mut Tally) -> anyhow::Result<()> {
    let mut conn = store.conn().await?;
    let now = records::now_ms(&mut conn).await?;
    let mut add = |kind: StuckKind, d: &DeliveryRef| {
        *tally.entry((d.campaign.clone(), d.period.clone(), d.channel, kind)).or_default() += 1;
    };
    // Both lanes: a receipt nobody picks up is as stuck as a digest.
    for lane in Lane::ALL {
        let stream = store.keys.lane_stream(p, lane);
        // Read once for both looks.
        let info = streams::group_info(&mut conn, &stream, group).await?;
        for d in unclaimed(&mut conn, &stream, info.as_ref(), now, limits).await? {
            add(StuckKind::Unclaimed, &d);
        }
        for d in lease_expired(&mut conn, store, &stream, group, info.as_ref(), p, now, limits).await? {
            add(StuckKind::LeaseExpired, &d);
        }
    }
    for d in past_deadline(&mut conn, store, p, now, limits).await? {
        add(StuckKind::PastDeadline, &d);
    }
    Ok(())
}

/// Looks at every partition.
pub async fn look_everywhere(store: &Store, config: &Config) -> anyhow::Result<Tally> {
    let limits = StuckLimits::from_config(config);
    let mut tally = Tally::new();
    for p in 0..store.keys.partitions() {
        look(store, &config.redis.group, p, &limits, &mut tally).await?;
    }
    Ok(tally)
}

/// Entries after the group's last-delivered id that were added before `now - stuck_after`.
async fn unclaimed(
    conn: &mut impl ConnectionLike,
    stream: &str,
    info: Option<&streams::GroupInfo>,
    now: u64,
    limits: &StuckLimits,
) -> anyhow::Result<Vec<DeliveryRef>> {
    let Some(cutoff) = now.checked_sub(limits.stuck_after_ms) else { return Ok(Vec::new()) };
    // Without the group nothing was ever read: every entry counts.
    let after = info.map(|g| g.last_delivered);
    let entries = streams::range_after(conn, stream, after, cutoff, LIMIT).await?;
    Ok(entries.into_iter().filter_map(delivery_of).collect())
}

/// Pending entries idle longer than a lease whose record says the lease ended more
/// than a lease ago (the heartbeat renews a live holder's record, not the entry).
#[allow(clippy::too_many_arguments)]
async fn lease_expired(
    conn: &mut impl ConnectionLike,
    store: &Store,
    stream: &str,
    group: &str,
    info: Option<&streams::GroupInfo>,
    p: u16,
    now: u64,
    limits: &StuckLimits,
) -> anyhow::Result<Vec<DeliveryRef>> {
    if info.is_none_or(|g| g.pending == 0) {
        return Ok(Vec::new());
    }
    let idle = streams::idle_pending(conn, (stream, group), limits.lease_ms, LIMIT).await?;
    let deliveries: Vec<DeliveryRef> = idle.into_iter().filter_map(delivery_of).collect();
    let records = records::leases(conn, &store.keys, p, &deliveries).await?;
    Ok(deliveries
        .into_iter()
        .zip(records)
        .filter(|(_, (state, until))| {
            state.as_deref() == Some("processing") && until.is_some_and(|u| u + limits.lease_ms < now)
        })
        .map(|(d, _)| d)
        .collect())
}

/// Members of unsettled batches past the deadline the last gate would apply.
async fn past_deadline(
    conn: &mut impl ConnectionLike,
    store: &Store,
    p: u16,
    now: u64,
    limits: &StuckLimits,
) -> anyhow::Result<Vec<DeliveryRef>> {
    let mut out = Vec::new();
    for b in records::batch_ages(conn, &store.keys, p, LIMIT).await? {
        let late = match b.maybe_sent {
            true => b.sealed_ms.is_some_and(|at| at + limits.maybe_sent_deadline_ms < now),
            false => b.first_sealed_ms.is_some_and(|at| at + limits.deadline_ms < now),
        };
        if late {
            out.extend(b.members);
        }
    }
    Ok(out)
}

/// The delivery a stream entry names (`delivery <id>`).
fn delivery_of((_, delivery): StreamEntry) -> Option<DeliveryRef> {
    delivery.as_deref().and_then(DeliveryRef::parse)
}
