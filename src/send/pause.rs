//! Holding all sending back, team-wide, in Redis: each instance keeps a view of the
//! shared state, reread every heartbeat. Two reasons, one way of waiting (nothing is
//! dropped: batches wait sealed, deliveries wait in the streams or the queues):
//!
//! - **A quota pause** ([`Pause`]) when the provider's daily or monthly quota is used
//!   up: one key per partition with an expiry at the next quota window (so the last
//!   gate reads it in its own hash slot); it ends on its own, or at `mailstream resume`.
//! - **The provider down** ([`ProviderHealth`]): a run of failures that say nothing
//!   about a batch (no connection, timeouts, 5xx), from more than one batch, with no
//!   success between them. Then one request probes it every `probe_interval_seconds`;
//!   the first success ends it for everyone and makes every batch waiting for a retry
//!   due at once (a minute with no work to probe with ends it too).

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Datelike, TimeZone, Utc};

use crate::model::error_name::ErrorName;
use crate::resend::ProviderError;
use crate::store::Store;
use crate::store::records;
use crate::store::scripts::{self, HealthCall, HealthRule};

/// This instance's view of the shared pause.
#[derive(Default)]
pub struct Pause {
    until: Mutex<Option<SystemTime>>,
}

impl Pause {
    /// Whether sending is paused now.
    pub fn is_paused(&self) -> bool {
        self.remaining().is_some()
    }

    /// How long the pause still lasts.
    pub fn remaining(&self) -> Option<Duration> {
        let until = (*self.until.lock().expect("pause lock"))?;
        until.duration_since(SystemTime::now()).ok().filter(|d| !d.is_zero())
    }

    /// Pauses every instance until `until` (only ever extends a pause).
    pub async fn begin(&self, store: &Store, until: SystemTime, reason: &str) -> anyhow::Result<()> {
        let ms = until.duration_since(SystemTime::now()).unwrap_or_default().as_millis().max(1) as u64;
        {
            let mut local = self.until.lock().expect("pause lock");
            if local.is_none_or(|u| u < until) {
                *local = Some(until);
            }
        }
        let mut conn = store.conn().await?;
        for p in 0..store.keys.partitions() {
            crate::store::scripts::pause(&mut conn, &store.keys, p, reason, ms).await?;
        }
        Ok(())
    }

    /// Reads the shared pause (each instance does this every heartbeat).
    pub async fn refresh(&self, store: &Store) -> anyhow::Result<()> {
        let ttls = records::pauses_left_ms(store).await?;
        // -1: paused by hand without an expiry, until `mailstream resume`.
        let left = ttls
            .into_iter()
            .filter_map(|ttl| match ttl {
                -1 => Some(Duration::from_secs(3600)),
                ms if ms > 0 => Some(Duration::from_millis(ms as u64)),
                _ => None,
            })
            .max();
        *self.until.lock().expect("pause lock") = left.map(|d| SystemTime::now() + d);
        Ok(())
    }

    /// Ends the pause everywhere (`mailstream resume`); returns whether one was on.
    pub async fn resume(store: &Store) -> anyhow::Result<bool> {
        records::clear_pauses(store).await
    }
}

/// The rule `[resend]` sets for when the provider is down.
pub fn health_rule(config: &crate::config::Config) -> HealthRule {
    let r = &config.resend;
    HealthRule {
        failures: r.down_after_failures,
        window_ms: r.down_window_seconds * 1000,
        probe_interval_ms: r.probe_interval_seconds * 1000,
        // While down it is probed once an interval: a burst within one is no outage.
        min_span_ms: r.probe_interval_seconds * 1000,
    }
}

/// This instance's view of the provider's team-wide health.
pub struct ProviderHealth {
    rule: HealthRule,
    /// Since when it is down (Redis ms), as last seen.
    down_since_ms: Mutex<Option<u64>>,
}

/// A change of the provider's health made by this instance's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    Down,
    /// Back up after being down this long.
    Up(Duration),
}

impl ProviderHealth {
    pub fn new(rule: HealthRule) -> ProviderHealth {
        ProviderHealth { rule, down_since_ms: Mutex::new(None) }
    }

    /// The rule `[resend]` sets.
    pub fn from_config(config: &crate::config::Config) -> ProviderHealth {
        ProviderHealth::new(health_rule(config))
    }

    /// Whether the provider is down, as last seen.
    pub fn is_down(&self) -> bool {
        self.down_since_ms().is_some()
    }

    /// Since when the provider is down (Redis ms), as last seen.
    pub fn down_since_ms(&self) -> Option<u64> {
        *self.down_since_ms.lock().expect("health lock")
    }

