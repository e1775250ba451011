//! Key layout 8 (`mailstream upgrade` from an earlier one): every trace of a campaign
//! period's dedup that an earlier layout made expire the retention after its last write
//! gets the expiry layout 8 gives it (lua/prelude.lua, `keep_until`): never before the
//! period's kick window ends. One pass over each partition's counts hashes and settled
//! records; every write only lengthens (`PEXPIREAT … GT`, `HSETNX`, `ZADD … GT`), so a pass
//! stopped halfway is simply run again.

use anyhow::Context;
use redis::AsyncCommands;

use super::Store;
use crate::config::Config;
use crate::model::period::PeriodKind;
use crate::model::work::{Channel, DeliveryRef};

/// What a re-stamp did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restamped {
    /// Campaign periods (per partition and channel) whose kick window is now recorded.
    pub periods: u64,
    /// Settled-history buckets, counts hashes, failed and outcome_unknown records, and
    /// periods index entries given the later expiry.
    pub keys: u64,
}

/// When the kick window of `campaign`'s `period` ends (Redis-clock ms) with a window of
/// `window_secs`: by the campaign's calendar in `config`, or, for a campaign no longer there,
/// by the latest start any zone gives a period of that form (a later end keeps traces longer,
/// never shorter). `None` for a transactional day, which has no kick window (its dedup is the
/// idempotency key's guard), and for what is not a period.
fn kick_until_of(config: &Config, campaign: &str, period: &str, window_secs: u64) -> Option<u64> {
    if campaign == crate::model::work::TRANSACTIONAL {
        return None;
    }
    let start = match config.campaign(campaign) {
        Some(c) => c.period.start(period, c.tz())?,
        None => [PeriodKind::Week, PeriodKind::Day, PeriodKind::Month]
            .into_iter()
            .find_map(|kind| kind.start(period, chrono_tz::Etc::GMTPlus12))?,
    };
    Some(start.timestamp_millis().max(0) as u64 + window_secs * 1000)
}

impl Store {
    /// Re-stamps every live trace of a campaign period's dedup by `config`'s campaigns
    /// ([`kick_until_of`]); a period with no kick window keeps its traces' expiry. An index
    /// entry scored by its last enqueue (layout 7) is scored by when it is kept until: the
    /// retention after that enqueue, or its kick window's end if later.
    pub(crate) async fn restamp_dedup(&self, config: &Config) -> anyhow::Result<Restamped> {
        let window = self.kick_window_secs(config).await?;
        let kick_until = |campaign: &str, period: &str| kick_until_of(config, campaign, period, window);
        let kick_until: &dyn Fn(&str, &str) -> Option<u64> = &kick_until;
        let retention_ms = crate::model::ms(config.retention());
        let mut done = Restamped::default();
        let mut conn = self.conn().await?;
        for p in 0..self.keys.partitions() {
            let counts_prefix = self.keys.counts(p, "", "");
            let counts_prefix = counts_prefix.trim_end_matches(':');
            for key in self.scan(&format!("{}*", glob_escape(counts_prefix))).await? {
                let Some((campaign, period, channel)) = counts_name(&key[counts_prefix.len()..]) else { continue };
                let Some(until) = kick_until(campaign, period) else { continue };
                let buckets: Option<u32> = conn.hget(&key, "buckets").await?;
                let mut pipe = redis::pipe();
                pipe.hset_nx(&key, "kick_until", until).ignore();
                pipe.cmd("PEXPIREAT").arg(&key).arg(until).arg("GT").ignore();
                for n in 0..buckets.unwrap_or(0) {
                    pipe.cmd("PEXPIREAT").arg(self.keys.settled(p, campaign, period, channel, n)).arg(until).arg("GT");
                }
                let stamped: Vec<i64> = pipe.query_async(&mut conn).await.context("re-stamping a period")?;
                done.periods += 1;
                done.keys += 1 + stamped.iter().filter(|&&s| s == 1).count() as u64;
            }
            // Failed and outcome_unknown records: the only settled records that stay.
            let records = self.keys.delivery(p, "");
            for key in self.scan(&format!("{}*", glob_escape(&records))).await? {
                let Some(d) = DeliveryRef::parse(&key[records.len()..]) else { continue };
                let Some(until) = kick_until(&d.campaign, &d.period) else { continue };
                let ttl: i64 = conn.pttl(&key).await?;
                if ttl > 0 {
                    let stamped: i64 =
                        redis::cmd("PEXPIREAT").arg(&key).arg(until).arg("GT").query_async(&mut conn).await?;
                    done.keys += stamped as u64;
                }
            }
            done.keys += self.rescore_periods(&mut conn, p, kick_until, retention_ms).await?;
        }
        Ok(done)
    }

    /// Scores partition `p`'s periods index by when each period is kept until (its kick
    /// window's end, or the retention after its last enqueue if later), and keeps the
    /// index as long as its last period.
    async fn rescore_periods(
        &self,
        conn: &mut super::Conn,
        p: u16,
        kick_until: &dyn Fn(&str, &str) -> Option<u64>,
        retention_ms: u64,
    ) -> anyhow::Result<u64> {
        let index = self.keys.periods(p);
        let scored: Vec<(String, f64)> = conn.zrange_withscores(&index, 0, -1).await?;
        if scored.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        let mut last = 0u64;
        for (member, enqueued_ms) in &scored {
            let mut keep = *enqueued_ms as u64 + retention_ms;
            if let Some((campaign, period)) = member.split_once(':')
                && let Some(until) = kick_until(campaign, period)
            {
                keep = keep.max(until);
            }
            last = last.max(keep);
            pipe.cmd("ZADD").arg(&index).arg("GT").arg(keep).arg(member).ignore();
        }
        pipe.cmd("PEXPIREAT").arg(&index).arg(last).arg("GT").ignore();
        let _: () = pipe.query_async(conn).await.context("re-scoring the periods index")?;
        Ok(scored.len() as u64)
    }
}

/// `<campaign>:<period>[:<channel>]`, the tail of a counts hash's name.
fn counts_name(tail: &str) -> Option<(&str, &str, Channel)> {
    let mut parts = tail.strip_prefix(':')?.split(':');
    let (campaign, period) = (parts.next()?, parts.next()?);
    let channel = match parts.next() {
        None => Channel::Email,
        Some(c) => c.parse().ok().filter(|c| *c != Channel::Email)?,
    };
    parts.next().is_none().then_some((campaign, period, channel))
}

/// `s` with the characters special to SCAN's MATCH escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counts_hash_name_gives_its_campaign_period_and_channel() {
        assert_eq!(counts_name(":weekly:2026-W48"), Some(("weekly", "2026-W48", Channel::Email)));
        assert_eq!(counts_name(":weekly:2026-W48:app"), Some(("weekly", "2026-W48", Channel::App)));
        assert_eq!(counts_name(":weekly:2026-W48:email"), None);
        assert_eq!(counts_name(":weekly:2026-W48:app:x"), None);
        assert_eq!(counts_name("weekly:2026-W48"), None);
        assert_eq!(glob_escape("a{0}:b*[c]"), "a{0}:b\\*\\[c\\]");
    }
}
