//! The same binary and scripts on a private 3-primary Redis Cluster: the
//! pipeline with its dedup, a crash and its recovery, and a slot migration
//! (MOVED/ASK) in the middle of a run.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use mailstream::model::outcome::Failpoint;
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::{Failpoints, Hold, RunOptions};
use tokio::sync::Notify;

const SETTLE: Duration = Duration::from_secs(120);

fn four_partitions(c: &mut mailstream::config::Config) {
    c.redis.partitions = 4;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_runs_unchanged_on_a_cluster() {
    let mut world = World::cluster(four_partitions).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    world.subscribers(1000).await;
    assert_eq!(world.kick().await.new, 1000);
    assert_eq!(world.kick().await.duplicates, 1000, "dedup holds on a cluster");
    // The partitions' keys live on more than one node.
    let mut holders = std::collections::BTreeSet::new();
    for (i, node) in world.redis.cluster().nodes.iter().enumerate() {
        let n: u64 = node.command(&redis::cmd("DBSIZE")).await.unwrap();
        if n > 0 {
            holders.insert(i);
        }
    }
    assert!(holders.len() >= 2, "keys on {holders:?}");
    let (one, two) = (world.daemon(), world.daemon());
    let counts = world.settled(SETTLE).await;
    one.stop().await;
    two.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (1000, 0, 0));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (1000, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_send_and_settle_recovers_on_a_cluster() {
    let mut world = World::cluster(|c| {
        four_partitions(c);
        c.resend.timeout_seconds = 1;
        c.delivery.lease_seconds = 4;
    })
    .await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    world.subscribers(400).await;
    world.kick().await;
    let reached = Arc::new(Notify::new());
    let freeze = {
        let reached = reached.clone();
        let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        Failpoints::new(move |at| -> Hold {
            if at != Failpoint::Answered || fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return Box::pin(async {});
            }
            let reached = reached.clone();
            Box::pin(async move {
                reached.notify_one();
                std::future::pending::<()>().await
            })
        })
    };
    let crashing = Daemon::start(world.config.clone(), RunOptions { failpoints: freeze, ..Default::default() });
    tokio::time::timeout(Duration::from_secs(60), reached.notified()).await.expect("the failpoint is reached");
    crashing.task.abort();
    let survivor = world.daemon();
    let counts = world.settled(SETTLE).await;
    survivor.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (400, 0, 0));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (400, 0));
    assert!(stats.replays >= 1, "the taker resent the sealed batch and got a replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_during_a_run_loses_and_repeats_nothing() {
    let mut world = World::cluster(|c| {
        four_partitions(c);
        c.resend.requests_per_second = 20;
    })
    .await;
    let (emulator, _stop) =
        world.emulator(EmulatorConfig { requests_per_second: Some(20), ..Default::default() }).await;
    world.subscribers(4000).await;
    world.kick().await;
    let daemon = world.daemon();
    let store = world.store.clone();
    let midway = eventually(Duration::from_secs(60), || {
        let store = store.clone();
        async move { store.counts(CAMPAIGN, &PERIOD).await.ok().filter(|c| c.sent >= 800) }
    })
    .await;
    assert!(midway.is_some());
    // Partition 0's slot (its stream, records, batches, counts) moves to another node.
    let slot: u16 = world.redis.cluster().nodes[0]
        .command(redis::cmd("CLUSTER").arg("KEYSLOT").arg(world.store.keys.stream(0)))
        .await
        .unwrap();
    let before = world.redis.cluster().owner_of(slot).await.unwrap();
    let keys_before: u64 = world
        .redis
        .cluster()
        .nodes
        .iter()
        .find(|n| n.port() == before)
        .unwrap()
        .command(redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot))
        .await
        .unwrap();
    world.redis.cluster().migrate_slot(slot).await.expect("the slot migrates");
    let after = world.redis.cluster().owner_of(slot).await.unwrap();
    assert_ne!(before, after, "the slot moved");
    assert!(keys_before > 1000, "with its keys: {keys_before}");
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (4000, 0, 0));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.duplicate_sends), (4000, 0), "{stats:?}");
}
