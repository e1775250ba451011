//! Scale-out: the team-wide limiter in Redis (its script under a fake clock),
//! several instances sharing one provider limit, and an instance that dies
//! mid-run while the others finish its work.

mod common;

use std::time::Duration;

use common::*;
use mailstream::store::scripts;
use mailstream::tools::emulator::EmulatorConfig;

const SETTLE: Duration = Duration::from_secs(120);

/// limiter.lua at 10 requests/s with a 2 ms guard and a fake "now" (µs): (wait µs, now µs,
/// request number).
async fn limiter(world: &World, op: &str, arg: u64, now_us: u64) -> (u64, u64, u64) {
    let mut conn = world.store.conn().await.unwrap();
    let key = world.store.keys.limiter();
    scripts::limiter(&mut conn, &key, op, 10, GUARD, arg, Some(now_us), None).await.unwrap()
}

/// limiter.lua's 'hello' from instance `id`, which may pace alone 30 s: (live instances,
/// its share, requests/s kept out of the shared rate).
async fn hello(world: &World, id: &str, now_us: u64) -> (u64, u64, u64) {
    back(world, id, None, now_us).await
}

/// limiter.lua's 'back' from instance `id` that paced alone at `share` requests/s, its
/// last request alone `held` ms before its second ends (or a 'hello' without `back`).
async fn back(world: &World, id: &str, back: Option<(u64, u32)>, now_us: u64) -> (u64, u64, u64) {
    let (op, held, share) = back.map_or(("hello", 0, 0), |(held, share)| ("back", held, share));
    said(world, id, op, (held, share, &[]), now_us).await
}

/// limiter.lua's 'back' from instance `id` that paced alone at `share` requests/s, saying
/// in how many ms each of its requests alone still in its second leaves it.
async fn back_each(world: &World, id: &str, share: u32, each: &[u64], now_us: u64) -> (u64, u64, u64) {
    said(world, id, "back", (each.iter().copied().max().unwrap_or(0), share, each), now_us).await
}

/// limiter.lua's `op` ('hello' or 'back') from instance `id`, which may pace alone 30 s:
/// with the ms its share stays out, the share, and the ms each request alone stays out.
async fn said(
    world: &World,
    id: &str,
    op: &str,
    (held, share, each): (u64, u32, &[u64]),
    now_us: u64,
) -> (u64, u64, u64) {
    let mut conn = world.store.conn().await.unwrap();
    let key = world.store.keys.limiter();
    scripts::limiter(&mut conn, &key, op, 10, GUARD, held, Some(now_us), Some((id, 30_000, share, each))).await.unwrap()
}

