//! The admin pages in an incident (#51): failures grouped by reason (failed with Resend's
//! `validation_error`, one whose outcome is unknown) and retried by reason, each action
//! answered by a redirect back to what it touched; a campaign period's progress and the
//! instances reading; sessions kept in Redis that sign out, expire and end with their
//! token; the headers every admin answer carries; the last hour charted from per-minute
//! counters; a search by address (through its hash) or subscriber; the pages at a phone's width in
//! headless Chromium, with screenshots in `target/test-artifacts/`.

mod common;

use std::time::Duration;

use common::browser::Browser;
use common::*;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, Secret};
use mailstream::model::work::DeliveryRef;
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::{Listeners, RunOptions};
use serde_json::Value;

const SETTLE: Duration = Duration::from_secs(120);
const TOKEN: &str = "an-admin-token-for-tests";

/// 20 subscribers through one period, every 5th refused by Resend (`validation_error`:
/// 4 failed); then one delivery of the period whose outcome is unknown (sealed, passed the
/// last gate by a holder that died, its batch record lost).
async fn incident() -> World {
    let mut world = World::with(Default::default(), |c| c.http.admin_tokens = vec![Secret::new(TOKEN)]).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let mut subs: Vec<Subscriber> = (0..20).map(subscriber).collect();
    for (i, s) in subs.iter_mut().enumerate() {
        if i % 5 == 0 {
            s.email = format!("someone{i}@example.com"); // Resend refuses example.com
        }
    }
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    let daemon = world.daemon();
    world.settled(SETTLE).await;
    daemon.stop().await;

    let lost = (0..).map(|i| format!("lost-{i}")).find(|id| world.store.keys.partition_of(id) == 0).unwrap();
    let lost_sub = Subscriber { id: lost.clone(), ..subscriber(99) };
    subscribers::upsert(&world.store, std::slice::from_ref(&lost_sub)).await.unwrap();
    let item = (DeliveryRef::new(CAMPAIGN, &PERIOD, &lost, "t"), lost_sub.email.clone());
    let (batch, _) = sealed_batch_of(&world, &[item], window(&world.config, &PERIOD), "a-holder-that-died", true).await;
    let mut conn = world.store.conn().await.unwrap();
    let _: () = redis::cmd("DEL").arg(world.store.keys.batch(0, &batch)).query_async(&mut conn).await.unwrap();
    world
}

/// The daemon with its private listener (metrics and the admin pages) on a free port.
async fn daemon_on(config: Config) -> (Daemon, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let listeners = Listeners { metrics: Some(listener), public: None };
    (Daemon::start_listening(config, RunOptions::default(), listeners), url)
}

