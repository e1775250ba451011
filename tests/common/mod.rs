//! Shared set-up for the integration tests: a private redis-server per test, the
//! emulator on port 0, a config pointing at both, and the daemon in-process.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use mailstream::config::{Config, Secret};
use mailstream::emulator::{Emulator, EmulatorConfig};
use mailstream::kick;
use mailstream::metrics::Metrics;
use mailstream::redis_server::{RedisOptions, RedisServer};
use mailstream::shutdown::{self, Trigger};
use mailstream::store::{Counts, Store};
use mailstream::subscribers::{self, Subscriber};
use mailstream::{Listeners, RunOptions};
use tokio::task::JoinHandle;

pub const CAMPAIGN: &str = "weekly_digest";
pub const PERIOD: &str = "2026-W48";

/// A private Redis and a config for it (emulator not yet attached).
pub struct World {
    pub redis: RedisServer,
    pub config: Config,
    pub store: Store,
}

impl World {
    pub async fn new() -> World {
        World::with(RedisOptions::default(), |_| {}).await
    }

    pub async fn with(options: RedisOptions, tweak: impl FnOnce(&mut Config)) -> World {
        logs();
        let redis = RedisServer::start(options).await.expect("redis-server starts");
        let mut config = Config::example();
        config.redis.url = Secret::new(redis.url());
        config.redis.partitions = 2;
        config.redis.pool_size = 16;
        config.resend.api_key = Some(Secret::new("re_test_key"));
        config.resend.base_url = "http://127.0.0.1:9".into();
        // Fast tests: a high rate, short leases and retries.
        config.resend.requests_per_second = 200;
        config.resend.timeout_seconds = 2;
        config.delivery.lease_seconds = 7;
        config.delivery.retry_base_ms = 50;
        config.delivery.retry_max_ms = 200;
        config.delivery.block_ms = 200;
        config.http.metrics_listen = None;
        tweak(&mut config);
        config.validate().expect("test config is valid");
        let store = Store::connect(&config).await.expect("store connects");
        World { redis, config, store }
    }

    /// Attaches an emulator (returned) as the config's Resend.
    pub async fn emulator(&mut self, config: EmulatorConfig) -> (Emulator, Trigger) {
        let (emulator, url, stop) = start_emulator(config).await;
        self.config.resend.base_url = url;
        (emulator, stop)
    }

    /// Writes `n` subscribers `user-000000..` with resend.dev addresses, one target each.
    pub async fn subscribers(&self, n: usize) -> Vec<Subscriber> {
        let subs: Vec<Subscriber> = (0..n).map(subscriber).collect();
        subscribers::upsert(&self.store, &subs).await.expect("upsert");
        subs
    }

    pub async fn kick(&self) -> kick::KickReport {
        kick::kick_registry(&self.store, &self.config, CAMPAIGN, PERIOD).await.expect("kick")
    }

    pub async fn counts(&self) -> Counts {
        self.store.counts(CAMPAIGN, PERIOD).await.expect("counts")
    }

    /// Starts the daemon with this world's config.
    pub fn daemon(&self) -> Daemon {
        Daemon::start(self.config.clone(), RunOptions::default())
    }

    /// Waits (polling Redis) until every enqueued delivery is settled.
    pub async fn settled(&self, within: Duration) -> Counts {
        let store = self.store.clone();
        eventually(within, || {
            let store = store.clone();
            async move {
                let c = store.counts(CAMPAIGN, PERIOD).await.ok()?;
                (c.enqueued > 0 && c.settled() >= c.enqueued).then_some(c)
            }
        })
        .await
        .unwrap_or_else(|| panic!("not settled within {within:?}"))
    }
}

/// Daemon logs in test output when `MAILSTREAM_LOG` is set (e.g. `debug`).
pub fn logs() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("MAILSTREAM_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    }
}

pub fn subscriber(i: usize) -> Subscriber {
    Subscriber::synthetic(i as u64)
}

pub async fn start_emulator(config: EmulatorConfig) -> (Emulator, String, Trigger) {
    let emulator = Emulator::new(config);
    let (url, stop, _) = emulator.spawn_local().await.unwrap();
    (emulator, url, stop)
}

/// A daemon running in-process.
pub struct Daemon {
    pub stop: Trigger,
    pub task: JoinHandle<anyhow::Result<()>>,
    pub metrics: Arc<Metrics>,
}

impl Daemon {
    pub fn start(config: Config, mut options: RunOptions) -> Daemon {
        let metrics = Arc::new(Metrics::new());
        options.metrics = Some(metrics.clone());
        options.reclaim_every.get_or_insert(Duration::from_millis(100));
        let (stop, down) = shutdown::channel();
        let task = tokio::spawn(mailstream::run_with(config, Listeners::default(), down, options));
        Daemon { stop, task, metrics }
    }

    /// Graceful stop; the daemon must end cleanly.
    pub async fn stop(self) {
        self.stop.trigger();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("daemon stops within 30 s")
            .expect("daemon task")
            .expect("daemon ends without error");
    }
}

/// Polls `check` until it yields a value or `within` passes.
pub async fn eventually<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A delivery record's fields.
pub async fn delivery(store: &Store, id: &str) -> std::collections::HashMap<String, String> {
    let mut conn = store.conn().await.unwrap();
    for p in 0..store.keys.partitions() {
        let fields: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(store.keys.delivery(p, id)).query_async(&mut conn).await.unwrap();
        if !fields.is_empty() {
            return fields;
        }
    }
    Default::default()
}

/// Every delivery id enqueued (from the dedup keys) with its record.
pub async fn deliveries(store: &Store) -> Vec<(String, std::collections::HashMap<String, String>)> {
    let mut conn = store.conn().await.unwrap();
    let mut out = Vec::new();
    for p in 0..store.keys.partitions() {
        let keys = store.scan(&format!("{}*", store.keys.delivery(p, ""))).await.unwrap();
        for key in keys {
            let fields: std::collections::HashMap<String, String> =
                redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await.unwrap();
            let id = key.rsplit(':').next().unwrap().to_string();
            out.push((id, fields));
        }
    }
    out
}
