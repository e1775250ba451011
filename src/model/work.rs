//! The values that travel down the send path (read → queue → dispatch → request):
//! a reference to a delivery, a rendered email waiting for a batch,
//! a sealed batch, and the next request's worth of work.

use bytes::Bytes;

use crate::model::names::names;

/// The campaign name of transactional deliveries (receipts, resets) enqueued
/// through the ingest API or `mailstream enqueue`; no configured campaign may
/// take it.
pub const TRANSACTIONAL: &str = "transactional";

names! {
    /// The line a delivery waits in. Each has its own stream per partition; the
    /// dispatcher fills every request slot from the transactional lane first, so a
    /// receipt never waits behind a digest. A batch of receipts has its spare room
    /// filled with digest emails of the same partition (seal.lua acknowledges each
    /// member's entry on its own lane's stream). `ALL` is in the order the dispatcher
    /// serves them. Deliveries of the application channel (any campaign) wait in a
    /// lane of their own, `App`, read by the channel's sender (`app.rs`), never by the
    /// batcher: an application that is down holds no email; so do those of the Web Push
    /// channel, `Push` (`push/`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Lane {
        Transactional = "transactional",
        Digest = "digest",
        App = "app",
        Push = "push",
    }
}

impl Lane {
    /// The lane of `campaign`'s deliveries on `channel`: every application event has a
    /// lane of its own; transactional email has its own; campaign email is the digest's.
    pub fn of(campaign: &str, channel: Channel) -> Lane {
        match (channel, campaign == TRANSACTIONAL) {
            (Channel::App, _) => Lane::App,
            (Channel::Push, _) => Lane::Push,
            (Channel::Email, true) => Lane::Transactional,
            (Channel::Email, false) => Lane::Digest,
        }
    }

    /// The lanes whose emails the batcher sends.
    pub const EMAIL: [Lane; 2] = [Lane::Transactional, Lane::Digest];

    pub fn index(self) -> usize {
        self as usize
    }
}

names! {
    /// Where a delivery reaches its subscriber (`channels` of a campaign). Each channel
    /// of a (campaign, period, subscriber, target) is a delivery of its own, with its own
    /// record, claim, gate and outcome, so one channel's outage never holds or repeats
    /// another. An email delivery's id is the natural key alone (as before channels
    /// existed); another channel's adds `:<channel>`.
    #[derive(
        Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Deserialize, serde::Serialize,
    )]
    #[serde(rename_all = "snake_case")]
    pub enum Channel {
        #[default]
        Email = "email",
        /// A signed POST of the delivery's event to the application (`[channels.app]`).
        App = "app",
        /// A Web Push notification to each of the subscriber's browsers (`[channels.push]`).
        Push = "push",
    }
}

names! {
    /// Whom a template's mail is for (`audience` of `[templates.NAME]`). Customer mail is
    /// the default. Operator mail goes only to the addresses of `[operators] to`, always
    /// in a request of its own (never batched with customer mail), and only it may fall
    /// back once to another sender when Resend refuses the first.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Audience {
        #[default]
        Customers = "customers",
        Operators = "operators",
    }
}

/// The id of a delivery, [`DeliveryRef::id`], from its parts (for a fan-out, which
/// builds ids by the million and needs no `DeliveryRef` for them).
pub(crate) fn delivery_id(campaign: &str, period: &str, subscriber: &str, target: &str, channel: Channel) -> String {
    match channel {
        Channel::Email => format!("{campaign}:{period}:{subscriber}:{target}"),
        other => format!("{campaign}:{period}:{subscriber}:{target}:{other}"),
    }
}

/// Which delivery: one (campaign, period, subscriber, target) on one channel. Its id,
/// `campaign:period:subscriber:target` for email and `…:target:<channel>` for another
/// channel, names its record and is its dedup key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeliveryRef {
    pub campaign: String,
    pub period: String,
    pub subscriber: String,
    pub target: String,
    pub channel: Channel,
}

impl DeliveryRef {
    /// An email delivery.
    pub fn new(campaign: &str, period: &str, subscriber: &str, target: &str) -> DeliveryRef {
        DeliveryRef {
            campaign: campaign.to_string(),
            period: period.to_string(),
            subscriber: subscriber.to_string(),
            target: target.to_string(),
            channel: Channel::Email,
        }
    }

    /// The same (campaign, period, subscriber, target) on `channel`.
    pub fn on(mut self, channel: Channel) -> DeliveryRef {
        self.channel = channel;
        self
    }

    /// Its lane: transactional email has a lane of their own, and so has every delivery
    /// of the application channel.
    pub fn lane(&self) -> Lane {
        Lane::of(&self.campaign, self.channel)
    }

