//! The pool of connections to a single server: deadpool-redis's, with a `PING` on
//! checkout only after a connection sat idle, and a connection whose command failed for
//! the connection's sake never handed out again.

use std::time::Duration;

use deadpool::managed::{Metrics, Object, RecycleResult};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// How long a pooled connection may have gone unused and still be handed out without a
/// `PING` first (deadpool-redis pings on every checkout: a round trip before every
/// command, which at a few thousand webhooks or batches a second was a second round
/// trip for each). A connection in steady use is not pinged; one idle longer is, so a
/// Redis restart during a quiet spell costs nobody a failed command; and one whose
/// command failed for its connection's sake leaves the pool ([`Pooled`]).
const PING_IF_IDLE: Duration = Duration::from_secs(1);

/// deadpool-redis's manager, checking a connection on checkout only after
/// [`PING_IF_IDLE`].
pub(crate) struct Recycler(pub(crate) deadpool_redis::Manager);

impl deadpool::managed::Manager for Recycler {
    type Type = MultiplexedConnection;
    type Error = redis::RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, redis::RedisError> {
        self.0.create().await
    }

    async fn recycle(&self, conn: &mut MultiplexedConnection, metrics: &Metrics) -> RecycleResult<redis::RedisError> {
        if metrics.last_used() < PING_IF_IDLE {
            return Ok(());
        }
        self.0.recycle(conn, metrics).await
    }
}

/// A connection of the pool to a single server. Once a command on it failed with an
/// error of the connection (closed, reset, timed out), it is not given back to the pool.
pub struct Pooled {
    conn: Option<Object<Recycler>>,
    broken: bool,
}

impl Pooled {
    pub(crate) fn new(conn: Object<Recycler>) -> Pooled {
        Pooled { conn: Some(conn), broken: false }
    }

    fn inner(&mut self) -> &mut MultiplexedConnection {
        self.conn.as_mut().expect("present until dropped")
    }

    fn note<T>(&mut self, result: &redis::RedisResult<T>) {
        if let Err(e) = result {
            self.broken |= e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_unrecoverable_error();
        }
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.broken, self.conn.take()) {
            drop(Object::take(conn));
        }
    }
}

impl ConnectionLike for Pooled {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.inner().req_packed_command(cmd).await;
            self.note(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self.inner().req_packed_commands(pipeline, offset, count).await;
            self.note(&result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.as_ref().map_or(0, |c| c.get_db())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{RedisConfig, Secret};
    use crate::store::conn::Backend;

    /// A pooled connection that broke is not handed out again: the command that found
    /// it broken fails, the next one gets a new connection (and a connection in use is
    /// not pinged on every checkout: CLIENT LIST shows the one connection serving all).
    #[tokio::test]
    async fn a_broken_pooled_connection_leaves_the_pool() {
        let redis = crate::store::redis_server::RedisServer::start(Default::default()).await.expect("redis starts");
        let config = RedisConfig { url: Secret::new(redis.url()), pool_size: 1, ..Default::default() };
        let backend = Backend::connect(&config).await.unwrap();
        for _ in 0..20 {
            let _: () =
                redis::cmd("SET").arg("k").arg("v").query_async(&mut backend.conn().await.unwrap()).await.unwrap();
        }
        let mut admin = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
        let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut admin).await.unwrap();
        let pings: u64 = stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_ping:calls="))
            .map_or(0, |v| v.split(',').next().unwrap_or("0").parse().unwrap());
        assert!(pings <= 1, "20 checkouts in a row pinged {pings} times");
        let killed: u64 = crate::store::redis_server::kill_clients(&mut admin).await;
        assert_eq!(killed, 1, "the pool's one connection");
        let first: redis::RedisResult<String> =
            redis::cmd("GET").arg("k").query_async(&mut backend.conn().await.unwrap()).await;
        // Whether or not the client noticed the close before this command, the next
        // checkout has a working connection.
        let _ = first;
        let again: String = redis::cmd("GET").arg("k").query_async(&mut backend.conn().await.unwrap()).await.unwrap();
        assert_eq!(again, "v");
    }
}
