//! Observable events. Each is one method that logs and counts with the same
//! labels; label values are bounded (campaign names from the config, outcome
//! and error names, partition numbers), never an address or a message.
//! `/metrics` serves them, with what other processes did read from Redis at
//! scrape time (`from_redis.rs`) and the process's own figures (`process.rs`).

mod families;
mod from_redis;
mod process;

use std::time::Duration;

use prometheus::{Encoder, Registry, TextEncoder};

pub use self::from_redis::refresh;
pub(crate) use self::from_redis::{Partition, partition};
use crate::config::Config;
use crate::model::error_name::ErrorName;
use crate::model::outcome::{Outcome, Reason};
use crate::model::work::Channel;
use crate::resend::ProviderError;

/// An error's text for a log line, without the values redis-rs quotes when a reply
/// does not parse ("… (value was …)"): such a value may be a subscriber's data.
fn redacted(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    match text.find("value was") {
        Some(at) => format!("{}value withheld)", &text[..at]),
        None => text,
    }
}

/// Every metric mailstream exports.
pub struct Metrics {
    registry: Registry,
    sending: families::Sending,
    channels: families::Channels,
    inbound: families::Inbound,
    watch: families::Watch,
    /// Read from Redis at scrape time: the same on every instance.
    redis: from_redis::Gauges,
    /// Held while gauges are replaced and while the registry is gathered, so a
    /// scrape never sees half of a refresh.
    exposition: std::sync::Mutex<()>,
    /// The pause as last logged (the gauge is also set at scrape time).
    paused_logged: std::sync::atomic::AtomicBool,
}

impl Metrics {
    /// `n` deliveries of `campaign` on `channel` reached `outcome` (with a reason unless sent).
    pub fn settled(&self, campaign: &str, channel: Channel, outcome: Outcome, reason: Option<&Reason>, n: u64) {
        if n == 0 {
            return;
        }
        let (label, channel) = (reason.map_or("", Reason::label), channel.as_str());
        match reason {
            None => tracing::debug!(campaign, channel, outcome = outcome.as_str(), n, "settled"),
            Some(reason) => {
                tracing::info!(campaign, channel, outcome = outcome.as_str(), reason = reason.as_str(), n, "settled")
            }
        }
        self.sending.outcomes.with_label_values(&[campaign, channel, outcome.as_str(), label]).inc_by(n);
    }

    /// One request of the application channel answered `status` (`None`: no answer).
    pub fn app_request(&self, status: Option<u16>) {
        self.channels.app_requests.with_label_values(&[status_class(status)]).inc();
    }

    /// One request to a push service answered `status` (`None`: no answer).
    pub fn push_request(&self, status: Option<u16>) {
        self.channels.push_requests.with_label_values(&[status_class(status)]).inc();
    }

    /// A Web Push request not made: its subscription's endpoint is refused (`reason`).
    pub fn push_endpoint_refused(&self, reason: crate::model::push_endpoint::EndpointRefusal) {
        self.channels.push_endpoints_refused.with_label_values(&[reason.as_str()]).inc();
    }

    /// A Web Push subscription removed (its push service said it is gone).
    pub fn push_subscription_removed(&self) {
        self.channels.push_removed.inc();
    }

    /// Facts from the config: the objectives, the ceiling, the version.
    pub(crate) fn configure(&self, config: &Config) {
        self.watch.objective.set(config.slo.failure_rate);
        self.watch.stuck_after.set(config.stuck_after().as_secs_f64());
        self.watch.ceiling.set(f64::from(config.resend.requests_per_second) * config.resend.batch_size as f64);
        self.watch.build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        // Every series from 0, so an increase shows from the first action.
        for operation in Metrics::ADMIN_OPERATIONS {
            for result in ["done", "refused"] {
                self.admin_action(operation, result, 0);
            }
        }
        for (name, _) in config.templates.iter().filter(|(_, t)| t.fallback_from.is_some()) {
            self.sending.sender_fallbacks.with_label_values(&[name]).inc_by(0);
        }
        if config.channels.app.is_some() {
            for class in ["2xx", "3xx", "4xx", "5xx", "none"] {
                self.channels.app_requests.with_label_values(&[class]).inc_by(0);
            }
        }
        if config.channels.push.is_some() {
            for class in ["2xx", "3xx", "4xx", "5xx", "none"] {
                self.channels.push_requests.with_label_values(&[class]).inc_by(0);
            }
            for reason in crate::model::push_endpoint::EndpointRefusal::ALL {
                self.channels.push_endpoints_refused.with_label_values(&[reason.as_str()]).inc_by(0);
            }
        }
        for p in 0..config.redis.partitions {
            self.sending.unreplicated.with_label_values(&[&p.to_string()]).inc_by(0);
            self.set_unreplicated(p, false);
        }
    }

