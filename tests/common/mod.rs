//! Shared set-up for the integration tests: a private redis-server per test, the
//! emulator on port 0, a config pointing at both, and the daemon in-process.

#![allow(dead_code)]

pub mod browser;
pub mod cli;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use mailstream::audience::kick;
use mailstream::audience::subscribers::{self, Subscriber};
use mailstream::config::{Config, Secret};
use mailstream::metrics::Metrics;
use mailstream::shutdown::{self, Trigger};
use mailstream::store::redis_server::{RedisCluster, RedisOptions, RedisServer};
use mailstream::store::{Counts, Store};
use mailstream::tools::emulator::{Emulator, EmulatorConfig};
use mailstream::{Listeners, RunOptions};
use tokio::task::JoinHandle;

pub const CAMPAIGN: &str = "weekly_digest";

/// The week the tests kick: the current one in the example campaign's zone (Asia/Tokyo)
/// when the test binary started, so its kick window (the retention, 35 days, from its
/// start) is open whenever the tests run.
pub static PERIOD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| week(0));

/// The ISO week `offset` weeks from the current one, in the example campaign's zone.
pub fn week(offset: i64) -> String {
    let at = chrono::Utc::now() + chrono::Duration::weeks(offset);
    let w = chrono::Datelike::iso_week(&at.with_timezone(&chrono_tz::Asia::Tokyo));
    format!("{}-W{:02}", w.year(), w.week())
}

/// The kick window of the example campaign's `period`, with `config`'s retention.
pub fn window(config: &Config, period: &str) -> mailstream::store::scripts::KickWindow {
    let c = config.campaign(CAMPAIGN).expect("the example campaign");
    kick::window_of(c, period, config.retention().as_secs()).expect("a week")
}

/// enqueue.lua's answer for items it enqueued (not refused for a closed window).
pub fn added(enqueued: mailstream::store::scripts::Enqueued) -> Vec<bool> {
    match enqueued {
        mailstream::store::scripts::Enqueued::Added(added) => added,
        closed => panic!("enqueue refused: {closed:?}"),
    }
}

/// The Redis a test world runs on: one server, or a 3-primary cluster.
pub enum Servers {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Servers {
    /// A URL to connect to (any node of a cluster).
    pub fn url(&self) -> String {
        match self {
            Servers::Single(s) => s.url(),
            Servers::Cluster(c) => c.url(),
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Servers::Single(s) => s.port(),
            Servers::Cluster(c) => c.nodes[0].port(),
        }
    }

    /// Kills and restarts the server (single servers only).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        match self {
            Servers::Single(s) => s.restart().await,
            Servers::Cluster(_) => anyhow::bail!("restart is for single servers"),
        }
    }

    pub fn cluster(&self) -> &RedisCluster {
        match self {
            Servers::Cluster(c) => c,
            Servers::Single(_) => panic!("not a cluster"),
        }
    }

    pub fn cluster_mut(&mut self) -> &mut RedisCluster {
        match self {
            Servers::Cluster(c) => c,
            Servers::Single(_) => panic!("not a cluster"),
        }
    }
}

/// A private Redis and a config for it (emulator not yet attached).
pub struct World {
    pub redis: Servers,
    pub config: Config,
    pub store: Store,
}

impl World {
    pub async fn new() -> World {
        World::with(RedisOptions::default(), |_| {}).await
    }

    pub async fn with(options: RedisOptions, tweak: impl FnOnce(&mut Config)) -> World {
        let redis = RedisServer::start(options).await.expect("redis-server starts");
        World::on(Servers::Single(redis), tweak).await
    }

    /// A world on a private 3-primary Redis Cluster (`redis.cluster = true`).
    pub async fn cluster(tweak: impl FnOnce(&mut Config)) -> World {
        World::cluster_with(0, tweak).await
    }

