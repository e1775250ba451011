//! Web Push subscriptions: what a browser's `PushSubscription.toJSON()` gives
//! (`endpoint`, `keys.p256dh`, `keys.auth`), registered by `mailstream subscribe
//! --push-subscription` or `POST /v1/push-subscriptions`, several per subscriber. They
//! live in one hash per subscriber (`push:<subscriber>`, beside the subscriber's record in
//! its partition), each under its id: a hash of its endpoint. An endpoint is personal
//! data (it names one person's browser): it is a value there and nowhere else; logs,
//! stream entries, labels and keys name a subscription by its id, and the admin page
//! shows the push service's host and the id.
//!
//! Raw Redis here: a subscriber's browser subscriptions, registered, listed and removed; the push
//! channel reads them through `store::records`.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ClassifyName;

use crate::model::push_endpoint::{AllowedHosts, EndpointRefusal};
use crate::model::webpush::Receiver;
use crate::store::Store;
use crate::store::conn::Conn;
use crate::store::keys::Keys;

/// The most subscriptions a subscriber keeps (a browser each, rarely more than a few).
pub const MAX_PER_SUBSCRIBER: usize = 20;
/// The longest endpoint taken (push services' are under 500 characters).
const MAX_ENDPOINT: usize = 2048;

/// A subscription as the browser gives it (unknown fields, like `expirationTime`, are
/// ignored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    pub endpoint: String,
    pub keys: SubscriptionKeys,
}

/// `keys` of a subscription (base64url).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionKeys {
    pub p256dh: String,
    pub auth: String,
}

impl Subscription {
    /// Reads one subscription as stored, checking its form (not where its endpoint points:
    /// [`Subscription::admit`]); an error names what is wrong, never the input.
    pub fn parse(json: &str) -> Result<Subscription, String> {
        let s: Subscription = serde_json::from_str(json).map_err(|e| {
            format!(
                "not a PushSubscription (expected {{\"endpoint\", \"keys\": {{\"p256dh\", \"auth\"}}}}): {}",
                e.classify_name()
            )
        })?;
        s.check()?;
        Ok(s)
    }

    /// A subscription given to register (CLI): its form, and its endpoint one this
    /// deployment may be aimed at (`allowed`, checked without a DNS lookup).
    pub fn register(json: &str, allowed: &AllowedHosts) -> Result<Subscription, String> {
        let s = Subscription::parse(json)?;
        s.admit(allowed).map_err(|r| r.message().to_string())?;
        Ok(s)
    }

    /// From a JSON value, checking its form only (a program that makes its own, as the demo
    /// does; a registration checks the endpoint too: [`Subscription::register_value`]).
    pub fn from_value(v: serde_json::Value) -> Result<Subscription, String> {
        let s: Subscription = serde_json::from_value(v)
            .map_err(|_| "subscription: expected {\"endpoint\", \"keys\": {\"p256dh\", \"auth\"}}".to_string())?;
        s.check()?;
        Ok(s)
    }

    /// [`Subscription::register`] from a JSON value (the ingest API's `subscription`).
    pub fn register_value(v: serde_json::Value, allowed: &AllowedHosts) -> Result<Subscription, String> {
        let s = Subscription::from_value(v)?;
        s.admit(allowed).map_err(|r| r.message().to_string())?;
        Ok(s)
    }

    /// Whether its endpoint is one this deployment may be aimed at (`push_endpoint`).
    pub fn admit(&self, allowed: &AllowedHosts) -> Result<(), EndpointRefusal> {
        allowed.admit(&self.endpoint)
    }

    fn check(&self) -> Result<(), String> {
        let e = &self.endpoint;
        if e.len() > MAX_ENDPOINT {
            return Err(format!("endpoint: longer than {MAX_ENDPOINT} characters"));
        }
        if host(e).is_empty() || e.chars().any(char::is_whitespace) || !e.contains("://") {
            return Err("endpoint: must be an https URL".into());
        }
        Receiver::parse(&self.keys.p256dh, &self.keys.auth).map(|_| ()).map_err(str::to_string)
    }

