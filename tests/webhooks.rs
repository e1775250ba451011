//! Listening to Resend: signed webhooks (the official vectors, a body signed by
//! Svix's own library, forgeries), each event's effect once, suppression and
//! its cascade end to end from the emulator, transient bounces, RFC 8058
//! one-click unsubscribe, and the public listener's limits.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::audience::suppression;
use mailstream::audience::tokens::Tokens;
use mailstream::config::{Config, Secret};
use mailstream::http::public::webhook::Webhooks;
use mailstream::model::svix::SigningKey;
use mailstream::model::work::DeliveryRef;
use mailstream::store::scripts;
use mailstream::tools::emulator::{EmulatorConfig, WebhookTarget};
use mailstream::{Listeners, RunOptions};
use serde_json::json;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const UNSUBSCRIBE: &str = "an-unsubscribe-secret-for-tests";
const SETTLE: Duration = Duration::from_secs(120);

fn listening(c: &mut Config) {
    c.webhook.secrets = vec![Secret::new(SECRET)];
    c.unsubscribe.secrets = vec![Secret::new(UNSUBSCRIBE)];
}

/// A daemon with a public listener on a port of its own; returns it and the listener's URL.
async fn daemon_with_public(config: &Config) -> (Daemon, String) {
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", public.local_addr().unwrap());
    let listeners = Listeners { metrics: None, public: Some(public) };
    (Daemon::start_listening(config.clone(), RunOptions::default(), listeners), url)
}

fn http() -> reqwest::Client {
    mailstream::resend::client::install_crypto_provider();
    reqwest::Client::builder().build().unwrap()
}

