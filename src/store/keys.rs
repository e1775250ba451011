//! The Redis key layout, in one place. Every key of a delivery (its stream,
//! record, batch, counters, subscriber, the partition's pause) carries the hash
//! tag of its partition, `{N}`, so each Lua script touches one hash slot and the
//! same scripts run on Redis Cluster. A delivery's record is named by its natural
//! dedup key, so the dedup check and the record are one key. The README
//! documents each family.

use crate::model::work::{Channel, DeliveryRef, Lane};

/// The layout version recorded in `meta` (1: a ULID per delivery plus a dedup key;
/// 2: natural-key records, fan-out over the registry's records; 3: fan-out over each
/// partition's audience and the campaigns' opt-out sets; 4: batches of several
/// partitions could share a request (since retired: this version cannot send one);
/// 5: one partition's batch per request, and every partition keeps the suppressed
/// addresses its last gate reads; 6: deliveries of other channels than email, each
/// with its own stream, due set and counts; an email delivery's keys are as in 5;
/// 7: a delivery settled sent or skipped keeps a compact entry in its period's settled
/// history instead of its record, which the dedup reads too; 8: every trace of a campaign
/// period's dedup expires no earlier than its kick window's end, which its counts hash
/// records, and the periods index is scored by when each period is kept until).
pub(crate) const LAYOUT: u32 = 8;

/// The layout that also needs the audience index built (`subscribers::build_audience`)
/// on its way to [`LAYOUT`].
pub(crate) const AUDIENCE_LAYOUT: u32 = 2;

/// The layout whose unsettled batches may belong to a shared tail request: it is
/// upgraded only once a layout-4 daemon has settled them.
pub(crate) const SHARED_TAIL_LAYOUT: u32 = 4;

/// The earlier layouts `mailstream upgrade` moves to [`LAYOUT`].
pub(crate) const UPGRADABLE_LAYOUTS: [u32; 6] = [AUDIENCE_LAYOUT, 3, SHARED_TAIL_LAYOUT, 5, 6, 7];

/// How many settlements each partition's `recent` index keeps (`RECENT_KEEP` in
/// lua/prelude.lua: a test holds them together).
pub const RECENT_KEEP: usize = 1_000;

/// Builds key names for one deployment (one prefix, fixed partition count).
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
    partitions: u16,
    /// The deployment's random salt (in `meta`) for address hashes.
    salt: String,
}

/// An email address as mailstream keeps it: a salted hash (never the address) and
/// the partition its suppression record and subscriber index live in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub hash: String,
    pub partition: u16,
}

impl Keys {
    pub fn new(prefix: &str, partitions: u16) -> Keys {
        assert!(partitions > 0, "at least one partition");
        Keys { prefix: prefix.to_string(), partitions, salt: String::new() }
    }

    /// The same layout with the deployment's salt (read from `meta` at connect).
    pub(crate) fn with_salt(mut self, salt: &str) -> Keys {
        self.salt = salt.to_string();
        self
    }

    /// The hash and home partition of an address ([`normalized`]): 32 hex digits of
    /// SHA-256 over the salt and the address, safe in key names and logs. The webhook
    /// side and the last gate both name an address this way, so a suppression made from
    /// a provider's event finds the address the gate reads out of a sealed body.
    pub fn address(&self, email: &str) -> Address {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(self.salt.as_bytes());
        h.update(b":");
        h.update(normalized(email).as_bytes());
        let digest = h.finalize();
        let hash: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        let partition = u16::from_be_bytes([digest[0], digest[1]]) % self.partitions;
        Address { hash, partition }
    }

    /// The address `hash` names (as [`Keys::address`] made it), if it is such a hash:
    /// what an operator who sees only hashes acts on.
    pub fn address_of_hash(&self, hash: &str) -> Option<Address> {
        let hex = hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let partition = u16::from_str_radix(hash.get(..4)?, 16).ok()? % self.partitions;
        hex.then(|| Address { hash: hash.to_string(), partition })
    }

