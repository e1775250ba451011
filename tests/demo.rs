//! The README's first command, as a user runs it: `mailstream demo --json`
//! brings up a private Redis and the emulator and sends every digest once,
//! paced under the provider's limit. (Alone in its test binary, so no other
//! test competes with it for the two cores while it paces.)

use std::process::Command;

use serde_json::Value;

#[test]
fn demo_sends_5000_digests_once_within_the_rate_limit() {
    let out = Command::new(env!("CARGO_BIN_EXE_mailstream"))
        .args(["demo", "--subscribers", "5000", "--rps", "10", "--json"])
        .env_remove("MAILSTREAM_LOG")
        .output()
        .expect("the binary runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stderr.contains("[") && stderr.contains("sent"), "progress is printed on stderr:\n{stderr}");
    let r: Value = serde_json::from_str(&stdout).expect("stdout is one JSON object");
    for key in [
        "subscribers",
        "enqueued",
        "duplicates_suppressed",
        "sent",
        "failed",
        "skipped",
        "elapsed_seconds",
        "email_seconds",
        "emails_per_second",
        "ceiling_emails_per_second",
    ] {
        assert!(r.get(key).is_some(), "missing {key}");
    }
    assert!(r.get("channels").is_none(), "plain demo has no per-channel report: {r}");
    assert_eq!(r["subscribers"], 5000);
    assert_eq!(r["enqueued"], 5000);
    assert_eq!(r["duplicates_suppressed"], 5000, "the second kick adds nothing");
    assert_eq!(r["sent"], 5000);
    assert_eq!(r["ceiling_emails_per_second"], 1000.0);
    // Receipts sent through the transactional lane while the digest drained.
    let t = &r["transactional"];
    assert!(t["enqueued"].as_u64().unwrap() > 0, "{t}");
    assert_eq!(t["sent"], t["enqueued"], "{t}");
    assert!(t["p99_latency_ms"].as_u64().is_some(), "{t}");
    let p = &r["provider"];
    assert_eq!(p["emails_accepted"].as_u64(), Some(5000 + t["sent"].as_u64().unwrap()));
    assert_eq!(p["duplicate_sends"], 0);
    assert_eq!(p["rate_limited"], 0);
    assert!(p["max_requests_in_1s"].as_u64().unwrap() <= 10, "{p}");
    assert!(p["requests"].as_u64().unwrap() >= 50, "at most 100 emails per request");
}
