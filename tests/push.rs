//! The Web Push channel against the emulator's push service over loopback, with a real
//! Redis: each browser shown a notification once, gone subscriptions removed, a refusal,
//! a throttle and a lost answer each with its outcome; the payload and the VAPID token
//! checked by Python's http_ece and cryptography, which share no code with ours.

mod common;

use std::time::Duration;

use base64::Engine;
use common::{CAMPAIGN, PERIOD, World, delivery_of, eventually};
use mailstream::audience::subscribers::push::{self as subscriptions, Subscription};
use mailstream::config::{PushChannelConfig, Secret, Urgency};
use mailstream::model::webpush::{self as crypto, VapidKey};
use mailstream::model::work::Channel;
use mailstream::store::Counts;
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::tools::emulator::push::PushService;

const SETTLE: Duration = Duration::from_secs(90);

/// A world whose campaign goes by email and Web Push, signing with a new VAPID key, and a
/// push service serving on loopback.
async fn push_world(timeout_ms: u64) -> (World, PushService, VapidKey, mailstream::shutdown::Trigger) {
    let (world, service, _, vapid, stop) = push_world_keyed(timeout_ms).await;
    (world, service, vapid, stop)
}

/// `push_world`, and the VAPID private key too (for a daemon run as a process).
async fn push_world_keyed(timeout_ms: u64) -> (World, PushService, String, VapidKey, mailstream::shutdown::Trigger) {
    let service = PushService::new();
    let (_, stop, _) = service.spawn_local().await.unwrap();
    let (private, vapid) = VapidKey::generate();
    let mut world = World::with(Default::default(), |c| {
        c.campaigns[0].channels = vec![Channel::Email, Channel::Push];
        c.channels.push = Some(PushChannelConfig {
            allowed_hosts: Some(vec![service.allowed_host()]),
            ttl_seconds: 60,
            urgency: Urgency::High,
            timeout_ms,
            concurrency: 8,
            requests_per_second_per_service: 1000,
            ..PushChannelConfig::new("mailto:ops@example.com", Secret::new(private.clone()))
        });
    })
    .await;
    let (_emulator, stop_emulator) = world.emulator(EmulatorConfig::default()).await;
    std::mem::forget(stop_emulator);
    (world, service, private, vapid, stop)
}

async fn push_settled(world: &World) -> Counts {
    let store = world.store.clone();
    eventually(SETTLE, || {
        let store = store.clone();
        async move {
            let c = store.channel_counts(CAMPAIGN, &PERIOD, Channel::Push).await.ok()?;
            (c.enqueued > 0 && c.settled() >= c.enqueued).then_some(c)
        }
    })
    .await
    .expect("the push deliveries settled")
}

