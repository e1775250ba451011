//! Attachments on receipts (#53): a file read by `mailstream enqueue --attach` in the CLI
//! process goes out once through Resend's `POST /emails` (never in a batch), overtaking a
//! running digest; its key replayed sends nothing; the ingest API refuses a remote `path`
//! whole and an oversized attachment with its size and the limit, reads a larger body only
//! for its token, and answers 429 past the pending bytes of a partition; a receipt that
//! fails loses its files, and its retry is refused.

mod common;

use std::time::Duration;

use common::cli::{ANY_METRICS_PORT, TEST_REDIS, config_file, run, stdout};
use common::*;
use mailstream::audience::ingest;
use mailstream::config::{Config, Secret};
use mailstream::model::outcome::Requeue;
use mailstream::model::work::TRANSACTIONAL;
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::{Listeners, RunOptions};
use serde_json::{Value, json};

const TOKEN: &str = "ingest-token-0123456789";

fn http() -> reqwest::Client {
    mailstream::resend::client::install_crypto_provider();
    reqwest::Client::builder().build().unwrap()
}

/// `n` bytes that do not compress, as a PDF would not.
fn file_bytes(n: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn base64_of(n: usize) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(file_bytes(n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_with_a_pdf_goes_once_through_emails_overtaking_a_running_digest() {
    let mut world = World::with(Default::default(), |c| {
        c.resend.requests_per_second = 10;
        c.delivery.lease_seconds = 15;
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let base_url = format!("base_url = \"{}\"", world.config.resend.base_url);
    let path = config_file(
        "attach.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            TEST_REDIS,
            ANY_METRICS_PORT,
            ("partitions = 1", "partitions = 2"),
        ],
    );
    let pdf = std::env::temp_dir().join(format!("mailstream-invoice-{}.pdf", std::process::id()));
    std::fs::write(&pdf, file_bytes(1_048_576)).unwrap();
    world.subscribers(8_000).await;
    world.kick().await;
    let daemon = world.daemon();
    // The digest is under way: 80 requests at 10 a second.
    eventually(Duration::from_secs(60), || async { (emulator.stats().requests >= 3).then_some(()) }).await.unwrap();
    let before = emulator.seen().len();
    let url = world.redis.url();
    let args = [
        "enqueue",
        "--key",
        "invoice-42",
        "--to",
        "delivered+inv42@resend.dev",
        "--subject",
        "Your invoice 42",
        "--text",
        "Attached.",
        "--attach",
        pdf.to_str().unwrap(),
        "--json",
    ];
    let enqueued = run(&path, &url, &args, "");
    assert!(enqueued.status.success(), "{}", String::from_utf8_lossy(&enqueued.stderr));
    let said: Value = serde_json::from_str(stdout(&enqueued).lines().last().unwrap()).unwrap();
    assert_eq!(said["accepted"], 1, "{said}");
    let counts = tx_settled(&world.store, 1).await;
    assert_eq!(counts.sent, 1, "{counts:?}");
    let seen = emulator.seen();
    let at = seen.iter().skip(before).position(|s| s.campaign.as_deref() == Some(TRANSACTIONAL));
    let receipt = &seen[before + at.expect("the receipt's request was seen")];
    assert_eq!((receipt.emails, receipt.status), (1, 200), "one email, accepted: {receipt:?}");
    let digest_left = world.counts().await;
    assert!(digest_left.settled() < digest_left.enqueued, "it overtook the digest: {digest_left:?}");
    assert!(at.unwrap() <= 20, "behind at most the requests under way: {at:?}");
    let stats = emulator.stats();
    assert_eq!((stats.attachments_accepted, stats.attachment_bytes), (1, 1_048_576), "{stats:?}");

    // The same key again: nothing new, nothing sent.
    let again = run(&path, &url, &args, "");
    let said: Value = serde_json::from_str(stdout(&again).lines().last().unwrap()).unwrap();
    assert_eq!((said["accepted"].as_u64(), said["duplicates"].as_u64()), (Some(0), Some(1)), "{said}");
    world.settled(Duration::from_secs(120)).await;
    daemon.stop().await;
    let stats = emulator.stats();
    assert_eq!(stats.attachments_accepted, 1, "{stats:?}");
    assert_eq!(stats.duplicate_sends, 0);
    assert!(emulator.seen().iter().all(|s| s.status != 422), "no batch carried the attachment");
    assert_eq!(emulator.sends_matching("Your invoice 42").values().sum::<u32>(), 1);
    let _ = std::fs::remove_file(&pdf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ingest_api_bounds_attachments_by_size_by_token_and_by_what_waits() {
    let (_socket, port) = closed_port();
    let world = World::with(Default::default(), |c: &mut Config| {
        c.http.ingest_tokens = vec![Secret::new(TOKEN)];
        c.http.public_max_body_bytes = 64 * 1024;
        c.attachments.max_bytes = 200_000;
        c.attachments.max_pending_bytes = 300_000;
        // The limit is per partition: one, so every receipt below counts against it.
        c.redis.partitions = 1;
        // No provider: what is enqueued waits.
        c.resend.base_url = format!("http://127.0.0.1:{port}");
    })
    .await;
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/deliveries", public.local_addr().unwrap());
    let listeners = Listeners { metrics: None, public: Some(public) };
    let daemon = Daemon::start_listening(world.config.clone(), RunOptions::default(), listeners);
    let post = |token: Option<&'static str>, items: Vec<Value>| {
        let body = json!({ "deliveries": items }).to_string();
        let mut req = http().post(&url).header("content-type", "application/json").body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        async move {
            let r = req.send().await.unwrap();
            let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
            (r.status().as_u16(), retry_after, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let receipt = |key: &str, attachment: Value| {
        json!({"idempotency_key": key, "to": "delivered@resend.dev", "subject": "Receipt", "text": "Attached.",
               "attachments": [attachment]})
    };
    let file = |bytes: usize| json!({"filename": "receipt.pdf", "content": base64_of(bytes), "content_type": "application/pdf"});

    // A file for Resend to fetch: the whole request is refused, nothing enqueued.
    let remote = receipt("r-path", json!({"filename": "x.pdf", "path": "https://files.example/x.pdf"}));
    let (status, _, body) = post(Some(TOKEN), vec![receipt("r-ok", file(10)), remote]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("deliveries[1].attachments[0].path"), "{body}");
    let day = today(&world.store).await;
    assert_eq!(world.store.counts(TRANSACTIONAL, &day).await.unwrap().enqueued, 0);

    // Over the limit: refused with its size and the limit (base64 of 150,003 bytes is 200,004).
    let (status, _, body) = post(Some(TOKEN), vec![receipt("r-big", file(150_003))]).await;
    assert_eq!(status, 207, "{body}");
    let error = body["results"][0]["error"].as_str().unwrap();
    assert!(error.contains("200004 bytes") && error.contains("attachments.max_bytes (200000)"), "{error}");

    // A body past the listener's 64 KiB: read only for the token's holder.
    let (status, _, _) = post(None, vec![receipt("r-1", file(110_000))]).await;
    assert_eq!(status, 413, "without the token the listener's own limit holds");
    let (status, _, body) = post(Some(TOKEN), vec![receipt("r-1", file(110_000))]).await;
    assert_eq!(status, 202, "{body}");
    // 146,668 pending; another 146,668 fits in 300,000; a third does not: 429, come back later.
    let (status, _, body) = post(Some(TOKEN), vec![receipt("r-2", file(110_000))]).await;
    assert_eq!(status, 202, "{body}");
    let (status, retry_after, body) = post(Some(TOKEN), vec![receipt("r-3", file(10_000))]).await;
    assert_eq!(status, 429, "{body}");
    assert!(retry_after.is_some_and(|s| s.parse::<u64>().unwrap() > 0));
    assert_eq!(body["results"][0]["status"], "retry_later", "{body}");
    // A receipt without files still goes in.
    let plain =
        json!({"idempotency_key": "r-4", "to": "delivered@resend.dev", "subject": "Receipt", "text": "No file."});
    assert_eq!(post(Some(TOKEN), vec![plain]).await.0, 202);
    daemon.stop().await;
    // The files sit in the records (Redis and its AOF) and nowhere else: no stream entry.
    let mut conn = world.store.conn().await.unwrap();
    for p in 0..world.store.keys.partitions() {
        let stream = world.store.keys.lane_stream(p, mailstream::model::work::Lane::Transactional);
        let entries: Vec<redis::Value> =
            redis::cmd("XRANGE").arg(&stream).arg("-").arg("+").query_async(&mut conn).await.unwrap();
        assert!(!format!("{entries:?}").contains("receipt.pdf"), "no file in a stream entry");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_that_fails_loses_its_files_and_its_retry_is_refused() {
    let mut world = World::new().await;
    let refusing = EmulatorConfig { api_key: Some("re_another_teams_key".into()), ..Default::default() };
    let (emulator, _stop) = world.emulator(refusing).await;
    let item = json!({"idempotency_key": "inv-7", "to": "delivered@resend.dev", "subject": "Invoice 7", "text": "Attached.",
                      "attachments": [{"filename": "invoice-7.pdf", "content": base64_of(3000)}]});
    let results = ingest::enqueue(&world.store, &world.config, vec![item]).await.unwrap();
    let ingest::ItemResult::Accepted { delivery, .. } = &results[0] else { panic!("{results:?}") };
    let record = common::delivery(&world.store, delivery).await;
    assert!(
        record.contains_key("attachments") && !record["request"].contains("invoice-7.pdf"),
        "kept apart: {record:?}"
    );
    let daemon = world.daemon();
    let counts = tx_settled(&world.store, 1).await;
    daemon.stop().await;
    assert_eq!(counts.failed, 1, "{counts:?}");
    assert_eq!(emulator.stats().attachments_accepted, 0);
    let record = common::delivery(&world.store, delivery).await;
    assert!(!record.contains_key("attachments"), "deleted when it settled: {record:?}");
    assert_eq!(record.get("attachments_deleted").map(String::as_str), Some("1"));
    let retried =
        mailstream::ops::dead_letters::retry(&world.store, std::slice::from_ref(delivery), false).await.unwrap();
    assert_eq!(retried[0].1, Requeue::FilesGone);
    // What waits is counted no more: the pending entry goes at the next look.
    let p = world.store.keys.partition_of(mailstream::model::work::DeliveryRef::parse(delivery).unwrap().home());
    let mut conn = world.store.conn().await.unwrap();
    mailstream::store::records::prune_pending_attachments(&mut conn, &world.store.keys, p).await.unwrap();
    let left: u64 = redis::cmd("HLEN").arg(world.store.keys.attachments(p)).query_async(&mut conn).await.unwrap();
    assert_eq!(left, 0);
}
