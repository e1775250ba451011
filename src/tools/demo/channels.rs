//! `demo --channels email,push,app`: the campaign on several channels, with a small
//! application endpoint that verifies each event's signature and counts an event id
//! taken twice, and a push service (the emulator's) whose browsers count a notification
//! shown twice, one subscription in ten of which is gone; what each channel came to.
//!
//! Raw Redis here: the demo's read-only look at what each channel wrote, to show it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::audience::subscribers::push::{self as subscriptions, Subscription};
use crate::config::{AppChannelConfig, Config, PushChannelConfig, Secret};
use crate::model::webpush::VapidKey;
use crate::model::work::Channel;
use crate::store::Store;
use crate::tools::emulator::Stats;
use crate::tools::emulator::app::{AppEndpoint, AppStats};
use crate::tools::emulator::push::{PushService, PushStats};

/// In the demo, one push subscription in this many answers 410 Gone.
pub const GONE_EVERY: u64 = 10;
/// And one subscriber in this many has a second browser.
const SECOND_BROWSER_EVERY: u64 = 3;

/// `--channels`: a comma-separated list of channels (`email`, `app`).
pub fn parse(list: &str) -> Result<Vec<Channel>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let channel: Channel = name.parse().map_err(|e: crate::model::names::UnknownName| e.to_string())?;
        if out.contains(&channel) {
            return Err(format!("{name:?} is listed twice"));
        }
        out.push(channel);
    }
    if out.is_empty() { Err("name at least one channel".into()) } else { Ok(out) }
}

/// A server of a run (the application endpoint, the push service), while it runs.
pub struct Serving<T> {
    pub server: T,
    stop: crate::shutdown::Trigger,
    task: tokio::task::JoinHandle<()>,
}

impl<T> Serving<T> {
    pub async fn stop(self) {
        self.stop.trigger();
        let _ = self.task.await;
    }
}

/// The far ends of the channels other than email.
#[derive(Default)]
pub struct Ends {
    pub app: Option<Serving<AppEndpoint>>,
    pub push: Option<Serving<PushService>>,
    /// The VAPID public key the push channel signs with (subscriptions are made for it).
    vapid_public: String,
}

impl Ends {
    pub async fn stop(self) {
        if let Some(app) = self.app {
            app.stop().await;
        }
        if let Some(push) = self.push {
            push.stop().await;
        }
    }

    /// With the push channel: a subscription from the push service for each subscriber
    /// (a second one for every third), registered as `subscribe --push-subscription` does.
    /// Returns how many were registered.
    pub async fn subscribe(&self, store: &Store, ids: impl Iterator<Item = String>) -> anyhow::Result<u64> {
        let Some(push) = &self.push else { return Ok(0) };
        let mut items: Vec<(String, Subscription)> = Vec::new();
        for (i, id) in ids.enumerate() {
            items.push((
                id.clone(),
                Subscription::from_value(push.server.subscribe(&self.vapid_public))
                    .expect("the emulator's subscriptions are well-formed"),
            ));
            if (i as u64).is_multiple_of(SECOND_BROWSER_EVERY) {
                items.push((
                    id,
                    Subscription::from_value(push.server.subscribe(&self.vapid_public))
                        .expect("the emulator's subscriptions are well-formed"),
                ));
            }
        }
        subscriptions::add_many(store, &items).await?;
        Ok(items.len() as u64)
    }
}

/// Puts `channels` on `campaign` and, with the application channel, starts its endpoint
/// and points `[channels.app]` at it; with Web Push, starts a push service (one
/// subscription in [`GONE_EVERY`] gone) and sets `[channels.push]` with a new VAPID key.
pub async fn configure(config: &mut Config, campaign: &str, channels: &[Channel]) -> anyhow::Result<Ends> {
    for c in config.campaigns.iter_mut().filter(|c| c.name == campaign) {
        c.channels = channels.to_vec();
    }
    let mut ends = Ends::default();
    if channels.contains(&Channel::Push) {
        let service = PushService::new();
        service.set_gone_every(GONE_EVERY);
        let (_, stop, task) = service.spawn_local().await?;
        let (private, key) = VapidKey::generate();
        ends.vapid_public = key.public;
        config.channels.push = Some(PushChannelConfig {
            ttl_seconds: 3600,
            requests_per_second_per_service: 1000,
            // The emulator's push service, on loopback: listed with its port, so plain http.
            allowed_hosts: Some(vec![service.allowed_host()]),
            ..PushChannelConfig::new("mailto:ops@example.com", Secret::new(private))
        });
        ends.push = Some(Serving { server: service, stop, task });
    }
    if !channels.contains(&Channel::App) {
        return Ok(ends);
    }
    let secret = format!(
        "whsec_{}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, rand::random::<[u8; 24]>())
    );
    let endpoint = AppEndpoint::new(&secret)?;
    let (url, stop, task) = endpoint.spawn_local().await?;
    config.channels.app = Some(AppChannelConfig {
        url,
        timeout_ms: 5000,
        concurrency: 16,
        secret_file: None,
        secret: Some(Secret::new(secret)),
    });
    ends.app = Some(Serving { server: endpoint, stop, task });
    Ok(ends)
}

/// What one channel came to.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChannelReport {
    pub enqueued: u64,
    pub sent: u64,
    pub failed: u64,
    pub skipped: u64,
    pub not_settled: u64,
    /// Email: emails the provider sent twice. App: event ids the application took twice.
    /// Push: notifications a browser was shown twice (one tag, one subscription).
    pub duplicate_sends: u64,
    /// App only: what the application endpoint saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<AppStats>,
    /// Push only: deliveries skipped because no subscription was left to take them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_subscription: Option<u64>,
    /// Push only: subscriptions removed because their push service said they are gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gone_removed: Option<u64>,
    /// Push only: what the push service and its browsers saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push_service: Option<PushStats>,
}

