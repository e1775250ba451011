//! Shared tail requests (join.lua): when no partition has a full batch, the partial
//! batches of several partitions go out as one request, each sealed in its own hash
//! slot. A crash at each step of one, a lost lead, a member who leaves before the gate
//! and a request that times out: every delivery is sent once or accounted for, against
//! a real Redis and the emulator. An instance is driven by hand up to the step under
//! test (so the request's make-up is known), then a daemon recovers.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use mailstream::Failpoints;
use mailstream::batcher::Batcher;
use mailstream::config::Config;
use mailstream::consumer::Consumer;
use mailstream::ctx::Ctx;
use mailstream::db::scripts::{self, Gate, GateRequest};
use mailstream::db::streams::entry_of;
use mailstream::emulator::{Emulator, EmulatorConfig, Faults};
use mailstream::outcome::Failpoint;
use mailstream::redis_server::RedisOptions;
use mailstream::sender::{self, Sender};
use mailstream::shutdown::{self, Trigger};
use mailstream::subscribers::{self, Subscriber};
use mailstream::work::{Lane, Sealed, Work};
use redis::streams::StreamReadReply;
use tokio::sync::Notify;

const SETTLE: Duration = Duration::from_secs(90);
const PARTITIONS: u16 = 4;
/// Subscribers per partition: four partial batches, 80 emails, one request's worth.
const EACH: usize = 20;

/// A world of four partitions with `EACH` subscribers in each, kicked.
async fn world(faults: Faults) -> (World, Emulator, Trigger, Vec<Subscriber>) {
    let mut world = World::with(RedisOptions::default(), |c| {
        c.redis.partitions = PARTITIONS;
        c.resend.timeout_seconds = 1;
        c.delivery.lease_seconds = 6;
    })
    .await;
    let (emulator, stop) =
        world.emulator(EmulatorConfig { requests_per_second: None, faults, ..Default::default() }).await;
    let mut per: BTreeMap<u16, usize> = BTreeMap::new();
    let subs: Vec<Subscriber> = (0..)
        .map(subscriber)
        .filter(|s| {
            let n = per.entry(world.store.keys.partition_of(&s.id)).or_default();
            *n += 1;
            *n <= EACH
        })
        .take(EACH * usize::from(PARTITIONS))
        .collect();
    subscribers::upsert(&world.store, &subs).await.unwrap();
    world.kick().await;
    (world, emulator, stop, subs)
}

/// An instance driven by hand: its readers' and dispatcher's steps, one at a time.
struct Instance {
    ctx: Arc<Ctx>,
    consumer: Consumer,
    batcher: Arc<Batcher>,
    sender: Sender,
    _stop: Trigger,
}

impl Instance {
    fn new(config: &Config, world: &World, failpoints: Failpoints) -> Instance {
        let (stop, down) = shutdown::channel();
        let metrics = Arc::new(mailstream::metrics::Metrics::new());
        let ctx = Arc::new(Ctx::new(config.clone(), world.store.clone(), "by-hand".into(), metrics, failpoints, &down));
        let batcher = Arc::new(Batcher::from_config(config));
        let consumer = Consumer::new(ctx.clone(), config.renderer().unwrap(), batcher.clone()).unwrap();
        let sender = Sender::from_config(config, Some(7)).unwrap();
        Instance { ctx, consumer, batcher, sender, _stop: stop }
    }

    /// Reads, claims and renders every digest entry of every partition into the queues.
    async fn read_all(&self) {
        let keys = &self.ctx.store.keys;
        self.ctx.store.ensure_groups(&self.ctx.config.redis.group).await.unwrap();
        let mut conn = self.ctx.store.conn().await.unwrap();
        for p in 0..PARTITIONS {
            let reply: StreamReadReply = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&self.ctx.config.redis.group)
                .arg(&self.ctx.consumer)
                .arg("COUNT")
                .arg(1000)
                .arg("STREAMS")
                .arg(keys.lane_stream(p, Lane::Digest))
                .arg(">")
                .query_async(&mut conn)
                .await
                .unwrap();
            let entries = reply.keys.into_iter().flat_map(|k| k.ids).map(entry_of).collect();
            let ready = self.consumer.process_entries(p, Lane::Digest, &mut conn, entries).await.unwrap();
            assert_eq!(ready.len(), EACH, "partition {p}");
            self.batcher.push(p, Lane::Digest, ready).await.unwrap();
        }
    }

    /// The next request's work: the four partial batches, shared.
    fn take_shared(&self) -> Vec<(u16, Vec<mailstream::work::Ready>)> {
        match self.batcher.take() {
            Some(Work::Shared(parts)) => parts,
            other => panic!("expected a shared request, got {other:?}"),
        }
    }

    /// Reads everything and seals it as one shared request.
    async fn sealed(&self) -> Sealed {
        self.read_all().await;
        let parts = self.take_shared();
        assert_eq!(parts.len(), usize::from(PARTITIONS));
        sender::seal(&self.ctx, parts).await.expect("sealed")
    }
}

