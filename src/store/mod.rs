//! The Redis side of a deployment: connections (one server or a cluster,
//! `conn.rs`), the key layout (`keys.rs`), the Lua scripts as typed calls
//! (`scripts.rs`), the start-up checks (Redis reachable and recent, partition
//! count and layout unchanged, durable, consumer groups), the reading of streams
//! and groups (`streams.rs`), and the few reads that span partitions (counts,
//! periods, scans).

pub mod conn;
mod counts;
mod deployment;
pub mod history;
pub mod keys;
mod pool;
pub mod records;
pub mod redis_server;
mod restamp;
pub mod scripts;
pub mod sessions;
pub mod streams;

use anyhow::{Context, bail};
use redis::AsyncCommands;
use redis::aio::ConnectionLike;

use self::conn::Backend;
pub use self::conn::Conn;
pub use self::counts::{Counts, Minute, PeriodFigures};
pub use self::deployment::NoDeployment;
use self::keys::{AUDIENCE_LAYOUT, Keys, LAYOUT, SHARED_TAIL_LAYOUT, UPGRADABLE_LAYOUTS};
use crate::config::{Config, Durability};

/// The one member of `keys::kick_window`.
const KICK_WINDOW_MEMBER: &str = "retention_s";

/// Whether a command may write (claim a fresh prefix, make its salt) or only reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// What Redis or the deployment under the prefix refuses of this config: a Redis too
/// old, a key layout or partition count other than this config's, persistence that may
/// lose a seal. A configuration problem: the CLI exits 78, and `run` starts nothing.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unfit(pub String);

/// `return Err(Unfit(format!(…)))`.
macro_rules! unfit {
    ($($arg:tt)*) => {
        return Err(Unfit(format!($($arg)*)).into())
    };
}

/// Redis could not be reached or did not answer: the dependency failed, not the request.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);

/// Whether `e` says Redis (or the way to it) failed rather than the request: a
/// command exits 69 (sysexits' EX_UNAVAILABLE) on it.
pub fn unavailable(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Unreachable>().is_some()
        || e.chain()
            .filter_map(|c| c.downcast_ref::<redis::RedisError>())
            .any(|r| r.is_io_error() || r.is_connection_refusal() || r.is_timeout() || r.is_connection_dropped())
}

/// Connections plus the key layout. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    pub keys: Keys,
    /// `redis.wait_replicas`: replicas that must hold a write before it is reported done.
    wait_replicas: u32,
}

impl Store {
    /// Connects and checks that Redis answers, in one clear error if not.
    pub async fn connect(config: &Config) -> anyhow::Result<Store> {
        Store::connect_for(config, Access::Write).await
    }

    /// [`Store::connect`]; a reader makes no salt where the deployment has none yet
    /// (then no address of it was ever hashed, and any salt finds nothing).
    async fn connect_for(config: &Config, access: Access) -> anyhow::Result<Store> {
        let r = &config.redis;
        let unreachable = || Unreachable(format!("cannot reach Redis at {}", r.url.redacted_url()));
        let backend = Backend::connect(r).await.with_context(unreachable)?;
        let keys = Keys::new(&r.prefix, r.partitions);
        let mut conn = backend.conn().await.with_context(unreachable)?;
        let _: () = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .with_context(|| Unreachable(format!("Redis at {} does not answer PING", r.url.redacted_url())))?;
        if !conn.cluster_ok().await? {
            return Err(
                Unreachable(format!("Redis Cluster at {}: not every primary answers", r.url.redacted_url())).into()
            );
        }
        // The deployment's salt for address hashes: made once, kept in meta.
        if access == Access::Write {
            let fresh: String = (0..16).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
            let _: bool = conn.hset_nx(keys.meta(), "salt", fresh).await?;
        }
        let salt: Option<String> = conn.hget(keys.meta(), "salt").await?;
        let salt = salt.unwrap_or_default();
        if access == Access::Write {
            let _: () = redis::cmd("ZADD")
                .arg(keys.kick_window())
                .arg("LT")
                .arg(config.retention().as_secs())
                .arg(KICK_WINDOW_MEMBER)
                .query_async(&mut conn)
                .await?;
        }
        Ok(Store { backend, keys: keys.with_salt(&salt), wait_replicas: r.wait_replicas })
    }