/// What the push channel's run left: how many of the registered subscriptions are gone
/// from the registry now, and how many deliveries were skipped for having none.
pub struct PushRun {
    pub registered: u64,
    pub stats: PushStats,
}

/// (subscriptions removed, deliveries skipped `no_subscription`) of a period, read from
/// the registry and the period's settled history.
async fn push_outcomes(store: &Store, campaign: &str, period: &str, registered: u64) -> anyhow::Result<(u64, u64)> {
    let keys = &store.keys;
    let mut left = 0u64;
    let mut skipped = 0u64;
    let mut conn = store.conn().await?;
    for p in 0..keys.partitions() {
        let mut cursor = 0u64;
        loop {
            let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(keys.push_subscriptions(p, "*"))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            for key in found {
                let n: u64 = redis::cmd("HLEN").arg(key).query_async(&mut conn).await?;
                left += n;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let buckets = crate::store::history::buckets(&mut conn, keys, p, campaign, period, Channel::Push).await?;
        for n in 0..buckets.unwrap_or(0) {
            let entries = crate::store::history::bucket(&mut conn, keys, p, campaign, period, Channel::Push, n).await?;
            skipped += entries.iter().filter(|(_, e)| e.detail.as_deref() == Some("no_subscription")).count() as u64;
        }
    }
    Ok((registered.saturating_sub(left), skipped))
}

/// Whether every channel of `campaign`'s `period` other than email is settled.
pub async fn others_settled(store: &Store, campaign: &str, period: &str, channels: &[Channel]) -> anyhow::Result<bool> {
    for &channel in channels.iter().filter(|c| **c != Channel::Email) {
        let c = store.channel_counts(campaign, period, channel).await?;
        if c.settled() < c.enqueued {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Each channel's report.
pub async fn report(
    store: &Store,
    (campaign, period): (&str, &str),
    channels: &[Channel],
    provider: &Stats,
    app: Option<&AppStats>,
    push: Option<&PushRun>,
) -> anyhow::Result<BTreeMap<String, ChannelReport>> {
    let mut out = BTreeMap::new();
    for &channel in channels {
        let c = store.channel_counts(campaign, period, channel).await?;
        let mut r = ChannelReport {
            enqueued: c.enqueued,
            sent: c.sent,
            failed: c.failed,
            skipped: c.skipped,
            not_settled: c.pending(),
            ..Default::default()
        };
        match channel {
            Channel::Email => r.duplicate_sends = provider.duplicate_sends,
            Channel::App => {
                r.duplicate_sends = app.map_or(0, |a| a.duplicates);
                r.endpoint = app.copied();
            }
            Channel::Push => {
                if let Some(push) = push {
                    let (removed, none) = push_outcomes(store, campaign, period, push.registered).await?;
                    r.duplicate_sends = push.stats.duplicates;
                    r.gone_removed = Some(removed);
                    r.no_subscription = Some(none);
                    r.push_service = Some(push.stats);
                }
            }
        }
        out.insert(channel.as_str().to_string(), r);
    }
    Ok(out)
}

/// The problems the channels' reports show (each one line).
pub fn problems(channels: &BTreeMap<String, ChannelReport>) -> Vec<String> {
    let mut p = Vec::new();
    for (name, r) in channels {
        if r.not_settled > 0 {
            p.push(format!("{}: {} deliveries were not settled", name, r.not_settled));
        }
        if r.duplicate_sends > 0 {
            p.push(format!("{}: {} sent twice", name, r.duplicate_sends));
        }
        if let Some(e) = &r.endpoint {
            if e.rejected > 0 {
                p.push(format!("{name}: the application rejected {} signatures", e.rejected));
            }
            if e.taken != r.sent {
                p.push(format!("{name}: the application took {} events but {} are recorded as sent", e.taken, r.sent));
            }
        }
        if let Some(s) = &r.push_service {
            if s.rejected + s.malformed > 0 {
                p.push(format!(
                    "{name}: the push service refused {} requests as forged or malformed",
                    s.rejected + s.malformed
                ));
            }
            if s.gone > 0 && r.gone_removed == Some(0) {
                p.push(format!(
                    "{name}: the push service answered 410 {} times but no subscription was removed",
                    s.gone
                ));
            }
        }
    }
    p
}

/// One summary line per channel.
pub fn summary(
    out: &mut (dyn std::io::Write + Send),
    channels: &BTreeMap<String, ChannelReport>,
) -> std::io::Result<()> {
    for (name, r) in channels {
        write!(
            out,
            "  channel {name}: {} enqueued, {} sent, {} failed, {} skipped, {} not settled, {} duplicates",
            r.enqueued, r.sent, r.failed, r.skipped, r.not_settled, r.duplicate_sends
        )?;
        if let Some(e) = &r.endpoint {
            write!(out, " (application: {} requests, {} signatures rejected)", e.received, e.rejected)?;
        }
        if let (Some(none), Some(removed)) = (r.no_subscription, r.gone_removed) {
            write!(out, " ({none} with no subscription left, {removed} gone subscriptions removed)")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_read_strictly() {
        assert_eq!(parse("email,app"), Ok(vec![Channel::Email, Channel::App]));
        assert_eq!(parse(" app "), Ok(vec![Channel::App]));
        assert!(parse("email,email").is_err());
        assert!(parse("email,fax").unwrap_err().contains("fax"));
        assert!(parse("").is_err());
    }
}
