//! The operator's contract on every path: every command clap knows (walked from its
//! definition, not a list kept here) is run against each error class — a bad flag or
//! value, a bad config, Redis down, Redis not answering, a prefix with no deployment —
//! and must exit with the code of the one mapping (`cli/exit.rs`), say the problem on
//! stderr, and leave stdout empty or valid JSON. A refused `run` writes nothing; the
//! units and the documented table agree with the mapping.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use common::cli::{ANY_METRICS_PORT, TEST_REDIS, bin, config_file};
use mailstream::cli::exit;
use mailstream::store::redis_server::{RedisOptions, RedisServer};

/// Every command of the definition, by its path (`["dead-letters", "list"]`).
fn leaves(cmd: &clap::Command, above: &[String], out: &mut Vec<Vec<String>>) {
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let path: Vec<String> = above.iter().cloned().chain([sub.get_name().to_string()]).collect();
        if sub.has_subcommands() {
            leaves(sub, &path, out);
        } else {
            out.push(path);
        }
    }
}

/// What a command touches.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Reads {
    /// Its config and Redis.
    Redis,
    /// Its config only.
    Config,
    /// Neither.
    Nothing,
}

/// How each command is run to reach its work: the arguments after its path, what it
/// reads, and whether it creates a deployment on a fresh prefix. A command clap knows
/// and this table does not fails the test: a new command joins the contract here.
fn how(path: &str) -> Option<(Vec<&'static str>, Reads, bool)> {
    use Reads::*;
    Some(match path {
        "run" => (vec![], Redis, true),
        "check-config" => (vec!["--json"], Config, false),
        "subscribe" => (vec!["--id", "u1", "--email", "a@acme.example", "--json"], Redis, true),
        "enqueue" => {
            (vec!["--key", "k1", "--to", "a@acme.example", "--subject", "s", "--text", "t", "--json"], Redis, true)
        }
        "kick" => (vec!["--campaign", "weekly_digest", "--json"], Redis, true),
        "schedule" => (vec!["--json"], Config, false),
        "preview" => (vec!["--campaign", "weekly_digest", "--subscriber", "u1", "--json"], Redis, false),
        "dead-letters list" => (vec!["--json"], Redis, false),
        "dead-letters retry" => (vec!["weekly_digest:2026-W48:u1:default", "--json"], Redis, false),
        "deliveries" => (vec!["--json"], Redis, false),
        "resume" => (vec!["--json"], Redis, false),
        "upgrade" => (vec!["--json"], Redis, false),
        "suppressions list" => (vec!["--json"], Redis, false),
        "suppressions add" => (vec!["--email", "a@acme.example", "--json"], Redis, true),
        "suppressions remove" => (vec!["--email", "a@acme.example", "--json"], Redis, true),
        // A dry run: it reaches Redis (and refuses a fresh prefix) before Resend.
        "suppressions sync" => (vec!["--dry-run", "--json"], Redis, false),
        "slo" => (vec!["--json"], Redis, false),
        "vapid-keys" => (vec!["--json"], Nothing, false),
        "completions" => (vec!["bash"], Nothing, false),
        "man" => (vec![], Nothing, false),
        "emulator" => (vec![], Nothing, false),
        "demo" => (vec![], Nothing, false),
        _ => return None,
    })
}

/// `mailstream slo` keeps its own 4 where it cannot evaluate.
fn expected(path: &str, code: u8) -> i32 {
    if path == "slo" && code == exit::UNAVAILABLE { 4 } else { code as i32 }
}

struct Case<'a> {
    path: &'a str,
    args: Vec<String>,
    config: &'a Path,
    redis: String,
}

