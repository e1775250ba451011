//! Settled history (key layout 7): a delivery settled `sent` or `skipped` keeps no record,
//! only one field in a bucket of its campaign period (`settled:<campaign>:<period>:<n>`),
//! written by the scripts that settle it (lua/prelude.lua says how, and why). This reads
//! it: a delivery's entry by id, a whole bucket, an entry's text.

use std::collections::BTreeMap;

use super::Conn;
use super::keys::Keys;
use crate::model::work::{Channel, DeliveryRef};

/// What a delivery settled compactly keeps: `<state> <settled_ms> <detail>[ <sends>]` (the
/// requests made, left out when 1), then ` fallback` and ` variant=<v>` where they apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// `sent` or `skipped` (whatever the text says: shown, never acted on).
    pub state: String,
    pub settled_ms: i64,
    /// The provider's email id (sent), or the reason (skipped, or an event's `accepted`).
    pub detail: Option<String>,
    /// Requests made for its batch.
    pub sends: u64,
    /// Operator mail sent from its template's fallback sender.
    pub fallback: bool,
    /// The A/B variant it was sealed with.
    pub variant: Option<String>,
}

impl HistoryEntry {
    /// An entry's text, `None` unless it has the four leading parts.
    pub fn parse(text: &str) -> Option<HistoryEntry> {
        let mut parts = text.split(' ').peekable();
        let state = parts.next().filter(|s| !s.is_empty())?.to_string();
        let settled_ms = parts.next()?.parse().ok()?;
        let detail = parts.next()?;
        let detail = (detail != "-").then(|| detail.to_string());
        let sends = match parts.peek().map(|t| t.parse()) {
            Some(Ok(n)) => {
                parts.next();
                n
            }
            Some(Err(_)) | None => 1,
        };
        let (mut fallback, mut variant) = (false, None);
        for flag in parts {
            match flag.strip_prefix("variant=") {
                Some(v) => variant = Some(v.to_string()),
                None => fallback |= flag == "fallback",
            }
        }
        Some(HistoryEntry { state, settled_ms, detail, sends, fallback, variant })
    }

    /// The fields a whole record of it would hold, named as in a record (what the delivery
    /// log reads).
    pub fn fields(&self) -> BTreeMap<String, String> {
        let mut f = BTreeMap::from([
            ("state".to_string(), self.state.clone()),
            ("settled_ms".to_string(), self.settled_ms.to_string()),
            ("sends".to_string(), self.sends.to_string()),
        ]);
        if let Some(detail) = &self.detail {
            let name = if self.state == "sent" && detail != "accepted" { "provider_id" } else { "reason" };
            f.insert(name.to_string(), detail.clone());
        }
        if self.fallback {
            f.insert("fallback".to_string(), "1".to_string());
        }
        if let Some(v) = &self.variant {
            f.insert("variant".to_string(), v.clone());
        }
        f
    }
}

/// The bucket hash of a delivery's home (`home_hash` in lua/prelude.lua): `h * 31 + byte`
/// over its bytes, modulo 2^31 − 1.
pub fn home_hash(home: &str) -> u64 {
    home.bytes().fold(0u64, |h, b| (h * 31 + u64::from(b)) % 2_147_483_647)
}

/// A delivery's field in its bucket: `<subscriber>:<target>`.
pub fn field(d: &DeliveryRef) -> String {
    format!("{}:{}", d.subscriber, d.target)
}

/// The key of the bucket `d` is kept in, in a period of `buckets` buckets.
pub fn bucket_of(keys: &Keys, p: u16, d: &DeliveryRef, buckets: u32) -> String {
    let n = (home_hash(d.home()) % u64::from(buckets.max(1))) as u32;
    keys.settled(p, &d.campaign, &d.period, d.channel, n)
}

/// The number of buckets of a period's settled history on `channel` in partition `p`
/// (`buckets` in its counts hash); `None` while it has none.
pub async fn buckets(
    conn: &mut Conn,
    keys: &Keys,
    p: u16,
    campaign: &str,
    period: &str,
    channel: Channel,
) -> anyhow::Result<Option<u32>> {
    let cmd = redis::cmd("HGET").arg(keys.channel_counts(p, campaign, period, channel)).arg("buckets").clone();
    Ok(conn.each::<Option<u32>>(&[cmd]).await?.pop().flatten())
}

/// The compact entries of `refs` (deliveries of partition `p`), aligned with them (`None`:
/// none kept): the bucket counts of their periods, then the fields, two round trips.
pub async fn lookup(
    conn: &mut Conn,
    keys: &Keys,
    p: u16,
    refs: &[DeliveryRef],
) -> anyhow::Result<Vec<Option<HistoryEntry>>> {
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    let periods: Vec<(&str, &str, Channel)> = {
        let mut all: Vec<_> = refs.iter().map(|d| (d.campaign.as_str(), d.period.as_str(), d.channel)).collect();
        all.sort();
        all.dedup();
        all
    };
    let cmds: Vec<redis::Cmd> = periods
        .iter()
        .map(|(c, period, ch)| redis::cmd("HGET").arg(keys.channel_counts(p, c, period, *ch)).arg("buckets").clone())
        .collect();
    let counts: Vec<Option<u32>> = conn.each(&cmds).await?;
    let n_of = |d: &DeliveryRef| {
        let i = periods.binary_search(&(d.campaign.as_str(), d.period.as_str(), d.channel)).ok()?;
        counts[i]
    };
    let asked: Vec<(usize, redis::Cmd)> = refs
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let n = n_of(d)?;
            Some((i, redis::cmd("HGET").arg(bucket_of(keys, p, d, n)).arg(field(d)).clone()))
        })
        .collect();
    let cmds: Vec<redis::Cmd> = asked.iter().map(|(_, c)| c.clone()).collect();
    let texts: Vec<Option<String>> = if cmds.is_empty() { Vec::new() } else { conn.each(&cmds).await? };
    let mut out = vec![None; refs.len()];
    for ((i, _), text) in asked.into_iter().zip(texts) {
        out[i] = text.as_deref().and_then(HistoryEntry::parse);
    }
    Ok(out)
}

