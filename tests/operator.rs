//! The operator's first hour: what a newcomer meets with the shipped config and the
//! README, held to what it should be (one test per finding that failed before).

mod common;

use common::cli::*;
use mailstream::store::redis_server::{RedisOptions, RedisServer};

/// The stored fields of subscriber `id` (whatever its partition).
async fn record(url: &str, id: &str) -> std::collections::HashMap<String, String> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("*:subscriber:{id}")).query_async(&mut conn).await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    redis::cmd("HGETALL").arg(&keys[0]).query_async(&mut conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_changes_only_the_fields_it_is_given() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let (path, url) = (config_file("subscribe.toml", &[]), redis.url());
    let ann = "{\"id\":\"u9\",\"email\":\"ann@acme.example\",\"targets\":[\"team-9\"],\"data\":{\"name\":\"Ann\"},\"time_zone\":\"Europe/Berlin\"}\n";
    assert!(run(&path, &url, &["subscribe", "--ndjson", "-"], ann).status.success());

    // The plan is cancelled, then back: the target, data and zone stay.
    let out = run(&path, &url, &["subscribe", "--id", "u9", "--entitled", "false"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = record(&url, "u9").await;
    assert_eq!((r["entitled"].as_str(), r["targets"].as_str()), ("0", "team-9"), "{r:?}");
    assert_eq!((r["data"].as_str(), r["time_zone"].as_str()), ("{\"name\":\"Ann\"}", "Europe/Berlin"), "{r:?}");
    assert!(run(&path, &url, &["subscribe", "--id", "u9", "--entitled", "true"], "").status.success());
    let r = record(&url, "u9").await;
    assert_eq!(
        (r["entitled"].as_str(), r["targets"].as_str(), r["email"].as_str()),
        ("1", "team-9", "ann@acme.example")
    );

    // --replace writes the whole record from the flags.
    let out = run(&path, &url, &["subscribe", "--id", "u9", "--email", "ann@acme.example", "--replace"], "");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = record(&url, "u9").await;
    assert_eq!(r["targets"], "default", "{r:?}");
    assert!(!r.contains_key("data") && !r.contains_key("time_zone"), "{r:?}");

    // A subscriber not yet in the registry needs an address: a usage error (64).
    let out = run(&path, &url, &["subscribe", "--id", "u10", "--entitled", "false"], "");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--email is needed"), "{out:?}");
}

/// How many keys the Redis at `url` holds.
async fn dbsize(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Stdout is exactly one JSON object.
fn one_object(args: &[&str], out: &std::process::Output) -> serde_json::Value {
    let text = stdout(out);
    assert_eq!(text.trim_end().lines().count(), 1, "{args:?}: one line on stdout:\n{text}\n{}", stderr(out));
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: stdout is not JSON ({e}):\n{text}"));
    assert!(value.is_object(), "{args:?}: {value}");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_write_nothing_and_slo_on_an_empty_prefix_cannot_evaluate() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let (path, url) = (config_file("reads.toml", &[]), redis.url());
    let reads: [&[&str]; 9] = [
        &["slo"],
        &["deliveries"],
        &["deliveries", "--campaign", "weekly_digest", "--json"],
        &["dead-letters", "list"],
        &["dead-letters", "list", "--unknown", "--json"],
        &["suppressions", "list"],
        &["suppressions", "list", "--email", "ann@acme.example"],
        &["kick", "--campaign", "weekly_digest", "--dry-run"],
        &["preview", "--campaign", "weekly_digest", "--subscriber", "u1"],
    ];
    for args in reads {
        let out = run(&path, &url, args, "");
        assert_eq!(dbsize(&url).await, 0, "{args:?} wrote to a fresh prefix: {}", stderr(&out));
    }
    // A nightly check pointed at a mistyped prefix must not stay green.
    let out = run(&path, &url, &["slo", "--json"], "");
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let report = one_object(&["slo", "--json"], &out);
    assert_eq!(report["status"], "unevaluated");
    assert!(stderr(&out).contains("no mailstream deployment under prefix \"mailstream\""), "{}", stderr(&out));

    // A deployment with nothing kicked yet has nothing to evaluate either.
    assert!(run(&path, &url, &["subscribe", "--id", "u1", "--email", "ann@acme.example"], "").status.success());
    let out = run(&path, &url, &["slo"], "");
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing to evaluate"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_pipes_one_object_on_stdout_and_people_read_stderr() {
    let redis = RedisServer::start(RedisOptions::default()).await.unwrap();
    let (path, url) = (config_file("json.toml", &[]), redis.url());
    let ann = "{\"id\":\"u1\",\"email\":\"ann@acme.example\",\"targets\":[\"team-1\"]}\n";
    let single: [&[&str]; 10] = [
        &["subscribe", "--ndjson", "-", "--json"],
        &["check-config", "--json"],
        &["schedule", "--json"],
        &["kick", "--campaign", "weekly_digest", "--dry-run", "--json"],
        &["kick", "--campaign", "weekly_digest", "--json"],
        &["slo", "--json"],
        &["preview", "--campaign", "weekly_digest", "--subscriber", "u1", "--json"],
        &["resume", "--json"],
        &["suppressions", "add", "--email", "bo@acme.example", "--json"],
        &["suppressions", "remove", "--email", "bo@acme.example", "--json"],
    ];
    for args in single {
        let out = run(&path, &url, args, ann);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        one_object(args, &out);
    }
    let features = one_object(&[], &run(&path, &url, &["check-config", "--json"], ""))["features"].clone();
    assert!(features.is_object() && features["unsubscribe"]["on"] == true, "{features}");
    let kicked = one_object(&[], &run(&path, &url, &["kick", "--campaign", "weekly_digest", "--json"], ""));
    assert_eq!(kicked["duplicates"], 1, "{kicked}");

    // A refusal is still one object, with the exit code saying it.
    let args = ["dead-letters", "retry", "weekly_digest:2026-W01:nobody:team-1", "--json"];
    let out = run(&path, &url, &args, "");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(one_object(&args, &out)["refused"], 1);

    // Listings are one object per line.
    for args in
        [&["deliveries", "--json"][..], &["suppressions", "list", "--json"], &["dead-letters", "list", "--json"]]
    {
        let out = run(&path, &url, args, "");
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        for line in stdout(&out).lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{args:?}: {e}: {line}"));
            assert!(v.is_object(), "{args:?}: {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_follow_sysexits() {
    let path = config_file("exits.toml", &[]);
    for args in
        [&["frobnicate"][..], &["kick", "--campagne", "x"], &["emulator", "--config", "x.toml"], &["demo", "-c", "x"]]
    {
        let out = bin().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
    }
    let help = bin().arg("--help").output().unwrap();
    assert!(help.status.success());
    for code in ["64", "69", "78"] {
        assert!(stdout(&help).contains(code), "--help names exit {code}:\n{}", stdout(&help));
    }

    let (_reserved, port) = common::closed_port();
    let nowhere = format!("redis://127.0.0.1:{port}");
    let out = run(&path, &nowhere, &["deliveries"], "");
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    let out = run(&path, &nowhere, &["slo"], "");
    assert_eq!(out.status.code(), Some(4), "slo keeps its own code: {}", stderr(&out));

    let broken = config_file("broken.toml", &[("requests_per_second = 10", "requests_per_second = \"ten\"")]);
    for args in [&["run"][..], &["check-config"], &["kick", "--campaign", "weekly_digest"]] {
        let out = run(&broken, &nowhere, args, "");
        assert_eq!(out.status.code(), Some(78), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn a_campaign_without_an_unsubscribe_link_is_refused_unless_it_says_so() {
    let path = config_file("nolink.toml", &[]);
    let check = |path: &std::path::Path, secret: bool, args: &[&str]| {
        let mut cmd = bin();
        if !secret {
            cmd.env_remove("MAILSTREAM_UNSUBSCRIBE_SECRET");
        }
        cmd.env("RESEND_API_KEY", "re_operator_test");
        cmd.args(args).arg("--config").arg(path).env("MAILSTREAM_REDIS_URL", "redis://127.0.0.1:1").output().unwrap()
    };
    // What makes email refuses it too, before it reaches Redis (here unreachable): nothing
    // is enqueued that run would refuse to send, nor previewed without its header.
    let kick = ["kick", "--campaign", "weekly_digest"];
    let preview = ["preview", "--campaign", "weekly_digest", "--subscriber", "u1"];
    let enqueue = ["enqueue", "--key", "k1", "--to", "a@acme.example", "--subject", "s", "--text", "t"];
    for args in [&["check-config"][..], &["run"], &["check-config", "--json"], &kick, &preview, &enqueue] {
        let out = check(&path, false, args);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("campaign[0] (weekly_digest)") && err.contains("one_click_unsubscribe = false"), "{err}");
    }
    // With --json, the object still says what is on, and why it is refused.
    let report = one_object(&[], &check(&path, false, &["check-config", "--json"]));
    assert_eq!((report["ok"].as_bool(), report["features"]["unsubscribe"]["on"].as_bool()), (Some(false), Some(false)));
    assert_eq!(report["errors"][0]["key"], "campaign[0]", "{report}");
    assert!(report["errors"][0]["message"].as_str().unwrap().contains("one_click_unsubscribe = false"), "{report}");
    assert!(report["errors"][0]["line"].as_u64().is_some(), "the line of its [[campaign]]: {report}");

    // One-click on: the feature names where its secret came from; http is a warning.
    let out = check(&path, true, &["check-config", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = one_object(&[], &out);
    assert_eq!(report["features"]["unsubscribe"]["mode"], "one_click", "{report}");
    assert_eq!(report["features"]["unsubscribe"]["secret"], "env", "{report}");
    assert_eq!(report["features"]["webhooks"]["on"], false, "{report}");
    assert!(stderr(&out).contains("warning: unsubscribe.base_url: \"http://127.0.0.1:8080\" is not https"));
    assert!(!stdout(&out).contains(UNSUBSCRIBE_SECRET) && !stderr(&out).contains(UNSUBSCRIBE_SECRET));

    // A secret file: its source is "file"; a missing one names the key.
    let dir = std::env::temp_dir().join(format!("mailstream-operator-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("unsubscribe_secret");
    std::fs::write(&secret, "a-secret-from-a-file-0123\n").unwrap();
    let line = format!("secret_file = {:?}", secret.display().to_string());
    let from_file = config_file(
        "fromfile.toml",
        &[("# secret_file = \"/run/credentials/mailstream.service/unsubscribe_secret\"", &line)],
    );
    let report = one_object(&[], &check(&from_file, false, &["check-config", "--json"]));
    assert_eq!(report["features"]["unsubscribe"]["secret"], "file", "{report}");
    std::fs::remove_file(&secret).unwrap();
    let out = check(&from_file, false, &["check-config"]);
    assert_eq!(out.status.code(), Some(78));
    assert!(stderr(&out).contains("unsubscribe.secret_file: cannot read"), "{}", stderr(&out));

    // Mail that is not bulk may go without.
    let opted = config_file("optout.toml", &[("one_click_unsubscribe = true", "one_click_unsubscribe = false")]);
    let out = check(&opted, false, &["check-config", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(one_object(&[], &out)["features"]["unsubscribe"]["on"], false);

    // A settings page is a link, not one click: accepted, with a warning.
    let page = config_file(
        "settings.toml",
        &[("settings_url = \"\"", "settings_url = \"https://app.acme.example/settings\"")],
    );
    let out = check(&page, false, &["check-config"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("not one-click unsubscribe"), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("features: ") && stdout(&out).contains("unsubscribe=settings_url"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_bad_schedule_is_explained_in_our_words_with_its_field() {
    let path = config_file("cron.toml", &[("catch_up_hours = 6", "schedule = \"0 9 * * 1DAY\"\ncatch_up_hours = 6")]);
    let out = bin().args(["check-config", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = stderr(&out);
    assert!(err.contains("campaign[0].schedule: the weekday field \"1DAY\" is not valid"), "{err}");
    assert!(!err.contains("illegal character"), "croner's words leak: {err}");
    let path = config_file("cron4.toml", &[("catch_up_hours = 6", "schedule = \"0 9 * MON\"\ncatch_up_hours = 6")]);
    let err = stderr(&bin().args(["check-config", "--config"]).arg(&path).output().unwrap());
    assert!(err.contains("has 5 fields") && err.contains("this has 4"), "{err}");
}
