//! A partition's last gate as the queues see it: whether a batch of it is at its gate
//! (one at a time), and its run of batches whose replicas did not acknowledge (`WAIT`),
//! which holds the partition's work for a backoff while the others take every slot.

use std::time::Duration;

use tokio::time::Instant;

/// A partition's last gate: whether a batch of it is at the gate, and its run of
/// batches its replicas did not acknowledge (`WAIT`).
#[derive(Default, Clone, Copy)]
pub(super) struct PartitionGate {
    /// A batch taken from it has not passed (or failed) its first gate yet: no other is
    /// taken, so batches never queue up behind a `WAIT` that no replica answers.
    pub(super) gating: bool,
    /// In a row, with no acknowledged batch between them.
    pub(super) failures: u32,
    /// None of the partition's work is taken before this.
    pub(super) until: Option<Instant>,
}

/// The first wait of a partition whose replicas did not acknowledge; it doubles with
/// each failure in a row, up to [`REPLICA_BACKOFF_MAX`].
const REPLICA_BACKOFF: Duration = Duration::from_secs(1);

/// How long a partition without the replicas it needs waits at most between tries:
/// short enough that it resumes within seconds of a replica coming back, long enough
/// that a try (a `WAIT` of up to a second, off the dispatcher's path) costs nothing.
pub(super) const REPLICA_BACKOFF_MAX: Duration = Duration::from_secs(8);

impl PartitionGate {
    pub(super) fn backoff(&self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(16);
        (REPLICA_BACKOFF * 2u32.pow(doublings)).min(REPLICA_BACKOFF_MAX)
    }

    pub(super) fn holds(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| until > now)
    }

    /// Whether its work may be taken now.
    pub(super) fn open(&self, now: Instant) -> bool {
        !self.gating && !self.holds(now)
    }

    /// A batch of the partition is taken to its gate; in trouble, it is the partition's
    /// one try, and its hold lasts until that try's answer or the next backoff.
    pub(super) fn trying(&mut self, now: Instant) {
        self.gating = true;
        if self.failures > 0 {
            self.until = Some(now + self.backoff());
        }
    }
}
