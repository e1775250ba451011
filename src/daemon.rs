//! The daemon: builds the rooms from the config and starts their tasks (partition
//! readers, the dispatcher, the reclaimer, the scheduler, the listeners), tells systemd when it is
//! ready and when it stops, and returns once every task has stopped.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tracing::Instrument;

use crate::model::work::Lane;
use crate::send::ctx::Failpoints;
use crate::{
    config::Config, http::private, http::public, http::server, metrics::Metrics, ops::schedule, send::ctx,
    send::dispatch, send::queue, send::read, send::reclaim, shutdown, shutdown::Shutdown, store,
};

/// Sockets the daemon serves on, bound by the caller (tests bind port 0): private
/// (metrics and admin) and public (webhooks, unsubscribe).
#[derive(Default)]
pub struct Listeners {
    pub metrics: Option<TcpListener>,
    pub public: Option<TcpListener>,
}

impl Listeners {
    /// Binds what the config asks for.
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let retry = Duration::from_secs(config.http.bind_retry_seconds);
        let metrics = server::bind(config.http.metrics_listen, "metrics", retry).await?;
        Ok(Listeners { metrics, public: server::bind(config.http.public_listen, "public", retry).await? })
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
    /// Consumer name (and lease owner prefix); `host-$MAILSTREAM_INSTANCE` when `None`.
    pub owner: Option<String>,
    pub failpoints: Failpoints,
}

/// Runs the daemon until `shutdown`: partition readers, the dispatcher, the
/// reclaimer and `/metrics`. Returns once every task has stopped.
pub async fn run(config: Config, listeners: Listeners, shutdown: Shutdown) -> anyhow::Result<()> {
    run_with(config, listeners, shutdown, RunOptions::default()).await
}

/// [`run`] with options.
pub async fn run_with(config: Config, listeners: Listeners, shutdown: Shutdown, o: RunOptions) -> anyhow::Result<()> {
    let checked = check(&config, o.seed).await?;
    serve(config, checked, listeners, shutdown, o).await
}

/// What the checks a daemon starts with found, and what they built.
pub struct Checked {
    /// Redis's persistence may lose a seal, and `redis.durability = "relaxed"` accepts it.
    relaxed: bool,
    renderer: crate::audience::render::Renderer,
    sender: crate::send::request::Sender,
}

/// Everything a daemon refuses to start on, checked before it writes anything (a
/// refused start leaves Redis as it was): the config, Redis's version and persistence,
/// the deployment's layout and partition count, the templates, the Resend key.
pub async fn check(config: &Config, seed: Option<u64>) -> anyhow::Result<Checked> {
    config.validate()?;
    let relaxed = store::Store::check_for_daemon(config).await?;
    let renderer = crate::audience::render::Renderer::of(config).context("compiling templates")?;
    let sender = crate::send::request::Sender::from_config(config, seed)?;
    Ok(Checked { relaxed, renderer, sender })
}

/// Runs the daemon a [`check`] passed: claims the deployment (its meta, its streams'
/// groups), loads the scripts, and serves until `shutdown`.
pub async fn serve(
    config: Config,
    checked: Checked,
    listeners: Listeners,
    shutdown: Shutdown,
    o: RunOptions,
) -> anyhow::Result<()> {
    let Checked { relaxed, renderer, sender } = checked;
    let store = store::Store::open_for_daemon(&config).await?;
    let scripts =
        store::scripts::load_all(&mut store.conn().await?).await.context("loading the Lua scripts into Redis")?;
    let batcher = Arc::new(queue::Batcher::from_config(&config));
    let consumer_name = o.owner.unwrap_or_else(ctx::consumer_from_env);
    let ctx =
        Arc::new(ctx::Ctx::new(config, store, consumer_name, o.metrics.unwrap_or_default(), o.failpoints, &shutdown));
    ctx.metrics.set_durability_relaxed(relaxed);
    ctx.metrics.configure(&ctx.config);
    let (c, owner) = (&ctx.config, &ctx.owner);
    tracing::info!(
        %owner,
        partitions = c.redis.partitions,
        rps = c.resend.requests_per_second,
        scripts,
        "mailstream running"
    );
    tracing::info!(features = %c.features(), "features");
    // Redis answered, the scripts are loaded, the listeners were bound before `run`.
    ctx.notify.ready(&format!(
        "running as {owner}: {} partitions, {} requests/s",
        c.redis.partitions, c.resend.requests_per_second
    ));
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(listener) = listeners.metrics {
        tasks.spawn(private::serve(&ctx, listener, shutdown.clone()));
    }
    let email_reader = Arc::new(read::EmailReader::new(ctx.clone(), renderer, batcher.clone())?);
    let app = crate::channels::app::AppChannel::from_ctx(&ctx)?;
    let push = crate::channels::push::PushChannel::from_ctx(&ctx)?;
    for p in 0..c.redis.partitions {
        for lane in Lane::EMAIL {
            let reader = tracing::info_span!("reader", partition = p, lane = lane.as_str());
            tasks.spawn(email_reader.clone().read_partition(p, lane).instrument(reader));
        }
        // The application channel's own readers, with their own connections and requests.
        if let Some(app) = &app {
            let reader = tracing::info_span!("reader", partition = p, lane = Lane::App.as_str());
            tasks.spawn(crate::channels::read_partition(app.clone(), p).instrument(reader));
        }
        // And the Web Push channel's.
        if let Some(push) = &push {
            let reader = tracing::info_span!("reader", partition = p, lane = Lane::Push.as_str());
            tasks.spawn(crate::channels::read_partition(push.clone(), p).instrument(reader));
        }
    }
    let tick = o.reclaim_every.unwrap_or((c.lease() / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)));
    let reclaimer = reclaim::Reclaimer { ctx: ctx.clone(), reader: email_reader, batcher: batcher.clone() };
    tasks.spawn(reclaimer.run(tick));
    tasks.spawn(schedule::Scheduler::new(ctx.clone()).run(Duration::from_secs(1)));
    tasks.spawn(Arc::new(dispatch::Dispatcher::new(&ctx, batcher, sender)).run(ctx.clone()));
    let mut down = shutdown.clone();
    let notify = ctx.notify;
    tasks.spawn(async move {
        down.wait().await;
        notify.stopping();
    });
    // The public listener outlives the drain: events and unsubscribes are not lost to a stop.
    let (public_stop, public_down) = shutdown::channel();
    let public = listeners.public.map(|listener| tokio::spawn(public::serve(&ctx, listener, public_down)));
    shutdown::join_all(tasks).await;
    public_stop.trigger();
    if let Some(public) = public {
        let _ = public.await;
    }
    Ok(())
}
