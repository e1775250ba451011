//! The reads of records the send path makes, each written once: a subscriber as the
//! claim's readers and `preview` see it, the request a transactional delivery's record
//! keeps, the fields a channel marks on a delivery, who holds a batch, and Redis's clock.
//! The subscriber record's field names live here too: they are the record's layout, as
//! `keys.rs` is the keys'.

use redis::aio::ConnectionLike;

use super::keys::Keys;
use crate::model::work::DeliveryRef;

/// One command per item, pipelined in one round trip, the replies in order (nothing is
/// sent for no items).
async fn each<I, T: redis::FromRedisValue>(
    conn: &mut impl ConnectionLike,
    items: impl IntoIterator<Item = I>,
    command: impl Fn(I) -> redis::Cmd,
) -> anyhow::Result<Vec<T>> {
    let mut pipe = redis::pipe();
    for item in items {
        pipe.add_command(command(item));
    }
    if pipe.cmd_iter().next().is_none() {
        return Ok(Vec::new());
    }
    Ok(pipe.query_async(conn).await?)
}

/// The fields of a subscriber record (`keys::subscriber`).
pub mod field {
    pub(crate) const EMAIL: &str = "email";
    /// Comma-separated target ids.
    pub(crate) const TARGETS: &str = "targets";
    /// "1" or "0".
    pub(crate) const ENTITLED: &str = "entitled";
    /// "1" or "0".
    pub(crate) const SUBSCRIBED: &str = "subscribed";
    /// A JSON object for the template.
    pub(crate) const DATA: &str = "data";
    /// Present when the address is suppressed (bounced, complained): why.
    pub(crate) const SUPPRESSED: &str = "suppressed";
    /// The subscriber's IANA zone, for deliveries at a local hour.
    pub(crate) const TIME_ZONE: &str = "time_zone";

    /// Present (when, ms) when the subscriber turned `campaign` off (one-click unsubscribe).
    pub fn opted_out(campaign: &str) -> String {
        format!("off:{campaign}")
    }

    /// Present (when, ms) when the subscriber turned `campaign` off on `channel`:
    /// [`opted_out`] for email, `off:<campaign>:<channel>` for another channel.
    pub fn channel_opted_out(campaign: &str, channel: crate::model::work::Channel) -> String {
        match channel {
            crate::model::work::Channel::Email => opted_out(campaign),
            other => format!("off:{campaign}:{other}"),
        }
    }
}

/// The fields [`subscriber_rows`] reads, in the order of [`SubscriberRow`]; the last
/// field of a row is the opt-out field the caller names.
pub const RESOLVE_FIELDS: [&str; 5] =
    [field::EMAIL, field::ENTITLED, field::SUBSCRIBED, field::SUPPRESSED, field::DATA];

/// A subscriber record as [`RESOLVE_FIELDS`] + an opt-out field read it, as raw bytes (a
/// field that is not UTF-8 is the record's problem, not the reader's).
pub type SubscriberRow =
    (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>);

/// One subscriber to read: its partition, its id, and the opt-out field that matters
/// (`field::opted_out` or `field::channel_opted_out`).
pub struct SubscriberRead<'a> {
    pub partition: u16,
    pub id: &'a str,
    pub opted_out: String,
}

/// The subscriber records of `reads`, in their order, in one pipelined round trip.
pub async fn subscriber_rows(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    reads: &[SubscriberRead<'_>],
) -> anyhow::Result<Vec<SubscriberRow>> {
    each(conn, reads, |r| {
        redis::cmd("HMGET").arg(keys.subscriber(r.partition, r.id)).arg(&RESOLVE_FIELDS).arg(&r.opted_out).clone()
    })
    .await
}

/// The request each transactional delivery's record keeps (its JSON, as ingest stored
/// it; `None` where the record or the field is gone), for delivery ids `ids` of
/// partition `p`.
pub async fn stored_requests(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    ids: &[String],
) -> anyhow::Result<Vec<Option<String>>> {
    deliveries_field(conn, keys, p, ids, "request").await
}

/// Forgets the pending-attachment entries of partition `p` whose delivery no longer keeps
/// its attachments (settled: deleted then, or compacted), so ingest.lua's sum of what is
/// pending counts only what waits.
pub async fn prune_pending_attachments(conn: &mut impl ConnectionLike, keys: &Keys, p: u16) -> anyhow::Result<()> {
    let pending: Vec<String> = redis::cmd("HKEYS").arg(keys.attachments(p)).query_async(conn).await?;
    if pending.is_empty() {
        return Ok(());
    }
    let kept = deliveries_marked(conn, keys, p, &pending, "attachments").await?;
    let gone: Vec<&String> = pending.iter().zip(kept).filter(|(_, kept)| !kept).map(|(id, _)| id).collect();
    if !gone.is_empty() {
        let _: () = redis::cmd("HDEL").arg(keys.attachments(p)).arg(gone).query_async(conn).await?;
    }
    Ok(())
}

/// Whether each delivery record of `ids` (partition `p`) holds `field` (a channel's
/// message, or its maybe-taken mark).
pub async fn deliveries_marked(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    ids: &[String],
    field: &str,
) -> anyhow::Result<Vec<bool>> {
    each(conn, ids, |id| redis::cmd("HEXISTS").arg(keys.delivery(p, id)).arg(field).clone()).await
}

/// Who holds a batch, as its record says now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchHolder {
    pub owner: Option<String>,
    pub state: Option<String>,
    /// The Idempotency-Key it is sealed under.
    pub key: Option<String>,
}

