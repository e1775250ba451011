//! Connections to Redis, one kind or the other: a pool of connections to a
//! single server, or a Redis Cluster connection that routes every command by
//! its key's hash slot (MOVED, ASK and NOSCRIPT handled by the redis crate).
//! Everything above talks to [`Conn`] and does not care which; the few
//! commands that belong to a node rather than a key (SCAN, CONFIG GET, WAIT)
//! are routed here.

use std::time::Duration;

use anyhow::Context;
use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::pool::{Pooled, Recycler};
use crate::config::RedisConfig;

/// Where connections come from.
#[derive(Clone)]
pub(crate) enum Backend {
    Single(std::sync::Arc<SingleServer>),
    Cluster(Box<ClusterBackend>),
}

/// Connections to a Redis Cluster.
#[derive(Clone)]
pub(crate) struct ClusterBackend {
    /// The client, for dedicated connections.
    client: ClusterClient,
    /// One shared, multiplexed connection.
    shared: ClusterConnection,
    /// Another, for writes whose caller then waits for replicas (made when first needed).
    waited: std::sync::Arc<tokio::sync::OnceCell<ClusterConnection>>,
    /// A client that tries a command only a few times (see [`Backend::brief`]), and its
    /// connection (made when first needed).
    brief_client: ClusterClient,
    brief: std::sync::Arc<tokio::sync::OnceCell<ClusterConnection>>,
}

/// Connections to a single server: a pool, and one shared, multiplexed, reconnecting
/// connection (made when first needed).
pub(crate) struct SingleServer {
    pool: deadpool::managed::Pool<Recycler>,
    client: redis::Client,
    shared_config: ConnectionManagerConfig,
    shared: tokio::sync::OnceCell<ConnectionManager>,
}

/// One connection, to a single server or to the cluster.
pub enum Conn {
    Single(LocalConn),
    Cluster(ClusterConnection),
}

/// A connection to a single server: one of the pool's, or the shared one.
pub enum LocalConn {
    Pooled(Pooled),
    Shared(ConnectionManager),
}

