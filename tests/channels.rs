//! Channels: a campaign on email and the application channel. Each channel's delivery
//! is enqueued by the one kick under the natural key plus the channel, claimed, sent and
//! settled on its own; the application's events are signed the Standard Webhooks way
//! (checked with Svix's own Python library), carry ids only, and an application that is
//! down delays no email.

mod common;

use std::time::Duration;

use common::*;
use mailstream::config::{AppChannelConfig, Secret};
use mailstream::model::work::Channel;
use mailstream::store::Counts;
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::tools::emulator::app::AppEndpoint;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// `[channels.app]` pointing at `url`, signed with [`SECRET`].
fn app_channel(url: String) -> Option<AppChannelConfig> {
    let secret = Some(Secret::new(SECRET));
    Some(AppChannelConfig { url, timeout_ms: 2000, concurrency: 8, secret_file: None, secret })
}

/// A world whose campaign goes out on email and the application channel, to `endpoint`.
async fn world_with_app(endpoint_url: &str) -> World {
    let url = endpoint_url.to_string();
    World::with(Default::default(), move |c| {
        c.campaigns[0].channels = vec![Channel::Email, Channel::App];
        c.channels.app = app_channel(url);
    })
    .await
}

async fn app_counts(world: &World) -> Counts {
    world.store.channel_counts(CAMPAIGN, &PERIOD, Channel::App).await.unwrap()
}

