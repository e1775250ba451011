//! The Resend emulator over real HTTP: Resend's shapes, batch rules,
//! idempotency (replay and both 409s), the rate limit and its headers, reading
//! sent emails back (one by id, lists), quota refusals by name, the suppression
//! list (its routes, cursor walks, sends to listed addresses, its webhooks), attachments
//! (counted, refused in a batch and when malformed or over 40 MB), and the official Python
//! SDK against it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::start_emulator;
use mailstream::tools::emulator::{EmulatorConfig, Faults, QuotaRefusal, SuppressionOrigin, WebhookTarget};
use serde_json::{Value, json};

fn email(i: usize) -> Value {
    json!({
        "from": "Acme <digest@acme.example>",
        "to": [format!("delivered+u{i}@resend.dev")],
        "subject": format!("Digest {i}"),
        "text": "hello",
    })
}

fn batch(n: usize) -> Value {
    Value::Array((0..n).map(email).collect())
}

struct Api {
    http: reqwest::Client,
    url: String,
}

impl Api {
    fn new(url: &str) -> Api {
        mailstream::resend::client::install_crypto_provider();
        Api { http: reqwest::Client::builder().user_agent("mailstream-test").build().unwrap(), url: url.to_string() }
    }

    async fn post(&self, path: &str, key: Option<&str>, body: &Value, permissive: bool) -> reqwest::Response {
        let mut req = self.http.post(format!("{}{path}", self.url)).bearer_auth("re_test").json(body);
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        if permissive {
            req = req.header("x-batch-validation", "permissive");
        }
        req.send().await.unwrap()
    }
}

impl Api {
    async fn get(&self, path: &str) -> (u16, Value) {
        json_of(self.http.get(format!("{}{path}", self.url)).bearer_auth("re_test").send().await.unwrap()).await
    }

    async fn delete(&self, path: &str) -> (u16, Value) {
        json_of(self.http.delete(format!("{}{path}", self.url)).bearer_auth("re_test").send().await.unwrap()).await
    }

    /// `POST /_emulator/suppressions`: the test control, without a key.
    async fn seed(&self, entries: &Value) -> (u16, Value) {
        json_of(self.http.post(format!("{}/_emulator/suppressions", self.url)).json(entries).send().await.unwrap())
            .await
    }
}

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

fn unlimited() -> EmulatorConfig {
    EmulatorConfig { requests_per_second: None, ..Default::default() }
}

#[tokio::test]
async fn idempotent_replay_sends_once() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let (s1, first) = json_of(api.post("/emails/batch", Some("k-1"), &batch(3), true).await).await;
    let (s2, again) = json_of(api.post("/emails/batch", Some("k-1"), &batch(3), true).await).await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(first, again, "a replay returns the original answer");
    assert_eq!(first["data"].as_array().unwrap().len(), 3);
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.replays, stats.duplicate_sends), (3, 1, 0));
    // The single-email endpoint honours keys too.
    let (_, one) = json_of(api.post("/emails", Some("k-2"), &email(9), false).await).await;
    let (_, same) = json_of(api.post("/emails", Some("k-2"), &email(9), false).await).await;
    assert_eq!(one, same);
    assert!(one["id"].is_string());
    assert_eq!(emulator.stats().emails_accepted, 4);
}

#[tokio::test]
async fn same_key_with_another_body_is_refused() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    api.post("/emails/batch", Some("k"), &batch(2), true).await;
    let (status, body) = json_of(api.post("/emails/batch", Some("k"), &batch(3), true).await).await;
    assert_eq!(status, 409);
    assert_eq!(body["name"], "invalid_idempotent_request");
    assert_eq!(body["statusCode"], 409);
    assert_eq!(emulator.stats().emails_accepted, 2);
}

#[tokio::test]
async fn same_key_while_the_first_is_in_flight_is_a_concurrent_conflict() {
    let config = EmulatorConfig { faults: Faults { hang: 1.0, hang_ms: 1500, ..Default::default() }, ..unlimited() };
    let (emulator, url, _stop) = start_emulator(config).await;
    let api = Api::new(&url);
    let first = {
        let (http, url) = (api.http.clone(), url.clone());
        tokio::spawn(async move {
            Api { http, url }.post("/emails/batch", Some("slow"), &batch(1), true).await.status().as_u16()
        })
    };
    let stats =
        common::eventually(Duration::from_secs(5), || async { (emulator.stats().emails_accepted == 1).then_some(()) })
            .await;
    assert!(stats.is_some(), "the hung request was processed");
    let (status, body) = json_of(api.post("/emails/batch", Some("slow"), &batch(1), true).await).await;
    assert_eq!(status, 409);
    assert_eq!(body["name"], "concurrent_idempotent_requests");
    assert_eq!(first.await.unwrap(), 200);
    // Once the original has answered, the same key replays.
    let (status, _) = json_of(api.post("/emails/batch", Some("slow"), &batch(1), true).await).await;
    assert_eq!(status, 200);
    assert_eq!(emulator.stats().emails_accepted, 1);
}