    /// The hashes of `addresses` as seal.lua keeps them for the last gate (and ingest.lua
    /// for its address index): comma-separated, `-` for none.
    pub(crate) fn address_hashes(&self, addresses: &[String]) -> String {
        if addresses.is_empty() {
            return "-".to_string();
        }
        addresses.iter().map(|a| self.address(a).hash).collect::<Vec<_>>().join(",")
    }

    /// Set: the ids of the subscribers whose address hashes to `hash` (in its home partition).
    pub(crate) fn address_index(&self, a: &Address) -> String {
        self.tagged(a.partition, &format!("addr:{}", a.hash))
    }

    /// Hash: an address's suppression (reason, at_ms, source, event), in its home partition.
    pub fn suppression(&self, a: &Address) -> String {
        self.tagged(a.partition, &format!("suppression:{}", a.hash))
    }

    /// Hash: address hash → reason, for every suppressed address, kept in every
    /// partition (written by the cascade), so the last gate reads it in the batch's own
    /// slot, whoever supplied the address.
    pub fn suppressed(&self, p: u16) -> String {
        self.tagged(p, "suppressed")
    }

    /// The pattern matching every suppression record (for SCAN).
    pub(crate) fn suppressions_pattern(&self) -> String {
        format!("{}:{{*}}:suppression:*", self.prefix)
    }

    /// Sorted set: an address's recent transient bounces (event id → ms), expiring
    /// after the window.
    pub(crate) fn bounces(&self, a: &Address) -> String {
        self.tagged(a.partition, &format!("bounces:{}", a.hash))
    }

    /// String with a TTL: webhook event `event` has had its effect `step` in partition `p`.
    pub fn seen(&self, p: u16, event: &str, step: &str) -> String {
        self.tagged(p, &format!("seen:{event}:{step}"))
    }

