//! The operator's first hour: what a newcomer meets with the shipped config and the
//! README, held to what it should be (one test per finding that failed before).

mod common;

use common::cli::*;
use mailstream::redis_server::{RedisOptions, RedisServer};

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

    // A subscriber not yet in the registry needs an address.
    let out = run(&path, &url, &["subscribe", "--id", "u10", "--entitled", "false"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--email is needed"), "{out:?}");
}