#[tokio::test]
async fn keys_outside_one_to_256_characters_are_refused() {
    let (_emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let long = "k".repeat(257);
    let (status, body) = json_of(api.post("/emails/batch", Some(&long), &batch(1), true).await).await;
    assert_eq!((status, body["name"].as_str()), (400, Some("invalid_idempotency_key")));
    let (status, _) = json_of(api.post("/emails/batch", Some(&"k".repeat(256)), &batch(1), true).await).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn more_than_the_limit_in_a_second_is_refused_with_headers() {
    let config = EmulatorConfig { requests_per_second: Some(5), ..Default::default() };
    let (emulator, url, _stop) = start_emulator(config).await;
    let api = Api::new(&url);
    let mut statuses = Vec::new();
    let mut limited = None;
    for i in 0..6 {
        let r = api.post("/emails", None, &email(i), false).await;
        statuses.push(r.status().as_u16());
        if i == 0 {
            assert_eq!(r.headers()["ratelimit-limit"], "5");
            assert_eq!(r.headers()["ratelimit-remaining"], "4");
        }
        if r.status() == 429 {
            limited = Some(r);
        }
    }
    // Six requests in far less than a second: the sixth is over the limit (no burst above 5).
    assert_eq!(statuses, vec![200, 200, 200, 200, 200, 429]);
    let r = limited.unwrap();
    assert_eq!(r.headers()["ratelimit-remaining"], "0");
    assert_eq!(r.headers()["retry-after"], "1");
    assert!(r.headers().contains_key("ratelimit-reset"));
    let (_, body) = json_of(r).await;
    assert_eq!(body["name"], "rate_limit_exceeded");
    let stats = emulator.stats();
    assert_eq!((stats.rate_limited, stats.max_requests_in_1s, stats.emails_accepted), (1, 6, 5));
}

#[tokio::test]
async fn a_batch_over_100_is_refused() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let (status, body) = json_of(api.post("/emails/batch", None, &batch(101), true).await).await;
    assert_eq!(status, 422);
    assert_eq!(body["name"], "validation_error");
    let (status, _) = json_of(api.post("/emails/batch", None, &batch(100), true).await).await;
    assert_eq!(status, 200);
    assert_eq!(emulator.stats().emails_accepted, 100);
}

#[tokio::test]
async fn permissive_reports_bad_emails_by_index_and_strict_refuses_all() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let mut body = batch(3);
    body[1]["to"] = json!(["x@example.com"]);
    body[2].as_object_mut().unwrap().remove("subject");
    let (status, answer) = json_of(api.post("/emails/batch", None, &body, true).await).await;
    assert_eq!(status, 200);
    assert_eq!(answer["data"].as_array().unwrap().len(), 1);
    let errors = answer["errors"].as_array().unwrap();
    assert_eq!(errors.iter().map(|e| e["index"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(emulator.stats().emails_accepted, 1);

    let (status, answer) = json_of(api.post("/emails/batch", None, &body, false).await).await;
    assert_eq!(status, 422, "strict validation refuses the whole batch: {answer}");
    assert_eq!(emulator.stats().emails_accepted, 1);
}

#[tokio::test]
async fn user_agent_and_api_key_are_required() {
    let (_emulator, url, _stop) = start_emulator(unlimited()).await;
    let bare = reqwest::Client::builder().build().unwrap();
    let r = bare.post(format!("{url}/emails")).bearer_auth("re_x").json(&email(1)).send().await.unwrap();
    assert_eq!(r.status(), 403, "no User-Agent");
    let api = Api::new(&url);
    let r = api.http.post(format!("{url}/emails")).json(&email(1)).send().await.unwrap();
    let (status, body) = json_of(r).await;
    assert_eq!((status, body["name"].as_str()), (401, Some("missing_api_key")));
    // What an SDK sends when no key was configured, and keys that are not Resend keys.
    for bad in ["None", "sk_live_123", "re_"] {
        let r = api.http.post(format!("{url}/emails")).bearer_auth(bad).json(&email(1)).send().await.unwrap();
        let (status, body) = json_of(r).await;
        assert_eq!((status, body["name"].as_str()), (403, Some("invalid_api_key")), "{bad}");
    }
}

#[tokio::test]
async fn injected_faults_and_quota() {
    let config =
        EmulatorConfig { faults: Faults { quota_after_emails: Some(150), ..Default::default() }, ..unlimited() };
    let (emulator, url, _stop) = start_emulator(config).await;
    let api = Api::new(&url);
    assert_eq!(api.post("/emails/batch", None, &batch(100), true).await.status(), 200);
    let (status, body) = json_of(api.post("/emails/batch", None, &batch(100), true).await).await;
    assert_eq!((status, body["name"].as_str()), (429, Some("daily_quota_exceeded")));
    assert_eq!(emulator.stats().emails_accepted, 100);

    let config = EmulatorConfig { faults: Faults { server_error: 1.0, ..Default::default() }, ..unlimited() };
    let (emulator, url, _stop) = start_emulator(config).await;
    let status = Api::new(&url).post("/emails/batch", Some("k"), &batch(2), true).await.status();
    assert!(status.is_server_error());
    assert_eq!(emulator.stats().emails_accepted, 0, "a 5xx fault sends nothing");
}

#[tokio::test]
async fn a_restart_keeps_the_idempotency_store() {
    let emulator = mailstream::tools::emulator::Emulator::new(unlimited());
    let (url, stop, task) = emulator.spawn_local().await.unwrap();
    let (_, first) = json_of(Api::new(&url).post("/emails/batch", Some("k"), &batch(2), true).await).await;
    stop.trigger();
    task.await.unwrap();
    // Restarted (a new listener, the same state): the same key replays, nothing is sent again.
    let (url, _stop, _task) = emulator.spawn_local().await.unwrap();
    let (status, again) = json_of(Api::new(&url).post("/emails/batch", Some("k"), &batch(2), true).await).await;
    assert_eq!((status, &again), (200, &first));
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.replays), (2, 1));
}

#[tokio::test]
async fn an_accepted_email_reads_back_by_id_as_resend_answers() {
    let (_emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let mut sent = email(1);
    sent["html"] = json!("<p>hello</p>");
    sent["cc"] = json!("cc@acme.example");
    sent["reply_to"] = json!(["help@acme.example"]);
    sent["tags"] = json!([{"name": "campaign", "value": "weekly_digest"}]);
    let (_, answer) = json_of(api.post("/emails", None, &sent, false).await).await;
    let id = answer["id"].as_str().unwrap();

    let (status, got) = api.get(&format!("/emails/{id}")).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["object"], "email");
    assert_eq!(got["id"], id);
    assert_eq!(got["from"], sent["from"]);
    assert_eq!(got["to"], sent["to"]);
    assert_eq!(got["subject"], sent["subject"]);
    assert_eq!((&got["html"], &got["text"]), (&sent["html"], &sent["text"]));
    assert_eq!(got["cc"], json!(["cc@acme.example"]), "one address reads back as an array");
    assert_eq!(got["reply_to"], sent["reply_to"]);
    assert!(got["bcc"].is_null() && got["scheduled_at"].is_null());
    assert_eq!(got["tags"], sent["tags"]);
    assert_eq!(got["last_event"], "delivered");
    let created = got["created_at"].as_str().unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(created).is_ok(), "{created}");

    // Each email of a batch has its own id; a test address's fate shows in last_event.
    let mut two = batch(2);
    two[1]["to"] = json!(["bounced+u1@resend.dev"]);
    let (_, answer) = json_of(api.post("/emails/batch", None, &two, false).await).await;
    let bounced = answer["data"][1]["id"].as_str().unwrap();
    let (status, got) = api.get(&format!("/emails/{bounced}")).await;
    assert_eq!((status, got["last_event"].as_str()), (200, Some("bounced")));

    let (status, body) = api.get("/emails/4ef9a417-02e9-4d39-ad75-9611e0fcc33c").await;
    assert_eq!(status, 404);
    assert_eq!(body, json!({"statusCode": 404, "name": "not_found", "message": "Email not found"}));
    // Other methods on these paths are not allowed.
    let delete = api.http.delete(format!("{url}/emails/{id}")).bearer_auth("re_test").send().await.unwrap();
    let (status, body) = json_of(delete).await;
    assert_eq!((status, body["name"].as_str()), (405, Some("method_not_allowed")));
    let put = api.http.put(format!("{url}/emails")).bearer_auth("re_test").send().await.unwrap();
    assert_eq!(put.status(), 405);
    // Reading needs a key, as sending does.
    let bare = api.http.get(format!("{url}/emails/{id}")).send().await.unwrap();
    assert_eq!(
        json_of(bare).await,
        (
            401,
            json!({"statusCode": 401, "name": "missing_api_key",
        "message": "Missing API key in the authorization header."})
        )
    );
}

