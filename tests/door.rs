//! Input checked at the door: an address, a zone, a size or an unknown id is refused
//! where it enters (a flag: 64; a line of a file: 65), naming the field and never the
//! value, and nothing of the refused input is written; a long import is written a batch
//! at a time; a stored record that fails the address rule is skipped at send.

mod common;

use std::time::Duration;

use common::cli::{ANY_METRICS_PORT, TEST_REDIS, config_file, run};
use common::{World, delivery, delivery_of};
use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::tools::emulator::EmulatorConfig;

async fn keys(url: &str) -> Vec<String> {
    let mut conn = redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.unwrap();
    keys.sort();
    keys
}

fn said(out: &std::process::Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_where_it_enters_naming_the_field_and_writing_nothing() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let url = redis.url();
    let small = ("max_data_bytes = 65536", "max_data_bytes = 1024");
    let config = config_file("door.toml", &[TEST_REDIS, ANY_METRICS_PORT, small]);
    let made = run(&config, &url, &["subscribe", "--id", "u1", "--email", "ann@acme.example"], "");
    assert!(made.status.success(), "{:?}", said(&made));
    let before = keys(&url).await;
    let big = format!("{{\"id\":\"z1\",\"email\":\"z@acme.example\",\"data\":{{\"x\":\"{}\"}}}}\n", "y".repeat(2000));
    let cases: Vec<(Vec<&str>, String, i32, &str)> = vec![
        (vec!["suppressions", "add", "--email", "nope"], String::new(), 64, "--email: the address has no @"),
        (vec!["suppressions", "add", "--email", "Ann <ann@acme.example>"], String::new(), 64, "--email"),
        (vec!["subscribe", "--id", "u2", "--email", "ann@localhost"], String::new(), 64, "--email: the address"),
        (vec!["subscribe", "--id", "u2", "--email", "\"a b\"@acme.example"], String::new(), 64, "--email"),
        (
            vec!["subscribe", "--id", "u1", "--time-zone", "Mars/Olympus"],
            String::new(),
            64,
            "--time-zone: \"Mars/Olympus\" is not an IANA time zone",
        ),
        (
            vec!["subscribe", "--ndjson", "-"],
            "{\"id\":\"u3\",\"email\":\"c@acme.example\",\"time_zone\":\"Mars/Olympus\"}\n".into(),
            65,
            "line 1: time_zone: \"Mars/Olympus\"",
        ),
        (vec!["subscribe", "--ndjson", "-"], big.clone(), 65, "line 1: data: 2008 bytes, more than subscribers.max_data_bytes (1024)"),
        (
            vec!["kick", "--campaign", "weekly_digest", "--audience", "-"],
            big,
            65,
            "data: 2008 bytes, more than subscribers.max_data_bytes (1024)",
        ),
        (
            vec!["subscribe", "--ndjson", "-"],
            "{\"id\":\"u3\",\"email\":\"c@acme.example\"}\n\n{\"id\":\"u4\",\"nmae\":\"x\",\"email\":\"d@acme.example\"}\n".into(),
            65,
            "line 3: unknown field \"nmae\"; expected one of id, email, targets",
        ),
        (
            vec!["subscribe", "--ndjson", "-"],
            "{\"id\":\"u3\",\"email\":\"secret person@acme.example\"}\n".into(),
            65,
            "line 1: email: the address has a character a dot-atom local part does not take",
        ),
        (vec!["enqueue", "--key", "k1", "--subscriber", "nosuch", "--subject", "s", "--text", "t"], String::new(), 65, "unknown_subscriber"),
        (vec!["enqueue", "--key", "k1", "--to", "nope", "--subject", "s", "--text", "t"], String::new(), 64, "--to: the address has no @"),
        (vec!["dead-letters", "retry", "a b c"], String::new(), 64, "\"a b c\" is not a delivery id"),
    ];
    for (args, stdin, code, names) in cases {
        let out = run(&config, &url, &args, &stdin);
        let (o, e) = said(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {e}");
        assert!(e.contains(names), "{args:?} names {names:?}: {e}");
        assert!(o.is_empty(), "{args:?}: refusals on stderr, stdout empty: {o}");
        assert!(!e.contains("secret person"), "never the value: {e}");
        assert_eq!(keys(&url).await, before, "{args:?} wrote something");
    }
    // What the rule takes: an internationalized domain, a plus, an apostrophe.
    for email in ["ann@bücher.example", "o'brien+x@acme.example"] {
        let out = run(&config, &url, &["subscribe", "--id", "u5", "--email", email], "");
        assert!(out.status.success(), "{email}: {:?}", said(&out));
    }
    // --allow-unknown keeps today's behaviour: enqueued, skipped at send if still unknown.
    let args = ["enqueue", "--key", "k2", "--subscriber", "nosuch", "--subject", "s", "--text", "t", "--allow-unknown"];
    let out = run(&config, &url, &args, "");
    assert!(out.status.success(), "{:?}", said(&out));
}

/// A long NDJSON import from stdin: every line checked before the first write (a bad
/// line near the end writes nothing), then written a batch at a time, nothing on stderr
/// when it is not a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_import_is_checked_whole_then_written_in_batches() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let url = redis.url();
    let config = config_file("door-import.toml", &[TEST_REDIS, ANY_METRICS_PORT]);
    let n = 3500;
    let lines: String = (0..n)
        .map(|i| format!("{{\"id\":\"imp-{i}\",\"email\":\"delivered+imp-{i}@resend.dev\",\"data\":{{\"i\":{i}}}}}\n"))
        .collect();
    // The shipped limit (64 KiB) refuses a record of 70 KB data, naming size and limit.
    let heavy =
        format!("{{\"id\":\"z1\",\"email\":\"z@acme.example\",\"data\":{{\"x\":\"{}\"}}}}\n", "y".repeat(70_000));
    let out = run(&config, &url, &["subscribe", "--ndjson", "-"], &heavy);
    let (_, e) = said(&out);
    assert_eq!(out.status.code(), Some(65), "{e}");
    assert!(e.contains("line 1: data: 70008 bytes, more than subscribers.max_data_bytes (65536)"), "{e}");
    assert!(keys(&url).await.is_empty());
    let spoiled = format!("{lines}{{\"id\":\"imp-x\",\"email\":\"nope\"}}\n");
    let out = run(&config, &url, &["subscribe", "--ndjson", "-"], &spoiled);
    let (_, e) = said(&out);
    assert_eq!(out.status.code(), Some(65), "{e}");
    assert!(e.contains(&format!("line {}: email", n + 1)), "{e}");
    assert!(keys(&url).await.is_empty(), "a bad last line wrote nothing");

    // With a scratch folder of its own, to see that its copy of stdin is removed.
    let scratch = config.parent().unwrap().join(format!("door-scratch-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut child = common::cli::bin()
        .args(["subscribe", "--ndjson", "-", "--json", "--config"])
        .arg(&config)
        .env("MAILSTREAM_REDIS_URL", &url)
        .env("TMPDIR", &scratch)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), lines.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (o, e) = said(&out);
    assert!(out.status.success(), "{e}");
    assert_eq!(e.trim(), format!("{n} subscribers written"), "no progress bar when stderr is not a terminal");
    let report: serde_json::Value = serde_json::from_str(o.trim()).unwrap();
    assert_eq!(report["written"], n);
    let mut conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let subscribers: Vec<String> =
        redis::cmd("KEYS").arg("mailstream:*subscriber:imp-*").query_async(&mut conn).await.unwrap();
    assert_eq!(subscribers.len(), n, "every record written");
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().collect();
    assert!(left.is_empty(), "the scratch copy of stdin is removed: {left:?}");

    // A kick's audience the same way: checked whole (a bad last line: nothing written),
    // then upserted and enqueued a batch at a time, counted as one kick.
    let audience: String =
        (0..2500).map(|i| format!("{{\"id\":\"aud-{i}\",\"email\":\"delivered+aud-{i}@resend.dev\"}}\n")).collect();
    let before = keys(&url).await;
    let kick = ["kick", "--campaign", "weekly_digest", "--audience", "-", "--json"];
    let out = run(&config, &url, &kick, &format!("{audience}{{\"id\":\"aud-x\"}}\n"));
    assert_eq!(out.status.code(), Some(65), "{:?}", said(&out));
    assert!(said(&out).1.contains("line 2501: missing field \"email\""), "{:?}", said(&out));
    assert_eq!(keys(&url).await, before, "a refused audience wrote nothing");
    let out = run(&config, &url, &kick, &audience);
    let (o, e) = said(&out);
    assert!(out.status.success(), "{e}");
    let report: serde_json::Value = serde_json::from_str(o.trim()).unwrap();
    assert_eq!((report["new"].as_u64(), report["duplicates"].as_u64()), (Some(2500), Some(0)), "{report}");
}

/// A record written by hand (or before the rule) whose address fails it is skipped at
/// send as `invalid_address`, never sent, never a refusal to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_address_that_fails_the_rule_is_skipped_at_send() {
    let mut world = World::new().await;
    let (emulator, _stop) = world.emulator(EmulatorConfig::default()).await;
    let subs = world.subscribers(3).await;
    let bad = &subs[1];
    let key = world.store.keys.subscriber(world.store.keys.partition_of(&bad.id), &bad.id);
    let mut conn = world.store.conn().await.unwrap();
    let _: () =
        redis::cmd("HSET").arg(&key).arg("email").arg("two words@resend.dev").query_async(&mut conn).await.unwrap();
    world.kick().await;
    let daemon = world.daemon();
    let counts = world.settled(Duration::from_secs(60)).await;
    daemon.stop().await;
    assert_eq!((counts.sent, counts.skipped), (2, 1), "{counts:?}");
    let record = delivery(&world.store, &delivery_of(bad).id()).await;
    assert_eq!((record["state"].as_str(), record["reason"].as_str()), ("skipped", "invalid_address"));
    assert!(emulator.sends_matching("two words").is_empty());
}
