//! What a campaign period's counts hashes say, summed over the partitions: per channel
//! (email's hash is `counts:<campaign>:<period>`, another channel's adds `:<channel>`), and
//! the periods the partitions list.

use std::collections::BTreeMap;

use super::Store;
use crate::model::work::Channel;

/// A campaign period's counters, summed over partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub enqueued: u64,
    /// Offers of a delivery already enqueued (a second kick, a retried kick).
    pub duplicates: u64,
    pub sent: u64,
    pub failed: u64,
    pub skipped: u64,
    pub outcome_unknown: u64,
    /// Operator mail sealed again from its fallback sender (its sender refused), whatever
    /// came of it.
    pub fallbacks: u64,
    /// Emails the provider accepted and then failed (`email.failed`), as its webhooks
    /// reported them: these settled `sent`, and stay so in the counts above.
    pub provider_failed: u64,
    /// Emails the provider reported delayed after accepting them (`email.delivery_delayed`).
    pub delivery_delayed: u64,
}

impl Counts {
    /// Deliveries with a final outcome.
    pub fn settled(&self) -> u64 {
        self.sent + self.failed + self.skipped + self.outcome_unknown
    }

    /// Deliveries enqueued and not settled yet.
    pub fn pending(&self) -> u64 {
        self.enqueued.saturating_sub(self.settled())
    }

    /// Failed over decided outcomes, `failed / (sent + failed)`: skipped (not wanted),
    /// pending (not decided) and outcome_unknown (reported beside it) are outside the
    /// denominator. `None` while nothing is decided.
    pub fn failure_rate(&self) -> Option<f64> {
        let decided = self.sent + self.failed;
        (decided > 0).then(|| self.failed as f64 / decided as f64)
    }
}

impl Store {
    /// Every `(campaign, period)` enqueued within the retention, in order.
    pub async fn periods(&self) -> anyhow::Result<Vec<(String, String)>> {
        let cmds: Vec<redis::Cmd> = (0..self.keys.partitions())
            .map(|p| redis::cmd("ZRANGE").arg(self.keys.periods(p)).arg(0).arg(-1).clone())
            .collect();
        let pages: Vec<Vec<String>> = self.conn().await?.each(&cmds).await?;
        let mut all = std::collections::BTreeSet::new();
        for members in pages {
            all.extend(members.into_iter().filter_map(|m| {
                let (campaign, period) = m.split_once(':')?;
                Some((campaign.to_string(), period.to_string()))
            }));
        }
        Ok(all.into_iter().collect())
    }

    /// The email counters of `campaign` for `period`, summed over the partitions.
    pub async fn counts(&self, campaign: &str, period: &str) -> anyhow::Result<Counts> {
        self.channel_counts(campaign, period, Channel::Email).await
    }

    /// The counters of `campaign` for `period` on `channel`, summed over the partitions.
    pub async fn channel_counts(&self, campaign: &str, period: &str, channel: Channel) -> anyhow::Result<Counts> {
        Ok(self.period_figures(campaign, period, channel).await?.counts)
    }

    /// A campaign period's A/B exposures (emails of each variant the provider
    /// accepted), summed over partitions.
    pub async fn exposures(&self, campaign: &str, period: &str) -> anyhow::Result<BTreeMap<String, u64>> {
        Ok(self.period_figures(campaign, period, Channel::Email).await?.exposed)
    }

    /// Everything a campaign period's counts hashes say, from one read of each partition's.
    pub async fn period_figures(
        &self,
        campaign: &str,
        period: &str,
        channel: Channel,
    ) -> anyhow::Result<PeriodFigures> {
        let cmds: Vec<redis::Cmd> = (0..self.keys.partitions())
            .map(|p| redis::cmd("HGETALL").arg(self.keys.channel_counts(p, campaign, period, channel)).clone())
            .collect();
        let parts: Vec<std::collections::HashMap<String, u64>> = self.conn().await?.each(&cmds).await?;
        let mut f = PeriodFigures::default();
        let c = &mut f.counts;
        for part in parts {
            let get = |name: &str| part.get(name).copied().unwrap_or(0);
            c.enqueued += get("enqueued");
            c.duplicates += get("duplicates");
            c.sent += get("sent");
            c.failed += get("failed");
            c.skipped += get("skipped");
            c.outcome_unknown += get("outcome_unknown");
            c.fallbacks += get("fallbacks");
            c.provider_failed += get("provider_failed");
            c.delivery_delayed += get("delivery_delayed");
            for (field, n) in &part {
                let by = |prefix: &str| field.strip_prefix(prefix).map(str::to_string);
                if let Some(variant) = by("exposed:") {
                    *f.exposed.entry(variant).or_default() += n;
                } else if let Some(reason) = by("provider_failed:") {
                    *f.provider_failed_by_reason.entry(reason).or_default() += n;
                }
            }
        }
        Ok(f)
    }
}

/// A campaign period's counters, its A/B exposures, and the provider's failures after
/// acceptance by reason (event.lua counts them), summed over the partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeriodFigures {
    pub counts: Counts,
    pub exposed: BTreeMap<String, u64>,
    pub provider_failed_by_reason: BTreeMap<String, u64>,
}

/// The deliveries settled in one minute, summed over the partitions (the admin overview's
/// chart): what the partitions' `per_minute` hashes count (prelude.lua's `tally_minute`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Minute {
    /// Minutes since the epoch (Redis's clock).
    pub minute: i64,
    pub sent: u64,
    pub failed: u64,
    pub outcome_unknown: u64,
    pub skipped: u64,
}

impl Store {
    /// How many subscribers the registry holds (all partitions).
    pub(crate) async fn subscriber_count(&self) -> anyhow::Result<u64> {
        let cmds: Vec<redis::Cmd> =
            (0..self.keys.partitions()).map(|p| redis::cmd("SCARD").arg(self.keys.subscribers(p)).clone()).collect();
        let sizes: Vec<u64> = self.conn().await?.each(&cmds).await?;
        Ok(sizes.iter().sum())
    }

    /// The settlements of the `n` minutes up to and including `now`'s (Redis's clock),
    /// oldest first, summed over the partitions; a minute nothing settled in counts 0.
    pub async fn per_minute(&self, now: chrono::DateTime<chrono::Utc>, n: usize) -> anyhow::Result<Vec<Minute>> {
        let last = now.timestamp().div_euclid(60);
        let first = last - n as i64 + 1;
        let mut minutes: Vec<Minute> = (first..=last).map(|minute| Minute { minute, ..Minute::default() }).collect();
        let cmds: Vec<redis::Cmd> =
            (0..self.keys.partitions()).map(|p| redis::cmd("HGETALL").arg(self.keys.per_minute(p)).clone()).collect();
        let parts: Vec<std::collections::HashMap<String, u64>> = self.conn().await?.each(&cmds).await?;
        for (field, count) in parts.iter().flatten() {
            let Some((at, state)) = field.split_once(':') else { continue };
            let Some(m) = at.parse::<i64>().ok().and_then(|at| minutes.get_mut(usize::try_from(at - first).ok()?))
            else {
                continue;
            };
            match state {
                "sent" => m.sent += count,
                "failed" => m.failed += count,
                "outcome_unknown" => m.outcome_unknown += count,
                "skipped" => m.skipped += count,
                _ => {}
            }
        }
        Ok(minutes)
    }
}
