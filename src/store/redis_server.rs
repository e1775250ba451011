//! A private `redis-server` on a free loopback port, in a scratch directory,
//! killed when dropped, and a private 3-primary Redis Cluster made of such
//! servers (with or without a replica per primary, whose primaries can be killed
//! and failed over). The demo runs on one; every test starts its own, so tests
//! are isolated, run in parallel, and need no Redis already running.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// How long a starting redis-server may take to answer.
const STARTUP_PATIENCE: Duration = Duration::from_secs(30);

/// How to start the server.
#[derive(Debug, Clone, Copy, Default)]
pub struct RedisOptions {
    /// Append-only persistence (fsync every write), so a restart keeps everything.
    pub appendonly: bool,
    /// A cluster node (`cluster-enabled yes`), for [`RedisCluster`].
    pub cluster: bool,
    /// A replica of the server on this loopback port (`replicaof`).
    pub replica_of: Option<u16>,
}

/// A running private Redis.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    options: RedisOptions,
    /// Environment the server is (re)started with beside this process's own (a test's
    /// `LD_PRELOAD` that moves its clock).
    env: Vec<(String, String)>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub async fn start(options: RedisOptions) -> anyhow::Result<RedisServer> {
        let mut last = None;
        for _ in 0..5 {
            let port = free_port()?;
            let dir = std::env::temp_dir().join(format!("mailstream-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut server = RedisServer { child: None, port, dir, options, env: Vec::new() };
            match server.spawn().await {
                Ok(()) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (like a crash: no shutdown save) and starts it again on
    /// the same port and directory; with appendonly, every write survives.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn().await
    }

    /// [`RedisServer::restart`] with `env` set for the server from now on (replacing what
    /// an earlier call set).
    pub async fn restart_with_env(&mut self, env: &[(&str, &str)]) -> anyhow::Result<()> {
        self.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.restart().await
    }

    /// Waits until this replica's link to its primary is up (it has the primary's data).
    pub async fn linked(&self) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + STARTUP_PATIENCE;
        while std::time::Instant::now() < deadline {
            let info: String = self.command(redis::cmd("INFO").arg("replication")).await.unwrap_or_default();
            if info.contains("master_link_status:up") {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the replica on port {} did not link to its primary within {} s", self.port, STARTUP_PATIENCE.as_secs())
    }

    /// Whether the server was started and not killed since.
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server now.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no", "--protected-mode", "yes"])
            .args(["--appendonly", if self.options.appendonly { "yes" } else { "no" }])
            .args(["--appendfsync", "always"])
            .args(if self.options.cluster {
                vec!["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000", "--cluster-require-full-coverage", "no"]
            } else {
                vec![]
            })
            .args(self.options.replica_of.map(|port| vec!["--replicaof".to_string(), "127.0.0.1".into(), port.to_string()]).unwrap_or_default())
            .arg("--dir")
            .arg(&self.dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => anyhow::anyhow!(
                    "redis-server not found on PATH: install it (Debian: apt-get install redis-server) or pass --redis-url"
                ),
                _ => anyhow::Error::new(e).context("starting redis-server"),
            })?;
        self.child = Some(child);
        let client = redis::Client::open(self.url())?;
        // Generous: on a loaded machine (CI's two cores, other servers starting) a
        // redis-server can take seconds to answer, longer while it loads its AOF.
        let deadline = std::time::Instant::now() + STARTUP_PATIENCE;
        while std::time::Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                bail!("redis-server exited at start ({status}); port {} may be taken", self.port);
            }
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
                // While loading the append-only file Redis answers LOADING; wait it out.
                if pong.is_ok() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill();
        bail!("redis-server on port {} did not answer within {} s", self.port, STARTUP_PATIENCE.as_secs())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port that was free a moment ago (the OS picks it).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A private Redis Cluster: three primaries, every slot covered, with or without a
/// replica each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// How long a failover may take: the replicas notice the primary is gone after the
/// node timeout (5 s), then elect one of them.
const FAILOVER_PATIENCE: Duration = Duration::from_secs(60);

impl RedisCluster {
    /// Starts three primaries with no replicas (see [`RedisCluster::start_with`]).
    pub async fn start(appendonly: bool) -> anyhow::Result<RedisCluster> {
        RedisCluster::start_with(appendonly, 0).await
    }

    /// Starts three primaries and `replicas` replicas of each, joins them with
    /// `redis-cli --cluster create`, and waits until every node says
    /// `cluster_state:ok` and every replica's link to its primary is up.
    pub async fn start_with(appendonly: bool, replicas: usize) -> anyhow::Result<RedisCluster> {
        let mut nodes = Vec::new();
        for _ in 0..3 * (1 + replicas) {
            nodes.push(RedisServer::start(RedisOptions { appendonly, cluster: true, replica_of: None }).await?);
        }
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .context("running redis-cli --cluster create")?;
        if !out.status.success() {
            bail!("redis-cli --cluster create failed: {}", String::from_utf8_lossy(&out.stdout));
        }
        let cluster = RedisCluster { nodes };
        cluster.settled(STARTUP_PATIENCE).await?;
        Ok(cluster)
    }

    /// Waits until every running node says `cluster_state:ok`, every slot is served by
    /// a running primary, and every running replica's link is up.
    async fn settled(&self, patience: Duration) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            let mut ok = true;
            for node in self.nodes.iter().filter(|n| n.is_running()) {
                let info: String = node.command(redis::cmd("CLUSTER").arg("INFO")).await.unwrap_or_default();
                let replication: String = node.command(redis::cmd("INFO").arg("replication")).await.unwrap_or_default();
                ok &= info.contains("cluster_state:ok")
                    && (replication.contains("role:master") || replication.contains("master_link_status:up"));
            }
            if ok && self.primaries().await.is_ok_and(|p| p.len() == 3) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!("the cluster did not settle (state ok, replicas linked) within {} s", patience.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The indexes (into `nodes`) of the running primaries that serve slots.
    pub async fn primaries(&self) -> anyhow::Result<Vec<usize>> {
        let node = self.nodes.iter().find(|n| n.is_running()).context("no node is running")?;
        let slots: redis::Value = node.command(redis::cmd("CLUSTER").arg("SLOTS")).await?;
        Ok((0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_running() && !slots_owned_by(&slots, self.nodes[i].port()).is_empty())
            .collect())
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of a running node).
    pub async fn slot_of(&self, key: &str) -> anyhow::Result<u16> {
        let node = self.nodes.iter().find(|n| n.is_running()).context("no node is running")?;
        node.command(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await
    }

    /// The index (into `nodes`) of the primary that serves `slot` now.
    pub async fn primary_of(&self, slot: u16) -> anyhow::Result<usize> {
        let port = self.owner_of(slot).await?;
        self.nodes.iter().position(|n| n.port() == port).context("the slot's owner is not one of ours")
    }

    /// Kills the primary `index` (like a crash) and waits until one of its replicas has
    /// been promoted in its place and the cluster is ok again; returns the new
    /// primary's index. The killed node stays down until [`RedisCluster::rejoin`].
    pub async fn kill_primary(&mut self, index: usize) -> anyhow::Result<usize> {
        let slots: redis::Value = self.nodes[index].command(redis::cmd("CLUSTER").arg("SLOTS")).await?;
        let (first, _) = *slots_owned_by(&slots, self.nodes[index].port()).first().context("not a primary")?;
        self.nodes[index].kill();
        let deadline = std::time::Instant::now() + FAILOVER_PATIENCE;
        loop {
            if let Ok(promoted) = self.primary_of(first).await
                && promoted != index
            {
                self.settled(FAILOVER_PATIENCE).await?;
                return Ok(promoted);
            }
            if std::time::Instant::now() > deadline {
                bail!("no replica took over within {} s", FAILOVER_PATIENCE.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts a killed node again (same port and directory); it rejoins as a replica of
    /// the primary promoted in its place. Waits until its link is up.
    pub async fn rejoin(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].spawn().await?;
        self.settled(FAILOVER_PATIENCE).await
    }

    /// The first node's URL (any node is a seed for the whole cluster).
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    /// The port of the node that holds `slot` now.
    pub async fn owner_of(&self, slot: u16) -> anyhow::Result<u16> {
        let node = self.nodes.iter().find(|n| n.is_running()).context("no node is running")?;
        let slots: redis::Value = node.command(redis::cmd("CLUSTER").arg("SLOTS")).await?;
        self.nodes
            .iter()
            .map(RedisServer::port)
            .find(|&port| slots_owned_by(&slots, port).iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .context("no node holds the slot")
    }

    /// Moves `slot` from the node that holds it to the next one, keys included
    /// (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE in steps of 100 keys, SETSLOT
    /// NODE), while clients keep working: they meet ASK and MOVED redirects meanwhile.
    pub async fn migrate_slot(&self, slot: u16) -> anyhow::Result<()> {
        let mut ids = Vec::new();
        for node in &self.nodes {
            let id: String = node.command(redis::cmd("CLUSTER").arg("MYID")).await?;
            ids.push(id);
        }
        let slots: redis::Value = self.nodes[0].command(redis::cmd("CLUSTER").arg("SLOTS")).await?;
        let from = self
            .nodes
            .iter()
            .position(|node| slots_owned_by(&slots, node.port()).iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .context("no node holds the slot")?;
        let to = (from + 1) % self.nodes.len();
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let setslot = |state: &str, id: &str| redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg(state).arg(id).clone();
        let _: () = dst.command(&setslot("IMPORTING", &ids[from])).await?;
        let _: () = src.command(&setslot("MIGRATING", &ids[to])).await?;
        loop {
            let keys: Vec<String> = src.command(redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(100)).await?;
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate.arg("127.0.0.1").arg(dst.port()).arg("").arg(0).arg(5000).arg("KEYS").arg(&keys);
            let _: redis::Value = src.command(&migrate).await?;
        }
        // The new owner first, then the old one, then the rest.
        let others = self.nodes.iter().filter(|n| n.port() != src.port() && n.port() != dst.port());
        for node in [dst, src].into_iter().chain(others) {
            let _: () = node.command(&setslot("NODE", &ids[to])).await?;
        }
        Ok(())
    }
}

/// The slot ranges a `CLUSTER SLOTS` reply gives the node on `port`.
fn slots_owned_by(reply: &redis::Value, port: u16) -> Vec<(u16, u16)> {
    let redis::Value::Array(ranges) = reply else { return Vec::new() };
    ranges
        .iter()
        .filter_map(|r| {
            let redis::Value::Array(parts) = r else { return None };
            let int = |v: &redis::Value| if let redis::Value::Int(n) = v { Some(*n) } else { None };
            let (start, end) = (int(parts.first()?)?, int(parts.get(1)?)?);
            let redis::Value::Array(primary) = parts.get(2)? else { return None };
            (int(primary.get(1)?)? == i64::from(port)).then_some((start as u16, end as u16))
        })
        .collect()
}

/// Closes every client connection of `admin`'s server but `admin`'s own; how many.
#[cfg(test)]
pub(crate) async fn kill_clients(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let kill = redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").arg("SKIPME").arg("yes").clone();
    kill.query_async(admin).await.expect("CLIENT KILL")
}

impl RedisServer {
    /// Runs one command on this server alone.
    pub async fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> anyhow::Result<T> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        Ok(cmd.query_async(&mut conn).await?)
    }
}
