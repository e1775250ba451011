//! The delivery log: filters over a seeded Redis (several statuses at once, paging
//! to the end, a subscriber, `since`, a state this version does not know), the
//! command line, the admin endpoint's token, the overview against `slo --json` and
//! `/metrics`, and the pages driven in headless Chromium (sign in to the overview,
//! filter by two statuses and a span, page 2, one delivery, screenshots of each).

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::browser::Browser;
use common::*;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::audience::suppression;
use mailstream::config::Secret;
use mailstream::model::outcome::Why;
use mailstream::ops::deliveries::{self, Filter};
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::{Listeners, RunOptions};
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(120);
const TOKEN: &str = "an-admin-token-for-tests";

/// 60 subscribers through one period: every 5th refused by Resend (failed), every
/// 7th unsubscribed before the run (skipped), the rest sent; then the next period
/// enqueued and not run (pending).
async fn seeded() -> World {
    let mut world = World::with(Default::default(), |c| c.http.admin_tokens = vec![Secret::new(TOKEN)]).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let mut subs: Vec<Subscriber> = (0..60).map(subscriber).collect();
    for (i, s) in subs.iter_mut().enumerate() {
        if i % 5 == 0 {
            s.email = format!("someone{i}@example.com"); // Resend refuses example.com
        }
    }
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    for s in subs.iter_mut().filter(|s| s.id.ends_with('7')) {
        s.subscribed = false;
    }
    subscribers::upsert(&world.store, &subs).await.unwrap();
    let daemon = world.daemon();
    world.settled(SETTLE).await;
    daemon.stop().await;
    mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(1)).await.unwrap();
    world
}