    /// A world on a private 3-primary Redis Cluster with `replicas` replicas per primary;
    /// every node is a seed, so a daemon starts whichever node is down.
    pub async fn cluster_with(replicas: usize, tweak: impl FnOnce(&mut Config)) -> World {
        let cluster = RedisCluster::start_with(false, replicas).await.expect("the cluster starts");
        let seeds: Vec<Secret> = cluster.nodes.iter().map(|n| Secret::new(n.url())).collect();
        World::on(Servers::Cluster(cluster), |c| {
            c.redis.cluster = true;
            c.redis.cluster_seeds = seeds;
            tweak(c)
        })
        .await
    }

    async fn on(redis: Servers, tweak: impl FnOnce(&mut Config)) -> World {
        logs();
        let mut config = Config::example();
        config.redis.url = Secret::new(redis.url());
        config.redis.partitions = 2;
        config.redis.pool_size = 16;
        config.resend.api_key = Some(Secret::new("re_test_key"));
        config.resend.base_url = "http://127.0.0.1:9".into();
        // Fast tests: a high rate, short leases and retries; a throwaway Redis.
        config.redis.durability = mailstream::config::Durability::Relaxed;
        config.resend.requests_per_second = 200;
        config.resend.timeout_seconds = 2;
        config.delivery.lease_seconds = 6;
        config.delivery.retry_base_ms = 50;
        config.delivery.retry_max_ms = 200;
        config.delivery.block_ms = 200;
        config.http.metrics_listen = None;
        // Tests kick by hand; the shipped schedule would fire by the wall clock.
        for c in &mut config.campaigns {
            c.schedule = None;
        }
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
        kick::kick_registry(&self.store, &self.config, CAMPAIGN, &PERIOD).await.expect("kick")
    }

    pub async fn counts(&self) -> Counts {
        self.store.counts(CAMPAIGN, &PERIOD).await.expect("counts")
    }

    /// Starts the daemon with this world's config.
    pub fn daemon(&self) -> Daemon {
        Daemon::start(self.config.clone(), RunOptions::default())
    }

    /// Starts another instance with this world's config, leasing as `owner`.
    pub fn daemon_as(&self, owner: &str) -> Daemon {
        Daemon::start(self.config.clone(), RunOptions { owner: Some(owner.to_string()), ..Default::default() })
    }

