//! A Redis Cluster failover under a batch that passed its last gate: three primaries
//! with a replica each, `wait_replicas = 1`, the batch's primary killed (its replica
//! promoted) while its holder dies before or after the request left; another holder
//! takes the batch over. Each delivery is sent once, and every one is settled.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mailstream::RunOptions;
use mailstream::emulator::{EmulatorConfig, Stats};
use mailstream::outcome::Failpoint;
use tokio::sync::Notify;

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

    let reached = Arc::new(Notify::new());
    let options = RunOptions { failpoints: freeze_at(point, reached.clone(), None), ..Default::default() };
    let holder = Daemon::start(world.config.clone(), options);
    tokio::time::timeout(SETTLE, reached.notified()).await.expect("a batch passed its gate and WAIT");
    holder.task.abort();
    let _ = holder.task.await;

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
    let sends = emulator.sends_matching(PERIOD);
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