    /// One request to Resend's `endpoint` (`emails_batch`) ended after `took`,
    /// accepted or refused.
    pub(crate) fn provider_request(
        &self,
        endpoint: &'static str,
        result: Result<(), &ProviderError>,
        emails: usize,
        took: Duration,
    ) {
        let (name, action, class) = match result {
            Ok(()) => {
                tracing::debug!(emails, "batch accepted");
                ("ok", "none", "2xx")
            }
            Err(e) => {
                tracing::warn!(error = e.name.as_str(), action = e.action.as_str(), emails, "batch request failed");
                (e.name.label(), e.action.as_str(), status_class(e.status))
            }
        };
        self.sending.provider_requests.with_label_values(&[endpoint, class, name, action]).inc();
        self.sending.provider_duration.with_label_values(&[endpoint, class]).observe(took.as_secs_f64());
        self.sending.batch_emails.observe(emails as f64);
    }

    /// A request slot a batch was aimed at goes unused, for `reason`.
    pub(crate) fn slot_given_back(&self, reason: &'static str) {
        self.sending.slots_given_back.with_label_values(&[reason]).inc();
    }

    pub(crate) fn limiter_waited(&self, waited: Duration) {
        self.sending.limiter_wait.observe(waited.as_secs_f64());
    }

    pub(crate) fn retry_scheduled(&self, error: &ErrorName, attempts: u32, delay: Duration) {
        tracing::info!(error = error.as_str(), attempts, delay_ms = crate::model::ms(delay), "batch retry scheduled");
        self.sending.retries.with_label_values(&[error.label()]).inc();
    }

    /// Sending is paused (a provider quota is used up) or resumed, on every instance.
    pub(crate) fn set_paused(&self, paused: bool) {
        let was = self.paused_logged.swap(paused, std::sync::atomic::Ordering::Relaxed);
        if paused && !was {
            tracing::error!("sending paused: the provider's quota is used up; nothing is dropped");
        } else if !paused && was {
            tracing::warn!("sending resumed");
        }
        self.sending.paused.set(i64::from(paused));
    }

    /// The provider is down, or up, as this instance last saw it (scrapes read Redis).
    pub(crate) fn set_provider_down(&self, down: bool) {
        self.sending.provider_down.set(i64::from(down));
    }

    /// Operator mail of `template` was accepted from its fallback sender, after Resend
    /// refused the first one (`error`, HTTP `status`) on request `attempts`: a warning,
    /// since a fallback that works silently hides a broken domain. No address is logged.
    pub(crate) fn sender_fallback(&self, template: &str, error: &ErrorName, status: u16, attempts: u32) {
        tracing::warn!(
            template,
            class = crate::resend::Action::SenderRejected.as_str(),
            error = error.as_str(),
            status,
            attempts,
            used_fallback_sender = true,
            "Resend refused the sender of operator mail; it was sent from the template's fallback_from: \
             check the first sender's domain (verification, DKIM, SPF)"
        );
        self.sending.sender_fallbacks.with_label_values(&[template]).inc();
    }

    /// A batch of partition `p` went back unsent: its replicas did not acknowledge.
    pub(crate) fn unreplicated(&self, p: u16) {
        self.sending.unreplicated.with_label_values(&[&p.to_string()]).inc();
        self.set_unreplicated(p, true);
    }

    /// Whether this instance holds partition `p` back for its replicas (set from the
    /// batcher's state every heartbeat).
    pub(crate) fn set_unreplicated(&self, p: u16, held: bool) {
        self.sending.unreplicated_now.with_label_values(&[&p.to_string()]).set(i64::from(held));
    }

    /// A webhook request was answered: `result` is verified, duplicate, rejected or
    /// invalid; `why` says why a rejection was (a bounded name).
    pub(crate) fn webhook_request(&self, result: &'static str, why: Option<&'static str>) {
        if result == "rejected" {
            tracing::warn!(why = why.unwrap_or(""), "webhook request rejected");
        }
        self.inbound.webhook_requests.with_label_values(&[result]).inc();
    }

    /// A verified webhook event of `kind` (a bounded name).
    pub(crate) fn webhook_event(&self, kind: &'static str) {
        self.inbound.webhook_events.with_label_values(&[kind]).inc();
    }

    /// An address was suppressed (logged by reason; the address never appears).
    pub fn suppressed(&self, reason: &'static str) {
        tracing::info!(reason, "address suppressed");
        self.inbound.suppressions.with_label_values(&[reason]).inc();
    }

    /// A subscriber turned a campaign off.
    pub fn unsubscribed(&self, source: &'static str, campaign: &str) {
        tracing::info!(source, campaign, "campaign turned off by its subscriber");
        self.inbound.unsubscribes.with_label_values(&[source]).inc();
    }

