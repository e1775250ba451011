//! The kick window and the dedup's expiry on one clock: whenever a period was kicked
//! (early, as "the next period"; on time; late, as the previous one) and whenever it
//! settled, every trace its dedup reads — the counts hash, the settled history's buckets,
//! a failed or outcome_unknown record, the periods index — is kept until the period's kick
//! window ends, and a kick after that is refused. Read from the expiries the real scripts
//! set, for a weekly, a daily and a monthly campaign; then once with Redis's own clock
//! moved forward for real (a small `LD_PRELOAD` shim, compiled here with `cc`), the way an
//! operator would meet it: a period kicked early, kicked again weeks later.

mod common;

use std::time::Duration;

use common::*;
use mailstream::audience::kick::{self, PeriodRule};
use mailstream::audience::subscribers::Subscriber;
use mailstream::config::{CampaignConfig, Config};
use mailstream::model::period::PeriodKind;
use mailstream::model::work::DeliveryRef;
use mailstream::store::Store;
use mailstream::store::redis_server::RedisOptions;
use mailstream::tools::emulator::EmulatorConfig;

const SETTLE: Duration = Duration::from_secs(120);

/// The example campaign under another name, counted in periods of `kind`.
fn campaign_of(config: &Config, name: &str, kind: PeriodKind) -> CampaignConfig {
    CampaignConfig { name: name.into(), period: kind, ..config.campaigns[0].clone() }
}

async fn pexpiretime(conn: &mut mailstream::store::Conn, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME").arg(key).query_async(conn).await.unwrap()
}

/// The end of `campaign`'s `period`'s kick window, by the calendar (Redis-clock ms).
fn window_end(config: &Config, campaign: &CampaignConfig, period: &str) -> i64 {
    let w = kick::window_of(campaign, period, config.retention().as_secs()).unwrap();
    (w.start_ms + w.window_secs * 1000) as i64
}

/// The previous, current and next periods of `c` on Redis's clock.
async fn near_periods(store: &Store, c: &CampaignConfig) -> [String; 3] {
    let current = kick::period_for(store, c, None, PeriodRule::NearNow).await.unwrap();
    let previous = c.period.previous(&current, c.tz()).unwrap();
    let next = c.period.next(&current, c.tz()).unwrap();
    [previous, current, next]
}

/// A subscriber id of partition 0 (the partition `sealed_batch_of` seals in).
fn partition_0_id(store: &Store, prefix: &str) -> String {
    (0..).map(|i| format!("{prefix}{i}")).find(|id| store.keys.partition_of(id) == 0).unwrap()
}