fn run(case: &Case) -> Output {
    let mut cmd = bin();
    cmd.args(case.path.split(' ')).args(&case.args);
    // vapid-keys, completions, man, emulator and demo take no --config.
    if how(case.path).is_some_and(|(_, reads, _)| reads != Reads::Nothing) {
        cmd.arg("--config").arg(case.config);
    }
    let mut child = cmd
        .env("MAILSTREAM_REDIS_URL", &case.redis)
        .env("RESEND_API_KEY", "re_contract_test")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

/// The code, that stderr says `names` (any of them), and that stdout is empty or JSON.
fn check(case: &Case, out: &Output, code: i32, names: &[&str]) -> Result<(), String> {
    let err = String::from_utf8_lossy(&out.stderr);
    let said = format!("mailstream {} {}: exit {:?}\nstderr: {err}", case.path, case.args.join(" "), out.status.code());
    if out.status.code() != Some(code) {
        return Err(format!("{said}\nwanted exit {code}"));
    }
    if !names.is_empty() && !names.iter().any(|n| err.contains(n)) {
        return Err(format!("{said}\nstderr should name one of {names:?}"));
    }
    for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()) {
        if serde_json::from_str::<serde_json::Value>(line).is_err() {
            return Err(format!("{said}\nstdout is not empty nor JSON: {line:?}"));
        }
    }
    Ok(())
}

/// A server that accepts connections and never answers (a hung Redis).
fn silent_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    url
}

fn free_port_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("redis://127.0.0.1:{port}")
}

/// Every key of `redis`, sorted; none where no Redis answers there.
async fn keys(redis: &str) -> Vec<String> {
    let Ok(mut conn) = redis::Client::open(redis).unwrap().get_multiplexed_async_connection().await else {
        return Vec::new();
    };
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
    keys.sort();
    keys
}

async fn flush(redis: &str) {
    let mut conn = redis::Client::open(redis).unwrap().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
}