#[tokio::test]
async fn sent_emails_list_newest_first_in_pages() {
    let (_emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let mut ids = Vec::new();
    for i in 0..5 {
        let (_, answer) = json_of(api.post("/emails", None, &email(i), false).await).await;
        ids.push(answer["id"].as_str().unwrap().to_string());
    }
    ids.reverse();
    let page_ids = |list: &Value| -> Vec<String> {
        list["data"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_string()).collect()
    };

    let (status, all) = api.get("/emails").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!((all["object"].as_str(), all["has_more"].as_bool()), (Some("list"), Some(false)));
    assert_eq!(page_ids(&all), ids, "newest first");
    let item = &all["data"][0];
    assert_eq!((item["subject"].as_str(), item["last_event"].as_str()), (Some("Digest 4"), Some("delivered")));
    assert!(item.get("html").is_none() && item.get("object").is_none(), "list items leave the body out");

    let (_, first) = api.get("/emails?limit=2").await;
    assert_eq!((page_ids(&first), first["has_more"].as_bool()), (ids[..2].to_vec(), Some(true)));
    let (_, next) = api.get(&format!("/emails?limit=2&after={}", ids[1])).await;
    assert_eq!((page_ids(&next), next["has_more"].as_bool()), (ids[2..4].to_vec(), Some(true)));
    let (_, last) = api.get(&format!("/emails?limit=2&after={}", ids[3])).await;
    assert_eq!((page_ids(&last), last["has_more"].as_bool()), (ids[4..].to_vec(), Some(false)));
    let (_, back) = api.get(&format!("/emails?limit=2&before={}", ids[3])).await;
    assert_eq!((page_ids(&back), back["has_more"].as_bool()), (ids[1..3].to_vec(), Some(true)));
    for bad in ["limit=0", "limit=101", "after=unknown"] {
        let (status, body) = api.get(&format!("/emails?{bad}")).await;
        assert_eq!((status, body["name"].as_str()), (422, Some("validation_error")), "{bad}");
    }
}

#[tokio::test]
async fn the_bearer_scheme_is_matched_case_insensitively() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = api
            .http
            .post(format!("{url}/emails"))
            .header("Authorization", format!("{scheme} re_test"))
            .json(&email(1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    let r = api.http.get(format!("{url}/emails")).header("Authorization", "bearer re_test").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(emulator.stats().emails_accepted, 3);
}

#[tokio::test]
async fn each_quota_refusal_is_injected_by_name() {
    let cases = [
        (QuotaRefusal::Daily, "daily_quota_exceeded", "daily", "x-resend-daily-quota"),
        (QuotaRefusal::Monthly, "monthly_quota_exceeded", "monthly", "x-resend-monthly-quota"),
    ];
    for (refusal, name, period, header) in cases {
        let faults = Faults { quota_after_emails: Some(2), quota_refusal: refusal, ..Default::default() };
        let (emulator, url, _stop) = start_emulator(EmulatorConfig { faults, ..unlimited() }).await;
        let api = Api::new(&url);
        for used in ["1", "2"] {
            let r = api.post("/emails", None, &email(1), false).await;
            assert_eq!((r.status().as_u16(), r.headers()[header].to_str().unwrap()), (200, used), "{name}");
        }
        let r = api.post("/emails", None, &email(1), false).await;
        assert_eq!(r.headers()[header], "2", "{name}: nothing taken by a refusal");
        let message = format!("You have reached your {period} email sending quota.");
        assert_eq!(json_of(r).await, (429, json!({"statusCode": 429, "name": name, "message": message})));
        let stats = emulator.stats();
        assert_eq!((stats.emails_accepted, stats.quota_refusals), (2, 1), "{name}");
        emulator.renew_quota();
        assert_eq!(api.post("/emails", None, &email(1), false).await.status(), 200, "{name}: renewed");
    }
}

#[tokio::test]
async fn the_emulator_command_logs_its_rate_limit_as_a_number() {
    for (rps, want) in [("7", Some(7)), ("0", None)] {
        let emulator = common::Logged::spawn(
            common::cli::bin()
                .args(["emulator", "--listen", "127.0.0.1:0", "--rps", rps])
                .env("MAILSTREAM_LOG", "info"),
        );
        let line = emulator.line_with("Resend emulator listening", Duration::from_secs(20)).await.expect("it listens");
        let logged: Value = serde_json::from_str(&line).expect("a JSON line");
        assert_eq!(logged.get("rps").map(|v| v.as_u64().expect("a number")), want, "{line}");
        // It serves where it says it listens.
        let url = format!("http://{}", logged["listen"].as_str().unwrap());
        assert_eq!(Api::new(&url).get("/emails").await.0, 200);
        emulator.signal("TERM");
        assert_eq!(emulator.wait().await.0, Some(0));
    }
}

#[tokio::test]
async fn the_emulator_command_refuses_a_sender_domain_it_is_told_to() {
    let emulator = common::Logged::spawn(
        common::cli::bin()
            .args(["emulator", "--listen", "127.0.0.1:0", "--rps", "0", "--reject-from-domain", "acme.example"])
            .env("MAILSTREAM_LOG", "info"),
    );
    let line = emulator.line_with("Resend emulator listening", Duration::from_secs(20)).await.expect("it listens");
    let logged: Value = serde_json::from_str(&line).expect("a JSON line");
    let api = Api::new(&format!("http://{}", logged["listen"].as_str().unwrap()));
    // As Resend answers for a domain that is not verified, for one email and for a batch.
    let message = "The acme.example domain is not verified. Please, add and verify your domain.";
    let refused = json!({"statusCode": 403, "name": "validation_error", "message": message});
    assert_eq!(json_of(api.post("/emails", None, &email(1), false).await).await, (403, refused.clone()));
    let batch = json!([email(2), email(3)]);
    assert_eq!(json_of(api.post("/emails/batch", None, &batch, false).await).await, (403, refused));
    // Another domain goes through.
    let mut other = email(4);
    other["from"] = json!("Ops <ops@verified.example>");
    assert_eq!(api.post("/emails", None, &other, false).await.status(), 200);
    emulator.signal("TERM");
    assert_eq!(emulator.wait().await.0, Some(0));
}

/// The official Python SDK (PyPI `resend`; `.ci/run` installs it) against the emulator:
/// a send, then a get and a list that read the same email back.
#[tokio::test]
async fn the_official_python_sdk_sends_and_reads_back() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let script = format!(
        r#"import json, resend, resend.exceptions
resend.api_key = "re_python_sdk"
resend.api_url = "{url}"
params = {{
    "from": "Acme <digest@acme.example>",
    "to": ["delivered+py@resend.dev"],
    "cc": ["cc@acme.example"],
    "reply_to": "help@acme.example",
    "subject": "Digest from Python",
    "html": "<p>hello</p>",
    "text": "hello",
    "tags": [{{"name": "campaign", "value": "weekly_digest"}}],
}}
sent = resend.Emails.send(params)
got = resend.Emails.get(sent["id"])
listed = resend.Emails.list({{"limit": 1}})
try:
    resend.Emails.get("4ef9a417-02e9-4d39-ad75-9611e0fcc33c")
    missing = None
except resend.exceptions.ResendError as e:
    missing = {{"code": e.code, "type": e.error_type, "message": e.message}}
drop = lambda d: {{k: v for k, v in d.items() if k != "http_headers"}}
print(json.dumps({{"sent": drop(sent), "got": drop(got), "listed": drop(listed), "missing": missing}}))
"#
    );
    // Blocking, off the runtime that serves the emulator.
    let python =
        tokio::task::spawn_blocking(move || std::process::Command::new("python3").args(["-c", &script]).output());
    let out = python
        .await
        .unwrap()
        .expect("python3 is needed for this test, with the resend package (python3 -m pip install resend)");
    assert!(
        out.status.success(),
        "the SDK script failed; it needs the resend Python package (python3 -m pip install resend): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let id = result["sent"]["id"].as_str().expect("an id");
    let got = &result["got"];
    assert_eq!(got["object"], "email");
    assert_eq!(got["id"], id);
    assert_eq!(got["from"], "Acme <digest@acme.example>");
    assert_eq!(got["to"], json!(["delivered+py@resend.dev"]));
    assert_eq!(got["cc"], json!(["cc@acme.example"]));
    assert_eq!(got["reply_to"], json!(["help@acme.example"]));
    assert_eq!((got["subject"].as_str(), got["html"].as_str()), (Some("Digest from Python"), Some("<p>hello</p>")));
    assert_eq!((got["text"].as_str(), got["last_event"].as_str()), (Some("hello"), Some("delivered")));
    assert_eq!(got["tags"], json!([{"name": "campaign", "value": "weekly_digest"}]));
    assert_eq!(result["listed"]["data"][0]["id"], id);
    assert_eq!(result["listed"]["object"], "list");
    assert_eq!(result["missing"], json!({"code": 404, "type": "not_found", "message": "Email not found"}));
    assert_eq!(emulator.stats().emails_accepted, 1);
    let seen = emulator.seen();
    assert_eq!(seen.len(), 1, "the reads are not sending requests");
}

#[tokio::test]
async fn the_suppression_list_is_seeded_listed_read_and_changed() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let seeded = json!([
        {"email": "bounced.user@acme.example", "origin": "bounce"},
        {"email": " Ann+News@Acme.Example ", "origin": "complaint"},
        {"email": "hand@acme.example"},
    ]);
    assert_eq!(api.seed(&seeded).await, (200, json!({"added": 3})));
    let (status, body) = api.seed(&json!([{"email": "x@acme.example", "origin": "spam"}])).await;
    assert_eq!((status, body["name"].as_str()), (400, Some("validation_error")));

    let (status, list) = api.get("/suppressions").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!((list["object"].as_str(), list["has_more"].as_bool()), (Some("list"), Some(false)));
    let listed: Vec<(&str, &str)> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["email"].as_str().unwrap(), e["origin"].as_str().unwrap()))
        .collect();
    let want = [
        ("bounced.user@acme.example", "bounce"),
        ("ann+news@acme.example", "complaint"),
        ("hand@acme.example", "manual"),
    ];
    assert_eq!(listed, want, "oldest first, trimmed and lowercased");
    let first = &list["data"][0];
    assert_eq!((first["object"].as_str(), first["source_id"].is_null()), (Some("suppression"), true));
    let created = first["created_at"].as_str().unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(created).is_ok() && created.ends_with('Z'), "{created}");
    let pairs = want.iter().map(|(e, o)| (e.to_string(), o.to_string())).collect::<Vec<_>>();
    assert_eq!(emulator.suppression_list(), pairs);

    // By a percent-encoded address (the `+` stays a plus), and by id.
    let (status, got) = api.get("/suppressions/ann%2Bnews%40acme.example").await;
    assert_eq!((status, got["origin"].as_str()), (200, Some("complaint")), "{got}");
    let (status, by_id) = api.get(&format!("/suppressions/{}", got["id"].as_str().unwrap())).await;
    assert_eq!((status, &by_id), (200, &got));
    let missing = json!({"statusCode": 404, "name": "not_found", "message": "Suppression not found"});
    assert_eq!(api.get("/suppressions/nobody%40acme.example").await, (404, missing.clone()));

    // Added by hand: twice is the same entry.
    let (status, added) =
        json_of(api.post("/suppressions", None, &json!({"email": "New@acme.example"}), false).await).await;
    assert_eq!((status, added["object"].as_str()), (200, Some("suppression")), "{added}");
    let (_, again) = json_of(api.post("/suppressions", None, &json!({"email": "new@acme.example"}), false).await).await;
    assert_eq!(again["id"], added["id"]);
    let (status, body) =
        json_of(api.post("/suppressions", None, &json!({"email": "not an address"}), false).await).await;
    assert_eq!((status, body["name"].as_str()), (422, Some("validation_error")));
    let (_, batch) = json_of(
        api.post("/suppressions/batch/add", None, &json!({"emails": ["b1@acme.example", "b2@acme.example"]}), false)
            .await,
    )
    .await;
    assert_eq!(batch["data"].as_array().unwrap().len(), 2, "{batch}");
    assert_eq!(emulator.stats().suppressions_listed, 6);

    // Removed by address, by id, and in a batch.
    let (status, deleted) = api.delete("/suppressions/new%40acme.example").await;
    assert_eq!((status, &deleted), (200, &json!({"object": "suppression", "id": added["id"], "deleted": true})));
    assert_eq!(api.delete("/suppressions/new%40acme.example").await, (404, missing));
    assert_eq!(api.delete(&format!("/suppressions/{}", batch["data"][0]["id"].as_str().unwrap())).await.0, 200);
    let remove = json!({"emails": ["b2@acme.example", "nobody@acme.example"]});
    let (status, removed) = json_of(api.post("/suppressions/batch/remove", None, &remove, false).await).await;
    assert_eq!((status, removed["data"].as_array().unwrap().len()), (200, 1), "{removed}");
    let both = json!({"emails": ["b2@acme.example"], "ids": ["x"]});
    assert_eq!(api.post("/suppressions/batch/remove", None, &both, false).await.status(), 422);
    assert_eq!(emulator.stats().suppressions_listed, 3);

    // Every route needs a key, as Resend's do.
    let bare = api.http.get(format!("{url}/suppressions")).send().await.unwrap();
    assert_eq!(bare.status(), 401);
    let put = api.http.put(format!("{url}/suppressions")).bearer_auth("re_test").send().await.unwrap();
    assert_eq!(put.status(), 405);
}