    /// The first component of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    /// The partition a subscriber's deliveries live in: FNV-1a of the id, stable
    /// across versions and machines (changing it would break deduplication).
    pub fn partition_of(&self, subscriber: &str) -> u16 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in subscriber.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        (hash % u64::from(self.partitions)) as u16
    }

    fn tagged(&self, partition: u16, rest: &str) -> String {
        format!("{}:{{{}}}:{}", self.prefix, partition, rest)
    }

    /// Stream of digest delivery ids waiting to be sent (entries: `delivery <id>`).
    pub fn stream(&self, p: u16) -> String {
        self.tagged(p, "stream")
    }

    /// The stream of `lane` in partition `p`: `stream` for campaigns, `stream:tx` for
    /// transactional deliveries (read first), `stream:app` for the application channel.
    pub fn lane_stream(&self, p: u16, lane: Lane) -> String {
        match lane {
            Lane::Digest => self.stream(p),
            Lane::Transactional => self.tagged(p, "stream:tx"),
            Lane::App => self.tagged(p, "stream:app"),
            Lane::Push => self.tagged(p, "stream:push"),
        }
    }

    /// The due set of `lane`'s deliveries in partition `p`: `due` for email (a local
    /// hour, a render hook's wait), `due:app` for the application channel (a local hour,
    /// a retry), so due.lua releases each into its own lane's stream.
    pub fn lane_due(&self, p: u16, lane: Lane) -> String {
        match lane {
            Lane::App => self.tagged(p, "due:app"),
            Lane::Push => self.tagged(p, "due:push"),
            Lane::Digest | Lane::Transactional => self.due(p),
        }
    }

    /// The stream a delivery waits in.
    pub(crate) fn stream_of(&self, p: u16, d: &DeliveryRef) -> String {
        self.lane_stream(p, d.lane())
    }

    /// String: the guard of a caller's idempotency key (transactional), holding the
    /// delivery id it made and a hash of the request; expires after the retention.
    pub fn idempotency(&self, p: u16, key: &str) -> String {
        self.tagged(p, &format!("idem:{key}"))
    }

    /// Hash: one delivery (`campaign:period:subscriber:target`): its state, claims,
    /// lease, batch and outcome; no addresses. Its existence is the dedup check.
    pub fn delivery(&self, p: u16, id: &str) -> String {
        self.tagged(p, &format!("d:{id}"))
    }

    /// The pattern matching every delivery record of partition `p` (for SCAN).
    pub fn deliveries_pattern(&self, p: u16) -> String {
        self.tagged(p, "d:*")
    }

    /// Hash: counters of one campaign period's email in this partition (enqueued, sent, ...).
    pub fn counts(&self, p: u16, campaign: &str, period: &str) -> String {
        self.tagged(p, &format!("counts:{campaign}:{period}"))
    }

    /// Hash: the counters of one campaign period on `channel`: [`Keys::counts`] for email,
    /// `counts:<campaign>:<period>:<channel>` for another channel.
    pub fn channel_counts(&self, p: u16, campaign: &str, period: &str, channel: Channel) -> String {
        match channel {
            Channel::Email => self.counts(p, campaign, period),
            other => self.tagged(p, &format!("counts:{campaign}:{period}:{other}")),
        }
    }

    /// Sorted set: the `campaign:period`s enqueued in this partition, scored by when their
    /// traces are kept until (Redis-clock ms; what /metrics and `slo` report on).
    pub fn periods(&self, p: u16) -> String {
        self.tagged(p, "periods")
    }

    /// Sorted set: delivery ids waiting for their release time (a campaign sent at each
    /// recipient's local hour), scored by it in Redis-clock ms; due.lua moves them into
    /// the stream.
    pub fn due(&self, p: u16) -> String {
        self.tagged(p, "due")
    }

    /// Hash: one campaign period's fan-out over the registry (owner, lease, a cursor
    /// per partition, counts), so it runs once and resumes where it stopped.
    pub fn fanout(&self, campaign: &str, period: &str) -> String {
        format!("{}:fanout:{campaign}:{period}", self.prefix)
    }

    /// Hash: a subscriber (address, targets, entitled, subscribed, data, time_zone).
    pub fn subscriber(&self, p: u16, id: &str) -> String {
        self.tagged(p, &format!("subscriber:{id}"))
    }

    /// Hash: a subscriber's Web Push subscriptions, by their id (a hash of the endpoint:
    /// the endpoint itself, personal data, is only ever a value here).
    pub fn push_subscriptions(&self, p: u16, id: &str) -> String {
        self.tagged(p, &format!("push:{id}"))
    }

    /// Set: ids of the subscribers in this partition (the registry).
    pub fn subscribers(&self, p: u16) -> String {
        self.tagged(p, "subscribers")
    }

    /// Hash: id → what a kick needs (`targets|time_zone`) of each subscriber in this
    /// partition who is entitled, subscribed and not suppressed; written with every change
    /// of those fields, so a fan-out reads one entry per subscriber it mails, nothing else.
    pub fn audience(&self, p: u16) -> String {
        self.tagged(p, "audience")
    }

    /// Set: ids of the subscribers in this partition who turned `campaign` off (its email:
    /// the one-click unsubscribe).
    pub fn opted_out(&self, p: u16, campaign: &str) -> String {
        self.tagged(p, &format!("off:{campaign}"))
    }

    /// Set: ids of the subscribers in this partition who turned `campaign` off on
    /// `channel`: [`Keys::opted_out`] for email, `off:<campaign>:<channel>` for another.
    pub fn channel_opted_out(&self, p: u16, campaign: &str, channel: Channel) -> String {
        match channel {
            Channel::Email => self.opted_out(p, campaign),
            other => self.tagged(p, &format!("off:{campaign}:{other}")),
        }
    }

    /// Hash: a sealed batch (exact request body, idempotency key, members).
    pub fn batch(&self, p: u16, id: &str) -> String {
        self.tagged(p, &format!("batch:{id}"))
    }

    /// String: the heartbeat's last write to partition `p`'s node while its replicas did
    /// not acknowledge, for `WAIT` to count.
    pub fn replicas_probe(&self, p: u16) -> String {
        self.tagged(p, "replicas_probe")
    }

    /// Sorted set: unsettled batches, scored by when they next need attention
    /// (their lease expiry, or their retry due time), in Redis-clock milliseconds.
    pub fn batches(&self, p: u16) -> String {
        self.tagged(p, "batches")
    }

    /// Hash: bucket `n` of a campaign period's settled history on `channel` (email's
    /// `settled:<campaign>:<period>:<n>`, another channel's adds `:<channel>` before the
    /// bucket), one field per delivery settled sent or skipped (`store::history`).
    pub fn settled(&self, p: u16, campaign: &str, period: &str, channel: Channel, n: u32) -> String {
        match channel {
            Channel::Email => self.tagged(p, &format!("settled:{campaign}:{period}:{n}")),
            other => self.tagged(p, &format!("settled:{campaign}:{period}:{other}:{n}")),
        }
    }

    /// Sorted set: the ids of this partition's newest settled deliveries (at most 1,000,
    /// within the retention), scored by when they settled: the delivery log's newest-first
    /// pages. Written by whoever settles (settle, decide, the last gate's skips).
    pub fn recent(&self, p: u16) -> String {
        self.tagged(p, "recent")
    }

    /// Hash: this partition's settlements per minute of the last hour, field
    /// `<minute since the epoch>:<state>` (and `oldest`, the oldest minute kept): the admin
    /// overview's chart. Written by whoever settles, once per call (prelude.lua's
    /// `tally_minute`).
    pub fn per_minute(&self, p: u16) -> String {
        self.tagged(p, "per_minute")
    }

    /// Sorted set: this partition's address index, member `<address hash>:<delivery id>` for
    /// each address a transactional delivery is sent to inline, scored by when its
    /// idempotency key's guard expires (ingest.lua): how the admin page's search finds the
    /// deliveries addressed to someone (a subscriber's, through `address_index`).
    pub fn by_address(&self, p: u16) -> String {
        self.tagged(p, "by_address")
    }

    /// Stream: dead letters (delivery id, error name, attempts; no personal data).
    pub fn dead(&self, p: u16) -> String {
        self.tagged(p, "dead")
    }

    /// Stream: deliveries whose outcome is unknown (id, error name), for the operator.
    pub fn unknown(&self, p: u16) -> String {
        self.tagged(p, "unknown")
    }

    /// Hash: webhook events written on this partition's deliveries in one hour (`hour`:
    /// Unix ms / 3,600,000), by type; expires after 25 hours (the overview's last 24).
    pub fn webhooks(&self, p: u16, hour: i64) -> String {
        self.tagged(p, &format!("webhooks:{hour}"))
    }

    /// Hash: whether the provider is down, team-wide (failures in the current run, since
    /// when it is down, when the next probe may leave); health.lua.
    pub fn provider(&self) -> String {
        format!("{}:provider", self.prefix)
    }

    /// Hash: delivery id -> bytes of its attachments, for the unsettled receipts of
    /// partition `p` that carry some (ingest.lua writes; entries of settled ones are pruned).
    pub fn attachments(&self, p: u16) -> String {
        self.tagged(p, "attachments")
    }

    /// Hash: an unfinished `mailstream suppressions sync` (the cursor `after`, `started_ms`,
    /// and its counts so far); deleted when a sync completes.
    pub fn suppressions_sync(&self) -> String {
        format!("{}:suppressions:sync", self.prefix)
    }

    /// Set: the address hashes an unfinished sync has seen on Resend's list (a suppression
    /// of Resend's it did not see is lifted when it completes); deleted with it.
    pub fn suppressions_sync_seen(&self) -> String {
        format!("{}:suppressions:sync:seen", self.prefix)
    }

    /// Hash with a TTL: a signed-in admin session (the token's name and owner mark), under
    /// the SHA-256 of the random id its cookie holds (the id itself is never stored).
    pub fn admin_session(&self, id_hash: &str) -> String {
        format!("{}:admin:session:{id_hash}", self.prefix)
    }

    /// Hash: the team-wide request limiter (next departure, pause, a lowered rate).
    pub fn limiter(&self) -> String {
        format!("{}:limiter", self.prefix)
    }

    /// Hash: the live instances the limiter counts, beside `limiter` (whose name is its
    /// hash tag, so both are in one slot): instance id -> "<hello ms>:<share>".
    pub fn limiter_peers(limiter: &str) -> String {
        format!("{{{limiter}}}:peers")
    }

    /// Hash: deployment facts checked at start (the partition count).
    pub fn meta(&self) -> String {
        format!("{}:meta", self.prefix)
    }

    /// Sorted set, one member (`retention_s`): the kick window's retention, the shortest
    /// `delivery.retention_days` (in seconds) any command that writes has run this
    /// deployment with (`ZADD … LT`, so it only ever shrinks): a window that widened could
    /// reach a period whose traces expired under the shorter retention.
    pub fn kick_window(&self) -> String {
        format!("{}:kick_window", self.prefix)
    }

    /// String with a TTL, one per partition (so the last gate reads it in its own
    /// slot): sending is paused (quota exhausted) until it expires.
    pub fn paused(&self, p: u16) -> String {
        self.tagged(p, "paused")
    }
}

