//! Mail to ourselves must arrive: operator mail (a template with `audience =
//! "operators"`) whose sender Resend refuses is sealed again once from the template's
//! `fallback_from` and sent, only when nothing of it can have been sent; customer mail
//! never falls back; and the SLO report goes out as operator mail, once per fire
//! whatever the instances, or at once with `slo --mail`. Each against a real Redis and
//! the emulator (refusing a domain where it says so).

mod common;

use std::time::Duration;

use common::*;
use mailstream::audience::ingest::ItemResult;
use mailstream::model::outcome::Failpoint;
use mailstream::store::redis_server::RedisOptions;
use mailstream::tools::emulator::{EmulatorConfig, Faults};
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(90);
const FALLBACK_FROM: &str = "Acme alerts <alerts@acme-mail.example>";

/// A world whose emulator refuses the senders of `domains` (the shipped config sends
/// from acme.example; its operator template `new_lead` falls back to acme-mail.example).
async fn refusing(domains: &[&str]) -> (World, mailstream::tools::emulator::Emulator, mailstream::shutdown::Trigger) {
    let mut world = World::with(RedisOptions::default(), |c| {
        c.resend.timeout_seconds = 1;
        c.delivery.lease_seconds = 6;
    })
    .await;
    let faults =
        Faults { rejected_sender_domains: domains.iter().map(|d| d.to_string()).collect(), ..Default::default() };
    let config = EmulatorConfig { faults, requests_per_second: None, ..Default::default() };
    let (emulator, stop) = world.emulator(config).await;
    (world, emulator, stop)
}

/// Enqueues transactional items as the ingest API does; the delivery id of each accepted one.
async fn enqueue(world: &World, items: Vec<serde_json::Value>) -> Vec<ItemResult> {
    mailstream::audience::ingest::enqueue(&world.store, &world.config, items).await.expect("enqueued")
}

fn accepted(result: &ItemResult) -> String {
    match result {
        ItemResult::Accepted { delivery, .. } => delivery.clone(),
        other => panic!("not accepted: {other:?}"),
    }
}

fn lead(key: &str) -> serde_json::Value {
    json!({"idempotency_key": key, "to": "oncall@acme.example", "template": "new_lead", "data": {"company": "Initech"}})
}

/// Waits until delivery `id` is settled; its record.
async fn settled(world: &World, id: &str) -> std::collections::HashMap<String, String> {
    let store = world.store.clone();
    eventually(SETTLE, || {
        let (store, id) = (store.clone(), id.to_string());
        async move {
            let d = delivery(&store, &id).await;
            let state = d.get("state").map(String::as_str);
            matches!(state, Some("sent" | "failed" | "outcome_unknown" | "skipped")).then_some(d)
        }
    })
    .await
    .unwrap_or_else(|| panic!("{id} not settled within {SETTLE:?}"))
}