/// Every entry of one bucket, with the delivery it names.
pub async fn bucket(
    conn: &mut Conn,
    keys: &Keys,
    p: u16,
    campaign: &str,
    period: &str,
    channel: Channel,
    n: u32,
) -> anyhow::Result<Vec<(DeliveryRef, HistoryEntry)>> {
    let cmd = redis::cmd("HGETALL").arg(keys.settled(p, campaign, period, channel, n)).clone();
    let fields: Vec<BTreeMap<String, String>> = conn.each(&[cmd]).await?;
    Ok(fields
        .into_iter()
        .flatten()
        .filter_map(|(field, text)| {
            let (subscriber, target) = field.split_once(':')?;
            let d = DeliveryRef::new(campaign, period, subscriber, target).on(channel);
            Some((d, HistoryEntry::parse(&text)?))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_as_the_fields_of_a_record() {
        // One request made, the usual case: the count is left out.
        let e = HistoryEntry::parse("sent 1764720000123 4f2c1e9a-0b1c-4d2e-8f3a-5b6c7d8e9f01").unwrap();
        assert_eq!(HistoryEntry::parse("sent 1764720000123 4f2c1e9a-0b1c-4d2e-8f3a-5b6c7d8e9f01 1"), Some(e.clone()));
        assert_eq!(e.fields()["provider_id"], "4f2c1e9a-0b1c-4d2e-8f3a-5b6c7d8e9f01");
        assert_eq!((e.state.as_str(), e.settled_ms, e.sends, e.fallback), ("sent", 1764720000123, 1, false));
        let skipped = HistoryEntry::parse("skipped 1764720000123 not_entitled 0").unwrap();
        assert_eq!(skipped.fields()["reason"], "not_entitled");
        let flagged = HistoryEntry::parse("sent 17 re_1 2 fallback variant=b").unwrap();
        assert!(flagged.fallback && flagged.variant.as_deref() == Some("b") && flagged.sends == 2);
        let once = HistoryEntry::parse("sent 17 re_1 variant=a").unwrap();
        assert_eq!((once.sends, once.variant.as_deref(), once.fallback), (1, Some("a"), false));
        assert_eq!(flagged.fields()["fallback"], "1");
        let event = HistoryEntry::parse("sent 17 accepted 0").unwrap();
        assert_eq!(event.fields()["reason"], "accepted");
        assert_eq!(HistoryEntry::parse("sent 17 - 0").unwrap().detail, None);
        for bad in ["", "sent", "sent x - 0", "sent 17", "sent 17.5 re_1"] {
            assert_eq!(HistoryEntry::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_subscribers_deliveries_of_a_period_share_a_bucket() {
        let keys = Keys::new("mailstream", 4);
        let d = DeliveryRef::new("weekly_digest", "2026-W49", "u42", "team-7");
        let other_target = DeliveryRef::new("weekly_digest", "2026-W49", "u42", "team-8");
        assert_eq!(bucket_of(&keys, 1, &d, 64), bucket_of(&keys, 1, &other_target, 64));
        assert_eq!(
            bucket_of(&keys, 1, &d.clone().on(Channel::App), 1),
            "mailstream:{1}:settled:weekly_digest:2026-W49:app:0"
        );
        // A receipt's home is its idempotency key.
        let receipt = DeliveryRef::new("transactional", "2026-12-02", "-", "order-1");
        assert_eq!(home_hash(receipt.home()), home_hash("order-1"));
        // Pinned: a change would lose every settled delivery's dedup.
        assert_eq!(home_hash("u42"), (117 * 31 + 52) * 31 + 50);
    }

    /// lua/prelude.lua names a delivery's counts hash, bucket and field as this module does,
    /// for every channel and lane, and hashes its home alike.
    #[tokio::test]
    async fn the_scripts_and_this_module_name_the_same_keys() {
        let redis = crate::store::redis_server::RedisServer::start(Default::default()).await.expect("redis starts");
        let mut conn = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
        let keys = Keys::new("mailstream", 8);
        let script = format!(
            "{}\nlocal counts, prefix, h, field = history(KEYS[1])\n\
             return {{counts, prefix .. (h % tonumber(ARGV[1])), field, tostring(h)}}",
            crate::store::scripts::PRELUDE
        );
        let long_home = "u".repeat(128);
        for d in [
            DeliveryRef::new("weekly_digest", "2026-W49", "u42", "team-7"),
            DeliveryRef::new("weekly_digest", "2026-W49", "u42", "team-7").on(Channel::App),
            DeliveryRef::new("transactional", "2026-12-02", "-", "order.1"),
            DeliveryRef::new("monthly", "2026-12", &long_home, "t"),
        ] {
            let p = keys.partition_of(d.home());
            for n in [1u32, 64, 65536] {
                let got: Vec<String> = redis::cmd("EVAL")
                    .arg(&script)
                    .arg(1)
                    .arg(keys.delivery(p, &d.id()))
                    .arg(n)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let want = [
                    keys.channel_counts(p, &d.campaign, &d.period, d.channel),
                    bucket_of(&keys, p, &d, n),
                    field(&d),
                    home_hash(d.home()).to_string(),
                ];
                assert_eq!(got, want, "{d:?} in {n} buckets");
            }
        }
    }
}