    /// The kick window's retention (seconds): `config`'s retention, or the shorter one
    /// this deployment has run with (`keys::kick_window`). A period may be kicked until its
    /// start plus this (`scripts::KickWindow`).
    pub async fn kick_window_secs(&self, config: &Config) -> anyhow::Result<u64> {
        let mut conn = self.conn().await?;
        let recorded: Option<u64> = conn.zscore(self.keys.kick_window(), KICK_WINDOW_MEMBER).await?;
        let configured = config.retention().as_secs();
        Ok(recorded.map_or(configured, |r| r.min(configured)))
    }

    /// With `redis.wait_replicas`, waits (up to a second) until that many replicas hold
    /// every write made so far on `conn` to `key`'s node: what a caller reports as done (an
    /// enqueue, an unsubscribe, a suppression, a last gate) must not be taken back by a
    /// failover. False when they do not acknowledge in time; true at once without
    /// replicas (durability then rests on `appendfsync always`).
    pub async fn replicated(&self, conn: &mut Conn, key: &str) -> anyhow::Result<bool> {
        if self.wait_replicas == 0 {
            return Ok(true);
        }
        // On the node that holds `key`, on the connection that wrote (WAIT has no key and
        // counts that connection's writes).
        let acked = conn.wait_on_node_of(key, self.wait_replicas, 1000).await?;
        Ok(acked >= self.wait_replicas)
    }

    /// Whether partition `p`'s replicas acknowledge again (the heartbeat's probe of a held
    /// partition): a write to its node, then `WAIT` up to `patience`, both on `conn` (one of
    /// the partition's own: `WAIT` blocks the connection it is sent on).
    pub async fn replicas_probe(&self, conn: &mut Conn, p: u16, patience: std::time::Duration) -> anyhow::Result<bool> {
        let key = self.keys.replicas_probe(p);
        let now = chrono::Utc::now().timestamp_millis();
        let _: () = redis::cmd("SET").arg(&key).arg(now).arg("PX").arg(60_000).query_async(conn).await?;
        let acked = conn.wait_on_node_of(&key, self.wait_replicas, crate::model::ms(patience).max(1)).await?;
        Ok(acked >= self.wait_replicas)
    }

    /// [`Store::replicated`], or an error saying the write may not survive a failover
    /// (the caller reports failure, and a retry is idempotent).
    pub async fn durable(&self, conn: &mut Conn, key: &str) -> anyhow::Result<()> {
        if !self.replicated(conn, key).await? {
            bail!(
                "Redis replicas did not acknowledge the write within a second ({} wanted): it may be lost in a \
                 failover; retry",
                self.wait_replicas
            );
        }
        Ok(())
    }

    /// A daemon's store, after [`Store::check_for_daemon`]: claims the prefix (its meta)
    /// and creates the consumer group on every stream.
    pub(crate) async fn open_for_daemon(config: &Config) -> anyhow::Result<Store> {
        let store = Store::open(config).await?;
        store.ensure_groups(&config.redis.group).await?;
        Ok(store)
    }

    /// The checks a daemon starts with, writing nothing: Redis reachable and recent, this
    /// config's layout and partition count (or a fresh prefix), persistence that keeps a
    /// seal (see `check_durability`; true when only `relaxed` lets it run).
    pub(crate) async fn check_for_daemon(config: &Config) -> anyhow::Result<bool> {
        Store::open_read(config).await?.check_durability(config).await
    }

    /// Connects and checks what every command relies on: Redis 7.0 or later, and a
    /// deployment of this layout with this partition count.
    pub async fn open(config: &Config) -> anyhow::Result<Store> {
        Store::open_for(config, Access::Write).await
    }

    /// [`Store::open`] for a command that only reads: it writes nothing, so a fresh
    /// or mistyped prefix stays empty ([`Store::deployed`] tells).
    pub async fn open_read(config: &Config) -> anyhow::Result<Store> {
        Store::open_for(config, Access::Read).await
    }

    async fn open_for(config: &Config, access: Access) -> anyhow::Result<Store> {
        let store = Store::connect_for(config, access).await?;
        store.check_version().await?;
        store.check_partitions(access).await?;
        Ok(store)
    }

