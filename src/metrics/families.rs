//! Every family `/metrics` exports, declared and registered once: its name, help and
//! labels (what `dashboards/` and the alert rules read). The methods that count are in
//! `mod.rs`; what is read from Redis at scrape time is in `from_redis.rs`.

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use super::{Metrics, from_redis, process};

pub(super) fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register(Box::new(c.clone())).expect("unique metric");
    c
}

pub(super) fn gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register(Box::new(g.clone())).expect("unique metric");
    g
}

pub(super) fn float_gauges(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    registry.register(Box::new(g.clone())).expect("unique metric");
    g
}

pub(super) fn gauge(registry: &Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::new(name, help).expect("valid metric");
    registry.register(Box::new(g.clone())).expect("unique metric");
    g
}

pub(super) fn histogram(registry: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric");
    registry.register(Box::new(h.clone())).expect("unique metric");
    h
}

pub(super) fn int_gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric");
    registry.register(Box::new(g.clone())).expect("unique metric");
    g
}

pub(super) fn int_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    registry.register(Box::new(c.clone())).expect("unique metric");
    c
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        r.register(Box::new(process::Collector::new())).expect("unique metric");
        Metrics {
            sending: Sending::new(&r),
            channels: Channels::new(&r),
            inbound: Inbound::new(&r),
            watch: Watch::new(&r),
            redis: from_redis::Gauges::new(&r),
            exposition: std::sync::Mutex::new(()),
            paused_logged: std::sync::atomic::AtomicBool::new(false),
            registry: r,
        }
    }
}

/// Why a request slot went unused (`mailstream_request_slots_given_back_total`).
pub(super) const SLOT_REASONS: [&str; 7] =
    ["nothing_sealed", "partition_unreached", "gate_refused", "unreplicated", "slot_too_far", "stopping", "other"];

/// What the send path counts: outcomes, requests to Resend, pacing, retries, the pause and the provider's health, replicas, fallbacks, lost records, Redis errors.
pub(super) struct Sending {
    pub(super) outcomes: IntCounterVec,
    pub(super) provider_requests: IntCounterVec,
    pub(super) provider_duration: HistogramVec,
    pub(super) batch_emails: Histogram,
    pub(super) limiter_wait: Histogram,
    pub(super) slots_given_back: IntCounterVec,
    pub(super) retries: IntCounterVec,
    pub(super) paused: IntGauge,
    pub(super) provider_down: IntGauge,
    pub(super) unreplicated: IntCounterVec,
    pub(super) unreplicated_now: IntGaugeVec,
    pub(super) sender_fallbacks: IntCounterVec,
    pub(super) records_lost: IntCounter,
    pub(super) durability_relaxed: IntGauge,
    pub(super) limiter_alone: IntGauge,
    pub(super) redis_errors: IntCounterVec,
}