/// Runs tests/push_check.py on one message a browser got: (payload, VAPID claims).
fn python_check(service: &PushService, s: &Subscription, origin: &str) -> serde_json::Value {
    let (private_key, auth, taken) = service.taken(&s.endpoint).expect("the browser exists");
    let (body, authorization) = taken.first().expect("a message was taken").clone();
    let input = serde_json::json!({
        "private_key": private_key,
        "auth": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(auth),
        "body": base64::engine::general_purpose::STANDARD.encode(body),
        "authorization": authorization,
        "audience": origin,
    });
    let mut child = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/push_check.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (.ci/run installs http_ece and cryptography)");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "push_check.py: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A new browser's subscription at `service`, for an application with `key`.
fn browser(service: &PushService, key: &str) -> Subscription {
    Subscription::from_value(service.subscribe(key)).expect("the emulator's subscriptions are well-formed")
}

/// The daemon as a process (to be killed), on email and Web Push: (config file name,
/// lease seconds, push timeout ms).
fn daemon_process(
    world: &World,
    service: &PushService,
    private: &str,
    (name, lease, timeout): (&str, u64, u64),
) -> common::Logged {
    use common::cli::{ANY_METRICS_PORT, TEST_REDIS, bin, config_file};
    let base_url = format!("base_url = \"{}\"", world.config.resend.base_url);
    let lease = format!("lease_seconds = {lease}");
    let push =
        format!("[channels.push]\ntimeout_ms = {timeout}\nallowed_hosts = [\"{}\"]\nsubject", service.allowed_host());
    let path = config_file(
        name,
        &[
            ("base_url = \"https://api.resend.com\"", &base_url),
            ("lease_seconds = 15", &lease),
            ("partitions = 1", "partitions = 2"),
            ("channels = [\"email\"]", "channels = [\"email\", \"push\"]"),
            ("# [channels.push]\n# subject", &push),
            ANY_METRICS_PORT,
            TEST_REDIS,
        ],
    );
    let mut cmd = bin();
    cmd.arg("run").arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", world.redis.url());
    cmd.env("RESEND_API_KEY", "re_cli_test").env("MAILSTREAM_VAPID_PRIVATE_KEY", private);
    common::Logged::spawn(cmd.stdout(std::process::Stdio::null()))
}

fn origin_of(s: &Subscription) -> String {
    s.origin().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_browser_is_shown_a_notification_once_and_gone_ones_are_forgotten() {
    let (world, service, vapid, _stop) = push_world(2000).await;
    let subs = world.subscribers(6).await;
    let (_, other_key) = VapidKey::generate();
    // u0: one browser. u1: two, one of them gone. u2: one, gone. u3: none. u4: one made
    // for another application server key (refused 403). u5: one.
    let s0 = browser(&service, &vapid.public);
    let s1a = browser(&service, &vapid.public);
    let s1b = browser(&service, &vapid.public);
    let s2 = browser(&service, &vapid.public);
    let s4 = browser(&service, &other_key.public);
    let s5 = browser(&service, &vapid.public);
    service.make_gone(&s1b.endpoint);
    service.make_gone(&s2.endpoint);
    for (i, s) in [(0, &s0), (1, &s1a), (1, &s1b), (2, &s2), (4, &s4), (5, &s5)] {
        subscriptions::add(&world.store, &subs[i].id, s).await.unwrap();
    }
    // Registering one again replaces it; an unknown subscriber is refused.
    subscriptions::add(&world.store, &subs[0].id, &s0).await.unwrap();
    let unknown = subscriptions::add(&world.store, "nobody", &s0).await.unwrap_err();
    assert!(unknown.to_string().contains("not in the registry"), "{unknown}");
    // The first two requests are throttled: asked again after their Retry-After.
    service.throttle(2, 1);
    world.kick().await;
    let daemon = world.daemon();
    let push = push_settled(&world).await;
    world.settled(SETTLE).await;
    let scrape = daemon.metrics.render();
    daemon.stop().await;
    service.show();
    let requests =
        |class: &str| common::metric(&scrape, "mailstream_push_requests_total", &format!("status_class=\"{class}\""));
    // 2xx: s0, s1a, s5; 4xx: two 429s, two 410s, one 403; no 5xx. (More if an answer
    // came after the client gave up on a busy machine, and the request was made again.)
    assert!(requests("2xx") >= 3.0 && requests("4xx") >= 5.0, "{scrape}");
    assert_eq!(requests("5xx"), 0.0, "{scrape}");
    assert_eq!(common::metric(&scrape, "mailstream_push_subscriptions_removed_total", ""), 2.0, "{scrape}");
    let settled = |outcome: &str| {
        common::metric(&scrape, "mailstream_deliveries_total", &format!("channel=\"push\",outcome=\"{outcome}\""))
    };
    assert_eq!((settled("sent"), settled("skipped"), settled("failed")), (3.0, 2.0, 1.0), "{scrape}");

    assert_eq!((push.sent, push.skipped, push.failed, push.outcome_unknown), (3, 2, 1, 0), "{push:?}");
    let stats = service.stats();
    assert_eq!(
        (stats.duplicates, stats.throttled, stats.gone, stats.rejected, stats.malformed),
        (0, 2, 2, 1, 0),
        "{stats:?}"
    );
    assert_eq!(stats.shown, 3, "{stats:?}");
    for (i, s) in [(0, &s0), (1, &s1a), (5, &s5)] {
        let tag = crypto::topic(&delivery_of(&subs[i]).on(Channel::Push).id());
        assert_eq!(service.shown(&s.endpoint).get(&tag), Some(&1), "subscriber {i}");
    }
    // The gone subscriptions are removed; the others stay.
    let mut conn = world.store.conn().await.unwrap();
    let keys = &world.store.keys;
    for (i, left) in [(0, 1), (1, 1), (2, 0), (4, 1), (5, 1)] {
        let id = &subs[i].id;
        let found = subscriptions::list(&mut conn, keys, keys.partition_of(id), id).await.unwrap();
        assert_eq!(found.len(), left, "subscriber {i}: {found:?}");
    }
    // What each delivery came to, as the delivery log reads it.
    let refs: Vec<_> = [2, 3].iter().map(|&i| delivery_of(&subs[i]).on(Channel::Push)).collect();
    for d in &refs {
        let p = keys.partition_of(&d.subscriber);
        let entry = mailstream::store::history::lookup(&mut conn, keys, p, std::slice::from_ref(d)).await.unwrap();
        let entry = entry[0].clone().expect("settled compactly");
        assert_eq!((entry.state.as_str(), entry.detail.as_deref()), ("skipped", Some("no_subscription")), "{d:?}");
    }
    let refused = common::delivery(&world.store, &delivery_of(&subs[4]).on(Channel::Push).id()).await;
    assert_eq!((refused["state"].as_str(), refused["error"].as_str()), ("failed", "push_refused"), "{refused:?}");

    // Independently: the payload decrypts with the browser's key, the token verifies.
    let checked = python_check(&service, &s0, &origin_of(&s0));
    let d0 = delivery_of(&subs[0]).on(Channel::Push);
    assert_eq!(checked["payload"]["title"], "Your weekly digest");
    assert_eq!(checked["payload"]["tag"], crypto::topic(&d0.id()).as_str());
    assert!(checked["payload"]["url"].as_str().unwrap().contains(&d0.target), "{checked}");
    assert_eq!(checked["vapid"]["sub"], "mailto:ops@example.com");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_a_lost_answer_carries_the_same_topic_and_payload() {
    let (world, service, vapid, _stop) = push_world(300).await;
    let subs = world.subscribers(1).await;
    let s = browser(&service, &vapid.public);
    subscriptions::add(&world.store, &subs[0].id, &s).await.unwrap();
    // The browser is offline, and the service answers only after the client gave up:
    // every request is taken, none is known to be.
    service.set_offline(true);
    service.set_slow(2000);
    world.kick().await;
    let daemon = world.daemon();
    let retried = eventually(SETTLE, || {
        let service = service.clone();
        let endpoint = s.endpoint.clone();
        async move { (service.taken(&endpoint)?.2.len() >= 2).then_some(()) }
    })
    .await;
    assert!(retried.is_some(), "asked again after no answer: {:?}", service.stats());
    service.set_slow(0);
    let push = push_settled(&world).await;
    daemon.stop().await;
    service.set_offline(false);

    assert_eq!(push.sent, 1, "{push:?}");
    let (private_key, auth, taken) = service.taken(&s.endpoint).unwrap();
    let secret = p256::SecretKey::from_slice(&crypto::b64_decode(&private_key).unwrap()).unwrap();
    let plain: Vec<Vec<u8>> = taken.iter().map(|(body, _)| crypto::decrypt(body, &secret, &auth).unwrap()).collect();
    assert!(plain.len() >= 2 && plain.iter().all(|p| *p == plain[0]), "one payload, every time");
    assert_ne!(taken[0].0, taken[1].0, "each request encrypted anew");
    let stats = service.stats();
    // The push service held one message: each retry replaced it by its Topic.
    assert_eq!(stats.replaced, stats.created - 1, "{stats:?}");
    assert_eq!((stats.shown, stats.duplicates), (1, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_push_service_that_is_down_holds_the_delivery_not_the_email() {
    let (world, service, vapid, _stop) = push_world(2000).await;
    let subs = world.subscribers(20).await;
    let items: Vec<_> = subs.iter().map(|sub| (sub.id.clone(), browser(&service, &vapid.public))).collect();
    subscriptions::add_many(&world.store, &items).await.unwrap();
    service.set_down(true);
    world.kick().await;
    let daemon = world.daemon();
    let email = world.settled(SETTLE).await;
    assert_eq!(email.sent, 20, "{email:?}");
    let held = world.store.channel_counts(CAMPAIGN, &PERIOD, Channel::Push).await.unwrap();
    assert_eq!(held.sent, 0, "{held:?}");
    let refused = eventually(SETTLE, || {
        let service = service.clone();
        async move { (service.stats().refused_while_down >= 40).then_some(()) }
    })
    .await;
    assert!(refused.is_some(), "asked again while down: {:?}", service.stats());
    service.set_down(false);
    let push = push_settled(&world).await;
    daemon.stop().await;
    service.show();
    assert_eq!((push.sent, push.failed), (20, 0), "{push:?}");
    assert_eq!(service.stats().duplicates, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_come_by_the_ingest_api_and_the_cli_and_are_never_quoted() {
    let (mut world, service, private, vapid, _stop) = push_world_keyed(2000).await;
    world.config.http.ingest_tokens = vec![Secret::new("ingest-token-0123456789")];
    let subs = world.subscribers(2).await;
    let public = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/push-subscriptions", public.local_addr().unwrap());
    let listeners = mailstream::Listeners { metrics: None, public: Some(public) };
    let daemon = common::Daemon::start_listening(world.config.clone(), Default::default(), listeners);
    mailstream::resend::client::install_crypto_provider();
    let http = reqwest::Client::new();
    let s = browser(&service, &vapid.public);
    let token = s.endpoint.rsplit('/').next().unwrap().to_string();
    let post = |body: serde_json::Value| {
        let req = http.post(&url).bearer_auth("ingest-token-0123456789").json(&body);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, body) = post(serde_json::json!({"subscriber": subs[0].id, "subscription": s})).await;
    assert_eq!(status, 201, "{body}");
    assert!(body.contains(&s.id()) && !body.contains(&token), "{body}");
    let mut bad = serde_json::to_value(&s).unwrap();
    bad["keys"]["auth"] = "AAEC".into();
    let (status, body) = post(serde_json::json!({"subscriber": subs[0].id, "subscription": bad})).await;
    assert_eq!(status, 400, "{body}");
    assert!(!body.contains(&token), "{body}");
    let (status, _) = post(serde_json::json!({"subscriber": "nobody", "subscription": s})).await;
    assert_eq!(status, 404);
    let r = http.post(&url).json(&serde_json::json!({"subscriber": subs[0].id, "subscription": s})).send().await;
    assert_eq!(r.unwrap().status().as_u16(), 401, "the token is needed");
    daemon.stop().await;

    // The CLI, as an operator runs it: the subscription names its id, never its endpoint.
    // The deployment lists the emulator's push service (on loopback) as one to send to.
    let push = format!("[channels.push]\nallowed_hosts = [\"{}\"]\nsubject", service.allowed_host());
    let config = common::cli::config_file(
        "push.toml",
        &[common::cli::TEST_REDIS, ("partitions = 1", "partitions = 2"), ("# [channels.push]\n# subject", &push)],
    );
    let second = browser(&service, &vapid.public);
    let json = serde_json::to_string(&second).unwrap();
    let redis = world.redis.url();
    let args = ["subscribe", "--id", &subs[1].id, "--push-subscription", "-", "--json"];
    let run = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = common::cli::bin()
            .args(args)
            .arg("--config")
            .arg(&config)
            .env("MAILSTREAM_REDIS_URL", &redis)
            .env("MAILSTREAM_VAPID_PRIVATE_KEY", &private)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = run(&args, &json);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = format!("{}{}", common::cli::stdout(&out), String::from_utf8_lossy(&out.stderr));
    let second_token = second.endpoint.rsplit('/').next().unwrap();
    assert!(printed.contains(&second.id()) && !printed.contains(second_token), "{printed}");
    // The line a person reads names the subscription once.
    let third = browser(&service, &vapid.public);
    let out = run(&args[..args.len() - 1], &serde_json::to_string(&third).unwrap());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = format!("{}{}", common::cli::stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert_eq!(said.matches(&third.id()).count(), 1, "{said}");
    let out =
        run(&["subscribe", "--id", &subs[1].id, "--push-subscription", "{\"endpoint\":\"https://x/secret-path\"}"], "");
    assert_eq!(out.status.code(), Some(64));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("secret-path"), "{}", String::from_utf8_lossy(&out.stderr));
    let mut conn = world.store.conn().await.unwrap();
    let keys = &world.store.keys;
    for sub in &subs {
        let found = subscriptions::list(&mut conn, keys, keys.partition_of(&sub.id), &sub.id).await.unwrap();
        assert_eq!(found.len(), if sub.id == subs[1].id { 2 } else { 1 }, "{}", sub.id);
    }
    // `mailstream vapid-keys`: a pair whose private half is only in the file.
    let file = std::env::temp_dir().join(format!("vapid-{}.key", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let out = common::cli::bin().args(["vapid-keys", "--out"]).arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let private = std::fs::read_to_string(&file).unwrap();
    let public = common::cli::stdout(&out);
    assert_eq!(VapidKey::parse(private.trim()).unwrap().public, public.trim());
    assert!(!public.contains(private.trim()));
    let again = common::cli::bin().args(["vapid-keys", "--out"]).arg(&file).output().unwrap();
    assert_eq!(again.status.code(), Some(73), "an existing key file is never overwritten (EX_CANTCREAT)");
    assert!(again.stdout.is_empty());
    std::fs::remove_file(&file).unwrap();
    let out = common::cli::bin().args(["vapid-keys", "--json", "--out"]).arg(&file).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let private = std::fs::read_to_string(&file).unwrap();
    assert_eq!(report["public_key"].as_str(), Some(VapidKey::parse(private.trim()).unwrap().public.as_str()));
    assert_eq!(report["private_key_file"].as_str(), file.to_str());
    std::fs::remove_file(&file).unwrap();
}

/// A sender killed (SIGKILL) with its requests out: the push service took them, nobody
/// recorded an answer, and the record keeps the killed instance's in-flight flag. The
/// next holder, after the lease, asks again with the same Topic, so each browser (offline
/// meanwhile) is shown its notification once; a browser gone since is removed, and its
/// delivery ends `outcome_unknown`, not `skipped`: the killed request may have reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_killed_with_requests_out_is_followed_by_one_that_shows_each_once() {
    let (world, service, private, vapid, _stop) = push_world_keyed(2000).await;
    let subs = world.subscribers(6).await;
    let browsers: Vec<_> = subs.iter().map(|s| (s.id.clone(), browser(&service, &vapid.public))).collect();
    subscriptions::add_many(&world.store, &browsers).await.unwrap();
    // Taken at once, answered only after a minute: the killed instance hears nothing.
    service.set_offline(true);
    service.set_slow(60_000);
    world.kick().await;
    let killed = daemon_process(&world, &service, &private, ("push-kill.toml", 10, 8000));
    let all_out = eventually(SETTLE, || {
        let (service, browsers) = (service.clone(), browsers.clone());
        async move {
            browsers.iter().all(|(_, s)| service.taken(&s.endpoint).is_some_and(|t| !t.2.is_empty())).then_some(())
        }
    })
    .await;
    assert!(all_out.is_some(), "every browser's request is out: {:?}", killed.lines.lock().unwrap());
    killed.signal("KILL");
    let _ = killed.wait().await;
    let in_doubt = common::delivery(&world.store, &delivery_of(&subs[0]).on(Channel::Push).id()).await;
    assert!(in_doubt.keys().any(|f| f.starts_with("push_inflight:")), "{in_doubt:?}");

    service.set_slow(0);
    service.make_gone(&browsers[5].1.endpoint);
    let daemon = world.daemon();
    let push = push_settled(&world).await;
    daemon.stop().await;
    service.set_offline(false);
    service.show();

    assert_eq!((push.sent, push.outcome_unknown, push.skipped, push.failed), (5, 1, 0, 0), "{push:?}");
    let gone = common::delivery(&world.store, &delivery_of(&subs[5]).on(Channel::Push).id()).await;
    assert_eq!(gone["state"].as_str(), "outcome_unknown", "{gone:?}");
    for (i, (_, s)) in browsers.iter().enumerate().take(5) {
        let tag = crypto::topic(&delivery_of(&subs[i]).on(Channel::Push).id());
        assert!(service.taken(&s.endpoint).unwrap().2.len() >= 2, "asked again: subscriber {i}");
        assert_eq!(service.shown(&s.endpoint).get(&tag), Some(&1), "shown once: subscriber {i}");
    }
    let stats = service.stats();
    assert!(stats.replaced >= 5, "each retry replaced the held copy by its Topic: {stats:?}");
    assert_eq!(stats.duplicates, 0, "{stats:?}");
}

/// An answer is recorded as it arrives: of a subscriber's two browsers, the first answers
/// 201 at once and the second is held unanswered. Once the record marks the first, the
/// sender is killed (SIGKILL); after restart only the second browser is asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_recorded_before_a_kill_is_not_asked_again() {
    let (world, service, private, vapid, _stop) = push_world_keyed(2000).await;
    let subs = world.subscribers(1).await;
    let (first, second) = (browser(&service, &vapid.public), browser(&service, &vapid.public));
    let id = subs[0].id.clone();
    subscriptions::add_many(&world.store, &[(id.clone(), first.clone()), (id, second.clone())]).await.unwrap();
    let (first_path, second_path) = (PushService::path_of(&first.endpoint), PushService::path_of(&second.endpoint));
    service.holds.hold(second_path);
    world.kick().await;
    let killed = daemon_process(&world, &service, &private, ("push-answer-kill.toml", 30, 25_000));
    let delivery = delivery_of(&subs[0]).on(Channel::Push).id();
    let mark = subscriptions::sent_field(&first.id());
    let marked = eventually(SETTLE, || {
        let (store, delivery, mark) = (world.store.clone(), delivery.clone(), mark.clone());
        async move { common::delivery(&store, &delivery).await.contains_key(&mark).then_some(()) }
    })
    .await;
    assert!(marked.is_some(), "the first browser's 201 is recorded: {:?}", killed.lines.lock().unwrap());
    // The two requests leave together, but the second may reach the service a moment after
    // the first's answer is recorded: wait for it rather than for a busy machine's luck.
    let out = eventually(SETTLE, || async { (service.holds.waiting() == 1).then_some(1) }).await;
    assert_eq!(out.unwrap_or(service.holds.waiting()), 1, "the second browser's request is out, unanswered");
    killed.signal("KILL");
    let _ = killed.wait().await;

    let daemon = world.daemon();
    let asked_again = eventually(SETTLE, || {
        let service = service.clone();
        async move { (service.holds.arrived(second_path) >= 2).then_some(()) }
    })
    .await;
    assert!(asked_again.is_some(), "the unanswered browser is asked again after the restart");
    service.holds.release();
    let push = push_settled(&world).await;
    daemon.stop().await;
    assert_eq!(push.sent, 1, "{push:?}");
    assert_eq!(service.holds.arrived(first_path), 1, "the browser whose 201 was recorded is not asked again");
}
