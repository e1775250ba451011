//! `demo --channels email,app`: the campaign on several channels, with a small
//! application endpoint that verifies each event's signature and counts an event id
//! taken twice; what each channel came to.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{AppChannelConfig, Config, Secret};
use crate::db::Store;
use crate::emulator::Stats;
use crate::emulator::app::{AppEndpoint, AppStats};
use crate::work::Channel;

/// `--channels`: a comma-separated list of channels (`email`, `app`).
pub fn parse(list: &str) -> Result<Vec<Channel>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let channel: Channel = name.parse().map_err(|e: crate::names::Unknown| e.to_string())?;
        if out.contains(&channel) {
            return Err(format!("{name:?} is listed twice"));
        }
        out.push(channel);
    }
    if out.is_empty() { Err("name at least one channel".into()) } else { Ok(out) }
}

/// The application endpoint of a run, while it runs.
pub struct Endpoint {
    pub endpoint: AppEndpoint,
    stop: crate::shutdown::Trigger,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    pub async fn stop(self) {
        self.stop.trigger();
        let _ = self.task.await;
    }
}

/// Puts `channels` on `campaign` and, with the application channel, starts its endpoint
/// and points `[channels.app]` at it.
pub async fn configure(config: &mut Config, campaign: &str, channels: &[Channel]) -> anyhow::Result<Option<Endpoint>> {
    for c in config.campaigns.iter_mut().filter(|c| c.name == campaign) {
        c.channels = channels.to_vec();
    }
    if !channels.contains(&Channel::App) {
        return Ok(None);
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
    Ok(Some(Endpoint { endpoint, stop, task }))
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
    pub duplicate_sends: u64,
    /// App only: what the application endpoint saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<AppStats>,
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
