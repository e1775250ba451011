//! The invariants of DESIGN §2 that no other test file pins by itself: every
//! script call touches one hash slot (recorded from a real run with Redis's own
//! MONITOR), no address (nor a Web Push endpoint) reaches a log line, a stream
//! entry, a key name or a metric label of a full run with faults, and the failure
//! rate counts decided outcomes only. (The README's table maps each invariant to its tests.)

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::*;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{LogConfig, LogFormat};
use mailstream::store::Counts;
use mailstream::tools::emulator::{EmulatorConfig, Faults};

const SETTLE: Duration = Duration::from_secs(120);

/// Every log line of this test binary, from every daemon it runs, at debug level.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let writer = move || Sink(sink.clone());
        // The daemon's own JSON logger, as under systemd.
        let log =
            LogConfig { level: "mailstream=debug,mailstream::tools::emulator=off".into(), format: LogFormat::Json };
        mailstream::ops::logging::init(&log, writer, false).unwrap();
        buffer
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The arguments of one MONITOR line (`1700000000.1 [0 127.0.0.1:1] "EVALSHA" "…" …`).
fn monitor_args(line: &str) -> Vec<String> {
    let Some(start) = line.find("] ") else { return Vec::new() };
    let mut args = Vec::new();
    let mut chars = line[start + 2..].chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        arg.push(u8::from_str_radix(&hex, 16).map_or('?', char::from));
                    }
                    Some('n') => arg.push('\n'),
                    Some('r') => arg.push('\r'),
                    Some('t') => arg.push('\t'),
                    Some(other) => arg.push(other),
                    None => {}
                },
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    args
}

