//! A minimal W3C WebDriver client over chromedriver's HTTP API, for the admin pages'
//! tests in headless Chromium (`chromium` and `chromium-driver`; `.ci/run` installs them).

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::eventually;

/// A minimal W3C WebDriver client over chromedriver's HTTP API.
pub struct Browser {
    http: reqwest::Client,
    base: String,
    driver: std::process::Child,
}

impl Browser {
    pub async fn start() -> Browser {
        let which = |name: &str| -> String {
            let found = ["/usr/bin", "/usr/local/bin", "/snap/bin"].iter().map(|d| format!("{d}/{name}"));
            found.into_iter().find(|p| std::path::Path::new(p).exists()).unwrap_or_else(|| {
                panic!("{name} is needed: apt-get install chromium chromium-driver (.ci/run installs them)")
            })
        };
        let port = mailstream::store::redis_server::free_port().unwrap();
        let driver = Command::new(which("chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        mailstream::resend::client::install_crypto_provider();
        let http = reqwest::Client::new();
        let status = format!("http://127.0.0.1:{port}/status");
        let ready = eventually(Duration::from_secs(30), || {
            let (http, status) = (http.clone(), status.clone());
            async move {
                let v: Value = http.get(&status).send().await.ok()?.json().await.ok()?;
                v["value"]["ready"].as_bool().filter(|r| *r)
            }
        })
        .await;
        assert!(ready.is_some(), "chromedriver starts");
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": which("chromium"),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"]
        }}}});
        let session: Value = http
            .post(format!("http://127.0.0.1:{port}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = session["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("a session: {session}")).to_string();
        Browser { http, base: format!("http://127.0.0.1:{port}/session/{id}"), driver }
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let mut r = self.http.request(method.clone(), format!("{}{path}", self.base));
        if method != reqwest::Method::GET {
            r = r.json(&body);
        }
        let v: Value = r.send().await.unwrap().json().await.unwrap();
        assert!(v["value"]["error"].is_null(), "{path}: {v}");
        v["value"].clone()
    }

    pub async fn go(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", json!({"url": url})).await;
    }

    pub async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self.call(reqwest::Method::POST, "/elements", json!({"using": "css selector", "value": css})).await;
        found
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_object().unwrap().values().next().unwrap().as_str().unwrap().to_string())
            .collect()
    }

    pub async fn find(&self, css: &str) -> String {
        self.find_all(css).await.into_iter().next().unwrap_or_else(|| panic!("no element {css}"))
    }

    pub async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{e}/click"), json!({})).await;
    }

    /// Clicks something that loads another page, and waits until that page is loaded.
    pub async fn click_to_navigate(&self, css: &str) {
        let before = self.call(reqwest::Method::GET, "/url", json!({})).await;
        self.click(css).await;
        let loaded = eventually(Duration::from_secs(30), || {
            let before = before.clone();
            async move {
                let url = self.call(reqwest::Method::GET, "/url", json!({})).await;
                let state = self
                    .call(
                        reqwest::Method::POST,
                        "/execute/sync",
                        json!({"script": "return document.readyState", "args": []}),
                    )
                    .await;
                (url != before && state == "complete").then_some(())
            }
        })
        .await;
        assert!(loaded.is_some(), "clicking {css} loaded another page");
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{e}/value"), json!({"text": text})).await;
    }

    pub async fn text(&self, css: &str) -> String {
        let e = self.find(css).await;
        self.call(reqwest::Method::GET, &format!("/element/{e}/text"), json!({})).await.as_str().unwrap().to_string()
    }

    pub async fn screenshot(&self, name: &str) -> std::path::PathBuf {
        let png = self.call(reqwest::Method::GET, "/screenshot", json!({})).await;
        let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, png.as_str().unwrap()).unwrap();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Runs `script` in the page; what it returns.
    pub async fn script(&self, script: &str) -> Value {
        self.call(reqwest::Method::POST, "/execute/sync", json!({"script": script, "args": []})).await
    }

    /// The page's address.
    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", json!({})).await.as_str().unwrap_or_default().to_string()
    }

    /// Resizes the window (a phone's width: 420).
    pub async fn resize(&self, width: u32, height: u32) {
        self.call(reqwest::Method::POST, "/window/rect", json!({"width": width, "height": height})).await;
    }

    pub async fn quit(mut self) {
        let _ = self.http.delete(&self.base).send().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
