//! Resend's idempotency store: a keyed request's body (its SHA-256: an email with a
//! 10 MB attachment is not held for a day) and answer kept for 24 hours. The same key with the same body replays the answer without sending;
//! with another body it is 409 `invalid_idempotent_request`; while the first
//! is still being processed (a hung request) it is 409 `concurrent_idempotent_requests`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Idempotency keys are kept this long, as Resend does.
pub const TTL: Duration = Duration::from_secs(24 * 3600);

/// A keyed request's answer. Until `ready_at` (a hung request still "running")
/// the same key gets 409 `concurrent_idempotent_requests`.
struct StoredAnswer {
    body: [u8; 32],
    response: Bytes,
    at: Instant,
    ready_at: Instant,
}

/// What the store says about a keyed request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Not seen: process it.
    Fresh,
    /// Seen with this body: answer this, send nothing.
    Replay(Bytes),
    /// Seen with another body.
    Mismatch,
    /// The original is still being processed.
    InFlight,
}

/// Keyed requests seen within the TTL.
#[derive(Default)]
pub(crate) struct IdempotencyStore {
    entries: HashMap<String, StoredAnswer>,
}

impl IdempotencyStore {
    /// Looks `key` up for a request with `body` arriving at `now`.
    pub(crate) fn lookup(&mut self, key: &str, body: &Bytes, now: Instant) -> Lookup {
        self.entries.retain(|_, s| now.duration_since(s.at) <= TTL);
        match self.entries.get(key) {
            None => Lookup::Fresh,
            Some(stored) if now < stored.ready_at => Lookup::InFlight,
            Some(stored) if stored.body == digest(body) => Lookup::Replay(stored.response.clone()),
            Some(_) => Lookup::Mismatch,
        }
    }

    /// Remembers the answer to a processed request; `ready_at` is when its answer leaves.
    pub fn store(&mut self, key: String, body: Bytes, response: Bytes, now: Instant, ready_at: Instant) {
        self.entries.insert(key, StoredAnswer { body: digest(&body), response, at: now, ready_at });
    }
}

fn digest(body: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(body).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_mismatch_in_flight_and_expiry() {
        let mut s = IdempotencyStore::default();
        let t0 = Instant::now();
        let body = Bytes::from_static(b"[1]");
        assert_eq!(s.lookup("k", &body, t0), Lookup::Fresh);
        s.store("k".into(), body.clone(), Bytes::from_static(b"ok"), t0, t0 + Duration::from_secs(2));
        assert_eq!(s.lookup("k", &body, t0 + Duration::from_secs(1)), Lookup::InFlight);
        let later = t0 + Duration::from_secs(3);
        assert_eq!(s.lookup("k", &body, later), Lookup::Replay(Bytes::from_static(b"ok")));
        assert_eq!(s.lookup("k", &Bytes::from_static(b"[2]"), later), Lookup::Mismatch);
        assert_eq!(s.lookup("k", &body, t0 + TTL + Duration::from_secs(1)), Lookup::Fresh);
    }
}
