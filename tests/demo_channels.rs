//! `mailstream demo --channels email,app --json`: the weekly run on email and the
//! application channel, with the demo's application endpoint verifying each event's
//! signature and counting ids taken twice. (Alone in its test binary, as the plain
//! demo's test is.)

use std::process::Command;

use serde_json::Value;

#[test]
fn the_demo_on_two_channels_sends_each_delivery_once_on_each() {
    let out = Command::new(env!("CARGO_BIN_EXE_mailstream"))
        .args(["demo", "--subscribers", "1000", "--rps", "10", "--channels", "email,app", "--json"])
        .env_remove("MAILSTREAM_LOG")
        .output()
        .expect("the binary runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "demo failed:\n{stdout}\n{stderr}");
    assert!(stderr.contains("channel app: 1000 enqueued"), "a line per channel:\n{stderr}");
    let r: Value = serde_json::from_str(&stdout).expect("stdout is one JSON object");
    assert_eq!(r["duplicates_suppressed"], 2000, "the second kick adds nothing on either channel");
    let (email, app) = (&r["channels"]["email"], &r["channels"]["app"]);
    for channel in [email, app] {
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
    assert_eq!(r["provider"]["duplicate_sends"], 0);
}