impl ConnectionLike for LocalConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            LocalConn::Pooled(c) => c.req_packed_command(cmd),
            LocalConn::Shared(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            LocalConn::Pooled(c) => c.req_packed_commands(pipeline, offset, count),
            LocalConn::Shared(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            LocalConn::Pooled(c) => c.get_db(),
            LocalConn::Shared(c) => c.get_db(),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Runs `cmds` (each about keys of one slot) in order and returns their replies: one
    /// pipeline on a single server, a command at a time on a cluster (which takes no
    /// pipeline across slots). For reads of one key per partition.
    pub async fn each<T: redis::FromRedisValue>(&mut self, cmds: &[Cmd]) -> redis::RedisResult<Vec<T>> {
        match self {
            Conn::Single(c) => {
                let mut pipe = redis::pipe();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                pipe.query_async(c).await
            }
            Conn::Cluster(c) => {
                let mut out = Vec::with_capacity(cmds.len());
                for cmd in cmds {
                    out.push(cmd.query_async(c).await?);
                }
                Ok(out)
            }
        }
    }

    /// Runs `cmd` on the node that holds `key`'s slot (on a single server: here).
    pub(crate) async fn on_node_of<T: redis::FromRedisValue>(&mut self, key: &str, cmd: &Cmd) -> anyhow::Result<T> {
        match self {
            Conn::Single(c) => Ok(cmd.query_async(c).await?),
            Conn::Cluster(c) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                    key.as_bytes(),
                    SlotAddr::Master,
                )));
                Ok(redis::from_redis_value(c.route_command(cmd.clone(), route).await?)?)
            }
        }
    }

    /// `WAIT replicas timeout_ms` on the node that holds `key`'s slot, over this
    /// connection (WAIT counts the writes this connection made there): how many
    /// replicas acknowledged them. On a cluster the client sends a command routed to a
    /// slot whose node it is not connected to (just after a failover) to any node it
    /// is, and there a keyless WAIT would count nothing written and answer at once; so
    /// WAIT goes in one pipeline with `EXISTS key`, which only the slot's node answers
    /// (any other refuses it with MOVED), and an answer from elsewhere is an error.
    pub(crate) async fn wait_on_node_of(&mut self, key: &str, replicas: u32, timeout_ms: u64) -> anyhow::Result<u32> {
        let mut pipe = redis::pipe();
        pipe.cmd("WAIT").arg(replicas).arg(timeout_ms).cmd("EXISTS").arg(key);
        let values: Vec<Value> = match self {
            Conn::Single(c) => pipe.query_async(c).await?,
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key.as_bytes(), SlotAddr::Master));
                c.route_pipeline(pipe, 0, 2, route).await?
            }
        };
        match values.as_slice() {
            [acked, Value::Int(_)] => Ok(redis::from_redis_value(acked.clone())?),
            other => anyhow::bail!("WAIT was not answered by the node that holds the key: {other:?}"),
        }
    }

    /// Runs `cmd` on the node at `address` (`host:port`; on a single server: here).
    pub(crate) async fn on_node<T: redis::FromRedisValue>(&mut self, address: &str, cmd: &Cmd) -> anyhow::Result<T> {
        match self {
            Conn::Single(c) => Ok(cmd.query_async(c).await?),
            Conn::Cluster(c) => {
                let (host, port) = address.rsplit_once(':').context("a node address")?;
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.to_string(),
                    port: port.parse().context("a node port")?,
                });
                Ok(redis::from_redis_value(c.route_command(cmd.clone(), route).await?)?)
            }
        }
    }

    /// The primaries' addresses (`host:port`); a single server is its own (`""`).
    pub async fn primaries(&mut self) -> anyhow::Result<Vec<String>> {
        match self {
            Conn::Single(_) => Ok(vec![String::new()]),
            Conn::Cluster(c) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                let nodes: String =
                    redis::from_redis_value(c.route_command(redis::cmd("CLUSTER").arg("NODES").clone(), route).await?)?;
                Ok(primaries_of(&nodes))
            }
        }
    }

    /// Whether every primary of the cluster answers (a single server: always).
    pub(crate) async fn cluster_ok(&mut self) -> anyhow::Result<bool> {
        match self {
            Conn::Single(_) => Ok(true),
            Conn::Cluster(c) => {
                let route = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let reply = c.route_command(redis::cmd("PING").clone(), route).await;
                Ok(reply.is_ok())
            }
        }
    }
}

/// The cluster client's wait before it sends again a command refused while the cluster
/// reconfigures (CLUSTERDOWN, TRYAGAIN, MASTERDOWN) or one it found no connection for:
/// 20 ms, doubling per try up to a second (16 tries, about 11 s in all). The client's own
/// default waits at least 1.28 s, so every command that met the few hundred milliseconds
/// between a primary's failure being agreed and its replica's promotion (when a cluster
/// that requires full coverage refuses every key) came back over a second after the
/// cluster did: a second of nothing sent by every partition, the live ones too.
const RETRY_WAIT_MIN_MS: u64 = 20;
const RETRY_WAIT_MAX_MS: u64 = 1000;

/// How many times the brief connection's client sends a command again: enough to follow a
/// MOVED or an ASK (a slot that moved), to reconnect once, and to wait out 20 + 40 ms of
/// CLUSTERDOWN; not to wait for a dead primary's replica.
const BRIEF_TRIES: u32 = 3;

