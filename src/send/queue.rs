//! The batcher: queues, and which partition may be served. Rendered emails
//! wait in per-lane, per-partition queues (a batch is sealed within one
//! partition, so its Lua scripts touch one hash slot); each request slot
//! takes up to `batch_size` emails of one partition, so under backlog every
//! slot carries a full batch. Transactional emails go first (their batch's
//! spare room filled with digest emails of the same partition), then batches
//! due for a resend, then digests.
//! Bounded queues push back on the readers (each lane has its own room, so a
//! digest backlog never holds a receipt's reader back). Pacing is dispatch's.
//! One batch of a partition passes its last gate at a time. A partition whose
//! replicas did not acknowledge a batch is held: none of its work is taken until
//! its backoff has passed, then one batch tries again, while the other
//! partitions' work takes every slot.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::model::work::{DeliveryRef, Lane, Ready, Sealed, Work};
use crate::send::partition_gate::{PartitionGate, REPLICA_BACKOFF_MAX};

/// A batch in hand, for as long as this lives ([`Batcher::hold`]).
pub(crate) struct InHand {
    batcher: Arc<Batcher>,
    batch: String,
}

impl Drop for InHand {
    fn drop(&mut self) {
        self.batcher.in_hand.lock().expect("batcher lock").remove(&self.batch);
    }
}

/// Queues between the readers and the request slots, and the batches in hand.
pub(crate) struct Batcher {
    batch_size: usize,
    queues: Mutex<Queues>,
    changed: Notify,
    /// Free places per lane and partition queue; readers wait here when sending falls behind.
    space: [Vec<Semaphore>; 2],
    /// Set at shutdown: nothing more is queued (pushers get their items back).
    closed: AtomicBool,
    /// Sealed batches this instance is sending or waiting to send, by id: their leases
    /// are renewed, and the reclaimer leaves them alone.
    in_hand: Mutex<HashMap<String, u16>>,
}

struct Queues {
    /// Per lane, per partition: emails with the time they were queued.
    fresh: [Vec<VecDeque<(Instant, Ready)>>; 2],
    resend: VecDeque<Sealed>,
    /// Per partition: its gate, and replicas that did not acknowledge.
    gates: Vec<PartitionGate>,
}

/// Everything that was queued, handed back at a stop or a pause.
pub(crate) struct Drained {
    /// Claimed emails, per partition.
    pub fresh: Vec<(u16, Vec<Ready>)>,
    /// Sealed batches that were waiting to be resent.
    pub resend: Vec<Sealed>,
}

impl Batcher {
    /// The queues `config` asks for: room for two batches or one read per partition.
    pub(crate) fn from_config(config: &crate::config::Config) -> Batcher {
        let size = config.resend.batch_size;
        Batcher::new(config.redis.partitions, size, (2 * size).max(config.delivery.read_count))
    }

    /// `capacity` emails may wait per partition (at least one full read and one batch).
    pub fn new(partitions: u16, batch_size: usize, capacity: usize) -> Batcher {
        Batcher {
            batch_size,
            queues: Mutex::new(Queues {
                fresh: [(); 2].map(|_| (0..partitions).map(|_| VecDeque::new()).collect()),
                resend: VecDeque::new(),
                gates: vec![PartitionGate::default(); usize::from(partitions)],
            }),
            changed: Notify::new(),
            space: [(); 2].map(|_| (0..partitions).map(|_| Semaphore::new(capacity)).collect()),
            closed: AtomicBool::new(false),
            in_hand: Mutex::new(HashMap::new()),
        }
    }

    /// Queues emails of partition `p` in `lane`, waiting for room; gives them back once closed.
    pub async fn push(&self, p: u16, lane: Lane, items: Vec<Ready>) -> Result<(), Vec<Ready>> {
        if items.is_empty() {
            return Ok(());
        }
        match self.space[lane.index()][usize::from(p)].acquire_many(items.len() as u32).await {
            Ok(permits) => permits.forget(),
            Err(_) => return Err(items),
        }
        self.enqueue(p, lane, items)
    }

