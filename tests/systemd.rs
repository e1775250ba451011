//! Running under systemd: the daemon tells a notify socket it owns READY=1 (after
//! Redis answered, the scripts loaded, the listeners bound), STATUS= lines,
//! WATCHDOG=1 while its reclaimer loop turns, and STOPPING=1 on SIGTERM, in that
//! order; it logs one JSON object per line when stderr is not a terminal; and the
//! shipped units pass `systemd-analyze verify` (deploy/verify).

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use mailstream::config::EXAMPLE;
use mailstream::tools::emulator::EmulatorConfig;

/// A notify socket owned by the test: every datagram it receives, in order.
pub struct NotifySocket {
    pub path: std::path::PathBuf,
    pub messages: Arc<Mutex<Vec<String>>>,
}

impl NotifySocket {
    pub fn bind(name: &str) -> NotifySocket {
        let dir = std::env::temp_dir().join(format!("mailstream-notify-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let socket = UnixDatagram::bind(&path).unwrap();
        let messages = Arc::new(Mutex::new(Vec::new()));
        let sink = messages.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = socket.recv(&mut buf) {
                sink.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).to_string());
            }
        });
        NotifySocket { path, messages }
    }

    /// Every state line received so far (`READY=1`, `STATUS=…`, …), in order.
    pub fn lines(&self) -> Vec<String> {
        self.messages.lock().unwrap().iter().flat_map(|m| m.lines().map(str::to_string).collect::<Vec<_>>()).collect()
    }

    pub async fn count(&self, line: &str, at_least: usize, within: Duration) -> bool {
        eventually(
            within,
            || async move { (self.lines().iter().filter(|l| *l == line).count() >= at_least).then_some(()) },
        )
        .await
        .is_some()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_notifies_ready_status_watchdog_and_stopping_in_order_and_logs_json() {
    let mut world = World::new().await;
    let (_emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    world.subscribers(30).await;
    world.kick().await;
    let text = EXAMPLE
        .replacen("schedule = \"0 9 * * MON\"", "", 1)
        .replacen("durability = \"strict\"", "durability = \"relaxed\"", 1)
        .replacen("partitions = 1", "partitions = 2", 1)
        .replacen("metrics_listen = \"127.0.0.1:9464\"", "metrics_listen = \"127.0.0.1:0\"", 1)
        .replacen(
            "base_url = \"https://api.resend.com\"",
            &format!("base_url = \"{}\"", world.config.resend.base_url),
            1,
        )
        .replacen("lease_seconds = 15", "lease_seconds = 3", 1);
    let config = std::env::temp_dir().join(format!("mailstream-systemd-{}.toml", std::process::id()));
    std::fs::write(&config, text).unwrap();
    let notify = NotifySocket::bind("order");

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mailstream"));
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("MAILSTREAM_REDIS_URL", world.redis.url())
        .env("RESEND_API_KEY", "re_systemd_test")
        .env("MAILSTREAM_UNSUBSCRIBE_SECRET", "unsubscribe-secret-of-the-systemd-test")
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "3000000")
        .env_remove("WATCHDOG_PID")
        .env_remove("MAILSTREAM_LOG")
        .stdout(Stdio::null());
    let daemon = Logged::spawn(&mut cmd);
    assert!(notify.count("READY=1", 1, Duration::from_secs(60)).await, "{:?}", notify.lines());
    assert!(notify.count("WATCHDOG=1", 3, Duration::from_secs(60)).await, "{:?}", notify.lines());
    let status = eventually(Duration::from_secs(60), || async {
        notify.lines().into_iter().find(|l| l.starts_with("STATUS=") && l.contains("backlog"))
    })
    .await;
    world.settled(Duration::from_secs(60)).await;
    daemon.signal("TERM");
    let (code, logs) = daemon.wait().await;
    assert_eq!(code, Some(0), "{logs:#?}");

    let lines = notify.lines();
    println!("notify socket received, in order: {lines:#?}");
    assert!(status.is_some(), "a STATUS= line with the backlog: {lines:?}");
    let first = |l: &str| lines.iter().position(|x| x == l);
    let (ready, stopping) = (first("READY=1").unwrap(), first("STOPPING=1").expect("STOPPING=1 on SIGTERM"));
    let first_ping = first("WATCHDOG=1").unwrap();
    assert_eq!(ready, 0, "READY=1 comes first: {lines:?}");
    assert!(ready < first_ping && first_ping < stopping, "READY, then WATCHDOG, then STOPPING: {lines:?}");
    assert_eq!(lines.iter().filter(|l| *l == "READY=1").count(), 1);

    // stderr is a pipe, not a terminal: `log.format = "auto"` writes JSON lines.
    assert!(logs.len() > 3, "{logs:?}");
    for line in &logs {
        let json: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(json["timestamp"].is_string() && json["level"].is_string() && json["message"].is_string(), "{line}");
    }
    assert!(logs.iter().any(|l| l.contains("\"message\":\"mailstream running\"")), "{logs:#?}");
}

#[test]
fn the_shipped_units_pass_systemd_analyze_verify() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("{root}/deploy/verify"))
        .arg(env!("CARGO_BIN_EXE_mailstream"))
        .output()
        .expect("deploy/verify runs (it needs systemd-analyze: apt-get install systemd)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "{text}");
}