/// The `host:port` of each live primary that serves slots in a `CLUSTER NODES` reply
/// (`<id> <addr> <flags> <primary> <ping> <pong> <epoch> <link> <slot>...`): a primary
/// with no slots (one just added, or emptied) serves no key, and the cluster client
/// has no connection to route to it.
fn primaries_of(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            let serves_slots = fields.len() > 8;
            let is_primary = flags.split(',').any(|f| f == "master") && !flags.contains("fail") && serves_slots;
            let address = fields.get(1)?.split('@').next()?;
            is_primary.then(|| address.to_string())
        })
        .collect()
}

impl Backend {
    /// Connects as `r` asks: a pool to one server, or the cluster from its seeds.
    pub async fn connect(r: &RedisConfig) -> anyhow::Result<Backend> {
        let connect_timeout = Duration::from_secs(3);
        let response_timeout = Duration::from_millis(r.response_timeout_ms);
        if r.cluster {
            let seeds: Vec<&str> =
                std::iter::once(r.url.expose()).chain(r.cluster_seeds.iter().map(|s| s.expose())).collect();
            let builder = || {
                ClusterClient::builder(seeds.clone())
                    .connection_timeout(connect_timeout)
                    .response_timeout(response_timeout)
                    .min_retry_wait(RETRY_WAIT_MIN_MS)
                    .max_retry_wait(RETRY_WAIT_MAX_MS)
            };
            let invalid = || format!("invalid redis.url or redis.cluster_seeds ({})", r.url.redacted_url());
            let client = builder().build().with_context(invalid)?;
            let brief_client = builder().retries(BRIEF_TRIES).build().with_context(invalid)?;
            let shared = client.get_async_connection().await?;
            let cluster =
                ClusterBackend { client, shared, waited: Default::default(), brief_client, brief: Default::default() };
            return Ok(Backend::Cluster(Box::new(cluster)));
        }
        let settings = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout));
        let manager = deadpool_redis::Manager::new_with_config(r.url.expose(), settings)
            .with_context(|| format!("invalid redis.url {}", r.url.redacted_url()))?;
        let client = redis::Client::open(r.url.expose())
            .with_context(|| format!("invalid redis.url {}", r.url.redacted_url()))?;
        let shared_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout))
            .set_number_of_retries(2);
        let pool = deadpool::managed::Pool::builder(Recycler(manager))
            .max_size(r.pool_size)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()
            .context("building the Redis pool")?;
        Ok(Backend::Single(std::sync::Arc::new(SingleServer {
            pool,
            client,
            shared_config,
            shared: Default::default(),
        })))
    }

    /// A connection for ordinary commands.
    pub async fn conn(&self) -> anyhow::Result<Conn> {
        match self {
            Backend::Single(single) => {
                let conn = single.pool.get().await.map_err(|e| super::Unreachable(format!("Redis connection: {e}")))?;
                Ok(Conn::Single(LocalConn::Pooled(Pooled::new(conn))))
            }
            Backend::Cluster(cluster) => Ok(Conn::Cluster(cluster.shared.clone())),
        }
    }

    /// A connection on which a command is tried only a few times, for a caller that has
    /// something better to do than wait for a node that is gone (the shared limiter's: its
    /// instance paces alone meanwhile). On a cluster the client otherwise tries a command
    /// to a dead primary sixteen times, about 11 s, before it says so; on this one a
    /// connection refused, a slot still owned by the dead node, or a CLUSTERDOWN past about
    /// 60 ms is an error within moments. A single server's connection says so at once.
    pub async fn brief(&self) -> anyhow::Result<Conn> {
        match self {
            Backend::Single(_) => self.conn().await,
            Backend::Cluster(cluster) => made_once(&cluster.brief, &cluster.brief_client).await,
        }
    }

    /// The shared, multiplexed connection, for short commands many tasks send at once
    /// (a webhook's event): concurrent commands leave in one write and Redis answers them
    /// in one pass of its loop (one fsync), instead of one connection, read and write
    /// each. Never for a blocking command or a WAIT (they would hold up every other). On
    /// a single server it reconnects by itself after a failure; on a cluster it is the
    /// cluster's shared connection.
    pub async fn shared(&self) -> anyhow::Result<Conn> {
        match self {
            Backend::Single(single) => {
                let conn = single
                    .shared
                    .get_or_try_init(|| {
                        ConnectionManager::new_with_config(single.client.clone(), single.shared_config.clone())
                    })
                    .await
                    .map_err(|e| super::Unreachable(format!("Redis connection: {e}")))?;
                Ok(Conn::Single(LocalConn::Shared(conn.clone())))
            }
            Backend::Cluster(cluster) => Ok(Conn::Cluster(cluster.shared.clone())),
        }
    }

    /// A connection for writes the caller then waits for replicas to hold (`WAIT`, which
    /// blocks the connection it is sent on: up to a second when a primary has lost its
    /// replica). On a cluster, a multiplexed connection apart from the shared one, so such
    /// a wait never holds up the commands that pace and send (the limiter's, other
    /// partitions'); they wait for each other, as on any one connection.
    pub async fn waited_conn(&self) -> anyhow::Result<Conn> {
        match self {
            Backend::Single(_) => self.conn().await,
            Backend::Cluster(cluster) => made_once(&cluster.waited, &cluster.client).await,
        }
    }

    /// A connection of its own, for a command that blocks (XREADGROUP … BLOCK): on a
    /// cluster, a blocking read on the shared multiplexed connection would hold up
    /// every other command to that node.
    pub(crate) async fn dedicated(&self) -> anyhow::Result<Conn> {
        match self {
            Backend::Single(_) => self.conn().await,
            Backend::Cluster(cluster) => Ok(Conn::Cluster(cluster.client.get_async_connection().await?)),
        }
    }
}