    /// Queues emails of partition `p` in `lane` if there is room now; gives them back if not.
    pub(crate) fn try_push(&self, p: u16, lane: Lane, items: Vec<Ready>) -> Result<(), Vec<Ready>> {
        if items.is_empty() {
            return Ok(());
        }
        match self.space[lane.index()][usize::from(p)].try_acquire_many(items.len() as u32) {
            Ok(permits) => permits.forget(),
            Err(_) => return Err(items),
        }
        self.enqueue(p, lane, items)
    }

    fn enqueue(&self, p: u16, lane: Lane, items: Vec<Ready>) -> Result<(), Vec<Ready>> {
        debug_assert!(items.iter().all(|r| r.delivery.lane() == lane), "one lane per push");
        let mut q = self.queues.lock().expect("batcher lock");
        // Checked under the lock `drain` takes, so nothing lands after the last drain.
        if self.closed.load(Ordering::SeqCst) {
            return Err(items);
        }
        let now = Instant::now();
        q.fresh[lane.index()][usize::from(p)].extend(items.into_iter().map(|r| (now, r)));
        drop(q);
        self.changed.notify_one();
        Ok(())
    }

    /// Queues a sealed batch for resending; gives it back once closed (stopping: the
    /// caller puts it back in Redis, so another instance need not wait out its lease).
    pub(crate) fn push_resend(&self, sealed: Sealed) -> Result<(), Sealed> {
        let mut q = self.queues.lock().expect("batcher lock");
        // Checked under the lock `drain` takes, so nothing lands after the last drain.
        if self.closed.load(Ordering::SeqCst) {
            return Err(sealed);
        }
        q.resend.push_back(sealed);
        drop(q);
        self.changed.notify_one();
        Ok(())
    }

    /// Stops queueing: waiting and later pushes get their items back.
    pub(crate) fn close(&self) {
        let _q = self.queues.lock().expect("batcher lock");
        self.closed.store(true, Ordering::SeqCst);
        for s in self.space.iter().flatten() {
            s.close();
        }
    }

    /// Takes everything queued (to hand it back to Redis).
    pub(crate) fn drain(&self) -> Drained {
        let mut q = self.queues.lock().expect("batcher lock");
        let mut fresh = Vec::new();
        for (lane, queues) in q.fresh.iter_mut().enumerate() {
            for (p, queue) in queues.iter_mut().enumerate() {
                if !queue.is_empty() {
                    let items: Vec<Ready> = queue.drain(..).map(|(_, r)| r).collect();
                    self.space[lane][p].add_permits(items.len());
                    fresh.push((p as u16, items));
                }
            }
        }
        Drained { fresh, resend: q.resend.drain(..).collect() }
    }

    /// Emails and batches waiting.
    #[cfg(test)]
    fn queued(&self) -> (usize, usize) {
        let q = self.queues.lock().expect("batcher lock");
        (q.fresh.iter().flatten().map(VecDeque::len).sum(), q.resend.len())
    }

    /// The deliveries waiting in partition `p`'s queues (claimed by this instance).
    pub fn claimed(&self, p: u16) -> Vec<DeliveryRef> {
        let q = self.queues.lock().expect("batcher lock");
        q.fresh.iter().flat_map(|lane| lane[usize::from(p)].iter()).map(|(_, r)| r.delivery.clone()).collect()
    }

    /// Free places in partition `p`'s queue of `lane`.
    pub fn room(&self, p: u16, lane: Lane) -> usize {
        self.space[lane.index()][usize::from(p)].available_permits()
    }

    /// Marks a sealed batch as in hand (being sent, or waiting for its slot) until the
    /// returned guard is dropped: whatever becomes of it (sent, put back, given up, the
    /// task aborted), its lease stops being renewed then.
    pub fn hold(self: &Arc<Self>, batch: &str, p: u16) -> InHand {
        self.in_hand.lock().expect("batcher lock").insert(batch.to_string(), p);
        InHand { batcher: self.clone(), batch: batch.to_string() }
    }

