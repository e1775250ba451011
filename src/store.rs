//! The Redis side of a deployment: the connection pool, the key layout, and the
//! start-up checks (Redis reachable, partition count unchanged, consumer groups).

use std::time::Duration;

use anyhow::{Context, bail};
use deadpool_redis::{Connection, Pool};
use redis::AsyncCommands;
use redis::aio::ConnectionLike;

use crate::config::Config;
use crate::keys::Keys;

/// Pooled connections plus the key layout. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    pub keys: Keys,
}

impl Store {
    /// Builds the pool and checks that Redis answers, in one clear error if not.
    pub async fn connect(config: &Config) -> anyhow::Result<Store> {
        let r = &config.redis;
        let settings = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_millis(r.response_timeout_ms)));
        let manager = deadpool_redis::Manager::new_with_config(r.url.expose(), settings)
            .with_context(|| format!("invalid redis.url {}", r.url.redacted_url()))?;
        let pool = Pool::builder(manager)
            .max_size(r.pool_size)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()
            .context("building the Redis pool")?;
        let store = Store { pool, keys: Keys::new(&r.prefix, r.partitions) };
        let mut conn = store.conn().await.with_context(|| format!("cannot reach Redis at {}", r.url.redacted_url()))?;
        let _: () = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .with_context(|| format!("Redis at {} does not answer PING", r.url.redacted_url()))?;
        Ok(store)
    }

    /// Connects and makes the checks a daemon starts with: partition count,
    /// consumer groups, durability.
    pub async fn open_for_daemon(config: &Config) -> anyhow::Result<Store> {
        let store = Store::connect(config).await?;
        store.check_partitions().await?;
        store.ensure_groups(&config.redis.group).await?;
        store.check_durability(config.redis.wait_replicas).await?;
        Ok(store)
    }

    /// A pooled connection.
    pub async fn conn(&self) -> anyhow::Result<Connection> {
        self.pool.get().await.map_err(|e| anyhow::anyhow!("Redis connection: {e}"))
    }

    /// Records the partition count on first use and refuses a different one later:
    /// subscribers would move partitions and their dedup keys would no longer be found.
    pub async fn check_partitions(&self) -> anyhow::Result<()> {
        let mut conn = self.conn().await?;
        let meta = self.keys.meta();
        let want = self.keys.partitions();
        let _: bool = conn.hset_nx(&meta, "partitions", want).await?;
        let have: u16 = conn.hget(&meta, "partitions").await?;
        if have != want {
            bail!(
                "redis.partitions is {want} but this deployment ({meta}) was created with {have}; \
                 changing it would re-partition subscribers and break deduplication"
            );
        }
        Ok(())
    }

    /// Warns when Redis could lose what exactly-once rests on: evicted dedup keys or
    /// batches, or writes lost at a restart. (CONFIG may be disabled: then it says so.)
    pub async fn check_durability(&self, wait_replicas: u32) -> anyhow::Result<()> {
        let mut conn = self.conn().await?;
        let get = |name: &'static str| redis::cmd("CONFIG").arg("GET").arg(name).clone();
        let policy: redis::RedisResult<Vec<String>> = get("maxmemory-policy").query_async(&mut conn).await;
        let aof: redis::RedisResult<Vec<String>> = get("appendonly").query_async(&mut conn).await;
        let fsync: redis::RedisResult<Vec<String>> = get("appendfsync").query_async(&mut conn).await;
        match (policy, aof, fsync) {
            (Ok(policy), Ok(aof), Ok(fsync)) => {
                let value = |v: &[String]| v.get(1).cloned().unwrap_or_default();
                if value(&policy) != "noeviction" {
                    tracing::warn!(
                        maxmemory_policy = %value(&policy),
                        "Redis may evict keys under memory pressure; evicted dedup keys or sealed batches can mean \
                         duplicate or lost mail: set maxmemory-policy noeviction"
                    );
                }
                if wait_replicas == 0 && (value(&aof) != "yes" || value(&fsync) != "always") {
                    tracing::info!(
                        appendonly = %value(&aof),
                        appendfsync = %value(&fsync),
                        "a Redis crash may lose the last writes; for exactly-once across Redis crashes use \
                         appendonly yes with appendfsync always, or replicas with redis.wait_replicas"
                    );
                }
            }
            _ => tracing::info!("CONFIG GET is not allowed; Redis persistence and eviction settings were not checked"),
        }
        Ok(())
    }

    /// Creates the consumer group on every partition's stream (idempotent).
    pub async fn ensure_groups(&self, group: &str) -> anyhow::Result<()> {
        let mut conn = self.conn().await?;
        for p in 0..self.keys.partitions() {
            ensure_group(&mut conn, &self.keys.stream(p), group).await?;
        }
        Ok(())
    }
}