#[tokio::test]
async fn a_send_to_a_listed_address_is_accepted_but_not_delivered() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let seeded = json!([{"email": "gone@acme.example", "origin": "bounce"}, {"email": "delivered+u1@resend.dev"}]);
    assert_eq!(api.seed(&seeded).await.0, 200);
    let mut listed = email(0);
    listed["to"] = json!(["Gone <GONE@acme.example>"]);
    let (status, answer) = json_of(api.post("/emails", None, &listed, false).await).await;
    assert_eq!(status, 200, "{answer}");
    let (_, got) = api.get(&format!("/emails/{}", answer["id"].as_str().unwrap())).await;
    assert_eq!(got["last_event"], "suppressed");
    // In a batch: the listed one (u1) is accepted with the rest, and not delivered.
    let (status, answer) = json_of(api.post("/emails/batch", None, &batch(3), false).await).await;
    assert_eq!((status, answer["data"].as_array().unwrap().len()), (200, 3));
    let (_, got) = api.get(&format!("/emails/{}", answer["data"][1]["id"].as_str().unwrap())).await;
    assert_eq!(got["last_event"], "suppressed");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.suppressed_sends), (4, 2));
    assert_eq!((stats.distinct_sends, stats.duplicate_sends), (2, 0), "only u0 and u2 were really sent");
    assert!(emulator.sends_matching("Digest").keys().all(|to| !to.contains("u1@")));
    // The test address keeps its behaviour: suppressed, yet a real send as before.
    let mut test_address = email(7);
    test_address["to"] = json!(["suppressed@resend.dev"]);
    let (_, answer) = json_of(api.post("/emails", None, &test_address, false).await).await;
    let (_, got) = api.get(&format!("/emails/{}", answer["id"].as_str().unwrap())).await;
    assert_eq!(got["last_event"], "suppressed");
    let stats = emulator.stats();
    assert_eq!((stats.suppressed_sends, stats.distinct_sends), (2, 3));
    // Lifted, the address is sent to again.
    assert_eq!(api.delete("/suppressions/gone%40acme.example").await.0, 200);
    assert_eq!(api.post("/emails", None, &listed, false).await.status(), 200);
    assert_eq!((emulator.stats().suppressed_sends, emulator.stats().distinct_sends), (2, 4));
}

