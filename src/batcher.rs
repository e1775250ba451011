//! The batcher: queues only. Rendered emails wait in per-partition queues (a
//! batch is sealed within one partition, so its Lua scripts touch one hash
//! slot); each request slot takes up to `batch_size` emails of one partition,
//! so under backlog every slot carries a full batch. Batches due for a resend
//! go first. Bounded queues push back on the readers. Pacing is dispatch's.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::work::{Ready, Sealed, Work};

/// Queues between the readers and the request slots.
pub struct Batcher {
    batch_size: usize,
    queues: Mutex<Queues>,
    changed: Notify,
    /// Free places per partition queue; readers wait here when sending falls behind.
    space: Vec<Semaphore>,
}

struct Queues {
    /// Per partition: emails with the time they were queued.
    fresh: Vec<VecDeque<(Instant, Ready)>>,
    resend: VecDeque<Sealed>,
}

impl Batcher {
    /// The queues `config` asks for: room for two batches or one read per partition.
    pub fn from_config(config: &crate::config::Config) -> Batcher {
        let size = config.resend.batch_size;
        Batcher::new(config.redis.partitions, size, (2 * size).max(config.delivery.read_count))
    }

    /// `capacity` emails may wait per partition (at least one full read and one batch).
    pub fn new(partitions: u16, batch_size: usize, capacity: usize) -> Batcher {
        Batcher {
            batch_size,
            queues: Mutex::new(Queues {
                fresh: (0..partitions).map(|_| VecDeque::new()).collect(),
                resend: VecDeque::new(),
            }),
            changed: Notify::new(),
            space: (0..partitions).map(|_| Semaphore::new(capacity)).collect(),
        }
    }

    /// Queues emails of partition `p`, waiting for room.
    pub async fn push(&self, p: u16, items: Vec<Ready>) {
        if items.is_empty() {
            return;
        }
        let permits = self.space[usize::from(p)]
            .acquire_many(items.len() as u32)
            .await
            .expect("batcher semaphores are never closed");
        permits.forget();
        let now = Instant::now();
        self.queues.lock().expect("batcher lock").fresh[usize::from(p)].extend(items.into_iter().map(|r| (now, r)));
        self.changed.notify_one();
    }

    /// Queues a sealed batch for resending.
    pub fn push_resend(&self, sealed: Sealed) {
        self.queues.lock().expect("batcher lock").resend.push_back(sealed);
        self.changed.notify_one();
    }

    /// Emails and batches waiting.
    pub fn queued(&self) -> (usize, usize) {
        let q = self.queues.lock().expect("batcher lock");
        (q.fresh.iter().map(VecDeque::len).sum(), q.resend.len())
    }

    /// Free places in partition `p`'s queue.
    pub fn room(&self, p: u16) -> usize {
        self.space[usize::from(p)].available_permits()
    }

    /// Whether a batch (or its resend) is already queued here.
    pub fn has_resend(&self, batch: &str) -> bool {
        self.queues.lock().expect("batcher lock").resend.iter().any(|s| s.id == batch)
    }

    /// Waits until there is something to send.
    pub async fn wait_for_work(&self) {
        loop {
            let notified = self.changed.notified();
            {
                let q = self.queues.lock().expect("batcher lock");
                if !q.resend.is_empty() || q.fresh.iter().any(|f| !f.is_empty()) {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Takes the next request's worth: a resend first, else up to `batch_size` emails
    /// of one partition: the one waiting longest among those with a full batch, or,
    /// when none has, the one waiting longest. Oldest-first keeps every partition
    /// moving under backlog (the fullest-first rule let one partition that refilled
    /// within a slot take every slot, while the others' leases ran out).
    pub fn take(&self) -> Option<Work> {
        let mut q = self.queues.lock().expect("batcher lock");
        if let Some(sealed) = q.resend.pop_front() {
            return Some(Work::Resend(sealed));
        }
        let oldest = |full: bool| {
            q.fresh
                .iter()
                .enumerate()
                .filter(|(_, f)| if full { f.len() >= self.batch_size } else { !f.is_empty() })
                .min_by_key(|(_, f)| f.front().map(|(at, _)| *at))
                .map(|(p, _)| p)
        };
        let p = oldest(true).or_else(|| oldest(false))?;
        let queue = &mut q.fresh[p];
        let n = queue.len().min(self.batch_size);
        let items: Vec<Ready> = queue.drain(..n).map(|(_, r)| r).collect();
        self.space[p].add_permits(n);
        Some(Work::Fresh(p as u16, items))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::work::DeliveryRef;

    fn ready(n: usize) -> Vec<Ready> {
        (0..n)
            .map(|i| Ready {
                entry: format!("0-{i}"),
                delivery: DeliveryRef { id: format!("d{i}"), campaign: "c".into(), period: "p".into() },
                json: "{}".into(),
            })
            .collect()
    }

    fn sizes(b: &Batcher) -> Vec<(u16, usize)> {
        std::iter::from_fn(|| match b.take()? {
            Work::Fresh(p, items) => Some((p, items.len())),
            Work::Resend(_) => None,
        })
        .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn full_batches_first_oldest_first_never_over_the_batch_size() {
        let b = Batcher::new(3, 100, 300);
        b.push(0, ready(30)).await;
        tokio::time::advance(Duration::from_millis(1)).await;
        b.push(2, ready(250)).await;
        // Partition 2 has full batches; then partition 0's 30 have waited longest.
        assert_eq!(sizes(&b), vec![(2, 100), (2, 100), (0, 30), (2, 50)]);
        assert!(b.take().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_partition_that_refills_at_once_does_not_take_every_slot() {
        let b = Batcher::new(3, 100, 200);
        for p in 0..3 {
            b.push(p, ready(200)).await;
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        let mut served = Vec::new();
        for _ in 0..6 {
            let Some(Work::Fresh(p, items)) = b.take() else { panic!("work") };
            served.push(p);
            // Its reader refills the queue before the next slot.
            b.push(p, ready(items.len())).await;
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // Oldest first: each partition's 200 (two slots' worth) go before the refills.
        assert_eq!(served, vec![0, 0, 1, 1, 2, 2]);
    }

    #[tokio::test]
    async fn a_full_queue_holds_its_reader_back() {
        let b = Arc::new(Batcher::new(1, 100, 150));
        b.push(0, ready(100)).await;
        let pushing = {
            let b = b.clone();
            tokio::spawn(async move { b.push(0, ready(100)).await })
        };
        tokio::task::yield_now().await;
        assert!(!pushing.is_finished(), "no room for 100 more");
        assert!(matches!(b.take(), Some(Work::Fresh(0, items)) if items.len() == 100));
        pushing.await.unwrap();
        assert_eq!(b.queued(), (100, 0));
    }
}
