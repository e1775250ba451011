//! Transactional sends: the ingest API (auth, whole-body refusals, per-item
//! errors, idempotency keys replayed at once), `mailstream enqueue`'s path, the
//! recipient kept out of streams, suppression, and the lane that overtakes a
//! running digest.

mod common;

use std::time::Duration;

use common::*;
use mailstream::audience::ingest;
use mailstream::config::{Config, Secret};
use mailstream::model::work::TRANSACTIONAL;
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::{Listeners, RunOptions};
use serde_json::{Value, json};

const TOKEN: &str = "ingest-token-0123456789";

fn with_ingest(c: &mut Config) {
    c.http.ingest_tokens = vec![Secret::new(TOKEN)];
}

async fn daemon_with_public(config: &Config) -> (Daemon, String) {
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/deliveries", public.local_addr().unwrap());
    let listeners = Listeners { metrics: None, public: Some(public) };
    (Daemon::start_listening(config.clone(), RunOptions::default(), listeners), url)
}

fn http() -> reqwest::Client {
    mailstream::resend::client::install_crypto_provider();
    reqwest::Client::builder().build().unwrap()
}

async fn post(url: &str, token: Option<&str>, body: String) -> (u16, Value) {
    let mut req = http().post(url).header("content-type", "application/json").body(body);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let response = req.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn receipt(key: &str, to: &str) -> Value {
    json!({"idempotency_key": key, "to": to, "subject": "Your receipt", "text": "Thanks.", "html": "<p>Thanks.</p>"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingest_api_refuses_whole_bodies_and_reports_each_bad_item() {
    let mut world = World::with(Default::default(), with_ingest).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let (daemon, url) = daemon_with_public(&world.config).await;
    let good = json!({"deliveries": [receipt("r-1", "delivered+r1@resend.dev")]}).to_string();

    assert_eq!(post(&url, None, good.clone()).await.0, 401, "no token");
    assert_eq!(post(&url, Some("wrong-token-0123456789"), good.clone()).await.0, 401, "wrong token");
    assert_eq!(post(&url, Some(TOKEN), "{not json".into()).await.0, 400);
    assert_eq!(post(&url, Some(TOKEN), json!([receipt("r-1", "a@b.example")]).to_string()).await.0, 400);
    let many: Vec<Value> = (0..1001).map(|i| receipt(&format!("m-{i}"), "delivered@resend.dev")).collect();
    let (status, body) = post(&url, Some(TOKEN), json!({ "deliveries": many }).to_string()).await;
    assert_eq!(status, 413, "{body}");
    // With the token a body may carry a delivery's attachments (10 MiB + 64 KiB); past that, 413.
    let huge = format!("{{\"deliveries\": [{{\"idempotency_key\": \"h\", \"text\": \"{}\"}}]}}", "x".repeat(11 << 20));
    assert_eq!(post(&url, Some(TOKEN), huge).await.0, 413, "over the body limit");
    assert_eq!(world.store.counts(TRANSACTIONAL, &today(&world.store).await).await.unwrap().enqueued, 0);

    let mixed = json!({"deliveries": [
        receipt("r-1", "delivered+r1@resend.dev"),
        {"idempotency_key": "r-2", "to": "not an address", "subject": "s", "text": "t"},
        {"idempotency_key": "r-3", "subscriber": "user-000001", "template": "no_such_template"},
        {"to": "delivered@resend.dev", "subject": "s", "text": "t"},
        {"idempotency_key": "r-5", "subscriber": "user-000001", "template": "weekly_digest", "bcc": "x"},
        {"idempotency_key": "r-6", "subscriber": "nosuch", "subject": "s", "text": "t"},
    ]});
    let (status, body) = post(&url, Some(TOKEN), mixed.to_string()).await;
    assert_eq!(status, 207, "{body}");
    let results = body["results"].as_array().unwrap();
    let fields: Vec<(&str, &str)> =
        results.iter().map(|r| (r["status"].as_str().unwrap(), r["field"].as_str().unwrap_or(""))).collect();
    assert_eq!(
        fields,
        vec![
            ("accepted", ""),
            ("invalid", "to"),
            ("invalid", "template"),
            ("invalid", "idempotency_key"),
            ("invalid", "bcc"),
            ("refused", "subscriber")
        ]
    );
    // A subscriber the registry does not hold is refused at the door, not skipped later.
    assert_eq!((results[5]["error"].as_str(), body["refused"].as_u64()), (Some("unknown_subscriber"), Some(5)));
    assert!(!body.to_string().contains("not an address"), "values are never echoed: {body}");
    assert_eq!(results[0]["delivery"], format!("transactional:{}:-:r-1", today(&world.store).await));
    let (status, body) = post(&url, Some(TOKEN), good).await;
    assert_eq!((status, body["duplicates"].as_u64()), (202, Some(1)), "{body}");
    tx_settled(&world.store, 1).await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_replayed_at_once_enqueues_one_delivery_and_a_changed_request_is_refused() {
    let mut world = World::with(Default::default(), with_ingest).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let (daemon, url) = daemon_with_public(&world.config).await;
    let body = json!({"deliveries": [receipt("order-77", "delivered+o77@resend.dev")]}).to_string();
    let posts: Vec<_> = (0..10)
        .map(|_| {
            let (url, body) = (url.clone(), body.clone());
            async move { post(&url, Some(TOKEN), body).await }
        })
        .collect();
    let answers = futures_join(posts).await;
    let accepted: u64 = answers.iter().map(|(_, b)| b["accepted"].as_u64().unwrap()).sum();
    let duplicates: u64 = answers.iter().map(|(_, b)| b["duplicates"].as_u64().unwrap()).sum();
    assert!(answers.iter().all(|(s, _)| *s == 202), "{answers:?}");
    assert_eq!((accepted, duplicates), (1, 9));
    let changed = json!({"deliveries": [receipt("order-77", "delivered+someone-else@resend.dev")]}).to_string();
    let (status, answer) = post(&url, Some(TOKEN), changed).await;
    assert_eq!((status, answer["results"][0]["status"].as_str()), (207, Some("conflict")), "{answer}");
    let counts = tx_settled(&world.store, 1).await;
    assert_eq!((counts.enqueued, counts.sent, counts.duplicates), (1, 1, 9));
    assert_eq!(emulator.stats().emails_accepted, 1);
    daemon.stop().await;
}

/// Joins futures without another dependency.
async fn futures_join<F: std::future::Future + Send + 'static>(futures: Vec<F>) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_sends_reach_addresses_and_subscribers_and_keep_addresses_out_of_streams() {
    let mut world = World::new().await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(3).await;
    // One address suppressed earlier (a bounce): skipped, never sent.
    mailstream::audience::suppression::apply(
        &world.store,
        &world.config,
        "bounced+gone@resend.dev",
        mailstream::audience::suppression::Act::Suppress(mailstream::model::outcome::Why::Manual),
        None,
    )
    .await
    .unwrap();
    let items = vec![
        receipt("inline-1", "delivered+inline@resend.dev"),
        json!({"idempotency_key": "sub-1", "subscriber": "user-000001", "template": "weekly_digest", "data": {"name": "Ann"}}),
        receipt("gone-1", "bounced+gone@resend.dev"),
        json!({"idempotency_key": "nobody-1", "subscriber": "no-such-user", "subject": "s", "text": "t"}),
    ];
    // `nobody-1` names no subscriber: let in (as `enqueue --allow-unknown` does), it is
    // skipped at send, as one deleted after its enqueue is.
    let allow = ingest::UnknownSubscriber::Allow;
    let results = ingest::enqueue_with(&world.store, &world.config, items, allow).await.unwrap();
    assert!(results.iter().all(|r| !r.is_refused()), "{results:?}");
    let daemon = world.daemon();
    let counts = tx_settled(&world.store, 4).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped, counts.failed), (2, 2, 0), "{counts:?}");
    let sent = emulator.sends_matching("");
    assert!(sent.contains_key("delivered+inline@resend.dev") && sent.contains_key(&subscriber(1).email), "{sent:?}");
    assert!(!sent.contains_key("bounced+gone@resend.dev"));
    // The streams carry ids only.
    let mut conn = world.store.conn().await.unwrap();
    for p in 0..world.store.keys.partitions() {
        for lane in mailstream::model::work::Lane::ALL {
            let entries: Value = {
                let raw: redis::Value = redis::cmd("XRANGE")
                    .arg(world.store.keys.lane_stream(p, lane))
                    .arg("-")
                    .arg("+")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                Value::String(format!("{raw:?}"))
            };
            assert!(!entries.to_string().contains('@'), "no address in {entries}");
        }
    }
    let day = today(&world.store).await;
    let gone = delivery(&world.store, &format!("transactional:{day}:-:gone-1")).await;
    assert_eq!((gone["state"].as_str(), gone["reason"].as_str()), ("skipped", "suppressed"));
    let nobody = delivery(&world.store, &format!("transactional:{day}:no-such-user:nobody-1")).await;
    assert_eq!(nobody["reason"], "unknown_subscriber");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_overtake_a_running_digest() {
    let mut world = World::with(Default::default(), |c| {
        c.resend.requests_per_second = 10;
        c.delivery.lease_seconds = 15;
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(10_000).await;
    world.kick().await;
    let daemon = world.daemon();
    // The digest is under way: 100 batches of 100 at 10 requests/s (10 s at the least,
    // however busy the machine: the rounds below end well within it).
    eventually(Duration::from_secs(60), || async { (emulator.stats().requests >= 3).then_some(()) }).await.unwrap();
    let mut behind = Vec::new();
    for round in 0..5 {
        let before = emulator.seen().len();
        let items: Vec<Value> = (0..10)
            .map(|i| receipt(&format!("rx-{round}-{i}"), &format!("delivered+rx{round}{i}@resend.dev")))
            .collect();
        let results = ingest::enqueue(&world.store, &world.config, items).await.unwrap();
        assert!(results.iter().all(|r| matches!(r, ingest::ItemResult::Accepted { .. })));
        tx_settled(&world.store, 10 * (round + 1)).await;
        let seen = emulator.seen();
        let at = seen.iter().skip(before).position(|s| s.campaign.as_deref() == Some(TRANSACTIONAL));
        // Requests that left between the enqueue and the receipts' own request.
        behind.push(at.expect("the receipts' request was seen"));
    }
    eprintln!("digest requests between enqueue and the receipts' request, per round: {behind:?}");
    let digest_left = world.counts().await;
    daemon.stop().await;
    // Without a lane of their own they would wait behind the whole digest backlog
    // (dozens of requests); with it, behind at most the requests already under way
    // (here 0; the bound leaves room for a starved reader on a loaded machine).
    assert!(behind.iter().all(|&n| n <= 20), "digest requests before each round's receipts: {behind:?}");
    assert!(digest_left.settled() < digest_left.enqueued, "the digest was still running: {digest_left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_of_a_daemon_that_dies_mid_run_are_sent_once_by_the_next() {
    let mut world = World::with(Default::default(), |c| {
        c.resend.requests_per_second = 20;
        c.resend.batch_size = 10;
        c.delivery.lease_seconds = 3;
    })
    .await;
    // Some answers are lost after the emails were sent: a resend must be a replay.
    let faults = mailstream::tools::emulator::Faults { hang: 0.2, hang_ms: 2500, ..Default::default() };
    let (emulator, _stop) = world.emulator(EmulatorConfig { faults, ..Default::default() }).await;
    let items: Vec<Value> =
        (0..300).map(|i| receipt(&format!("crash-{i}"), &format!("delivered+crash{i}@resend.dev"))).collect();
    ingest::enqueue(&world.store, &world.config, items).await.unwrap();
    let first = world.daemon();
    let day = today(&world.store).await;
    let store = world.store.clone();
    eventually(Duration::from_secs(60), || {
        let (store, day) = (store.clone(), day.clone());
        async move { (store.counts(TRANSACTIONAL, &day).await.ok()?.sent >= 60).then_some(()) }
    })
    .await
    .expect("some receipts sent");
    // Killed: no graceful stop, its claims and sealed batches left behind.
    first.task.abort();
    let _ = first.task.await;
    let second = world.daemon_as("second");
    let counts = tx_settled(&world.store, 300).await;
    second.stop().await;
    let stats = emulator.stats();
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (300, 0, 0), "{counts:?}");
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (300, 0), "{stats:?}");
}