#[tokio::test]
async fn a_long_suppression_list_is_walked_by_cursor_each_entry_once() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let entries: Vec<Value> = (0..10_000).map(|i| json!({"email": format!("user{i:05}@acme.example")})).collect();
    assert_eq!(api.seed(&Value::Array(entries)).await, (200, json!({"added": 10_000})));
    let mut seen = std::collections::HashSet::new();
    let (mut pages, mut path) = (0, "/suppressions?limit=100".to_string());
    loop {
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        let data = page["data"].as_array().unwrap();
        assert_eq!(data.len(), 100);
        for entry in data {
            assert!(seen.insert(entry["email"].as_str().unwrap().to_string()), "an entry twice: {entry}");
        }
        if !page["has_more"].as_bool().unwrap() {
            break;
        }
        path = format!("/suppressions?limit=100&after={}", data.last().unwrap()["id"].as_str().unwrap());
    }
    assert_eq!((pages, seen.len()), (100, 10_000));
    assert_eq!(emulator.stats().suppressions_listed, 10_000);
    let (status, body) = api.get("/suppressions?after=4ef9a417-02e9-4d39-ad75-9611e0fcc33c").await;
    assert_eq!((status, body["name"].as_str()), (422, Some("validation_error")));
    for bad in ["limit=0", "limit=101"] {
        assert_eq!(api.get(&format!("/suppressions?{bad}")).await.0, 422, "{bad}");
    }
}

