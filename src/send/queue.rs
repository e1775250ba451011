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
//! replicas did not acknowledge a batch, or whose Redis did not answer, is held: none
//! of its work is taken until the heartbeat finds it well again, while the other
//! partitions' work takes every slot.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::model::work::{DeliveryRef, Lane, Ready, Sealed, Work};
use crate::send::partition_gate::PartitionGate;

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
            {
                let q = self.queues.lock().expect("batcher lock");
                let waiting = |p: usize| {
                    q.resend.iter().any(|s| usize::from(s.partition) == p) || q.fresh.iter().any(|l| !l[p].is_empty())
                };
                // A gate passed or failed, or a partition found well again, says so.
                if q.gates.iter().enumerate().any(|(p, t)| waiting(p) && t.open()) {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Partition `p`'s replicas did not acknowledge a batch: none of its work is taken
    /// until the heartbeat finds them acknowledging; the batch goes back to Redis due after
    /// the returned backoff. True as well when this begins a run of such failures.
    pub(crate) fn replicas_failed(&self, p: u16) -> (Duration, bool) {
        let mut q = self.queues.lock().expect("batcher lock");
        let t = &mut q.gates[usize::from(p)];
        t.failures += 1;
        (t.backoff(), t.failures == 1)
    }

    /// Partition `p`'s replicas acknowledged (a batch, or the heartbeat's probe): its work
    /// is taken again at once. True when this ends a run of failures.
    pub(crate) fn replicas_acknowledged(&self, p: u16) -> bool {
        let mut q = self.queues.lock().expect("batcher lock");
        let ended = std::mem::take(&mut q.gates[usize::from(p)].failures) > 0;
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

    /// Whether partition `p` is held for replicas that did not acknowledge.
    pub(crate) fn unreplicated(&self, p: u16) -> bool {
        self.queues.lock().expect("batcher lock").gates[usize::from(p)].failures > 0
    }

    /// Partition `p`'s Redis answers (`yes`) or did not: while it does not, none of its
    /// work is taken. True when this changed.
    pub(crate) fn reachable(&self, p: u16, yes: bool) -> bool {
        let mut q = self.queues.lock().expect("batcher lock");
        let changed = std::mem::replace(&mut q.gates[usize::from(p)].unreached, !yes) == yes;
        drop(q);
        if changed && yes {
            self.changed.notify_one();
        }
        changed
    }

    pub(crate) fn unreached(&self, p: u16) -> bool {
        self.queues.lock().expect("batcher lock").gates[usize::from(p)].unreached
    }

    /// Takes the next request's worth: transactional emails first (the partition that
    /// has waited longest, whatever its size: a receipt does not wait for a full
    /// batch), then a resend, else up to `batch_size` digest emails of one partition:
    /// the one waiting longest among those with a full batch, or, when none has, the
    /// one waiting longest. Oldest-first keeps every partition moving under backlog
    /// (the fullest-first rule let one partition that refilled within a slot take
    /// every slot, while the others' leases ran out). A partition with a batch at its
    /// gate, or held, is passed over.
    pub fn take(&self) -> Option<Work> {
        let mut q = self.queues.lock().expect("batcher lock");
        let open: Vec<bool> = q.gates.iter().map(PartitionGate::open).collect();
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
                    q.gates[usize::from(sealed.partition)].gating = true;
                    return Some(Work::Resend(sealed));
                }
                oldest(&q.fresh[digest], true).or_else(|| oldest(&q.fresh[digest], false))?
            }
        };
        q.gates[p].gating = true;
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
mod tests;