/// The keys of the requests the emulator saw, with their status, for the batch whose
/// first key is the one of `status_first` (the refused request's).
fn requests(emulator: &mailstream::tools::emulator::Emulator) -> Vec<(String, u16)> {
    emulator.seen().into_iter().map(|s| (s.idempotency_key.unwrap_or_default(), s.status)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_mail_falls_back_once_and_customer_mail_never_does() {
    let (world, emulator, _stop) = refusing(&["acme.example"]).await;
    world.subscribers(10).await;
    world.kick().await;
    let results = enqueue(
        &world,
        vec![
            lead("lead-1"),
            json!({"idempotency_key": "order-1", "to": "delivered+ann@resend.dev", "template": "receipt"}),
            // Operator mail goes to the team only.
            json!({"idempotency_key": "lead-2", "to": "delivered+ann@resend.dev", "template": "new_lead"}),
        ],
    )
    .await;
    let (lead_id, receipt_id) = (accepted(&results[0]), accepted(&results[1]));
    assert!(
        matches!(&results[2], ItemResult::Invalid { field, .. } if field == "to"),
        "an operator template mails only [operators] to: {:?}",
        results[2]
    );
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    let (lead, receipt) = (settled(&world, &lead_id).await, settled(&world, &receipt_id).await);
    let metrics = daemon.metrics.render();
    daemon.stop().await;

    // Customer mail, digest and receipt alike, fails: a refused sender is not swapped.
    assert_eq!((counts.failed, counts.sent), (10, 0), "{counts:?}");
    assert_eq!((receipt["state"].as_str(), receipt["error"].as_str()), ("failed", "validation_error"));
    assert!(!receipt.contains_key("fallback"), "{receipt:?}");
    // The operator mail went out once, from the fallback sender, marked so.
    assert_eq!((lead["state"].as_str(), lead.get("fallback").map(String::as_str)), ("sent", Some("1")), "{lead:?}");
    let sent = emulator.accepted();
    assert_eq!(sent.len(), 1, "one real send, and only the operator's: {sent:?}");
    assert_eq!(
        (sent[0]["from"].as_str(), sent[0]["to"][0].as_str()),
        (Some(FALLBACK_FROM), Some("oncall@acme.example"))
    );
    assert_eq!(emulator.stats().duplicate_sends, 0);
    // Two requests for it: the refused one, then one under the derived key.
    let seen = requests(&emulator);
    let fallbacks: Vec<&(String, u16)> = seen.iter().filter(|(k, _)| k.ends_with(".fallback")).collect();
    assert_eq!(fallbacks.len(), 1, "{seen:?}");
    let refused_key = fallbacks[0].0.trim_end_matches(".fallback");
    assert_eq!(seen.iter().filter(|(k, s)| k == refused_key && *s == 403).count(), 1, "{seen:?}");
    assert_eq!(fallbacks[0].1, 200);
    assert_eq!(metric(&metrics, "mailstream_sender_fallbacks_total", "template=\"new_lead\""), 1.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_refused_too_records_the_first_refusal() {
    let (world, emulator, _stop) = refusing(&["acme.example", "acme-mail.example"]).await;
    let id = accepted(&enqueue(&world, vec![lead("lead-1")]).await[0]);
    let daemon = world.daemon();
    let record = settled(&world, &id).await;
    let metrics = daemon.metrics.render();
    daemon.stop().await;
    assert_eq!((record["state"].as_str(), record["error"].as_str()), ("failed", "validation_error"), "{record:?}");
    assert_eq!(record.get("fallback").map(String::as_str), Some("1"), "the log shows it was tried");
    let seen = requests(&emulator);
    assert_eq!(seen.len(), 2, "the refused request and its one fallback, no more: {seen:?}");
    assert!(seen[1].0.ends_with(".fallback") && seen.iter().all(|(_, s)| *s == 403), "{seen:?}");
    assert_eq!(metric(&metrics, "mailstream_sender_fallbacks_total", "template=\"new_lead\""), 0.0);
    let dead =
        mailstream::ops::dead_letters::list(&world.store, mailstream::ops::dead_letters::DeadLetterKind::Failed, 10)
            .await
            .unwrap();
    assert_eq!(dead.iter().map(|d| d.error.as_str()).collect::<Vec<_>>(), ["validation_error"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_no_longer_among_the_operators_gets_no_fallback() {
    let (mut world, emulator, _stop) = refusing(&["acme.example"]).await;
    let id = accepted(&enqueue(&world, vec![lead("lead-1")]).await[0]);
    // The team changed between the enqueue and the refusal.
    world.config.operators.to = vec!["someone-else@acme.example".into()];
    let daemon = world.daemon();
    let record = settled(&world, &id).await;
    daemon.stop().await;
    assert_eq!((record["state"].as_str(), record["error"].as_str()), ("failed", "validation_error"), "{record:?}");
    assert!(!record.contains_key("fallback") && emulator.accepted().is_empty(), "{record:?}");
}

/// Runs a daemon that stops for good at `point` the first time (its tasks then aborted,
/// as by kill -9), then another; the operator mail's record and the emulator after.
async fn crash_then_take_over(
    point: Failpoint,
) -> (std::collections::HashMap<String, String>, mailstream::tools::emulator::Emulator) {
    let (world, emulator, _stop) = refusing(&["acme.example"]).await;
    let id = accepted(&enqueue(&world, vec![lead("lead-1")]).await[0]);
    crash_at(&world.config, point, Duration::from_secs(30)).await;
    let survivor = world.daemon_as("survivor");
    let record = settled(&world, &id).await;
    survivor.stop().await;
    (record, emulator)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_refusal_and_the_fallback_sends_the_fallback_once() {
    let (record, emulator) = crash_then_take_over(Failpoint::FellBack).await;
    assert_eq!(record["state"], "sent", "{record:?}");
    let sent = emulator.accepted();
    assert_eq!((sent.len(), sent[0]["from"].as_str()), (1, Some(FALLBACK_FROM)));
    let seen = requests(&emulator);
    // The fallback was sealed before the crash: the taker sent it, under the derived key.
    assert_eq!(seen.iter().filter(|(k, _)| k.ends_with(".fallback")).count(), 1, "{seen:?}");
    assert_eq!(emulator.stats().duplicate_sends, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_a_request_that_may_have_been_sent_never_falls_back() {
    // The refused request's answer is lost with its holder: whoever takes the batch over
    // cannot know the request was refused, so its resend's refusal proves nothing.
    let (record, emulator) = crash_then_take_over(Failpoint::Answered).await;
    assert_eq!((record["state"].as_str(), record["error"].as_str()), ("outcome_unknown", "validation_error"));
    assert!(!record.contains_key("fallback"), "{record:?}");
    let seen = requests(&emulator);
    assert!(seen.len() >= 2 && seen.iter().all(|(k, _)| !k.ends_with(".fallback")), "{seen:?}");
    assert!(emulator.accepted().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_by_fallback_is_one_warn_line_with_no_address() {
    use common::cli::*;
    let redis = mailstream::store::redis_server::RedisServer::start(RedisOptions::default()).await.unwrap();
    let emulator = Logged::spawn(
        bin()
            .args(["emulator", "--listen", "127.0.0.1:0", "--rps", "0", "--reject-from-domain", "acme.example"])
            .env("MAILSTREAM_LOG", "info"),
    );
    let line = emulator.line_with("Resend emulator listening", Duration::from_secs(20)).await.expect("it listens");
    let listen: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
    let base_url = format!("base_url = \"http://{}\"", listen["listen"].as_str().unwrap());
    let path = config_file(
        "fallback.toml",
        &[("base_url = \"https://api.resend.com\"", &base_url), ANY_METRICS_PORT, TEST_REDIS],
    );
    let url = redis.url();
    let out =
        run(&path, &url, &["enqueue", "--key", "lead-1", "--to", "oncall@acme.example", "--template", "new_lead"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let mut cmd = bin();
    cmd.arg("run").arg("--config").arg(&path).env("MAILSTREAM_REDIS_URL", &url).env("RESEND_API_KEY", "re_cli_test");
    let daemon = Logged::spawn(cmd.stdout(std::process::Stdio::null()));
    let warned = daemon.line_with("used_fallback_sender", Duration::from_secs(60)).await;
    daemon.signal("TERM");
    let (code, lines) = daemon.wait().await;
    emulator.signal("TERM");
    let _ = emulator.wait().await;
    let warned = warned.unwrap_or_else(|| panic!("no fallback line: {lines:#?}"));
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&warned).expect("a JSON line");
    assert_eq!(v["level"], "WARN", "{v}");
    let fields = &v;
    assert_eq!(
        (fields["class"].as_str(), fields["error"].as_str(), fields["status"].as_u64(), fields["attempts"].as_u64()),
        (Some("sender_rejected"), Some("validation_error"), Some(403), Some(2)),
        "{v}"
    );
    assert_eq!((fields["used_fallback_sender"].as_bool(), fields["template"].as_str()), (Some(true), Some("new_lead")));
    assert_eq!(lines.iter().filter(|l| l.contains("used_fallback_sender")).count(), 1, "one line: {lines:#?}");
    // No address anywhere in what the daemon logged.
    assert!(!lines.iter().any(|l| l.contains("oncall") || l.contains("alerts@")), "{lines:#?}");
}

#[test]
fn check_config_refuses_a_fallback_sender_outside_operator_mail() {
    use common::cli::*;
    let receipt = "[templates.receipt]\n";
    let with_fallback = "[templates.receipt]\nfallback_from = \"Acme <receipts@acme-mail.example>\"\n";
    let path = config_file("customer-fallback.toml", &[(receipt, with_fallback)]);
    let out = bin().args(["check-config", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "sysexits' EX_CONFIG");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("templates.receipt.fallback_from: only a template with audience = \"operators\""), "{err}");
    assert!(err.contains("customer mail is never sent from a sender it was not meant to come from"), "{err}");

    let same_domain = "fallback_from = \"Acme alerts <alerts@acme.example>\"";
    let path =
        config_file("same-domain.toml", &[("fallback_from = \"Acme alerts <alerts@acme-mail.example>\"", same_domain)]);
    let out = bin().args(["check-config", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("templates.new_lead.fallback_from: is in the domain of resend.from")
    );

    let nobody = config_file("no-operators.toml", &[("to = [\"oncall@acme.example\"]", "to = []")]);
    let out = bin().args(["check-config", "--config"]).arg(&nobody).output().unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("templates.new_lead.audience: \"operators\", but [operators] to lists no address")
    );
}

/// The transactional deliveries of SLO reports in Redis, with their records.
async fn reports(world: &World) -> Vec<std::collections::HashMap<String, String>> {
    deliveries(&world.store)
        .await
        .into_iter()
        .filter(|(d, _)| d.target.starts_with("slo-report."))
        .map(|(_, r)| r)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_report_is_enqueued_once_by_two_instances() {
    let mut world = World::with(RedisOptions::default(), |c| {
        c.operators.to = vec!["oncall@acme.example".into(), "lead@acme.example".into()];
        // A fire three hours ago, within the report's catch-up window.
        c.slo.report.schedule = Some(daily_three_hours_ago());
    })
    .await;
    let config = EmulatorConfig { requests_per_second: None, ..Default::default() };
    let (emulator, _stop) = world.emulator(config).await;
    world.subscribers(5).await;
    world.kick().await;
    let (a, b) = (world.daemon(), world.daemon_as("another-instance"));
    let sent = eventually(SETTLE, || {
        let world = &world;
        async move {
            let r = reports(world).await;
            (r.len() >= 2 && r.iter().all(|d| d["state"] == "sent")).then_some(r)
        }
    })
    .await;
    a.stop().await;
    b.stop().await;
    let sent = sent.expect("the report is sent to each operator");
    assert_eq!(sent.len(), 2, "one report per operator, whatever the instances: {sent:?}");
    let mails: Vec<serde_json::Value> = emulator
        .accepted()
        .into_iter()
        .filter(|e| e["subject"].as_str().is_some_and(|s| s.starts_with("mailstream SLO: ")))
        .collect();
    assert_eq!(mails.len(), 2, "{mails:?}");
    let text = mails[0]["text"].as_str().unwrap();
    assert!(text.contains("weekly_digest") && text.contains("within"), "{text}");
    let to: std::collections::BTreeSet<&str> = mails.iter().filter_map(|m| m["to"][0].as_str()).collect();
    assert_eq!(to, ["lead@acme.example", "oncall@acme.example"].into());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slo_mail_enqueues_a_report_now_and_plain_slo_writes_nothing() {
    use common::cli::*;
    let redis = mailstream::store::redis_server::RedisServer::start(RedisOptions::default()).await.unwrap();
    let (path, url) = (config_file("slo-mail.toml", &[TEST_REDIS]), redis.url());
    assert!(run(&path, &url, &["subscribe", "--id", "u1", "--email", "delivered@resend.dev"], "").status.success());
    assert!(run(&path, &url, &["kick", "--campaign", "weekly_digest"], "").status.success());
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let reader = conn.clone();
    let keys = |pattern: &'static str| {
        let mut conn = reader.clone();
        async move {
            let k: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut conn).await.unwrap();
            k.len()
        }
    };
    let before: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    let out = run(&path, &url, &["slo"], "");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let after: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!((before, keys("*slo-report*").await), (after, 0), "plain slo only reads");

    let out = run(&path, &url, &["slo", "--mail", "--json"], "");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!((report["status"].as_str(), report["mailed"]["operators"].as_u64()), (Some("within"), Some(1)));
    assert!(report["mailed"]["report"].as_str().is_some_and(|r| r.starts_with("now-")), "{report}");
    assert_eq!(keys("*:d:transactional:*:slo-report.now-*").await, 1, "one operator, one report");
}
