//! `[redis]`: where the streams live, how they are partitioned, and how sure Redis
//! must be of what it acknowledged.

use serde::Deserialize;

use super::{Secret, is_name};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// `redis://[:password@]host:port[/db]`; overridden by `MAILSTREAM_REDIS_URL`.
    /// With `cluster`, any node of the cluster (a seed).
    pub url: Secret,
    /// Redis Cluster: commands are routed by their keys' hash slots (every script
    /// touches one slot, so the same scripts run unchanged).
    pub cluster: bool,
    /// More cluster nodes to start from, should `url`'s node be down at start.
    pub cluster_seeds: Vec<Secret>,
    /// First component of every key.
    pub prefix: String,
    /// Number of partitions (streams). Fixed for the life of a deployment. A request
    /// carries one partition's batch, so each partition ends a run on a partial batch of
    /// its own: 1 on a single Redis; on a cluster, enough to spread over the primaries
    /// (the tail costs at most `partitions - 1` extra requests a run).
    pub partitions: u16,
    /// Consumer group shared by every instance of this deployment.
    pub group: String,
    /// Connections in the pool; each partition reader holds one.
    pub pool_size: usize,
    /// How long one Redis command may take before it is an error.
    pub response_timeout_ms: u64,
    /// Replicas that must acknowledge a sealed batch (WAIT) before its request
    /// leaves; 0 relies on the primary's own persistence (appendfsync always).
    pub wait_replicas: u32,
    /// `strict`: refuse to run on a Redis that may lose an acknowledged write
    /// (no `appendfsync always`, too few replicas for `wait_replicas`); `relaxed`:
    /// run anyway, with a warning and the `mailstream_durability_relaxed` gauge.
    pub durability: Durability,
}

/// How sure mailstream must be that Redis keeps what it acknowledged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    #[default]
    Strict,
    Relaxed,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: Secret::new("redis://127.0.0.1:6379"),
            cluster: false,
            cluster_seeds: Vec::new(),
            prefix: "mailstream".into(),
            partitions: 1,
            group: "mailstream".into(),
            pool_size: 32,
            response_timeout_ms: 10_000,
            wait_replicas: 0,
            durability: Durability::Strict,
        }
    }
}

impl RedisConfig {
    /// Adds a message, naming its key, for each setting of `[redis]` that is wrong.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        let mut check = |ok: bool, message: String| {
            if !ok {
                errors.push(message);
            }
        };
        let r = self;
        check(
            r.url.expose().starts_with("redis://") || r.url.expose().starts_with("rediss://"),
            format!("redis.url: must start with redis:// or rediss:// (got {})", r.url.redacted_url()),
        );
        check(is_name(&r.prefix), format!("redis.prefix: use letters, digits, '_', '-' or '.' (got {:?})", r.prefix));
        for seed in &r.cluster_seeds {
            check(
                seed.expose().starts_with("redis://") || seed.expose().starts_with("rediss://"),
                format!(
                    "redis.cluster_seeds: each must start with redis:// or rediss:// (got {})",
                    seed.redacted_url()
                ),
            );
        }
        check(r.cluster || r.cluster_seeds.is_empty(), "redis.cluster_seeds: given but redis.cluster is false".into());
        check((1..=1024).contains(&r.partitions), format!("redis.partitions: must be 1..=1024 (got {})", r.partitions));
        check(!r.group.is_empty(), "redis.group: must not be empty".into());
        check(
            r.pool_size as u32 > 2 * u32::from(r.partitions) + 4,
            format!(
                "redis.pool_size: must exceed 2 x redis.partitions + 4, as each partition keeps a connection per \
                 lane (digest, transactional) for its blocking reads, and claims take others (got {} for {} partitions)",
                r.pool_size, r.partitions
            ),
        );
    }
}
