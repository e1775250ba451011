//! The handles every task of a running daemon shares: config, Redis, this
//! instance's name, metrics, the shared pause and provider health, failpoints, shutdown and systemd. Rooms
//! that need more (the client, the limiter, the queues) own it themselves.

use std::sync::Arc;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::outcome::Failpoint;
use crate::send::notify::Notifier;
use crate::send::pause::{Pause, ProviderHealth};
use crate::shutdown::Shutdown;
use crate::store::Store;

/// What every task of a running daemon shares.
pub(crate) struct Ctx {
    pub config: Config,
    pub store: Store,
    /// This instance's name in the consumer group: host and instance id, stable across
    /// restarts, so `XINFO CONSUMERS` reads as the fleet does.
    pub consumer: String,
    /// This process's lease owner: the consumer name, the pid and a random part, unique
    /// per process (leases must never be shared, even by two processes misconfigured
    /// with one instance id).
    pub owner: String,
    pub metrics: Arc<Metrics>,
    /// This instance's view of the shared quota pause.
    pub pause: Pause,
    /// This instance's view of the provider's shared health.
    pub health: ProviderHealth,
    pub failpoints: Failpoints,
    /// Shutdown as every task sees it (waits that are not loops select on it).
    pub shutdown: Shutdown,
    /// systemd's notify socket (a no-op when not under systemd).
    pub notify: Notifier,
}

impl Ctx {
    /// The context of a daemon named `consumer` in its group.
    pub fn new(
        config: Config,
        store: Store,
        consumer: String,
        metrics: Arc<Metrics>,
        failpoints: Failpoints,
        shutdown: &Shutdown,
    ) -> Ctx {
        let owner = crate::model::id::owner_name(&consumer);
        let notify = Notifier::from_env();
        let health = ProviderHealth::from_config(&config);
        Ctx {
            config,
            store,
            consumer,
            owner,
            metrics,
            pause: Pause::default(),
            health,
            failpoints,
            shutdown: shutdown.clone(),
            notify,
        }
    }
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

/// The environment variable naming this instance on its host (a systemd template's `%i`).
const ENV_INSTANCE: &str = "MAILSTREAM_INSTANCE";

/// This instance's consumer name from the host name and `MAILSTREAM_INSTANCE`.
pub(crate) fn consumer_from_env() -> String {
    consumer_name(std::env::var(ENV_INSTANCE).ok().as_deref())
}

/// `host-instance`: this instance's consumer name, the same after a restart.
fn consumer_name(instance: Option<&str>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let instance: String = instance
        .unwrap_or("1")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.')
        .take(64)
        .collect();
    format!("{host}-{}", if instance.is_empty() { "1" } else { &instance })
}
