//! The `mailstream` binary run as an operator runs it: a scratch config from the
//! shipped one, a Redis given by URL, stdin, and what it printed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use mailstream::config::EXAMPLE;

/// The one-click unsubscribe secret the README has an operator set (the shipped
/// config's campaign is refused without one).
pub const UNSUBSCRIBE_SECRET: &str = "unsubscribe-secret-of-the-tests";

/// The binary with none of the operator's environment but the unsubscribe secret.
pub fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mailstream"));
    cmd.env_remove("RESEND_API_KEY")
        .env_remove("MAILSTREAM_REDIS_URL")
        .env_remove("MAILSTREAM_CONFIG")
        .env_remove("MAILSTREAM_LOG")
        .env_remove("MAILSTREAM_WEBHOOK_SECRET")
        .env_remove("MAILSTREAM_ADMIN_TOKEN")
        .env_remove("MAILSTREAM_INGEST_TOKEN")
        .env_remove("MAILSTREAM_RENDER_HOOK_SECRET")
        .env_remove("CREDENTIALS_DIRECTORY")
        .env("MAILSTREAM_UNSUBSCRIBE_SECRET", UNSUBSCRIBE_SECRET);
    cmd
}

/// The shipped config with some lines replaced, written to a scratch file.
pub fn config_file(name: &str, replace: &[(&str, &str)]) -> PathBuf {
    // Tests kick by hand; the shipped schedule would fire by the wall clock.
    let mut text = EXAMPLE.replacen("schedule = \"0 9 * * MON\"", "", 1);
    for (from, to) in replace {
        assert!(text.contains(from), "config.toml has no {from:?}");
        text = text.replacen(from, to, 1);
    }
    let dir = std::env::temp_dir().join(format!("mailstream-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Lines that make a config fit a test's throwaway Redis (no persistence) and emulator.
pub const TEST_REDIS: (&str, &str) = ("durability = \"strict\"", "durability = \"relaxed\"");
/// Port 0: each daemon gets a free port (leaving the line out would mean the default 9464,
/// which two daemons of parallel tests would fight over).
pub const ANY_METRICS_PORT: (&str, &str) = ("metrics_listen = \"127.0.0.1:9464\"", "metrics_listen = \"127.0.0.1:0\"");

pub fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().map(str::to_string).collect()
}

/// Runs `mailstream ARGS` against `redis` with `stdin`, the config's `--config` last.
pub fn run(config: &Path, redis: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = bin()
        .args(args)
        .arg("--config")
        .arg(config)
        .env("MAILSTREAM_REDIS_URL", redis)
        .env("RESEND_API_KEY", "re_cli_test")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}