    /// What picks its partition: the subscriber, or for a transactional delivery the
    /// caller's idempotency key (its `target`), so the key's guard and the delivery
    /// share one hash slot.
    pub fn home(&self) -> &str {
        if self.campaign == TRANSACTIONAL { &self.target } else { &self.subscriber }
    }

    /// `campaign:period:subscriber:target`, then `:<channel>` unless it is email (none of
    /// the parts holds a `:`).
    pub fn id(&self) -> String {
        delivery_id(&self.campaign, &self.period, &self.subscriber, &self.target, self.channel)
    }

    /// The delivery an id names; `None` unless it has four non-empty parts, or five
    /// whose last names a channel other than email.
    pub fn parse(id: &str) -> Option<DeliveryRef> {
        let mut parts = id.split(':');
        let mut next = || parts.next().filter(|p| !p.is_empty());
        let d = DeliveryRef::new(next()?, next()?, next()?, next()?);
        let d = match parts.next() {
            None => d,
            Some(channel) => d.on(channel.parse().ok().filter(|c| *c != Channel::Email)?),
        };
        parts.next().is_none().then_some(d)
    }

    /// The id as a Resend tag value (letters, digits, `_` and `-` only): `_` is
    /// written `__`, `:` `_c` and `.` `_d`, so [`DeliveryRef::from_tag`] reverses it.
    pub fn tag(&self) -> String {
        let mut out = String::new();
        for c in self.id().chars() {
            match c {
                '_' => out.push_str("__"),
                ':' => out.push_str("_c"),
                '.' => out.push_str("_d"),
                c => out.push(c),
            }
        }
        out
    }

    /// The delivery a [`DeliveryRef::tag`] value names.
    pub fn from_tag(tag: &str) -> Option<DeliveryRef> {
        let mut id = String::new();
        let mut chars = tag.chars();
        while let Some(c) = chars.next() {
            match (c, c == '_') {
                (_, true) => match chars.next()? {
                    '_' => id.push('_'),
                    'c' => id.push(':'),
                    'd' => id.push('.'),
                    _ => return None,
                },
                (c, false) => id.push(c),
            }
        }
        DeliveryRef::parse(&id)
    }
}

/// A claimed, rendered email waiting for a batch.
#[derive(Debug, Clone)]
pub struct Ready {
    /// Its stream entry (acknowledged when the batch is sealed).
    pub entry: String,
    pub delivery: DeliveryRef,
    /// The email object, exactly as it will be sent.
    pub json: String,
    /// Its A/B variant, recorded at sealing and counted as exposed once accepted.
    pub variant: Option<String>,
    /// Operator mail travels in a request of its own.
    pub audience: Audience,
}

impl Ready {
    /// Whether it travels in a request of its own: operator mail (never beside customer
    /// mail), and an email with attachments (Resend's batch endpoint refuses them: it goes
    /// through `POST /emails`).
    pub(crate) fn alone(&self) -> bool {
        self.audience == Audience::Operators || carries_attachments(&self.json)
    }

    /// Every address its email is addressed to (`to`, `cc`, `bcc`; a string or a list
    /// each), read from the JSON that will be sealed, so the last gate checks exactly
    /// the addresses the request carries, whoever supplied them.
    pub(crate) fn recipients(&self) -> Vec<String> {
        serde_json::from_str(&self.json).map(|email| recipients_of(&email)).unwrap_or_default()
    }
}

/// How an email's attachments read in its JSON, spliced in last by [`with_attachments`].
/// Inside a JSON string every `"` is escaped, so `,"` here can only open a key.
const ATTACHMENTS: &str = ",\"attachments\":[";

/// The email object `json` with `attachments` (a JSON array) as its last field.
pub fn with_attachments(json: &str, attachments: &str) -> String {
    let Some(open) = json.trim_end().strip_suffix('}') else { return json.to_string() };
    let attachments = attachments.strip_prefix('[').unwrap_or(attachments);
    format!("{open}{ATTACHMENTS}{attachments}}}")
}

/// Whether an email object's JSON carries attachments: it is sent alone, through
/// `POST /emails`, not in a batch.
pub fn carries_attachments(json: &str) -> bool {
    // As spliced, or first of an object serialized again in key order (a fallback sender's).
    json.contains(ATTACHMENTS) || json.contains(&ATTACHMENTS.replacen(',', "{", 1))
}