async fn app_settled(world: &World, within: Duration) -> Counts {
    let store = world.store.clone();
    eventually(within, || {
        let store = store.clone();
        async move {
            let c = store.channel_counts(CAMPAIGN, &PERIOD, Channel::App).await.ok()?;
            (c.enqueued > 0 && c.settled() >= c.enqueued).then_some(c)
        }
    })
    .await
    .unwrap_or_else(|| panic!("the application channel was not settled within {within:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_kick_enqueues_a_delivery_per_channel_once_and_each_settles_on_its_own() {
    let endpoint = AppEndpoint::new(SECRET).unwrap();
    let (url, stop_app, _) = endpoint.spawn_local().await.unwrap();
    let mut world = world_with_app(&url).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(30).await;
    let first = world.kick().await;
    let second = world.kick().await;
    assert_eq!((first.new, first.duplicates), (60, 0), "an email and an event per subscriber");
    assert_eq!((second.new, second.duplicates), (0, 60), "a second kick adds nothing on any channel");

    let daemon = world.daemon();
    let email = world.settled(Duration::from_secs(60)).await;
    let app = app_settled(&world, Duration::from_secs(60)).await;
    let scrape = daemon.metrics.render();
    daemon.stop().await;
    stop_app.trigger();
    assert_eq!(metric(&scrape, "mailstream_app_requests_total", "status_class=\"2xx\""), 30.0, "{scrape}");
    assert_eq!(metric(&scrape, "mailstream_app_requests_total", "status_class=\"5xx\""), 0.0);
    let sent = |channel: &str| {
        let labels = format!("channel=\"{channel}\",outcome=\"sent\"");
        metric(&scrape, "mailstream_deliveries_total", &labels)
    };
    assert_eq!((sent("email"), sent("app")), (30.0, 30.0), "{scrape}");
    assert_eq!((email.enqueued, email.sent), (30, 30));
    assert_eq!((app.enqueued, app.sent, app.failed), (30, 30, 0));
    let seen = endpoint.stats();
    assert_eq!((seen.taken, seen.duplicates, seen.rejected), (30, 0, 0), "{seen:?}");
    assert_eq!(emulator.stats().duplicate_sends, 0);

    // Each channel has its own record under the natural key plus the channel; the email
    // record is as it always was (no field of the other channel).
    let d = delivery_of(&subs[0]);
    let email_record = delivery(&world.store, &d.id()).await;
    let app_id = d.clone().on(Channel::App).id();
    assert!(app_id.ends_with(":app"), "{app_id}");
    let app_record = delivery(&world.store, &app_id).await;
    assert_eq!(email_record["state"], "sent");
    assert_eq!((app_record["state"].as_str(), app_record["reason"].as_str()), ("sent", "accepted"));
    assert!(email_record.keys().all(|f| !f.starts_with("app")), "{email_record:?}");
    // The event carries ids only; once it is sent its record, body and all, has given
    // way to its compact entry.
    assert!(!app_record.contains_key("app_body"), "{app_record:?}");
    let (headers, taken) = endpoint.taken(&app_id).expect("the application took it");
    let body = String::from_utf8(taken.to_vec()).unwrap();
    assert!(!body.contains('@') && body.contains(&subs[0].id), "{body}");
    assert!(headers.iter().any(|(n, v)| n == "webhook-id" && *v == app_id), "{headers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_verify_with_svixs_own_library() {
    let endpoint = AppEndpoint::new(SECRET).unwrap();
    let (url, stop_app, _) = endpoint.spawn_local().await.unwrap();
    let mut world = world_with_app(&url).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(3).await;
    world.kick().await;
    let daemon = world.daemon();
    app_settled(&world, Duration::from_secs(60)).await;
    daemon.stop().await;
    stop_app.trigger();
    let ids = endpoint.taken_ids();
    assert_eq!(ids.len(), 3);
    for id in ids {
        let (headers, body) = endpoint.taken(&id).unwrap();
        let headers: serde_json::Map<String, serde_json::Value> =
            headers.into_iter().map(|(n, v)| (n, serde_json::Value::String(v))).collect();
        // Svix's Python library (pip install svix; .ci/run installs it) verifies what was sent.
        let script = format!(
            "import json, sys\nfrom svix.webhooks import Webhook\n\
             headers, body = json.loads(sys.argv[1]), sys.stdin.buffer.read()\n\
             Webhook('{SECRET}').verify(body, headers)\n\
             sys.stdout.buffer.write(body)"
        );
        let mut python = std::process::Command::new("python3")
            .args(["-c", &script, &serde_json::Value::Object(headers).to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        use std::io::Write;
        python.stdin.take().unwrap().write_all(&body).unwrap();
        let out = python.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "svix refused the event (pip install svix): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let payload: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(payload["data"]["delivery"], id.as_str());
        assert_eq!(payload["data"]["channel"], "app");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_that_is_down_delays_no_email_and_loses_no_event() {
    let endpoint = AppEndpoint::new(SECRET).unwrap();
    endpoint.set_down(true);
    let (url, stop_app, _) = endpoint.spawn_local().await.unwrap();
    let mut world = world_with_app(&url).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(200).await;
    world.kick().await;
    let daemon = world.daemon();
    // Every email goes out while every event is refused.
    let email = world.settled(Duration::from_secs(60)).await;
    assert_eq!((email.sent, email.failed), (200, 0));
    assert_eq!(emulator.stats().duplicate_sends, 0);
    let refused = eventually(Duration::from_secs(30), || async {
        let s = endpoint.stats();
        (s.refused_while_down >= 200).then_some(s)
    })
    .await
    .expect("every event was offered while the application was down");
    assert_eq!(refused.taken, 0);
    let waiting = app_counts(&world).await;
    assert_eq!((waiting.sent, waiting.failed, waiting.pending()), (0, 0, 200), "put off, not failed");
    // The application comes back: every event arrives once.
    endpoint.set_down(false);
    let app = app_settled(&world, Duration::from_secs(90)).await;
    daemon.stop().await;
    stop_app.trigger();
    assert_eq!((app.sent, app.failed), (200, 0));
    let seen = endpoint.stats();
    assert_eq!((seen.taken, seen.duplicates, seen.rejected), (200, 0, 0), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_fails_the_event_and_an_opt_out_of_one_channel_leaves_the_other() {
    let endpoint = AppEndpoint::new(SECRET).unwrap();
    endpoint.set_gone_every(5);
    let (url, stop_app, _) = endpoint.spawn_local().await.unwrap();
    let mut world = world_with_app(&url).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(20).await;
    // Subscriber 0 turned the campaign's application channel off; 1 turned its email off.
    let mut conn = world.store.conn().await.unwrap();
    for (sub, channel) in [(&subs[0], Channel::App), (&subs[1], Channel::Email)] {
        let keys = &world.store.keys;
        let changed = mailstream::store::scripts::opt_out(&mut conn, keys, &sub.id, CAMPAIGN, channel).await.unwrap();
        assert_eq!(changed, Some(true));
    }
    let kicked = world.kick().await;
    assert_eq!(kicked.new, 38, "19 emails and 19 events");
    let daemon = world.daemon();
    let app = app_settled(&world, Duration::from_secs(60)).await;
    let email = world.settled(Duration::from_secs(60)).await;
    daemon.stop().await;
    stop_app.trigger();
    assert_eq!(email.sent, 19);
    let gone = endpoint.stats().gone;
    assert!(gone >= 3, "every fifth new id is gone: {gone}");
    assert_eq!((app.sent + app.failed, app.failed), (19, gone), "410 fails, and is not asked again");
    let off_app = delivery_of(&subs[0]).on(Channel::App);
    assert!(delivery(&world.store, &off_app.id()).await.is_empty(), "no event for who turned it off");
    let off_email = delivery_of(&subs[1]);
    assert!(delivery(&world.store, &off_email.id()).await.is_empty(), "no email for who turned it off");
    assert!(!delivery(&world.store, &off_email.clone().on(Channel::App).id()).await.is_empty());
    let failed: Vec<_> = deliveries(&world.store)
        .await
        .into_iter()
        .filter(|(d, r)| d.channel == Channel::App && r.get("state").map(String::as_str) == Some("failed"))
        .collect();
    assert_eq!(failed.len() as u64, gone);
    assert!(failed.iter().all(|(_, r)| r["error"] == "app_gone"), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_whose_template_lists_the_application_channel_sends_its_event_once_too() {
    let endpoint = AppEndpoint::new(SECRET).unwrap();
    let (url, stop_app, _) = endpoint.spawn_local().await.unwrap();
    let mut world = World::with(Default::default(), move |c| {
        c.templates.get_mut("receipt").unwrap().channels = vec![Channel::Email, Channel::App];
        c.channels.app = app_channel(url);
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let item = serde_json::json!({"idempotency_key": "order-1", "to": "delivered@resend.dev",
        "template": "receipt", "data": {"order": "1"}});
    let day = world.store.time().await.unwrap().format("%Y-%m-%d").to_string();
    for _ in 0..2 {
        mailstream::audience::ingest::enqueue(&world.store, &world.config, vec![item.clone()]).await.unwrap();
    }
    let daemon = world.daemon();
    let store = world.store.clone();
    let (email, app) = eventually(Duration::from_secs(60), || {
        let (store, day) = (store.clone(), day.clone());
        async move {
            let tx = mailstream::model::work::TRANSACTIONAL;
            let email = store.counts(tx, &day).await.ok()?;
            let app = store.channel_counts(tx, &day, Channel::App).await.ok()?;
            (email.sent == 1 && app.sent == 1).then_some((email, app))
        }
    })
    .await
    .expect("the receipt and its event were sent");
    daemon.stop().await;
    stop_app.trigger();
    assert_eq!((email.enqueued, email.duplicates, app.enqueued, app.duplicates), (1, 1, 1, 1));
    assert_eq!(emulator.stats().emails_accepted, 1);
    let id = format!("transactional:{day}:-:order-1:app");
    let (_, body) = endpoint.taken(&id).expect("the application took the receipt's event");
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["data"]["data_keys"], serde_json::json!(["order"]));
    assert_eq!(body["data"]["template"], "receipt");
    assert!(!body.to_string().contains('@'), "{body}");
    assert_eq!(endpoint.stats().duplicates, 0);
}

/// Each event's answer is recorded as it arrives: of two events read in one pass, the
/// first is answered at once and the second held unanswered. Once the first is settled
/// the daemon is killed (SIGKILL); after restart only the second is asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_answered_before_a_kill_is_not_posted_again() {
    use common::cli::{ANY_METRICS_PORT, TEST_REDIS, bin, config_file};
    let endpoint = AppEndpoint::new(SECRET).unwrap();
    let (url, _stop_app, _) = endpoint.spawn_local().await.unwrap();
    let mut world = world_with_app(&url).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(2).await;
    let (first, second) = (delivery_of(&subs[0]).on(Channel::App).id(), delivery_of(&subs[1]).on(Channel::App).id());
    endpoint.holds.hold(&second);
    world.kick().await;
    let base_url = format!("base_url = \"{}\"", world.config.resend.base_url);
    let app = format!("[channels.app]\nurl = \"{url}\"\ntimeout_ms = 25000\n# url");
    let path = config_file(
        "app-answer-kill.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            ("lease_seconds = 15", "lease_seconds = 30"),
            ("partitions = 1", "partitions = 2"),
            ("channels = [\"email\"]", "channels = [\"email\", \"app\"]"),
            ("# [channels.app]\n# url", &app),
            ANY_METRICS_PORT,
            TEST_REDIS,
        ],
    );
    let mut cmd = bin();
    cmd.arg("run").arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", world.redis.url());
    cmd.env("RESEND_API_KEY", "re_cli_test").env("MAILSTREAM_APP_WEBHOOK_SECRET", SECRET);
    let killed = common::Logged::spawn(cmd.stdout(std::process::Stdio::null()));
    let recorded = eventually(Duration::from_secs(150), || {
        let (store, first) = (world.store.clone(), first.clone());
        async move { (delivery(&store, &first).await.get("state").map(String::as_str) == Some("sent")).then_some(()) }
    })
    .await;
    assert!(recorded.is_some(), "the first event's answer is recorded: {:?}", killed.lines.lock().unwrap());
    assert_eq!(endpoint.holds.waiting(), 1, "the second event is out, unanswered");
    killed.signal("KILL");
    let _ = killed.wait().await;

    let daemon = world.daemon();
    let asked_again = eventually(Duration::from_secs(150), || {
        let endpoint = endpoint.clone();
        let second = second.clone();
        async move { (endpoint.holds.arrived(&second) >= 2).then_some(()) }
    })
    .await;
    assert!(asked_again.is_some(), "the unanswered event is posted again after the restart");
    endpoint.holds.release();
    let counts = app_settled(&world, Duration::from_secs(150)).await;
    daemon.stop().await;
    assert_eq!(counts.sent, 2, "{counts:?}");
    assert_eq!(endpoint.holds.arrived(&first), 1, "the event whose answer was recorded is not posted again");
}

/// A 429's `Retry-After` is a floor for the application channel's next request (capped
/// at an hour): the delivery's due time lies at least that far past the 429, far beyond
/// the delivery backoff (at most `retry_max_ms`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_application_channel_waits_out_a_retry_after() {
    use mailstream::model::work::Lane;
    let endpoint = AppEndpoint::new(SECRET).unwrap();
    let (url, _stop_app, _) = endpoint.spawn_local().await.unwrap();
    let mut world = world_with_app(&url).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(2).await;
    // The first event's request is told 30 minutes; the second's 30 hours (read as one).
    endpoint.throttle(1, 1800);
    world.kick().await;
    let daemon = world.daemon();
    let store = world.store.clone();
    let due = |d: String| {
        let store = store.clone();
        async move {
            let p = store.keys.partition_of(&subs_id(&d));
            let mut conn = store.conn().await.ok()?;
            let score: Option<f64> = redis::cmd("ZSCORE")
                .arg(store.keys.lane_due(p, Lane::of("", Channel::App)))
                .arg(&d)
                .query_async(&mut conn)
                .await
                .ok()?;
            score.map(|s| s as u64)
        }
    };
    let ids: Vec<String> = subs.iter().map(|s| delivery_of(s).on(Channel::App).id()).collect();
    let put_off = eventually(Duration::from_secs(60), || {
        let (ids, due) = (ids.clone(), &due);
        async move {
            for id in &ids {
                if let Some(at) = due(id.clone()).await {
                    return Some((id.clone(), at));
                }
            }
            None
        }
    })
    .await;
    let (throttled, at) = put_off.expect("the throttled event is put off");
    let now = world.store.time().await.unwrap();
    let now_ms = now.timestamp_millis() as u64;
    assert!(at >= now_ms + 1_000_000, "due {} s from now: the Retry-After of 1800 s is obeyed", (at - now_ms) / 1000);
    assert_eq!(endpoint.stats().throttled, 1);
    // The other event went at once.
    let other = ids.iter().find(|id| **id != throttled).unwrap().clone();
    let sent = eventually(Duration::from_secs(60), || {
        let (store, other) = (world.store.clone(), other.clone());
        async move { (delivery(&store, &other).await.get("state").map(String::as_str) == Some("sent")).then_some(()) }
    })
    .await;
    assert!(sent.is_some());
    // A longer one is capped at an hour.
    endpoint.throttle(1, 108_000);
    let keys = &world.store.keys;
    let mut conn = world.store.conn().await.unwrap();
    let p = keys.partition_of(&subs_id(&throttled));
    // Due now: the next request is the throttled one again.
    let _: () = redis::cmd("ZADD")
        .arg(keys.lane_due(p, Lane::of("", Channel::App)))
        .arg("XX")
        .arg(0)
        .arg(&throttled)
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = eventually(Duration::from_secs(60), || {
        let (endpoint, due, throttled) = (endpoint.clone(), &due, throttled.clone());
        async move {
            if endpoint.stats().throttled < 2 {
                return None;
            }
            due(throttled).await.filter(|&at| at > 0)
        }
    })
    .await;
    daemon.stop().await;
    let at = again.expect("put off again");
    let now_ms = world.store.time().await.unwrap().timestamp_millis() as u64;
    assert!(
        at <= now_ms + 3_600_000,
        "a Retry-After of 30 hours is read as one hour: due in {} s",
        (at - now_ms) / 1000
    );
    assert!(at >= now_ms + 3_000_000, "and still obeyed: due in {} s", (at - now_ms) / 1000);
}

/// The subscriber id in a delivery id (`campaign:period:subscriber:target:channel`).
fn subs_id(delivery: &str) -> String {
    delivery.split(':').nth(2).unwrap().to_string()
}

/// `kick --dry-run --json` counts deliveries as the kick does, over every channel of the
/// campaign (an opt-out of one channel leaves the others), and says each channel's share;
/// the keys it had are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_counts_each_channel_as_the_kick_does() {
    let world = world_with_app("http://127.0.0.1:9/events").await;
    let subs = world.subscribers(3).await;
    let mut conn = world.store.conn().await.unwrap();
    mailstream::store::scripts::opt_out(&mut conn, &world.store.keys, &subs[2].id, CAMPAIGN, Channel::App)
        .await
        .unwrap();
    let json = |d: &mailstream::audience::kick::DryRun| serde_json::to_value(d).unwrap();
    let before =
        json(&mailstream::audience::kick::dry_run(&world.store, &world.config, CAMPAIGN, &PERIOD).await.unwrap());
    for key in ["campaign", "period", "subscribers", "new", "already_enqueued", "not_eligible", "by_release_hour"] {
        assert!(before.get(key).is_some(), "{key} is kept: {before}");
    }
    assert_eq!(
        (before["subscribers"].as_u64(), before["new"].as_u64(), before["duplicates"].as_u64()),
        (Some(3), Some(5), Some(0))
    );
    assert_eq!(
        before["by_channel"],
        serde_json::json!({"email": {"new": 3, "duplicates": 0}, "app": {"new": 2, "duplicates": 0}}),
        "{before}"
    );
    let kicked = world.kick().await;
    assert_eq!((kicked.new, kicked.duplicates), (5, 0), "the kick enqueued what the dry run said");
    let after =
        json(&mailstream::audience::kick::dry_run(&world.store, &world.config, CAMPAIGN, &PERIOD).await.unwrap());
    assert_eq!(
        (after["new"].as_u64(), after["duplicates"].as_u64(), after["already_enqueued"].as_u64()),
        (Some(0), Some(5), Some(5))
    );
    assert_eq!(
        after["by_channel"],
        serde_json::json!({"email": {"new": 0, "duplicates": 3}, "app": {"new": 0, "duplicates": 2}}),
        "{after}"
    );
}
