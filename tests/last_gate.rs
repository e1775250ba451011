//! The last gate, for every address and every lane: an address suppressed while its
//! email waited, sealed, for Resend is never mailed, whoever supplied the address (the
//! registry, an inline transactional recipient; the render hook's case is in
//! `render_hook.rs`). Also: a holder that finds its batch already settled by a taker
//! raises no lost-write alarm, and a batch record counts requests, not looks.

mod common;

use std::time::Duration;

use common::*;
use mailstream::audience::suppression::{self, Act};
use mailstream::config::Config;
use mailstream::model::outcome::Why;
use mailstream::model::outcome::{Failpoint, Reason};
use mailstream::model::work::TRANSACTIONAL;
use mailstream::store::scripts::{self, Gate, GateRequest, Reschedule, Settlement, Settler, Take, Verdict};
use mailstream::tools::emulator::{Emulator, EmulatorConfig};
use mailstream::{audience::ingest, audience::subscribers, ops::deliveries};
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(90);

/// Points the config at a loopback port that refuses every connection (Resend down);
/// [`resend_returns`] serves the emulator on it.
fn resend_down(config: &mut Config) -> tokio::net::TcpSocket {
    let (socket, port) = closed_port();
    config.resend.base_url = format!("http://127.0.0.1:{port}");
    socket
}

/// Resend comes back on the port `socket` kept.
fn resend_returns(socket: tokio::net::TcpSocket) -> (Emulator, mailstream::shutdown::Trigger) {
    let emulator = Emulator::new(EmulatorConfig { requests_per_second: None, ..Default::default() });
    let (stop, down) = mailstream::shutdown::channel();
    tokio::spawn(emulator.clone().serve(socket.listen(64).unwrap(), down));
    (emulator, stop)
}

/// Waits until `n` deliveries are sealed into batches (rendered, their requests refused).
async fn all_sealed(world: &World, n: usize) {
    let store = world.store.clone();
    let sealed = eventually(SETTLE, || {
        let store = store.clone();
        async move {
            let records = deliveries(&store).await;
            (records.iter().filter(|(_, r)| r.get("state").map(String::as_str) == Some("sealed")).count() == n)
                .then_some(())
        }
    })
    .await;
    assert!(sealed.is_some(), "{n} deliveries sealed while Resend was down");
}

/// Waits, Resend still down, until the last gate has settled delivery `id` skipped for
/// its suppressed address. A request gated before the bounce may still leave after it:
/// the gate's last look is up to `GATE_FRESHNESS` (500 ms) before its request, by design
/// (docs/protocol.md, "The last gate's window"). While Resend is down every such request
/// fails; once the gate has dropped the delivery, no request carries it again.
async fn skipped_at_the_gate(world: &World, id: &str) {
    let store = world.store.clone();
    let skipped = eventually(SETTLE, || {
        let store = store.clone();
        async move { (delivery(&store, id).await.get("state").map(String::as_str) == Some("skipped")).then_some(()) }
    })
    .await;
    assert!(skipped.is_some(), "the last gate dropped {id} while Resend was down");
}

