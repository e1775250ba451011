//! The batcher's choices: which partition's work takes the next slot, and when.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::model::work::{Audience, DeliveryRef};

/// A task waiting until the batcher has work it may take.
fn waiting_for_work(b: &Arc<Batcher>) -> tokio::task::JoinHandle<()> {
    let b = b.clone();
    tokio::spawn(async move { b.wait_for_work().await })
}

fn ready(n: usize) -> Vec<Ready> {
    lane_ready("c", n)
}

fn lane_ready(campaign: &str, n: usize) -> Vec<Ready> {
    (0..n)
        .map(|i| Ready {
            entry: format!("0-{i}"),
            delivery: DeliveryRef::new(campaign, "p", &format!("s{i}"), "t"),
            json: "{}".into(),
            variant: None,
            audience: Audience::Customers,
        })
        .collect()
}

/// A sealed batch of partition `p` waiting for a resend.
fn resend_of(p: u16, id: &str) -> Sealed {
    Sealed {
        partition: p,
        id: id.into(),
        key: "k".into(),
        body: Bytes::new(),
        members: Vec::new(),
        tries: 1,
        maybe_sent: false,
    }
}

/// Takes the next request's worth, its gate done at once.
fn next(b: &Batcher) -> Option<Work> {
    let work = b.take()?;
    b.gate_done(match &work {
        Work::Fresh(p, _) => *p,
        Work::Resend(sealed) => sealed.partition,
    });
    Some(work)
}

/// Each request's partition and emails.
fn sizes(b: &Batcher) -> Vec<(u16, usize)> {
    std::iter::from_fn(|| match next(b)? {
        Work::Fresh(p, items) => Some((p, items.len())),
        Work::Resend(_) => None,
    })
    .collect()
}

