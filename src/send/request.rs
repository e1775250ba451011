//! One provider request: POST a batch that passed its last gate with its sealed
//! key and body, then settle what the provider answered or plan what follows a
//! failure (`plan`: retry after a backoff, pause for a quota, or give up), and
//! report what it said about pacing back to the dispatcher. A refused sender may fall
//! back once (`fallback.rs`); what became of the batch is recorded by `settle.rs`.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use chrono::Utc;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::config::{Config, ConfigError};
use crate::model::error_name::ErrorName;
use crate::model::outcome::{Failpoint, Outcome, Reason};
use crate::model::work::Sealed;
use crate::resend::{AcceptedEmail, Action, Client, ProviderError, RateHeaders};
use crate::send::ctx::Ctx;
use crate::send::fallback::{self, FellBack};
use crate::send::pause::{HealthChange, quota_renews};
use crate::send::retry::RetryPolicy;
use crate::send::settle::{self, QUOTA_RECHECK};
use crate::store::scripts::{Reschedule, Settler, Verdict};

/// What the provider said about pacing, for the limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PacingNews {
    pub rate: RateHeaders,
    /// A 429 `rate_limit_exceeded` asked every request to wait this long.
    pub pause: Option<Duration>,
    /// The request was the first on a new connection (or got no answer): it may have
    /// reached the provider later than its bytes left, so its departure is recorded
    /// again, now.
    pub late_arrival: bool,
}

/// The `endpoint` label of `POST /emails/batch`.
const BATCH_ENDPOINT: &str = "emails_batch";

/// Sends sealed batches and records what became of them.
pub(crate) struct Sender {
    client: Client,
    retry: RetryPolicy,
    rng: Mutex<StdRng>,
    /// Where requests go (for the log lines of the provider's health).
    base_url: String,
}

impl Sender {
    pub fn new(client: Client, retry: RetryPolicy, rng: StdRng, base_url: &str) -> Sender {
        Sender { client, retry, rng: Mutex::new(rng), base_url: base_url.to_string() }
    }

    /// The sender `config` describes; `seed` fixes the retry jitter (tests).
    pub(crate) fn from_config(config: &Config, seed: Option<u64>) -> anyhow::Result<Sender> {
        Sender::with_timeout(config, seed, Duration::from_secs(config.resend.timeout_seconds))
    }

    /// [`Sender::from_config`], its requests giving up after `timeout` (the model's walks:
    /// shorter than the config's whole seconds).
    pub(crate) fn with_timeout(config: &Config, seed: Option<u64>, timeout: Duration) -> anyhow::Result<Sender> {
        let r = &config.resend;
        let key = r.api_key.clone().ok_or_else(|| ConfigError::Invalid(vec![crate::config::NO_API_KEY.into()]))?;
        let client = Client::new(&r.base_url, key, timeout)?;
        let rng = seed.map_or_else(rand::make_rng, StdRng::seed_from_u64);
        Ok(Sender::new(client, RetryPolicy::from_config(&config.delivery), rng, &r.base_url))
    }

    /// Sends a batch that passed the last gate (the caller has just taken its slot) and
    /// records what happened; `on_wire` is told when the request's bytes can go out.
    /// Returns what the provider said about pacing and, when Resend refused the sender of
    /// operator mail and it was sealed again from its fallback sender, that batch: the
    /// caller sends it at the next slot (no backoff: nothing of it was sent).
    pub async fn attempt(
        &self,
        ctx: &Ctx,
        b: Sealed,
        on_wire: tokio::sync::oneshot::Sender<()>,
    ) -> (PacingNews, Option<Sealed>) {
        ctx.failpoints.at(Failpoint::Gated).await;
        let started = std::time::Instant::now();
        let emails = b.members.len();
        let (answer, late_arrival) =
            self.client.send_batch_telling(&b.key, b.body.clone(), emails, Some(on_wire)).await;
        let took = started.elapsed();
        ctx.failpoints.at(Failpoint::Answered).await;
        // A fallback request's record says which refusal it follows (read before it settles).
        let refusal = fallback::refusal_of(ctx, &b).await;
        let news = match &answer {
            Ok(accepted) => {
                self.health(ctx, &b.id, None).await;
                ctx.metrics.provider_request(BATCH_ENDPOINT, Ok(()), emails, took);
                PacingNews { rate: accepted.rate, pause: None, late_arrival }
            }
            Err((e, rate)) => {
                ctx.metrics.provider_request(BATCH_ENDPOINT, Err(e), emails, took);
                self.health(ctx, &b.id, Some(e)).await;
                let pause = e.retry_after.filter(|_| e.name == ErrorName::RateLimitExceeded);
                PacingNews { rate: *rate, pause, late_arrival }
            }
        };
        // Permissive validation may report a refused sender per email: for a request of one
        // email, that is the request refused, and nothing of it was sent. (Settled as an
        // answer when it does not fall back: a 200 is this request's, or a replay of the
        // first one's, so 'failed' is true of it.)
        let refused_in_200 = answer.as_ref().ok().and_then(|accepted| refused_sender(&accepted.items));
        let refused = match &answer {
            Ok(_) => refused_in_200.as_ref(),
            Err((e, _)) => Some(e),
        };
        if let Some(e) = refused {
            match fallback::try_after(ctx, &b, e, refusal.as_ref()).await {
                FellBack::Sealed(again) => return (news, Some(again)),
                FellBack::Unknown => return (news, None),
                FellBack::No => {}
            }
        }
        match answer {
            Ok(accepted) => self.accepted(ctx, &b, &accepted.items, refusal).await,
            Err((e, _)) => self.failed(ctx, b, e, refusal).await,
        }
        (news, None)
    }