    /// Its id: 16 hex characters of the endpoint's SHA-256.
    pub fn id(&self) -> String {
        let digest = Sha256::digest(self.endpoint.as_bytes());
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The keys to encrypt for it.
    pub fn receiver(&self) -> Result<Receiver, &'static str> {
        Receiver::parse(&self.keys.p256dh, &self.keys.auth)
    }

    /// The push service's origin (`https://host[:port]`): the VAPID token's audience, and
    /// what requests are paced by.
    pub fn origin(&self) -> String {
        origin(&self.endpoint)
    }

    /// What the admin page and the CLI show: the push service's host and the id, not the
    /// path that names the browser, nor a userinfo an endpoint was given with.
    pub fn masked(&self) -> String {
        format!("{}/… ({})", host(&self.endpoint), self.id())
    }
}

/// `scheme://host[:port]` of a URL, without a userinfo (`user:pw@`) before the host.
fn origin(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
    let authority = &url[start..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{}{host}", &url[..start])
}

/// `host[:port]` of a URL (without a userinfo).
fn host(url: &str) -> String {
    let o = origin(url);
    o.find("://").map_or(o.clone(), |i| o[i + 3..].to_string())
}

/// The field of a Web Push delivery's record marking subscription `<id>` as reached (its
/// push service answered 201).
pub fn sent_field(sid: &str) -> String {
    format!("push_sent:{sid}")
}

/// Registers `s` for subscriber `id` (again: its keys are replaced). Refused when the
/// subscriber is not in the registry, or already has [`MAX_PER_SUBSCRIBER`] others.
/// Returns the subscription's id.
pub async fn add(store: &Store, id: &str, s: &Subscription) -> anyhow::Result<String> {
    let p = store.keys.partition_of(id);
    let mut conn = store.conn().await?;
    let key = store.keys.push_subscriptions(p, id);
    let (exists, count, has): (bool, usize, bool) = redis::pipe()
        .exists(store.keys.subscriber(p, id))
        .hlen(&key)
        .hexists(&key, s.id())
        .query_async(&mut conn)
        .await?;
    anyhow::ensure!(exists, "subscriber {id} is not in the registry");
    anyhow::ensure!(
        has || count < MAX_PER_SUBSCRIBER,
        "subscriber {id} has {count} push subscriptions already (at most {MAX_PER_SUBSCRIBER})"
    );
    let sid = s.id();
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg(&sid)
        .arg(serde_json::to_string(s).expect("serializes"))
        .query_async(&mut conn)
        .await?;
    store.durable(&mut conn, &key).await?;
    Ok(sid)
}

/// Registers many subscriptions at once, `(subscriber id, subscription)`, one pipeline per
/// partition per 1,000 (a loader's path: the subscribers are known to be in the registry,
/// and nothing counts them against [`MAX_PER_SUBSCRIBER`]).
pub async fn add_many(store: &Store, items: &[(String, Subscription)]) -> anyhow::Result<()> {
    let mut by_partition: Vec<Vec<&(String, Subscription)>> = vec![Vec::new(); usize::from(store.keys.partitions())];
    for item in items {
        by_partition[usize::from(store.keys.partition_of(&item.0))].push(item);
    }
    let mut conn = store.waited_conn().await?;
    for (p, list) in by_partition.iter().enumerate() {
        for chunk in list.chunks(1000) {
            let mut pipe = redis::pipe();
            let mut last = String::new();
            for (id, s) in chunk {
                last = store.keys.push_subscriptions(p as u16, id);
                pipe.hset(&last, s.id(), serde_json::to_string(s).expect("serializes")).ignore();
            }
            let _: () = pipe.query_async(&mut conn).await?;
            store.durable(&mut conn, &last).await?;
        }
    }
    Ok(())
}

/// Subscriber `id`'s subscriptions, by id; one that no longer reads (written by hand)
/// is left out.
pub async fn list(conn: &mut Conn, keys: &Keys, p: u16, id: &str) -> anyhow::Result<Vec<(String, Subscription)>> {
    let all: Vec<(String, String)> =
        redis::cmd("HGETALL").arg(keys.push_subscriptions(p, id)).query_async(conn).await?;
    Ok(read(all))
}

/// The subscriptions of an `HGETALL` of a subscriber's hash that read.
pub fn read(all: Vec<(String, String)>) -> Vec<(String, Subscription)> {
    all.into_iter().filter_map(|(sid, json)| Some((sid, Subscription::parse(&json).ok()?))).collect()
}

/// Removes subscription `sid` of subscriber `id` (the push service said it is gone).
/// Returns whether it was there.
pub async fn remove(conn: &mut Conn, keys: &Keys, p: u16, id: &str, sid: &str) -> anyhow::Result<bool> {
    let removed: u32 = redis::cmd("HDEL").arg(keys.push_subscriptions(p, id)).arg(sid).query_async(conn).await?;
    Ok(removed > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::webpush::{new_secret, public_b64};

    fn browser(endpoint: &str) -> String {
        let key = public_b64(&new_secret().public_key());
        serde_json::json!({ "endpoint": endpoint, "expirationTime": null, "keys": { "p256dh": key, "auth": "AAECAwQFBgcICQoLDA0ODw" } })
            .to_string()
    }

    #[test]
    fn a_browser_subscription_is_read_and_checked_without_quoting_it() {
        let defaults = AllowedHosts::default();
        let s = Subscription::register(&browser("https://fcm.googleapis.com/fcm/send/abc:secret-token"), &defaults)
            .unwrap();
        assert_eq!(s.origin(), "https://fcm.googleapis.com");
        assert_eq!(s.id().len(), 16);
        assert!(!s.masked().contains("secret-token"), "{}", s.masked());
        assert!(s.masked().starts_with("fcm.googleapis.com/…"));
        let local = AllowedHosts::parse(["127.0.0.1:9"]).unwrap();
        let s = Subscription::register(&browser("http://127.0.0.1:9/push/1"), &local).unwrap();
        assert_eq!(s.origin(), "http://127.0.0.1:9");
        for bad in [
            browser("http://push.example/secret-token"),
            browser("ftp://push.example/secret-token"),
            browser(&format!("https://push.example/{}", "x".repeat(3000))),
            browser("https://fcm.googleapis.com/secret-token").replace("AAECAwQFBgcICQoLDA0ODw", "AAEC"),
            r#"{"endpoint":"https://push.example/secret-token"}"#.to_string(),
            "secret-token".to_string(),
            browser("https://user:secret-token@fcm.googleapis.com/x"),
        ] {
            let e = Subscription::register(&bad, &defaults).unwrap_err();
            assert!(!e.contains("secret-token"), "{e}");
        }
    }

    #[test]
    fn a_compressed_p256dh_is_refused() {
        // RFC 8291 §4: the 65-byte uncompressed point; 33 bytes is the compressed form.
        let key = crate::model::webpush::new_secret().public_key();
        let compressed = {
            use base64::Engine;
            use p256::elliptic_curve::sec1::ToEncodedPoint;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.to_encoded_point(true).as_bytes())
        };
        let json = serde_json::json!({ "endpoint": "https://fcm.googleapis.com/x", "keys": { "p256dh": compressed, "auth": "AAECAwQFBgcICQoLDA0ODw" } });
        let e = Subscription::parse(&json.to_string()).unwrap_err();
        assert!(e.contains("uncompressed"), "{e}");
    }

    #[test]
    fn a_listing_never_shows_a_userinfo() {
        let s = Subscription::parse(&browser("https://user:pw@fcm.googleapis.com/x")).unwrap();
        assert!(!s.masked().contains("user") && !s.masked().contains("pw"), "{}", s.masked());
        let s = Subscription::parse(&browser("http://127.0.0.1:1@otherhost/x")).unwrap();
        assert!(s.masked().starts_with("otherhost/…"), "{}", s.masked());
    }
}