/// `XGROUP CREATE ... 0 MKSTREAM` (entries added before the group existed are
/// delivered too), treating "already exists" as success.
pub async fn ensure_group(conn: &mut impl ConnectionLike, stream: &str, group: &str) -> anyhow::Result<()> {
    let created: redis::RedisResult<()> =
        redis::cmd("XGROUP").arg("CREATE").arg(stream).arg(group).arg("0").arg("MKSTREAM").query_async(conn).await;
    match created {
        Ok(()) => Ok(()),
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating consumer group {group} on {stream}")),
    }
}

/// A campaign period's counters, summed over partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub enqueued: u64,
    pub sent: u64,
    pub failed: u64,
    pub skipped: u64,
    pub outcome_unknown: u64,
}

impl Counts {
    /// Deliveries with a final outcome.
    pub fn settled(&self) -> u64 {
        self.sent + self.failed + self.skipped + self.outcome_unknown
    }

    /// Failed over decided outcomes, `failed / (sent + failed)`: skipped (not wanted),
    /// pending (not decided) and outcome_unknown (reported beside it) are outside the
    /// denominator. `None` while nothing is decided.
    pub fn failure_rate(&self) -> Option<f64> {
        let decided = self.sent + self.failed;
        (decided > 0).then(|| self.failed as f64 / decided as f64)
    }
}

impl Store {
    /// Every key matching `pattern` (SCAN, so Redis is never blocked; a key may
    /// appear twice if the keyspace is rehashed meanwhile).
    pub async fn scan(&self, pattern: &str) -> anyhow::Result<Vec<String>> {
        let mut conn = self.conn().await?;
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            out.extend(keys);
            cursor = next;
            if cursor == 0 {
                return Ok(out);
            }
        }
    }

    /// Deletes every key under this deployment's prefix (the demo on a shared Redis).
    pub async fn delete_all(&self) -> anyhow::Result<u64> {
        let keys = self.scan(&format!("{}:*", self.keys.prefix())).await?;
        let mut conn = self.conn().await?;
        let mut removed = 0;
        for chunk in keys.chunks(1000) {
            let n: u64 = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await?;
            removed += n;
        }
        Ok(removed)
    }

    /// The counters of `campaign` for `period` (one pipelined read).
    pub async fn counts(&self, campaign: &str, period: &str) -> anyhow::Result<Counts> {
        let mut conn = self.conn().await?;
        let mut pipe = redis::pipe();
        for p in 0..self.keys.partitions() {
            pipe.hgetall(self.keys.counts(p, campaign, period));
        }
        let parts: Vec<std::collections::HashMap<String, u64>> = pipe.query_async(&mut conn).await?;
        let mut c = Counts::default();
        for part in parts {
            let get = |f: &str| part.get(f).copied().unwrap_or(0);
            c.enqueued += get("enqueued");
            c.sent += get("sent");
            c.failed += get("failed");
            c.skipped += get("skipped");
            c.outcome_unknown += get("outcome_unknown");
        }
        Ok(c)
    }
}
