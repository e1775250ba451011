//! A browser subscription cannot aim the daemon anywhere: every endpoint an outside check
//! had the daemon accept (internal addresses in every spelling, the userinfo trick) is
//! refused at registration, by the CLI (exit 64) and the ingest API (400), with nothing
//! written; one stored by an older version is never sent to (skipped
//! `push_endpoint_refused`, counted by reason), including a name that resolves to a
//! forbidden address; and a redirect is an answer, never followed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use mailstream::audience::subscribers::push::Subscription;
use mailstream::config::{PushChannelConfig, Secret};
use mailstream::model::webpush::VapidKey;
use mailstream::model::work::{Channel, DeliveryRef};
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::tools::emulator::push::PushService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SETTLE: Duration = Duration::from_secs(90);
const TOKEN: &str = "ingest-token-0123456789";

/// Every endpoint of the finding, and the rule that refuses it.
const REFUSED: [(&str, &str); 14] = [
    ("https://10.0.0.5/push/secret-path", "address"),
    ("https://192.168.1.10/push/secret-path", "address"),
    ("https://172.16.0.1/push/secret-path", "address"),
    ("https://169.254.169.254/latest/secret-path", "address"),
    ("https://127.0.0.1/push/secret-path", "address"),
    ("https://localhost/push/secret-path", "host"),
    ("https://[::1]/push/secret-path", "address"),
    ("https://[fd00::1]/push/secret-path", "address"),
    ("https://0.0.0.0/push/secret-path", "address"),
    ("https://2130706433/push/secret-path", "address"),
    ("https://0x7f.1/push/secret-path", "address"),
    ("https://[::ffff:169.254.169.254]/push/secret-path", "address"),
    ("https://user:pw@fcm.googleapis.com/fcm/send/secret-path", "user"),
    ("http://127.0.0.1:1@otherhost/push/secret-path", "user"),
];

/// A browser's subscription to `endpoint`, with real keys.
fn subscription(endpoint: &str) -> serde_json::Value {
    let key = mailstream::model::webpush::public_b64(&mailstream::model::webpush::new_secret().public_key());
    serde_json::json!({ "endpoint": endpoint, "keys": { "p256dh": key, "auth": "AAECAwQFBgcICQoLDA0ODw" } })
}