/// POSTs `body` to the webhook endpoint signed with `secret` as event `id`, now.
async fn post_event(url: &str, secret: &str, id: &str, body: &str) -> u16 {
    let ts = chrono::Utc::now().timestamp();
    let sig = SigningKey::parse(secret).unwrap().sign(id, ts, body.as_bytes());
    http()
        .post(format!("{url}/webhooks/resend"))
        .header("svix-id", id)
        .header("svix-timestamp", ts.to_string())
        .header("svix-signature", sig)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn request(headers: &[(&str, &str)], body: &'static [u8]) -> mailstream::http::server::HttpRequest {
    let mut b = hyper::Request::builder().method("POST").uri("/webhooks/resend");
    for (name, value) in headers {
        b = b.header(*name, *value);
    }
    b.body(Bytes::from_static(body)).unwrap()
}

async fn dbsize(world: &World) -> u64 {
    let mut conn = world.store.conn().await.unwrap();
    redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_vectors_and_every_forgery_through_the_handler() {
    let world = World::with(Default::default(), listening).await;
    let metrics = Arc::new(mailstream::metrics::Metrics::new());
    let hooks = |secret: &str, clock: fn() -> i64| {
        let mut config = world.config.clone();
        config.webhook.secrets = vec![Secret::new(secret)];
        Webhooks::new(&config, world.store.clone(), metrics.clone()).with_clock(clock)
    };
    let first = hooks(SECRET, || 1649367553);
    let body = br#"{"email":"test@example.com","username":"test_user"}"#;
    let signed = |sig: &'static str, ts: &'static str| {
        request(
            &[("svix-id", "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk"), ("svix-timestamp", ts), ("svix-signature", sig)],
            body,
        )
    };
    let good = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";
    assert_eq!(first.handle(signed(good, "1649367553")).await.status(), 200, "verified, an unknown event: 2xx");
    let second = hooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", || 1614265330);
    let req = request(
        &[
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            ("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
        ],
        br#"{"test": 2432232314}"#,
    );
    assert_eq!(second.handle(req).await.status(), 200, "the unbranded header names");

    let before = dbsize(&world).await;
    let refused = [
        signed("v1,R3PTzyfHASBKHH98a7yexTwaJ4yNIcGhFQc1yuN+BPU=", "1649367553"), // the negative vector
        signed("v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3", "1649367553"),     // truncated
        signed("v1,", "1649367553"),                                             // bare
        signed("v1,Zm9v v1,YmFy", "1649367553"),                                 // a list without it
        signed(good, "1649367193"),                                              // 6 minutes early
        signed(good, "1649367913"),                                              // 6 minutes late
        signed(good, "yesterday"),                                               // not a number
        request(&[("svix-id", "msg_1")], body),                                  // headers missing
    ];
    for req in refused {
        assert_eq!(first.handle(req).await.status(), 401);
    }
    let wrong_secret = hooks("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", || 1649367553);
    assert_eq!(wrong_secret.handle(signed(good, "1649367553")).await.status(), 401);
    let not_json = request(&[("svix-id", "m"), ("svix-timestamp", "1649367553"), ("svix-signature", "x")], b"{");
    assert_eq!(first.handle(not_json).await.status(), 401, "verification comes before parsing");
    assert_eq!(dbsize(&world).await, before, "a refused request changes nothing");
    assert_eq!(metrics.webhook_requests("rejected"), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_signed_by_svixs_own_library_is_accepted() {
    let world = World::with(Default::default(), listening).await;
    let (daemon, url) = daemon_with_public(&world.config).await;
    let body = r#"{"type":"email.delivered","created_at":"2026-11-30T00:00:00Z","data":{"email_id":"e1","to":["a@b.example"]}}"#;
    let ts = chrono::Utc::now().timestamp();
    // Svix's Python library (pip install svix; .ci/run installs it) signs; mailstream verifies.
    let signature = svix_signed(SECRET, "msg_svix_lib", ts, body);
    assert!(signature.starts_with("v1,"), "{signature}");
    let status = http()
        .post(format!("{url}/webhooks/resend"))
        .header("svix-id", "msg_svix_lib")
        .header("svix-timestamp", ts.to_string())
        .header("svix-signature", signature)
        .body(body)
        .send()
        .await
        .unwrap()
        .status();
    daemon.stop().await;
    assert_eq!(status, 200);
}

fn bounced(to: &str, delivery: &DeliveryRef, bounce_type: &str) -> String {
    json!({"type": "email.bounced", "created_at": "2026-11-30T00:00:00Z",
        "data": {"email_id": "e", "to": [to], "tags": {"delivery": delivery.tag()},
                 "bounce": {"type": bounce_type, "subType": "General", "message": "x"}}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_ten_times_at_once_changes_state_once() {
    let world = World::with(Default::default(), listening).await;
    let subs: Vec<Subscriber> = (0..3)
        .map(subscriber)
        .map(|mut s| {
            s.email = "shared@person.example".into(); // three subscribers, one address
            s
        })
        .collect();
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    let (daemon, url) = daemon_with_public(&world.config).await;
    let body = bounced("shared@person.example", &delivery_of(&subs[0]), "Permanent");
    let posts: Vec<_> = (0..10)
        .map(|_| {
            let (url, body) = (url.clone(), body.clone());
            async move { post_event(&url, SECRET, "msg_the_one", &body).await }
        })
        .collect();
    let statuses = futures_like_join(posts).await;
    let metrics = daemon.metrics.clone();
    daemon.stop().await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(metrics.suppressions_by_reason().get("bounced"), Some(&1), "suppressed once");
    assert_eq!(metrics.webhook_requests("verified") + metrics.webhook_requests("duplicate"), 10);
    // Each request is counted "duplicate" when none of its effects was new; two racing
    // requests may each have had one of the two effects first, so at least eight.
    assert!(metrics.webhook_requests("duplicate") >= 8, "{}", metrics.render());
    // Written once on its record, if it still had one (a delivery skipped for the bounce
    // keeps only its settled-history entry, and the tally below counts the event).
    let record = delivery(&world.store, &delivery_of(&subs[0]).id()).await;
    if record.contains_key("events") || !matches!(record["state"].as_str(), "sent" | "skipped") {
        assert_eq!((record["events"].as_str(), record.contains_key("ev_bounced")), ("1", true));
    }
    // The admin overview's last 24 hours count it once too.
    let tallied = mailstream::store::scripts::webhook_events_last_24h(&world.store).await.unwrap();
    assert_eq!(tallied, [("bounced".to_string(), 1)].into(), "{tallied:?}");
    // The cascade reached every subscriber with that address.
    let mut conn = world.store.conn().await.unwrap();
    for s in &subs {
        let key = world.store.keys.subscriber(world.store.keys.partition_of(&s.id), &s.id);
        let (suppressed, subscribed): (Option<String>, String) =
            redis::cmd("HMGET").arg(key).arg("suppressed").arg("subscribed").query_async(&mut conn).await.unwrap();
        assert_eq!((suppressed.as_deref(), subscribed.as_str()), (Some("bounced"), "0"), "{}", s.id);
    }
    let listed = suppression::list(&world.store, None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!format!("{listed:?}").contains('@'), "no address in the record");
}

/// Runs the futures at once and collects their outputs, in order.
async fn futures_like_join<F: std::future::Future<Output = u16> + Send + 'static>(fs: Vec<F>) -> Vec<u16> {
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounces_and_complaints_from_the_emulator_suppress_and_the_next_week_skips_them() {
    let mut world = World::with(Default::default(), listening).await;
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", public.local_addr().unwrap());
    let target = WebhookTarget { url: format!("{url}/webhooks/resend"), secret: SECRET.into() };
    let (emulator, _stop) = world.emulator(EmulatorConfig { webhook: Some(target), ..Default::default() }).await;
    let mut subs: Vec<Subscriber> = (0..40).map(subscriber).collect();
    subs[3].email = "bounced+u3@resend.dev".into();
    subs[4].email = "complained+u4@resend.dev".into();
    subs[5].email = "bounced+u3@resend.dev".into(); // another subscriber, the same dead address
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    let listeners = Listeners { metrics: None, public: Some(public) };
    let daemon = Daemon::start_listening(world.config.clone(), RunOptions::default(), listeners);
    world.settled(SETTLE).await;
    // 40 delivered/bounced events and one complaint.
    let all_in = eventually(Duration::from_secs(30), || {
        let stats = emulator.stats();
        async move { (stats.webhooks_delivered >= 41).then_some(()) }
    })
    .await;
    let metrics = daemon.metrics.clone();
    assert!(all_in.is_some(), "{:?}", emulator.stats());
    assert_eq!(metrics.suppressions_by_reason().get("bounced"), Some(&1));
    assert_eq!(metrics.suppressions_by_reason().get("complained"), Some(&1));
    // Events about deliveries already settled (kept compactly, without a record) are
    // counted, each once, not taken for repeats.
    let posted = emulator.stats().webhooks_delivered;
    assert_eq!(metrics.webhook_requests("verified"), posted, "{}", metrics.render());
    let tallied = mailstream::store::scripts::webhook_events_last_24h(&world.store).await.unwrap();
    assert_eq!(tallied.values().sum::<u64>(), posted, "{tallied:?}");
    // Next week: the kick leaves the three out...
    let next =
        mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(1)).await.unwrap();
    assert_eq!((next.new, next.not_eligible), (37, 3), "{next:?}");
    // ...and a delivery that was enqueued anyway is skipped when claimed.
    let mut conn = world.store.conn().await.unwrap();
    let late = DeliveryRef::new(CAMPAIGN, &week(1), &subs[4].id, &subs[4].targets_or_default()[0]);
    scripts::enqueue(
        &mut conn,
        &world.store.keys,
        world.store.keys.partition_of(&subs[4].id),
        std::slice::from_ref(&late),
        3600,
        window(&world.config, &week(1)),
    )
    .await
    .unwrap();
    let skipped = eventually(SETTLE, || {
        let store = world.store.clone();
        let id = late.id();
        async move {
            let d = delivery(&store, &id).await;
            let c = store.counts(CAMPAIGN, &week(1)).await.ok()?;
            let done = c.settled() >= c.enqueued && d.get("state").map(String::as_str) == Some("skipped");
            done.then(|| d["reason"].clone())
        }
    })
    .await;
    daemon.stop().await;
    assert_eq!(skipped.as_deref(), Some("suppressed"));
    assert_eq!(emulator.sends_matching(&week(1)).len(), 37);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_bounces_suppress_only_at_the_third_within_the_window() {
    let world = World::with(Default::default(), listening).await;
    let subs = world.subscribers(2).await;
    let (daemon, url) = daemon_with_public(&world.config).await;
    let address = subs[0].email.clone();
    let body = bounced(&address, &delivery_of(&subs[0]), "Transient");
    for (n, id) in ["msg_t1", "msg_t2"].iter().enumerate() {
        assert_eq!(post_event(&url, SECRET, id, &body).await, 200);
        assert!(suppression::list(&world.store, Some(&address)).await.unwrap().is_empty(), "not after {}", n + 1);
    }
    // A repeat of the second is not a third.
    assert_eq!(post_event(&url, SECRET, "msg_t2", &body).await, 200);
    assert!(suppression::list(&world.store, Some(&address)).await.unwrap().is_empty());
    assert_eq!(post_event(&url, SECRET, "msg_t3", &body).await, 200);
    let listed = suppression::list(&world.store, Some(&address)).await.unwrap();
    daemon.stop().await;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].reason.as_str(), listed[0].source.as_str()), ("transient_bounces", "webhook"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_click_unsubscribe_acts_once_and_only_on_post() {
    let mut world = World::with(Default::default(), |c| {
        listening(c);
        c.redis.partitions = 1;
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(5).await;
    world.kick().await;
    // The sealed request carries the RFC 8058 headers.
    let store = world.store.clone();
    let body = Arc::new(std::sync::Mutex::new(String::new()));
    let seen_body = body.clone();
    let peek = mailstream::Failpoints::new(move |at| -> mailstream::Hold {
        if at != mailstream::model::outcome::Failpoint::Sealed {
            return Box::pin(async {});
        }
        let (store, body) = (store.clone(), seen_body.clone());
        Box::pin(async move {
            let mut conn = store.conn().await.unwrap();
            for key in store.scan("mailstream:*:batch:*").await.unwrap() {
                let b: String = redis::cmd("HGET").arg(key).arg("body").query_async(&mut conn).await.unwrap();
                *body.lock().unwrap() = b;
            }
        })
    });
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", public.local_addr().unwrap());
    let mut config = world.config.clone();
    config.unsubscribe.base_url = url.clone();
    let listeners = Listeners { metrics: None, public: Some(public) };
    let daemon = Daemon::start_listening(config, RunOptions { failpoints: peek, ..Default::default() }, listeners);
    world.settled(SETTLE).await;
    let emails: Vec<serde_json::Value> = serde_json::from_str(&body.lock().unwrap()).unwrap();
    let headers = &emails[0]["headers"];
    assert_eq!(headers["List-Unsubscribe-Post"], "List-Unsubscribe=One-Click");
    let link = headers["List-Unsubscribe"].as_str().unwrap().trim_matches(|c| c == '<' || c == '>').to_string();
    assert!(link.starts_with(&format!("{url}/u/")) && !link.contains('@'), "{link}");
    let subscriber = emails[0]["tags"][2]["value"].as_str().map(DeliveryRef::from_tag).unwrap().unwrap().subscriber;
    assert_eq!(emulator.stats().emails_accepted, 5);

    let client = http();
    // GET (a link scanner) shows a page and changes nothing.
    let page = client.get(&link).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("<form method=\"post\""));
    let off_field = format!("off:{CAMPAIGN}");
    let key = world.store.keys.subscriber(0, &subscriber);
    let mut conn = world.store.conn().await.unwrap();
    let off: Option<String> = redis::cmd("HGET").arg(&key).arg(&off_field).query_async(&mut conn).await.unwrap();
    assert!(off.is_none(), "a GET never unsubscribes");
    // POST acts, once.
    for _ in 0..2 {
        let r = client.post(&link).body("List-Unsubscribe=One-Click").send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let off: Option<String> = redis::cmd("HGET").arg(&key).arg(&off_field).query_async(&mut conn).await.unwrap();
    assert!(off.is_some());
    // Forged, altered and rotated-out tokens: refused, nothing changes.
    let other = subs.iter().find(|s| s.id != subscriber).unwrap();
    let rotated_out = Tokens::new(&[Secret::new("an-old-secret-no-longer-listed")]).make(&other.id, CAMPAIGN).unwrap();
    let token = link.rsplit('/').next().unwrap();
    // The same signature on another subscriber's payload.
    let (_, tag) = token.split_once('.').unwrap();
    let payload =
        base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, format!("{}\n{CAMPAIGN}", other.id));
    let altered = format!("{payload}.{tag}");
    for (path, want) in [(format!("/u/{rotated_out}"), 404), (format!("/u/{altered}"), 404), ("/u/garbage".into(), 400)]
    {
        let r = client.post(format!("{url}{path}")).body("List-Unsubscribe=One-Click").send().await.unwrap();
        assert_eq!(r.status(), want, "{path}");
    }
    let other_key = world.store.keys.subscriber(0, &other.id);
    let off: Option<String> = redis::cmd("HGET").arg(&other_key).arg(&off_field).query_async(&mut conn).await.unwrap();
    assert!(off.is_none());
    let metrics = daemon.metrics.clone();
    daemon.stop().await;
    assert!(metrics.render().contains("mailstream_unsubscribes_total{source=\"one_click\"} 1"));
    // The next kick leaves the subscriber out.
    let next =
        mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(1)).await.unwrap();
    assert_eq!((next.new, next.not_eligible), (4, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_public_listener_refuses_big_bodies_and_floods() {
    let world = World::with(Default::default(), |c| {
        listening(c);
        c.http.public_max_body_bytes = 4096;
        c.http.public_requests_per_second_per_source = 5;
    })
    .await;
    let (daemon, url) = daemon_with_public(&world.config).await;
    let client = http();
    let big = client.post(format!("{url}/webhooks/resend")).body(vec![b'x'; 10_000]).send().await.unwrap();
    assert_eq!(big.status(), 413);
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..12 {
        let r = client.post(format!("{url}/webhooks/resend")).body("{}").send().await.unwrap();
        if r.status() == 429 {
            retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
        }
        statuses.push(r.status().as_u16());
    }
    daemon.stop().await;
    assert!(statuses.contains(&401) && statuses.contains(&429), "{statuses:?}");
    assert!(retry_after.is_some_and(|s| s.parse::<u64>().is_ok_and(|n| n >= 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_suppresses_and_lifts_an_address() {
    let world = World::with(Default::default(), listening).await;
    let subs = world.subscribers(10).await;
    let address = subs[2].email.clone();
    let act = suppression::Act::Suppress(mailstream::model::outcome::Why::Manual);
    assert_eq!(
        suppression::apply(&world.store, &world.config, &address, act, None).await.unwrap(),
        scripts::Suppressed::New
    );
    let kicked = world.kick().await;
    assert_eq!((kicked.new, kicked.not_eligible), (9, 1));
    // A re-import of the subscriber keeps the suppression.
    subscribers::upsert(&world.store, &subs[2..3]).await.unwrap();
    let kicked =
        mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(1)).await.unwrap();
    assert_eq!(kicked.not_eligible, 1);
    suppression::apply(&world.store, &world.config, &address, suppression::Act::Lift, None).await.unwrap();
    assert!(suppression::list(&world.store, None).await.unwrap().is_empty());
    // Lifted, and subscribed again by the application: mailed again.
    subscribers::upsert(&world.store, &subs[2..3]).await.unwrap();
    let kicked =
        mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(2)).await.unwrap();
    assert_eq!(kicked.new, 10);
}