    /// Records the provider's answer to a request of `b`, item by item (`refusal`: the
    /// one `b` is the fallback of).
    async fn accepted(
        &self,
        ctx: &Ctx,
        b: &Sealed,
        items: &[AcceptedEmail],
        refusal: Option<fallback::ProviderRefusal>,
    ) {
        // A fallback refused too records the refusal it followed.
        let invalid = refusal.as_ref().map_or(ErrorName::ValidationError, |r| r.error.clone());
        let (verdicts, said): (Vec<Verdict>, Vec<Option<&str>>) = items
            .iter()
            .map(|item| match item {
                AcceptedEmail::Sent(id) => (Verdict::Sent(id.clone()), None),
                AcceptedEmail::Invalid(said) => (Verdict::Failed(Reason::Provider(invalid.clone())), said.as_deref()),
            })
            .unzip();
        let any_sent = verdicts.iter().any(|v| matches!(v, Verdict::Sent(_)));
        settle::record(ctx, b.partition, &b.id, &b.members, Settler::Answer, verdicts, &said).await;
        if let Some(r) = refusal.filter(|_| any_sent) {
            ctx.metrics.sender_fallback(&r.template, &r.error, r.status, b.tries + 1);
        }
    }

    /// Records what a request said of the provider's health, team-wide; logs a change
    /// once (here, where it was made) and, when the provider is back, makes every
    /// waiting batch due at once.
    async fn health(&self, ctx: &Ctx, batch: &str, failure: Option<&ProviderError>) {
        match ctx.health.record(&ctx.store, batch, failure).await {
            Ok(Some(HealthChange::Down)) => tracing::error!(
                base_url = %self.base_url,
                failures = ctx.config.resend.down_after_failures,
                probe_interval_seconds = ctx.config.resend.probe_interval_seconds,
                "Resend is down (failures with no success between them): every instance holds its batches, \
                 sealed, and one probes it at a time; nothing is dropped, deadlines keep counting"
            ),
            Ok(Some(HealthChange::Up(after))) => {
                let woken = crate::send::pause::wake_waiting(&ctx.store).await;
                if let Err(e) = &woken {
                    ctx.metrics.redis_error("wake", e);
                }
                tracing::warn!(
                    base_url = %self.base_url,
                    down_seconds = after.as_secs(),
                    batches_due_now = woken.unwrap_or(0),
                    "Resend is back: every waiting batch is due now"
                );
            }
            Ok(None) => {}
            Err(e) => ctx.metrics.redis_error("health", &e),
        }
        ctx.metrics.set_provider_down(ctx.health.is_down());
    }