    /// Webhook requests counted with `result` so far.
    pub fn webhook_requests(&self, result: &str) -> u64 {
        self.inbound.webhook_requests.with_label_values(&[result]).get()
    }

    /// Addresses suppressed so far, by reason.
    pub fn suppressions_by_reason(&self) -> std::collections::BTreeMap<String, u64> {
        crate::model::outcome::Why::ALL
            .iter()
            .map(|why| (why.as_str().to_string(), self.inbound.suppressions.with_label_values(&[why.as_str()]).get()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// A scheduled fire of `campaign` came to `result` (fired, caught_up, missed, standby).
    /// One render-hook request and its result.
    pub fn render_hook(&self, campaign: &str, result: &'static str) {
        self.inbound.render_hook_requests.with_label_values(&[campaign, result]).inc();
    }

    /// Deliveries of `campaign` deferred for want of a hook answer.
    pub(crate) fn render_hook_deferred(&self, campaign: &str, n: u64) {
        self.inbound.render_hook_deferred.with_label_values(&[campaign]).inc_by(n);
    }

    /// Items of an ingest request, by result.
    pub fn ingested(&self, result: &'static str, n: u64) {
        self.inbound.ingested.with_label_values(&[result]).inc_by(n);
    }

    /// The operations the admin pages offer (the `operation` label).
    pub(crate) const ADMIN_OPERATIONS: [&'static str; 3] = ["retry", "retry_period", "lift"];

    /// `n` deliveries or addresses an admin operation touched, by its result.
    pub(crate) fn admin_action(&self, operation: &'static str, result: &'static str, n: u64) {
        self.inbound.admin_actions.with_label_values(&[operation, result]).inc_by(n);
    }

    pub(crate) fn schedule_fire(&self, campaign: &str, result: &'static str) {
        self.watch.schedule_fires.with_label_values(&[campaign, result]).inc();
    }

    /// A campaign's latest and next fire times.
    pub(crate) fn schedule_times(
        &self,
        campaign: &str,
        last: Option<chrono::DateTime<chrono::Utc>>,
        next: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        for (g, t) in [(&self.watch.schedule_last, last), (&self.watch.schedule_next, next)] {
            if let Some(t) = t {
                g.with_label_values(&[campaign]).set(t.timestamp() as f64);
            }
        }
    }

    /// What the reclaimer's last look found stuck, as counts by (campaign, kind); it
    /// replaces the previous look (a kind of a campaign that is not given reads 0 only if
    /// the caller gives it: `stuck::by_campaign` gives every kind of every campaign).
    pub(crate) fn set_stuck<'a>(&self, by: impl IntoIterator<Item = ((&'a str, &'a str), u64)>) {
        let _exposition = self.exposition.lock().expect("exposition lock");
        self.watch.stuck.reset();
        for ((campaign, kind), n) in by {
            self.watch.stuck.with_label_values(&[campaign, kind]).set(n as i64);
        }
    }

    /// `n` deliveries were found without the record (or batch record) they should have.
    pub(crate) fn records_lost(&self, n: u64) {
        self.sending.records_lost.inc_by(n);
    }

    /// Running on a Redis that may lose acknowledged writes, by the operator's choice.
    /// This instance paces alone (the shared limiter out of reach), or no longer does.
    pub(crate) fn set_limiter_alone(&self, alone: bool) {
        self.sending.limiter_alone.set(i64::from(alone));
    }

    pub(crate) fn set_durability_relaxed(&self, relaxed: bool) {
        self.sending.durability_relaxed.set(i64::from(relaxed));
    }

    /// A Redis call failed; `op` names the step (a fixed name, never data).
    pub(crate) fn redis_error(&self, op: &'static str, error: &anyhow::Error) {
        tracing::warn!(op, error = %redacted(error), "redis call failed");
        self.count_redis_error(op);
    }

    /// A failed Redis call whose caller logs it its own way.
    pub(crate) fn count_redis_error(&self, op: &'static str) {
        self.sending.redis_errors.with_label_values(&[op]).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let families = {
            let _exposition = self.exposition.lock().expect("exposition lock");
            self.registry.gather()
        };
        let mut out = Vec::new();
        TextEncoder::new().encode(&families, &mut out).expect("text encoding cannot fail");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

/// A status code's class, a bounded label (`none`: no answer came).
fn status_class(status: Option<u16>) -> &'static str {
    match status {
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        Some(_) => "other",
        None => "none",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_do_not_carry_the_value_into_logs() {
        let e =
            anyhow::anyhow!("Incompatible type - \"Invalid UTF-8\" (value was bulk-string('ann@person.example\\xff'))");
        let line = redacted(&e);
        assert!(!line.contains("ann@person"), "{line}");
        assert!(line.contains("Invalid UTF-8") && line.contains("withheld"), "{line}");
        assert_eq!(redacted(&anyhow::anyhow!("broken pipe")), "broken pipe");
    }
}