#[tokio::test]
async fn the_rate_limit_counts_suppression_requests() {
    let config = EmulatorConfig { requests_per_second: Some(2), ..Default::default() };
    let (emulator, url, _stop) = start_emulator(config).await;
    let api = Api::new(&url);
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(api.http.get(format!("{url}/suppressions")).bearer_auth("re_test").send().await.unwrap());
    }
    let statuses: Vec<u16> = answers.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, vec![200, 200, 429]);
    assert_eq!(answers[0].headers()["ratelimit-limit"], "2");
    assert_eq!(answers[0].headers()["ratelimit-remaining"], "1");
    let limited = answers.pop().unwrap();
    assert_eq!(limited.headers()["ratelimit-remaining"], "0");
    assert_eq!(limited.headers()["retry-after"], "1");
    assert_eq!(json_of(limited).await.1["name"], "rate_limit_exceeded");
    assert_eq!(emulator.stats().rate_limited, 1);
    // The test control is not limited, and needs no key.
    assert_eq!(api.seed(&json!([{"email": "a@acme.example"}])).await.0, 200);
}

/// A webhook receiver on a loopback port: every request's svix headers and body.
async fn receiver() -> (String, Arc<Mutex<Vec<(String, String, String, String)>>>, mailstream::shutdown::Trigger) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/webhooks/resend", listener.local_addr().unwrap());
    let got: Arc<Mutex<Vec<_>>> = Arc::default();
    let (stop, down) = mailstream::shutdown::channel();
    let kept = got.clone();
    let handler = move |req: mailstream::http::server::HttpRequest| {
        let header = |name: &str| req.headers()[name].to_str().unwrap().to_string();
        let body = String::from_utf8(req.body().to_vec()).unwrap();
        kept.lock().unwrap().push((header("svix-id"), header("svix-timestamp"), header("svix-signature"), body));
        async { mailstream::http::server::json(hyper::StatusCode::OK, &json!({"ok": true})) }
    };
    tokio::spawn(mailstream::http::server::serve(listener, handler, down, Default::default()));
    (url, got, stop)
}