    /// Redis's clock (`TIME`): the one clock for leases, pauses, periods and releases.
    pub async fn time(&self) -> anyhow::Result<chrono::DateTime<chrono::Utc>> {
        let mut conn = self.conn().await?;
        let (secs, micros) = records::redis_time(&mut conn).await?;
        let secs = i64::try_from(secs).context("Redis TIME is out of range")?;
        chrono::DateTime::from_timestamp(secs, (micros * 1000) as u32).context("Redis TIME is out of range")
    }

    /// Refuses a Redis older than 7.0 (the scripts use `EXPIRE … NX`, `XAUTOCLAIM`'s
    /// deleted ids and `ZADD … GT`), with one clear error rather than a script failing halfway.
    pub(crate) async fn check_version(&self) -> anyhow::Result<()> {
        let mut conn = self.conn().await?;
        for node in conn.primaries().await? {
            let info: String = conn.on_node(&node, redis::cmd("INFO").arg("server")).await?;
            supported_version(&info)?;
        }
        Ok(())
    }

    /// A connection for ordinary commands.
    /// Whether partition `p`'s Redis answers: one read routed to the node that serves it.
    pub async fn reach(&self, conn: &mut Conn, p: u16) -> anyhow::Result<()> {
        let _: bool = redis::cmd("EXISTS").arg(self.keys.batches(p)).query_async(conn).await?;
        Ok(())
    }

    pub async fn conn(&self) -> anyhow::Result<Conn> {
        self.backend.conn().await
    }

    /// The shared, multiplexed connection, for short commands sent by many tasks at once
    /// (never a blocking one, never a WAIT): see `Backend::shared`.
    pub async fn shared(&self) -> anyhow::Result<Conn> {
        self.backend.shared().await
    }

    /// A connection that says soon that a node is gone (see `Backend::brief`).
    pub(crate) async fn brief(&self) -> anyhow::Result<Conn> {
        self.backend.brief().await
    }

    /// A connection for writes followed by [`Store::durable`] (see `Backend::waited_conn`).
    pub async fn waited_conn(&self) -> anyhow::Result<Conn> {
        self.backend.waited_conn().await
    }

    /// A connection of its own, for blocking reads.
    pub(crate) async fn dedicated(&self) -> anyhow::Result<Conn> {
        self.backend.dedicated().await
    }

    /// Moves a deployment of one of `UPGRADABLE_LAYOUTS` to this one: from layout 2,
    /// `build_audience` (the registry's part, in `subscribers`) runs first; from layout
    /// 4, it refuses while a batch of a shared tail request is unsettled (this version
    /// would send its parts alone, and a part may have left in its shared request);
    /// from any, every suppression is written into every partition's `suppressed` hash;
    /// then every live trace of a campaign period's dedup gets layout 8's expiry
    /// (`restamp_dedup`, by `config`'s campaigns and retention); then `meta` says the new
    /// layout. Returns the layout it moved from, `None` when there was nothing to do.
    /// Refuses any other.
    pub async fn upgrade_layout<F>(&self, config: &Config, build_audience: F) -> anyhow::Result<Option<u32>>
    where
        F: AsyncFnOnce(&Store) -> anyhow::Result<()>,
    {
        let mut conn = self.conn().await?;
        let meta = self.keys.meta();
        let (layout, partitions): (Option<u32>, Option<u16>) =
            redis::cmd("HMGET").arg(&meta).arg("layout").arg("partitions").query_async(&mut conn).await?;
        // Every step below walks the partitions: with another count it would miss some.
        if let Some(have) = partitions.filter(|&have| have != self.keys.partitions()) {
            unfit!(
                "redis.partitions is {} but this deployment ({meta}) was created with {have}; set it to {have} \
                 and run `mailstream upgrade` again",
                self.keys.partitions()
            );
        }
        let from = match layout {
            Some(LAYOUT) | None => return Ok(None),
            Some(from) if UPGRADABLE_LAYOUTS.contains(&from) => from,
            Some(other) => {
                unfit!("{meta} says key layout {other}; this mailstream upgrades layouts {UPGRADABLE_LAYOUTS:?} only")
            }
        };
        if from == SHARED_TAIL_LAYOUT {
            let shared = self.unsettled_shared_batches().await?;
            if shared > 0 {
                bail!(
                    "{shared} batches of shared tail requests are unsettled; this version cannot send them. Stop \
                     kicks and ingest (and the campaigns' schedules), run a layout-4 mailstream until it has \
                     settled everything it holds, stop it, then run `mailstream upgrade` again"
                );
            }
        }
        if from == AUDIENCE_LAYOUT {
            build_audience(self).await?;
        }
        self.spread_suppressions().await?;
        self.address_unsettled_batches().await?;
        let restamped = self.restamp_dedup(config).await?;
        tracing::info!(
            periods = restamped.periods,
            keys = restamped.keys,
            "every live trace of a campaign period's dedup now expires no earlier than its kick window's end"
        );
        let _: () = conn.hset(&meta, "layout", LAYOUT).await?;
        Ok(Some(from))
    }

