//! Observable events. Each is one method that logs and counts with the same
//! labels; label values are bounded (campaign names from the config, outcome
//! and error names), never an address or a message. `/metrics` serves them.

use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::http::{self, HttpRequest, HttpResponse};
use crate::outcome::{Outcome, Reason};
use crate::resend::{ErrorName, ProviderError};

/// An error's text for a log line, without the values redis-rs quotes when a reply
/// does not parse ("… (value was …)"): such a value may be a subscriber's data.
pub fn redacted(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    match text.find("value was") {
        Some(at) => format!("{}value withheld)", &text[..at]),
        None => text,
    }
}

/// Every metric mailstream exports.
pub struct Metrics {
    registry: Registry,
    enqueued: IntCounterVec,
    outcomes: IntCounterVec,
    provider_requests: IntCounterVec,
    batch_emails: Histogram,
    limiter_wait: Histogram,
    retries: IntCounterVec,
    paused: IntGauge,
    backlog: IntGaugeVec,
    redis_errors: IntCounterVec,
    records_lost: prometheus::IntCounter,
    durability_relaxed: IntGauge,
    webhook_requests: IntCounterVec,
    webhook_events: IntCounterVec,
    suppressions: IntCounterVec,
    unsubscribes: IntCounterVec,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register(Box::new(c.clone())).expect("unique metric");
    c
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric");
    registry.register(Box::new(h.clone())).expect("unique metric");
    h
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let paused = IntGauge::new("mailstream_sending_paused", "1 while sending is paused (provider quota exhausted)")
            .expect("valid metric");
        r.register(Box::new(paused.clone())).expect("unique metric");
        let backlog = IntGaugeVec::new(
            Opts::new(
                "mailstream_backlog",
                "Stream entries not yet read by the group, plus entries read but not acknowledged",
            ),
            &["partition", "kind"],
        )
        .expect("valid metric");
        r.register(Box::new(backlog.clone())).expect("unique metric");
        let records_lost = prometheus::IntCounter::new(
            "mailstream_records_lost_total",
            "Deliveries whose record or batch record was missing where one was expected (a lost write)",
        )
        .expect("valid metric");
        r.register(Box::new(records_lost.clone())).expect("unique metric");
        let durability_relaxed = IntGauge::new(
            "mailstream_durability_relaxed",
            "1 when running with redis.durability = relaxed on a Redis that may lose acknowledged writes",
        )
        .expect("valid metric");
        r.register(Box::new(durability_relaxed.clone())).expect("unique metric");
        Metrics {
            records_lost,
            durability_relaxed,
            webhook_requests: counter(
                &r,
                "mailstream_webhook_requests_total",
                "Webhook requests, by result (verified, duplicate, rejected, invalid)",
                &["result"],
            ),
            webhook_events: counter(
                &r,
                "mailstream_webhook_events_total",
                "Verified webhook events, by type (delivered, bounced, ..., other)",
                &["type"],
            ),
            suppressions: counter(&r, "mailstream_suppressions_total", "Addresses suppressed, by reason", &["reason"]),
            unsubscribes: counter(
                &r,
                "mailstream_unsubscribes_total",
                "Campaigns turned off by a subscriber, by source (one_click)",
                &["source"],
            ),
            enqueued: counter(
                &r,
                "mailstream_enqueued_total",
                "Deliveries offered to enqueue, by result (new, duplicate)",
                &["campaign", "result"],
            ),
            outcomes: counter(
                &r,
                "mailstream_deliveries_total",
                "Deliveries settled, by outcome (sent, skipped, failed, outcome_unknown) and reason",
                &["campaign", "outcome", "reason"],
            ),
            provider_requests: counter(
                &r,
                "mailstream_provider_requests_total",
                "Requests to Resend, by result (ok or the error name) and action",
                &["result", "action"],
            ),
            batch_emails: histogram(
                &r,
                "mailstream_batch_emails",
                "Emails per batch request",
                vec![1.0, 10.0, 25.0, 50.0, 75.0, 99.0, 100.0],
            ),
            limiter_wait: histogram(
                &r,
                "mailstream_limiter_wait_seconds",
                "Time a ready batch waited for a request slot",
                prometheus::exponential_buckets(0.001, 4.0, 8).expect("valid buckets"),
            ),
            retries: counter(
                &r,
                "mailstream_batch_retries_total",
                "Batches scheduled for another attempt, by error",
                &["error"],
            ),
            paused,
            backlog,
            redis_errors: counter(
                &r,
                "mailstream_redis_errors_total",
                "Redis calls that failed, by operation",
                &["op"],
            ),
            registry: r,
        }
    }

    pub fn enqueued(&self, campaign: &str, new: u64, duplicates: u64) {
        tracing::info!(campaign, new, duplicates, "enqueued");
        self.enqueued.with_label_values(&[campaign, "new"]).inc_by(new);
        self.enqueued.with_label_values(&[campaign, "duplicate"]).inc_by(duplicates);
    }

    /// `n` deliveries of `campaign` reached `outcome` (with a reason unless sent).
    pub fn settled(&self, campaign: &str, outcome: Outcome, reason: Option<&Reason>, n: u64) {
        if n == 0 {
            return;
        }
        let label = reason.map_or("", Reason::label);
        match reason {
            None => tracing::debug!(campaign, outcome = outcome.as_str(), n, "settled"),
            Some(reason) => {
                tracing::info!(campaign, outcome = outcome.as_str(), reason = reason.as_str(), n, "settled")
            }
        }
        self.outcomes.with_label_values(&[campaign, outcome.as_str(), label]).inc_by(n);
    }

    /// One request to Resend ended, accepted or refused.
    pub fn provider_request(&self, result: Result<(), &ProviderError>, emails: usize) {
        let (name, action) = match result {
            Ok(()) => {
                tracing::debug!(emails, "batch accepted");
                ("ok", "none")
            }
            Err(e) => {
                tracing::warn!(error = e.name.as_str(), action = e.action.as_str(), emails, "batch request failed");
                (e.name.label(), e.action.as_str())
            }
        };
        self.provider_requests.with_label_values(&[name, action]).inc();
        self.batch_emails.observe(emails as f64);
    }

    pub fn limiter_waited(&self, waited: Duration) {
        self.limiter_wait.observe(waited.as_secs_f64());
    }

    pub fn retry_scheduled(&self, error: &ErrorName, attempts: u32, delay: Duration) {
        tracing::info!(error = error.as_str(), attempts, delay_ms = delay.as_millis() as u64, "batch retry scheduled");
        self.retries.with_label_values(&[error.label()]).inc();
    }

    /// Sending is paused (a provider quota is used up) or resumed, on every instance.
    pub fn set_paused(&self, paused: bool) {
        if paused && self.paused.get() == 0 {
            tracing::error!("sending paused: the provider's quota is used up; nothing is dropped");
        } else if !paused && self.paused.get() == 1 {
            tracing::warn!("sending resumed");
        }
        self.paused.set(i64::from(paused));
    }

    pub fn backlog(&self, partition: u16, unread: u64, unacked: u64) {
        let p = partition.to_string();
        self.backlog.with_label_values(&[p.as_str(), "unread"]).set(unread as i64);
        self.backlog.with_label_values(&[p.as_str(), "unacked"]).set(unacked as i64);
    }

    /// A webhook request was answered: `result` is verified, duplicate, rejected or
    /// invalid; `why` says why a rejection was (a bounded name).
    pub fn webhook_request(&self, result: &'static str, why: Option<&'static str>) {
        if result == "rejected" {
            tracing::warn!(why = why.unwrap_or(""), "webhook request rejected");
        }
        self.webhook_requests.with_label_values(&[result]).inc();
    }

    /// A verified webhook event of `kind` (a bounded name).
    pub fn webhook_event(&self, kind: &'static str) {
        self.webhook_events.with_label_values(&[kind]).inc();
    }

    /// An address was suppressed (logged by reason; the address never appears).
    pub fn suppressed(&self, reason: &'static str) {
        tracing::info!(reason, "address suppressed");
        self.suppressions.with_label_values(&[reason]).inc();
    }

    /// A subscriber turned a campaign off.
    pub fn unsubscribed(&self, source: &'static str, campaign: &str) {
        tracing::info!(source, campaign, "campaign turned off by its subscriber");
        self.unsubscribes.with_label_values(&[source]).inc();
    }

    /// Webhook requests counted with `result` so far.
    pub fn webhook_requests(&self, result: &str) -> u64 {
        self.webhook_requests.with_label_values(&[result]).get()
    }

    /// Addresses suppressed so far, by reason.
    pub fn suppressions_by_reason(&self) -> std::collections::BTreeMap<String, u64> {
        crate::suppression::Why::ALL
            .iter()
            .map(|why| (why.as_str().to_string(), self.suppressions.with_label_values(&[why.as_str()]).get()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// `n` deliveries were found without the record (or batch record) they should have.
    pub fn lost_batch(&self, n: u64) {
        self.records_lost.inc_by(n);
    }

    /// Running on a Redis that may lose acknowledged writes, by the operator's choice.
    pub fn set_durability_relaxed(&self, relaxed: bool) {
        self.durability_relaxed.set(i64::from(relaxed));
    }

    /// A Redis call failed; `op` names the step (a fixed name, never data).
    pub fn redis_error(&self, op: &'static str, error: &anyhow::Error) {
        tracing::warn!(op, error = %redacted(error), "redis call failed");
        self.redis_errors.with_label_values(&[op]).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding cannot fail");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }

    /// The `/metrics` handler.
    pub fn handle(&self, req: &HttpRequest) -> HttpResponse {
        if req.uri().path() == "/metrics" {
            http::text(hyper::StatusCode::OK, self.render())
        } else {
            http::text(hyper::StatusCode::NOT_FOUND, "not found\n")
        }
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
