//! The daemon as a process of its own, as the benches that kill it run it: the shipped
//! config pointed at a private Redis and the emulator (short timeouts and leases, any
//! metrics port, no schedule), and `mailstream run` with its log appended to a file.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use mailstream::config::EXAMPLE;

/// The shipped config for a run against `redis_url` and the emulator at `emulator_url`,
/// with `more` lines replaced too.
pub fn config_text(redis_url: &str, emulator_url: &str, more: &[(&str, String)]) -> String {
    // The benchmarks kick by hand; the shipped schedule would fire by the wall clock.
    let mut text = EXAMPLE.replacen("schedule = \"0 9 * * MON\"", "", 1);
    let common = [
        ("url = \"redis://127.0.0.1:6379\"", format!("url = \"{redis_url}\"")),
        ("base_url = \"https://api.resend.com\"", format!("base_url = \"{emulator_url}\"")),
        ("timeout_seconds = 30", "timeout_seconds = 2".into()),
        ("lease_seconds = 15", "lease_seconds = 6".into()),
        ("metrics_listen = \"127.0.0.1:9464\"", "metrics_listen = \"127.0.0.1:0\"".into()),
    ];
    for (from, to) in common.iter().chain(more) {
        assert!(text.contains(from), "config.toml lost {from}");
        text = text.replacen(from, to, 1);
    }
    text
}

/// Starts `mailstream run` on `config`, its log appended to `log`.
#[allow(dead_code)] // not every bench that includes this module runs one instance
pub fn spawn_daemon(binary: &Path, config: &Path, log: &Path, api_key: &str) -> anyhow::Result<Child> {
    spawn_instance(binary, config, log, api_key, 1)
}

/// [`spawn_daemon`] as instance `instance` of this host (`MAILSTREAM_INSTANCE`).
pub fn spawn_instance(binary: &Path, config: &Path, log: &Path, api_key: &str, instance: u32) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    Command::new(binary)
        .args(["run", "--config"])
        .arg(config)
        .env("RESEND_API_KEY", api_key)
        .env("MAILSTREAM_INSTANCE", instance.to_string())
        .env("MAILSTREAM_UNSUBSCRIBE_SECRET", "unsubscribe-secret-of-the-bench")
        .env("MAILSTREAM_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))
}