#[tokio::test]
async fn suppression_changes_and_suppressed_sends_post_signed_webhooks() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (hook, got, _hook_stop) = receiver().await;
    let webhook = Some(WebhookTarget { url: hook, secret: SECRET.into() });
    let (emulator, url, _stop) = start_emulator(EmulatorConfig { webhook, ..unlimited() }).await;
    let api = Api::new(&url);
    // Seeded: no webhook (listed before the webhook was configured).
    let seeded = json!([{"email": "bounced.user@acme.example", "origin": "bounce"}, {"email": "hand@acme.example"}]);
    assert_eq!(api.seed(&seeded).await.0, 200);
    emulator.suppress("complainer@acme.example", SuppressionOrigin::Complaint);
    let (_, added) = json_of(api.post("/suppressions", None, &json!({"email": "new@acme.example"}), false).await).await;
    api.post("/suppressions", None, &json!({"email": "new@acme.example"}), false).await; // already listed: no event
    api.post("/suppressions/batch/add", None, &json!({"emails": ["new@acme.example", "b@acme.example"]}), false).await;
    assert_eq!(api.delete("/suppressions/hand%40acme.example").await.0, 200);
    for to in ["bounced.user@acme.example", "complainer@acme.example", "new@acme.example"] {
        let mut listed = email(1);
        listed["to"] = json!([to]);
        assert_eq!(api.post("/emails", None, &listed, false).await.status(), 200);
    }
    let all_in =
        common::eventually(Duration::from_secs(10), || async { (got.lock().unwrap().len() >= 6).then_some(()) });
    assert!(all_in.await.is_some(), "{:?}", emulator.stats());
    tokio::time::sleep(Duration::from_millis(300)).await; // nothing more comes
    let events = got.lock().unwrap().clone();
    let key = mailstream::model::svix::SigningKey::parse(SECRET).unwrap();
    let mut kinds = Vec::new();
    for (id, timestamp, signature, body) in &events {
        assert_eq!(signature, &key.sign(id, timestamp.parse().unwrap(), body.as_bytes()), "signed as the rest");
        let event: Value = serde_json::from_str(body).unwrap();
        let data = &event["data"];
        let about = match event["type"].as_str().unwrap() {
            "email.suppressed" => format!("{}:{}", data["to"][0].as_str().unwrap(), data["suppressed"]["reason"]),
            _ => {
                assert!(
                    data["id"].is_string() && data["source_id"].is_null() && data["created_at"].is_string(),
                    "{event}"
                );
                format!("{}:{}", data["email"].as_str().unwrap(), data["origin"])
            }
        };
        kinds.push(format!("{} {about}", event["type"].as_str().unwrap()));
    }
    kinds.sort();
    assert_eq!(
        kinds,
        vec![
            "email.suppressed bounced.user@acme.example:\"previous_bounce\"",
            "email.suppressed complainer@acme.example:\"previous_complaint\"",
            "email.suppressed new@acme.example:\"manually_suppressed\"",
            "suppression.added b@acme.example:\"manual\"",
            "suppression.added new@acme.example:\"manual\"",
            "suppression.removed hand@acme.example:\"manual\"",
        ]
    );
    let new_added = events.iter().find(|e| e.3.contains("suppression.added") && e.3.contains("new@")).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&new_added.3).unwrap()["data"]["id"], added["id"]);
    assert_eq!(emulator.stats().webhooks_delivered, 6);
}

/// The official Python SDK's suppressions methods against the emulator: add, get by an
/// address it percent-encodes, batch add, list pages, remove one and a batch.
#[tokio::test]
async fn the_official_python_sdk_manages_suppressions() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    assert_eq!(Api::new(&url).seed(&json!([{"email": "old@acme.example", "origin": "bounce"}])).await.0, 200);
    let script = format!(
        r#"import json, resend, resend.exceptions
resend.api_key = "re_python_sdk"
resend.api_url = "{url}"
added = resend.Suppressions.add({{"email": "Ann+News@Acme.Example"}})
got = resend.Suppressions.get("ann+news@acme.example")
batch = resend.Suppressions.Batch.add({{"emails": ["b1@acme.example", "b2@acme.example"]}})
first = resend.Suppressions.list({{"limit": 2}})
rest = resend.Suppressions.list({{"limit": 2, "after": first["data"][-1]["id"]}})
bounces = resend.Suppressions.list({{"origin": "bounce"}})
removed = resend.Suppressions.remove("ann+news@acme.example")
batch_removed = resend.Suppressions.Batch.remove({{"ids": [batch["data"][0]["id"]]}})
try:
    resend.Suppressions.get("ann+news@acme.example")
    missing = None
except resend.exceptions.ResendError as e:
    missing = {{"code": e.code, "type": e.error_type, "message": e.message}}
drop = lambda d: {{k: v for k, v in d.items() if k != "http_headers"}}
out = {{"added": added, "got": got, "batch": batch, "first": first, "rest": rest, "bounces": bounces,
    "removed": removed, "batch_removed": batch_removed}}
print(json.dumps({{**{{k: drop(v) for k, v in out.items()}}, "missing": missing}}))
"#
    );
    let python =
        tokio::task::spawn_blocking(move || std::process::Command::new("python3").args(["-c", &script]).output());
    let out = python.await.unwrap().expect("python3 is needed for this test, with the resend package");
    assert!(
        out.status.success(),
        "the SDK script failed; it needs the resend Python package (python3 -m pip install resend): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let id = result["added"]["id"].as_str().expect("an id");
    assert_eq!(result["added"]["object"], "suppression");
    let got = &result["got"];
    assert_eq!((got["id"].as_str(), got["email"].as_str()), (Some(id), Some("ann+news@acme.example")));
    assert_eq!((got["origin"].as_str(), got["object"].as_str()), (Some("manual"), Some("suppression")));
    let emails = |page: &Value| -> Vec<String> {
        page["data"].as_array().unwrap().iter().map(|e| e["email"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(
        (emails(&result["first"]), result["first"]["has_more"].as_bool()),
        (vec!["old@acme.example".to_string(), "ann+news@acme.example".into()], Some(true))
    );
    assert_eq!(
        (emails(&result["rest"]), result["rest"]["has_more"].as_bool()),
        (vec!["b1@acme.example".to_string(), "b2@acme.example".into()], Some(false))
    );
    assert_eq!(emails(&result["bounces"]), vec!["old@acme.example"]);
    assert_eq!(result["removed"], json!({"object": "suppression", "id": id, "deleted": true}));
    let batch_id = &result["batch"]["data"][0]["id"];
    assert_eq!(result["batch_removed"]["data"], json!([{"object": "suppression", "id": batch_id, "deleted": true}]));
    assert_eq!(result["missing"], json!({"code": 404, "type": "not_found", "message": "Suppression not found"}));
    let listed: Vec<String> = emulator.suppression_list().into_iter().map(|(email, _)| email).collect();
    assert_eq!(listed, vec!["old@acme.example", "b2@acme.example"]);
}

/// `email(i)` carrying `attachments`.
fn with_attachments(i: usize, attachments: Value) -> Value {
    let mut email = email(i);
    email["attachments"] = attachments;
    email
}

#[tokio::test]
async fn an_attachment_is_counted_once_and_its_bytes_not_kept() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let file: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
    let sent = with_attachments(
        1,
        json!([{"filename": "report.pdf", "content": STANDARD.encode(&file), "content_type": "application/pdf"}]),
    );
    let (status, first) = json_of(api.post("/emails", Some("att-1"), &sent, false).await).await;
    assert_eq!(status, 200, "{first}");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.attachments_accepted, stats.attachment_bytes), (1, 1, 1_048_576));

    // The replay sends nothing, so counts nothing again.
    let (status, again) = json_of(api.post("/emails", Some("att-1"), &sent, false).await).await;
    assert_eq!((status, &again), (200, &first));
    let stats = emulator.stats();
    assert_eq!((stats.replays, stats.emails_accepted), (1, 1));
    assert_eq!((stats.attachments_accepted, stats.attachment_bytes), (1, 1_048_576));

    // It reads back as any email, without the file.
    let (status, got) = api.get(&format!("/emails/{}", first["id"].as_str().unwrap())).await;
    assert_eq!((status, &got["subject"]), (200, &sent["subject"]));
    assert!(got.to_string().len() < 4096, "no attachment content kept: {} bytes", got.to_string().len());
}