/// Runs `cases` on threads (a hung Redis costs each a timeout), collecting failures.
fn run_all(cases: Vec<(Case, i32, Vec<&str>)>) -> Vec<String> {
    std::thread::scope(|s| {
        let handles: Vec<_> =
            cases.iter().map(|(case, code, names)| s.spawn(move || check(case, &run(case), *code, names))).collect();
        handles.into_iter().filter_map(|h| h.join().unwrap().err()).collect()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_keeps_the_contract_on_every_error_class() {
    let mut paths = Vec::new();
    leaves(&mailstream::cli::definition(), &[], &mut paths);
    let paths: Vec<String> = paths.iter().map(|p| p.join(" ")).collect();
    let unknown: Vec<&String> = paths.iter().filter(|p| how(p).is_none()).collect();
    assert!(unknown.is_empty(), "commands the contract table does not know: {unknown:?}");
    assert!(paths.len() >= 20, "{paths:?}");

    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let url = redis.url();
    let timeout = ("response_timeout_ms = 10000", "response_timeout_ms = 1500");
    let good = config_file("contract.toml", &[TEST_REDIS, ANY_METRICS_PORT, timeout]);
    let bad =
        config_file("contract-bad.toml", &[TEST_REDIS, ANY_METRICS_PORT, ("partitions = 1", "partitions = \"x\"")]);
    let down = free_port_url();
    let silent = silent_server();
    let dir = good.parent().unwrap().to_path_buf();
    let case = |path: &'static str, config: &'static Path, redis: &str, extra: &[&str]| {
        let (mut args, _, _) = how(path).unwrap();
        let mut args: Vec<String> = args.drain(..).map(str::to_string).collect();
        if path == "vapid-keys" {
            let key = dir.join(format!("vapid-{}-{}.pem", std::process::id(), rand_suffix()));
            args.extend(["--out".to_string(), key.to_string_lossy().to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Case { path, args, config, redis: redis.to_string() }
    };
    // 'static paths and configs for the threads.
    let paths: Vec<&'static str> = paths.into_iter().map(|p| &*Box::leak(p.into_boxed_str())).collect();
    let good: &'static Path = Box::leak(good.into_boxed_path());
    let bad: &'static Path = Box::leak(bad.into_boxed_path());
    let mut failures = Vec::new();

    // A flag no command has: a usage error, nothing on stdout.
    let cases = paths.iter().map(|&p| (case(p, good, &url, &["--no-such-flag"]), 64, vec!["--no-such-flag"])).collect();
    failures.extend(run_all(cases));

    // A config that is not valid: every command that reads one says the key, exits 78.
    let cases = paths
        .iter()
        .filter(|p| how(p).unwrap().1 != Reads::Nothing)
        .map(|&p| (case(p, bad, &url, &[]), 78, vec!["redis.partitions"]))
        .collect();
    failures.extend(run_all(cases));

    // Redis down, then Redis not answering: 69 (slo: 4) where the command needs Redis;
    // a command that reads only its config does its work.
    for redis in [&down, &silent] {
        let cases = paths
            .iter()
            .filter(|p| how(p).unwrap().1 != Reads::Nothing)
            .map(|&p| match how(p).unwrap().1 {
                Reads::Redis => (case(p, good, redis, &[]), expected(p, exit::UNAVAILABLE), vec!["Redis"]),
                _ => (case(p, good, redis, &[]), 0, vec![]),
            })
            .collect();
        failures.extend(run_all(cases));
    }

    // A prefix with no deployment: what creates one does; what reads or maintains one
    // exits 78 (slo: 4) and writes nothing. (`run` is left out: it would run.)
    for &p in paths.iter().filter(|p| how(p).unwrap().1 == Reads::Redis && **p != "run") {
        flush(&url).await;
        let c = case(p, good, &url, &[]);
        let out = run(&c);
        let creates = how(p).unwrap().2;
        let result = if creates {
            check(&c, &out, 0, &[])
        } else {
            let code = if p == "slo" { 4 } else { 78 };
            check(&c, &out, code, &["no deployment under prefix mailstream", "no mailstream deployment under prefix"])
        };
        failures.extend(result.err());
        let written = keys(&url).await;
        if !creates && !written.is_empty() {
            failures.push(format!("mailstream {p} on a fresh prefix wrote {written:?}"));
        }
    }
    assert!(failures.is_empty(), "{} broken:\n\n{}", failures.len(), failures.join("\n\n"));
}

/// Values our own code parses, not clap's: each a usage error (64) naming the flag, on
/// a deployment that exists, so only the value is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_value_of_any_flag_is_a_usage_error_that_names_it() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let url = redis.url();
    let config: &'static Path =
        Box::leak(config_file("contract-values.toml", &[TEST_REDIS, ANY_METRICS_PORT]).into_boxed_path());
    let args = ["--id", "u1", "--email", "a@acme.example"].map(String::from).to_vec();
    let out = run(&Case { path: "subscribe", args, config, redis: url.clone() });
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bad: Vec<(&'static str, Vec<&str>, &str)> = vec![
        ("kick", vec!["--campaign", "nope"], "nope"),
        ("kick", vec!["--campaign", "weekly_digest", "--period", "someday"], "--period"),
        ("kick", vec!["--campaign", "weekly_digest", "--period", "last"], "--period"),
        ("preview", vec!["--campaign", "nope", "--subscriber", "u1"], "nope"),
        ("preview", vec!["--campaign", "weekly_digest", "--subscriber", "u1", "--period", "2026-W99"], "2026-W99"),
        ("deliveries", vec!["--status", "bogus"], "bogus"),
        ("deliveries", vec!["--since", "yesterday"], "--since"),
        ("deliveries", vec!["--cursor", "zzz"], "cursor"),
        ("deliveries", vec!["--limit", "many"], "--limit"),
        ("deliveries", vec!["--limit", "0"], "limit"),
        ("dead-letters list", vec!["--limit=-3"], "--limit"),
        (
            "enqueue",
            vec!["--key", "k1", "--to", "a@acme.example", "--subject", "s", "--text", "t", "--data", "{"],
            "--data",
        ),
        ("subscribe", vec!["--id", "u1", "--off", "nope"], "--off"),
        ("subscribe", vec!["--id", "u1", "--off", "weekly_digest:fax"], "fax"),
        ("subscribe", vec!["--id", "u1", "--entitled", "maybe"], "--entitled"),
        ("subscribe", vec!["--id", "u1", "--push-subscription", "{}"], "--push-subscription"),
        ("schedule", vec!["--next=-1"], "--next"),
        ("completions", vec!["tcsh"], "tcsh"),
        ("man", vec!["nope"], "nope"),
        ("demo", vec!["--channels", "email,fax"], "fax"),
    ];
    let before = keys(&url).await;
    let cases = bad
        .into_iter()
        .map(|(path, args, names)| {
            let args = args.into_iter().map(str::to_string).collect();
            (Case { path, args, config, redis: url.clone() }, 64, vec![names])
        })
        .collect();
    let failures = run_all(cases);
    assert!(failures.is_empty(), "{} broken:\n\n{}", failures.len(), failures.join("\n\n"));
    assert_eq!(keys(&url).await, before, "a refused value wrote nothing");
}

/// Input data that is refused (65) or cannot be read (66): nothing of it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_data_exits_65_and_an_unreadable_file_66_and_nothing_is_written() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let url = redis.url();
    let config = config_file("contract-data.toml", &[TEST_REDIS, ANY_METRICS_PORT]);
    let dir = config.parent().unwrap().to_path_buf();
    let not_utf8 = dir.join("contract-latin1.ndjson");
    std::fs::write(&not_utf8, b"{\"id\":\"u\xe9\"}\n").unwrap();
    let missing = dir.join("contract-no-such-file.ndjson");
    let runs: Vec<(Vec<&str>, &str, i32, &str)> = vec![
        (vec!["subscribe", "--ndjson", "-"], "{\"id\":\"u1\",\"email\":\"a@acme.example\"}\nnot json\n", 65, "line 2"),
        (vec!["subscribe", "--ndjson", "-"], "{\"id\":\"u1\",\"nope\":1}\n", 65, "line 1"),
        (vec!["enqueue", "--ndjson", "-"], "{\"idempotency_key\":\"a\"}\n{\n", 65, "line 2"),
        (vec!["kick", "--campaign", "weekly_digest", "--audience", "-"], "", 65, "empty"),
        (vec!["kick", "--campaign", "weekly_digest", "--audience", "-"], "[1]\n", 65, "line 1"),
        (vec!["subscribe", "--ndjson", not_utf8.to_str().unwrap()], "", 65, "UTF-8"),
        (vec!["subscribe", "--ndjson", missing.to_str().unwrap()], "", 66, "cannot read"),
        (vec!["kick", "--campaign", "weekly_digest", "--audience", missing.to_str().unwrap()], "", 66, "cannot read"),
    ];
    for (args, stdin, code, names) in runs {
        let out = common::cli::run(&config, &url, &args, stdin);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(names), "{args:?} names {names}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
        assert!(keys(&url).await.is_empty(), "{args:?} wrote something");
    }
}

/// `run` refused at start, for each reason it refuses, writes nothing to Redis, and
/// exits with the mapping's code; its last log line is JSON (its log is JSON off a
/// terminal) and carries that code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_run_writes_nothing() {
    let lossy = RedisServer::start(RedisOptions::default()).await.unwrap();
    let durable = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await.unwrap();
    let other = RedisServer::start(RedisOptions { appendonly: true, ..Default::default() }).await.unwrap();
    let strict = config_file("contract-strict.toml", &[ANY_METRICS_PORT]);
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_line = format!("metrics_listen = \"{}\"", busy.local_addr().unwrap());
    let in_use = config_file(
        "contract-busy.toml",
        &[("metrics_listen = \"127.0.0.1:9464\"", &busy_line), ("bind_retry_seconds = 10", "bind_retry_seconds = 1")],
    );
    let bad_listen = config_file(
        "contract-listen.toml",
        &[("metrics_listen = \"127.0.0.1:9464\"", "metrics_listen = \"localhost\"")],
    );
    let two = config_file("contract-two.toml", &[ANY_METRICS_PORT, ("partitions = 1", "partitions = 2")]);
    // A deployment of 2 partitions, made by a command that creates one.
    let made = common::cli::run(&two, &other.url(), &["subscribe", "--id", "u1", "--email", "a@acme.example"], "");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));

    let runs: Vec<(&Path, String, bool, i32, &str)> = vec![
        (&strict, lossy.url(), true, 78, "appendonly no"),
        (&strict, durable.url(), false, 78, "no Resend API key"),
        (&in_use, durable.url(), true, 69, "still in use"),
        (&bad_listen, durable.url(), true, 78, "http.metrics_listen"),
        (&strict, other.url(), true, 78, "created with 2"),
        (&strict, free_port_url(), true, 69, "Redis"),
    ];
    for (config, redis, key, code, names) in runs {
        let before = keys(&redis).await;
        let mut cmd = bin();
        cmd.arg("run").arg("--config").arg(config).env("MAILSTREAM_REDIS_URL", &redis);
        if key {
            cmd.env("RESEND_API_KEY", "re_contract_test");
        }
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{}: {err}", config.display());
        assert!(out.stdout.is_empty());
        let last: serde_json::Value = serde_json::from_str(err.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("the last line is JSON ({e}): {err}"));
        assert!(last["message"].as_str().is_some_and(|m| m.contains(names)), "{names}: {last}");
        assert_eq!(last["exit_code"], code, "{last}");
        assert_eq!(keys(&redis).await, before, "{}: a refused run wrote", config.display());
    }
    assert!(keys(&durable.url()).await.is_empty());
}

/// The units do not restart on exactly the codes that do not mend themselves, and the
/// documented table lists every code of the mapping, and no other.
#[test]
fn the_units_and_the_documented_table_are_the_mapping() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for unit in ["deploy/mailstream.service", "deploy/mailstream@.service"] {
        let text = std::fs::read_to_string(root.join(unit)).unwrap();
        let line = text.lines().find_map(|l| l.strip_prefix("RestartPreventExitStatus=")).expect(unit);
        let codes: Vec<u8> = line.split_whitespace().map(|c| c.parse().unwrap()).collect();
        assert_eq!(codes, vec![exit::USAGE, exit::CONFIG], "{unit}");
    }
    let docs = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    let table: Vec<u8> =
        docs.lines().filter_map(|l| l.strip_prefix("| ")?.split(" |").next()?.trim().parse().ok()).collect();
    let mapping = vec![
        exit::OK,
        exit::FAILED,
        exit::USAGE,
        exit::DATA,
        exit::NO_INPUT,
        exit::UNAVAILABLE,
        exit::CANNOT_CREATE,
        exit::CONFIG,
    ];
    assert_eq!(table, mapping, "docs/configuration.md's exit-code table");
    let help = bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    for code in &mapping[1..] {
        assert!(help.contains(&format!(" {code} ")), "--help names {code}: {help}");
    }
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// `check-config` refuses what `run` refuses, the Resend API key included unless
/// `--offline`, and with `--json` prints `{"ok": false, "errors": [{key, line,
/// message}]}` for every refusal: a file that cannot be read or is not TOML too.
#[test]
fn check_config_json_says_every_refusal_with_its_key_and_line() {
    let refused: Vec<(PathBuf, Option<&str>, Option<usize>, &str)> = vec![
        (
            config_file("cc-type.toml", &[("partitions = 1", "partitions = \"x\"")]),
            Some("redis.partitions"),
            None,
            "u16",
        ),
        (
            config_file("cc-unknown.toml", &[("pool_size = 32", "pool_size = 32\nnope = 1")]),
            Some("redis.nope"),
            None,
            "nope",
        ),
        (config_file("cc-syntax.toml", &[("[redis]", "[redis")]), Some("redis"), None, "]"),
        (
            config_file("cc-value.toml", &[("batch_size = 100", "batch_size = 250")]),
            Some("resend.batch_size"),
            None,
            "250",
        ),
        (PathBuf::from("/nonexistent/mailstream.toml"), None, None, "cannot read"),
    ];
    for (path, key, _, says) in &refused {
        let out = bin()
            .args(["check-config", "--json", "--config"])
            .arg(path)
            .env("RESEND_API_KEY", "re_x")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{}: {err}", path.display());
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
        assert_eq!(report["ok"], false, "{report}");
        let first = &report["errors"][0];
        assert_eq!(first["key"].as_str(), *key, "{report}");
        assert!(first["message"].as_str().is_some_and(|m| m.contains(says)), "{says}: {report}");
        if key.is_some() {
            let line = first["line"].as_u64().expect("a line") as usize;
            let text = std::fs::read_to_string(path).unwrap();
            let field = key.unwrap().rsplit('.').next().unwrap();
            assert!(text.lines().nth(line - 1).unwrap().contains(field), "line {line} holds {field}: {report}");
        }
    }
    // No Resend API key: run would refuse, so check-config does; --offline does not ask.
    let shipped = config_file("cc-nokey.toml", &[]);
    let out = bin().args(["check-config", "--json", "--config"]).arg(&shipped).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["errors"][0]["key"], "resend.api_key", "{report}");
    assert!(report["features"].is_object(), "what the config holds is still said: {report}");
    let offline = bin().args(["check-config", "--offline", "--config"]).arg(&shipped).output().unwrap();
    assert_eq!(offline.status.code(), Some(0), "{}", String::from_utf8_lossy(&offline.stderr));
}

