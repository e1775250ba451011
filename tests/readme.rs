//! The documentation's command lines run as written: every line of a code block in
//! `README.md`, then in the files of `docs/` (in the order `DOCS` lists them), then in
//! `deploy/README.md`, that starts with `mailstream` or `curl`, in that order, through
//! `sh`, against the shipped `config.toml`, with the variables the README exports set,
//! a private Redis (append-only, as production runs it) and the Resend emulator.
//! `mailstream run` is started in the background where the README starts it and
//! stopped at the end. A line that pipes into `mailstream` runs too, with the program
//! it reads from defined where the document defines it, as a one-line shell function
//! (`app_export() { … }`) that the lines after it see.
//!
//! What a reader fills in, and only that, is filled in here: the config's path
//! (`/etc/mailstream/config.toml`) and the credentials' folder, the public listener's address
//! (`127.0.0.1:8080`, a free port here). Periods and ids run as written (`--period
//! previous` where the line means last week). A line exits 0 unless its comment says
//! `exit N`, and then with N. A line that needs systemd or the real provider says `needs systemd` or `needs
//! the real provider` in its comment and is skipped by that mark.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::cli::{ANY_METRICS_PORT, UNSUBSCRIBE_SECRET, config_file};
use common::{Logged, start_emulator};
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::emulator::EmulatorConfig;

/// The files of `docs/` whose command lines run, in this order, after the README's
/// (which starts the daemon, writes the subscribers and kicks the campaign these lines
/// use) and before `deploy/README.md`'s. Each is listed by name, so a new file joins
/// at the place its lines need rather than wherever the directory lists it: the
/// configuration (schedules, the dry run, a preview of u42), the HTTP API (ingest
/// through the running daemon's public listener, then suppressions), Resend as it is today
/// (a dry run of the suppressions sync against the emulator), the channels
/// (u42's application events and browsers), operations (dead letters, the delivery
/// log, the SLO, over what the lines before wrote); the rest have no command lines.
const DOCS: [&str; 8] = [
    "docs/configuration.md",
    "docs/http-api.md",
    "docs/resend.md",
    "docs/channels.md",
    "docs/operations.md",
    "docs/redis.md",
    "docs/protocol.md",
    "docs/architecture.md",
];

/// One command line of a document, or a shell function it defines for the lines after.
#[derive(Debug)]
struct Documented {
    at: String,
    line: String,
    definition: bool,
}

/// Whether `command` defines a shell function on one line: `name() { …; }`.
fn defines_a_function(command: &str) -> bool {
    command.split_once("() {").is_some_and(|(name, _)| {
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// The command lines of `file`'s fenced code blocks. In a block that shows a
/// session (lines starting with `$ `), only those lines are commands; a line whose
/// single quotes are open continues on the next.
fn documented(file: &str) -> Vec<Documented> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let mut found = Vec::new();
    let mut block: Vec<(usize, &str)> = Vec::new();
    let mut inside = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            if inside {
                let session = block.iter().any(|(_, l)| l.starts_with("$ "));
                let mut lines = block.drain(..).filter_map(|(n, l)| match session {
                    true => l.strip_prefix("$ ").map(|l| (n, l)),
                    false => Some((n, l)),
                });
                while let Some((n, l)) = lines.next() {
                    let mut command = l.to_string();
                    while quote_open(&command) {
                        let Some((_, more)) = lines.next() else { break };
                        command = format!("{command}\n{more}");
                    }
                    // After any `NAME=value` assignments, as in `CREDENTIALS_DIRECTORY=… mailstream …`,
                    // in any stage of a pipe (`app_export | mailstream kick …`).
                    let runs = command.split(" | ").any(|stage| {
                        let program = stage.split_whitespace().find(|w| !w.contains('=')).unwrap_or("");
                        program == "mailstream" || program == "curl"
                    });
                    let definition = defines_a_function(&command);
                    if runs || definition {
                        found.push(Documented { at: format!("{file}:{}", n + 1), line: command, definition });
                    }
                }
            }
            inside = !inside;
        } else if inside {
            block.push((n, line));
        }
    }
    found
}

/// Whether `command` ends inside single quotes (a `#` comment outside quotes, with
/// its apostrophes, does not count).
fn quote_open(command: &str) -> bool {
    let (mut open, mut word_start) = (false, true);
    for c in command.chars() {
        match c {
            '\'' => open = !open,
            '#' if !open && word_start => return false,
            _ => {}
        }
        word_start = c.is_whitespace();
    }
    open
}