impl Sending {
    pub(super) fn new(r: &Registry) -> Sending {
        Sending {
            outcomes: counter(
                r,
                "mailstream_deliveries_total",
                "Deliveries settled, by channel (email, app, push), outcome (sent, skipped, failed, outcome_unknown) and \
                 reason",
                &["campaign", "channel", "outcome", "reason"],
            ),
            provider_requests: counter(
                r,
                "mailstream_provider_requests_total",
                "Requests to Resend, by endpoint, status class (2xx, 3xx, 4xx, 5xx, other, none), result (ok or the \
                 error name) and action (none, retryable, quota_exhausted, sender_rejected, fatal)",
                &["endpoint", "status_class", "result", "action"],
            ),
            provider_duration: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "mailstream_provider_request_duration_seconds",
                        "Time from writing a request to Resend to its answer (or giving up)",
                    )
                    .buckets(prometheus::exponential_buckets(0.005, 2.0, 12).expect("valid buckets")),
                    &["endpoint", "status_class"],
                )
                .expect("valid metric");
                r.register(Box::new(h.clone())).expect("unique metric");
                h
            },
            batch_emails: histogram(
                r,
                "mailstream_batch_emails",
                "Emails per batch request",
                vec![1.0, 10.0, 25.0, 50.0, 75.0, 99.0, 100.0],
            ),
            limiter_wait: histogram(
                r,
                "mailstream_limiter_wait_seconds",
                "Time a ready batch waited for a request slot",
                prometheus::exponential_buckets(0.001, 4.0, 8).expect("valid buckets"),
            ),
            slots_given_back: {
                let c = counter(
                    r,
                    "mailstream_request_slots_given_back_total",
                    "Request slots a batch was aimed at and did not use, by reason (nothing_sealed, \
                     partition_unreached, gate_refused, unreplicated, slot_too_far, stopping, other)",
                    &["reason"],
                );
                // Every reason from zero, so a rate over them is defined before the first.
                for reason in SLOT_REASONS {
                    c.with_label_values(&[reason]);
                }
                c
            },
            retries: counter(
                r,
                "mailstream_batch_retries_total",
                "Batches scheduled for another attempt, by error",
                &["error"],
            ),
            paused: int_gauge(
                r,
                "mailstream_sending_paused",
                "1 while sending is paused (provider quota exhausted); read from Redis at scrape time",
            ),
            provider_down: int_gauge(
                r,
                "mailstream_provider_down",
                "1 while the provider counts as down for every instance (a run of failures with no success between \
                 them; one request probes it at a time); read from Redis at scrape time",
            ),
            unreplicated: counter(
                r,
                "mailstream_unreplicated_batches_total",
                "Batches put back unsent because the replicas of their partition's primary did not acknowledge \
                 the last gate's write (redis.wait_replicas), by partition",
                &["partition"],
            ),
            unreplicated_now: gauges(
                r,
                "mailstream_partition_unreplicated",
                "1 while this instance holds a partition's batches back because its primary's replicas did not \
                 acknowledge the last one (tried again after a backoff of at most 8 s; 0 again once one is acknowledged, \
                 or 8 s after the last try), by partition",
                &["partition"],
            ),
            sender_fallbacks: counter(
                r,
                "mailstream_sender_fallbacks_total",
                "Operator emails sent from their template's fallback_from after Resend refused their sender \
                 (a warning: the first sender's domain is broken), by template",
                &["template"],
            ),
            records_lost: int_counter(
                r,
                "mailstream_records_lost_total",
                "Deliveries whose record or batch record was missing where one was expected (a lost write)",
            ),
            limiter_alone: int_gauge(
                r,
                "mailstream_limiter_pacing_alone",
                "1 while this instance paces its requests alone, at its share of the team's rate, because the \
                 shared limiter's Redis key cannot be reached",
            ),
            durability_relaxed: int_gauge(
                r,
                "mailstream_durability_relaxed",
                "1 when running with redis.durability = relaxed on a Redis that may lose acknowledged writes",
            ),
            redis_errors: counter(r, "mailstream_redis_errors_total", "Redis calls that failed, by operation", &["op"]),
        }
    }
}

/// The application channel's and Web Push's requests.
pub(super) struct Channels {
    pub(super) app_requests: IntCounterVec,
    pub(super) push_requests: IntCounterVec,
    pub(super) push_endpoints_refused: IntCounterVec,
    pub(super) push_removed: IntCounter,
}

impl Channels {
    pub(super) fn new(r: &Registry) -> Channels {
        Channels {
            app_requests: counter(
                r,
                "mailstream_app_requests_total",
                "Requests of the application channel, by status class (2xx, 3xx, 4xx, 5xx, none: no answer)",
                &["status_class"],
            ),
            push_requests: counter(
                r,
                "mailstream_push_requests_total",
                "Requests to push services (Web Push), by status class (2xx, 3xx, 4xx, 5xx, none: no answer)",
                &["status_class"],
            ),
            push_endpoints_refused: counter(
                r,
                "mailstream_push_endpoints_refused_total",
                "Web Push requests not made because the subscription's endpoint is not one to aim at, by reason \
                 (userinfo, host_not_allowed, address_forbidden, not_https)",
                &["reason"],
            ),
            push_removed: int_counter(
                r,
                "mailstream_push_subscriptions_removed_total",
                "Web Push subscriptions removed because their push service answered 404 or 410",
            ),
        }
    }
}

