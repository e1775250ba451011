//! The deployment under a prefix (`<prefix>:meta`): whether there is one, which a
//! command that only reads or maintains one requires, and when its first `run` looked.

use anyhow::Context;
use redis::AsyncCommands;

use super::{Access, Store};
use crate::config::Config;

/// A prefix with no deployment, met by a command that only reads or maintains one (a
/// configuration mistake: the CLI exits 78).
#[derive(Debug, thiserror::Error)]
#[error("no deployment under prefix {prefix} (no {prefix}:meta): is redis.prefix or redis.url mistyped?")]
pub struct NoDeployment {
    pub prefix: String,
}

impl Store {
    /// Deletes every key under this deployment's prefix (the demo on a shared Redis),
    /// one slot at a time (a cluster refuses multi-key commands across slots).
    pub(crate) async fn delete_all(&self) -> anyhow::Result<u64> {
        let keys = self.scan(&format!("{}:*", self.keys.prefix())).await?;
        let mut by_slot: std::collections::BTreeMap<&str, Vec<&String>> = Default::default();
        for key in &keys {
            by_slot.entry(crate::store::keys::hash_tag(key)).or_default().push(key);
        }
        let mut conn = self.conn().await?;
        let mut removed = 0;
        for (_, keys) in by_slot {
            for chunk in keys.chunks(500) {
                let n: u64 = redis::cmd("UNLINK").arg(chunk).query_async(&mut conn).await?;
                removed += n;
            }
        }
        Ok(removed)
    }

    /// [`Store::connect`] of a deployment that exists, whatever its layout (`upgrade`'s):
    /// [`NoDeployment`] otherwise, and nothing written.
    pub async fn connect_deployed(config: &Config) -> anyhow::Result<Store> {
        Store::connect_for(config, Access::Read).await?.require_deployed().await?;
        Store::connect(config).await
    }

    /// [`Store::open_read`] of a deployment that exists, for a command that only reads or
    /// maintains one: on a prefix with none (a mistyped `redis.prefix` or `redis.url`)
    /// it is refused with [`NoDeployment`], and nothing is written.
    pub async fn open_deployed(config: &Config) -> anyhow::Result<Store> {
        let store = Store::open_read(config).await?;
        store.require_deployed().await?;
        Ok(store)
    }

    /// [`NoDeployment`] unless this prefix holds a deployment.
    pub async fn require_deployed(&self) -> anyhow::Result<()> {
        match self.deployed().await? {
            true => Ok(()),
            false => Err(NoDeployment { prefix: self.keys.prefix().to_string() }.into()),
        }
    }

    /// Whether this prefix holds a deployment (its `meta` exists).
    pub async fn deployed(&self) -> anyhow::Result<bool> {
        let mut conn = self.conn().await?;
        Ok(conn.exists(self.keys.meta()).await?)
    }

    /// When this deployment's scheduler first looked (`<prefix>:meta` `first_run_ms`,
    /// Redis-clock ms): `at` if no `run` had looked before, else what the first one
    /// recorded. A fire before it was never a daemon's to send, so it is not "missed".
    pub async fn first_run(&self, at: chrono::DateTime<chrono::Utc>) -> anyhow::Result<chrono::DateTime<chrono::Utc>> {
        let mut conn = self.conn().await?;
        let meta = self.keys.meta();
        let (_, first): (bool, i64) = redis::pipe()
            .atomic()
            .hset_nx(&meta, "first_run_ms", at.timestamp_millis())
            .hget(&meta, "first_run_ms")
            .query_async(&mut conn)
            .await?;
        chrono::DateTime::from_timestamp_millis(first).context("first_run_ms is out of range")
    }
}