    /// Unsettled batches that belong to a shared tail request of layout 4 (their records
    /// name a `lead` or `riders`): the only place this version names them.
    async fn unsettled_shared_batches(&self) -> anyhow::Result<u64> {
        let mut conn = self.conn().await?;
        let mut shared = 0;
        for p in 0..self.keys.partitions() {
            let ids: Vec<String> = conn.zrange(self.keys.batches(p), 0, -1).await?;
            for id in ids {
                let (lead, riders): (Option<String>, Option<String>) = redis::cmd("HMGET")
                    .arg(self.keys.batch(p, &id))
                    .arg("lead")
                    .arg("riders")
                    .query_async(&mut conn)
                    .await?;
                shared += u64::from(lead.is_some() || riders.is_some());
            }
        }
        Ok(shared)
    }

    /// Gives each unsettled batch sealed by an earlier layout the `addresses` seal.lua now
    /// keeps (per member, the hashes of its email's addresses, read from its body), so the
    /// last gate checks them too. Returns how many batches.
    async fn address_unsettled_batches(&self) -> anyhow::Result<usize> {
        let mut conn = self.conn().await?;
        let mut done = 0;
        for p in 0..self.keys.partitions() {
            let ids: Vec<String> = conn.zrange(self.keys.batches(p), 0, -1).await?;
            for id in ids {
                let key = self.keys.batch(p, &id);
                let (body, addresses): (Option<String>, Option<String>) =
                    redis::cmd("HMGET").arg(&key).arg("body").arg("addresses").query_async(&mut conn).await?;
                let (Some(body), None) = (body, addresses) else { continue };
                let emails: Vec<serde_json::Value> = serde_json::from_str(&body)
                    .with_context(|| format!("the body of batch {id} in partition {p} is not a JSON array"))?;
                let per_member: Vec<String> = emails
                    .iter()
                    .map(|email| self.keys.address_hashes(&crate::model::work::recipients_of(email)))
                    .collect();
                let _: () = conn.hset(&key, "addresses", per_member.join(" ")).await?;
                done += 1;
            }
        }
        Ok(done)
    }

    /// Writes every suppression record into every partition's `suppressed` hash, as the
    /// cascade does for each new one (an earlier layout kept them in the address's home
    /// partition only). Returns how many addresses.
    async fn spread_suppressions(&self) -> anyhow::Result<usize> {
        let records = self.scan(&self.keys.suppressions_pattern()).await?;
        let mut conn = self.conn().await?;
        let mut suppressed: Vec<(String, String)> = Vec::with_capacity(records.len());
        for key in &records {
            let reason: Option<String> = conn.hget(key, "reason").await?;
            let hash = key.rsplit(':').next().unwrap_or_default().to_string();
            if let Some(reason) = reason.filter(|_| !hash.is_empty()) {
                suppressed.push((hash, reason));
            }
        }
        for p in 0..self.keys.partitions() {
            for chunk in suppressed.chunks(1000) {
                let _: () = conn.hset_multiple(self.keys.suppressed(p), chunk).await?;
            }
        }
        Ok(suppressed.len())
    }