/// The holder of batch `batch` of partition `p` (all `None` once it is settled).
pub async fn batch_holder(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    batch: &str,
) -> anyhow::Result<BatchHolder> {
    let (owner, state, key) =
        redis::cmd("HMGET").arg(keys.batch(p, batch)).arg("owner").arg("state").arg("key").query_async(conn).await?;
    Ok(BatchHolder { owner, state, key })
}

/// Redis's clock (`TIME`) as (seconds, microseconds): the one clock for leases, pauses,
/// periods and releases.
pub async fn redis_time(conn: &mut impl ConnectionLike) -> anyhow::Result<(u64, u64)> {
    Ok(redis::cmd("TIME").query_async(conn).await?)
}

/// Redis's clock in milliseconds since the Unix epoch.
pub async fn now_ms(conn: &mut impl ConnectionLike) -> anyhow::Result<u64> {
    let (secs, micros) = redis_time(conn).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// Whether `address` is among partition `p`'s suppressed addresses (by its hash, as the
/// last gate looks).
pub async fn is_suppressed(conn: &mut impl ConnectionLike, keys: &Keys, p: u16, address: &str) -> anyhow::Result<bool> {
    Ok(redis::cmd("HEXISTS").arg(keys.suppressed(p)).arg(keys.address(address).hash).query_async(conn).await?)
}

/// The batches of partition `p` due by Redis's clock `now_ms` (a retry's time, or a
/// holder's lease ended), oldest first, at most `limit`.
pub async fn due_batches(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    now_ms: u64,
    limit: usize,
) -> anyhow::Result<Vec<String>> {
    let due = redis::cmd("ZRANGE")
        .arg(keys.batches(p))
        .arg("-inf")
        .arg(now_ms)
        .arg("BYSCORE")
        .arg("LIMIT")
        .arg(0)
        .arg(limit)
        .query_async(conn)
        .await?;
    Ok(due)
}

/// The deliveries of partition `p` whose records say they are sealed into `batch`: a
/// scan of every record of the partition (for a batch record that was lost, which is rare).
pub async fn sealed_into(store: &super::Store, p: u16, batch: &str) -> anyhow::Result<Vec<DeliveryRef>> {
    let records = store.scan(&store.keys.deliveries_pattern(p)).await?;
    let mut conn = store.conn().await?;
    let mut members = Vec::new();
    for chunk in records.chunks(500) {
        let rows: Vec<(Option<String>, Option<String>)> =
            each(&mut conn, chunk, |key| redis::cmd("HMGET").arg(key).arg(&["state", "batch"]).clone()).await?;
        for (key, (state, b)) in chunk.iter().zip(rows) {
            if state.as_deref() == Some("sealed") && b.as_deref() == Some(batch) {
                let id = key.rsplit_once(":d:").map_or("", |(_, id)| id);
                members.extend(DeliveryRef::parse(id));
            }
        }
    }
    Ok(members)
}

/// What a fallback batch's record keeps of the refusal it stands in for: the operator
/// template, the provider's error name, the HTTP status (all `None` for another batch).
pub async fn fallback_refusal(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    batch: &str,
) -> anyhow::Result<(Option<String>, Option<String>, Option<u16>)> {
    let fields = ["fallback_template", "fallback_error", "fallback_status"];
    Ok(redis::cmd("HMGET").arg(keys.batch(p, batch)).arg(&fields).query_async(conn).await?)
}

/// Each delivery's state and lease end (ms), as its record says.
pub async fn leases(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    deliveries: &[DeliveryRef],
) -> anyhow::Result<Vec<(Option<String>, Option<u64>)>> {
    each(conn, deliveries, |d| {
        redis::cmd("HMGET").arg(keys.delivery(p, &d.id())).arg("state").arg("lease_until").clone()
    })
    .await
}

/// How old an unsettled batch is, as its record says.
pub struct BatchAge {
    /// A request of it may have been taken.
    pub maybe_sent: bool,
    /// When it was last sealed, and first (ms).
    pub sealed_ms: Option<u64>,
    pub first_sealed_ms: Option<u64>,
    pub members: Vec<DeliveryRef>,
}

/// The first `limit` unsettled batches of partition `p`, by due time, with their ages.
pub async fn batch_ages(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    limit: usize,
) -> anyhow::Result<Vec<BatchAge>> {
    let batches = unsettled_batches(conn, keys, p, limit).await?;
    let fields = ["maybe_sent", "sealed_ms", "first_sealed_ms", "members"];
    type AgeFields = (Option<String>, Option<u64>, Option<u64>, Option<String>);
    let rows: Vec<AgeFields> =
        each(conn, &batches, |b| redis::cmd("HMGET").arg(keys.batch(p, b)).arg(&fields).clone()).await?;
    Ok(rows
        .into_iter()
        .map(|(maybe_sent, sealed_ms, first_sealed_ms, members)| BatchAge {
            maybe_sent: maybe_sent.as_deref() == Some("1"),
            sealed_ms,
            first_sealed_ms,
            members: members.unwrap_or_default().split(' ').filter_map(DeliveryRef::parse).collect(),
        })
        .collect())
}

/// The first `limit` unsettled batches of partition `p` (`usize::MAX`: all), by due time.
pub async fn unsettled_batches(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    limit: usize,
) -> anyhow::Result<Vec<String>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    // ZRANGE's stop is inclusive; -1 is the last.
    let stop = isize::try_from(limit).map_or(-1, |l| l - 1);
    Ok(redis::cmd("ZRANGE").arg(keys.batches(p)).arg(0).arg(stop).query_async(conn).await?)
}