#[tokio::test]
async fn a_path_attachment_is_accepted_with_no_bytes() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let sent = with_attachments(1, json!([{"filename": "invoice.pdf", "path": "https://files.acme.example/i.pdf"}]));
    let (status, answer) = json_of(api.post("/emails", None, &sent, false).await).await;
    assert_eq!(status, 200, "{answer}");
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.attachments_accepted, stats.attachment_bytes), (1, 1, 0));
}

#[tokio::test]
async fn a_batch_carrying_an_attachment_is_refused_whole() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let mut body = batch(3);
    body[1]["attachments"] = json!([{"filename": "a.txt", "content": STANDARD.encode(b"hello")}]);
    for permissive in [false, true] {
        let (status, answer) = json_of(api.post("/emails/batch", None, &body, permissive).await).await;
        assert_eq!(
            (status, answer),
            (
                422,
                json!({"statusCode": 422, "name": "validation_error",
                    "message": "Attachments are not supported in the batch endpoint."})
            ),
            "permissive: {permissive}"
        );
    }
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.invalid_emails, stats.attachments_accepted), (0, 0, 0));
    assert!(emulator.accepted().is_empty(), "nothing sent");
    // An empty `attachments` attaches nothing: the batch goes.
    body[1]["attachments"] = json!([]);
    assert_eq!(api.post("/emails/batch", None, &body, false).await.status(), 200);
    assert_eq!(emulator.stats().emails_accepted, 3);
}

#[tokio::test]
async fn malformed_attachments_are_refused() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    let cases = [
        (
            json!([{"filename": "a.txt", "content": "not base64!"}]),
            "`attachments[0].content` is not valid base64 (the standard alphabet, padded).",
        ),
        (json!([{"content": STANDARD.encode(b"hello")}]), "`attachments[0].filename` is missing or empty."),
        (json!([{"filename": "a.txt"}]), "`attachments[0]` needs a `content` or a `path`."),
        (json!("a.txt"), "The `attachments` field must be an array."),
    ];
    for (attachments, message) in cases {
        let (status, answer) = json_of(api.post("/emails", None, &with_attachments(1, attachments), false).await).await;
        assert_eq!(
            (status, answer["name"].as_str(), answer["message"].as_str()),
            (422, Some("validation_error"), Some(message))
        );
    }
    let stats = emulator.stats();
    assert_eq!((stats.emails_accepted, stats.attachments_accepted, stats.attachment_bytes), (0, 0, 0));
}

#[tokio::test]
async fn an_email_over_40_mb_of_encoded_attachments_is_refused_not_too_large_to_read() {
    let (emulator, url, _stop) = start_emulator(unlimited()).await;
    let api = Api::new(&url);
    // Over the listener's usual 16 MB: the emulator reads it, and Resend's rule answers.
    let content = "A".repeat(40_000_004);
    let sent = with_attachments(1, json!([{"filename": "big.bin", "content": content}]));
    let (status, answer) = json_of(api.post("/emails", None, &sent, false).await).await;
    assert_eq!((status, answer["name"].as_str()), (422, Some("validation_error")));
    assert_eq!(
        answer["message"],
        "The email is too large: its attachments come to 40000004 bytes after base64 encoding, above the limit of 40 MB (40000000 bytes)."
    );
    assert_eq!(emulator.stats().emails_accepted, 0);
}