/// Waits until every delivery of `campaign`'s `period` is settled.
async fn settled(store: &Store, campaign: &str, period: &str) -> mailstream::store::Counts {
    eventually(SETTLE, || async {
        let c = store.counts(campaign, period).await.ok()?;
        (c.enqueued > 0 && c.settled() >= c.enqueued).then_some(c)
    })
    .await
    .unwrap_or_else(|| panic!("{campaign} {period} not settled within {SETTLE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_trace_of_a_period_is_kept_until_its_kick_window_ends_however_early_it_was_kicked() {
    let mut world = World::with(Default::default(), |c| {
        // The late monthly kick is of the previous month, whose window (its start plus the
        // retention) the default 35 days closes from about the 5th: a retention longer than
        // two months keeps every kick of this test open whatever day it runs on.
        c.delivery.retention_days = 70;
        let campaigns = [
            campaign_of(c, "age_week", PeriodKind::Week),
            campaign_of(c, "age_day", PeriodKind::Day),
            campaign_of(c, "age_month", PeriodKind::Month),
        ];
        c.campaigns.extend(campaigns);
    })
    .await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let config = world.config.clone();
    let retention_ms = config.retention().as_millis() as i64;
    let mut subs: Vec<Subscriber> = (0..4).map(subscriber).collect();
    // Resend refuses an example.com recipient: that delivery is failed, its record kept.
    subs.push(Subscriber { id: "refused".into(), email: "someone@example.com".into(), ..subscriber(0) });
    mailstream::audience::subscribers::upsert(&world.store, &subs).await.unwrap();

    let campaigns: Vec<CampaignConfig> = config.campaigns[1..].to_vec();
    let mut pairs = Vec::new();
    for c in &campaigns {
        for period in near_periods(&world.store, c).await {
            pairs.push((c.clone(), period));
        }
    }
    // An outcome_unknown one too, of a weekly period kicked early: sealed, passed the last
    // gate by a holder that died, and its batch record lost, so nobody can tell whether it left.
    let (week, next_week) = (&pairs[0].0, pairs[2].1.clone());
    let lost = partition_0_id(&world.store, "lost-");
    let lost_delivery = DeliveryRef::new(&week.name, &next_week, &lost, "t");
    let lost_sub = Subscriber { id: lost.clone(), targets: vec!["t".into()], ..subscriber(9) };
    mailstream::audience::subscribers::upsert(&world.store, std::slice::from_ref(&lost_sub)).await.unwrap();
    let early = kick::window_of(week, &next_week, config.retention().as_secs()).unwrap();
    let items = [(lost_delivery.clone(), lost_sub.email.clone())];
    let (batch, _) = sealed_batch_of(&world, &items, early, "a-holder-that-died", true).await;
    let mut conn = world.store.conn().await.unwrap();
    let _: () = redis::cmd("DEL").arg(world.store.keys.batch(0, &batch)).query_async(&mut conn).await.unwrap();

    for (c, period) in &pairs {
        let report = kick::kick_registry(&world.store, &config, &c.name, period).await.unwrap();
        assert!(report.new >= 5, "{} {period}: {report:?}", c.name);
    }
    let daemon = world.daemon();
    for (c, period) in &pairs {
        let counts = settled(&world.store, &c.name, period).await;
        assert_eq!(counts.failed, 1, "{} {period}: {counts:?}", c.name);
    }
    daemon.stop().await;
    let lost_record = delivery(&world.store, &lost_delivery.id()).await;
    assert_eq!(lost_record.get("state").map(String::as_str), Some("outcome_unknown"), "{lost_record:?}");

    let keys = &world.store.keys;
    for (i, (c, period)) in pairs.iter().enumerate() {
        let what = format!("{} {period} ({})", c.name, ["late", "on time", "early"][i % 3]);
        let end = window_end(&config, c, period);
        let mut latest_settled = 0;
        for p in 0..keys.partitions() {
            let counts = keys.counts(p, &c.name, period);
            let (kick_until, buckets): (Option<i64>, Option<u32>) =
                redis::cmd("HMGET").arg(&counts).arg("kick_until").arg("buckets").query_async(&mut conn).await.unwrap();
            let Some(buckets) = buckets else { continue };
            assert_eq!(kick_until, Some(end), "{what}: the counts hash records where its kick window ends");
            let counts_expiry = pexpiretime(&mut conn, &counts).await;
            assert!(counts_expiry >= end, "{what}: counts hash expires at {counts_expiry}, before {end}");
            for n in 0..buckets {
                let bucket = keys.settled(p, &c.name, period, mailstream::model::work::Channel::Email, n);
                let entries: Vec<String> = redis::cmd("HVALS").arg(&bucket).query_async(&mut conn).await.unwrap();
                let Some(last) = entries
                    .iter()
                    .map(|e| mailstream::store::history::HistoryEntry::parse(e).expect("an entry").settled_ms)
                    .max()
                else {
                    continue;
                };
                latest_settled = latest_settled.max(last);
                // Kept the retention after its last settlement, and never before the window's end.
                let expiry = pexpiretime(&mut conn, &bucket).await;
                assert_eq!(expiry, (last + retention_ms).max(end), "{what}: {bucket}");
                assert!(counts_expiry >= expiry, "{what}: the counts hash goes before its bucket");
            }
            let listed: Option<f64> = redis::cmd("ZSCORE")
                .arg(keys.periods(p))
                .arg(format!("{}:{period}", c.name))
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(listed.is_some_and(|s| s as i64 >= end), "{what}: periods index entry {listed:?}");
            assert!(pexpiretime(&mut conn, &keys.periods(p)).await >= end, "{what}: periods index");
        }
        assert!(latest_settled > 0, "{what}: something settled compactly");
        if i % 3 == 2 {
            // Early: settled before the period started, so the retention from settlement
            // alone would end before the kick window does (what layout 7 did).
            assert!(latest_settled + retention_ms < end, "{what}: the case the rule is for");
        }
        // The failed delivery's record.
        let refused = DeliveryRef::new(&c.name, period, "refused", &subs[4].targets_or_default()[0]);
        let record = delivery(&world.store, &refused.id()).await;
        assert_eq!(record.get("state").map(String::as_str), Some("failed"), "{what}: {record:?}");
        let settled_ms: i64 = record["settled_ms"].parse().unwrap();
        let key = keys.delivery(keys.partition_of("refused"), &refused.id());
        assert_eq!(pexpiretime(&mut conn, &key).await, (settled_ms + retention_ms).max(end), "{what}: failed record");
    }
    let settled_ms: i64 = lost_record["settled_ms"].parse().unwrap();
    let end = window_end(&config, week, &next_week);
    assert!(settled_ms + retention_ms < end);
    let key = keys.delivery(0, &lost_delivery.id());
    assert_eq!(pexpiretime(&mut conn, &key).await, end, "the outcome_unknown record of an early kick");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_key_is_deduplicated_for_the_retention_from_its_first_acceptance() {
    let mut world = World::new().await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let item =
        serde_json::json!({"idempotency_key": "order-42", "to": "delivered@resend.dev", "subject": "s", "text": "t"});
    let first = mailstream::audience::ingest::enqueue(&world.store, &world.config, vec![item.clone()]).await.unwrap();
    let mailstream::audience::ingest::ItemResult::Accepted { delivery: id, .. } = first[0].clone() else {
        panic!("accepted: {first:?}")
    };
    let d = DeliveryRef::parse(&id).unwrap();
    let p = world.store.keys.partition_of(d.home());
    let guard = world.store.keys.idempotency(p, "order-42");
    let mut conn = world.store.conn().await.unwrap();
    let enqueued_ms: i64 = redis::cmd("HGET")
        .arg(world.store.keys.delivery(p, &id))
        .arg("enqueued_ms")
        .query_async(&mut conn)
        .await
        .unwrap();
    let retention_ms = world.config.retention().as_millis() as i64;
    assert_eq!(pexpiretime(&mut conn, &guard).await, enqueued_ms + retention_ms);
    // Sent (its record gone for a compact entry), then replayed: still a duplicate, and the
    // guard's expiry is where its first acceptance put it.
    let daemon = world.daemon();
    let sent = eventually(SETTLE, || async {
        let kept = delivery(&world.store, &id).await;
        (kept.get("state").map(String::as_str) == Some("sent")).then_some(())
    })
    .await;
    daemon.stop().await;
    assert!(sent.is_some(), "the receipt is sent");
    let again = mailstream::audience::ingest::enqueue(&world.store, &world.config, vec![item]).await.unwrap();
    assert!(
        matches!(&again[0], mailstream::audience::ingest::ItemResult::Duplicate { delivery, .. } if *delivery == id),
        "{again:?}"
    );
    assert_eq!(pexpiretime(&mut conn, &guard).await, enqueued_ms + retention_ms);
}

/// A shared object that moves the realtime clocks of the process it is preloaded into by
/// `MAILSTREAM_CLOCK_SHIFT_SECONDS` (Debian's libfaketime 0.9.10 cannot start redis-server
/// 7.0: "recursive calls to clock_gettime"). It calls the kernel directly, never the
/// functions it replaces, so there is nothing to recurse into.
const CLOCK_SHIFT_C: &str = r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <unistd.h>

static long shift(void) {
    static long seconds = -1;
    if (seconds == -1) {
        const char *v = getenv("MAILSTREAM_CLOCK_SHIFT_SECONDS");
        seconds = v ? atol(v) : 0;
    }
    return seconds;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += shift();
    return (int) r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    long r = syscall(SYS_gettimeofday, tv, tz);
    if (r == 0 && tv) tv->tv_sec += shift();
    return (int) r;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// Compiles [`CLOCK_SHIFT_C`] into a scratch folder; the path of the shared object.
fn clock_shift_library() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mailstream-clock-shift-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (source, library) = (dir.join("clock_shift.c"), dir.join("libclockshift.so"));
    std::fs::write(&source, CLOCK_SHIFT_C).unwrap();
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .output()
        .expect("cc (Debian: apt-get install gcc) compiles the clock shim");
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    library
}

/// Restarts the world's Redis on its append-only file with its clock `seconds` ahead.
async fn shift_redis_clock(world: &mut World, library: &std::path::Path, seconds: i64) {
    let Servers::Single(server) = &mut world.redis else { panic!("one server") };
    let seconds = seconds.to_string();
    let env = [("LD_PRELOAD", library.to_str().unwrap()), ("MAILSTREAM_CLOCK_SHIFT_SECONDS", seconds.as_str())];
    server.restart_with_env(&env).await.unwrap();
    // A fresh store: the pooled connections were to the server that was killed.
    world.store = Store::connect(&world.config).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_period_kicked_early_is_not_mailed_again_when_redis_s_clock_moves_on() {
    let library = clock_shift_library();
    let mut world = World::with(RedisOptions { appendonly: true, ..Default::default() }, |c| {
        let monthly = campaign_of(c, "monthly_news", PeriodKind::Month);
        c.campaigns.push(monthly);
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let config = world.config.clone();
    world.subscribers(20).await;
    let (weekly, monthly) =
        (config.campaign(CAMPAIGN).unwrap().clone(), config.campaign("monthly_news").unwrap().clone());
    let now = world.store.time().await.unwrap();
    // The monthly campaign's next period, kicked with no flag (the next period is allowed);
    // the weekly one's period two weeks ahead, with --allow-any-period. (Within an hour of
    // the month's end the month after next, with the flag: the test needs the period to
    // start some time after its settlement.)
    let [_, _, mut month] = near_periods(&world.store, &monthly).await;
    let mut month_rule = PeriodRule::NearNow;
    let starts = |c: &CampaignConfig, p: &str| c.period.start(p, c.tz()).unwrap();
    if starts(&monthly, &month) - now < chrono::Duration::hours(1) {
        month = monthly.period.next(&month, monthly.tz()).unwrap();
        month_rule = PeriodRule::AnyWithinRetention;
    }
    let [_, _, next_week] = near_periods(&world.store, &weekly).await;
    let week = weekly.period.next(&next_week, weekly.tz()).unwrap();
    let kicks = [(&monthly, month.clone(), month_rule), (&weekly, week.clone(), PeriodRule::AnyWithinRetention)];
    let kick = |world: &World, (c, period, rule): &(&CampaignConfig, String, PeriodRule)| {
        let (store, config, c, period, rule) =
            (world.store.clone(), world.config.clone(), (*c).clone(), period.clone(), *rule);
        async move {
            let period = kick::period_for(&store, &c, Some(&period), rule).await?;
            kick::kick_registry(&store, &config, &c.name, &period).await
        }
    };
    for k in &kicks {
        assert_eq!(kick(&world, k).await.unwrap().new, 20, "{} {}", k.0.name, k.1);
    }
    let daemon = world.daemon();
    for (c, period, _) in &kicks {
        assert_eq!(settled(&world.store, &c.name, period).await.sent, 20);
    }
    daemon.stop().await;
    assert_eq!(emulator.stats().emails_accepted, 40);

    // Redis's clock moves on: past the retention after the settlements, before the end of
    // both kick windows (where layout 7 had let everything of both periods expire).
    let settled_at = world.store.time().await.unwrap();
    let retention = chrono::Duration::from_std(config.retention()).unwrap();
    let earliest_start = starts(&monthly, &month).min(starts(&weekly, &week));
    let ahead = retention + (earliest_start - settled_at) / 2;
    shift_redis_clock(&mut world, &library, ahead.num_seconds()).await;
    let moved = world.store.time().await.unwrap();
    assert!(moved > settled_at + retention && moved < earliest_start + retention, "{moved}");
    for k in &kicks {
        let again = kick(&world, k).await.unwrap();
        assert_eq!((again.new, again.duplicates), (0, 20), "{} {}: {again:?}", k.0.name, k.1);
    }
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (40, 0), "nothing sent twice");

    // And once both windows have ended, a kick of either is refused and writes nothing.
    let latest_end = (starts(&monthly, &month).max(starts(&weekly, &week)) + retention) - moved;
    shift_redis_clock(&mut world, &library, (ahead + latest_end + chrono::Duration::days(1)).num_seconds()).await;
    let before: u64 = redis::cmd("DBSIZE").query_async(&mut world.store.conn().await.unwrap()).await.unwrap();
    for k in &kicks {
        let refused = kick(&world, k).await.expect_err("the window has ended");
        assert!(refused.downcast_ref::<kick::PeriodClosed>().is_some(), "{refused:#}");
    }
    let after: u64 = redis::cmd("DBSIZE").query_async(&mut world.store.conn().await.unwrap()).await.unwrap();
    assert_eq!(before, after, "a refused kick writes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_from_layout_7_keeps_every_live_trace_until_its_kick_window_ends() {
    let mut world = World::new().await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let config = world.config.clone();
    let retention_ms = config.retention().as_millis() as i64;
    world.subscribers(6).await;
    let refused = Subscriber { id: "refused".into(), email: "someone@example.com".into(), ..subscriber(0) };
    mailstream::audience::subscribers::upsert(&world.store, std::slice::from_ref(&refused)).await.unwrap();
    let c = config.campaign(CAMPAIGN).unwrap().clone();
    let [_, _, next] = near_periods(&world.store, &c).await;
    kick::kick_registry(&world.store, &config, CAMPAIGN, &next).await.unwrap();
    let daemon = world.daemon();
    settled(&world.store, CAMPAIGN, &next).await;
    daemon.stop().await;

    // What layout 7 left: no `kick_until`, each trace expiring the retention after its last
    // write, the index scored by the last enqueue.
    let keys = world.store.keys.clone();
    let mut conn = world.store.conn().await.unwrap();
    let member = format!("{CAMPAIGN}:{next}");
    let now: i64 = world.store.time().await.unwrap().timestamp_millis();
    let mut traces = Vec::new();
    for p in 0..keys.partitions() {
        let counts = keys.counts(p, CAMPAIGN, &next);
        let buckets: Option<u32> = redis::cmd("HGET").arg(&counts).arg("buckets").query_async(&mut conn).await.unwrap();
        let Some(buckets) = buckets else { continue };
        traces.push(counts.clone());
        traces
            .extend((0..buckets).map(|n| keys.settled(p, CAMPAIGN, &next, mailstream::model::work::Channel::Email, n)));
        let _: () = redis::cmd("HDEL").arg(&counts).arg("kick_until").query_async(&mut conn).await.unwrap();
        let _: () = redis::cmd("ZADD").arg(keys.periods(p)).arg(now).arg(&member).query_async(&mut conn).await.unwrap();
    }
    let refused_key = keys.delivery(
        keys.partition_of("refused"),
        &DeliveryRef::new(CAMPAIGN, &next, "refused", &refused.targets_or_default()[0]).id(),
    );
    traces.push(refused_key.clone());
    for key in &traces {
        let _: i64 = redis::cmd("PEXPIREAT").arg(key).arg(now + retention_ms).query_async(&mut conn).await.unwrap();
    }
    let _: () = redis::cmd("HSET").arg(keys.meta()).arg("layout").arg(7).query_async(&mut conn).await.unwrap();
    let refused_start = Store::open(&config).await.err().expect("layout 7 is refused");
    assert!(
        refused_start.to_string().contains("key layout 7") && refused_start.to_string().contains("mailstream upgrade")
    );

    let noop = async |_: &Store| Ok(());
    assert_eq!(world.store.upgrade_layout(&config, noop).await.unwrap(), Some(7));
    let end = window_end(&config, &c, &next);
    assert!(now + retention_ms < end, "an early kick: layout 7's expiry ends before the window");
    let mut expiries = Vec::new();
    for key in &traces {
        let expiry = pexpiretime(&mut conn, key).await;
        assert!(expiry >= end, "{key} expires at {expiry}, before {end}");
        expiries.push(expiry);
    }
    for p in 0..keys.partitions() {
        let kick_until: Option<i64> = redis::cmd("HGET")
            .arg(keys.counts(p, CAMPAIGN, &next))
            .arg("kick_until")
            .query_async(&mut conn)
            .await
            .unwrap();
        let score: Option<f64> =
            redis::cmd("ZSCORE").arg(keys.periods(p)).arg(&member).query_async(&mut conn).await.unwrap();
        if kick_until.is_some() {
            assert_eq!(kick_until, Some(end));
            assert!(score.is_some_and(|s| s as i64 >= end), "{score:?}");
        }
    }
    Store::open(&config).await.expect("upgraded");
    // Run again (an upgrade stopped halfway is simply run again): nothing shortens.
    let _: () = redis::cmd("HSET").arg(keys.meta()).arg("layout").arg(7).query_async(&mut conn).await.unwrap();
    assert_eq!(world.store.upgrade_layout(&config, noop).await.unwrap(), Some(7));
    for (key, expiry) in traces.iter().zip(&expiries) {
        assert_eq!(pexpiretime(&mut conn, key).await, *expiry, "{key}");
    }
    assert_eq!(world.store.upgrade_layout(&config, noop).await.unwrap(), None);
    // And the period is deduplicated as before: a kick finds everyone.
    let again = kick::kick_registry(&world.store, &config, CAMPAIGN, &next).await.unwrap();
    assert_eq!((again.new, again.duplicates), (0, 7), "{again:?}");
}