/// A hard bounce reported by Resend's webhook for `email` (what the listener applies).
async fn hard_bounce(world: &World, email: &str, event: &str) {
    suppression::apply(&world.store, &world.config, email, Act::Suppress(Why::Bounced), Some(event)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_whose_address_bounced_while_it_waited_sealed_is_not_sent() {
    let mut world = World::with(Default::default(), |c| c.redis.partitions = 4).await;
    let socket = resend_down(&mut world.config);
    let receipt =
        |key: &str, to: &str| json!({"idempotency_key": key, "to": to, "subject": "Your receipt", "text": "Thanks."});
    let items = vec![receipt("late-bounce", "delivered+late@resend.dev"), receipt("fine", "delivered+fine@resend.dev")];
    let results = ingest::enqueue(&world.store, &world.config, items).await.unwrap();
    assert!(results.iter().all(|r| matches!(r, ingest::ItemResult::Accepted { .. })), "{results:?}");
    let daemon = world.daemon();
    all_sealed(&world, 2).await;
    // Written as a mail client may show it: the gate compares addresses normalized.
    hard_bounce(&world, "Late <Delivered+Late@resend.dev>", "evt-late").await;
    let day = world.store.time().await.unwrap().format("%Y-%m-%d").to_string();
    skipped_at_the_gate(&world, &format!("{TRANSACTIONAL}:{day}:-:late-bounce")).await;
    let (emulator, _stop) = resend_returns(socket);
    let store = world.store.clone();
    let counts = eventually(SETTLE, || {
        let (store, day) = (store.clone(), day.clone());
        async move { store.counts(TRANSACTIONAL, &day).await.ok().filter(|c| c.settled() >= 2) }
    })
    .await
    .expect("both receipts settle");
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped, counts.failed), (1, 1, 0), "{counts:?}");
    let late = delivery(&world.store, &format!("{TRANSACTIONAL}:{day}:-:late-bounce")).await;
    assert_eq!((late["state"].as_str(), late["reason"].as_str()), ("skipped", "suppressed"));
    let sent = emulator.sends_matching("");
    assert!(!sent.contains_key("delivered+late@resend.dev"), "the bounced address was mailed: {sent:?}");
    assert_eq!((sent.len(), emulator.stats().emails_accepted), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_sealed_to_an_address_its_subscriber_since_left_and_that_bounced_is_not_sent() {
    let mut world = World::with(Default::default(), |c| c.redis.partitions = 4).await;
    let socket = resend_down(&mut world.config);
    let subs = world.subscribers(6).await;
    world.kick().await;
    let daemon = world.daemon();
    all_sealed(&world, 6).await;
    // Subscriber 1 moves to a new address; the old one, still in the sealed body, bounces.
    // Their record is neither suppressed nor unsubscribed: only the address tells.
    let mut moved = subs[1].clone();
    let old = std::mem::replace(&mut moved.email, "delivered+moved@resend.dev".into());
    subscribers::upsert(&world.store, std::slice::from_ref(&moved)).await.unwrap();
    hard_bounce(&world, &old, "evt-old").await;
    skipped_at_the_gate(&world, &delivery_of(&moved).id()).await;
    let (emulator, _stop) = resend_returns(socket);
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped, counts.failed), (5, 1, 0), "{counts:?}");
    let record = delivery(&world.store, &delivery_of(&moved).id()).await;
    assert_eq!((record["state"].as_str(), record["reason"].as_str()), ("skipped", "suppressed"));
    let sent = emulator.sends_matching(&PERIOD);
    assert!(!sent.contains_key(&old), "the bounced address was mailed");
    assert_eq!(emulator.stats().duplicate_sends, 0);
}