    /// Acts on a failed request of `b` that did not fall back (`refusal`: the one it is
    /// the fallback of): retries it later, pauses for a quota, or settles it.
    async fn failed(&self, ctx: &Ctx, b: Sealed, e: ProviderError, refusal: Option<fallback::ProviderRefusal>) {
        let next = {
            let mut rng = self.rng.lock().expect("rng lock");
            plan(&e, b.tries, b.maybe_sent, &self.retry, ctx.health.retry_cap(), &mut *rng, Utc::now())
        };
        // A fallback that is given up records the refusal it followed.
        let error = match (&next, refusal) {
            (Plan::Settle(_), Some(r)) => Reason::Provider(r.error),
            _ => Reason::Provider(e.name.clone()),
        };
        match next {
            Plan::Retry { delay } => {
                // What this holder knows of earlier requests counts too: a failover may have
                // taken the record's mark back.
                let r = Reschedule {
                    delay_ms: crate::model::ms(delay),
                    failed_request: true,
                    maybe_sent: e.maybe_sent || b.maybe_sent,
                    error,
                    said: e.said.clone(),
                };
                settle::reschedule(ctx, b.partition, &b.id, &r).await;
                ctx.metrics.retry_scheduled(&e.name, b.tries + 1, delay);
            }
            Plan::PauseUntil(until) => {
                if let Err(err) = ctx.pause.begin(&ctx.store, until, e.name.as_str()).await {
                    ctx.metrics.redis_error("pause", &err);
                }
                ctx.metrics.set_paused(true);
                // Due again almost at once, but no instance takes a batch while paused: it
                // goes out as soon as the pause ends, by expiry or `mailstream resume`.
                let r = Reschedule {
                    delay_ms: crate::model::ms(QUOTA_RECHECK),
                    failed_request: true,
                    maybe_sent: b.maybe_sent,
                    error,
                    said: e.said.clone(),
                };
                settle::reschedule(ctx, b.partition, &b.id, &r).await;
            }
            Plan::Settle(outcome) => {
                let verdict = if outcome == Outcome::Failed { Verdict::Failed(error) } else { Verdict::Unknown(error) };
                settle::record_all(ctx, &b, verdict, e.said.as_deref()).await;
            }
        }
    }
}

/// The refusal of a request of one email whose answer (permissive validation: a 200)
/// refused that email for its sender, as the error of the request.
fn refused_sender(items: &[AcceptedEmail]) -> Option<ProviderError> {
    let [AcceptedEmail::Invalid(said)] = items else { return None };
    let e = ProviderError::from_response(200, Some("validation_error"), said.as_deref().unwrap_or(""), None);
    (e.action == Action::SenderRejected).then_some(e)
}

/// What to do after a failed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Resend the same sealed batch (same key, same body) after `delay`; the last gate
    /// ends it at its deadline.
    Retry { delay: Duration },
    /// Every instance stops sending until the quota renews; the batch waits, sealed.
    PauseUntil(SystemTime),
    /// No point retrying: settle every member with this outcome.
    Settle(Outcome),
}