const GUARD: u64 = 2_000;
const INTERVAL: u64 = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_limiter_spreads_requests_and_holds_every_sliding_second() {
    let world = World::new().await;
    let t0 = 1_000_000_000;
    // One slot per interval, whoever asks: a second taker at the same instant waits the rest.
    assert_eq!(limiter(&world, "take", 0, t0).await, (0, t0, 0));
    assert_eq!(limiter(&world, "take", 0, t0).await, (INTERVAL, t0, 1));
    assert_eq!(limiter(&world, "take", 0, t0 + 50_000).await, (INTERVAL - 50_000, t0 + 50_000, 1));
    // A taker a little late keeps the cadence: the next slot is still on the grid.
    assert_eq!(limiter(&world, "take", 0, t0 + INTERVAL + 3_000).await, (0, t0 + INTERVAL + 3_000, 1));
    let mut at = t0 + INTERVAL;
    for n in 2..10 {
        at += INTERVAL;
        assert_eq!(limiter(&world, "take", 0, at).await, (0, at, n), "one interval later");
        assert!(limiter(&world, "take", 0, at + 1).await.0 >= INTERVAL - 1, "never two in one interval");
    }
    // The eleventh waits until a second plus the guard after the first left (granted at
    // t0 and not yet said to have left: taken to be within 1 ms): the provider never
    // counts eleven in a second.
    at += INTERVAL;
    assert_eq!(limiter(&world, "take", 0, at).await.0, 1_000 + GUARD);
    assert_eq!(limiter(&world, "take", 0, at + 1_000 + GUARD).await, (0, at + 1_000 + GUARD, 10));
    // After ten idle seconds nothing is banked: one slot now, the next an interval later.
    let later = at + 10_000_000;
    assert_eq!(limiter(&world, "take", 0, later).await.0, 0);
    assert_eq!(limiter(&world, "take", 0, later + 1_000).await.0, INTERVAL - 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_counts_live_instances_and_keeps_out_the_shares_of_peers_that_may_pace_alone() {
    let world = World::new().await;
    // Redis's clock today, in µs: 16 digits (Lua prints a number of more than 14 as 1.8e+15).
    let t0 = 1_800_000_000_000_000;
    assert_eq!(hello(&world, "a", t0).await, (1, 10, 0));
    assert_eq!(hello(&world, "b", t0).await, (2, 5, 0));
    assert_eq!(hello(&world, "a", t0 + 500_000).await, (2, 5, 0));
    // The limiter's node was lost; 8 s later `a` is back after pacing alone at 5/s, its
    // last request alone 700 ms before its second ends: its 5 stay out of the shared rate
    // until then, and so do `b`'s, not seen since (it may still pace alone).
    let t1 = t0 + 8_000_000;
    assert_eq!(back(&world, "a", Some((700, 5)), t1).await, (2, 5, 10));
    assert_eq!(limiter(&world, "take", 0, t1).await.0, 100_000, "nothing left to share: ask again soon");
    // a's second has passed: b's 5 stay out, 5 requests/s are shared.
    let t2 = t1 + 700_000;
    assert_eq!(limiter(&world, "take", 0, t2).await.0, 0);
    assert_eq!(limiter(&world, "take", 0, t2 + 100_000).await.0, 100_000, "5 requests/s: 200 ms apart");
    assert_eq!(limiter(&world, "take", 0, t2 + 200_000).await.0, 0);
    // `b` says hello: the whole rate again (after the slot already given).
    assert_eq!(hello(&world, "b", t2 + 250_000).await, (2, 5, 0));
    assert_eq!(limiter(&world, "take", 0, t2 + 400_000).await.0, 0);
    assert_eq!(limiter(&world, "take", 0, t2 + 450_000).await.0, 50_000, "10 requests/s: 100 ms apart");
    // A peer silent for longer than it may pace alone (and than the live horizon) is forgotten.
    assert_eq!(hello(&world, "a", t1 + 32_000_000).await, (1, 10, 0));
    let mut conn = world.store.conn().await.unwrap();
    let peers: Vec<String> = redis::cmd("HKEYS")
        .arg(mailstream::store::keys::Keys::limiter_peers(&world.store.keys.limiter()))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(peers, ["a"]);
}

/// An instance back from pacing alone keeps each of its requests alone out of the shared
/// rate only until that request's second has passed: the shared rate grows back as they
/// age (one request at a time), instead of staying without its whole share until the
/// last one's second ends; and it stays so through its next hellos, which say nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_back_keeps_each_request_alone_out_only_until_its_second_has_passed() {
    let world = World::new().await;
    let t0 = 1_800_000_000_000_000;
    hello(&world, "a", t0).await;
    hello(&world, "b", t0).await;
    // `a` paced alone at 5/s; its last five requests alone leave their second in 100,
    // 300, 500, 700 and 900 ms: they stay out, and so does b's share, not seen since.
    let t1 = t0 + 8_000_000;
    assert_eq!(back_each(&world, "a", 5, &[100, 300, 500, 700, 900], t1).await, (2, 5, 10));
    // `b` is back too (it had sent nothing alone): only a's five are out.
    assert_eq!(hello(&world, "b", t1 + 1_000).await, (2, 5, 5));
    assert_eq!(limiter(&world, "take", 0, t1 + 1_000).await.0, 0, "5 requests/s shared at once");
    assert_eq!(limiter(&world, "take", 0, t1 + 1_001).await.0, 2 * INTERVAL - 1, "5 requests/s: 200 ms apart");
    // 150 ms on, the first has left its second: 6 requests/s, and the next slot is 1/6 s
    // after the last, not the 1/5 s set when it was granted.
    assert_eq!(limiter(&world, "peek", 0, t1 + 150_000).await.0, 1_000 + 1_000_000 / 6 - 150_000);
    // 500 ms on, three of a's five have left their second: 8 requests/s are shared.
    let t2 = t1 + 500_000;
    assert_eq!(limiter(&world, "take", 0, t2).await.0, 0);
    assert_eq!(limiter(&world, "take", 0, t2 + 1).await.0, 1_000_000 / 8 - 1, "8 requests/s");
    // A hello from `a` (and one from `b`) keeps the two still in their second out...
    assert_eq!(hello(&world, "a", t2 + 100_000).await, (2, 5, 2));
    assert_eq!(hello(&world, "b", t2 + 150_000).await, (2, 5, 2));
    // ...until the last one's second has passed: the whole rate is shared again.
    assert_eq!(hello(&world, "a", t1 + 950_000).await, (2, 5, 0));
    let t3 = t1 + 1_000_000;
    assert_eq!(limiter(&world, "take", 0, t3).await.0, 0);
    assert_eq!(limiter(&world, "take", 0, t3 + 1).await.0, INTERVAL - 1, "10 requests/s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_not_seen_since_an_outage_keeps_its_share_out_only_while_it_may_pace_alone() {
    let world = World::new().await;
    let t0 = 1_900_000_000_000_000;
    hello(&world, "a", t0).await;
    hello(&world, "b", t0).await;
    assert_eq!(back(&world, "a", Some((0, 5)), t0 + 5_000_000).await, (2, 5, 5));
    assert_eq!(limiter(&world, "take", 0, t0 + 5_000_000).await.0, 0);
    assert_eq!(limiter(&world, "take", 0, t0 + 5_000_001).await.0, 2 * INTERVAL - 1, "5 requests/s shared");
    // 30 s after b's last hello it may no longer pace alone: the whole rate is shared again.
    let after = t0 + 30_000_000;
    assert_eq!(limiter(&world, "take", 0, after).await.0, 0);
    assert_eq!(limiter(&world, "take", 0, after + 1).await.0, INTERVAL - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_limiter_obeys_pauses_lower_rates_and_late_departures() {
    let world = World::new().await;
    let t0 = 5_000_000_000;
    assert_eq!(limiter(&world, "take", 0, t0).await.0, 0);
    // A 429 somewhere asked for 3 s: nobody sends before then.
    limiter(&world, "pause", 3_000, t0 + 1_000).await;
    assert_eq!(limiter(&world, "take", 0, t0 + 200_000).await.0, 2_801_000);
    assert_eq!(limiter(&world, "take", 0, t0 + 3_001_000).await.0, 0);
    // The provider announces 5 per second: adopted for everyone, once.
    assert_eq!(limiter(&world, "lower", 5, t0 + 3_001_000).await.0, 1);
    assert_eq!(limiter(&world, "lower", 7, t0 + 3_001_000).await.0, 0, "a higher rate is ignored");
    let t1 = t0 + 4_000_000;
    assert_eq!(limiter(&world, "take", 0, t1).await.0, 0);
    assert_eq!(limiter(&world, "take", 0, t1 + 100_000).await.0, 100_000, "200 ms apart now");
    // A request written 40 ms after its grant holds back the one five requests (a
    // sliding second, at 5/s) after it by as much.
    let t2 = t1 + 1_000_000;
    let (_, _, n) = limiter(&world, "take", 0, t2).await;
    limiter(&world, "late", n, t2 + 40_000).await;
    for k in 1..5 {
        assert_eq!(limiter(&world, "take", 0, t2 + k * 200_000).await.0, 0);
    }
    assert_eq!(limiter(&world, "take", 0, t2 + 1_000_000).await.0, 40_000 + GUARD);
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
    let (a, b, c) = (world.daemon_as("instance-a"), world.daemon_as("instance-b"), world.daemon_as("instance-c"));
    let store = world.store.clone();
    let midway = eventually(Duration::from_secs(60), || {
        let store = store.clone();
        async move { store.counts(CAMPAIGN, &PERIOD).await.ok().filter(|c| c.sent >= 1500) }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_new_connections_never_crowd_the_providers_second() {
    let mut world = World::with(Default::default(), |c| {
        c.redis.partitions = 2;
        c.resend.requests_per_second = 10;
    })
    .await;
    // Each new connection is read 150 ms after it opened (a slow TLS handshake), and
    // connections close half a second after they opened: requests keep opening new ones.
    let config = EmulatorConfig {
        requests_per_second: Some(10),
        connect_delay_ms: 150,
        close_idle_after_ms: Some(500),
        ..Default::default()
    };
    let (emulator, _stop) = world.emulator(config).await;
    world.subscribers(5000).await;
    world.kick().await;
    let (a, b) = (world.daemon_as("instance-a"), world.daemon_as("instance-b"));
    let counts = world.settled(SETTLE).await;
    a.stop().await;
    b.stop().await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (5000, 0, 0));
    let stats = emulator.stats();
    assert_eq!((stats.rate_limited, stats.duplicate_sends), (0, 0), "{stats:?}");
    assert!(stats.max_requests_in_1s <= 10, "{stats:?}");
}