/// A client that shows redirects rather than following them.
fn http() -> reqwest::Client {
    mailstream::resend::client::install_crypto_provider();
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// A form's body.
fn form(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

/// An admin action posted with the bearer token (no form token needed), its answer.
async fn act(http: &reqwest::Client, url: &str, pairs: &[(&str, &str)]) -> reqwest::Response {
    let post = http.post(format!("{url}/admin/act")).header("authorization", bearer());
    let post = post.header("content-type", "application/x-www-form-urlencoded").body(form(pairs));
    post.send().await.unwrap()
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// The groups of a page's `failures_by_reason`, as (status, reason, count).
fn groups(v: &Value) -> Vec<(String, String, u64)> {
    let list = v["failures_by_reason"].as_array().unwrap_or_else(|| panic!("{v}"));
    list.iter()
        .map(|g| {
            (g["status"].as_str().unwrap().into(), g["error"].as_str().unwrap().into(), g["count"].as_u64().unwrap())
        })
        .collect()
}

/// Enqueues a receipt while Resend is gone (it went with the seeding) and waits until its
/// batch's request has failed: its id, url-encoded, and its page's JSON.
async fn a_waiting_receipt(world: &World, get: impl AsyncFn(&str) -> Option<Value>) -> (String, Value) {
    let receipt = serde_json::json!({"idempotency_key": "order-1", "to": "ann@acme.example", "subject": "Receipt", "text": "Thanks"});
    let r = mailstream::audience::ingest::enqueue(&world.store, &world.config, vec![receipt]).await.unwrap();
    let mailstream::audience::ingest::ItemResult::Accepted { delivery: id, .. } = &r[0] else { panic!("{r:?}") };
    let href = form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>();
    let path = format!("/admin/api/deliveries/{href}");
    let waiting = eventually(SETTLE, || async {
        let v = get(&path).await?;
        v["waiting"]["last_error"].as_str().is_some().then_some(v)
    })
    .await
    .expect("the receipt's request failed, and it waits");
    (href, waiting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_grouped_by_reason_and_retried_by_reason() {
    let world = incident().await;
    let (daemon, url) = daemon_on(world.config.clone()).await;
    let http = http();
    let get = |path: &str| http.get(format!("{url}{path}")).header("authorization", bearer()).send();
    // The lost batch's delivery is decided outcome_unknown once its lease is over.
    let overview = eventually(SETTLE, || async {
        let v: Value = get("/admin/api/overview").await.ok()?.json().await.ok()?;
        (groups(&v).len() == 2).then_some(v)
    })
    .await
    .expect("two groups of failures");
    let all = groups(&overview);
    assert_eq!((all[0].0.as_str(), all[0].1.as_str(), all[0].2), ("failed", "validation_error", 4), "{all:?}");
    assert_eq!((all[1].0.as_str(), all[1].2), ("outcome_unknown", 1), "{all:?}");
    let said = overview["failures_by_reason"][0]["said"].as_str().unwrap();
    assert!(said.contains("example.com domain is not allowed") && !said.contains("someone"), "{said}");
    assert_eq!(overview["failures_by_reason"][0]["periods"][0], format!("{CAMPAIGN} {}", *PERIOD));

    // The period's page: the same groups, its progress, the instance reading.
    let q = format!("campaign={CAMPAIGN}&period={}", *PERIOD);
    let period: Value = get(&format!("/admin/api/period?{q}")).await.unwrap().json().await.unwrap();
    assert_eq!(groups(&period), all);
    assert_eq!((period["settled"].as_u64(), period["enqueued"].as_u64()), (Some(21), Some(21)), "{period}");
    assert!(period["eta_seconds"].is_null(), "nothing left: {period}");
    let readers = period["readers"].as_array().unwrap();
    assert!(readers.iter().any(|r| r["lane"] == "digest" && r["consumer"].as_str().is_some()), "{period}");
    let html = get(&format!("/admin/period?{q}")).await.unwrap().text().await.unwrap();
    assert!(html.contains("class=\"retry-reason\"") && html.contains("retry these 4"), "{html}");
    assert!(html.contains("--allow-unknown"), "outcome unknown stays a command-line action: {html}");

    // Retry by reason: the confirmation says how many and why; the action redirects back.
    let confirm = get(&format!("/admin/confirm?op=retry_reason&error=validation_error&{q}")).await.unwrap();
    let text = confirm.text().await.unwrap();
    assert!(text.contains("Retry 4 failed deliveries of"), "{text}");
    assert!(text.contains("4 validation_error (Resend said: The example.com domain is not allowed"), "{text}");
    let pairs = [("op", "retry_reason"), ("error", "validation_error"), ("campaign", CAMPAIGN), ("period", &PERIOD)];
    let acted = act(&http, &url, &pairs).await;
    assert_eq!(acted.status(), 303);
    let to = acted.headers()["location"].to_str().unwrap().to_string();
    assert!(to.starts_with("/admin/period?campaign=") && to.contains("acted=retry_reason&done=4&refused=0"), "{to}");
    let back = get(&to).await.unwrap().text().await.unwrap();
    assert!(back.contains("id=\"result\"") && back.contains("4 done, 0 refused"), "{back}");
    // Requeued, so no longer failing; the unknown one is left to the command line.
    let after: Value = get("/admin/api/overview").await.unwrap().json().await.unwrap();
    assert!(groups(&after).iter().all(|g| g.0 == "outcome_unknown"), "{after}");
    // Nothing left to retry: said, not done.
    let none = get(&format!("/admin/confirm?op=retry_reason&error=validation_error&{q}")).await.unwrap();
    assert!(none.text().await.unwrap().contains("No failed delivery of"));
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    let line = "mailstream_admin_actions_total{operation=\"retry_reason\",result=\"done\"} 4";
    assert!(metrics.contains(line), "{line} in\n{metrics}");
    // A link cannot make a page say something else: only numbers and fixed words.
    let forged = get("/admin/overview?acted=%3Cb%3Ecall%20us%3C%2Fb%3E&done=1").await.unwrap().text().await.unwrap();
    assert!(!forged.contains("id=\"result\"") && !forged.contains("call us"));

    // A receipt waiting through the outage says what it waits for, since when and until when.
    let json = async |path: &str| -> Option<Value> { get(path).await.ok()?.json().await.ok() };
    let (href, waiting) = a_waiting_receipt(&world, json).await;
    let w = &waiting["waiting"];
    assert!(w["what"].as_str().unwrap().contains("sealed into batch"), "{waiting}");
    assert_eq!(w["last_error"], "connection_failed", "{waiting}");
    let now = chrono::Utc::now().timestamp_millis() as u64;
    assert!(w["next_attempt_ms"].as_u64().is_some(), "{waiting}");
    let deadline = w["deadline_ms"].as_u64().unwrap();
    assert!(deadline > now + 47 * 3_600_000 && deadline <= now + 48 * 3_600_000, "48 h after sealing: {waiting}");
    let html = get(&format!("/admin/deliveries/{href}")).await.unwrap().text().await.unwrap();
    for shown in ["id=\"waiting\"", "connection_failed", "Gives up", "Resend window ends", " UTC (in "] {
        assert!(html.contains(shown), "{shown} in {html}");
    }
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_charts_the_last_hour_and_search_finds_an_address_or_a_subscriber() {
    let world = incident().await;
    let (daemon, url) = daemon_on(world.config.clone()).await;
    let http = http();
    let get = |path: &str| http.get(format!("{url}{path}")).header("authorization", bearer()).send();
    let json = async |path: &str| -> Option<Value> { get(path).await.ok()?.json().await.ok() };
    // Once the lost batch's delivery is decided, the hour holds every settlement.
    let overview = eventually(SETTLE, || async {
        let v = json("/admin/api/overview").await?;
        (groups(&v).len() == 2).then_some(v)
    })
    .await
    .expect("two groups of failures");
    let minutes = overview["last_hour"].as_array().unwrap();
    assert_eq!(minutes.len(), 60, "{overview}");
    let sum = |state: &str| minutes.iter().map(|m| m[state].as_u64().unwrap()).sum::<u64>();
    let hour = (sum("sent"), sum("failed"), sum("outcome_unknown"), sum("skipped"));
    assert_eq!(hour, (16, 4, 1, 0), "{overview}");
    let html = get("/admin/overview?refresh=off").await.unwrap().text().await.unwrap();
    assert!(html.contains("Settled in the last 60 minutes: 16 sent, 0 skipped, 1 outcome unknown, 4 failed"), "{html}");
    assert_eq!(html.matches("<g class=\"minute\">").count(), 60);
    // The counters are bounded: an hash per partition that expires after the hour.
    let mut conn = world.store.conn().await.unwrap();
    let ttl: i64 = redis::cmd("TTL").arg(world.store.keys.per_minute(0)).query_async(&mut conn).await.unwrap();
    assert!(ttl > 3600 && ttl <= 3900, "{ttl}");

    // An address typed in the clear is sent on to its hash's page, which names no address.
    let (failing, email) = (subscriber(5).id, "someone5@example.com");
    let hash = world.store.keys.address(email).hash;
    let typed = get("/admin/search?q=Someone5%40Example.com").await.unwrap();
    assert_eq!(typed.status(), 303);
    assert_eq!(typed.headers()["location"].to_str().unwrap(), format!("/admin/search?address={hash}"));
    let page = get(&format!("/admin/search?address={hash}")).await.unwrap().text().await.unwrap();
    assert!(page.contains(&failing) && page.contains("validation_error") && !page.contains("someone5"), "{page}");
    assert!(page.contains("Not suppressed."), "{page}");
    // Suppressed: the search says so, by the subscriber's id too.
    let manual = mailstream::audience::suppression::Act::Suppress(mailstream::model::outcome::Why::Manual);
    mailstream::audience::suppression::apply(&world.store, &world.config, email, manual, None).await.unwrap();
    let found = json(&format!("/admin/api/search?q={failing}")).await.unwrap();
    assert_eq!(found["suppression"]["reason"], "manual", "{found}");
    assert_eq!(found["address_hash"], hash.as_str());
    let ids: Vec<&str> = found["deliveries"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    let of_period = format!("{CAMPAIGN}:{}:{failing}:", *PERIOD);
    assert!(ids.len() == 1 && ids[0].starts_with(&of_period), "{found}");

    // A receipt addressed inline is found by its address, through the address index, which
    // expires with its idempotency key's guard.
    let (href, _) = a_waiting_receipt(&world, json).await;
    let id = form_urlencoded::parse(format!("x={href}").as_bytes()).next().unwrap().1.to_string();
    let found = json("/admin/api/search?q=ann%40acme.example").await.unwrap();
    assert_eq!(found["subscribers"], serde_json::json!([]), "{found}");
    let ids: Vec<&str> = found["deliveries"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [id.as_str()], "{found}");
    let p = world.store.keys.partition_of(DeliveryRef::parse(&id).unwrap().home());
    let index = world.store.keys.by_address(p);
    let kept: i64 = redis::cmd("PTTL").arg(&index).query_async(&mut conn).await.unwrap();
    let retention = world.config.retention().as_millis() as i64;
    assert!(kept > retention - 60_000 && kept <= retention, "{kept} of {retention}");
    let members: Vec<String> = redis::cmd("ZRANGE").arg(&index).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
    let ann = world.store.keys.address("ann@acme.example").hash;
    assert_eq!(members, [format!("{ann}:{id}")], "hashes and ids only");
    // Nothing to find, and nothing asked: said, not an error page.
    let nobody = get("/admin/search?q=nobody%40acme.example").await.unwrap();
    assert_eq!(nobody.status(), 303);
    let none = get(nobody.headers()["location"].to_str().unwrap()).await.unwrap().text().await.unwrap();
    assert!(none.contains("No subscriber has this address.") && none.contains("No delivery within the retention."));
    assert_eq!(get("/admin/search").await.unwrap().status(), 200);
    // A delivery settled sent keeps no events: the log says so rather than a blank.
    let sent = get(&format!("/admin/deliveries?campaign={CAMPAIGN}&status=sent&limit=1")).await.unwrap();
    let sent = sent.text().await.unwrap();
    assert!(sent.contains("class=\"delivery\"") && sent.contains(">not kept</span>"), "{sent}");
    assert_eq!(get("/admin/api/search").await.unwrap().status(), 400);
    assert_eq!(get("/admin/search?address=not-a-hash").await.unwrap().status(), 400);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_delivery_that_fails_again_keeps_its_whole_history() {
    // Resend stays up: the retry is refused again, as the first request was.
    let mut world = World::with(Default::default(), |c| c.http.admin_tokens = vec![Secret::new(TOKEN)]).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let mut subs: Vec<Subscriber> = (0..4).map(subscriber).collect();
    subs[0].email = "someone0@example.com".into(); // Resend refuses example.com
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    let (daemon, url) = daemon_on(world.config.clone()).await;
    world.settled(SETTLE).await;
    let failed = mailstream::ops::deliveries::every(
        &world.store,
        &mailstream::ops::deliveries::Filter { statuses: vec!["failed".into()], limit: 10, ..Default::default() },
    )
    .await
    .unwrap();
    let [first] = failed.as_slice() else { panic!("{failed:?}") };
    let href = form_urlencoded::byte_serialize(first.id.as_bytes()).collect::<String>();
    let http = http();
    let acted = act(&http, &url, &[("op", "retry"), ("id", &first.id)]).await;
    assert_eq!(acted.status(), 303);
    let get = async |path: &str| -> Option<Value> {
        http.get(format!("{url}{path}")).header("authorization", bearer()).send().await.ok()?.json().await.ok()
    };
    // Failed again: the first failure, the operator's retry and the second failure, in order.
    let again = eventually(SETTLE, || async {
        let v = get(&format!("/admin/api/deliveries/{href}")).await?;
        (v["row"]["status"] == "failed" && v["history"].as_array()?.len() >= 3).then_some(v)
    })
    .await
    .expect("failed again");
    let said: Vec<&str> = again["history"].as_array().unwrap().iter().map(|h| h[1].as_str().unwrap()).collect();
    let refused = "failed: validation_error; Resend said: The example.com domain is not allowed";
    assert!(said[0].starts_with(refused), "{again}");
    assert_eq!(said[1], "retried by admin #1", "{again}");
    assert!(said[2].starts_with(refused), "{again}");
    assert_eq!(said.len(), 3, "{again}");
    assert!(again["fields"].get("history").is_none(), "shown as history, not as a raw field");
    // A delivery settled sent keeps only its compact entry: no history, no bytes added.
    let sent = DeliveryRef::new(CAMPAIGN, &PERIOD, &subs[1].id, &subs[1].targets[0]);
    let kept = mailstream::ops::deliveries::kept(&world.store, &sent).await.unwrap();
    assert_eq!(kept.get("state").map(String::as_str), Some("sent"), "{kept:?}");
    let at_most: std::collections::BTreeSet<&str> = ["state", "settled_ms", "sends", "provider_id"].into();
    assert!(kept.keys().all(|k| at_most.contains(k.as_str())), "{kept:?}");

    let browser = Browser::start().await;
    browser.go(&format!("{url}/admin/login")).await;
    browser.type_into("#token", TOKEN).await;
    browser.click_to_navigate("#sign-in").await;
    browser.go(&format!("{url}/admin/deliveries/{href}")).await;
    let history = browser.text("#history").await;
    assert!(history.contains("retried by admin #1") && history.matches("validation_error").count() == 2, "{history}");
    browser.screenshot("delivery-history-after-retry.png").await;
    browser.quit().await;
    daemon.stop().await;
}

/// The session cookie a sign-in set, and the whole Set-Cookie header.
async fn sign_in(http: &reqwest::Client, url: &str, token: &str) -> reqwest::Response {
    let r = http.post(format!("{url}/admin/login")).header("content-type", "application/x-www-form-urlencoded");
    r.body(form(&[("token", token)])).send().await.unwrap()
}

fn cookie_of(r: &reqwest::Response) -> (String, String) {
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    let id = set.strip_prefix("mailstream_admin=").and_then(|s| s.split(';').next()).unwrap().to_string();
    (id, set)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lives_in_redis_signs_out_expires_and_ends_with_its_token() {
    let world = World::with(Default::default(), |c| c.http.admin_tokens = vec![Secret::new(TOKEN)]).await;
    let (daemon, url) = daemon_on(world.config.clone()).await;
    let http = http();
    let page = |id: String| {
        http.get(format!("{url}/admin/overview")).header("cookie", format!("mailstream_admin={id}")).send()
    };
    let store = world.store.clone();
    let sessions = || {
        let store = store.clone();
        async move {
            let mut conn = store.conn().await.unwrap();
            let pattern = format!("{}:admin:session:*", store.keys.prefix());
            let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query_async(&mut conn).await.unwrap();
            keys
        }
    };

    // Every admin answer, even the sign-in page, forbids framing and referrers.
    let login = http.get(format!("{url}/admin/login")).send().await.unwrap();
    let h = login.headers();
    assert!(h["content-security-policy"].to_str().unwrap().contains("frame-ancestors 'none'"), "{h:?}");
    assert_eq!(
        (h["x-frame-options"].to_str().unwrap(), h["referrer-policy"].to_str().unwrap()),
        ("DENY", "no-referrer")
    );
    assert_eq!(sign_in(&http, &url, "not-the-token-at-all").await.status(), 401);
    assert!(sessions().await.is_empty());

    let signed = sign_in(&http, &url, TOKEN).await;
    assert_eq!(signed.status(), 303);
    let (id, set) = cookie_of(&signed);
    assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "a random 128-bit id: {set}");
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Max-Age=28800"), "{set}");
    let keys = sessions().await;
    assert_eq!(keys.len(), 1);
    assert!(!keys[0].contains(&id), "Redis keeps a hash of the id, not the id");
    let mut conn = world.store.conn().await.unwrap();
    let ttl: i64 = redis::cmd("TTL").arg(&keys[0]).query_async(&mut conn).await.unwrap();
    assert!((1..=8 * 3600).contains(&ttl), "{ttl}");
    let open = page(id.clone()).await.unwrap();
    assert_eq!(open.status(), 200);
    assert_eq!(open.headers()["x-frame-options"], "DENY");
    // Another id of the right shape opens nothing.
    assert_eq!(page("0".repeat(32)).await.unwrap().status(), 401);

    // Signing out needs only the cookie; after it, the same cookie gets 401.
    let out = http.post(format!("{url}/admin/logout")).header("cookie", format!("mailstream_admin={id}")).send();
    let out = out.await.unwrap();
    assert_eq!((out.status().as_u16(), out.headers()["location"].to_str().unwrap()), (303, "/admin/login"));
    assert!(out.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    assert_eq!(page(id).await.unwrap().status(), 401);
    assert!(sessions().await.is_empty());

    // A session whose hours have passed (its key expired in Redis) gets 401.
    let (id, _) = cookie_of(&sign_in(&http, &url, TOKEN).await);
    assert_eq!(page(id.clone()).await.unwrap().status(), 200);
    let key = sessions().await.pop().unwrap();
    let _: () = redis::cmd("PEXPIRE").arg(&key).arg(1).query_async(&mut conn).await.unwrap();
    let expired = eventually(Duration::from_secs(30), || async { (sessions().await.is_empty()).then_some(()) }).await;
    assert!(expired.is_some(), "the key expires");
    assert_eq!(page(id).await.unwrap().status(), 401);

    // A token rotated out ends its sessions.
    let (id, _) = cookie_of(&sign_in(&http, &url, TOKEN).await);
    daemon.stop().await;
    let mut rotated = world.config.clone();
    rotated.http.admin_tokens = vec![Secret::new("the-next-admin-token-1234")];
    let (daemon, url) = daemon_on(rotated).await;
    let old = http.get(format!("{url}/admin/overview")).header("cookie", format!("mailstream_admin={id}"));
    assert_eq!(old.send().await.unwrap().status(), 401);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incident_pages_in_headless_chromium_fit_a_phone() {
    let world = incident().await;
    let (daemon, url) = daemon_on(world.config.clone()).await;
    let browser = Browser::start().await;
    browser.go(&format!("{url}/admin/login")).await;
    browser.type_into("#token", TOKEN).await;
    browser.click_to_navigate("#sign-in").await;
    // The overview refreshes itself; paused here, so the test reads a page that stays.
    assert_eq!(browser.find_all("meta[http-equiv=refresh]").await.len(), 1, "a live overview");
    browser.click_to_navigate("#pause").await;
    assert!(browser.find_all("meta[http-equiv=refresh]").await.is_empty(), "paused");
    let grouped = eventually(SETTLE, || async {
        browser.go(&format!("{url}/admin/overview?refresh=off")).await;
        (browser.find_all("tr.failure-group").await.len() == 2).then_some(())
    })
    .await;
    assert!(grouped.is_some(), "both reasons shown");
    let first = browser.text("#failures tr.failure-group").await;
    assert!(first.contains("validation_error") && first.contains("retry these 4"), "{first}");
    assert!(browser.text("#periods .stuck").await.contains('0'), "a stuck count of 0, not a blank");
    browser.screenshot("failures-grouped.png").await;
    let chart = browser.text("#chart-legend").await;
    assert!(chart.contains("sent 16") && chart.contains("failed 4"), "{chart}");
    assert_eq!(browser.find_all("svg#chart g.minute").await.len(), 60);
    browser.script("document.querySelector('#last-hour').scrollIntoView(); return true").await;
    browser.screenshot("overview-chart.png").await;
    // Search by address: the page lands on the address's hash, and finds the subscriber.
    browser.go(&format!("{url}/admin/search")).await;
    browser.type_into("#q", "someone5@example.com").await;
    browser.click_to_navigate("#find").await;
    assert!(browser.url().await.contains("/admin/search?address="), "{}", browser.url().await);
    assert!(browser.text("#found").await.contains("validation_error"));
    assert!(browser.text("#subscribers").await.contains(&subscriber(5).id));
    browser.screenshot("search.png").await;
    browser.go(&format!("{url}/admin/overview?refresh=off")).await;

    // From the period's page, retry one reason; back on the period's page, which says so.
    browser.click_to_navigate("a.open-period").await;
    assert!(browser.text("#progress").await.contains("Settled 21 of 21"), "{}", browser.text("#progress").await);
    browser.click_to_navigate("a.retry-reason").await;
    assert!(browser.text("#what").await.contains("Retry 4 failed deliveries"), "{}", browser.text("#what").await);
    browser.click_to_navigate("#do").await;
    let landed = browser.url().await;
    assert!(landed.contains("/admin/period?") && !landed.contains("/admin/act"), "{landed}");
    assert!(browser.text("#result").await.contains("4 done, 0 refused"));

    // A receipt waiting through the outage: its page tells why.
    let http = http();
    let get = async |path: &str| -> Option<Value> {
        http.get(format!("{url}{path}")).header("authorization", bearer()).send().await.ok()?.json().await.ok()
    };
    let (href, _) = a_waiting_receipt(&world, get).await;
    browser.go(&format!("{url}/admin/deliveries/{href}")).await;
    assert!(browser.text("#last-error").await.contains("connection_failed"));
    browser.screenshot("delivery-waiting.png").await;

    // A phone's width: no sideways scroll on the overview or a delivery, the SLO in view.
    browser.resize(420, 900).await;
    let fits = "return document.documentElement.scrollWidth <= window.innerWidth";
    browser.go(&format!("{url}/admin/overview?refresh=off")).await;
    assert_eq!(browser.script(fits).await, true, "the overview at 420 px");
    let slo = "const r = document.querySelector('#periods td.slo').getBoundingClientRect(); \
               return r.width > 0 && r.right <= window.innerWidth";
    assert_eq!(browser.script(slo).await, true, "the SLO state visible at 420 px");
    browser.screenshot("overview-420px.png").await;
    browser.go(&format!("{url}/admin/deliveries?campaign={CAMPAIGN}&limit=1")).await;
    browser.click_to_navigate("tr.delivery a.open").await;
    assert_eq!(browser.script(fits).await, true, "a delivery at 420 px");
    let summary = browser.text("#summary").await;
    assert!(summary.contains(" UTC ("), "times as people read them: {summary}");
    let record = browser.text("#record").await;
    let settled_ms = record.lines().find(|l| l.starts_with("settled_ms")).unwrap_or_else(|| panic!("{record}"));
    assert!(settled_ms.contains(" UTC ("), "a time field read as a time, its raw value beside: {settled_ms}");

    // Signing out ends the session: the overview asks for a token again.
    browser.resize(1280, 1000).await;
    browser.go(&format!("{url}/admin/overview?refresh=off")).await;
    browser.click_to_navigate("#sign-out").await;
    browser.go(&format!("{url}/admin/overview?refresh=off")).await;
    assert_eq!(browser.find_all("#login").await.len(), 1, "signed out");
    browser.quit().await;
    daemon.stop().await;
}