/// The other side of the window: the last gate is the last look. A bounce that lands after
/// it, while its request is on its way (here held at the `gated` failpoint), does not call
/// the request back: that email goes, as one already on the wire would (docs/protocol.md,
/// "The last gate's window").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounce_after_the_last_gate_does_not_call_its_request_back() {
    let mut world = World::with(Default::default(), |c| c.redis.partitions = 1).await;
    let (emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    let subs = world.subscribers(1).await;
    world.kick().await;
    let (daemon, release) = held_at(&world.config, Failpoint::Gated, SETTLE).await;
    hard_bounce(&world, &subs[0].email, "evt-after-gate").await;
    release.notify_one();
    let counts = world.settled(SETTLE).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped), (1, 0), "{counts:?}");
    assert!(emulator.sends_matching(&PERIOD).contains_key(&subs[0].email), "the gated request left");
    let record = delivery(&world.store, &delivery_of(&subs[0]).id()).await;
    assert_eq!(record.get("state").map(String::as_str), Some("sent"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_finds_its_batch_settled_by_a_taker_raises_no_lost_write_alarm() {
    let mut world = World::with(Default::default(), |c| c.redis.partitions = 1).await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig { requests_per_second: None, ..Default::default() }).await;
    world.subscribers(5).await;
    world.kick().await;
    // The holder stalls right after Resend answered (as a paused process would)...
    let (holder, release) = held_at(&world.config, Failpoint::Answered, SETTLE).await;
    // ...long enough for its lease to run out and a taker to resend (a replay) and settle.
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let batches: Vec<String> =
        redis::cmd("ZRANGE").arg(keys.batches(0)).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
    let [batch] = batches.as_slice() else { panic!("one batch in hand: {batches:?}") };
    let _: () = redis::cmd("ZADD").arg(keys.batches(0)).arg(0).arg(batch).query_async(&mut conn).await.unwrap();
    let Take::Take { members, maybe_sent: true, .. } =
        scripts::take(&mut conn, keys, 0, batch, "taker", 60_000, 3_600_000).await.unwrap()
    else {
        panic!("the taker takes it, knowing it may have been sent")
    };
    let sent: Vec<Settlement<'_>> =
        members.iter().map(|m| Settlement { member: m, verdict: Verdict::Sent("re_replayed".into()) }).collect();
    let settled = scripts::settle(&mut conn, keys, 0, batch, Settler::Answer, &sent, 3600).await.unwrap();
    assert_eq!(settled.batch, scripts::BatchFound::Open);
    // The holder wakes up and records the same answer: the batch is gone, every member
    // final. A normal race, not a lost write.
    release.notify_one();
    let metrics = holder.metrics.clone();
    holder.stop().await;
    let counts = world.settled(SETTLE).await;
    assert_eq!((counts.sent, counts.failed, counts.outcome_unknown), (5, 0, 0), "{counts:?}");
    let text = metrics.render();
    let lost = text.lines().find(|l| l.starts_with("mailstream_records_lost_total ")).expect("the counter is exported");
    assert_eq!(lost, "mailstream_records_lost_total 0");
}

fn gate_request<'a>(owner: &'a str, new_key: &'a str) -> GateRequest<'a> {
    GateRequest { partition: 0, batch: "B1", owner, new_key, limits: gate_limits(60_000), maybe_sent: false }
}

/// The deadlines, by the batch record's own clock fields (set back as a batch sealed long
/// ago would have them): a batch never sent is let past the gate up to `deadline_ms` after
/// its first seal, one that may have been sent up to `maybe_sent_deadline_ms` after its
/// last (the code mutant `gate_skips_never_sent_deadline` lets the first through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_holds_a_batch_to_its_delivery_deadlines() {
    let world = World::new().await;
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let (batch, members) = sealed_batch(&world, 2, "h", false).await;
    let request = GateRequest { limits: gate_limits(60_000), ..gate_request("h", "k2") };
    let set =
        |field: &'static str, value: u64| redis::cmd("HSET").arg(keys.batch(0, &batch)).arg(field).arg(value).clone();
    let now_ms = mailstream::store::records::now_ms(&mut conn).await.unwrap();
    // Within both deadlines: it goes (and is marked sending; put it back as it was).
    assert_eq!(scripts::gate(&mut conn, keys, &request, &members).await.unwrap(), Gate::Go { sends: 1 });
    let _: () =
        redis::cmd("HSET").arg(keys.batch(0, &batch)).arg("state").arg("sealed").query_async(&mut conn).await.unwrap();
    // First sealed 49 hours ago, never sent: past the 48 h delivery deadline.
    let _: () = set("first_sealed_ms", now_ms - 49 * 3_600_000).query_async(&mut conn).await.unwrap();
    assert_eq!(scripts::gate(&mut conn, keys, &request, &members).await.unwrap(), Gate::Deadline { maybe_sent: false });
    // Maybe sent, last sealed 7 hours ago: past the 6 h deadline of a maybe-sent batch
    // (within the 23 h window, so not expired).
    let _: () = set("first_sealed_ms", now_ms).query_async(&mut conn).await.unwrap();
    let _: () = set("sealed_ms", now_ms - 7 * 3_600_000).query_async(&mut conn).await.unwrap();
    let _: () = set("maybe_sent", 1).query_async(&mut conn).await.unwrap();
    assert_eq!(scripts::gate(&mut conn, keys, &request, &members).await.unwrap(), Gate::Deadline { maybe_sent: true });
}

