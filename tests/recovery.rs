//! Never twice, never lost: crashes at each point of a batch's life, a slow
//! holder whose lease was taken over, batches too old to resend, retries,
//! quota pauses and a Redis restart, each against a real Redis and the emulator.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use mailstream::RunOptions;
use mailstream::config::Config;
use mailstream::model::error_name::ErrorName;
use mailstream::model::outcome::{DeliveryState, Failpoint, Outcome, Reason, Requeue};
use mailstream::model::work::{DeliveryRef, Ready};
use mailstream::store::redis_server::RedisOptions;
use mailstream::store::scripts::{self, Claim, Reschedule, SealRequest, Settlement, Settler, Verdict};
use mailstream::tools::emulator::{EmulatorConfig, Faults};
use tokio::sync::Notify;

const SETTLE: Duration = Duration::from_secs(90);

/// Test config: the shortest lease the config allows (timeout 1 s + 5 s).
fn quick(c: &mut Config) {
    c.resend.timeout_seconds = 1;
    c.delivery.lease_seconds = 6;
}

/// One partition, a 1 s request timeout, and a Resend that processes every fresh request
/// and answers it after 2.5 s (a replay at once): each first request times out after it
/// was sent.
async fn timing_out() -> (World, mailstream::tools::emulator::Emulator, mailstream::shutdown::Trigger) {
    let mut world = World::with(RedisOptions::default(), |c| {
        quick(c);
        c.redis.partitions = 1;
    })
    .await;
    let faults = Faults { hang: 1.0, hang_ms: 2500, ..Default::default() };
    let (emulator, stop) =
        world.emulator(EmulatorConfig { requests_per_second: None, faults, ..Default::default() }).await;
    (world, emulator, stop)
}