/// What comes in: webhooks, suppressions, unsubscribes, ingested items, render-hook answers, admin actions.
pub(super) struct Inbound {
    pub(super) webhook_requests: IntCounterVec,
    pub(super) webhook_events: IntCounterVec,
    pub(super) suppressions: IntCounterVec,
    pub(super) unsubscribes: IntCounterVec,
    pub(super) ingested: IntCounterVec,
    pub(super) render_hook_requests: IntCounterVec,
    pub(super) render_hook_deferred: IntCounterVec,
    pub(super) admin_actions: IntCounterVec,
}

impl Inbound {
    pub(super) fn new(r: &Registry) -> Inbound {
        Inbound {
            webhook_requests: counter(
                r,
                "mailstream_webhook_requests_total",
                "Webhook requests, by result (verified, duplicate, rejected, invalid)",
                &["result"],
            ),
            webhook_events: counter(
                r,
                "mailstream_webhook_events_total",
                "Verified webhook events, by type (delivered, bounced, ..., other)",
                &["type"],
            ),
            suppressions: counter(r, "mailstream_suppressions_total", "Addresses suppressed, by reason", &["reason"]),
            unsubscribes: counter(
                r,
                "mailstream_unsubscribes_total",
                "Campaigns turned off by a subscriber, by source (one_click)",
                &["source"],
            ),
            ingested: counter(
                r,
                "mailstream_ingest_items_total",
                "Transactional items taken by the ingest API, by result (accepted, duplicate, conflict, invalid)",
                &["result"],
            ),
            render_hook_requests: counter(
                r,
                "mailstream_render_hook_requests_total",
                "Requests to campaigns' render hooks, by result (ok, unreachable, status, garbage)",
                &["campaign", "result"],
            ),
            render_hook_deferred: counter(
                r,
                "mailstream_render_hook_deferred_total",
                "Deliveries put off because their render hook gave no answer for them",
                &["campaign"],
            ),
            admin_actions: counter(
                r,
                "mailstream_admin_actions_total",
                "Deliveries or addresses acted on from the admin pages, by operation (retry, retry_period, lift) and result (done, refused)",
                &["operation", "result"],
            ),
        }
    }
}

/// What an operator watches beside the counts: stuck deliveries, the objectives, the ceiling, the build, the schedules.
pub(super) struct Watch {
    pub(super) stuck: IntGaugeVec,
    pub(super) objective: Gauge,
    pub(super) stuck_after: Gauge,
    pub(super) ceiling: Gauge,
    pub(super) build_info: IntGaugeVec,
    pub(super) schedule_fires: IntCounterVec,
    pub(super) schedule_last: GaugeVec,
    pub(super) schedule_next: GaugeVec,
}

impl Watch {
    pub(super) fn new(r: &Registry) -> Watch {
        Watch {
            stuck: gauges(
                r,
                "mailstream_stuck_deliveries",
                "Deliveries stuck, by campaign and kind (unclaimed, lease_expired, past_deadline), from the \
                 reclaimer's last look (at most 1000 of a kind per partition)",
                &["campaign", "kind"],
            ),
            objective: gauge(
                r,
                "mailstream_slo_failure_rate_objective",
                "The failure-rate objective of every campaign period (slo.failure_rate)",
            ),
            stuck_after: gauge(
                r,
                "mailstream_slo_stuck_after_seconds",
                "How long an unread delivery waits before it counts as stuck (slo.stuck_after_seconds)",
            ),
            ceiling: gauge(
                r,
                "mailstream_ceiling_emails_per_second",
                "The most emails per second the configured rate allows (requests per second x batch size)",
            ),
            build_info: gauges(r, "mailstream_build_info", "Always 1; the running version", &["version"]),
            schedule_fires: counter(
                r,
                "mailstream_schedule_fires_total",
                "Scheduled fires, by campaign and result (fired, caught_up, missed, standby)",
                &["campaign", "result"],
            ),
            schedule_last: float_gauges(
                r,
                "mailstream_schedule_last_fire_timestamp_seconds",
                "The latest scheduled fire time at or before now, per campaign (Unix seconds)",
                &["campaign"],
            ),
            schedule_next: float_gauges(
                r,
                "mailstream_schedule_next_fire_timestamp_seconds",
                "The next scheduled fire time, per campaign (Unix seconds)",
                &["campaign"],
            ),
        }
    }
}
