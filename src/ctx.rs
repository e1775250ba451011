//! The handles every task of a running daemon shares: config, Redis, this
//! instance's name, metrics, the shared pause, failpoints and shutdown. Rooms
//! that need more (the client, the limiter, the queues) own it themselves.

use std::sync::Arc;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::outcome::Failpoint;
use crate::pause::Pause;
use crate::shutdown::Shutdown;
use crate::store::Store;

/// What every task of a running daemon shares.
pub struct Ctx {
    pub config: Config,
    pub store: Store,
    /// This instance's consumer name and lease owner: host, pid and a random part.
    pub owner: String,
    pub metrics: Arc<Metrics>,
    /// This instance's view of the shared quota pause.
    pub pause: Pause,
    pub failpoints: Failpoints,
    /// Shutdown as every task sees it (waits that are not loops select on it).
    pub shutdown: Shutdown,
}

/// A future returned by a failpoint hook.
pub type Hold = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Hooks at the points where a crash matters. The daemon awaits the hook's future
/// before going on, so a test can freeze it right there and then abort it, as
/// `kill -9` would. Empty in production.
#[derive(Clone, Default)]
pub struct Failpoints(Option<Arc<dyn Fn(Failpoint) -> Hold + Send + Sync>>);

impl Failpoints {
    pub fn new(hook: impl Fn(Failpoint) -> Hold + Send + Sync + 'static) -> Failpoints {
        Failpoints(Some(Arc::new(hook)))
    }

    /// Passes the point `at`.
    pub async fn at(&self, at: Failpoint) {
        if let Some(hook) = &self.0 {
            hook(at).await;
        }
    }
}

/// `host-pid-xxxx`: unique per process, readable in `XINFO CONSUMERS`.
pub fn owner_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let tag: u16 = rand::random();
    format!("{host}-{}-{tag:04x}", std::process::id())
}