#[tokio::test(start_paused = true)]
async fn full_batches_first_oldest_first_never_over_the_batch_size() {
    let b = Batcher::new(3, 100, 300);
    b.push(0, Lane::Digest, ready(30)).await.unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    b.push(2, Lane::Digest, ready(250)).await.unwrap();
    // Partition 2 has full batches; then partition 0's 30 have waited longest. A
    // request never mixes partitions.
    assert_eq!(sizes(&b), vec![(2, 100), (2, 100), (0, 30), (2, 50)]);
    assert!(next(&b).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_partition_that_refills_at_once_does_not_take_every_slot() {
    let b = Batcher::new(3, 100, 200);
    for p in 0..3 {
        b.push(p, Lane::Digest, ready(200)).await.unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    let mut served = Vec::new();
    for _ in 0..6 {
        let Some(Work::Fresh(p, items)) = next(&b) else { panic!("work") };
        served.push(p);
        // Its reader refills the queue before the next slot.
        b.push(p, Lane::Digest, ready(items.len())).await.unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    // Oldest first: each partition's 200 (two slots' worth) go before the refills.
    assert_eq!(served, vec![0, 0, 1, 1, 2, 2]);
}

#[tokio::test(start_paused = true)]
async fn transactional_mail_takes_the_next_slot_before_resends_and_full_digests() {
    let b = Batcher::new(2, 100, 300);
    b.push(0, Lane::Digest, ready(300)).await.unwrap();
    b.push_resend(resend_of(1, "b1")).unwrap();
    tokio::time::advance(Duration::from_millis(5)).await;
    // A digest backlog does not hold a receipt's reader back: each lane has its room.
    b.try_push(1, Lane::Transactional, lane_ready(crate::model::work::TRANSACTIONAL, 3)).unwrap();
    let Some(Work::Fresh(1, items)) = next(&b) else { panic!("the receipts first") };
    assert!(items.len() == 3 && items.iter().all(|r| r.delivery.lane() == Lane::Transactional));
    assert!(matches!(next(&b), Some(Work::Resend(s)) if s.id == "b1"));
    assert!(matches!(next(&b), Some(Work::Fresh(0, items)) if items.len() == 100));
    // Receipts in partition 0: their batch is topped up with that partition's digest.
    b.try_push(0, Lane::Transactional, lane_ready(crate::model::work::TRANSACTIONAL, 2)).unwrap();
    let Some(Work::Fresh(0, items)) = next(&b) else { panic!("the receipts first") };
    let lanes: Vec<Lane> = items.iter().map(|r| r.delivery.lane()).collect();
    assert_eq!((lanes.len(), lanes[..2].iter().all(|l| *l == Lane::Transactional)), (100, true));
    assert_eq!(b.queued(), (102, 0));
}

#[tokio::test(start_paused = true)]
async fn an_email_with_attachments_goes_in_a_request_of_its_own() {
    let b = Batcher::new(1, 100, 300);
    b.push(0, Lane::Digest, ready(50)).await.unwrap();
    let mut tx = lane_ready(crate::model::work::TRANSACTIONAL, 3);
    tx[1].json = crate::model::work::with_attachments(&tx[1].json, r#"[{"filename":"x.pdf","content":"eA=="}]"#);
    b.try_push(0, Lane::Transactional, tx).unwrap();
    let lengths: Vec<usize> = std::iter::from_fn(|| match next(&b) {
        Some(Work::Fresh(0, items)) => Some(items.len()),
        _ => None,
    })
    .collect();
    // The receipt before it, the digest filling its room; the one with the file alone
    // (nothing beside it); then the last receipt.
    assert_eq!(lengths, [51, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn operator_mail_goes_in_a_request_of_its_own() {
    let b = Batcher::new(1, 100, 300);
    b.push(0, Lane::Digest, ready(50)).await.unwrap();
    let mut tx = lane_ready(crate::model::work::TRANSACTIONAL, 5);
    for i in [2, 3] {
        tx[i].audience = Audience::Operators;
    }
    b.try_push(0, Lane::Transactional, tx).unwrap();
    let audiences = |items: &[Ready]| items.iter().map(|r| r.audience).collect::<Vec<_>>();
    // The receipts before the first operator email, with no operator mail beside them.
    let Some(Work::Fresh(0, items)) = next(&b) else { panic!("work") };
    assert_eq!((items.len(), items[..2].iter().all(|r| r.audience == Audience::Customers)), (52, true));
    // Then each operator email alone: no receipt, no digest email with it.
    for _ in 0..2 {
        let Some(Work::Fresh(0, items)) = next(&b) else { panic!("work") };
        assert_eq!(audiences(&items), [Audience::Operators]);
    }
    let Some(Work::Fresh(0, items)) = next(&b) else { panic!("work") };
    assert_eq!((items.len(), items[0].delivery.lane()), (1, Lane::Transactional));
    assert!(next(&b).is_none());
}

#[tokio::test]
async fn a_full_queue_holds_its_reader_back() {
    let b = Arc::new(Batcher::new(1, 100, 150));
    b.push(0, Lane::Digest, ready(100)).await.unwrap();
    let pushing = {
        let b = b.clone();
        tokio::spawn(async move { b.push(0, Lane::Digest, ready(100)).await })
    };
    tokio::task::yield_now().await;
    assert!(!pushing.is_finished(), "no room for 100 more");
    assert!(matches!(next(&b), Some(Work::Fresh(0, items)) if items.len() == 100));
    pushing.await.unwrap().unwrap();
    assert_eq!(b.queued(), (100, 0));
}

#[tokio::test]
async fn a_closed_batcher_gives_items_back_and_drains() {
    let b = Arc::new(Batcher::new(2, 100, 100));
    b.push(1, Lane::Digest, ready(100)).await.unwrap();
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { b.push(1, Lane::Digest, ready(10)).await })
    };
    tokio::task::yield_now().await;
    b.close();
    assert_eq!(waiting.await.unwrap().unwrap_err().len(), 10, "a waiting pusher gets its items back");
    assert_eq!(b.try_push(0, Lane::Digest, ready(5)).unwrap_err().len(), 5);
    let drained = b.drain();
    assert_eq!(drained.fresh.len(), 1);
    assert_eq!((drained.fresh[0].0, drained.fresh[0].1.len()), (1, 100));
    assert_eq!(b.queued(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_partition_whose_replicas_did_not_acknowledge_waits_and_the_others_take_every_slot() {
    let b = Batcher::new(2, 100, 1000);
    b.push(0, Lane::Digest, ready(500)).await.unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    b.push(1, Lane::Digest, ready(500)).await.unwrap();
    assert!(matches!(b.take(), Some(Work::Fresh(0, _))));
    // One batch of a partition at its gate at a time: the next one is partition 1's.
    assert!(matches!(b.take(), Some(Work::Fresh(1, _))));
    assert!(b.take().is_none(), "both are at their gates");
    b.gate_done(1);
    assert_eq!(b.replicas_failed(0), (Duration::from_secs(1), true));
    b.gate_done(0);
    assert!(b.unreplicated(0) && !b.unreplicated(1));
    // Partition 0 has waited longest, but it is held: partition 1 takes the slots, for
    // as long as it takes: no batch of partition 0 is aimed at a slot to try it.
    assert_eq!(sizes(&b)[..3], [(1, 100); 3]);
    b.push(1, Lane::Digest, ready(100)).await.unwrap();
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(matches!(next(&b), Some(Work::Fresh(1, _))));
    assert!(b.unreplicated(0), "held until its replicas acknowledge");
    // Failures in a row double the wait of the batch put back.
    assert_eq!(b.replicas_failed(0), (Duration::from_secs(2), false));
    // The heartbeat's probe finds them acknowledging: the run ends, and its work goes.
    assert!(b.replicas_acknowledged(0), "the run ends");
    assert!(!b.unreplicated(0));
    assert!(matches!(next(&b), Some(Work::Fresh(0, _))), "held no more");
    assert!(!b.replicas_acknowledged(0));
}

#[tokio::test(start_paused = true)]
async fn a_held_partition_s_resend_waits_until_the_partition_is_well_again() {
    let b = Arc::new(Batcher::new(2, 100, 100));
    b.replicas_failed(1);
    b.push_resend(resend_of(1, "b1")).unwrap();
    assert!(b.take().is_none(), "its partition is held");
    let waiting = waiting_for_work(&b);
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(!waiting.is_finished(), "nothing may be taken yet");
    b.replicas_acknowledged(1);
    waiting.await.unwrap();
    assert!(matches!(b.take(), Some(Work::Resend(s)) if s.id == "b1"));
}

#[tokio::test(start_paused = true)]
async fn a_partition_whose_redis_did_not_answer_waits_until_it_does() {
    let b = Arc::new(Batcher::new(2, 100, 1000));
    b.push(0, Lane::Digest, ready(100)).await.unwrap();
    assert!(b.reachable(0, false), "a change");
    assert!(!b.reachable(0, false), "no change");
    assert!(b.unreached(0));
    assert!(b.take().is_none(), "its work is not aimed at a slot");
    let waiting = waiting_for_work(&b);
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    assert!(b.reachable(0, true));
    waiting.await.unwrap();
    assert!(matches!(b.take(), Some(Work::Fresh(0, _))));
}