/// A world whose campaign goes by Web Push to the emulator's push service, listed as the
/// one loopback service this deployment sends to (`extra`: more entries).
async fn push_world(extra: &[String]) -> (World, PushService, String) {
    let service = PushService::new();
    let (_, stop, _) = service.spawn_local().await.unwrap();
    std::mem::forget(stop);
    let (private, _) = VapidKey::generate();
    let mut allowed = vec![service.allowed_host()];
    allowed.extend(extra.iter().cloned());
    let mut world = World::with(Default::default(), |c| {
        c.campaigns[0].channels = vec![Channel::Push];
        c.channels.push = Some(PushChannelConfig {
            allowed_hosts: Some(allowed.clone()),
            timeout_ms: 2000,
            requests_per_second_per_service: 1000,
            ..PushChannelConfig::new("mailto:ops@example.com", Secret::new(private.clone()))
        });
    })
    .await;
    world.config.http.ingest_tokens = vec![Secret::new(TOKEN)];
    let (_emulator, stop_emulator) = world.emulator(EmulatorConfig::default()).await;
    std::mem::forget(stop_emulator);
    (world, service, private)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_unsafe_endpoint_is_refused_by_the_cli_and_the_api_and_nothing_is_written() {
    let (world, _service, private) = push_world(&[]).await;
    let subs = world.subscribers(1).await;
    let id = subs[0].id.clone();
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/push-subscriptions", public.local_addr().unwrap());
    let listeners = mailstream::Listeners { metrics: None, public: Some(public) };
    let daemon = Daemon::start_listening(world.config.clone(), Default::default(), listeners);
    mailstream::resend::client::install_crypto_provider();
    let http = reqwest::Client::new();

    // The CLI reads a config like this deployment's.
    let push = "[channels.push]\nallowed_hosts = [\"fcm.googleapis.com\"]\nsubject";
    let config = common::cli::config_file(
        "push-endpoints.toml",
        &[common::cli::TEST_REDIS, ("partitions = 1", "partitions = 2"), ("# [channels.push]\n# subject", push)],
    );
    let redis = world.redis.url();
    for (endpoint, rule) in REFUSED {
        let s = subscription(endpoint);
        let r = http
            .post(&url)
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({"subscriber": id, "subscription": s}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(status, 400, "{endpoint}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(rule) && !error.contains("secret-path"), "{endpoint}: {error}");

        let out = common::cli::bin()
            .args(["subscribe", "--id", &id, "--push-subscription", &s.to_string(), "--config"])
            .arg(&config)
            .env("MAILSTREAM_REDIS_URL", &redis)
            .env("MAILSTREAM_VAPID_PRIVATE_KEY", &private)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{endpoint}: {err}");
        assert!(err.contains(rule) && !err.contains("secret-path") && !err.contains("pw@"), "{endpoint}: {err}");
        assert!(common::cli::stdout(&out).is_empty(), "{endpoint}");
    }
    daemon.stop().await;
    let mut conn = world.store.conn().await.unwrap();
    let keys = &world.store.keys;
    let stored: u64 = redis::cmd("HLEN")
        .arg(keys.push_subscriptions(keys.partition_of(&id), &id))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored, 0, "nothing was registered");
    // A compressed p256dh (33 bytes) is refused too: RFC 8291 §4 wants the 65-byte point.
    let compressed = {
        use base64::Engine;
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        let key = mailstream::model::webpush::new_secret().public_key();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.to_encoded_point(true).as_bytes())
    };
    let mut s = subscription("https://fcm.googleapis.com/fcm/send/x");
    s["keys"]["p256dh"] = compressed.into();
    let allowed = world.config.push_allowed_hosts();
    let e = Subscription::register_value(s, &allowed).unwrap_err();
    assert!(e.contains("uncompressed"), "{e}");
}

/// A TCP listener that answers every request with `response` and counts connections.
async fn counting_server(response: String) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hits = Arc::new(AtomicU64::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let response = response.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = socket.read(&mut buf).await;
                let _ = socket.write_all(response.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (addr, hits)
}

/// Writes `endpoint` as subscriber `id`'s subscription straight into Redis, as an older
/// version (or a hand) would have, bypassing the registration's checks.
async fn stored(world: &World, id: &str, endpoint: &str) {
    let s: Subscription = Subscription::from_value(subscription(endpoint)).expect("well-formed");
    let keys = &world.store.keys;
    let mut conn = world.store.conn().await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg(keys.push_subscriptions(keys.partition_of(id), id))
        .arg(s.id())
        .arg(serde_json::to_string(&s).unwrap())
        .query_async(&mut conn)
        .await
        .unwrap();
}

async fn push_settled(world: &World) -> mailstream::store::Counts {
    eventually(SETTLE, || async {
        let c = world.store.channel_counts(CAMPAIGN, &PERIOD, Channel::Push).await.ok()?;
        (c.enqueued > 0 && c.settled() >= c.enqueued).then_some(c)
    })
    .await
    .expect("the push deliveries settled")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_unsafe_endpoint_is_never_sent_to_and_a_redirect_is_not_followed() {
    // Internal services that must never be reached, and a listed one that answers 302 to one.
    let (internal, internal_hits) = counting_server("HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n".into()).await;
    let (target, target_hits) = counting_server("HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n".into()).await;
    let redirect = format!("HTTP/1.1 302 Found\r\nlocation: http://{target}/push/1\r\ncontent-length: 0\r\n\r\n");
    let (redirecting, redirecting_hits) = counting_server(redirect).await;
    let internal_port = internal.rsplit(':').next().unwrap().to_string();
    // `localhost` is listed without a port: a name, taken at registration, that resolves
    // to loopback at send time (what a rebinding name does): refused on its addresses.
    let (world, _service, _) = push_world(&["localhost".into(), redirecting.clone()]).await;
    let subs = world.subscribers(4).await;
    stored(&world, &subs[0].id, &format!("http://{internal}/push/secret-path")).await;
    stored(&world, &subs[1].id, &format!("http://user:pw@{internal}/push/secret-path")).await;
    stored(&world, &subs[2].id, &format!("https://localhost:{internal_port}/push/secret-path")).await;
    stored(&world, &subs[3].id, &format!("http://{redirecting}/push/1")).await;
    world.kick().await;
    let daemon = world.daemon();
    let counts = push_settled(&world).await;
    let scrape = daemon.metrics.render();
    daemon.stop().await;
    assert_eq!(internal_hits.load(Ordering::SeqCst), 0, "an internal address was reached");
    assert_eq!(target_hits.load(Ordering::SeqCst), 0, "a redirect was followed");
    assert_eq!(redirecting_hits.load(Ordering::SeqCst), 1, "the listed service is asked once");
    assert_eq!((counts.skipped, counts.failed, counts.sent), (3, 1, 0), "{counts:?}");
    for (sub, reason) in
        [(&subs[0], "push_endpoint_refused"), (&subs[1], "push_endpoint_refused"), (&subs[2], "push_endpoint_refused")]
    {
        let d = DeliveryRef::new(CAMPAIGN, &PERIOD, &sub.id, &sub.targets_or_default()[0]).on(Channel::Push);
        let kept = delivery(&world.store, &d.id()).await;
        assert_eq!(
            (kept["state"].as_str(), kept.get("reason").map(String::as_str)),
            ("skipped", Some(reason)),
            "{kept:?}"
        );
    }
    let d = DeliveryRef::new(CAMPAIGN, &PERIOD, &subs[3].id, &subs[3].targets_or_default()[0]).on(Channel::Push);
    let kept = delivery(&world.store, &d.id()).await;
    assert_eq!(kept.get("state").map(String::as_str), Some("failed"), "{kept:?}");
    let refused =
        |reason: &str| metric(&scrape, "mailstream_push_endpoints_refused_total", &format!("reason=\"{reason}\""));
    assert_eq!((refused("not_https"), refused("userinfo"), refused("address_forbidden")), (1.0, 1.0, 1.0), "{scrape}");
    assert_eq!(refused("host_not_allowed"), 0.0);
    assert_eq!(metric(&scrape, "mailstream_push_requests_total", "status_class=\"3xx\""), 1.0, "{scrape}");
}