/// Every page of `f`, in order: the rows (each id once) and how many pages.
async fn every_page(store: &mailstream::store::Store, f: &Filter) -> (Vec<deliveries::DeliveryRow>, usize) {
    let (mut rows, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    let mut seen = BTreeSet::new();
    loop {
        let p = deliveries::page(store, f, cursor.as_deref()).await.unwrap();
        pages += 1;
        assert!(p.rows.len() <= f.limit);
        for r in p.rows {
            assert!(seen.insert(r.id.clone()), "{} twice", r.id);
            rows.push(r);
        }
        match p.next {
            Some(next) => cursor = Some(next),
            None => return (rows, pages),
        }
    }
}

fn filter(statuses: &[&str]) -> Filter {
    Filter { statuses: statuses.iter().map(|s| s.to_string()).collect(), limit: 1000, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_log_filters_a_seeded_redis() {
    let world = seeded().await;
    let store = &world.store;
    let counts = world.counts().await;
    let page = |f: Filter| async move { deliveries::page(store, &f, None).await.unwrap() };

    let failed = page(filter(&["failed"])).await;
    assert_eq!(failed.rows.len() as u64, counts.failed);
    assert!(failed.rows.iter().all(|r| r.status == "failed" && r.why.as_deref() == Some("validation_error")));
    // What Resend said of each, not only its error's name.
    let said = |r: &deliveries::DeliveryRow| {
        r.said.as_deref().is_some_and(|s| s.contains("example.com domain is not allowed"))
    };
    assert!(failed.rows.iter().all(said), "{:?}", failed.rows[0]);
    let skipped = page(filter(&["skipped"])).await;
    assert_eq!(skipped.rows.len() as u64, counts.skipped);
    assert!(counts.failed > 0 && counts.skipped > 0, "{counts:?}");
    let both = page(filter(&["failed", "skipped"])).await;
    assert_eq!(both.rows.len(), failed.rows.len() + skipped.rows.len());
    let next = world.store.counts(CAMPAIGN, &week(1)).await.unwrap();
    assert_eq!(page(filter(&["pending"])).await.rows.len() as u64, next.enqueued, "the next period, not run");
    assert_eq!(next.enqueued, 54, "the six who unsubscribed are left out");

    // Pages of 7 over one period: every delivery once, then no cursor.
    let period =
        Filter { campaign: Some(CAMPAIGN.into()), period: Some(PERIOD.to_string()), limit: 7, ..Default::default() };
    let (rows, pages) = every_page(store, &period).await;
    assert!(rows.iter().all(|r| r.period == *PERIOD));
    assert_eq!((rows.len(), pages >= 9), (60, true));
    // Newest first: the settled ones by settlement time, then the rest (the next period's).
    let all = page(filter(&[])).await.rows;
    let settled: Vec<&str> = all.iter().map_while(|r| r.settled_at.as_deref()).collect();
    assert_eq!(settled.len(), 60, "settled first");
    assert!(settled.windows(2).all(|w| w[0] >= w[1]), "newest first: {settled:?}");
    assert!(all[60..].iter().all(|r| r.status == "pending") && all.len() == 114);

    // One partition's index trimmed to its newest 1,000 (here: ids of records that
    // do not exist, newer than any real one): what the indexes no longer cover comes
    // from the scan, still once each.
    let mut conn = store.conn().await.unwrap();
    let recent = store.keys.recent(0);
    let _: () = redis::cmd("DEL").arg(&recent).query_async(&mut conn).await.unwrap();
    let later = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let mut zadd = redis::cmd("ZADD");
    zadd.arg(&recent);
    for i in 0..mailstream::store::keys::RECENT_KEEP as i64 {
        zadd.arg(later + i).arg(format!("gone:2026-W01:nobody:{i}"));
    }
    let _: () = zadd.query_async(&mut conn).await.unwrap();
    let (again, _) = every_page(store, &period).await;
    let ids = |rows: &[deliveries::DeliveryRow]| rows.iter().map(|r| r.id.clone()).collect::<BTreeSet<_>>();
    assert_eq!(ids(&again), ids(&rows));
    assert_eq!(again.len(), 60, "every delivery once");

    // One subscriber: both periods; addresses masked.
    let f = Filter { subscriber: Some("user-000003".into()), limit: 10, ..Default::default() };
    let one = deliveries::page(store, &f, None).await.unwrap();
    assert_eq!(one.rows.len(), 2);
    assert!(one.rows.iter().all(|r| r.address.as_deref() == Some("d***@resend.dev")), "{:?}", one.rows);
    // Since: settled in the last hour (all of the first period), none from tomorrow.
    let now = chrono::Utc::now();
    let recent = Filter { since: Some(now - chrono::Duration::hours(1)), ..filter(&[]) };
    assert_eq!(page(recent).await.rows.len(), 60);
    let tomorrow = Filter { since: Some(now + chrono::Duration::days(1)), ..filter(&[]) };
    assert!(page(tomorrow).await.rows.is_empty());

    // A state written by some other version reads as unknown, never a crash.
    let odd = delivery_of(&subscriber(4));
    let key = store.keys.delivery(store.keys.partition_of(&odd.subscriber), &odd.id());
    let _: () = redis::cmd("HSET").arg(&key).arg("state").arg("from_the_future").query_async(&mut conn).await.unwrap();
    let unknown = page(filter(&["unknown"])).await;
    assert_eq!(unknown.rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [odd.id().as_str()]);
    let detail = deliveries::get(store, &odd.id()).await.unwrap().unwrap();
    assert_eq!(detail.row.status, "unknown");
    assert!(deliveries::page(store, &filter(&["delivered"]), None).await.is_err(), "not a status");

    // The command line, two statuses at once, one JSON object per line.
    let out = Command::new(env!("CARGO_BIN_EXE_mailstream"))
        .args(["deliveries", "--status", "failed", "--status", "skipped", "--json", "--limit", "500"])
        .arg("--config")
        .arg(config_for(&world))
        .env("MAILSTREAM_REDIS_URL", world.redis.url())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), both.rows.len());
    assert!(String::from_utf8_lossy(&out.stdout).lines().all(|l| !l.contains("someone")), "addresses masked");
}

/// The shipped config, fitted to this world's Redis.
fn config_for(world: &World) -> std::path::PathBuf {
    let text = mailstream::config::EXAMPLE.replacen("durability = \"strict\"", "durability = \"relaxed\"", 1).replacen(
        "partitions = 1",
        &format!("partitions = {}", world.config.redis.partitions),
        1,
    );
    let path =
        std::env::temp_dir().join(format!("mailstream-admin-{}-{}.toml", std::process::id(), world.redis.port()));
    std::fs::write(&path, text).unwrap();
    path
}

async fn daemon_with_metrics(world: &World) -> (Daemon, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let listeners = Listeners { metrics: Some(listener), public: None };
    (Daemon::start_listening(world.config.clone(), RunOptions::default(), listeners), url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_refuses_a_missing_or_wrong_token() {
    let world = seeded().await;
    let (daemon, url) = daemon_with_metrics(&world).await;
    mailstream::resend::client::install_crypto_provider();
    let http = reqwest::Client::new();
    let api = format!("{url}/admin/api/deliveries?status=failed&status=skipped");
    let get = |auth: Option<&str>| {
        let mut r = http.get(&api);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };
    assert_eq!(get(None).await.unwrap().status(), 401);
    assert_eq!(get(Some("Bearer not-the-token-at-all")).await.unwrap().status(), 401);
    assert_eq!(get(Some(&format!("Bearer {TOKEN}x"))).await.unwrap().status(), 401);
    let forged = http.get(&api).header("cookie", "mailstream_admin=00ff").send().await.unwrap();
    assert_eq!(forged.status(), 401);
    let ok = get(Some(&format!("Bearer {TOKEN}"))).await.unwrap();
    assert_eq!(ok.status(), 200);
    let page: Value = ok.json().await.unwrap();
    let counts = world.counts().await;
    assert_eq!(page["rows"].as_array().unwrap().len() as u64, counts.failed + counts.skipped);
    // The HTML page without a token asks for one.
    let html = http.get(format!("{url}/admin/deliveries")).send().await.unwrap();
    assert_eq!(html.status(), 401);
    assert!(html.text().await.unwrap().contains("id=\"login\""));
    daemon.stop().await;

    // No token configured: the log is off.
    let mut off = world.config.clone();
    off.http.admin_tokens.clear();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let off_url = format!("http://{}", listener.local_addr().unwrap());
    let listeners = Listeners { metrics: Some(listener), public: None };
    let daemon = Daemon::start_listening(off, RunOptions::default(), listeners);
    let r = http.get(format!("{off_url}/admin/api/deliveries")).header("authorization", format!("Bearer {TOKEN}"));
    assert_eq!(r.send().await.unwrap().status(), 404);
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_says_what_slo_and_the_metrics_say() {
    let world = seeded().await;
    // A receipt to an inline address: its row shows the address masked, its key as "Key".
    let receipt =
        json!({"idempotency_key": "order-1", "to": "ann@acme.example", "subject": "Receipt", "text": "Thanks"});
    let r = mailstream::audience::ingest::enqueue(&world.store, &world.config, vec![receipt]).await.unwrap();
    let (daemon, url) = daemon_with_metrics(&world).await;
    mailstream::resend::client::install_crypto_provider();
    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("{url}{path}")).header("authorization", format!("Bearer {TOKEN}")).send();
    let overview: Value = get("/admin/api/overview").await.unwrap().json().await.unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_mailstream"))
        .args(["slo", "--json", "--config"])
        .arg(config_for(&world))
        .env("MAILSTREAM_REDIS_URL", world.redis.url())
        .env_remove("MAILSTREAM_LOG")
        .output()
        .unwrap();
    let slo: Value = serde_json::from_slice(&out.stdout).unwrap();
    let figures = |v: &Value| -> Vec<Value> {
        let keep = ["campaign", "period", "enqueued", "sent", "failed", "skipped", "outcome_unknown", "failure_rate"];
        let periods = v["periods"].as_array().unwrap();
        periods.iter().map(|p| keep.iter().map(|k| (k.to_string(), p[k].clone())).collect()).collect()
    };
    assert_eq!(figures(&overview["slo"]), figures(&slo), "{overview}\n{slo}");
    assert_eq!(overview["slo"]["status"], slo["status"]);

    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    let gauge = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}:\n{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(overview["dead_letters"], gauge("mailstream_dead_letters{kind=\"failed\"}"));
    let counts = world.counts().await;
    assert_eq!(overview["dead_letters"], counts.failed, "{overview}");
    assert_eq!(overview["paused"], false);
    // Its Resend went away with the seeding: down, as the gauge and the overview say alike.
    let down = eventually(Duration::from_secs(60), || async {
        let overview: Value = get("/admin/api/overview").await.ok()?.json().await.ok()?;
        let metrics = get("/metrics").await.ok()?.text().await.ok()?;
        let said = overview["provider_down_since"].as_str()?.to_string();
        metrics.lines().any(|l| l == "mailstream_provider_down 1").then_some(said)
    })
    .await;
    assert!(down.is_some_and(|since| since.ends_with('Z')), "the provider is down and said so");
    assert_eq!(overview["partitions"].as_array().unwrap().len(), world.config.redis.partitions as usize);
    let page = get("/admin/overview").await.unwrap().text().await.unwrap();
    assert!(page.contains("id=\"periods\"") && page.contains(&week(1)), "{page}");
    assert!(page.contains("Resend is down since"), "{page}");

    let mailstream::audience::ingest::ItemResult::Accepted { delivery: id, .. } = &r[0] else { panic!("{r:?}") };
    let rows: Value = get("/admin/api/deliveries?campaign=transactional").await.unwrap().json().await.unwrap();
    assert_eq!(rows["rows"][0]["address"], "a***@acme.example", "{rows}");
    let href = form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>();
    assert!(id.ends_with(":order-1"), "{id}");
    let detail = get(&format!("/admin/deliveries/{href}")).await.unwrap().text().await.unwrap();
    assert!(detail.contains("<th>Key</th><td>order-1</td>") && !detail.contains("ann@"), "{detail}");
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_log_page_works_in_headless_chromium() {
    let mut world = seeded().await;
    // A provider again, for the retried delivery; an address suppressed by hand, to lift.
    let (_emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let config = world.config.clone();
    suppression::apply(&world.store, &config, "gone@acme.example", suppression::Act::Suppress(Why::Manual), None)
        .await
        .unwrap();
    let (daemon, url) = daemon_with_metrics(&world).await;
    let counts = world.counts().await;
    let browser = Browser::start().await;

    // Sign in.
    browser.go(&format!("{url}/admin/login")).await;
    browser.type_into("#token", TOKEN).await;
    browser.click_to_navigate("#sign-in").await;
    // The overview first: each campaign period against the SLO.
    assert_eq!(browser.find_all("tr.period").await.len(), 2, "signed in: the overview shows both periods");
    assert!(browser.text("#paused").await.contains("not paused"));
    browser.screenshot("admin-overview.png").await;
    // Pages of 5; filter by two statuses and a span, which the form keeps.
    browser.go(&format!("{url}/admin/deliveries?limit=5&period={}", *PERIOD)).await;
    browser.click("#status-failed").await;
    browser.click("#status-skipped").await;
    browser.type_into("#since", "30d").await;
    browser.click_to_navigate("#apply").await;
    let since = browser.find("#since").await;
    let kept = browser.call(reqwest::Method::GET, &format!("/element/{since}/property/value"), json!({})).await;
    assert_eq!(kept, "30d", "the filter keeps its value after Apply");
    let first: Vec<String> = row_texts(&browser).await;
    assert_eq!(first.len(), 5);
    assert!(first.iter().all(|r| r.contains("failed") || r.contains("skipped")), "{first:?}");
    browser.screenshot("delivery-log-page-1.png").await;
    // Page 2: five more, none repeated.
    browser.click_to_navigate("#next").await;
    let second = row_texts(&browser).await;
    assert!(!second.is_empty() && second.iter().all(|r| !first.contains(r)), "{first:?} then {second:?}");
    assert!(second.iter().all(|r| r.contains("failed") || r.contains("skipped")));
    assert!((first.len() + second.len()) as u64 <= counts.failed + counts.skipped);
    // One delivery.
    browser.click_to_navigate("tr.delivery a.open").await;
    let title = browser.text("#delivery").await;
    assert!(title.starts_with(&format!("{CAMPAIGN}:{}:", *PERIOD)), "{title}");
    let summary = browser.text("#summary").await;
    assert!(summary.contains("***@"), "the address, masked: {summary}");
    assert!(!summary.contains("someone"), "{summary}");
    let shot = browser.screenshot("delivery-log-detail.png").await;
    println!("screenshots saved: {} (and admin-overview.png, delivery-log-page-1.png)", shot.display());
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000, "a real screenshot");

    // Retry a failed delivery, once its address is fixed: confirmed, then sent.
    browser.go(&format!("{url}/admin/deliveries?status=failed&limit=1")).await;
    browser.click_to_navigate("tr.delivery a.open").await;
    let id = browser.text("#delivery").await;
    assert!(browser.text("#said").await.contains("domain is not allowed"), "what Resend said is shown");
    let sub = mailstream::model::work::DeliveryRef::parse(&id).unwrap().subscriber;
    let i: u64 = sub.trim_start_matches("user-").parse().unwrap();
    subscribers::upsert(&world.store, &[Subscriber::synthetic(i)]).await.unwrap();
    browser.click_to_navigate("#retry").await;
    assert!(browser.text("#what").await.contains(&id), "the confirmation names the delivery");
    browser.click_to_navigate("#do").await;
    // Back to the delivery (Post/Redirect/Get), which says what was done.
    assert_eq!(browser.text("#delivery").await, id);
    assert!(browser.text("#result").await.contains("1 done, 0 refused"), "{}", browser.text("#result").await);
    let sent = eventually(SETTLE, || {
        let store = world.store.clone();
        let id = id.clone();
        async move { deliveries::get(&store, &id).await.unwrap().filter(|d| d.row.status == "sent") }
    })
    .await;
    let sent = sent.expect("the retried delivery was sent");
    assert!(sent.row.provider_id.is_some() && sent.row.address.unwrap().ends_with("@resend.dev"));

    // Lift the suppression.
    browser.go(&format!("{url}/admin/suppressions")).await;
    assert_eq!(browser.find_all("tr.suppression").await.len(), 1);
    browser.click_to_navigate("tr.suppression a.lift").await;
    browser.click_to_navigate("#do").await;
    assert!(browser.text("#result").await.contains("1 done, 0 refused"));
    assert!(browser.url().await.contains("/admin/suppressions?"), "back to the suppressions");
    assert!(suppression::list(&world.store, Some("gone@acme.example")).await.unwrap().is_empty(), "lifted");

    // A form posted with the session's cookie but without the page's token is refused.
    let cookie = browser.call(reqwest::Method::GET, "/cookie/mailstream_admin", json!({})).await;
    let forged = reqwest::Client::new()
        .post(format!("{url}/admin/act"))
        .header("cookie", format!("mailstream_admin={}", cookie["value"].as_str().unwrap()))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("op=retry&id={}", form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    let metrics = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
    for line in [
        "mailstream_admin_actions_total{operation=\"retry\",result=\"done\"} 1",
        "mailstream_admin_actions_total{operation=\"lift\",result=\"done\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    browser.quit().await;
    daemon.stop().await;
}

async fn row_texts(browser: &Browser) -> Vec<String> {
    let mut out = Vec::new();
    for e in browser.find_all("tr.delivery").await {
        let t = browser.call(reqwest::Method::GET, &format!("/element/{e}/text"), json!({})).await;
        out.push(t.as_str().unwrap().to_string());
    }
    out
}