/// The hash tag Redis Cluster would hash for `key` (the whole key when it has none).
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_6_every_script_call_touches_one_hash_slot() {
    captured_logs();
    let mut world = World::with(Default::default(), |c| {
        c.redis.partitions = 4;
        c.resend.timeout_seconds = 1;
        // 400 emails in batches of 10 at 10 requests a second take longer than the
        // heartbeat (a third of the lease), so it renews the claims waiting (renew).
        c.resend.batch_size = 10;
        c.resend.requests_per_second = 10;
        c.delivery.lease_seconds = 3;
    })
    .await;
    // Redis's own record of every command, from before the first script call.
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &world.redis.port().to_string(), "monitor"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-cli runs");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let (out, lines) = (monitor.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        })
    };
    let ok = eventually(Duration::from_secs(10), || {
        let lines = lines.clone();
        async move { lines.lock().unwrap().first().map(|l| l == "OK").filter(|&ok| ok) }
    })
    .await;
    assert!(ok.is_some(), "MONITOR started");

    // A run that passes through every script: retries and hangs (reschedule, take),
    // refusals at send time (decide), a quota pause (pause), a dead letter requeued (requeue).
    let faults = Faults {
        server_error: 0.2,
        hang: 0.1,
        hang_ms: 1500,
        // About 70 emails a second are accepted; 40 run out within the 1.5 s window.
        quota_after_emails: Some(40),
        quota_reset_ms: Some(1500),
        ..Default::default()
    };
    let (_emulator, _stop) =
        world.emulator(EmulatorConfig { requests_per_second: None, faults, ..Default::default() }).await;
    let mut subs: Vec<Subscriber> = (0..400).map(subscriber).collect();
    subs[3].email = "someone@example.com".into();
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    subs[5].subscribed = false;
    subscribers::upsert(&world.store, &subs[5..6]).await.unwrap();
    // Transactional sends too (ingest, the lane's stream, receipts sealed beside digests).
    let receipts: Vec<serde_json::Value> = (0..20)
        .map(|i| match i % 2 {
            0 => serde_json::json!({"idempotency_key": format!("r{i}"), "to": format!("delivered+r{i}@resend.dev"), "subject": "s", "text": "t"}),
            _ => serde_json::json!({"idempotency_key": format!("r{i}"), "subscriber": subs[i].id, "template": "weekly_digest"}),
        })
        .collect();
    mailstream::audience::ingest::enqueue(&world.store, &world.config, receipts).await.unwrap();
    let day = world.store.time().await.unwrap().format("%Y-%m-%d").to_string();
    let daemon = world.daemon();
    let store = world.store.clone();
    // The quota pause is ended by hand (as `mailstream resume` does) until all is settled.
    let settled = eventually(SETTLE, || {
        let (store, day) = (store.clone(), day.clone());
        async move {
            let _ = mailstream::send::pause::Pause::resume(&store).await;
            let tx = store.counts(mailstream::model::work::TRANSACTIONAL, &day).await.ok()?;
            let c = store.counts(CAMPAIGN, &PERIOD).await.ok()?;
            (c.settled() >= c.enqueued && tx.settled() >= 20).then_some(c)
        }
    })
    .await
    .expect("settled");
    assert_eq!(settled.failed, 1, "{settled:?}");
    let dead =
        mailstream::ops::dead_letters::list(&world.store, mailstream::ops::dead_letters::DeadLetterKind::Failed, 10)
            .await
            .unwrap();
    mailstream::ops::dead_letters::retry(&world.store, &[dead[0].delivery.clone()], false).await.unwrap();
    daemon.stop().await;
    monitor.kill().unwrap();
    let _ = monitor.wait();
    reader.join().unwrap();

    // Which script each SHA is, by loading each into this Redis (SCRIPT LOAD is idempotent).
    let mut conn = world.store.conn().await.unwrap();
    let mut names = BTreeMap::new();
    for file in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/lua")).unwrap() {
        let path = file.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        // Every script of store::scripts runs behind the prelude.
        let source = format!("{}{text}", mailstream::store::scripts::PRELUDE);
        let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(source).query_async(&mut conn).await.unwrap();
        names.insert(sha, path.file_stem().unwrap().to_string_lossy().to_string());
    }
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    for line in lines.lock().unwrap().iter() {
        let args = monitor_args(line);
        let Some(command) = args.first().map(|c| c.to_ascii_uppercase()) else { continue };
        if command != "EVALSHA" && command != "EVAL" {
            continue;
        }
        let numkeys: usize = args[2].parse().expect("numkeys");
        let keys = &args[3..3 + numkeys];
        let tags: BTreeSet<&str> = keys.iter().map(|k| hash_tag(k)).collect();
        let script = names.get(&args[1]).cloned().unwrap_or_else(|| "an inline script".into());
        assert!(tags.len() <= 1, "{script} touched keys of several hash slots: {keys:?}");
        *calls.entry(script).or_default() += 1;
    }
    for script in [
        "enqueue",
        "ingest",
        "claim",
        "seal",
        "gate",
        "take",
        "reschedule",
        "settle",
        "decide",
        "requeue",
        "pause",
        "renew",
        "limiter",
    ] {
        assert!(calls.get(script).is_some_and(|&n| n > 0), "{script} was called in the recorded run: {calls:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_5_no_address_in_logs_streams_keys_or_metric_labels() {
    let logs = captured_logs();
    // Web Push too: a browser's endpoint is personal data like an address.
    let push = mailstream::tools::emulator::push::PushService::new();
    let (_, _stop_push, _) = push.spawn_local().await.unwrap();
    let (vapid_private, vapid) = mailstream::model::webpush::VapidKey::generate();
    let mut world = World::with(Default::default(), |c| {
        c.resend.timeout_seconds = 1;
        c.delivery.lease_seconds = 6;
        c.campaigns[0].channels = vec![mailstream::model::work::Channel::Email, mailstream::model::work::Channel::Push];
        c.channels.push = Some(mailstream::config::PushChannelConfig {
            allowed_hosts: Some(vec![push.allowed_host()]),
            ttl_seconds: 60,
            timeout_ms: 2000,
            concurrency: 8,
            requests_per_second_per_service: 1000,
            ..mailstream::config::PushChannelConfig::new(
                "https://acme.example/contact",
                mailstream::config::Secret::new(vapid_private),
            )
        });
    })
    .await;
    let faults = Faults { server_error: 0.1, hang: 0.05, hang_ms: 1500, concurrent: 0.05, ..Default::default() };
    // Webhooks too: the emulator posts signed events back (bounces and complaints suppress).
    let secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    world.config.webhook.secrets = vec![mailstream::config::Secret::new(secret)];
    world.config.unsubscribe.secrets = vec![mailstream::config::Secret::new("an-unsubscribe-secret-xyz")];
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let webhook = mailstream::tools::emulator::WebhookTarget {
        url: format!("http://{}/webhooks/resend", public.local_addr().unwrap()),
        secret: secret.into(),
    };
    let config = EmulatorConfig { requests_per_second: None, faults, webhook: Some(webhook), ..Default::default() };
    let (emulator, _stop) = world.emulator(config).await;
    let mut subs: Vec<Subscriber> = (0..300).map(subscriber).collect();
    // Addresses that fail (a dead letter), bounce and complain (suppressions), an
    // unsubscribe and a revoked plan (skips).
    subs[7].email = "ann.person@example.com".into();
    subs[8].email = "bo.person@test.com".into();
    subs[11].email = "bounced+cy.person@resend.dev".into();
    subs[12].email = "complained+di.person@resend.dev".into();
    subscribers::upsert(&world.store, &subs).await.unwrap();
    // A browser each for the first 100, one in five of them gone (removed, and logged).
    push.set_gone_every(5);
    let browsers: Vec<_> = subs[..100]
        .iter()
        .map(|s| {
            (
                s.id.clone(),
                mailstream::audience::subscribers::push::Subscription::from_value(push.subscribe(&vapid.public))
                    .unwrap(),
            )
        })
        .collect();
    mailstream::audience::subscribers::push::add_many(&world.store, &browsers).await.unwrap();
    world.kick().await;
    subs[9].subscribed = false;
    subs[10].entitled = false;
    subscribers::upsert(&world.store, &subs[9..11]).await.unwrap();
    // Receipts to addresses given inline (kept in their records only), one refused.
    let receipts: Vec<serde_json::Value> = (0..10)
        .map(|i| {
            let to =
                if i == 0 { "eve.person@example.com".to_string() } else { format!("delivered+rcpt{i}@resend.dev") };
            serde_json::json!({"idempotency_key": format!("inv5-{i}"), "to": to, "subject": "Receipt", "text": "t"})
        })
        .collect();
    mailstream::audience::ingest::enqueue(&world.store, &world.config, receipts).await.unwrap();
    let day = world.store.time().await.unwrap().format("%Y-%m-%d").to_string();
    let listeners = mailstream::Listeners { metrics: None, public: Some(public) };
    let daemon = Daemon::start_listening(world.config.clone(), Default::default(), listeners);
    let counts = world.settled(SETTLE).await;
    let store = world.store.clone();
    let pushed = eventually(SETTLE, || {
        let store = store.clone();
        async move {
            let c = store.channel_counts(CAMPAIGN, &PERIOD, mailstream::model::work::Channel::Push).await.ok()?;
            (c.enqueued > 0 && c.settled() >= c.enqueued).then_some(c)
        }
    })
    .await
    .expect("push settled");
    assert!(pushed.sent >= 70 && push.stats().gone >= 15, "{pushed:?} {:?}", push.stats());
    let tx = eventually(SETTLE, || {
        let (store, day) = (store.clone(), day.clone());
        async move {
            Some(store.counts(mailstream::model::work::TRANSACTIONAL, &day).await.ok()?).filter(|c| c.settled() >= 10)
        }
    })
    .await
    .expect("receipts settled");
    assert_eq!((tx.sent, tx.failed), (9, 1), "{tx:?}");
    assert_eq!((counts.failed, counts.skipped), (2, 2), "{counts:?}");
    let suppressed = eventually(Duration::from_secs(30), || {
        let m = daemon.metrics.clone();
        async move { (m.suppressions_by_reason().len() == 2).then_some(()) }
    })
    .await;
    assert!(suppressed.is_some(), "the bounce and the complaint came back: {:?}", emulator.stats());
    let metrics = daemon.metrics.render();
    daemon.stop().await;

    let addresses: Vec<&str> = subs.iter().map(|s| s.email.as_str()).collect();
    let sender = "digest@acme.example";
    // An endpoint, or its capability token (the last segment), anywhere.
    let tokens: Vec<&str> = browsers.iter().filter_map(|(_, b)| b.endpoint.rsplit('/').next()).collect();
    let personal = |text: &str| -> Option<String> {
        if let Some(a) = addresses.iter().chain(&tokens).find(|a| text.contains(**a)) {
            return Some(a.to_string());
        }
        if text.contains("/push/") {
            return Some("a push endpoint".into());
        }
        // Any other address-like text but the configured sender.
        let scrubbed = text.replace(sender, "");
        scrubbed.find('@').map(|at| scrubbed[at.saturating_sub(20)..(at + 20).min(scrubbed.len())].to_string())
    };

    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(logs.lines().count() > 10, "logs were captured: {logs}");
    for line in logs.lines() {
        let json: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(json["timestamp"].is_string() && json["level"].is_string() && json["message"].is_string(), "{line}");
        assert!(personal(line).is_none(), "a log line holds an address: {line}");
    }
    for line in metrics.lines() {
        assert!(personal(line).is_none(), "a metric holds an address: {line}");
    }
    let mut conn = world.store.conn().await.unwrap();
    let keys = world.store.scan("*").await.unwrap();
    assert!(keys.len() > 300);
    let mut entries = 0;
    for key in &keys {
        assert!(personal(key).is_none(), "a key name holds an address: {key}");
        let kind: String = redis::cmd("TYPE").arg(key).query_async(&mut conn).await.unwrap();
        if kind == "stream" {
            let all: redis::streams::StreamRangeReply =
                redis::cmd("XRANGE").arg(key).arg("-").arg("+").query_async(&mut conn).await.unwrap();
            for e in all.ids {
                entries += 1;
                let text = format!("{:?}", e.map);
                assert!(personal(&text).is_none(), "an entry of {key} holds an address: {text}");
            }
        }
    }
    assert!(entries >= 2, "the dead letters were scanned");
}

#[test]
fn invariant_8_failure_rate_counts_decided_outcomes_only() {
    let counts =
        Counts { enqueued: 1000, sent: 90, failed: 10, skipped: 500, outcome_unknown: 7, ..Default::default() };
    // 393 still pending, 500 skipped and 7 unknown are outside the denominator.
    assert_eq!(counts.failure_rate(), Some(0.1));
    assert_eq!(Counts { enqueued: 50, skipped: 50, ..Default::default() }.failure_rate(), None);
}
