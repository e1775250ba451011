//! A private `redis-server` on a free loopback port, in a scratch directory,
//! killed when dropped. The demo runs on one; every test starts its own, so
//! tests are isolated, run in parallel, and need no Redis already running.

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
}

/// A running private Redis.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    options: RedisOptions,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub async fn start(options: RedisOptions) -> anyhow::Result<RedisServer> {
        let mut last = None;
        for _ in 0..5 {
            let port = free_port()?;
            let dir = std::env::temp_dir().join(format!("mailstream-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut server = RedisServer { child: None, port, dir, options };
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
            .arg("--dir")
            .arg(&self.dir)
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