/// Runs a daemon that crashes at `point` (its tasks are aborted, as by kill -9),
/// then a fresh one; every delivery must be sent exactly once.
async fn crash_and_recover(point: Failpoint) -> mailstream::tools::emulator::Stats {
    let mut world = World::with(RedisOptions::default(), quick).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    world.subscribers(250).await;
    world.kick().await;

    crash_at(&world.config, point, Duration::from_secs(30)).await;

    let survivor = world.daemon();
    let counts = world.settled(SETTLE).await;
    survivor.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (250, 0, 0), "at {point:?}");
    let stats = emulator.stats();
    assert_eq!(stats.emails_accepted, 250, "one real send per delivery, crash at {point:?}");
    assert_eq!(stats.duplicate_sends, 0, "crash at {point:?}");
    let sends = emulator.sends_matching(&PERIOD);
    assert_eq!(sends.len(), 250);
    assert!(sends.values().all(|&n| n == 1));
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_claim_before_seal() {
    crash_and_recover(Failpoint::Claimed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_seal_and_send() {
    let stats = crash_and_recover(Failpoint::Sealed).await;
    assert_eq!(stats.replays, 0, "the sealed batch never left, so its resend is its first send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_send_and_settle() {
    let stats = crash_and_recover(Failpoint::Answered).await;
    assert!(stats.replays >= 1, "the taker resent the sealed bytes with the sealed key, and got a replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_settle() {
    // There is no "settled but not acknowledged" window: seal acknowledged the stream
    // entries, and settle deleted the batch in the same step that recorded its outcome.
    crash_and_recover(Failpoint::Settled).await;
}

fn settlements(members: &[DeliveryRef], verdict: Verdict) -> Vec<Settlement<'_>> {
    members.iter().map(|m| Settlement { member: m, verdict: verdict.clone() }).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_holder_cannot_overwrite_the_new_holders_result() {
    let world = World::new().await;
    let keys = &world.store.keys;
    let mut conn = world.store.conn().await.unwrap();
    let (batch, members) = sealed_batch(&world, 3, "slow", true).await;
    tokio::time::sleep(Duration::from_millis(5)).await; // the 1 ms lease runs out mid-send

    // The new holder takes the batch over, resends, and settles the provider's answer.
    let taken = scripts::take(&mut conn, keys, 0, &batch, "new", 60_000, 3_600_000).await.unwrap();
    assert!(matches!(&taken, scripts::Take::Take { key, maybe_sent: true, .. } if key == "mailstream-B1"), "{taken:?}");
    let sent = settlements(&members, Verdict::Sent("re_new".into()));
    let settled = scripts::settle(&mut conn, keys, 0, &batch, Settler::Answer, &sent, 3600).await.unwrap();
    assert_eq!(settled.recorded, vec![Some(Outcome::Sent); 3]);

    // The slow holder wakes up with a different story: neither its retry nor its
    // verdict changes anything.
    let timeout = Reason::Provider(ErrorName::Timeout);
    let retry = Reschedule { delay_ms: 10, failed_request: true, maybe_sent: true, error: timeout.clone(), said: None };
    assert_eq!(scripts::reschedule(&mut conn, keys, 0, &batch, "slow", &retry).await.unwrap(), None);
    let failed = settlements(&members, Verdict::Failed(timeout));
    let by = Settler::Holder("slow");
    assert_eq!(scripts::settle(&mut conn, keys, 0, &batch, by, &failed, 3600).await.unwrap().recorded, vec![None; 3]);
    for m in &members {
        let d = delivery(&world.store, &m.id()).await;
        assert_eq!((d["state"].as_str(), d["provider_id"].as_str()), ("sent", "re_new"));
    }
    let counts = world.counts().await;
    assert_eq!((counts.sent, counts.failed), (3, 0), "settled once, counted once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_needs_the_holder_and_never_calls_maybe_sent_mail_failed() {
    let world = World::new().await;
    let keys = &world.store.keys;
    let mut conn = world.store.conn().await.unwrap();
    let (batch, members) = sealed_batch(&world, 2, "slow", true).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    // The new holder's attempt times out: the batch record now says "may have been sent".
    assert!(matches!(
        scripts::take(&mut conn, keys, 0, &batch, "new", 1, 3_600_000).await.unwrap(),
        scripts::Take::Take { .. }
    ));
    let timeout = Reschedule {
        delay_ms: 60_000,
        failed_request: true,
        maybe_sent: true,
        error: Reason::Provider(ErrorName::Timeout),
        said: None,
    };
    assert_eq!(scripts::reschedule(&mut conn, keys, 0, &batch, "new", &timeout).await.unwrap(), Some(1));
    // The old holder, which only ever saw connection refusals, gives up: refused.
    let failed = settlements(&members, Verdict::Failed(Reason::Provider(ErrorName::ConnectionFailed)));
    let by = Settler::Holder("slow");
    assert_eq!(scripts::settle(&mut conn, keys, 0, &batch, by, &failed, 3600).await.unwrap().recorded, vec![None; 2]);
    // The holder gives up the same way: recorded as outcome_unknown, not failed, so no
    // dead-letter retry can send it a second time.
    let by = Settler::Holder("new");
    let settled = scripts::settle(&mut conn, keys, 0, &batch, by, &failed, 3600).await.unwrap();
    assert_eq!(settled.recorded, vec![Some(Outcome::OutcomeUnknown); 2]);
    let counts = world.counts().await;
    assert_eq!((counts.failed, counts.outcome_unknown), (0, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_claimer_is_fenced_out_of_sealing() {
    let world = World::new().await;
    let keys = &world.store.keys;
    let mut conn = world.store.conn().await.unwrap();
    let d = DeliveryRef::new(CAMPAIGN, &PERIOD, "s", "t");
    let id = d.id();
    added(
        scripts::enqueue(&mut conn, keys, 0, std::slice::from_ref(&d), 3600, window(&world.config, &PERIOD))
            .await
            .unwrap(),
    );
    let claimed = scripts::claim(&mut conn, keys, 0, &[&id], "slow", 1).await.unwrap();
    assert!(matches!(claimed[0], Claim::Claimed { .. }));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let again = scripts::claim(&mut conn, keys, 0, &[&id], "new", 60_000).await.unwrap();
    assert_eq!(again[0], Claim::Claimed { claims: 2 });
    let member =
        Ready { entry: "0-1".into(), delivery: d, json: "{}".into(), variant: None, audience: Default::default() };
    let req = |batch, owner| SealRequest {
        partition: 0,
        batch,
        idempotency_key: batch,
        owner,
        group: "mailstream",
        lease_ms: 60_000,
    };
    assert!(
        scripts::seal(&mut conn, keys, &req("late", "slow"), std::slice::from_ref(&member)).await.unwrap().is_empty()
    );
    assert_eq!(scripts::seal(&mut conn, keys, &req("B", "new"), &[member]).await.unwrap(), vec![0]);
    let exists: bool = redis::cmd("EXISTS").arg(keys.batch(0, "late")).query_async(&mut conn).await.unwrap();
    assert!(!exists, "nothing was sealed for the late holder");
}

/// Makes a sealed batch 25 hours old, with `fields` overwritten.
async fn age_batch(world: &World, batch: &str, fields: &[(&str, &str)]) {
    let mut conn = world.store.conn().await.unwrap();
    let old = (chrono::Utc::now().timestamp_millis() - 25 * 3_600_000).to_string();
    let mut cmd = redis::cmd("HSET");
    cmd.arg(world.store.keys.batch(0, batch)).arg("sealed_ms").arg(&old);
    for (field, value) in fields {
        cmd.arg(*field).arg(*value);
    }
    let _: () = cmd.query_async(&mut conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_older_than_the_idempotency_window_is_not_resent_blind() {
    let mut world = World::new().await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let (batch, _) = sealed_batch(&world, 4, "dead-holder", true).await;
    // Sealed 25 hours ago by a holder that died mid-send.
    age_batch(&world, &batch, &[]).await;
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.outcome_unknown, counts.sent), (4, 0));
    assert_eq!(emulator.stats().requests, 0, "never resent");
    let unknown = mailstream::ops::dead_letters::list(
        &world.store,
        mailstream::ops::dead_letters::DeadLetterKind::OutcomeUnknown,
        10,
    )
    .await
    .unwrap();
    assert_eq!(unknown.len(), 4);
    assert!(unknown.iter().all(|u| u.error == "idempotency_window_passed" && u.state_now == "outcome_unknown"));
    // The operator checked in Resend: not delivered. Requeueing needs saying so.
    let refused =
        mailstream::ops::dead_letters::retry(&world.store, &[unknown[0].delivery.clone()], false).await.unwrap();
    assert_eq!(refused[0].1, Requeue::Refused(DeliveryState::Done(Outcome::OutcomeUnknown)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_batch_that_was_never_sent_is_sent() {
    let mut world = World::new().await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let (batch, _) = sealed_batch(&world, 4, "paused-holder", false).await;
    // Waiting 25 hours for a retry, after refusals only (a long quota pause): nothing left.
    age_batch(&world, &batch, &[("state", "retry"), ("maybe_sent", "0")]).await;
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!(counts.sent, 4);
    assert_eq!(emulator.stats().emails_accepted, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_request_is_retried_with_the_same_key_and_body() {
    let (world, emulator, _stop) = timing_out().await;
    world.subscribers(30).await;
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!(counts.sent, 30);
    let seen = emulator.seen();
    assert!(seen.len() >= 2, "the timed-out request was retried: {seen:?}");
    let keys: std::collections::HashSet<_> = seen.iter().map(|s| s.idempotency_key.clone()).collect();
    assert_eq!(keys.len(), 1, "every retry carried the sealed key: {seen:?}");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (30, 0));
    assert!(stats.replays >= 1 || stats.concurrent_conflicts >= 1);
    assert_eq!(stats.idempotency_mismatches, 0, "same body every time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fatal_answer_is_one_attempt_and_a_dead_letter() {
    let mut world = World::with(RedisOptions::default(), |c| c.redis.partitions = 1).await;
    let config = EmulatorConfig { api_key: Some("re_the_right_one".into()), ..Default::default() };
    let (emulator, _stop) = world.emulator(config).await;
    world.subscribers(150).await;
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.failed, counts.sent), (150, 0));
    let seen = emulator.seen();
    assert_eq!(seen.len(), 2, "one request per batch, no retry: {seen:?}");
    assert!(seen.iter().all(|s| s.status == 403));
    let dead =
        mailstream::ops::dead_letters::list(&world.store, mailstream::ops::dead_letters::DeadLetterKind::Failed, 500)
            .await
            .unwrap();
    assert_eq!(dead.len(), 150);
    assert!(dead.iter().all(|d| d.error == "invalid_api_key"));

    // After fixing the key, the operator requeues them and they go out.
    let ids: Vec<String> = dead.iter().map(|d| d.delivery.clone()).collect();
    let results = mailstream::ops::dead_letters::retry(&world.store, &ids, false).await.unwrap();
    assert!(results.iter().all(|(_, r)| *r == Requeue::Requeued));
    world.config.resend.api_key = Some(mailstream::config::Secret::new("re_the_right_one"));
    let daemon = world.daemon();
    let store = world.store.clone();
    let sent = eventually(SETTLE, || {
        let store = store.clone();
        async move { store.counts(CAMPAIGN, &PERIOD).await.ok().filter(|c| c.sent == 150) }
    })
    .await;
    daemon.stop().await;
    let counts = sent.expect("requeued deliveries are sent");
    assert_eq!(counts.failed, 0, "requeue takes them out of the failed count");
    assert_eq!(emulator.stats().emails_accepted, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_sender_fails_at_once() {
    let mut world = World::with(RedisOptions::default(), |c| c.redis.partitions = 1).await;
    let faults = Faults { rejected_sender_domains: vec!["acme.example".into()], ..Default::default() };
    let (emulator, _stop) = world.emulator(EmulatorConfig { faults, ..Default::default() }).await;
    world.subscribers(20).await;
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!(counts.failed, 20);
    assert_eq!(emulator.seen().len(), 1, "no retry, no backoff sleep");
    let dead =
        mailstream::ops::dead_letters::list(&world.store, mailstream::ops::dead_letters::DeadLetterKind::Failed, 50)
            .await
            .unwrap();
    assert!(dead.iter().all(|d| d.error == "validation_error"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_quota_pauses_sending_and_drops_nothing() {
    let mut world = World::with(RedisOptions::default(), |c| c.redis.partitions = 1).await;
    let faults = Faults { quota_after_emails: Some(150), ..Default::default() };
    let (emulator, _stop) = world.emulator(EmulatorConfig { faults, ..Default::default() }).await;
    world.subscribers(250).await;
    world.kick().await;
    let daemon = world.daemon();
    let store = world.store.clone();
    let paused_key = store.keys.paused(0);
    let paused = eventually(Duration::from_secs(30), || {
        let (store, key) = (store.clone(), paused_key.clone());
        async move {
            let mut conn = store.conn().await.ok()?;
            let reason: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut conn).await.ok()?;
            reason
        }
    })
    .await;
    assert_eq!(paused.as_deref(), Some("daily_quota_exceeded"));
    let metrics = daemon.metrics.render();
    assert!(metrics.contains("mailstream_sending_paused 1"), "{metrics}");
    // Requests already on the wire when the pause began are answered (refused, or
    // accepted within the quota); after that, silence, and nothing is dropped.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (during, requests) = (world.counts().await, emulator.stats().requests);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(emulator.stats().requests, requests, "no request while paused");
    assert_eq!(world.counts().await, during);
    assert!(during.sent >= 100 && during.sent < 250, "{during:?}");
    assert_eq!(during.failed + during.skipped + during.outcome_unknown, 0);

    // The quota renews (room for the 150 left); the operator resumes.
    emulator.renew_quota();
    assert!(mailstream::send::pause::Pause::resume(&world.store).await.unwrap());
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.failed), (250, 0));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (250, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_mid_run_loses_and_repeats_nothing() {
    let mut world = World::with(RedisOptions { appendonly: true, ..Default::default() }, quick).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: Some(5), ..Default::default() }).await;
    world.config.resend.requests_per_second = 5;
    world.subscribers(2000).await;
    world.kick().await;
    let daemon = world.daemon();
    let store = world.store.clone();
    let started = eventually(Duration::from_secs(30), || {
        let store = store.clone();
        async move { store.counts(CAMPAIGN, &PERIOD).await.ok().filter(|c| c.sent >= 300) }
    })
    .await;
    assert!(started.is_some());
    world.redis.restart().await.expect("redis restarts");
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (2000, 0, 0));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (2000, 0));
}

/// The requests made so far that got no answer (`status_class="none"`), from a scrape.
fn unanswered(metrics: &str) -> u64 {
    metric(metrics, "mailstream_provider_requests_total{", "status_class=\"none\"") as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_holds_every_batch_and_the_first_success_sends_them_all() {
    // A batch's own backoff is ten minutes: only the provider's return brings it forward.
    let mut world = World::with(RedisOptions::default(), |c| {
        c.redis.partitions = 2;
        c.delivery.retry_base_ms = 600_000;
        c.delivery.retry_max_ms = 600_000;
        c.resend.probe_interval_seconds = 1;
    })
    .await;
    let emulator = mailstream::tools::emulator::Emulator::new(EmulatorConfig::default());
    let (url, stop, task) = emulator.spawn_local().await.unwrap();
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    // Resend unreachable from the start.
    stop.trigger();
    task.await.unwrap();
    world.config.resend.base_url = url;
    world.subscribers(500).await;
    world.kick().await;
    let daemon = world.daemon();
    let store = world.store.clone();
    let down_since = || {
        let store = store.clone();
        async move {
            let mut conn = store.conn().await.ok()?;
            let ms: Option<u64> =
                redis::cmd("HGET").arg(store.keys.provider()).arg("down_ms").query_async(&mut conn).await.ok()?;
            ms
        }
    };
    assert!(eventually(Duration::from_secs(60), down_since).await.is_some(), "the provider counts as down");
    let seen_down = tokio::time::Instant::now();
    let before = unanswered(&daemon.metrics.render());
    // Three more probes, one at a time.
    let probed = eventually(Duration::from_secs(60), || {
        let metrics = daemon.metrics.clone();
        async move { (unanswered(&metrics.render()) >= before + 3).then_some(()) }
    })
    .await;
    assert!(probed.is_some(), "it keeps probing");
    let (probes, held) = (unanswered(&daemon.metrics.render()) - before, seen_down.elapsed());
    // Once a second at most (and what was on the wire when it went down): five batches
    // retrying on their own would make many more.
    assert!(probes <= held.as_secs() + 1 + 5, "{probes} requests in {held:?}");
    assert!(daemon.metrics.render().contains("mailstream_provider_down 1"));
    assert_eq!(world.counts().await.settled(), 0);

    // Back: the first success ends it and sends every waiting batch, long before their backoff.
    let (_, _stop, _task) = emulator.spawn_at(addr).await.unwrap();
    let counts = world.settled(Duration::from_secs(120)).await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (500, 0, 0));
    assert!(down_since().await.is_none());
    assert!(daemon.metrics.render().contains("mailstream_provider_down 0"));
    daemon.stop().await;
    assert_eq!(emulator.stats().duplicate_sends, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_failing_again_and_again_never_puts_the_provider_down() {
    use mailstream::store::scripts::{HealthCall, HealthRule, health};
    let world = World::new().await;
    // No shortest span here: the run's count alone (the span has a test of its own).
    let rule = HealthRule { failures: 3, window_ms: 10_000, probe_interval_ms: 1_000, min_span_ms: 0 };
    let store = &world.store;
    let mut conn = store.conn().await.unwrap();
    // A batch the provider keeps refusing with a 5xx says more about the batch...
    for _ in 0..5 {
        let h = health(&mut conn, &store.keys, HealthCall::Failed("poison"), &rule).await.unwrap();
        assert_eq!(h.down_since_ms, None);
    }
    // ...but a refused connection is nobody's batch: it always counts (the third puts it down).
    health(&mut conn, &store.keys, HealthCall::Failed(""), &rule).await.unwrap();
    let h = health(&mut conn, &store.keys, HealthCall::Failed(""), &rule).await.unwrap();
    assert!(h.down_since_ms.is_some() && h.changed, "{h:?}");
    // Down lapses when nobody probes for a while; a probe keeps it.
    let ttl: i64 = redis::cmd("PTTL").arg(store.keys.provider()).query_async(&mut conn).await.unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    // One probe per interval, whoever asks.
    let first = health(&mut conn, &store.keys, HealthCall::Probe, &rule).await.unwrap();
    let second = health(&mut conn, &store.keys, HealthCall::Probe, &rule).await.unwrap();
    assert_eq!(
        (first.probe, second.probe),
        (false, false),
        "the failure that put it down was the probe of its interval"
    );
    let (keys, rule2) = (store.keys.clone(), rule);
    let granted = eventually(Duration::from_secs(30), || {
        let (store, keys) = (store.clone(), keys.clone());
        async move {
            let mut conn = store.conn().await.ok()?;
            health(&mut conn, &keys, HealthCall::Probe, &rule2).await.ok().filter(|h| h.probe)
        }
    })
    .await;
    assert!(granted.is_some(), "the next interval's probe");
    let taken = health(&mut conn, &store.keys, HealthCall::Probe, &rule).await.unwrap();
    assert!(!taken.probe, "one per interval");
    // Any answer ends it, and says so once.
    let up = health(&mut conn, &store.keys, HealthCall::Succeeded, &rule).await.unwrap();
    assert!(up.down_since_ms.is_none() && up.changed);
    let again = health(&mut conn, &store.keys, HealthCall::Succeeded, &rule).await.unwrap();
    assert!(!again.changed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_faults_is_no_outage_until_failures_last_a_probe_interval() {
    use mailstream::store::scripts::{HealthCall, health};
    let world = World::new().await;
    let store = &world.store;
    let rule = mailstream::send::pause::health_rule(&world.config);
    assert_eq!(rule.min_span_ms, 1_000, "one probe interval, as shipped");
    let mut conn = store.conn().await.unwrap();
    // Two 5xx of two batches and a timed-out hang of a third, back to back: many more
    // failures than the threshold, within less than a probe interval.
    let before = store.time().await.unwrap().timestamp_millis() as u64;
    for batch in ["b1", "b2", "b3", "b4", "b5"] {
        let h = health(&mut conn, &store.keys, HealthCall::Failed(batch), &rule).await.unwrap();
        if let Some(down) = h.down_since_ms {
            // Only a host too slow to make five calls within a second gets here, and then the
            // span has passed: still no outage declared before it.
            assert!(down >= before + rule.min_span_ms, "{h:?}");
            return;
        }
    }
    // A success among them ends the run: failures after it start counting again.
    health(&mut conn, &store.keys, HealthCall::Succeeded, &rule).await.unwrap();
    let first = store.time().await.unwrap().timestamp_millis() as u64;
    // With still no success, a failure once the span has passed puts it down.
    let down = eventually(Duration::from_secs(30), || async {
        let mut conn = store.conn().await.ok()?;
        health(&mut conn, &store.keys, HealthCall::Failed(""), &rule).await.ok()?.down_since_ms
    })
    .await
    .expect("down once failures have lasted the span");
    assert!(down >= first + rule.min_span_ms, "down at {down}, the run began at or after {first}");
}

/// Failpoints that hold at `first` once (telling `reached`, until `go_on`), then freeze for
/// good at `second` once (telling `stopped`): a daemon to change something under, then crash.
fn hold_then_freeze(
    (first, reached, go_on): (Failpoint, Arc<Notify>, Arc<Notify>),
    (second, stopped): (Failpoint, Arc<Notify>),
) -> mailstream::Failpoints {
    let fired = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    mailstream::Failpoints::new(move |name| -> mailstream::Hold {
        let (reached, go_on, stopped) = (reached.clone(), go_on.clone(), stopped.clone());
        if name == first && !fired[0].swap(true, Ordering::SeqCst) {
            return Box::pin(async move {
                reached.notify_one();
                go_on.notified().await;
            });
        }
        if name == second && !fired[1].swap(true, Ordering::SeqCst) {
            return Box::pin(async move {
                stopped.notify_one();
                std::future::pending::<()>().await;
            });
        }
        Box::pin(async {})
    })
}

/// Subscriber `s` unsubscribes (all campaigns), as the application would tell the registry.
async fn unsubscribe(world: &World, s: &mailstream::audience::subscribers::Subscriber) {
    let left = mailstream::audience::subscribers::Subscriber { subscribed: false, ..s.clone() };
    mailstream::audience::subscribers::upsert(&world.store, std::slice::from_ref(&left)).await.unwrap();
}

/// A batch re-sealed at its last gate (a member left after its seal) goes out under its new
/// key. The holder crashes after Resend accepted it; the taker resends it under the key
/// take.lua returns, the new one, so Resend replays it: never under a key the taker would
/// derive from the batch id (the code mutant `taker_derives_key_from_batch`), which Resend
/// would take for a new request and send again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_resealed_at_its_gate_is_taken_over_under_its_new_key() {
    let mut world = World::with(RedisOptions::default(), |c| {
        quick(c);
        c.redis.partitions = 1;
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let subs = world.subscribers(3).await;
    world.kick().await;
    let (sealed, go_on, answered) = (Arc::new(Notify::new()), Arc::new(Notify::new()), Arc::new(Notify::new()));
    let failpoints =
        hold_then_freeze((Failpoint::Sealed, sealed.clone(), go_on.clone()), (Failpoint::Answered, answered.clone()));
    let crashing = Daemon::start(world.config.clone(), RunOptions { failpoints, ..Default::default() });
    tokio::time::timeout(SETTLE, sealed.notified()).await.expect("the batch is sealed");
    unsubscribe(&world, &subs[0]).await;
    go_on.notify_one();
    tokio::time::timeout(SETTLE, answered.notified()).await.expect("Resend answered the re-sealed batch");
    crashing.task.abort();
    let _ = crashing.task.await;
    assert_eq!(emulator.stats().emails_accepted, 2, "the re-sealed batch left without the member who left");

    let survivor = world.daemon();
    let counts = world.settled(SETTLE).await;
    survivor.stop().await;
    assert_eq!((counts.sent, counts.skipped, counts.failed, counts.outcome_unknown), (2, 1, 0, 0), "{counts:?}");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (2, 0), "{stats:?}");
    assert!(stats.replays >= 1, "the taker's resend was a replay of the re-sealed request: {stats:?}");
}

/// A request that timed out may have been processed (Resend took it; the answer was lost).
/// When a member leaves before its retry, the batch is not re-sealed without them under a
/// new key, which would send the others again: it is withheld, its deliveries
/// `outcome_unknown` (the code mutant `timeout_not_processed` re-seals and sends twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_batch_whose_member_left_is_withheld_not_sent_again() {
    let (world, emulator, _stop) = timing_out().await;
    let subs = world.subscribers(3).await;
    world.kick().await;
    let (daemon, go_on) = held_at(&world.config, Failpoint::Answered, SETTLE).await;
    unsubscribe(&world, &subs[0]).await;
    go_on.notify_one();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped, counts.outcome_unknown), (0, 0, 3), "{counts:?}");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (3, 0), "{stats:?}");
}