/// The exit code a documented line says it ends with: `exit N` in its comment, else 0.
fn documented_exit(line: &str) -> i32 {
    let comment = line.split_once(" # ").map(|(_, c)| c).unwrap_or("");
    comment
        .split("exit ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or(0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn said(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_command_line_runs_as_written() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let unlisted: Vec<String> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| format!("docs/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|f| f.ends_with(".md") && !DOCS.contains(&f.as_str()))
        .collect();
    assert!(unlisted.is_empty(), "docs files missing from DOCS, the order their command lines run in: {unlisted:?}");
    let files = std::iter::once("README.md").chain(DOCS).chain(["deploy/README.md"]);
    let lines: Vec<Documented> = files.flat_map(documented).collect();
    assert!(lines.len() > 25, "the README's command lines were found: {lines:#?}");

    let redis = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await.unwrap();
    let (_emulator, emulator_url, _stop) = start_emulator(EmulatorConfig::default()).await;
    let public = format!("127.0.0.1:{}", free_port());
    let resend = format!("base_url = \"{emulator_url}\"");
    let listen = format!("public_listen = \"{public}\"");
    let config = config_file(
        "readme.toml",
        &[
            ("base_url = \"https://api.resend.com\"", &resend),
            ("# public_listen = \"127.0.0.1:8080\"", &listen),
            ANY_METRICS_PORT,
        ],
    );
    // The files the README's lines name, where a reader would have them.
    let dir = config.parent().unwrap().join("readme-cwd");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("subscribers.ndjson"),
        "{\"id\":\"u43\",\"email\":\"bo@acme.example\",\"targets\":[\"team-7\"],\"data\":{\"name\":\"Bo\"}}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("items.ndjson"),
        "{\"idempotency_key\": \"order-1236\", \"to\": \"ann@acme.example\", \"template\": \"receipt\", \"data\": {\"order\": \"1236\"}}\n",
    )
    .unwrap();

    // The credentials deploy/README.md stores (the tests' own values).
    let credentials = dir.join("credentials");
    std::fs::create_dir_all(&credentials).unwrap();
    std::fs::write(credentials.join("unsubscribe_secret"), UNSUBSCRIBE_SECRET).unwrap();
    std::fs::write(credentials.join("resend_api_key"), "re_readme_test").unwrap();
    let filled = |line: &str| {
        line.replace("/etc/mailstream/config.toml", config.to_str().unwrap())
            .replace("/etc/mailstream/credentials", credentials.to_str().unwrap())
            .replace("127.0.0.1:8080", &public)
    };
    let bin_dir = PathBuf::from(env!("CARGO_BIN_EXE_mailstream")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let shell = |line: &str| {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(line)
            .current_dir(&dir)
            .env("PATH", &path)
            .env("MAILSTREAM_CONFIG", &config)
            .env("RESEND_API_KEY", "re_readme_test")
            .env("MAILSTREAM_UNSUBSCRIBE_SECRET", UNSUBSCRIBE_SECRET)
            .env("MAILSTREAM_INGEST_TOKEN", "ingest-token-of-the-readme-test")
            .env("MAILSTREAM_REDIS_URL", redis.url())
            .env_remove("MAILSTREAM_LOG")
            .env_remove("CREDENTIALS_DIRECTORY");
        cmd
    };

    assert!(
        lines.iter().any(|l| l.line.starts_with("app_export | mailstream")),
        "the line that pipes an export into a kick is found"
    );
    let mut daemon: Option<Logged> = None;
    let mut functions = String::new();
    for Documented { at, line, definition } in &lines {
        if line.contains("needs systemd") || line.contains("needs the real provider") {
            continue;
        }
        if *definition {
            functions.push_str(line);
            functions.push('\n');
            continue;
        }
        let line = filled(line);
        if line.starts_with("mailstream run ") {
            // `exec`: the daemon is the child the test signals, not a shell around it.
            let started = Logged::spawn(shell(&format!("exec {line}")).stdout(std::process::Stdio::null()));
            let up = started.line_with("mailstream running", Duration::from_secs(60)).await;
            assert!(up.is_some(), "{at}: {line}: the daemon did not start: {:#?}", started.lines.lock().unwrap());
            daemon = Some(started);
            continue;
        }
        let out = tokio::task::spawn_blocking({
            let mut cmd = shell(&format!("{functions}{line}"));
            move || cmd.output().unwrap()
        })
        .await
        .unwrap();
        assert_eq!(out.status.code(), Some(documented_exit(&line)), "{at}: {line}\n{}", said(&out));
        if line.starts_with("curl ") {
            let body: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            assert!(body["accepted"].as_u64() > Some(0) && body["refused"] == 0, "{at}: {line}\n{}", said(&out));
        }
    }
    let daemon = daemon.expect("the README starts the daemon");
    daemon.signal("TERM");
    let (code, log) = daemon.wait().await;
    assert_eq!(code, Some(0), "{log:#?}");
    assert!(log.iter().any(|l| l.contains("unsubscribe=one_click(env)")), "the features line: {log:#?}");
}

/// Every program the tests start, and every Python package they import, is named in
/// the README's set-up paragraph and installed by `.ci/run` where it is missing.
#[test]
fn the_readme_names_every_tool_the_tests_need() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let setup = &readme[..readme.find("```").unwrap()];
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let mut needed = std::collections::BTreeSet::from(["redis-server", "systemd-analyze"]);
    let sources: Vec<String> = std::fs::read_dir(root.join("tests"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
        .collect();
    let shell = ["sh", "kill", "python3", "env"];
    // Python packages from PyPI the tests' scripts import (the standard library aside).
    let from_pypi = ["svix", "resend"];
    for source in &sources {
        for opener in ["tool(\"", "which(\"", "Command::new(\""] {
            for (at, _) in source.match_indices(opener) {
                let rest = &source[at + opener.len()..];
                let name = &rest[..rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).unwrap_or(0)];
                if !name.is_empty() && !shell.contains(&name) {
                    needed.insert(name);
                }
            }
        }
        for line in source.lines().filter(|l| l.contains("import ")) {
            let words: Vec<&str> = line.split(|c: char| !c.is_ascii_alphanumeric()).collect();
            needed.extend(from_pypi.iter().filter(|p| words.contains(p)));
        }
    }
    for tool in &needed {
        assert!(setup.contains(&format!("`{tool}`")), "the README's set-up paragraph names `{tool}`");
        assert!(ci.contains(tool), ".ci/run installs {tool} where it is missing");
    }
    assert!(needed.len() >= 9, "{needed:?}");
}
