//! Scale-out: the team-wide limiter in Redis (its script under a fake clock),
//! several instances sharing one provider limit, and an instance that dies
//! mid-run while the others finish its work.

mod common;

use std::time::Duration;

use common::*;
use mailstream::emulator::EmulatorConfig;
use mailstream::{Failpoints, RunOptions};
use redis::Script;

const SETTLE: Duration = Duration::from_secs(120);

/// limiter.lua with a fake "now" (µs): (wait µs, now µs).
async fn limiter(world: &World, op: &str, interval_us: u64, arg: u64, now_us: u64) -> (u64, u64) {
    let script = Script::new(include_str!("../lua/limiter.lua"));
    let mut conn = world.store.conn().await.unwrap();
    let mut call = script.key(world.store.keys.limiter());
    call.arg(op).arg(interval_us).arg(2_000).arg(arg).arg(now_us);
    call.invoke_async(&mut conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_limiter_spaces_departures_exactly_with_no_burst() {
    let world = World::new().await;
    let interval = 102_000; // 10 per second plus a 2 ms guard
    let t0 = 1_000_000_000;
    // One slot per interval, whoever asks: a second taker at the same instant waits the rest.
    assert_eq!(limiter(&world, "take", interval, 0, t0).await, (0, t0));
    assert_eq!(limiter(&world, "take", interval, 0, t0).await, (interval, t0));
    assert_eq!(limiter(&world, "take", interval, 0, t0 + 50_000).await, (interval - 50_000, t0 + 50_000));
    let mut at = t0;
    for _ in 0..20 {
        at += interval;
        assert_eq!(limiter(&world, "take", interval, 0, at).await.0, 0, "exactly one interval later");
        assert_eq!(limiter(&world, "take", interval, 0, at + 1).await.0, interval - 1, "never two in one interval");
    }
    // After ten idle seconds nothing is banked: one slot now, the next an interval later.
    let later = at + 10_000_000;
    assert_eq!(limiter(&world, "take", interval, 0, later).await.0, 0);
    assert_eq!(limiter(&world, "take", interval, 0, later + 1_000).await.0, interval - 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_limiter_obeys_pauses_lower_rates_and_late_departures() {
    let world = World::new().await;
    let interval = 100_000;
    let t0 = 5_000_000_000;
    assert_eq!(limiter(&world, "take", interval, 0, t0).await.0, 0);
    // A 429 somewhere asked for 3 s: nobody sends before then.
    limiter(&world, "pause", interval, 3_000, t0 + 1_000).await;
    assert_eq!(limiter(&world, "take", interval, 0, t0 + 200_000).await.0, 2_801_000);
    assert_eq!(limiter(&world, "take", interval, 0, t0 + 3_001_000).await.0, 0);
    // The provider announces 5 per second: adopted for everyone, once.
    assert_eq!(limiter(&world, "lower", interval, 5, t0 + 3_001_000).await.0, 1);
    assert_eq!(limiter(&world, "lower", interval, 7, t0 + 3_001_000).await.0, 0, "a higher rate is ignored");
    let t1 = t0 + 4_000_000;
    assert_eq!(limiter(&world, "take", interval, 0, t1).await.0, 0);
    assert_eq!(limiter(&world, "take", interval, 0, t1 + 100_000).await.0, 102_000, "200 ms + guard now");
    // A request that left 40 ms after its slot moves the next one back by as much.
    let t2 = t1 + 202_000;
    assert_eq!(limiter(&world, "take", interval, 0, t2).await.0, 0);
    limiter(&world, "late", interval, t2 + 40_000, t2 + 40_000).await;
    assert_eq!(limiter(&world, "take", interval, 0, t2 + 202_000).await.0, 40_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_limit_and_finish_a_dead_ones_work() {
    let mut world = World::with(Default::default(), |c| {
        c.redis.partitions = 4;
        c.resend.requests_per_second = 10;
    })
    .await;
    let (emulator, _stop) =
        world.emulator(EmulatorConfig { requests_per_second: Some(10), ..Default::default() }).await;
    world.subscribers(4000).await;
    world.kick().await;
    let start = |name: &str| {
        let options =
            RunOptions { owner: Some(name.to_string()), failpoints: Failpoints::default(), ..Default::default() };
        Daemon::start(world.config.clone(), options)
    };
    let (a, b, c) = (start("instance-a"), start("instance-b"), start("instance-c"));
    let store = world.store.clone();
    let midway = eventually(Duration::from_secs(60), || {
        let store = store.clone();
        async move { store.counts(CAMPAIGN, PERIOD).await.ok().filter(|c| c.sent >= 1500) }
    })
    .await;
    assert!(midway.is_some());
    // One instance dies (as kill -9: its tasks, heartbeat included, stop at once).
    b.task.abort();
    let counts = world.settled(SETTLE).await;
    a.stop().await;
    c.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (4000, 0, 0));
    let stats = emulator.stats();
    assert_eq!(stats.duplicate_sends, 0, "{stats:?}");
    assert_eq!(stats.rate_limited, 0, "{stats:?}");
    assert!(stats.max_requests_in_1s <= 10, "{stats:?}");
}