/// Every address an email object is addressed to: `to`, `cc` and `bcc`, each a string
/// or a list.
pub(crate) fn recipients_of(email: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for field in ["to", "cc", "bcc"] {
        match email.get(field) {
            Some(serde_json::Value::String(s)) => out.push(s.clone()),
            Some(serde_json::Value::Array(list)) => {
                out.extend(list.iter().filter_map(|v| v.as_str()).map(str::to_string))
            }
            _ => {}
        }
    }
    out
}

/// A sealed batch in hand: what to send and who is in it.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub partition: u16,
    pub id: String,
    /// Its Idempotency-Key, fixed at sealing.
    pub key: String,
    /// The exact request body stored at sealing.
    pub body: Bytes,
    pub members: Vec<DeliveryRef>,
    /// Failed requests before this one (the backoff's exponent).
    pub tries: u32,
    /// Whether an earlier attempt may have been processed by the provider.
    pub maybe_sent: bool,
}

impl Sealed {
    /// A batch just sealed (or taken over with no tries recorded).
    pub fn new(partition: u16, id: String, key: String, body: Bytes, members: Vec<DeliveryRef>) -> Sealed {
        Sealed { partition, id, key, body, members, tries: 0, maybe_sent: false }
    }

    /// The span its life is logged in (see [`batch_span`]).
    pub(crate) fn span(&self) -> tracing::Span {
        batch_span(self.partition, &self.id)
    }
}

/// The span of batch `id` of partition `p`: every line logged about it carries both.
pub(crate) fn batch_span(p: u16, id: &str) -> tracing::Span {
    tracing::info_span!("batch", partition = p, batch = id)
}

/// The next request to make.
#[derive(Debug)]
pub(crate) enum Work {
    /// A new batch of one partition's emails, to seal and send.
    Fresh(u16, Vec<Ready>),
    /// A sealed batch to send again, same key and body.
    Resend(Sealed),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_are_spliced_in_last_and_found_only_as_a_key() {
        let email = r#"{"from":"a@b.example","to":"c@d.example","text":"\",\"attachments\":[ in a body"}"#;
        assert!(!carries_attachments(email), "inside a string it is escaped");
        let with = with_attachments(email, r#"[{"filename":"x.pdf","content":"eA=="}]"#);
        assert!(with.ends_with(r#","attachments":[{"filename":"x.pdf","content":"eA=="}]}"#), "{with}");
        let parsed: serde_json::Value = serde_json::from_str(&with).unwrap();
        assert_eq!(parsed["attachments"][0]["filename"], "x.pdf");
        assert!(carries_attachments(&with));
        // Serialized again in key order (a fallback sender's), it is the first key.
        let resorted = serde_json::to_string(&parsed).unwrap();
        assert!(carries_attachments(&resorted), "{resorted}");
    }

    #[test]
    fn recipients_are_read_from_the_email_itself() {
        let ready = |json: &str| Ready {
            entry: "0-1".into(),
            delivery: DeliveryRef::new("c", "p", "s", "t"),
            json: json.into(),
            variant: None,
            audience: Audience::Customers,
        };
        let email = r#"{"to":["a@x.example"],"cc":"b@x.example","bcc":["c@x.example","d@x.example"],"subject":"s"}"#;
        assert_eq!(ready(email).recipients(), ["a@x.example", "b@x.example", "c@x.example", "d@x.example"]);
        assert_eq!(ready(r#"{"to":"Ann <a@x.example>"}"#).recipients(), ["Ann <a@x.example>"]);
        assert!(ready("not json").recipients().is_empty());
    }

    #[test]
    fn ids_and_tags_round_trip() {
        let d = DeliveryRef::new("weekly_digest", "2026-W48", "ann.b_7", "team-1");
        assert_eq!(d.id(), "weekly_digest:2026-W48:ann.b_7:team-1");
        assert_eq!(DeliveryRef::parse(&d.id()), Some(d.clone()));
        let tag = d.tag();
        assert!(tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'), "{tag}");
        assert_eq!(DeliveryRef::from_tag(&tag), Some(d));
        let app = DeliveryRef::new("weekly_digest", "2026-W48", "u1", "t").on(Channel::App);
        assert_eq!(app.id(), "weekly_digest:2026-W48:u1:t:app");
        assert_eq!((DeliveryRef::parse(&app.id()), app.lane()), (Some(app.clone()), Lane::App));
        assert_eq!(DeliveryRef::from_tag(&app.tag()), Some(app));
        for bad in ["a:b:c", "a:b:c:d:e", "a:b:c:d:email", "a:b:c:d:app:x", "a::c:d", "", "x_zy"] {
            assert_eq!(DeliveryRef::parse(bad).or_else(|| DeliveryRef::from_tag(bad)), None, "{bad}");
        }
    }
}
