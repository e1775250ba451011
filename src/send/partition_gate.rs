//! A partition's last gate as the queues see it: whether a batch of it is at its gate
//! (one at a time), its run of batches whose replicas did not acknowledge (`WAIT`), and
//! whether its Redis answers. A partition in either trouble is held: none of its work is
//! aimed at a request slot until the heartbeat finds its replicas acknowledging again
//! (a probe's write and `WAIT`) or its Redis answering, while the others take every slot.

use std::time::Duration;

/// A partition's last gate: whether a batch of it is at the gate, and its troubles.
#[derive(Default, Clone, Copy)]
pub(super) struct PartitionGate {
    /// A batch taken from it has not passed (or failed) its first gate yet: no other is
    /// taken, so batches never queue up behind a `WAIT` that no replica answers.
    pub(super) gating: bool,
    /// Batches its replicas did not acknowledge, in a row, with no acknowledgement since.
    pub(super) failures: u32,
    /// Its Redis did not answer: none of its work is taken until the heartbeat reaches it.
    pub(super) unreached: bool,
}

/// How long the first batch its replicas did not acknowledge waits in Redis before it
/// is due again (for any instance); it doubles with each failure in a row, up to
/// [`REPLICA_BACKOFF_MAX`].
const REPLICA_BACKOFF: Duration = Duration::from_secs(1);

/// The longest such wait.
const REPLICA_BACKOFF_MAX: Duration = Duration::from_secs(8);

impl PartitionGate {
    pub(super) fn backoff(&self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(16);
        (REPLICA_BACKOFF * 2u32.pow(doublings)).min(REPLICA_BACKOFF_MAX)
    }

    /// Whether its work may be taken now.
    pub(super) fn open(&self) -> bool {
        !self.gating && self.failures == 0 && !self.unreached
    }
}