    /// Waits (polling Redis) until every enqueued delivery is settled.
    pub async fn settled(&self, within: Duration) -> Counts {
        let store = self.store.clone();
        eventually(within, || {
            let store = store.clone();
            async move {
                let c = store.counts(CAMPAIGN, &PERIOD).await.ok()?;
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
    pub fn start(config: Config, options: RunOptions) -> Daemon {
        Daemon::start_listening(config, options, Listeners::default())
    }

    /// A daemon serving on `listeners` (a public listener bound to port 0, say).
    pub fn start_listening(config: Config, mut options: RunOptions, listeners: Listeners) -> Daemon {
        let metrics = Arc::new(Metrics::new());
        options.metrics = Some(metrics.clone());
        options.reclaim_every.get_or_insert(Duration::from_millis(100));
        let (stop, down) = shutdown::channel();
        let task = tokio::spawn(mailstream::run_with(config, listeners, down, options));
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

/// What a delivery keeps (`id` is `campaign:period:subscriber:target`), as a record's
/// fields: its record, or its compact entry in the settled history.
pub async fn delivery(store: &Store, id: &str) -> std::collections::HashMap<String, String> {
    let d = mailstream::model::work::DeliveryRef::parse(id).expect("a delivery id");
    mailstream::ops::deliveries::kept(store, &d).await.unwrap().into_iter().collect()
}

/// Every delivery enqueued, with what it keeps: the records, then the settled history's
/// entries (as a record's fields).
pub async fn deliveries(
    store: &Store,
) -> Vec<(mailstream::model::work::DeliveryRef, std::collections::HashMap<String, String>)> {
    use mailstream::model::work::{Channel, DeliveryRef};
    let mut conn = store.conn().await.unwrap();
    let mut out = Vec::new();
    for p in 0..store.keys.partitions() {
        let keys = store.scan(&store.keys.deliveries_pattern(p)).await.unwrap();
        for key in keys {
            let fields: std::collections::HashMap<String, String> =
                redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await.unwrap();
            if fields.is_empty() {
                // Settled and compacted between the SCAN and the read: the
                // settled history scanned below holds it now.
                continue;
            }
            let id = key.split_once(":d:").unwrap().1;
            out.push((DeliveryRef::parse(id).unwrap(), fields));
        }
        // `settled:<campaign>:<period>[:<channel>]:<n>`
        let pattern = format!("{}:{{{p}}}:settled:*", store.keys.prefix());
        for key in store.scan(&pattern).await.unwrap() {
            let name = key.split_once("}:settled:").unwrap().1;
            let parts: Vec<&str> = name.split(':').collect();
            let channel = if parts.len() == 4 { parts[2].parse().unwrap() } else { Channel::Email };
            let entries: std::collections::HashMap<String, String> =
                redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await.unwrap();
            for (field, text) in entries {
                let (subscriber, target) = field.split_once(':').unwrap();
                let d = DeliveryRef::new(parts[0], parts[1], subscriber, target).on(channel);
                let entry = mailstream::store::history::HistoryEntry::parse(&text).expect("a compact entry");
                out.push((d, entry.fields().into_iter().collect()));
            }
        }
    }
    out
}

/// The delivery of `CAMPAIGN`/`PERIOD` for subscriber `sub`'s first target.
pub fn delivery_of(sub: &Subscriber) -> mailstream::model::work::DeliveryRef {
    mailstream::model::work::DeliveryRef::new(CAMPAIGN, &PERIOD, &sub.id, &sub.targets_or_default()[0])
}

/// A loopback port that stays closed while the returned socket lives: bound, so no
/// other process can take it, but never listening, so connections are refused.
pub fn closed_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    let port = socket.local_addr().expect("bound").port();
    (socket, port)
}

/// A child process whose stderr lines are collected as they come; killed if
/// dropped before it was waited for (a failing test leaves no daemon behind).
pub struct Logged {
    child: Option<std::process::Child>,
    pub lines: Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Logged {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Logged {
    /// Spawns `cmd` with stderr piped and read line by line.
    pub fn spawn(cmd: &mut std::process::Command) -> Logged {
        use std::io::BufRead;
        let mut child = cmd.stderr(std::process::Stdio::piped()).spawn().expect("spawns");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Logged { child: Some(child), lines, reader: Some(reader) }
    }

    /// Waits (polling) for a stderr line containing `needle`.
    pub async fn line_with(&self, needle: &str, within: Duration) -> Option<String> {
        eventually(within, || {
            let found = self.lines.lock().unwrap().iter().find(|l| l.contains(needle)).cloned();
            async move { found }
        })
        .await
    }

    /// Sends a signal with kill(1).
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.as_ref().expect("running").id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to end; returns its exit code and every stderr line.
    pub async fn wait(mut self) -> (Option<i32>, Vec<String>) {
        let mut child = self.child.take().expect("running");
        let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        let lines = self.lines.lock().unwrap().clone();
        (status.code(), lines)
    }
}

/// The `127.0.0.1:PORT` a daemon logged for its metrics listener.
/// The `addr` field of a log line, JSON (`"addr":"…"`) or text (`addr=…`).
pub fn logged_addr(line: &str) -> String {
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(line) {
        return json["addr"].as_str().expect("an addr field").to_string();
    }
    let at = line.find("addr=").expect("an addr field") + "addr=".len();
    line[at..].split_whitespace().next().unwrap().trim_matches('"').to_string()
}

/// `n` subscribers of partition 0, written to the registry.
pub async fn partition_0_subscribers(world: &World, n: usize) -> Vec<Subscriber> {
    let subs: Vec<_> = (0..).map(subscriber).filter(|s| world.store.keys.partition_of(&s.id) == 0).take(n).collect();
    mailstream::audience::subscribers::upsert(&world.store, &subs).await.unwrap();
    subs
}

/// Claims and seals one batch of `n` deliveries in partition 0 as `owner` (a 1 ms
/// lease, soon expired); with `sending`, also passes the last gate, as a holder does
/// right before its request leaves (so a taker knows it may have been sent).
pub async fn sealed_batch(
    world: &World,
    n: usize,
    owner: &str,
    sending: bool,
) -> (String, Vec<mailstream::model::work::DeliveryRef>) {
    let subs = partition_0_subscribers(world, n).await;
    let items: Vec<(mailstream::model::work::DeliveryRef, String)> =
        subs.iter().map(|s| (delivery_of(s), s.email.clone())).collect();
    sealed_batch_of(world, &items, window(&world.config, &PERIOD), owner, sending).await
}

/// [`sealed_batch`] of `items` (deliveries of one campaign period in partition 0, each with
/// the address its email goes to), enqueued within `window`.
pub async fn sealed_batch_of(
    world: &World,
    items: &[(mailstream::model::work::DeliveryRef, String)],
    window: mailstream::store::scripts::KickWindow,
    owner: &str,
    sending: bool,
) -> (String, Vec<mailstream::model::work::DeliveryRef>) {
    let emails: Vec<(mailstream::model::work::DeliveryRef, String)> = items
        .iter()
        .map(|(d, email)| {
            let json =
                format!(r#"{{"from":"a@acme.example","to":["{email}"],"subject":"Digest {}","text":"x"}}"#, d.period);
            (d.clone(), json)
        })
        .collect();
    sealed_batch_of_emails(world, &emails, window, owner, sending).await
}

/// [`sealed_batch_of`] with each member's email object given whole (its JSON).
pub async fn sealed_batch_of_emails(
    world: &World,
    items: &[(mailstream::model::work::DeliveryRef, String)],
    window: mailstream::store::scripts::KickWindow,
    owner: &str,
    sending: bool,
) -> (String, Vec<mailstream::model::work::DeliveryRef>) {
    let keys = &world.store.keys;
    let mut conn = world.store.conn().await.unwrap();
    let refs: Vec<mailstream::model::work::DeliveryRef> = items.iter().map(|(d, _)| d.clone()).collect();
    added(mailstream::store::scripts::enqueue(&mut conn, keys, 0, &refs, 3600, window).await.unwrap());
    let ids: Vec<String> = refs.iter().map(mailstream::model::work::DeliveryRef::id).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let claims = mailstream::store::scripts::claim(&mut conn, keys, 0, &ids, owner, 1).await.unwrap();
    assert!(claims.iter().all(|c| matches!(c, mailstream::store::scripts::Claim::Claimed { .. })));
    let members: Vec<mailstream::model::work::Ready> = items
        .iter()
        .map(|(d, json)| mailstream::model::work::Ready {
            entry: "0-1".into(),
            delivery: d.clone(),
            json: json.clone(),
            variant: None,
            audience: Default::default(),
        })
        .collect();
    let req = mailstream::store::scripts::SealRequest {
        partition: 0,
        batch: "B1",
        idempotency_key: "mailstream-B1",
        owner,
        group: "mailstream",
        lease_ms: 1,
    };
    let sealed = mailstream::store::scripts::seal(&mut conn, keys, &req, &members).await.unwrap();
    assert_eq!(sealed.len(), items.len());
    if sending {
        let limits = gate_limits(1);
        let request = mailstream::store::scripts::GateRequest {
            partition: 0,
            batch: "B1",
            owner,
            new_key: "unused",
            limits,
            maybe_sent: false,
        };
        let gate = mailstream::store::scripts::gate(&mut conn, keys, &request, &refs).await.unwrap();
        assert_eq!(gate, mailstream::store::scripts::Gate::Go { sends: 1 });
    }
    ("B1".into(), refs)
}

/// A daily cron (in the example campaign's zone, Asia/Tokyo) whose latest fire was
/// three hours ago: past a one-hour catch-up window, within the retention.
pub fn daily_three_hours_ago() -> String {
    use chrono::Timelike;
    let then = (chrono::Utc::now() - chrono::Duration::hours(3)).with_timezone(&chrono_tz::Asia::Tokyo);
    format!("{} {} * * *", then.minute(), then.hour())
}

/// Failpoints that freeze at `point` the first time it is reached (`reached` is
/// notified) until `release` is notified, or for good.
pub fn freeze_at(
    point: mailstream::model::outcome::Failpoint,
    reached: Arc<tokio::sync::Notify>,
    release: Option<Arc<tokio::sync::Notify>>,
) -> mailstream::Failpoints {
    let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
    mailstream::Failpoints::new(move |name| -> mailstream::Hold {
        if name != point || fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(async {});
        }
        let (reached, release) = (reached.clone(), release.clone());
        Box::pin(async move {
            reached.notify_one();
            match release {
                Some(release) => release.notified().await,
                None => std::future::pending().await,
            }
        })
    })
}

/// Runs a daemon on `config` until it first reaches `point`, waiting at most `within`,
/// then aborts its tasks there, as kill -9 would.
pub async fn crash_at(config: &Config, point: mailstream::model::outcome::Failpoint, within: Duration) {
    let crashing = frozen_at(config, point, None, within).await;
    crashing.task.abort();
    let _ = crashing.task.await;
}

/// A daemon held the first time it reaches `point` (waited for, up to `within`), and what
/// lets it go on.
pub async fn held_at(
    config: &Config,
    point: mailstream::model::outcome::Failpoint,
    within: Duration,
) -> (Daemon, Arc<tokio::sync::Notify>) {
    let release = Arc::new(tokio::sync::Notify::new());
    (frozen_at(config, point, Some(release.clone()), within).await, release)
}

/// A daemon started with [`freeze_at`] `point`, once it is there.
async fn frozen_at(
    config: &Config,
    point: mailstream::model::outcome::Failpoint,
    release: Option<Arc<tokio::sync::Notify>>,
    within: Duration,
) -> Daemon {
    let reached = Arc::new(tokio::sync::Notify::new());
    let options = RunOptions { failpoints: freeze_at(point, reached.clone(), release), ..Default::default() };
    let daemon = Daemon::start(config.clone(), options);
    tokio::time::timeout(within, reached.notified()).await.unwrap_or_else(|_| panic!("{point:?} is reached"));
    daemon
}

/// The last gate's limits in tests: a resend window of 23 h, deadlines of 48 h (never
/// sent) and 6 h (maybe sent), an hour's retention, and a lease of `lease_ms`.
pub fn gate_limits(lease_ms: u64) -> mailstream::store::scripts::GateLimits {
    mailstream::store::scripts::GateLimits {
        lease_ms,
        window_ms: 23 * 3_600_000,
        deadline_ms: 48 * 3_600_000,
        maybe_sent_deadline_ms: 6 * 3_600_000,
        retention_secs: 3600,
    }
}

/// A counter of a daemon's /metrics text: the lines of `name` whose labels contain
/// `containing`, summed over their label sets.
pub fn metric(text: &str, name: &str, containing: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(containing))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `body` signed as event `id` at `ts` (Unix seconds) with `secret` by Svix's own Python
/// library (`pip install svix`; `.ci/run` installs it).
pub fn svix_signed(secret: &str, id: &str, ts: i64, body: &str) -> String {
    use std::io::Write;
    let script = format!(
        "import datetime, sys\nfrom svix.webhooks import Webhook\n\
         ts = datetime.datetime.fromtimestamp({ts}, tz=datetime.timezone.utc)\n\
         sys.stdout.write(Webhook('{secret}').sign('{id}', ts, sys.stdin.read()))"
    );
    let mut python = std::process::Command::new("python3")
        .args(["-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    python.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the svix Python package is needed for this test (pip install svix): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Today (UTC, by Redis's clock): the transactional lane's period.
pub async fn today(store: &Store) -> String {
    store.time().await.unwrap().format("%Y-%m-%d").to_string()
}

/// Waits until `n` transactional deliveries of today are settled; returns the counts.
pub async fn tx_settled(store: &Store, n: u64) -> Counts {
    let day = today(store).await;
    eventually(Duration::from_secs(90), || {
        let (store, day) = (store.clone(), day.clone());
        async move {
            let c = store.counts(mailstream::model::work::TRANSACTIONAL, &day).await.ok()?;
            (c.settled() >= n).then_some(c)
        }
    })
    .await
    .expect("transactional deliveries settle")
}
