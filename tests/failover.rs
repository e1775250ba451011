//! A Redis Cluster failover under a batch that passed its last gate: three primaries
//! with a replica each, `wait_replicas = 1`, the batch's primary killed (its replica
//! promoted) while its holder dies before or after the request left; another holder
//! takes the batch over. Each delivery is sent once, and every one is settled.
//! And a primary that lost its replica: only its own partitions wait, the others are
//! sent meanwhile, and everything goes once the replica is back.

mod common;

use std::time::Duration;

use common::*;
use mailstream::model::outcome::Failpoint;
use mailstream::tools::emulator::{EmulatorConfig, Stats};

const SETTLE: Duration = Duration::from_secs(180);
const DELIVERIES: usize = 400;

/// Runs a holder that stops for good at `point` (then dies), fails over the primary
/// of the batch it held, brings the old primary back as a replica, and lets another
/// holder finish. Returns the emulator's figures.
async fn fail_over_at(point: Failpoint) -> Stats {
    let mut world = World::cluster_with(1, |c| {
        c.redis.partitions = 4;
        c.redis.wait_replicas = 1;
        c.resend.timeout_seconds = 1;
        c.delivery.lease_seconds = 4;
        // One request at a time: the frozen one is the only batch on the wire.
        c.resend.max_in_flight = 1;
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    world.subscribers(DELIVERIES).await;
    world.kick().await;

    // Until a batch passed its gate and WAIT.
    crash_at(&world.config, point, SETTLE).await;

    // The batch it held: the one past its last gate and not settled.
    let (keys, mut conn) = (world.store.keys.clone(), world.store.conn().await.unwrap());
    let mut held = Vec::new();
    for p in 0..keys.partitions() {
        let ids: Vec<String> =
            redis::cmd("ZRANGE").arg(keys.batches(p)).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
        for id in ids {
            let state: Option<String> =
                redis::cmd("HGET").arg(keys.batch(p, &id)).arg("state").query_async(&mut conn).await.unwrap();
            if state.as_deref() == Some("sending") {
                held.push((p, id));
            }
        }
    }
    let [(p, batch)] = held.as_slice() else { panic!("one batch past its gate: {held:?}") };
    let cluster = world.redis.cluster_mut();
    let slot = cluster.slot_of(&keys.batch(*p, batch)).await.unwrap();
    let primary = cluster.primary_of(slot).await.unwrap();
    let promoted = cluster.kill_primary(primary).await.expect("a replica takes over");
    assert_ne!(primary, promoted);
    // The promoted replica has what WAIT acknowledged: the batch, past its gate.
    let state: Option<String> =
        cluster.nodes[promoted].command(redis::cmd("HGET").arg(keys.batch(*p, batch)).arg("state")).await.unwrap();
    assert_eq!(state.as_deref(), Some("sending"), "the replica holds the gate's write");
    // The old primary comes back as the new one's replica, so WAIT can succeed again.
    cluster.rejoin(primary).await.expect("the old primary rejoins");

    let taker = world.daemon_as("taker");
    let counts = world.settled(SETTLE).await;
    taker.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (DELIVERIES as u64, 0, 0), "{counts:?}");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (DELIVERIES as u64, 0), "{stats:?}");
    let sends = emulator.sends_matching(&PERIOD);
    assert!(sends.len() == DELIVERIES && sends.values().all(|&n| n == 1), "one real send each");
    stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_after_the_gate_and_before_the_request_sends_each_delivery_once() {
    let stats = fail_over_at(Failpoint::Gated).await;
    assert_eq!(stats.replays, 0, "the request never left: its resend is its first send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_after_the_request_left_replays_and_sends_each_delivery_once() {
    let stats = fail_over_at(Failpoint::Answered).await;
    assert!(stats.replays >= 1, "the taker resent the sealed bytes under the sealed key: a replay");
}

/// The per-partition counts of the test period: (enqueued, sent, settled otherwise).
async fn partition_counts(world: &World, p: u16) -> (u64, u64, u64) {
    let mut conn = world.store.conn().await.unwrap();
    let counts: std::collections::HashMap<String, u64> =
        redis::cmd("HGETALL").arg(world.store.keys.counts(p, CAMPAIGN, &PERIOD)).query_async(&mut conn).await.unwrap();
    let get = |f: &str| counts.get(f).copied().unwrap_or(0);
    (get("enqueued"), get("sent"), get("failed") + get("skipped") + get("outcome_unknown"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_lost_its_replica_holds_back_only_its_own_partitions() {
    let mut world = World::cluster_with(1, |c| {
        c.redis.partitions = 4;
        c.redis.wait_replicas = 1;
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    world.subscribers(DELIVERIES).await;
    // The kick's own writes wait for replicas too: it runs before one is lost.
    world.kick().await;

    // The replica of the primary that holds partition 0 dies; that primary's partitions
    // are the affected ones.
    let keys = world.store.keys.clone();
    let cluster = world.redis.cluster_mut();
    let mut primary_of = Vec::new();
    for p in 0..keys.partitions() {
        let slot = cluster.slot_of(&keys.batches(p)).await.unwrap();
        primary_of.push(cluster.primary_of(slot).await.unwrap());
    }
    let primary = primary_of[0];
    let affected: Vec<u16> = (0..keys.partitions()).filter(|&p| primary_of[usize::from(p)] == primary).collect();
    let info: String = cluster.nodes[primary].command(redis::cmd("INFO").arg("replication")).await.unwrap();
    let replica_port: u16 = info
        .lines()
        .find(|l| l.starts_with("slave0:"))
        .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("port=")))
        .and_then(|port| port.parse().ok())
        .expect("the primary has a replica");
    let replica = cluster.nodes.iter().position(|n| n.port() == replica_port).expect("one of ours");
    cluster.nodes[replica].kill();
    let alone = eventually(Duration::from_secs(30), || {
        let node = &cluster.nodes[primary];
        async move {
            let info: String = node.command(redis::cmd("INFO").arg("replication")).await.ok()?;
            info.contains("connected_slaves:0").then_some(())
        }
    })
    .await;
    assert!(alone.is_some(), "the primary saw its replica go");

    let daemon = world.daemon();
    // Every other partition is sent in full while the affected ones wait, held.
    let unaffected: Vec<u16> = (0..keys.partitions()).filter(|p| !affected.contains(p)).collect();
    let others_done = eventually(SETTLE, || {
        let (world, unaffected, affected, metrics) = (&world, &unaffected, &affected, daemon.metrics.clone());
        async move {
            for &p in unaffected {
                let (enqueued, sent, other) = partition_counts(world, p).await;
                if enqueued == 0 || sent + other < enqueued {
                    return None;
                }
            }
            let text = metrics.render();
            affected
                .iter()
                .all(|p| metric(&text, "mailstream_partition_unreplicated", &format!("partition=\"{p}\"")) == 1.0)
                .then_some(text)
        }
    })
    .await;
    let text = others_done.expect("the other partitions are sent while the affected ones are held");
    let mut waiting = 0;
    for p in 0..keys.partitions() {
        let (enqueued, sent, other) = partition_counts(&world, p).await;
        let put_back = metric(&text, "mailstream_unreplicated_batches_total", &format!("partition=\"{p}\""));
        if affected.contains(&p) {
            assert_eq!((sent, other), (0, 0), "partition {p}: no batch left without its replica's acknowledgement");
            assert!(put_back >= 1.0, "partition {p}: its batches were put back, and counted");
            waiting += enqueued;
        } else {
            assert_eq!((sent, other, put_back), (enqueued, 0, 0.0), "partition {p} went at its own pace");
        }
    }
    assert!(waiting > 0, "the affected partitions hold deliveries");

    // The replica comes back: the held partitions resume by themselves.
    let cluster = world.redis.cluster_mut();
    cluster.rejoin(replica).await.expect("the replica rejoins");
    let counts = world.settled(SETTLE).await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (DELIVERIES as u64, 0, 0), "{counts:?}");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (DELIVERIES as u64, 0), "{stats:?}");
    let resumed = eventually(Duration::from_secs(30), || {
        let text = daemon.metrics.render();
        let affected = &affected;
        async move {
            affected
                .iter()
                .all(|p| metric(&text, "mailstream_partition_unreplicated", &format!("partition=\"{p}\"")) == 0.0)
                .then_some(())
        }
    })
    .await;
    assert!(resumed.is_some(), "the gauge says the replicas acknowledge again");
    daemon.stop().await;
}

/// The limiter's node dies: two instances counted by each other pace alone at half the
/// rate each, so the partitions on the other primaries go on while its replica is
/// promoted; then they share the limiter again. Never more than the rate in a sliding
/// second, no 429, each delivery sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_limiters_node_fails_over_the_other_partitions_go_on_at_a_share_of_the_rate_each() {
    const RPS: u32 = 10;
    let mut world = World::cluster_with(1, |c| {
        c.redis.partitions = 4;
        c.resend.requests_per_second = RPS;
    })
    .await;
    let (emulator, _stop) =
        world.emulator(EmulatorConfig { requests_per_second: Some(RPS), ..Default::default() }).await;
    let subscribers = 4_000;
    world.subscribers(subscribers).await;
    let keys = world.store.keys.clone();
    let cluster = world.redis.cluster();
    let limiter_node = cluster.primary_of(cluster.slot_of(&keys.limiter()).await.unwrap()).await.unwrap();
    let mut unaffected = Vec::new();
    for p in 0..keys.partitions() {
        if cluster.primary_of(cluster.slot_of(&keys.batches(p)).await.unwrap()).await.unwrap() != limiter_node {
            unaffected.push(p);
        }
    }
    assert!(!unaffected.is_empty(), "some partitions live on other primaries");

    // Both instances say hello, and have been counted by each other for longer than an
    // instance must have been before it may pace alone (5 s).
    let (a, b) = (world.daemon_as("a"), world.daemon_as("b"));
    let peers = mailstream::store::keys::Keys::limiter_peers(&keys.limiter());
    let store = world.store.clone();
    let both = eventually(Duration::from_secs(30), || {
        let (store, peers) = (store.clone(), peers.clone());
        async move {
            let mut conn = store.conn().await.ok()?;
            let n: u64 = redis::cmd("HLEN").arg(&peers).query_async(&mut conn).await.ok()?;
            (n == 2).then_some(())
        }
    })
    .await;
    assert!(both.is_some(), "both instances said hello to the limiter");
    tokio::time::sleep(Duration::from_secs(6)).await;
    world.kick().await;
    let started = eventually(SETTLE, || {
        let world = &world;
        async move { (world.counts().await.sent >= 500).then_some(()) }
    })
    .await;
    assert!(started.is_some(), "sending began");

    let killed_at = std::time::Instant::now();
    let cluster = world.redis.cluster_mut();
    cluster.kill_primary(limiter_node).await.expect("its replica takes over");
    let promoted_at = std::time::Instant::now();
    let alone = emulator.seen().iter().filter(|s| s.at > killed_at && s.at < promoted_at).count();
    assert!(alone > 0, "requests left while the limiter's node was down");

    let counts = world.settled(SETTLE).await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (subscribers as u64, 0, 0), "{counts:?}");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (subscribers as u64, 0), "{stats:?}");
    assert_eq!(stats.rate_limited, 0, "{stats:?}");
    assert!(stats.max_requests_in_1s <= u64::from(RPS), "{stats:?}");
    for daemon in [&a, &b] {
        let back = eventually(Duration::from_secs(30), || {
            let text = daemon.metrics.render();
            async move { (metric(&text, "mailstream_limiter_pacing_alone", "") == 0.0).then_some(()) }
        })
        .await;
        assert!(back.is_some(), "back on the limiter");
    }
    a.stop().await;
    b.stop().await;
}
