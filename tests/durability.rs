//! What the protocol model found about replicas, against a real primary and replica:
//! a last gate's write that a failover took back before WAIT is not followed by its old
//! holder's request, and a write the caller reports as done (an enqueue, a subscriber
//! change, a suppression) is refused, not reported, when replicas do not acknowledge it.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use mailstream::audience::suppression::{self, Act};
use mailstream::config::Secret;
use mailstream::model::outcome::Failpoint;
use mailstream::model::outcome::Why;
use mailstream::resend::{AcceptedEmail, Client};
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::store::scripts::{self, Gate, GateRequest, Settlement, Settler, Take, Verdict};
use mailstream::tools::emulator::EmulatorConfig;
use mailstream::{audience::ingest, audience::subscribers};
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(60);

async fn replica_of(world: &World) -> RedisServer {
    let replica = RedisServer::start(RedisOptions { replica_of: Some(world.redis.port()), ..Default::default() })
        .await
        .expect("a replica starts");
    replica.linked().await.expect("the replica links");
    replica
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_write_lost_before_its_wait_is_not_followed_by_its_old_holders_request() {
    let mut world = World::with(Default::default(), |c| {
        c.redis.partitions = 1;
        c.redis.wait_replicas = 1;
    })
    .await;
    let _replica = replica_of(&world).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let subs = world.subscribers(2).await;
    world.kick().await;
    // The holder passes the last gate of the two's batch and stops before its WAIT.
    let (holder, release) = held_at(&world.config, Failpoint::Gating, SETTLE).await;
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let batches: Vec<String> =
        redis::cmd("ZRANGE").arg(keys.batches(0)).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
    let [batch] = batches.as_slice() else { panic!("one batch: {batches:?}") };
    // A failover: the promoted replica never had the gate's write, so the batch is as it
    // was before its gate, and its lease ran out. Another instance takes it over.
    let _: () =
        redis::cmd("HSET").arg(keys.batch(0, batch)).arg("state").arg("retry").query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("ZADD").arg(keys.batches(0)).arg(0).arg(batch).query_async(&mut conn).await.unwrap();
    let Take::Take { members, maybe_sent: false, .. } =
        scripts::take(&mut conn, keys, 0, batch, "taker", 60_000, 3_600_000).await.unwrap()
    else {
        panic!("taken as never sent")
    };
    // One of the two unsubscribes: the taker re-seals without them under a new key and sends.
    let mut leaving = subs.iter().find(|s| delivery_of(s) == members[1]).unwrap().clone();
    leaving.subscribed = false;
    subscribers::upsert(&world.store, std::slice::from_ref(&leaving)).await.unwrap();
    let request = GateRequest {
        partition: 0,
        batch,
        owner: "taker",
        new_key: "taker-key",
        limits: gate_limits(60_000),
        maybe_sent: false,
    };
    let Gate::Resealed { key, body, kept, .. } = scripts::gate(&mut conn, keys, &request, &members).await.unwrap()
    else {
        panic!("re-sealed without the one who left")
    };
    let client =
        Client::new(&world.config.resend.base_url, Secret::new("re_test_key"), Duration::from_secs(5)).unwrap();
    let answer = client.send_batch(&key, Bytes::from(body), kept.len()).await.expect("accepted");
    let sent: Vec<Settlement<'_>> = kept
        .iter()
        .zip(answer.items)
        .map(|(&i, item)| {
            let AcceptedEmail::Sent(id) = item else { panic!("sent") };
            Settlement { member: &members[i], verdict: Verdict::Sent(id) }
        })
        .collect();
    scripts::settle(&mut conn, keys, 0, batch, Settler::Answer, &sent, 3600).await.unwrap();
    // The old holder's WAIT is acknowledged now, but its gate's write is gone: it sends
    // nothing (its request would mail the one who left, and the other a second time).
    release.notify_one();
    holder.stop().await;
    let sends = emulator.sends_matching(&PERIOD);
    assert!(!sends.contains_key(&leaving.email), "the one who left was mailed");
    assert_eq!(sends.values().copied().collect::<Vec<_>>(), [1], "{sends:?}");
    assert_eq!(emulator.stats().duplicate_sends, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reported_done_wait_for_the_replicas_they_ask_for() {
    let world = World::with(Default::default(), |c| c.redis.wait_replicas = 1).await;
    let receipt = || vec![json!({"idempotency_key": "r-1", "to": "delivered@resend.dev", "subject": "s", "text": "t"})];
    let bounce = async || {
        suppression::apply(&world.store, &world.config, "bounced@resend.dev", Act::Suppress(Why::Bounced), Some("e-1"))
            .await
    };
    // No replica: nothing is reported done (a retry, once the replica is back, is idempotent).
    let refused = ingest::enqueue(&world.store, &world.config, receipt()).await.expect_err("no replica");
    assert!(refused.to_string().contains("replicas did not acknowledge"), "{refused}");
    assert!(subscribers::upsert(&world.store, &[subscriber(1)]).await.is_err());
    assert!(bounce().await.is_err());
    assert!(mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &PERIOD).await.is_err());
    // With the replica the deployment asks for, each goes through.
    let _replica = replica_of(&world).await;
    let accepted = ingest::enqueue(&world.store, &world.config, receipt()).await.unwrap();
    assert!(matches!(accepted[0], ingest::ItemResult::Accepted { .. } | ingest::ItemResult::Duplicate { .. }));
    subscribers::upsert(&world.store, &[subscriber(1)]).await.unwrap();
    bounce().await.unwrap();
    // (The refused kick's fan-out stands until its lease runs out: another period here.)
    let report =
        mailstream::audience::kick::kick_registry(&world.store, &world.config, CAMPAIGN, &week(-1)).await.unwrap();
    assert_eq!(report.new, 1, "{report:?}");
}