    /// The longest a batch waits after an error about the provider: while it is down,
    /// one probe interval (the batch comes back to wait, to probe or to go at once);
    /// while it is up, four.
    pub fn retry_cap(&self) -> Duration {
        Duration::from_millis(self.rule.probe_interval_ms) * if self.is_down() { 1 } else { 4 }
    }

    async fn call(&self, store: &Store, call: HealthCall<'_>) -> anyhow::Result<scripts::Health> {
        let mut conn = store.conn().await?;
        let h = scripts::health(&mut conn, &store.keys, call, &self.rule).await?;
        *self.down_since_ms.lock().expect("health lock") = h.down_since_ms;
        Ok(h)
    }

    /// Records what a request of `batch` found: answered (no `failure`, or one about the
    /// batch), or a failure that says the provider is in trouble (no answer, or a 5xx).
    /// A connection that could not be made, or broke, is no batch's doing; a 5xx or a
    /// timeout may be, so a batch failing so again right after itself counts once.
    /// Returns the change this made, if any.
    pub async fn record(
        &self,
        store: &Store,
        batch: &str,
        failure: Option<&ProviderError>,
    ) -> anyhow::Result<Option<HealthChange>> {
        let before = self.down_since_ms();
        let call = match failure.filter(|e| e.says_provider_down()) {
            None => HealthCall::Succeeded,
            Some(e) if e.is_connection() => HealthCall::Failed(""),
            Some(_) => HealthCall::Failed(batch),
        };
        let h = self.call(store, call).await?;
        Ok(match (h.changed, h.down_since_ms, before) {
            (false, ..) => None,
            (true, Some(_), _) => Some(HealthChange::Down),
            (true, None, since) => {
                let now = crate::model::local_now_ms();
                Some(HealthChange::Up(Duration::from_millis(since.map_or(0, |s| now.saturating_sub(s)))))
            }
        })
    }

    /// While the provider is down: whether this instance may send one request now (the
    /// probe: at most one per interval, team-wide). True too once it is up again.
    pub async fn may_probe(&self, store: &Store) -> anyhow::Result<bool> {
        let h = self.call(store, HealthCall::Probe).await?;
        Ok(h.probe || h.down_since_ms.is_none())
    }

    /// Rereads the shared state (every heartbeat).
    pub async fn refresh(&self, store: &Store) -> anyhow::Result<()> {
        let down = scripts::provider_down_since(&mut store.conn().await?, &store.keys).await?;
        *self.down_since_ms.lock().expect("health lock") = down;
        Ok(())
    }
}

/// The provider is back: makes every batch waiting for a retry due now, in every
/// partition (transactional ones go first, as always). Returns how many.
pub async fn wake_waiting(store: &Store) -> anyhow::Result<u64> {
    let mut conn = store.conn().await?;
    let mut woken = 0;
    for p in 0..store.keys.partitions() {
        let ids = records::unsettled_batches(&mut conn, &store.keys, p, usize::MAX).await?;
        for chunk in ids.chunks(500) {
            woken += scripts::wake(&mut conn, &store.keys, p, chunk).await?;
        }
    }
    Ok(woken)
}

/// When the quota named by `error` renews: daily quotas at the next 00:00 UTC,
/// monthly ones on the 1st of next month, 00:00 UTC.
pub(crate) fn quota_renews(error: &ErrorName, now: DateTime<Utc>) -> SystemTime {
    let next = if *error == ErrorName::MonthlyQuotaExceeded {
        let (y, m) = if now.month() == 12 { (now.year() + 1, 1) } else { (now.year(), now.month() + 1) };
        Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single()
    } else {
        let tomorrow = now.date_naive().succ_opt().unwrap_or(now.date_naive());
        Utc.from_local_datetime(&tomorrow.and_hms_opt(0, 0, 0).expect("midnight exists")).single()
    };
    let next = next.unwrap_or(now + chrono::Duration::hours(24));
    UNIX_EPOCH + Duration::from_millis(next.timestamp_millis().max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_renew_at_the_next_window() {
        let now = DateTime::parse_from_rfc3339("2026-12-31T22:15:00Z").unwrap().with_timezone(&Utc);
        let at = |t: SystemTime| DateTime::<Utc>::from(t).to_rfc3339();
        assert_eq!(at(quota_renews(&ErrorName::DailyQuotaExceeded, now)), "2027-01-01T00:00:00+00:00");
        assert_eq!(at(quota_renews(&ErrorName::MonthlyQuotaExceeded, now)), "2027-01-01T00:00:00+00:00");
        let mid = DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z").unwrap().with_timezone(&Utc);
        assert_eq!(at(quota_renews(&ErrorName::MonthlyQuotaExceeded, mid)), "2026-12-01T00:00:00+00:00");
        assert_eq!(at(quota_renews(&ErrorName::DailyQuotaExceeded, mid)), "2026-11-30T00:00:00+00:00");
    }
}