/// Every address an email goes to is checked at the gate, not only its first: a member
/// whose `cc` or second `to` or `bcc` address is suppressed is skipped, and the rest are
/// re-sealed (the code mutant `gate_checks_first_address_only` sends all three).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_checks_every_address_of_an_email() {
    let world = World::new().await;
    let subs = partition_0_subscribers(&world, 4).await;
    let email = |to: &str, more: &str| {
        format!(r#"{{"from":"a@acme.example","to":[{to}],{more}"subject":"Digest","text":"x"}}"#)
    };
    let items = vec![
        (delivery_of(&subs[0]), email(r#""ok+0@resend.dev""#, r#""cc":["bounced+cc@resend.dev"],"#)),
        (delivery_of(&subs[1]), email(r#""ok+1@resend.dev","bounced+to@resend.dev""#, "")),
        (delivery_of(&subs[2]), email(r#""ok+2@resend.dev""#, r#""bcc":["bounced+bcc@resend.dev"],"#)),
        (delivery_of(&subs[3]), email(r#""ok+3@resend.dev""#, r#""cc":["ok+cc@resend.dev"],"#)),
    ];
    let (batch, members) = sealed_batch_of_emails(&world, &items, window(&world.config, &PERIOD), "h", false).await;
    for (n, bounced) in ["bounced+cc@resend.dev", "bounced+to@resend.dev", "bounced+bcc@resend.dev"].iter().enumerate()
    {
        hard_bounce(&world, bounced, &format!("evt-{n}")).await;
    }
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let request = GateRequest { batch: &batch, limits: gate_limits(60_000), ..gate_request("h", "k2") };
    match scripts::gate(&mut conn, keys, &request, &members).await.unwrap() {
        Gate::Resealed { kept, skipped, .. } => {
            assert_eq!(kept, vec![3], "only the member whose every address is fine is kept");
            let skipped: Vec<(usize, Reason)> = skipped;
            assert_eq!(skipped, vec![(0, Reason::Suppressed), (1, Reason::Suppressed), (2, Reason::Suppressed)]);
        }
        other => panic!("the gate re-seals without the three: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_on_a_batch_a_taker_settled_is_told_so_and_a_lost_one_is_lost() {
    let world = World::new().await;
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let (batch, members) = sealed_batch(&world, 2, "slow", true).await;
    tokio::time::sleep(Duration::from_millis(5)).await; // the 1 ms lease runs out
    assert!(matches!(
        scripts::take(&mut conn, keys, 0, &batch, "new", 60_000, 3_600_000).await.unwrap(),
        Take::Take { .. }
    ));
    let sent: Vec<Settlement<'_>> =
        members.iter().map(|m| Settlement { member: m, verdict: Verdict::Sent("re_1".into()) }).collect();
    scripts::settle(&mut conn, keys, 0, &batch, Settler::Answer, &sent, 3600).await.unwrap();
    // The slow holder looks again before its own request: settled, not lost.
    assert_eq!(scripts::gate(&mut conn, keys, &gate_request("slow", "k2"), &members).await.unwrap(), Gate::Settled);
    // The same answer recorded again: already settled, not missing.
    let again = scripts::settle(&mut conn, keys, 0, &batch, Settler::Answer, &sent, 3600).await.unwrap();
    assert_eq!(again.batch, scripts::BatchFound::AlreadySettled);

    // A batch record gone while its members are still sealed into it is lost.
    let world = World::new().await;
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let (batch, members) = sealed_batch(&world, 2, "holder", false).await;
    let _: () = redis::cmd("DEL").arg(keys.batch(0, &batch)).query_async(&mut conn).await.unwrap();
    assert_eq!(scripts::gate(&mut conn, keys, &gate_request("holder", "k2"), &members).await.unwrap(), Gate::Lost);
    let answered = scripts::settle(&mut conn, keys, 0, &batch, Settler::Answer, &sent, 3600).await.unwrap();
    assert_eq!(answered.batch, scripts::BatchFound::Missing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_counts_requests_not_looks_and_the_log_shows_them_while_sealed() {
    let world = World::new().await;
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let (batch, members) = sealed_batch(&world, 2, "holder", false).await;
    let sends = |world: &World, id: String| {
        let store = world.store.clone();
        async move { deliveries::get(&store, &id).await.unwrap().expect("a record").row.sends }
    };
    let gate = scripts::gate(&mut conn, keys, &gate_request("holder", "k2"), &members).await.unwrap();
    assert_eq!(gate, Gate::Go { sends: 1 });
    // Its slot moved: the holder looks again before the request leaves. Still one.
    let again = scripts::gate(&mut conn, keys, &gate_request("holder", "k3"), &members).await.unwrap();
    assert_eq!(again, Gate::Go { sends: 1 });
    assert_eq!(sends(&world, members[0].id()).await, 1, "the log shows the batch's requests while sealed");
    // Put back before it left (replicas behind, say): that request was never made.
    let put_back =
        Reschedule { delay_ms: 0, failed_request: false, maybe_sent: false, error: Reason::Postponed, said: None };
    scripts::reschedule(&mut conn, keys, 0, &batch, "holder", &put_back).await.unwrap();
    assert_eq!(sends(&world, members[0].id()).await, 0);
    // Sent, and timed out: one request made, one more to come.
    let _ = scripts::gate(&mut conn, keys, &gate_request("holder", "k4"), &members).await.unwrap();
    let timeout = Reschedule {
        delay_ms: 0,
        failed_request: true,
        maybe_sent: true,
        error: Reason::Provider(mailstream::model::error_name::ErrorName::Timeout),
        said: None,
    };
    scripts::reschedule(&mut conn, keys, 0, &batch, "holder", &timeout).await.unwrap();
    assert_eq!(
        scripts::gate(&mut conn, keys, &gate_request("holder", "k5"), &members).await.unwrap(),
        Gate::Go { sends: 2 }
    );
    assert_eq!(sends(&world, members[1].id()).await, 2);
    let sent: Vec<Settlement<'_>> =
        members.iter().map(|m| Settlement { member: m, verdict: Verdict::Sent("re_1".into()) }).collect();
    scripts::settle(&mut conn, keys, 0, &batch, Settler::Answer, &sent, 3600).await.unwrap();
    let record = delivery(&world.store, &members[0].id()).await;
    assert_eq!((record["state"].as_str(), record["sends"].as_str()), ("sent", "2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_look_that_ends_the_batch_takes_back_the_request_never_made() {
    let world = World::new().await;
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let (batch, members) = sealed_batch(&world, 2, "holder", false).await;
    // One request that may have been processed (a timeout), then a second one gated.
    let _ = scripts::gate(&mut conn, keys, &gate_request("holder", "k2"), &members).await.unwrap();
    let timeout = Reschedule {
        delay_ms: 0,
        failed_request: true,
        maybe_sent: true,
        error: Reason::Provider(mailstream::model::error_name::ErrorName::Timeout),
        said: None,
    };
    scripts::reschedule(&mut conn, keys, 0, &batch, "holder", &timeout).await.unwrap();
    assert_eq!(
        scripts::gate(&mut conn, keys, &gate_request("holder", "k3"), &members).await.unwrap(),
        Gate::Go { sends: 2 }
    );
    // Before it leaves a member unsubscribes, and the second look withholds the batch:
    // one request was made, not two.
    let mut leaving = partition_0_subscribers(&world, 2).await.remove(1);
    leaving.subscribed = false;
    subscribers::upsert(&world.store, std::slice::from_ref(&leaving)).await.unwrap();
    let look = scripts::gate(&mut conn, keys, &gate_request("holder", "k4"), &members).await.unwrap();
    assert_eq!(look, Gate::Withhold { reasons: vec![None, Some(Reason::Unsubscribed)] });
    let unknown: Vec<Settlement<'_>> =
        members.iter().map(|m| Settlement { member: m, verdict: Verdict::Unknown(Reason::Withheld) }).collect();
    scripts::settle(&mut conn, keys, 0, &batch, Settler::Holder("holder"), &unknown, 3600).await.unwrap();
    let record = delivery(&world.store, &members[0].id()).await;
    assert_eq!((record["state"].as_str(), record["sends"].as_str()), ("outcome_unknown", "1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suppression_left_halfway_is_finished_by_its_retry_unless_lifted_since() {
    let world = World::with(Default::default(), |c| {
        c.redis.partitions = 4;
        c.webhook.transient_bounces_to_suppress = 2;
    })
    .await;
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let everywhere = |address: &str| {
        let (store, hash) = (world.store.clone(), keys.address(address).hash);
        async move {
            let mut conn = store.conn().await.unwrap();
            let mut found = Vec::new();
            for p in 0..store.keys.partitions() {
                let there: bool = redis::cmd("HEXISTS")
                    .arg(store.keys.suppressed(p))
                    .arg(&hash)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                found.push(there);
            }
            found
        }
    };
    // The second transient bounce reaches the threshold; the listener dies after
    // suppress.lua, before any partition's cascade. Resend retries the event.
    let flaky = "delivered+flaky@resend.dev";
    suppression::apply(&world.store, &world.config, flaky, Act::CountTransient, Some("evt-t1")).await.unwrap();
    let address = keys.address(flaky);
    let step = |event: &'static str, mode| scripts::Suppression {
        mode,
        reason: "transient_bounces",
        source: "webhook",
        event,
        seen_ttl_secs: 3600,
        transient_window_ms: 86_400_000,
        transient_threshold: 2,
    };
    let (state, _) =
        scripts::suppress(&mut conn, keys, &address, &step("evt-t2", scripts::SuppressMode::Transient)).await.unwrap();
    assert_eq!(state, scripts::Suppressed::New);
    assert_eq!(everywhere(flaky).await, [false; 4]);
    suppression::apply(&world.store, &world.config, flaky, Act::CountTransient, Some("evt-t2")).await.unwrap();
    assert_eq!(everywhere(flaky).await, [true; 4], "the retried event finished the cascade");

    // A permanent bounce left halfway, then lifted by an operator: its retry changes nothing.
    let gone = "delivered+lifted@resend.dev";
    let address = keys.address(gone);
    scripts::suppress(&mut conn, keys, &address, &step("evt-b1", scripts::SuppressMode::Suppress)).await.unwrap();
    suppression::apply(&world.store, &world.config, gone, Act::Lift, None).await.unwrap();
    suppression::apply(&world.store, &world.config, gone, Act::Suppress(Why::Bounced), Some("evt-b1")).await.unwrap();
    assert_eq!(everywhere(gone).await, [false; 4], "the lift stands");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taker_that_knows_a_request_may_have_left_is_withheld_though_a_failover_forgot() {
    let world = World::new().await;
    let (keys, mut conn) = (&world.store.keys, world.store.conn().await.unwrap());
    let (batch, members) = sealed_batch(&world, 2, "holder", true).await;
    // The holder's request timed out after the provider may have sent it; it is taken
    // back (marked maybe sent), and then a failover takes the record's mark back: the
    // record says 'sending', not maybe sent, as the replica had it after the gate's WAIT.
    let timeout = Reschedule {
        delay_ms: 0,
        failed_request: true,
        maybe_sent: true,
        error: Reason::Provider(mailstream::model::error_name::ErrorName::Timeout),
        said: None,
    };
    scripts::reschedule(&mut conn, keys, 0, &batch, "holder", &timeout).await.unwrap();
    let Take::Take { maybe_sent: true, .. } =
        scripts::take(&mut conn, keys, 0, &batch, "holder", 60_000, 3_600_000).await.unwrap()
    else {
        panic!("taken back, maybe sent")
    };
    let _: () = redis::cmd("HSET")
        .arg(keys.batch(0, &batch))
        .arg("maybe_sent")
        .arg(0)
        .arg("state")
        .arg("sending")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut leaving = partition_0_subscribers(&world, 2).await.remove(1);
    leaving.subscribed = false;
    subscribers::upsert(&world.store, std::slice::from_ref(&leaving)).await.unwrap();
    // The record alone would re-seal the other member under a new key: a second send.
    // What the holder knows withholds the batch, and is written back.
    let request = GateRequest { maybe_sent: true, ..gate_request("holder", "k2") };
    let look = scripts::gate(&mut conn, keys, &request, &members).await.unwrap();
    assert_eq!(look, Gate::Withhold { reasons: vec![None, Some(Reason::Unsubscribed)] });
    let marked: String =
        redis::cmd("HGET").arg(keys.batch(0, &batch)).arg("maybe_sent").query_async(&mut conn).await.unwrap();
    assert_eq!(marked, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_gates_rule_is_the_kicks_and_the_claims() {
    // gate.lua's `unwanted` (lua/prelude.lua) and subscribers::Unwanted, on every record.
    let world = World::new().await;
    let mut conn = world.store.conn().await.unwrap();
    let script = format!(
        "{}\nlocal function arg(i) if ARGV[i] == '' then return nil end return ARGV[i] end\n\
         return unwanted(arg(1), arg(2), arg(3), arg(4), arg(5))",
        mailstream::store::scripts::PRELUDE
    );
    for bits in 0u8..32 {
        let on = |i: u8| bits & (1 << i) != 0;
        let (exists, entitled, subscribed, suppressed, off) = (on(0), on(1), on(2), on(3), on(4));
        let rust = subscribers::Unwanted::of(exists, entitled, subscribed, suppressed, off)
            .map(|u| u.reason().as_str().to_string())
            .unwrap_or_default();
        let lua: String = redis::cmd("EVAL")
            .arg(&script)
            .arg(0)
            .arg(if exists { "a@acme.example" } else { "" })
            .arg(if entitled { "1" } else { "0" })
            .arg(if subscribed { "1" } else { "0" })
            .arg(if suppressed { "bounced" } else { "" })
            .arg(if off { "1700000000000" } else { "" })
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            lua, rust,
            "exists {exists}, entitled {entitled}, subscribed {subscribed}, suppressed {suppressed}, off {off}"
        );
    }
}