/// Starts a daemon (another owner) and waits until every delivery is settled.
async fn recover(world: &World) -> mailstream::db::Counts {
    let daemon = world.daemon();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    counts
}

/// Every recipient got exactly one real send.
fn each_sent_once(emulator: &Emulator, subs: &[Subscriber]) {
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (subs.len() as u64, 0), "{stats:?}");
    let sends = emulator.sends_matching(PERIOD);
    assert_eq!(sends.len(), subs.len());
    assert!(sends.values().all(|&n| n == 1));
    assert_eq!(stats.idempotency_mismatches, 0, "a key was never reused with another body");
}

/// A batch record's fields.
async fn record(world: &World, p: u16, id: &str) -> HashMap<String, String> {
    let mut conn = world.store.conn().await.unwrap();
    redis::cmd("HGETALL").arg(world.store.keys.batch(p, id)).query_async(&mut conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_partial_batches_go_out_as_one_request_and_settle_in_their_own_slots() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    let riders = sealed.riders.clone().unwrap();
    assert_eq!(riders.len(), 3);
    // Each part is a batch of its own partition; the lead names its riders, each rider its lead.
    let lead = record(&world, sealed.partition, &sealed.id).await;
    let planned: Vec<String> = riders.iter().map(|r| format!("{}:{}", r.partition, r.id)).collect();
    assert_eq!(lead["riders"], planned.join(" "));
    for r in &riders {
        assert_eq!(record(&world, r.partition, &r.id).await["lead"], sealed.lead_ref());
    }
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    let committed = record(&world, sealed.partition, &sealed.id).await;
    assert_eq!(committed["joint_key"], sealed.key, "the gate committed the request it returned");
    assert_eq!(committed["joint_body"].as_bytes(), &sealed.body[..]);
    me.sender.attempt(&me.ctx, sealed.clone()).await;

    let seen = emulator.seen();
    assert_eq!(seen.len(), 1, "one request, not four: {seen:?}");
    assert_eq!((seen[0].emails, seen[0].idempotency_key.as_deref()), (80, Some(sealed.key.as_str())));
    each_sent_once(&emulator, &subs);
    let counts = world.counts().await;
    assert_eq!((counts.sent, counts.settled()), (80, 80));
    // Settled where they live: each delivery names its own partition's batch, and no
    // batch record is left.
    let batches: std::collections::HashSet<(u16, String)> = deliveries(&world.store)
        .await
        .into_iter()
        .map(|(d, fields)| (world.store.keys.partition_of(d.home()), fields["batch"].clone()))
        .collect();
    let mut expected: std::collections::HashSet<(u16, String)> =
        riders.iter().map(|r| (r.partition, r.id.clone())).collect();
    expected.insert((sealed.partition, sealed.id.clone()));
    assert_eq!(batches, expected);
    for (p, id) in &expected {
        assert!(record(&world, *p, id).await.is_empty(), "batch {id} settled and gone");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_riders_are_sealed_and_before_their_lead_loses_and_repeats_nothing() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let reached = Arc::new(Notify::new());
    let me = Arc::new(Instance::new(&world.config, &world, freeze_at(Failpoint::Riding, reached.clone(), None)));
    me.read_all().await;
    let parts = me.take_shared();
    let sealing = {
        let me = me.clone();
        tokio::spawn(async move { sender::seal(&me.ctx, parts).await })
    };
    tokio::time::timeout(Duration::from_secs(30), reached.notified()).await.expect("the riders are sealed");
    sealing.abort();
    let _ = sealing.await;

    let counts = recover(&world).await;
    assert_eq!((counts.sent, counts.outcome_unknown), (80, 0));
    each_sent_once(&emulator, &subs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_gate_dissolves_the_request_and_sends_each_batch_once() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let sealed = me.sealed().await;
    drop(me);
    // Its lead was never committed: the taker dissolves it, and each batch goes alone.
    let counts = recover(&world).await;
    assert_eq!((counts.sent, counts.outcome_unknown), (80, 0));
    each_sent_once(&emulator, &subs);
    let seen = emulator.seen();
    assert_eq!(seen.len(), 4, "four batches of their own: {seen:?}");
    assert!(seen.iter().all(|s| s.emails == EACH && s.status == 200), "{seen:?}");
    assert!(seen.iter().any(|s| s.idempotency_key.as_deref() == Some(sealed.key.as_str())), "the lead's own key");
    assert_eq!(emulator.stats().replays, 0, "nothing had left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_commit_resends_the_whole_request_under_its_key() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    drop(me);
    // Committed (it may have left): the taker adopts the riders and resends it whole.
    let counts = recover(&world).await;
    assert_eq!((counts.sent, counts.outcome_unknown), (80, 0));
    each_sent_once(&emulator, &subs);
    let seen = emulator.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((seen[0].emails, seen[0].idempotency_key.as_deref()), (80, Some(sealed.key.as_str())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_answer_and_its_record_replays_and_records_every_part() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let reached = Arc::new(Notify::new());
    let me = Arc::new(Instance::new(&world.config, &world, freeze_at(Failpoint::Answered, reached.clone(), None)));
    let mut sealed = me.sealed().await;
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    let sending = {
        let me = me.clone();
        tokio::spawn(async move { me.sender.attempt(&me.ctx, sealed).await })
    };
    tokio::time::timeout(Duration::from_secs(30), reached.notified()).await.expect("answered");
    sending.abort();
    let _ = sending.await;

    let counts = recover(&world).await;
    assert_eq!((counts.sent, counts.outcome_unknown), (80, 0));
    each_sent_once(&emulator, &subs);
    assert!(emulator.stats().replays >= 1, "the taker's resend was answered from the idempotency store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rider_member_who_unsubscribes_before_the_gate_is_left_out_of_the_request() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    let email = unsubscribe(&world, &subs, &sealed.riders.as_ref().unwrap()[1].members[3].subscriber).await;

    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    assert_eq!(sealed.emails(), 79);
    me.sender.attempt(&me.ctx, sealed).await;
    let seen = emulator.seen();
    assert_eq!((seen.len(), seen[0].emails), (1, 79));
    let counts = world.counts().await;
    assert_eq!((counts.sent, counts.skipped), (79, 1));
    assert!(!emulator.sends_matching(PERIOD).contains_key(&email), "no mail after unsubscribing");
}

/// `subscriber`, unsubscribed.
async fn unsubscribe(world: &World, subs: &[Subscriber], subscriber: &str) -> String {
    let mut leaving = subs.iter().find(|s| s.id == subscriber).unwrap().clone();
    leaving.subscribed = false;
    subscribers::upsert(&world.store, std::slice::from_ref(&leaving)).await.unwrap();
    leaving.email
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_who_leaves_after_the_commit_is_never_mailed_whatever_crash_follows() {
    // Committed, then looked at again before leaving (the slot moved): the holder uncommits
    // first, so a crash right after a rider drops the member leaves no request behind that
    // still holds them; the taker dissolves it and each batch goes alone.
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    let rider = sealed.riders.as_ref().unwrap()[0].clone();
    let email = unsubscribe(&world, &subs, &rider.members[2].subscriber).await;
    let (keys, owner) = (&world.store.keys, me.ctx.owner.as_str());
    let mut conn = world.store.conn().await.unwrap();
    assert!(scripts::uncommit(&mut conn, keys, sealed.partition, &sealed.id, owner).await.unwrap());
    let limits = gate_limits(6_000);
    let request =
        GateRequest { partition: rider.partition, batch: &rider.id, owner, new_key: "k2", limits, riders: None };
    let gate = scripts::gate(&mut conn, keys, &request, &rider.members).await.unwrap();
    assert!(matches!(gate, Gate::Resealed { .. }), "{gate:?}");
    drop(me); // the lead's gate never ran again

    let counts = recover(&world).await;
    assert_eq!((counts.sent, counts.skipped, counts.outcome_unknown), (79, 1, 0));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends, stats.idempotency_mismatches), (79, 0, 0));
    assert!(!emulator.sends_matching(PERIOD).contains_key(&email), "no mail after unsubscribing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_who_leaves_after_the_commit_is_left_out_when_the_gate_looks_again() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    let first = sealed.key.clone();
    let email = unsubscribe(&world, &subs, &sealed.riders.as_ref().unwrap()[1].members[0].subscriber).await;
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await, "the slot moved: the gate looks again");
    assert_eq!(sealed.emails(), 79);
    assert_ne!(sealed.key, first, "a request that changed gets a new key (the first never left)");
    drop(me); // and the holder dies before sending: its taker resends the second commit whole
    let counts = recover(&world).await;
    assert_eq!((counts.sent, counts.skipped, counts.outcome_unknown), (79, 1, 0));
    let seen = emulator.seen();
    assert_eq!((seen.len(), seen[0].emails, seen[0].idempotency_key.as_deref()), (1, 79, Some(sealed.key.as_str())));
    assert!(!emulator.sends_matching(PERIOD).contains_key(&email));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_request_put_back_unsent_is_dissolved_into_batches_of_their_own() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    // Its slot moved far away (a long retry-after): put back, known unsent.
    sender::put_back(&me.ctx, sealed.partition, &sealed.id, Duration::ZERO).await;
    drop(me);
    let counts = recover(&world).await;
    assert_eq!((counts.sent, counts.outcome_unknown), (80, 0));
    each_sent_once(&emulator, &subs);
    let seen = emulator.seen();
    assert!(seen.len() == 4 && seen.iter().all(|s| s.emails == EACH), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_rider_leaves_at_its_gate_the_lead_goes_alone() {
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    let own_key = sealed.key.clone();
    for r in sealed.riders.clone().unwrap() {
        for m in &r.members {
            unsubscribe(&world, &subs, &m.subscriber).await;
        }
    }
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    assert!(sealed.riders.is_none(), "no riders left: a batch of its own");
    assert_eq!((sealed.emails(), sealed.key.as_str()), (EACH, own_key.as_str()));
    let fields = record(&world, sealed.partition, &sealed.id).await;
    assert!(!fields.contains_key("riders") && !fields.contains_key("joint_key"), "{fields:?}");
    me.sender.attempt(&me.ctx, sealed).await;
    let counts = world.counts().await;
    assert_eq!((counts.sent, counts.skipped), (20, 60));
    assert_eq!(emulator.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_rider_leaves_as_the_gate_looks_again_the_lead_goes_alone_with_its_own_key() {
    // Committed, then the slot moved and every rider's members unsubscribed: the request in
    // hand is the old commit's; what leaves is the lead's own batch under its own key.
    let (world, emulator, _stop, subs) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    let own_key = sealed.key.clone();
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    assert_ne!(sealed.key, own_key, "committed: the shared request's key");
    for r in sealed.riders.clone().unwrap() {
        for m in &r.members {
            unsubscribe(&world, &subs, &m.subscriber).await;
        }
    }
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    assert!(sealed.riders.is_none());
    assert_eq!((sealed.emails(), sealed.key.as_str()), (EACH, own_key.as_str()));
    me.sender.attempt(&me.ctx, sealed).await;
    let seen = emulator.seen();
    assert_eq!((seen.len(), seen[0].emails, seen[0].status), (1, EACH, 200), "{seen:?}");
    let counts = world.counts().await;
    assert_eq!((counts.sent, counts.skipped, counts.outcome_unknown), (20, 60, 0));
    assert_eq!(emulator.stats().emails_accepted, 20, "no unsubscribed member was mailed");
}

/// Seals a shared request (and passes its gate if `gated`), loses its lead's record (a
/// write Redis acknowledged and then lost), and lets a daemon recover.
async fn lose_the_lead(gated: bool) -> (mailstream::db::Counts, mailstream::emulator::Stats) {
    let (world, emulator, _stop, _) = world(Faults::default()).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    if gated {
        assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    }
    drop(me);
    let mut conn = world.store.conn().await.unwrap();
    let lead = world.store.keys.batch(sealed.partition, &sealed.id);
    let _: () = redis::cmd("DEL").arg(lead).query_async(&mut conn).await.unwrap();
    (recover(&world).await, emulator.stats())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn riders_of_a_lost_lead_that_never_passed_their_gate_go_alone() {
    // They cannot have been in a request; the lead's own deliveries, whose batch is gone,
    // are outcome_unknown (as for any lost batch).
    let (counts, stats) = lose_the_lead(false).await;
    assert_eq!((counts.sent, counts.outcome_unknown), (60, 20));
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (60, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn riders_of_a_lost_lead_that_passed_their_gate_are_never_sent_again() {
    // The lost lead may have carried them: outcome_unknown, and nothing silently dropped.
    let (counts, stats) = lose_the_lead(true).await;
    assert_eq!((counts.sent, counts.outcome_unknown), (0, 80));
    assert_eq!(stats.requests, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_request_that_times_out_is_resent_whole_with_its_key() {
    // Every first request is processed, then answered after 2.5 s: past the 1 s timeout.
    let faults = Faults { hang: 1.0, hang_ms: 2500, ..Default::default() };
    let (world, emulator, _stop, subs) = world(faults).await;
    let me = Instance::new(&world.config, &world, Failpoints::default());
    let mut sealed = me.sealed().await;
    assert!(sender::pass_gate(&me.ctx, &mut sealed).await);
    let key = sealed.key.clone();
    me.sender.attempt(&me.ctx, sealed).await;
    drop(me);
    // Maybe sent: rescheduled whole; a daemon takes it over and resends the same bytes.
    let counts = recover(&world).await;
    assert_eq!((counts.sent, counts.outcome_unknown), (80, 0));
    each_sent_once(&emulator, &subs);
    let seen = emulator.seen();
    assert!(
        seen.len() >= 2 && seen.iter().all(|s| s.idempotency_key.as_deref() == Some(key.as_str()) && s.emails == 80),
        "{seen:?}"
    );
}