/// The pause of each partition: its time left in ms, -1 without an expiry (paused by
/// hand), -2 when there is none.
pub async fn pauses_left_ms(store: &super::Store) -> anyhow::Result<Vec<i64>> {
    let mut conn = store.conn().await?;
    // One key per partition.
    let cmds: Vec<redis::Cmd> =
        (0..store.keys.partitions()).map(|p| redis::cmd("PTTL").arg(store.keys.paused(p)).clone()).collect();
    Ok(conn.each(&cmds).await?)
}

/// Ends the pause of every partition; returns whether one was on.
pub async fn clear_pauses(store: &super::Store) -> anyhow::Result<bool> {
    let mut conn = store.conn().await?;
    let cmds: Vec<redis::Cmd> =
        (0..store.keys.partitions()).map(|p| redis::cmd("DEL").arg(store.keys.paused(p)).clone()).collect();
    let removed: Vec<u32> = conn.each(&cmds).await?;
    Ok(removed.iter().sum::<u32>() > 0)
}

/// Each delivery record's `field` of `ids` (partition `p`), where it holds one.
pub async fn deliveries_field(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    ids: &[String],
    field: &str,
) -> anyhow::Result<Vec<Option<String>>> {
    each(conn, ids, |id| redis::cmd("HGET").arg(keys.delivery(p, id)).arg(field).clone()).await
}

/// A push delivery's browsers (subscriber `subscriber`'s subscriptions, raw) and the
/// fields its record `record` holds (what earlier requests of it marked), in one round
/// trip.
pub async fn push_subscriptions_and_marks(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    p: u16,
    subscriber: &str,
    record: &str,
) -> anyhow::Result<(Vec<(String, String)>, Vec<String>)> {
    let mut pipe = redis::pipe();
    pipe.cmd("HGETALL").arg(keys.push_subscriptions(p, subscriber)).cmd("HKEYS").arg(record);
    Ok(pipe.query_async(conn).await?)
}

/// Removes mark `field` from delivery record `record` (this instance's requests of it
/// are no longer in doubt).
pub async fn clear_mark(conn: &mut impl ConnectionLike, record: &str, field: &str) -> anyhow::Result<()> {
    let _: u32 = redis::cmd("HDEL").arg(record).arg(field).query_async(conn).await?;
    Ok(())
}
