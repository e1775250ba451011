//! Requests held unanswered until a test releases them: a remote service that never
//! answers (the push service, the application endpoint) without any timing. A held
//! request waits before it is handled, so nothing of it is taken until it is released;
//! each key (a request path, an event id) counts its arrivals, held or not.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Held {
    all: bool,
    keys: HashSet<String>,
}

impl Held {
    fn holds(&self, key: &str) -> bool {
        self.all || self.keys.contains(key)
    }
}

/// What is held; clones share it.
#[derive(Clone)]
pub struct Holds {
    held: Arc<watch::Sender<Held>>,
    /// Key → requests that arrived with it.
    arrived: Arc<Mutex<HashMap<String, u64>>>,
    waiting: Arc<Mutex<u64>>,
}

impl Default for Holds {
    fn default() -> Self {
        Holds { held: Arc::new(watch::channel(Held::default()).0), arrived: Arc::default(), waiting: Arc::default() }
    }
}

/// Counts a held request out however its wait ends (released, or the client gone).
struct Waiting<'a>(&'a Mutex<u64>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        *self.0.lock().expect("waiting") -= 1;
    }
}

impl Holds {
    /// Every request from now on waits until [`Holds::release`].
    pub fn hold_all(&self) {
        self.held.send_modify(|h| h.all = true);
    }

    /// Requests with this key wait until [`Holds::release`].
    pub fn hold(&self, key: &str) {
        self.held.send_modify(|h| {
            h.keys.insert(key.to_string());
        });
    }

    /// Lets every held request go, and holds nothing more.
    pub fn release(&self) {
        self.held.send_replace(Held::default());
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> u64 {
        *self.waiting.lock().expect("waiting")
    }

    /// Requests that arrived with `key`, held or not.
    pub fn arrived(&self, key: &str) -> u64 {
        self.arrived.lock().expect("arrived").get(key).copied().unwrap_or(0)
    }

    /// Counts a request with `key` and waits while it is held.
    pub async fn pass(&self, key: &str) {
        *self.arrived.lock().expect("arrived").entry(key.to_string()).or_default() += 1;
        let mut rx = self.held.subscribe();
        if !rx.borrow().holds(key) {
            return;
        }
        *self.waiting.lock().expect("waiting") += 1;
        let _counted = Waiting(&self.waiting);
        let _ = rx.wait_for(|h| !h.holds(key)).await;
    }

    /// Polls until at least `n` requests are waiting, or `within` passes: whether they are.
    pub async fn wait_for(&self, n: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.waiting() < n {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_key_waits_until_released_and_others_pass() {
        let holds = Holds::default();
        holds.hold("b");
        holds.pass("a").await;
        let h = holds.clone();
        let held = tokio::spawn(async move { h.pass("b").await });
        assert!(holds.wait_for(1, Duration::from_secs(10)).await);
        assert!(!held.is_finished());
        holds.release();
        held.await.unwrap();
        assert_eq!((holds.arrived("a"), holds.arrived("b"), holds.waiting()), (1, 1, 0));
    }
}