/// An address as mailstream compares it: the part inside `<…>` if there is one
/// (`Ann <ann@acme.example>`), trimmed and lower-cased.
pub fn normalized(email: &str) -> String {
    let inner = match (email.rfind('<'), email.rfind('>')) {
        (Some(open), Some(close)) if open < close => &email[open + 1..close],
        _ => email,
    };
    crate::model::address::comparable(inner)
}

/// The part of `key` Redis Cluster hashes: the first `{…}` if it is not empty, else
/// the whole key (keys with one tag share a slot).
pub fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_readable_and_tagged() {
        let keys = Keys::new("mailstream", 8);
        assert_eq!(
            keys.delivery(3, "weekly_digest:2026-W48:u42:team-1"),
            "mailstream:{3}:d:weekly_digest:2026-W48:u42:team-1"
        );
        assert_eq!(keys.paused(2), "mailstream:{2}:paused");
        assert_eq!(keys.stream(0), "mailstream:{0}:stream");
    }

    #[test]
    fn an_address_is_named_alike_however_it_is_written() {
        let keys = Keys::new("mailstream", 4).with_salt("s");
        let plain = keys.address("ann@acme.example");
        for written in [" Ann@Acme.Example ", "Ann <ann@acme.example>", "\"Ann B\" < ANN@acme.example >"] {
            assert_eq!(keys.address(written), plain, "{written}");
        }
        assert_ne!(keys.address("bob@acme.example"), plain);
        assert_eq!(keys.address_of_hash(&plain.hash), Some(plain.clone()), "a hash names its address");
        for not_a_hash in ["", "xyz", &plain.hash.to_uppercase(), &plain.hash[1..]] {
            assert_eq!(keys.address_of_hash(not_a_hash), None, "{not_a_hash:?}");
        }
    }

    #[test]
    fn partition_is_stable_and_in_range() {
        let keys = Keys::new("mailstream", 8);
        // Pinned values: a change here would re-partition every deployment.
        assert_eq!(keys.partition_of("u42"), keys.partition_of("u42"));
        let counts = (0..10_000).fold([0u32; 8], |mut acc, i| {
            acc[keys.partition_of(&format!("user-{i}")) as usize] += 1;
            acc
        });
        assert!(counts.iter().all(|&c| c > 1000), "{counts:?}");
        assert_eq!(Keys::new("x", 1000).partition_of("abc"), (0xe71fa2190541574b_u64 % 1000) as u16);
    }
}
