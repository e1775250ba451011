//! The walking skeleton end to end, against a real Redis and the emulator over
//! loopback: dedup at enqueue, one holder per delivery, send-time checks,
//! batching and idempotency keys, per-email validation failures.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::*;
use mailstream::audience::kick;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::model::work::DeliveryRef;
use mailstream::send::seal::idempotency_key;
use mailstream::store::scripts::{self, Claim};
use mailstream::tools::emulator::EmulatorConfig;

const SETTLE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_kick_twice_enqueues_once() {
    let world = World::new().await;
    world.subscribers(300).await;
    let first = world.kick().await;
    assert_eq!((first.new, first.duplicates), (300, 0));
    let second = world.kick().await;
    assert_eq!((second.new, second.duplicates), (0, 300));
    assert_eq!(world.counts().await.enqueued, 300);
    let mut conn = world.store.conn().await.unwrap();
    let mut entries = 0;
    for p in 0..world.store.keys.partitions() {
        let n: u64 = redis::cmd("XLEN").arg(world.store.keys.stream(p)).query_async(&mut conn).await.unwrap();
        entries += n;
    }
    assert_eq!(entries, 300, "one stream entry per delivery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_kicks_enqueue_once() {
    let world = World::new().await;
    let subs = world.subscribers(500).await;
    // Two registry kicks and two list kicks (as two daemons or a retried cron would), all at once.
    let (a, b, c, d) = tokio::join!(
        world.kick(),
        world.kick(),
        kick::kick_list(&world.store, &world.config, CAMPAIGN, &PERIOD, &subs),
        kick::kick_list(&world.store, &world.config, CAMPAIGN, &PERIOD, &subs),
    );
    let (c, d) = (c.unwrap(), d.unwrap());
    assert_eq!(a.new + b.new + c.new + d.new, 500);
    // A registry kick that finds the other one running stands by (it does nothing).
    let ran = [&a, &b, &c, &d].iter().filter(|r| r.standby.is_none()).count() as u64;
    assert!(ran >= 3, "{a:?} {b:?}");
    assert_eq!(a.duplicates + b.duplicates + c.duplicates + d.duplicates, (ran - 1) * 500);
    assert_eq!(world.counts().await.enqueued, 500);
    // A different period is a different delivery.
    let next = kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(1)).await.unwrap();
    assert_eq!(next.new, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_and_eligibility_shape_the_fan_out() {
    let world = World::new().await;
    let mut subs: Vec<Subscriber> = (0..4).map(subscriber).collect();
    subs[0].targets = vec!["t1".into(), "t2".into(), "t3".into()];
    subs[1].entitled = false;
    subs[2].subscribed = false;
    subscribers::upsert(&world.store, &subs).await.unwrap();
    let report = world.kick().await;
    assert_eq!((report.new, report.not_eligible), (4, 2), "three targets plus one plain subscriber");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_2_deployment_is_refused_until_upgraded_and_then_fans_out_to_everyone() {
    let world = World::new().await;
    let mut subs: Vec<Subscriber> = (0..40).map(subscriber).collect();
    subs[0].targets = vec!["t1".into(), "t2".into()];
    subs[1].entitled = false;
    subs[2].subscribed = false;
    subs[3].time_zone = Some("Europe/Berlin".into());
    subscribers::upsert(&world.store, &subs).await.unwrap();
    let keys = &world.store.keys;
    let mut conn = world.store.conn().await.unwrap();
    // subs[4] turned the campaign off (one-click), as a layout-2 deployment recorded it.
    let p4 = keys.partition_of(&subs[4].id);
    let _: () = redis::cmd("HSET")
        .arg(keys.subscriber(p4, &subs[4].id))
        .arg(subscribers::field::opted_out(CAMPAIGN))
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // What layout 2 had: no audience, no opt-out sets, and a fan-out halfway.
    for p in 0..keys.partitions() {
        let _: () = redis::cmd("DEL").arg(keys.audience(p)).query_async(&mut conn).await.unwrap();
    }
    let fanout = keys.fanout(CAMPAIGN, &PERIOD);
    let _: () = redis::cmd("HSET")
        .arg(&fanout)
        .arg(&["state", "running", "owner", "gone", "lease_until", "0", "c0", "123", "c1", "done"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET").arg(keys.meta()).arg("layout").arg(2).query_async(&mut conn).await.unwrap();
    let refused = mailstream::store::Store::open(&world.config).await.err().expect("layout 2 is refused");
    assert!(refused.to_string().contains("mailstream upgrade"), "{refused}");
    let built = std::sync::atomic::AtomicU64::new(0);
    let upgraded = world
        .store
        .upgrade_layout(&world.config, async |store: &mailstream::store::Store| {
            built.store(subscribers::build_audience(store).await?, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(upgraded, Some(2));
    assert_eq!(built.into_inner(), 38, "all but the one not entitled and the one unsubscribed");
    mailstream::store::Store::open(&world.config).await.expect("upgraded");
    let cursors: Vec<String> =
        redis::cmd("HMGET").arg(&fanout).arg(&["c0", "c1"]).query_async(&mut conn).await.unwrap();
    assert_eq!(cursors, ["0", "0"], "the fan-out halfway starts again from the beginning");
    // Everyone is mailed: 37 subscribers, one with two targets; three left out.
    let report = kick::kick_registry(&world.store, &world.config, CAMPAIGN, &PERIOD).await.unwrap();
    assert_eq!((report.new, report.not_eligible), (38, 3), "{report:?}");
    // And nothing is left to upgrade.
    let again = world.store.upgrade_layout(&world.config, async |_: &mailstream::store::Store| Ok(())).await.unwrap();
    assert_eq!(again, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_3_deployment_is_refused_until_upgraded_and_its_suppressions_reach_every_partition() {
    // Layout 3 kept a suppression in its address's home partition only; the last gate
    // reads every partition's own `suppressed` hash. A new version refuses it until every
    // instance is stopped and it is upgraded.
    let world = World::with(Default::default(), |c| c.redis.partitions = 4).await;
    world.subscribers(5).await;
    let mut conn = world.store.conn().await.unwrap();
    let keys = &world.store.keys;
    let bounced = keys.address("bounced+old@resend.dev");
    let _: () = redis::cmd("HSET")
        .arg(keys.suppression(&bounced))
        .arg("reason")
        .arg("bounced")
        .arg("at_ms")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // A batch sealed by that version, waiting: it kept no address hashes for the last gate.
    let (batch, members) = sealed_batch(&world, 2, "a-layout-3-daemon", false).await;
    let sealed: String =
        redis::cmd("HGET").arg(keys.batch(0, &batch)).arg("addresses").query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("HDEL").arg(keys.batch(0, &batch)).arg("addresses").query_async(&mut conn).await.unwrap();
    let meta = keys.meta();
    let _: () = redis::cmd("HSET")
        .arg(&meta)
        .arg("layout")
        .arg(3)
        .arg("partitions")
        .arg(4)
        .query_async(&mut conn)
        .await
        .unwrap();
    // Upgraded with another partition count, it would miss partitions: refused.
    let mut other = world.config.clone();
    other.redis.partitions = 1;
    let elsewhere = mailstream::store::Store::connect(&other).await.unwrap();
    let refused =
        elsewhere.upgrade_layout(&other, async |_: &mailstream::store::Store| Ok(())).await.expect_err("refused");
    assert!(refused.to_string().contains("was created with 4"), "{refused}");
    let refused = mailstream::store::Store::open(&world.config).await.err().expect("layout 3 is refused");
    assert!(refused.to_string().contains("suppressed addresses"), "{refused}");
    assert!(refused.to_string().contains("mailstream upgrade"), "{refused}");
    let upgraded = world
        .store
        .upgrade_layout(&world.config, async |_: &mailstream::store::Store| {
            panic!("layout 3 has its audience index already")
        })
        .await
        .unwrap();
    assert_eq!(upgraded, Some(3));
    for p in 0..keys.partitions() {
        let reason: Option<String> =
            redis::cmd("HGET").arg(keys.suppressed(p)).arg(&bounced.hash).query_async(&mut conn).await.unwrap();
        assert_eq!(reason.as_deref(), Some("bounced"), "partition {p}");
    }
    let addressed: String =
        redis::cmd("HGET").arg(keys.batch(0, &batch)).arg("addresses").query_async(&mut conn).await.unwrap();
    assert_eq!((addressed, members.len()), (sealed, 2), "the waiting batch's addresses, read from its body");
    mailstream::store::Store::open(&world.config).await.expect("upgraded");
    // The kick fans out to everyone: the batch's two were enqueued by the old version.
    let report = kick::kick_registry(&world.store, &world.config, CAMPAIGN, &PERIOD).await.unwrap();
    assert!(report.duplicates == 2 && report.new >= 3, "{report:?}");
    // A newer layout than this version knows is refused, not upgraded.
    let _: () = redis::cmd("HSET").arg(&meta).arg("layout").arg(9).query_async(&mut conn).await.unwrap();
    assert!(mailstream::store::Store::open(&world.config).await.is_err());
    assert!(world.store.upgrade_layout(&world.config, async |_: &mailstream::store::Store| Ok(())).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_4_deployment_is_upgraded_only_once_its_shared_tail_requests_are_settled() {
    // Layout 4 could seal batches of several partitions into one request; this version
    // cannot send them. Upgrading waits until a layout-4 daemon has settled them.
    let world = World::new().await;
    let (batch, _members) = sealed_batch(&world, 2, "a-layout-4-daemon", false).await;
    let mut conn = world.store.conn().await.unwrap();
    let keys = &world.store.keys;
    let _: () =
        redis::cmd("HSET").arg(keys.batch(0, &batch)).arg("riders").arg("1:B2").query_async(&mut conn).await.unwrap();
    let meta = keys.meta();
    let _: () = redis::cmd("HSET").arg(&meta).arg("layout").arg(4).query_async(&mut conn).await.unwrap();
    let refused = mailstream::store::Store::open(&world.config).await.err().expect("layout 4 is refused");
    assert!(refused.to_string().contains("let a layout-4 mailstream settle"), "{refused}");
    let noop = async |_: &mailstream::store::Store| panic!("layout 4 has its audience index already");
    let waiting =
        world.store.upgrade_layout(&world.config, noop).await.expect_err("not while a shared request is unsettled");
    assert!(waiting.to_string().starts_with("1 batches of shared tail requests are unsettled"), "{waiting}");
    let layout: u32 = redis::cmd("HGET").arg(&meta).arg("layout").query_async(&mut conn).await.unwrap();
    assert_eq!(layout, 4, "nothing changed");
    // The layout-4 daemon settles it; then the upgrade goes through.
    let _: () = redis::cmd("DEL").arg(keys.batch(0, &batch)).query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("ZREM").arg(keys.batches(0)).arg(&batch).query_async(&mut conn).await.unwrap();
    let noop = async |_: &mailstream::store::Store| panic!("layout 4 has its audience index already");
    assert_eq!(world.store.upgrade_layout(&world.config, noop).await.unwrap(), Some(4));
    mailstream::store::Store::open(&world.config).await.expect("upgraded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claimers_racing_on_one_delivery_only_one_wins() {
    let world = World::new().await;
    let keys = &world.store.keys;
    let items: Vec<DeliveryRef> =
        (0..200).map(|i| DeliveryRef::new(CAMPAIGN, &PERIOD, "s", &format!("t{i}"))).collect();
    let mut conn = world.store.conn().await.unwrap();
    added(scripts::enqueue(&mut conn, keys, 0, &items, 3600, window(&world.config, &PERIOD)).await.unwrap());
    let ids: Vec<String> = items.iter().map(DeliveryRef::id).collect();
    let race = |owner: &'static str| {
        let store = world.store.clone();
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        async move {
            let mut conn = store.conn().await.unwrap();
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            scripts::claim(&mut conn, &store.keys, 0, &ids, owner, 60_000).await.unwrap()
        }
    };
    let (a, b) = tokio::join!(tokio::spawn(race("a")), tokio::spawn(race("b")));
    let (a, b) = (a.unwrap(), b.unwrap());
    for (x, y) in a.iter().zip(&b) {
        let won = [x, y].iter().filter(|c| matches!(c, Claim::Claimed { .. })).count();
        assert_eq!(won, 1, "exactly one claimer wins: {x:?} / {y:?}");
        let either = |c: &Claim| matches!(c, Claim::Claimed { .. } | Claim::Held);
        assert!(either(x) && either(y));
    }
    // The loser's view changes nothing: the record names one owner, claimed once.
    let record = delivery(&world.store, &ids[0]).await;
    assert_eq!(record["claims"], "1");
    assert!(record["lease_owner"] == "a" || record["lease_owner"] == "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_send_each_delivery_once() {
    let mut world = World::new().await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    world.subscribers(1500).await;
    world.kick().await;
    let (one, two) = (world.daemon(), world.daemon());
    let counts = world.settled(SETTLE).await;
    one.stop().await;
    two.stop().await;
    assert_eq!(counts.sent, 1500);
    let stats = emulator.stats();
    assert_eq!(stats.emails_accepted, 1500);
    assert_eq!(stats.duplicate_sends, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entitlement_revoked_between_kick_and_send_is_skipped() {
    let mut world = World::new().await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let mut subs = world.subscribers(10).await;
    world.kick().await;
    // Between the kick and the send: one plan cancelled, one unsubscribe, one account deleted.
    subs[0].entitled = false;
    subs[1].subscribed = false;
    subscribers::upsert(&world.store, &subs[..2]).await.unwrap();
    let mut conn = world.store.conn().await.unwrap();
    let p = world.store.keys.partition_of(&subs[2].id);
    let _: () =
        redis::cmd("DEL").arg(world.store.keys.subscriber(p, &subs[2].id)).query_async(&mut conn).await.unwrap();

    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped, counts.failed), (7, 3, 0));
    let sends = emulator.sends_matching(&PERIOD);
    for s in &subs[..3] {
        assert!(!sends.contains_key(&s.email), "{} must not be mailed", s.id);
    }
    let reasons: BTreeMap<String, String> = deliveries(&world.store)
        .await
        .into_iter()
        .filter(|(_, d)| d["state"] == "skipped")
        .map(|(d, record)| (d.subscriber, record["reason"].clone()))
        .collect();
    assert_eq!(reasons[&subs[0].id], "not_entitled");
    assert_eq!(reasons[&subs[1].id], "unsubscribed");
    assert_eq!(reasons[&subs[2].id], "unknown_subscriber");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fifty_emails_become_three_keyed_requests() {
    let mut world = World::with(Default::default(), |c| c.redis.partitions = 1).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(250).await;
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!(counts.sent, 250);

    let seen = emulator.seen();
    let mut sizes: Vec<usize> = seen.iter().map(|s| s.emails).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![50, 100, 100], "{seen:?}");
    assert!(seen.iter().all(|s| s.status == 200));
    // Each request carried its sealed batch's key (derived from the batch id, a ULID), and
    // no two batches share one.
    let sent_keys: HashSet<String> = seen.iter().map(|s| s.idempotency_key.clone().expect("keyed")).collect();
    assert_eq!(sent_keys.len(), 3);
    let derived = idempotency_key(&world.config.redis.prefix, "");
    assert!(sent_keys.iter().all(|k| k.strip_prefix(&derived).is_some_and(|id| id.len() == 26)), "{sent_keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_address_fails_only_its_own_delivery() {
    let mut world = World::with(Default::default(), |c| c.redis.partitions = 1).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let mut subs: Vec<Subscriber> = (0..20).map(subscriber).collect();
    subs[7].email = "someone@example.com".into(); // Resend refuses example.com with 422
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.failed), (19, 1));
    assert_eq!(emulator.seen().len(), 1, "one permissive batch request");
    let failed: Vec<_> = deliveries(&world.store).await.into_iter().filter(|(_, d)| d["state"] == "failed").collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0.subscriber, subs[7].id);
    assert_eq!(failed[0].1["error"], "validation_error");
    // Dead letter: the id and the error name, no address.
    let mut conn = world.store.conn().await.unwrap();
    let dead: redis::streams::StreamRangeReply =
        redis::cmd("XRANGE").arg(world.store.keys.dead(0)).arg("-").arg("+").query_async(&mut conn).await.unwrap();
    assert_eq!(dead.ids.len(), 1);
    let entry = &dead.ids[0];
    assert_eq!(entry.get::<String>("delivery"), Some(failed[0].0.id()));
    assert_eq!(entry.get::<String>("error").as_deref(), Some("validation_error"));
    assert!(!format!("{:?}", entry.map).contains('@'));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_sealed_bodies_do_not_outlive_their_work() {
    let mut world = World::new().await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(300).await;
    world.kick().await;
    let daemon = world.daemon();
    world.settled(SETTLE).await;
    let store = world.store.clone();
    // The reclaimer trims every stream below its oldest needed entry.
    let trimmed = eventually(Duration::from_secs(20), || {
        let store = store.clone();
        async move {
            let mut conn = store.conn().await.ok()?;
            let mut total = 0u64;
            for p in 0..store.keys.partitions() {
                let n: u64 = redis::cmd("XLEN").arg(store.keys.stream(p)).query_async(&mut conn).await.ok()?;
                total += n;
            }
            (total == 0).then_some(())
        }
    })
    .await;
    daemon.stop().await;
    assert!(trimmed.is_some(), "streams are trimmed once every entry is acknowledged");
    let mut conn = world.store.conn().await.unwrap();
    let batches: Vec<String> = redis::cmd("KEYS").arg("mailstream:*:batch:*").query_async(&mut conn).await.unwrap();
    assert!(batches.is_empty(), "sealed bodies are deleted once settled: {batches:?}");
    // A delivery settled sent keeps no record, only its entry in the period's settled
    // history (what the dedup reads), whose buckets expire after the retention.
    let (_, record) = &deliveries(&world.store).await[0];
    assert_eq!(record["state"], "sent");
    let records: Vec<String> = redis::cmd("KEYS").arg("mailstream:*:d:*").query_async(&mut conn).await.unwrap();
    assert!(records.is_empty(), "{records:?}");
    let buckets: Vec<String> = redis::cmd("KEYS").arg("mailstream:*:settled:*").query_async(&mut conn).await.unwrap();
    assert!(!buckets.is_empty());
    for bucket in buckets {
        let ttl: i64 = redis::cmd("TTL").arg(&bucket).query_async(&mut conn).await.unwrap();
        assert!(ttl > 0 && ttl <= (world.config.retention().as_secs() as i64), "{bucket}: {ttl}");
    }
}