/// The connection in `cell`, made by `client` when first needed.
async fn made_once(cell: &tokio::sync::OnceCell<ClusterConnection>, client: &ClusterClient) -> anyhow::Result<Conn> {
    Ok(Conn::Cluster(cell.get_or_try_init(|| client.get_async_connection()).await?.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use crate::store::redis_server::RedisCluster;

    /// A WAIT answered by a node that does not hold the key is an error, never a count
    /// of replicas: there it would count nothing written and answer at once.
    #[tokio::test]
    async fn wait_is_answered_by_the_node_that_holds_the_key_or_not_at_all() {
        let cluster = RedisCluster::start(false).await.expect("the cluster starts");
        let key = "mailstream:{0}:batches";
        let owner = cluster.owner_of(cluster.slot_of(key).await.unwrap()).await.unwrap();
        let other = cluster.nodes.iter().find(|n| n.port() != owner).expect("another primary");
        let config = |url: String, cluster: bool| RedisConfig { url: Secret::new(url), cluster, ..Default::default() };
        // Through the cluster client: the slot's node answers (no replicas here: 0).
        let mut routed = Backend::connect(&config(cluster.url(), true)).await.unwrap().conn().await.unwrap();
        assert_eq!(routed.wait_on_node_of(key, 0, 100).await.unwrap(), 0);
        // Sent to a node that does not hold the slot, as the client's fallback would.
        let mut elsewhere = Backend::connect(&config(other.url(), false)).await.unwrap().conn().await.unwrap();
        let refused = elsewhere.wait_on_node_of(key, 0, 100).await.expect_err("not that node's key");
        assert!(format!("{refused:#}").to_lowercase().contains("moved"), "{refused:#}");
    }

    /// The brief connection says a primary is gone with an error, soon: not after the
    /// sixteen tries (about 11 s) of the ordinary one, which the shared limiter's calls
    /// and the heartbeat's renewals would wait out. Keys on the live primaries still answer.
    #[tokio::test]
    async fn the_brief_connection_says_soon_that_a_primary_is_gone() {
        let mut cluster = RedisCluster::start(false).await.expect("the cluster starts");
        let dead = "mailstream:{0}:batches";
        let owner = cluster.owner_of(cluster.slot_of(dead).await.unwrap()).await.unwrap();
        let config = RedisConfig { url: Secret::new(cluster.url()), cluster: true, ..Default::default() };
        let backend = Backend::connect(&config).await.unwrap();
        let mut live = None;
        for p in 0..64u16 {
            let key = format!("mailstream:{{{p}}}:batches");
            if cluster.owner_of(cluster.slot_of(&key).await.unwrap()).await.unwrap() != owner {
                live = Some(key);
                break;
            }
        }
        let live = live.expect("a key on another primary");
        let mut brief = backend.brief().await.unwrap();
        let _: bool = redis::cmd("EXISTS").arg(dead).query_async(&mut brief).await.unwrap();
        let node = cluster.nodes.iter().position(|n| n.port() == owner).unwrap();
        cluster.nodes[node].kill();
        // An error, not an answer from another node, after at most three tries: the live
        // primaries saw the command (refused with MOVED) no more than that.
        let before = exists_seen(&cluster).await;
        let got: redis::RedisResult<bool> = tokio::time::timeout(
            Duration::from_secs(30),
            redis::cmd("EXISTS").arg(dead).query_async(&mut backend.brief().await.unwrap()),
        )
        .await
        .expect("the brief connection answers");
        assert!(got.is_err(), "{got:?}");
        let tries = exists_seen(&cluster).await - before;
        assert!(tries <= u64::from(BRIEF_TRIES), "the live primaries saw {tries} tries");
        let _: bool = redis::cmd("EXISTS").arg(&live).query_async(&mut backend.brief().await.unwrap()).await.unwrap();
    }

    /// How many EXISTS the running nodes have been sent (answered or refused).
    async fn exists_seen(cluster: &RedisCluster) -> u64 {
        let mut seen = 0;
        for node in cluster.nodes.iter().filter(|n| n.is_running()) {
            let stats: String = node.command(redis::cmd("INFO").arg("commandstats")).await.unwrap();
            let line = stats.lines().find_map(|l| l.strip_prefix("cmdstat_exists:")).unwrap_or("");
            for field in ["calls", "rejected_calls"] {
                seen += line
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        seen
    }

    /// The shared connection serves many tasks at once over one socket, and after its
    /// connection is killed it reconnects by itself: a later command succeeds on it.
    #[tokio::test]
    async fn the_shared_connection_is_one_socket_and_comes_back_after_a_kill() {
        let redis = crate::store::redis_server::RedisServer::start(Default::default()).await.expect("redis starts");
        let config = RedisConfig { url: Secret::new(redis.url()), ..Default::default() };
        let backend = Backend::connect(&config).await.unwrap();
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let backend = backend.clone();
                tokio::spawn(async move {
                    let mut c = backend.shared().await.unwrap();
                    let _: () = redis::cmd("SET").arg(format!("k{i}")).arg(i).query_async(&mut c).await.unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let mut admin = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
        let killed: u64 = crate::store::redis_server::kill_clients(&mut admin).await;
        assert_eq!(killed, 1, "fifty tasks, one connection");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let mut c = backend.shared().await.unwrap();
            let got: redis::RedisResult<String> = redis::cmd("GET").arg("k7").query_async(&mut c).await;
            match got {
                Ok(v) => break assert_eq!(v, "7"),
                Err(e) => assert!(std::time::Instant::now() < deadline, "never came back: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn primaries_are_read_from_cluster_nodes() {
        let nodes = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master,fail - 0 1426238318243 3 connected 10923-16383
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460
5c1b2a0f36c4f4a6d2d3f9b1a7e0c2d4b6a8e0f1 127.0.0.1:30005@31005 master - 0 1426238316232 5 connected
";
        // A primary serving no slot (just added to the cluster) is not one to route to.
        assert_eq!(primaries_of(nodes), vec!["127.0.0.1:30002", "127.0.0.1:30001"]);
    }
}