/// stdout carries the result only: without `--json` the lines for people and no JSON,
/// refusals on stderr (an enqueue item refused, a retry of what is not a dead letter);
/// a `run` refused on a config that is not TOML says file, line and key on one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_on_stdout_refusals_on_stderr() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let url = redis.url();
    let config = config_file("contract-streams.toml", &[TEST_REDIS, ANY_METRICS_PORT]);
    let item = |to: &str| ["enqueue", "--key", "k1", "--to", to, "--subject", "s", "--text", "t"].map(String::from);
    let runs: Vec<(Vec<String>, i32, &str, &str)> = vec![
        (item("a@acme.example").to_vec(), 0, "item 1: accepted", ""),
        (item("a@acme.example").to_vec(), 0, "item 1: duplicate", ""),
        (item("b@acme.example").to_vec(), 1, "0 accepted, 0 duplicates, 1 refused", "item 1: refused"),
        (["dead-letters", "retry", "transactional:2026-12-05:-:k1"].map(String::from).to_vec(), 1, "", "transactional"),
    ];
    for (args, code, out_says, err_says) in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = common::cli::run(&config, &url, &args, "");
        let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(code), "{args:?}: {e}");
        assert!(o.contains(out_says) && e.contains(err_says), "{args:?}\nstdout: {o}\nstderr: {e}");
        assert!(!o.contains('{') && !o.contains("refused:"), "{args:?}: no JSON, no refusal on stdout: {o}");
    }
    let bad = config_file("contract-toml.toml", &[("[redis]", "[redis")]);
    let out = bin().arg("run").arg("--config").arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let line: serde_json::Value = serde_json::from_str(err.trim()).unwrap();
    let message = line["message"].as_str().unwrap();
    assert!(message.contains("contract-toml.toml:16: redis: "), "{message}");
}

/// `mailstream man` is a roff page from the same definitions as the parser (a command's
/// own page too), and `completions` a script that knows every command.
#[test]
fn the_manual_and_the_completions_come_from_the_definitions() {
    let page = bin().arg("man").output().unwrap();
    let roff = String::from_utf8_lossy(&page.stdout);
    assert!(page.status.success() && roff.contains(".TH mailstream 1") && roff.contains("check\\-config"), "{roff}");
    let kick = bin().args(["man", "kick"]).output().unwrap();
    let roff = String::from_utf8_lossy(&kick.stdout);
    assert!(roff.contains(".TH mailstream-kick 1") && roff.contains("allow\\-any\\-period"), "{roff}");
    let mut commands = Vec::new();
    leaves(&mailstream::cli::definition(), &[], &mut commands);
    for shell in ["bash", "zsh", "fish"] {
        let script = bin().args(["completions", shell]).output().unwrap();
        let script = String::from_utf8_lossy(&script.stdout);
        for command in commands.iter().filter_map(|c| c.last()) {
            assert!(script.contains(command.as_str()), "{shell} completes {command}");
        }
    }
}
