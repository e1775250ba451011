//! mailstream delivers scheduled and transactional email through Resend,
//! exactly once in effect, as fast as the provider allows, on Redis Streams.
//! [`run`] is the daemon; `main.rs` only parses arguments and wires signals.

pub mod audience;
pub mod batcher;
pub mod config;
pub mod consumer;
pub mod dead_letters;
pub mod demo;
pub mod http;
pub mod id;
pub mod keys;
pub mod limiter;
pub mod metrics;
pub mod pause;
pub mod reclaim;
pub mod redis_server;
pub mod render;
pub mod resend;
pub mod retry;
pub mod schedule;
pub mod scripts;
pub mod sender;
pub mod shutdown;
pub mod store;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::net::TcpListener;

use crate::batcher::Batcher;
use crate::config::Config;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::pause::Pause;
use crate::render::Renderer;
use crate::resend::Client;
use crate::retry::RetryPolicy;
use crate::sender::ProviderHealth;
use crate::shutdown::Shutdown;
use crate::store::Store;

/// Sockets the daemon serves on, bound by the caller (tests bind port 0).
#[derive(Default)]
pub struct Listeners {
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// Binds what the config asks for.
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let metrics = match config.http.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on http.metrics_listen {addr}"))?,
            ),
            None => None,
        };
        Ok(Listeners { metrics })
    }
}

/// What every task of a running daemon shares.
pub(crate) struct Ctx {
    pub config: Config,
    pub store: Store,
    /// This instance's consumer name and lease owner: host, pid and a random part.
    pub owner: String,
    pub renderer: Renderer,
    pub client: Client,
    pub limiter: Limiter,
    pub batcher: Batcher,
    pub metrics: Arc<Metrics>,
    pub retry: RetryPolicy,
    pub pause: Pause,
    pub health: ProviderHealth,
    pub rng: Mutex<StdRng>,
    pub failpoints: Failpoints,
    /// Shutdown as every task sees it (waits that are not loops select on it).
    pub shutdown: Shutdown,
}

/// A future returned by a failpoint hook.
pub type Hold = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Hooks at the points where a crash matters ("claimed", "sealed", "answered",
/// "settled"). The daemon awaits the hook's future before going on, so a test can
/// freeze it right there and then abort it, as `kill -9` would. Empty in production.
#[derive(Clone, Default)]
pub struct Failpoints(Option<Arc<dyn Fn(&'static str) -> Hold + Send + Sync>>);

impl Failpoints {
    pub fn new(hook: impl Fn(&'static str) -> Hold + Send + Sync + 'static) -> Failpoints {
        Failpoints(Some(Arc::new(hook)))
    }

    /// Passes the point named `name`.
    pub async fn at(&self, name: &'static str) {
        if let Some(hook) = &self.0 {
            hook(name).await;
        }
    }
}

/// Options a test or the demo may set that the config file does not carry.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Shared metrics (the demo reads them); a fresh registry when `None`.
    pub metrics: Option<Arc<Metrics>>,
    /// How often the reclaimer looks for expired leases and due batches.
    pub reclaim_every: Option<Duration>,
    /// Seed for retry jitter (deterministic runs).
    pub seed: Option<u64>,
    /// Lease owner name; generated when `None`.
    pub owner: Option<String>,
    pub failpoints: Failpoints,
}

/// Runs the daemon until `shutdown`: partition readers, the dispatcher, the
/// reclaimer and `/metrics`. Returns once every task has stopped.
pub async fn run(config: Config, listeners: Listeners, shutdown: Shutdown) -> anyhow::Result<()> {
    run_with(config, listeners, shutdown, RunOptions::default()).await
}

/// [`run`] with options.
pub async fn run_with(
    config: Config,
    listeners: Listeners,
    shutdown: Shutdown,
    options: RunOptions,
) -> anyhow::Result<()> {
    config.validate()?;
    let api_key =
        config.resend.api_key.clone().context("no Resend API key: set RESEND_API_KEY or resend.api_key_file")?;
    let store = Store::connect(&config).await?;
    store.check_partitions().await?;
    store.ensure_groups(&config.redis.group).await?;
    store.check_durability(config.redis.wait_replicas).await?;

    let r = &config.resend;
    let client = Client::new(&r.base_url, api_key, Duration::from_secs(r.timeout_seconds))?;
    let capacity = (2 * r.batch_size).max(config.delivery.read_count);
    let lease = config.lease();
    let ctx = Arc::new(Ctx {
        owner: options.owner.clone().unwrap_or_else(owner_name),
        renderer: Renderer::new(&config).context("compiling templates")?,
        client,
        limiter: Limiter::new(r.requests_per_second, Duration::from_millis(r.pacing_guard_ms)),
        batcher: Batcher::new(config.redis.partitions, r.batch_size, capacity),
        metrics: options.metrics.clone().unwrap_or_default(),
        retry: RetryPolicy::from_config(&config.delivery),
        pause: Pause::default(),
        health: ProviderHealth::new(&r.base_url),
        rng: Mutex::new(match options.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        }),
        failpoints: options.failpoints.clone(),
        shutdown: shutdown.clone(),
        store,
        config,
    });
    tracing::info!(
        owner = %ctx.owner,
        partitions = ctx.config.redis.partitions,
        requests_per_second = ctx.config.resend.requests_per_second,
        "mailstream running"
    );

    let mut tasks = tokio::task::JoinSet::new();
    if let Some(listener) = listeners.metrics {
        let metrics = ctx.metrics.clone();
        let down = shutdown.clone();
        tasks.spawn(async move {
            http::serve(
                listener,
                move |req| {
                    let response = metrics.handle(&req);
                    async move { response }
                },
                down,
                Duration::from_secs(1),
            )
            .await
        });
    }
    for p in 0..ctx.config.redis.partitions {
        tasks.spawn(consumer::read_partition(ctx.clone(), p, shutdown.clone()));
    }
    let tick =
        options.reclaim_every.unwrap_or_else(|| (lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)));
    tasks.spawn(reclaim::run(ctx.clone(), tick, shutdown.clone()));
    let drain = Duration::from_secs(ctx.config.resend.timeout_seconds + 5);
    tasks.spawn(batcher::dispatch(ctx.clone(), shutdown.clone(), drain));

    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let (emails, batches) = ctx.batcher.queued();
    if emails > 0 || batches > 0 {
        tracing::info!(
            emails,
            batches,
            "stopped with claimed work in hand; it stays leased or sealed and is recovered by the next instance"
        );
    }
    Ok(())
}

/// `host-pid-xxxx`: unique per process, readable in `XINFO CONSUMERS`.
fn owner_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    let tag: u16 = rand::random();
    format!("{host}-{}-{tag:04x}", std::process::id())
}