    /// The batches of partition `p` this instance holds: in hand, or queued for a resend
    /// (which may wait long: while the provider is down, only the probe leaves). The
    /// heartbeat renews their leases.
    pub(crate) fn in_hand(&self, p: u16) -> Vec<String> {
        let mut held: Vec<String> = {
            let held = self.in_hand.lock().expect("batcher lock");
            held.iter().filter(|(_, q)| **q == p).map(|(b, _)| b.clone()).collect()
        };
        let q = self.queues.lock().expect("batcher lock");
        held.extend(q.resend.iter().filter(|s| s.partition == p).map(|s| s.id.clone()));
        held
    }

    /// Whether this instance already has the batch: queued for a resend, or in hand.
    pub fn has(&self, batch: &str) -> bool {
        self.in_hand.lock().expect("batcher lock").contains_key(batch)
            || self.queues.lock().expect("batcher lock").resend.iter().any(|s| s.id == batch)
    }

    /// Waits until there is something to send (in a partition that is not held and has
    /// no batch at its gate).
    pub(crate) async fn wait_for_work(&self) {
        loop {
            let notified = self.changed.notified();
            let held_until = {
                let q = self.queues.lock().expect("batcher lock");
                let now = Instant::now();
                let waiting = |p: usize| {
                    q.resend.iter().any(|s| usize::from(s.partition) == p) || q.fresh.iter().any(|l| !l[p].is_empty())
                };
                let mut held_until: Option<Instant> = None;
                for (p, t) in q.gates.iter().enumerate() {
                    if !waiting(p) {
                        continue;
                    }
                    if t.open(now) {
                        return;
                    }
                    // A gate passed or failed says so; a hold ends by the clock.
                    if let Some(until) = t.until.filter(|_| t.holds(now)) {
                        held_until = Some(held_until.map_or(until, |u| u.min(until)));
                    }
                }
                held_until
            };
            match held_until {
                None => notified.await,
                Some(until) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(until) => {}
                    }
                }
            }
        }
    }

    /// Partition `p`'s replicas did not acknowledge a batch: none of its work is taken
    /// for the returned backoff (the batch goes back to Redis due then). True as well
    /// when this begins a run of such failures.
    pub(crate) fn replicas_failed(&self, p: u16) -> (Duration, bool) {
        let mut q = self.queues.lock().expect("batcher lock");
        let t = &mut q.gates[usize::from(p)];
        t.failures += 1;
        let backoff = t.backoff();
        t.until = Some(Instant::now() + backoff);
        (backoff, t.failures == 1)
    }

    /// Partition `p`'s replicas acknowledged a batch: its work is taken again at once.
    /// True when this ends a run of failures.
    pub(crate) fn replicas_acknowledged(&self, p: u16) -> bool {
        let mut q = self.queues.lock().expect("batcher lock");
        let t = &mut q.gates[usize::from(p)];
        let ended = t.failures > 0;
        (t.failures, t.until) = (0, None);
        drop(q);
        if ended {
            self.changed.notify_one();
        }
        ended
    }

    /// The batch taken from partition `p` is done with its first gate (passed, failed,
    /// or never sealed): another may be taken.
    pub(crate) fn gate_done(&self, p: u16) {
        self.queues.lock().expect("batcher lock").gates[usize::from(p)].gating = false;
        self.changed.notify_one();
    }

    /// Whether partition `p` is in a run of unacknowledged batches on this instance:
    /// held, or tried within the longest backoff (an instance with no more work for it
    /// stops saying so then).
    pub(crate) fn unreplicated(&self, p: u16) -> bool {
        let q = self.queues.lock().expect("batcher lock");
        let t = &q.gates[usize::from(p)];
        t.failures > 0 && t.until.is_some_and(|until| Instant::now() < until + REPLICA_BACKOFF_MAX)
    }

    /// Takes the next request's worth: transactional emails first (the partition that
    /// has waited longest, whatever its size: a receipt does not wait for a full
    /// batch), then a resend, else up to `batch_size` digest emails of one partition:
    /// the one waiting longest among those with a full batch, or, when none has, the
    /// one waiting longest. Oldest-first keeps every partition moving under backlog
    /// (the fullest-first rule let one partition that refilled within a slot take
    /// every slot, while the others' leases ran out). A partition with a batch at its
    /// gate, or held, is passed over; once its backoff has passed, the one batch taken
    /// from it is its try.
    pub fn take(&self) -> Option<Work> {
        let mut q = self.queues.lock().expect("batcher lock");
        let now = Instant::now();
        let open: Vec<bool> = q.gates.iter().map(|t| t.open(now)).collect();
        let oldest = |queues: &[VecDeque<(Instant, Ready)>], full: bool| {
            queues
                .iter()
                .enumerate()
                .filter(|&(p, f)| open[p] && if full { f.len() >= self.batch_size } else { !f.is_empty() })
                .min_by_key(|(_, f)| f.front().map(|(at, _)| *at))
                .map(|(p, _)| p)
        };
        let (tx, digest) = (Lane::Transactional.index(), Lane::Digest.index());
        let p = match oldest(&q.fresh[tx], false) {
            Some(p) => p,
            None => {
                if let Some(i) = q.resend.iter().position(|s| open[usize::from(s.partition)]) {
                    let sealed = q.resend.remove(i).expect("present");
                    q.gates[usize::from(sealed.partition)].trying(now);
                    return Some(Work::Resend(sealed));
                }
                oldest(&q.fresh[digest], true).or_else(|| oldest(&q.fresh[digest], false))?
            }
        };
        q.gates[p].trying(now);
        // The partition's receipts first, the spare room filled with its digest emails:
        // a receipt costs the digest no request slot. Operator mail goes in a request of
        // its own: never beside customer mail, whose sender a fallback must not touch; so
        // does an email with attachments, which only `POST /emails` takes.
        let queue = &mut q.fresh[tx][p];
        let n = match queue.front() {
            Some((_, first)) if first.alone() => 1,
            _ => queue.iter().take(self.batch_size).take_while(|(_, r)| !r.alone()).count(),
        };
        let mut items: Vec<Ready> = queue.drain(..n).map(|(_, r)| r).collect();
        self.space[tx][p].add_permits(n);
        if !items.first().is_some_and(Ready::alone) {
            let queue = &mut q.fresh[digest][p];
            let n = queue.len().min(self.batch_size - items.len());
            items.extend(queue.drain(..n).map(|(_, r)| r));
            self.space[digest][p].add_permits(n);
        }
        Some(Work::Fresh(p as u16, items))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::model::work::{Audience, DeliveryRef};

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
        // Partition 0 has waited longest, but it is held: partition 1 takes the slots.
        assert_eq!(sizes(&b)[..3], [(1, 100); 3]);
        b.push(1, Lane::Digest, ready(100)).await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        // Its backoff passed: one batch tries again, and nothing else of it is taken
        // meanwhile, even once that try's gate is done (its answer may be a success).
        assert!(matches!(b.take(), Some(Work::Fresh(0, _))));
        b.gate_done(0);
        assert!(matches!(next(&b), Some(Work::Fresh(1, _))));
        assert!(b.take().is_none(), "partition 0 waits for its try's answer");
        // Failures in a row double the wait.
        assert_eq!(b.replicas_failed(0), (Duration::from_secs(2), false));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(matches!(b.take(), Some(Work::Fresh(0, _))));
        assert!(b.replicas_acknowledged(0), "the run ends");
        b.gate_done(0);
        assert!(!b.unreplicated(0));
        assert!(matches!(next(&b), Some(Work::Fresh(0, _))), "held no more");
        assert!(!b.replicas_acknowledged(0));
        // An instance that stops trying a partition stops saying it is in trouble.
        b.replicas_failed(0);
        assert!(b.unreplicated(0));
        tokio::time::advance(Duration::from_secs(1) + REPLICA_BACKOFF_MAX).await;
        assert!(!b.unreplicated(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_partition_s_resend_waits_and_waiting_for_work_ends_with_its_backoff() {
        let b = Arc::new(Batcher::new(2, 100, 100));
        b.replicas_failed(1);
        b.push_resend(resend_of(1, "b1")).unwrap();
        assert!(b.take().is_none(), "its partition is held");
        let waiting = {
            let b = b.clone();
            tokio::spawn(async move { b.wait_for_work().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "nothing may be taken yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        waiting.await.unwrap();
        assert!(matches!(b.take(), Some(Work::Resend(s)) if s.id == "b1"));
    }
}