/// Decides what follows a failure of a batch that had failed `tries_before` times,
/// `maybe_sent_before` telling whether any earlier request may have been processed.
/// Pure, with the clock and randomness passed in. Retryable errors are retried
/// without a count: a batch ends at its deadline, so an outage delays mail. An error
/// about the provider rather than the batch is the team's to watch (`pause.rs`): the
/// batch's own backoff for it stops at `provider_cap` (a `retry-after` still a floor),
/// so retries a long outage piled up never hold it minutes once the provider is back.
fn plan(
    e: &ProviderError,
    tries_before: u32,
    maybe_sent_before: bool,
    policy: &RetryPolicy,
    provider_cap: Duration,
    rng: &mut impl rand::RngExt,
    now: chrono::DateTime<Utc>,
) -> Plan {
    match e.action {
        Action::Retryable => {
            let delay = policy.after_failure(tries_before + 1, e.retry_after, rng);
            let delay = if e.says_provider_down() {
                delay.min(provider_cap).max(e.retry_after.unwrap_or_default())
            } else {
                delay
            };
            Plan::Retry { delay }
        }
        Action::QuotaExhausted => Plan::PauseUntil(quota_renews(&e.name, now)),
        // A refusal now does not prove an earlier attempt was refused too (an API key
        // rotated in between is refused before the idempotency store is consulted).
        Action::SenderRejected | Action::Fatal if e.maybe_sent || maybe_sent_before => {
            Plan::Settle(Outcome::OutcomeUnknown)
        }
        Action::SenderRejected | Action::Fatal => Plan::Settle(Outcome::Failed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy { base: Duration::from_secs(1), max: Duration::from_secs(60) }
    }

    fn now() -> chrono::DateTime<Utc> {
        chrono::DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn answer(status: u16, name: &str) -> ProviderError {
        ProviderError::from_response(status, Some(name), "", None)
    }

    fn decide(e: &ProviderError, tries_before: u32, maybe_before: bool) -> Plan {
        plan(e, tries_before, maybe_before, &policy(), Duration::MAX, &mut StdRng::seed_from_u64(5), now())
    }

    #[test]
    fn an_error_about_the_provider_backs_off_at_most_the_cap() {
        let cap = Duration::from_secs(4);
        let at = |e: &ProviderError| plan(e, 40, true, &policy(), cap, &mut StdRng::seed_from_u64(5), now());
        assert_eq!(at(&ProviderError::local(ErrorName::Timeout, true)), Plan::Retry { delay: cap });
        assert_eq!(at(&answer(500, "internal_server_error")), Plan::Retry { delay: cap });
        // Not the provider's trouble: the batch's own backoff.
        assert!(matches!(at(&answer(409, "concurrent_idempotent_requests")), Plan::Retry { delay } if delay > cap));
    }

    #[test]
    fn a_timeout_is_retried_with_growing_backoff_and_no_count() {
        let timeout = ProviderError::local(ErrorName::Timeout, true);
        assert!(matches!(decide(&timeout, 0, false), Plan::Retry { delay } if delay <= Duration::from_secs(1)));
        assert!(matches!(decide(&timeout, 1, true), Plan::Retry { delay } if delay <= Duration::from_secs(2)));
        // However often: the last gate ends a batch at its deadline, not after a count.
        assert!(matches!(decide(&timeout, 500, true), Plan::Retry { delay } if delay <= Duration::from_secs(60)));
    }

    #[test]
    fn an_unreachable_provider_is_retried_for_as_long_as_it_takes() {
        let refused = ProviderError::local(ErrorName::ConnectionFailed, false);
        for tries in [0, 8, 100, 10_000] {
            assert!(matches!(decide(&refused, tries, false), Plan::Retry { .. }), "{tries}");
        }
    }

    #[test]
    fn a_429_waits_at_least_its_retry_after() {
        let e = ProviderError::from_response(429, Some("rate_limit_exceeded"), "", Some(Duration::from_secs(9)));
        assert_eq!(decide(&e, 0, false), Plan::Retry { delay: Duration::from_secs(9) });
        assert!(matches!(decide(&e, 40, false), Plan::Retry { delay } if delay >= Duration::from_secs(30)));
    }

    #[test]
    fn a_concurrent_request_waits_and_retries_the_same_batch() {
        let e = answer(409, "concurrent_idempotent_requests");
        assert!(matches!(decide(&e, 0, false), Plan::Retry { .. }));
        assert!(matches!(decide(&e, 9, true), Plan::Retry { .. }));
    }

    #[test]
    fn fatal_and_sender_rejected_end_at_once_without_a_sleep() {
        for e in [answer(422, "invalid_parameter"), answer(403, "invalid_api_key"), answer(422, "invalid_from_address")]
        {
            assert_eq!(decide(&e, 0, false), Plan::Settle(Outcome::Failed), "{e}");
            // After an attempt that may have been processed, nobody can say it was not.
            assert_eq!(decide(&e, 1, true), Plan::Settle(Outcome::OutcomeUnknown), "{e}");
        }
        let garbled = ProviderError::local(ErrorName::UnexpectedResponse, true);
        assert_eq!(decide(&garbled, 0, false), Plan::Settle(Outcome::OutcomeUnknown));
    }

    #[test]
    fn a_lone_email_refused_for_its_sender_in_a_200_is_the_request_refused() {
        let refused = Some("The acme.example domain is not verified. Please, add and verify your domain.".to_string());
        let e = refused_sender(&[AcceptedEmail::Invalid(refused.clone())]).expect("a sender refusal");
        assert_eq!((e.action, e.status, e.maybe_sent), (Action::SenderRejected, Some(200), false));
        assert!(refused_sender(&[AcceptedEmail::Invalid(Some("The `to` field is missing.".into()))]).is_none());
        assert!(refused_sender(&[AcceptedEmail::Invalid(refused.clone()), AcceptedEmail::Sent("id".into())]).is_none());
        assert!(refused_sender(&[AcceptedEmail::Sent("id".into())]).is_none());
    }

    #[test]
    fn a_quota_pauses_until_it_renews() {
        let e = answer(429, "daily_quota_exceeded");
        let renews = chrono::DateTime::parse_from_rfc3339("2026-11-30T00:00:00Z").unwrap();
        let want = std::time::UNIX_EPOCH + Duration::from_secs(renews.timestamp() as u64);
        assert_eq!(decide(&e, 0, false), Plan::PauseUntil(want));
        assert_eq!(decide(&e, 7, false), Plan::PauseUntil(want), "never given up on");
    }
}
