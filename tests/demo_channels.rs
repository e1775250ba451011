//! `mailstream demo --channels email,push,app --json`: the weekly run on email, Web
//! Push and the application channel, with the emulator's push service (one
//! subscription in ten gone) counting tags shown twice and the demo's application
//! endpoint verifying each event's signature and counting ids taken twice. (Alone in
//! its test binary, as the plain demo's test is.)

use std::process::Command;

use serde_json::Value;

#[test]
fn the_demo_on_three_channels_sends_each_delivery_once_on_each() {
    let out = Command::new(env!("CARGO_BIN_EXE_mailstream"))
        .args(["demo", "--subscribers", "1000", "--rps", "10", "--channels", "email,push,app", "--json"])
        .env_remove("MAILSTREAM_LOG")
        .output()
        .expect("the binary runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stderr.contains("channel app: 1000 enqueued"), "a line per channel:\n{stderr}");
    let r: Value = serde_json::from_str(&stdout).expect("stdout is one JSON object");
    assert!(stderr.contains("channel push: 1000 enqueued"), "a line per channel:\n{stderr}");
    assert_eq!(r["duplicates_suppressed"], 3000, "the second kick adds nothing on any channel");
    let elapsed = r["elapsed_seconds"].as_f64().unwrap();
    assert!(r["email_seconds"].as_f64().is_some_and(|e| e > 0.0 && e <= elapsed), "{r}");
    let (email, push, app) = (&r["channels"]["email"], &r["channels"]["push"], &r["channels"]["app"]);
    for channel in [email, push, app] {
        for key in ["enqueued", "sent", "failed", "skipped", "not_settled", "duplicate_sends"] {
            assert!(channel.get(key).is_some(), "missing {key}: {channel}");
        }
        assert_eq!(channel["enqueued"], 1000, "{channel}");
        assert_eq!(channel["not_settled"], 0, "{channel}");
        assert_eq!(channel["duplicate_sends"], 0, "{channel}");
    }
    assert_eq!(email["sent"], 1000);
    // A subscriber whose address bounced before their event was claimed is skipped there.
    let settled = app["sent"].as_u64().unwrap() + app["skipped"].as_u64().unwrap();
    assert_eq!((settled, app["failed"].as_u64()), (1000, Some(0)), "{app}");
    let endpoint = &app["endpoint"];
    assert_eq!(endpoint["rejected"], 0, "every signature verified: {endpoint}");
    assert_eq!(endpoint["taken"], app["sent"], "{endpoint}");
    // Web Push: one subscription in ten answers 410 and is removed; a subscriber left
    // with none is skipped, no_subscription; no browser is shown a tag twice.
    for key in ["no_subscription", "gone_removed", "push_service"] {
        assert!(push.get(key).is_some(), "missing {key}: {push}");
    }
    assert!(push["gone_removed"].as_u64().unwrap() > 0, "{push}");
    assert!(push["no_subscription"].as_u64().unwrap() > 0, "{push}");
    assert_eq!(push["failed"], 0, "{push}");
    let settled = push["sent"].as_u64().unwrap() + push["skipped"].as_u64().unwrap();
    assert_eq!(settled, 1000, "{push}");
    assert_eq!(push["push_service"]["duplicates"], 0, "{push}");
    assert_eq!(r["provider"]["duplicate_sends"], 0);
}