    /// Records the partition count on first use and refuses a different one later:
    /// subscribers would move partitions and their dedup keys would no longer be found.
    async fn check_partitions(&self, access: Access) -> anyhow::Result<()> {
        let mut conn = self.conn().await?;
        let meta = self.keys.meta();
        let want = self.keys.partitions();
        // One read of both: instances write `layout` before `partitions`, so a meta with
        // partitions and no layout was written by mailstream 0.1, not by a racing instance.
        let (layout, existing): (Option<u32>, Option<u16>) =
            redis::cmd("HMGET").arg(&meta).arg("layout").arg("partitions").query_async(&mut conn).await?;
        match (layout, existing) {
            (Some(LAYOUT), _) | (None, None) => {}
            (Some(AUDIENCE_LAYOUT), _) => unfit!(
                "{meta} says this deployment uses key layout {AUDIENCE_LAYOUT}, from before the kick's audience index; \
                 stop every instance, run `mailstream upgrade` once (it builds the index from the \
                 subscriber records; nothing else changes), then start this version"
            ),
            (Some(SHARED_TAIL_LAYOUT), _) => unfit!(
                "{meta} says this deployment uses key layout {SHARED_TAIL_LAYOUT}, whose batches may share a request, \
                 which this version cannot send; stop kicks and ingest, let a layout-4 mailstream settle what it \
                 holds, stop every instance, run `mailstream upgrade` once, then start this version"
            ),
            (Some(7), _) => unfit!(
                "{meta} says this deployment uses key layout 7, whose settled deliveries' traces expire the \
                 retention after they settled, which can be before a period kicked early may still be kicked \
                 again; stop every instance, run `mailstream upgrade` once (it gives every live trace its \
                 period's expiry), then start this version"
            ),
            (Some(6), _) => unfit!(
                "{meta} says this deployment uses key layout 6, whose settled deliveries keep their whole record \
                 and whose dedup does not read the settled history; stop every instance, run `mailstream \
                 upgrade` once (it records the layout; records settled before it are read as they are until they \
                 expire), then start this version"
            ),
            (Some(5), _) => unfit!(
                "{meta} says this deployment uses key layout 5, from before deliveries of channels other than \
                 email; stop every instance, run `mailstream upgrade` once (it records the layout; an email \
                 delivery's keys are unchanged), then start this version"
            ),
            (Some(from), _) if UPGRADABLE_LAYOUTS.contains(&from) => unfit!(
                "{meta} says this deployment uses key layout {from}, from before every partition kept the \
                 suppressed addresses its last gate reads; stop every instance, run `mailstream upgrade` once \
                 (it copies the suppressions; nothing else changes), then start this version"
            ),
            (Some(other), _) => unfit!(
                "{meta} says this deployment uses key layout {other}, and this mailstream knows layout {LAYOUT}; \
                 run the mailstream version that wrote it"
            ),
            (None, Some(_)) => unfit!(
                "this Redis holds a deployment ({meta}) in the key layout of mailstream 0.1 (a ULID per delivery); \
                 let that version drain it (every delivery settled), then delete its keys \
                 (redis-cli --scan --pattern '{}:*' | xargs redis-cli unlink) and start again",
                self.keys.prefix()
            ),
        }
        if access == Access::Write {
            let _: bool = conn.hset_nx(&meta, "layout", LAYOUT).await?;
            let _: bool = conn.hset_nx(&meta, "partitions", want).await?;
        }
        let have: Option<u16> = conn.hget(&meta, "partitions").await?;
        if let Some(have) = have.filter(|have| *have != want) {
            unfit!(
                "redis.partitions is {want} but this deployment ({meta}) was created with {have}; \
                 changing it would re-partition subscribers and break deduplication"
            );
        }
        Ok(())
    }

