//! Campaigns that run themselves: the daemon fires a due schedule and counts a
//! missed one; two schedulers fan out once; a fan-out stopped halfway resumes from
//! its cursors; deliveries at each recipient's local hour wait in the due sets and
//! are released at 09:00 their time, none early; a dry run writes nothing; a
//! preview is the very body that is sealed.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Timelike, Utc};
use common::*;
use mailstream::audience::kick::{self, FanoutOptions};
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::Secret;
use mailstream::model::outcome::Failpoint;
use mailstream::model::work::Lane;
use mailstream::store::scripts::{self, FanoutOf};
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::{Failpoints, Hold, RunOptions};

const SETTLE: Duration = Duration::from_secs(120);

/// The campaign's current period on Redis's clock.
async fn current_period(world: &World) -> String {
    let c = &world.config.campaigns[0];
    kick::period_for(&world.store, c, None, kick::PeriodRule::NearNow).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_fires_a_due_schedule_once_and_counts_a_missed_one() {
    // Every minute: the latest fire is always within the catch-up window.
    let mut world = World::with(Default::default(), |c| c.campaigns[0].schedule = Some("* * * * *".into())).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    world.subscribers(300).await;
    let period = current_period(&world).await;
    // Two daemons, two schedulers: one fan-out.
    let (a, b) = (world.daemon(), world.daemon());
    let store = world.store.clone();
    let settled = eventually(SETTLE, || {
        let (store, period) = (store.clone(), period.clone());
        async move {
            let c = store.counts(CAMPAIGN, &period).await.ok()?;
            (c.enqueued == 300 && c.settled() == 300).then_some(c)
        }
    })
    .await
    .expect("the scheduled kick was fired and sent");
    let mut conn = world.store.conn().await.unwrap();
    let record: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(world.store.keys.fanout(CAMPAIGN, &period)).query_async(&mut conn).await.unwrap();
    let fired: u64 = [&a, &b]
        .iter()
        .map(|d| {
            let text = d.metrics.render();
            text.lines()
                .filter(|l| l.starts_with("mailstream_schedule_fires_total") && l.contains("\"fired\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum();
    a.stop().await;
    b.stop().await;
    assert_eq!((settled.sent, settled.duplicates), (300, 0), "fanned out once: {settled:?}");
    assert_eq!((record["state"].as_str(), record["runs"].as_str(), record["new"].as_str()), ("done", "1", "300"));
    assert_eq!(fired, 1, "one scheduler fired it");
    assert_eq!(emulator.stats().emails_accepted, 300);

    // A schedule whose last fire is past the catch-up window: counted as missed, not sent.
    let late = World::with(Default::default(), |c| {
        c.campaigns[0].schedule = Some(daily_three_hours_ago());
        c.campaigns[0].catch_up_hours = 1;
    })
    .await;
    late.subscribers(10).await;
    let missed_line = "mailstream_schedule_fires_total{campaign=\"weekly_digest\",result=\"missed\"}";
    // A new deployment: the fire was before its first run, nobody's to send. Once the
    // scheduler has looked (it records the first run first), stop: the look is done.
    let first = late.daemon();
    let meta = late.store.keys.meta();
    let recorded = eventually(Duration::from_secs(30), || {
        let (store, meta) = (late.store.clone(), meta.clone());
        async move {
            let mut conn = store.conn().await.ok()?;
            let at: Option<i64> =
                redis::cmd("HGET").arg(&meta).arg("first_run_ms").query_async(&mut conn).await.ok()?;
            at
        }
    })
    .await
    .expect("the first run is recorded");
    let metrics = first.metrics.clone();
    first.stop().await;
    let text = metrics.render();
    assert!(!text.contains(&format!("{missed_line} 1")), "a fire before the first run is not missed:\n{text}");
    // A deployment that first ran a day before the fire: the same fire is missed.
    let day_before = recorded - 86_400_000;
    let mut conn = late.store.conn().await.unwrap();
    let _: () = redis::cmd("HSET").arg(&meta).arg("first_run_ms").arg(day_before).query_async(&mut conn).await.unwrap();
    let daemon = late.daemon();
    let missed = eventually(Duration::from_secs(30), || {
        let text = daemon.metrics.render();
        async move { text.contains(&format!("{missed_line} 1")).then_some(()) }
    })
    .await;
    daemon.stop().await;
    assert!(missed.is_some(), "the missed fire is counted");
    assert_eq!(late.store.counts(CAMPAIGN, &period).await.unwrap().enqueued, 0, "and nothing is sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_at_once_fan_out_once() {
    let world = World::new().await;
    world.subscribers(2000).await;
    let none = FanoutOptions::default();
    let (a, b) = tokio::join!(
        kick::kick_with(
            &world.store,
            &world.config,
            FanoutOf { campaign: CAMPAIGN, period: &PERIOD, owner: "scheduler-a" },
            false,
            &none
        ),
        kick::kick_with(
            &world.store,
            &world.config,
            FanoutOf { campaign: CAMPAIGN, period: &PERIOD, owner: "scheduler-b" },
            false,
            &none
        ),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let (ran, other) = if a.standby.is_none() && !a.already_done { (&a, &b) } else { (&b, &a) };
    assert_eq!(ran.new, 2000, "{a:?} {b:?}");
    assert!(other.standby.is_some() || other.already_done, "the other stood by: {other:?}");
    assert_eq!((other.new, other.duplicates), (0, 0));
    assert_eq!(world.counts().await.enqueued, 2000);
    // A scheduler never does a finished period again; an operator's kick does (all duplicates).
    let again = kick::kick_with(
        &world.store,
        &world.config,
        FanoutOf { campaign: CAMPAIGN, period: &PERIOD, owner: "scheduler-c" },
        false,
        &none,
    )
    .await
    .unwrap();
    assert!(again.already_done && again.new == 0, "{again:?}");
    let by_hand = world.kick().await;
    assert_eq!((by_hand.new, by_hand.duplicates), (0, 2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_stopped_halfway_resumes_from_its_cursors() {
    let world = World::with(Default::default(), |c| c.redis.partitions = 2).await;
    world.subscribers(6000).await;
    // A clean fan-out of another period counts the pages a whole scan takes.
    let none = FanoutOptions::default();
    let clean = kick::kick_with(
        &world.store,
        &world.config,
        FanoutOf { campaign: CAMPAIGN, period: &week(1), owner: "clean" },
        false,
        &none,
    )
    .await
    .unwrap();
    assert!(clean.scans >= 4, "{clean:?}");
    // Stopped after two pages, as a crash would stop it.
    let stop = FanoutOptions { stop_after_pages: Some(2), ..Default::default() };
    let first = kick::kick_with(
        &world.store,
        &world.config,
        FanoutOf { campaign: CAMPAIGN, period: &PERIOD, owner: "holder" },
        false,
        &stop,
    )
    .await
    .unwrap();
    assert!(first.abandoned && first.scans >= 2 && first.new < 6000, "{first:?}");
    // Resumed: only the pages not yet done are read again, and nothing is lost.
    let second = kick::kick_with(
        &world.store,
        &world.config,
        FanoutOf { campaign: CAMPAIGN, period: &PERIOD, owner: "holder" },
        false,
        &none,
    )
    .await
    .unwrap();
    assert!(second.resumed && !second.abandoned, "{second:?}");
    assert_eq!(first.scans + second.scans, clean.scans, "no page scanned twice: {first:?} {second:?} {clean:?}");
    assert_eq!((first.new + second.new, second.duplicates), (6000, 0));
    assert_eq!(world.counts().await.enqueued, 6000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_hour_deliveries_are_released_at_nine_their_time_and_never_early() {
    let world = World::with(Default::default(), |c| {
        c.redis.partitions = 1;
        c.campaigns[0].deliver_at_local = Some("09:00".into());
    })
    .await;
    let zones = ["Asia/Tokyo", "Europe/Berlin", "America/Los_Angeles", "Not/AZone"];
    let subs: Vec<Subscriber> =
        (0..20).map(|i| Subscriber { time_zone: Some(zones[i % 4].to_string()), ..subscriber(i) }).collect();
    // An unknown zone is refused where it enters now; one stored before that rule (here
    // written by hand) still means the campaign's zone.
    let known: Vec<Subscriber> = subs
        .iter()
        .map(|s| Subscriber { time_zone: s.time_zone.clone().filter(|z| z != "Not/AZone"), ..s.clone() })
        .collect();
    subscribers::upsert(&world.store, &known).await.unwrap();
    let mut conn = world.store.conn().await.unwrap();
    for s in subs.iter().filter(|s| s.time_zone.as_deref() == Some("Not/AZone")) {
        let key = world.store.keys.subscriber(world.store.keys.partition_of(&s.id), &s.id);
        let _: () = redis::cmd("HSET").arg(key).arg("time_zone").arg("Not/AZone").query_async(&mut conn).await.unwrap();
    }
    // Next week's period: every zone's next 09:00 falls inside it.
    let c = &world.config.campaigns[0];
    let next = c.period.next(&current_period(&world).await, c.tz()).unwrap();
    let kicked = kick::kick_registry(&world.store, &world.config, CAMPAIGN, &next).await.unwrap();
    assert_eq!(kicked.new, 20);
    let keys = &world.store.keys;
    assert_eq!(xlen(&mut conn, &keys.stream(0)).await, 0, "nothing claimable before its hour");
    let due: Vec<(String, u64)> =
        redis::cmd("ZRANGE").arg(keys.due(0)).arg(0).arg(-1).arg("WITHSCORES").query_async(&mut conn).await.unwrap();
    assert_eq!(due.len(), 20);
    // Each release is 09:00 on the subscriber's own clock (the campaign's for a bad zone).
    let mut by_zone = std::collections::BTreeMap::new();
    for (id, ms) in &due {
        let d = mailstream::model::work::DeliveryRef::parse(id).unwrap();
        let sub = subs.iter().find(|s| s.id == d.subscriber).unwrap();
        let zone = sub.time_zone.as_deref().unwrap();
        let tz: chrono_tz::Tz = zone.parse().unwrap_or(chrono_tz::Asia::Tokyo);
        let local = DateTime::<Utc>::from_timestamp_millis(*ms as i64).unwrap().with_timezone(&tz);
        assert_eq!((local.hour(), local.minute(), local.second()), (9, 0, 0), "{zone}: {local}");
        by_zone.insert(zone.to_string(), DateTime::<Utc>::from_timestamp_millis(*ms as i64).unwrap());
    }
    println!("observed release times (UTC) by subscriber zone: {by_zone:#?}");
    assert_eq!(by_zone["Not/AZone"], by_zone["Asia/Tokyo"], "an unknown zone means the campaign's");
    // Released by a clock a moment before each zone's hour: none early; at it: exactly that zone's.
    let mut times: Vec<DateTime<Utc>> = by_zone.values().copied().collect();
    times.sort();
    times.dedup();
    let mut released = 0;
    for t in times {
        let before = (t.timestamp_millis() - 1) as u64;
        assert_eq!(
            scripts::release_due(&mut conn, keys, 0, Lane::Digest, before, 1000).await.unwrap(),
            0,
            "none early at {t}"
        );
        let at =
            scripts::release_due(&mut conn, keys, 0, Lane::Digest, t.timestamp_millis() as u64, 1000).await.unwrap();
        released += at;
        assert_eq!(xlen(&mut conn, &keys.stream(0)).await, released);
    }
    assert_eq!(released, 20);
    // Dedup unchanged: a second kick adds nothing, anywhere.
    let again = kick::kick_registry(&world.store, &world.config, CAMPAIGN, &next).await.unwrap();
    assert_eq!((again.new, again.duplicates), (0, 20));
    let left: u64 = redis::cmd("ZCARD").arg(keys.due(0)).query_async(&mut conn).await.unwrap();
    assert_eq!((left, xlen(&mut conn, &keys.stream(0)).await), (0, 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_writes_nothing_and_counts_what_a_kick_would_do() {
    let world = World::with(Default::default(), |c| c.campaigns[0].deliver_at_local = Some("09:00".into())).await;
    let mut subs: Vec<Subscriber> = (0..40).map(subscriber).collect();
    subs[0].entitled = false;
    subs[1].subscribed = false;
    subs[2].time_zone = Some("America/Los_Angeles".into());
    subscribers::upsert(&world.store, &subs).await.unwrap();
    // Half of it already enqueued.
    kick::kick_list(&world.store, &world.config, CAMPAIGN, &PERIOD, &subs[..20]).await.unwrap();
    let snapshot = |store: mailstream::store::Store| async move {
        let mut conn = store.conn().await.unwrap();
        let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        let mut keys = store.scan("*").await.unwrap();
        keys.sort();
        let mut values = Vec::new();
        for k in &keys {
            let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(k).query_async(&mut conn).await.unwrap();
            values.push(dump);
        }
        (size, keys, values)
    };
    let before = snapshot(world.store.clone()).await;
    let dry = kick::dry_run(&world.store, &world.config, CAMPAIGN, &PERIOD).await.unwrap();
    let after = snapshot(world.store.clone()).await;
    assert!(before == after, "a dry run wrote something");
    assert_eq!(dry.subscribers, 40);
    assert_eq!((dry.new, dry.already_enqueued), (20, 18));
    assert_eq!(dry.not_eligible.get("not_entitled"), Some(&1));
    assert_eq!(dry.not_eligible.get("unsubscribed"), Some(&1));
    assert_eq!(dry.by_release_hour.values().sum::<u64>(), 20, "{:?}", dry.by_release_hour);
    // The kick then does what the dry run said.
    let kicked = world.kick().await;
    assert_eq!((kicked.new, kicked.duplicates, kicked.not_eligible), (20, 18, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_is_the_body_that_is_sealed() {
    let mut world = World::with(Default::default(), |c| {
        c.redis.partitions = 1;
        c.unsubscribe.secrets = vec![Secret::new("a-secret-for-links")];
    })
    .await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(3).await;
    let d = delivery_of(&subs[1]);
    let preview = mailstream::send::resolve::preview(&world.store, &world.config, &d).await.unwrap().unwrap();
    world.kick().await;
    let (store, sealed) = (world.store.clone(), Arc::new(Mutex::new(String::new())));
    let seen = sealed.clone();
    let peek = Failpoints::new(move |at| -> Hold {
        let (store, seen) = (store.clone(), seen.clone());
        Box::pin(async move {
            if at == Failpoint::Sealed {
                let mut conn = store.conn().await.unwrap();
                for key in store.scan("mailstream:*:batch:*").await.unwrap() {
                    let body: String = redis::cmd("HGET").arg(key).arg("body").query_async(&mut conn).await.unwrap();
                    *seen.lock().unwrap() = body;
                }
            }
        })
    });
    let daemon = Daemon::start(world.config.clone(), RunOptions { failpoints: peek, ..Default::default() });
    world.settled(SETTLE).await;
    daemon.stop().await;
    let body: Vec<serde_json::Value> = serde_json::from_str(&sealed.lock().unwrap()).unwrap();
    let tag = d.tag();
    let mine = body.iter().find(|e| e.to_string().contains(&tag)).expect("the subscriber's email was sealed");
    let preview: serde_json::Value = serde_json::from_str(&preview).unwrap();
    assert_eq!(&preview, mine);
    assert!(preview["headers"]["List-Unsubscribe"].is_string(), "{preview}");
}

async fn xlen(conn: &mut mailstream::store::Conn, stream: &str) -> u64 {
    redis::cmd("XLEN").arg(stream).query_async(conn).await.unwrap()
}