    /// Checks that Redis keeps what it acknowledged: a lost seal or last-gate write
    /// could mean a batch sent twice. Without `appendonly yes` + `appendfsync always`
    /// (or `wait_replicas` replicas connected) it refuses to start, unless the operator
    /// chose `redis.durability = "relaxed"`: then it warns and returns true.
    async fn check_durability(&self, config: &Config) -> anyhow::Result<bool> {
        let mut conn = self.conn().await?;
        let wait = config.redis.wait_replicas;
        let mut problem = None;
        for node in conn.primaries().await? {
            let at = if node.is_empty() { String::new() } else { format!(" (node {node})") };
            let get = |name: &'static str| redis::cmd("CONFIG").arg("GET").arg(name).clone();
            let mut value = async |name: &'static str| -> Option<String> {
                conn.on_node::<Vec<String>>(&node, &get(name)).await.ok().and_then(|v| v.get(1).cloned())
            };
            let policy = value("maxmemory-policy").await;
            let aof = value("appendonly").await;
            let fsync = value("appendfsync").await;
            if !node.is_empty() && value("cluster-require-full-coverage").await.as_deref() == Some("yes") {
                tracing::warn!(
                    "Redis{at} runs with cluster-require-full-coverage yes: from a failed primary's failure to its \
                     replica's promotion every node refuses every key, so every partition stops, not only the \
                     failed one's: set it to no (docs/redis.md)"
                );
            }
            if policy.as_deref().is_some_and(|p| p != "noeviction") {
                tracing::warn!(
                    maxmemory_policy = policy.as_deref().unwrap_or("?"),
                    "Redis{at} may evict keys under memory pressure; an evicted record or sealed batch can mean \
                     duplicate or lost mail: set maxmemory-policy noeviction"
                );
            }
            let found = if wait > 0 {
                let info: String = conn.on_node(&node, redis::cmd("INFO").arg("replication")).await?;
                let replicas: u32 = info_field(&info, "connected_slaves").and_then(|n| n.parse().ok()).unwrap_or(0);
                (replicas < wait).then(|| {
                    format!("redis.wait_replicas is {wait} but the primary{at} has {replicas} connected replicas")
                })
            } else {
                match (aof.as_deref(), fsync.as_deref()) {
                    (Some("yes"), Some("always")) => None,
                    (Some(aof), Some(fsync)) => Some(format!(
                        "Redis{at} runs with appendonly {aof}, appendfsync {fsync}: a crash may lose acknowledged writes"
                    )),
                    _ => Some(format!("Redis{at} does not allow CONFIG GET, so its persistence cannot be checked")),
                }
            };
            problem = problem.or(found);
        }
        match (problem, config.redis.durability) {
            (None, _) => Ok(false),
            (Some(problem), Durability::Relaxed) => {
                tracing::warn!(
                    "{problem}; running anyway (redis.durability = \"relaxed\"): a lost seal can mean an email sent twice"
                );
                Ok(true)
            }
            (Some(problem), Durability::Strict) => unfit!(
                "{problem}. A lost seal can mean an email sent twice, so mailstream refuses to run: use \
                 appendonly yes with appendfsync always, or replicas with redis.wait_replicas, or accept the \
                 risk with redis.durability = \"relaxed\""
            ),
        }
    }

    /// Creates the consumer group on every partition's stream (idempotent).
    pub async fn ensure_groups(&self, group: &str) -> anyhow::Result<()> {
        let mut conn = self.conn().await?;
        for p in 0..self.keys.partitions() {
            for lane in crate::model::work::Lane::ALL {
                ensure_group(&mut conn, &self.keys.lane_stream(p, lane), group).await?;
            }
        }
        Ok(())
    }
}

/// `XGROUP CREATE ... 0 MKSTREAM` (entries added before the group existed are
/// delivered too), treating "already exists" as success.
pub(crate) async fn ensure_group(conn: &mut impl ConnectionLike, stream: &str, group: &str) -> anyhow::Result<()> {
    let created: redis::RedisResult<()> =
        redis::cmd("XGROUP").arg("CREATE").arg(stream).arg(group).arg("0").arg("MKSTREAM").query_async(conn).await;
    match created {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating consumer group {group} on {stream}")),
    }
}

/// Whether an `INFO server` reply names Redis 7.0 or later.
fn supported_version(info: &str) -> anyhow::Result<()> {
    let version = info_field(info, "redis_version").unwrap_or("unknown");
    let major: u32 = version.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    if major < 7 {
        unfit!("Redis {version} is too old: mailstream needs Redis 7.0 or later");
    }
    Ok(())
}

/// A `field:value` line of an `INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(str::trim)
}

impl Store {
    /// Every key matching `pattern` (SCAN on every primary, so Redis is never
    /// blocked; a key may appear twice if the keyspace is rehashed meanwhile).
    pub async fn scan(&self, pattern: &str) -> anyhow::Result<Vec<String>> {
        let mut conn = self.conn().await?;
        let mut out = Vec::new();
        for node in conn.primaries().await? {
            let mut cursor: u64 = 0;
            loop {
                let scan = redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).clone();
                let (next, keys): (u64, Vec<String>) = conn.on_node(&node, &scan).await?;
                out.extend(keys);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_older_than_7_is_refused_with_its_version() {
        assert!(supported_version("# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n").is_ok());
        assert!(supported_version("redis_version:7.2.4\r\n").is_ok());
        let old = supported_version("redis_version:6.2.14\r\n").unwrap_err().to_string();
        assert!(old.contains("6.2.14") && old.contains("7.0"), "{old}");
        assert!(supported_version("no version here").is_err());
    }
}
