//! Reading a partition's stream and its consumer group: what the group has read,
//! what it holds, and what waits. Shared by the reclaimer (trimming), the stuck
//! scan and the scrape-time backlog, so each reads XINFO the same way.

use std::collections::HashMap;

use redis::aio::ConnectionLike;

/// A stream entry id, `ms-seq`, as numbers (ordered like Redis orders them).
type EntryId = (u64, u64);

/// What `XINFO GROUPS` says of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupInfo {
    /// The last entry handed to any consumer of the group.
    pub last_delivered: EntryId,
    /// Entries not yet read by the group.
    pub lag: u64,
    /// Entries read and not acknowledged (the pending entries list).
    pub pending: u64,
    /// Other groups read this stream too.
    pub foreign_groups: bool,
}

/// The group's standing on `stream`; `None` if the stream or the group does not exist.
pub(crate) async fn group_info(
    conn: &mut impl ConnectionLike,
    stream: &str,
    group: &str,
) -> anyhow::Result<Option<GroupInfo>> {
    let exists: bool = redis::cmd("EXISTS").arg(stream).query_async(conn).await?;
    if !exists {
        return Ok(None);
    }
    let groups: Vec<HashMap<String, redis::Value>> =
        redis::cmd("XINFO").arg("GROUPS").arg(stream).query_async(conn).await?;
    let Some(ours) = groups.iter().find(|g| g.get("name").and_then(text).as_deref() == Some(group)) else {
        return Ok(None);
    };
    let field = |name: &str| ours.get(name).and_then(text);
    Ok(Some(GroupInfo {
        last_delivered: field("last-delivered-id").and_then(|s| parse_id(&s)).unwrap_or((0, 0)),
        lag: field("lag").and_then(|s| s.parse().ok()).unwrap_or(0),
        pending: field("pending").and_then(|s| s.parse().ok()).unwrap_or(0),
        foreign_groups: groups.len() > 1,
    }))
}

/// A stream entry: its id and the delivery id it carries (None: malformed entry).
pub(crate) type StreamEntry = (String, Option<String>);

/// The delivery id of a stream entry (`delivery <id>`).
pub(crate) fn entry_of(s: redis::streams::StreamId) -> StreamEntry {
    let delivery = s.map.get("delivery").and_then(|v| redis::from_redis_value_ref::<String>(v).ok());
    (s.id, delivery)
}

/// A reply value as text, whatever its RESP type.
pub fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::Int(n) => Some(n.to_string()),
        redis::Value::Nil => None,
        other => redis::from_redis_value_ref::<String>(other).ok(),
    }
}

/// `ms-seq` as numbers.
pub fn parse_id(s: &str) -> Option<EntryId> {
    let (ms, seq) = s.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// The id as Redis writes it.
pub(crate) fn format_id(id: EntryId) -> String {
    format!("{}-{}", id.0, id.1)
}

/// One `XREADGROUP ... COUNT count BLOCK block_ms STREAMS stream >` as `consumer` of
/// `group`: the new entries. A stream or group that vanished (a Redis restarted without
/// persistence) is made again and read next time (no entries now).
pub(crate) async fn read_new(
    conn: &mut impl ConnectionLike,
    (stream, group, consumer): (&str, &str, &str),
    count: usize,
    block_ms: u64,
) -> anyhow::Result<Vec<StreamEntry>> {
    let reply: redis::RedisResult<redis::streams::StreamReadReply> = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(block_ms)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(conn)
        .await;
    match reply {
        Err(e) if e.code() == Some("NOGROUP") => {
            super::ensure_group(conn, stream, group).await?;
            Ok(Vec::new())
        }
        other => Ok(other?.keys.into_iter().flat_map(|k| k.ids).map(entry_of).collect()),
    }
}

/// Acknowledges `entries` of `stream` for `group` (nothing when there are none).
pub(crate) async fn ack(
    conn: &mut impl ConnectionLike,
    stream: &str,
    group: &str,
    entries: &[String],
) -> anyhow::Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let _: u64 = redis::cmd("XACK").arg(stream).arg(group).arg(entries).query_async(conn).await?;
    Ok(())
}

/// What one `XAUTOCLAIM` took over.
pub(crate) struct TakenOver {
    pub entries: Vec<StreamEntry>,
    /// Where the next call goes on from (`0-0`: the pending list was scanned to its end).
    pub next: String,
    /// Pending entries that had been deleted from the stream (Redis 7 drops them).
    pub deleted: usize,
}

/// One `XAUTOCLAIM stream group consumer min_idle_ms from COUNT count`: up to `count`
/// pending entries idle at least `min_idle_ms`, now `consumer`'s.
pub(crate) async fn take_over_idle(
    conn: &mut impl ConnectionLike,
    (stream, group, consumer): (&str, &str, &str),
    min_idle_ms: u64,
    from: &str,
    count: usize,
) -> anyhow::Result<TakenOver> {
    let reply: redis::streams::StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
        .arg(stream)
        .arg(group)
        .arg(consumer)
        .arg(min_idle_ms)
        .arg(from)
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    Ok(TakenOver {
        entries: reply.claimed.into_iter().map(entry_of).collect(),
        next: reply.next_stream_id,
        deleted: reply.deleted_ids.len(),
    })
}

/// The id of the oldest entry `group` has read and not acknowledged on `stream`, if any.
pub(crate) async fn oldest_pending(
    conn: &mut impl ConnectionLike,
    stream: &str,
    group: &str,
) -> anyhow::Result<Option<EntryId>> {
    // Summary form: [count, smallest id, greatest id, consumers].
    let summary: Vec<redis::Value> = redis::cmd("XPENDING").arg(stream).arg(group).query_async(conn).await?;
    Ok(summary.get(1).and_then(text).and_then(|s| parse_id(&s)))
}

/// Deletes the entries of `stream` older than `keep_from`.
pub(crate) async fn trim_before(
    conn: &mut impl ConnectionLike,
    stream: &str,
    keep_from: EntryId,
) -> anyhow::Result<()> {
    let _: u64 = redis::cmd("XTRIM").arg(stream).arg("MINID").arg(format_id(keep_from)).query_async(conn).await?;
    Ok(())
}

/// One consumer of a group, as `XINFO CONSUMERS` tells it.
pub(crate) struct ConsumerInfo {
    pub name: String,
    pub pending: u64,
    pub idle_ms: u64,
}

/// The consumers of `group` on `stream` (one without a name, pending count or idle time
/// is left out).
pub(crate) async fn consumers(
    conn: &mut impl ConnectionLike,
    stream: &str,
    group: &str,
) -> anyhow::Result<Vec<ConsumerInfo>> {
    let consumers: Vec<HashMap<String, redis::Value>> =
        redis::cmd("XINFO").arg("CONSUMERS").arg(stream).arg(group).query_async(conn).await?;
    Ok(consumers
        .iter()
        .filter_map(|c| {
            let get = |name: &str| c.get(name).and_then(text);
            Some(ConsumerInfo {
                name: get("name")?,
                pending: get("pending")?.parse().ok()?,
                idle_ms: get("idle")?.parse().ok()?,
            })
        })
        .collect())
}

/// Up to `count` entries of `stream` added after `after` (`None`: from the start) and no
/// later than `until_ms`.
pub(crate) async fn range_after(
    conn: &mut impl ConnectionLike,
    stream: &str,
    after: Option<EntryId>,
    until_ms: u64,
    count: usize,
) -> anyhow::Result<Vec<StreamEntry>> {
    let from = match after {
        Some(id) => format!("({}", format_id(id)),
        None => "-".to_string(),
    };
    let reply: redis::streams::StreamRangeReply =
        redis::cmd("XRANGE").arg(stream).arg(from).arg(until_ms).arg("COUNT").arg(count).query_async(conn).await?;
    Ok(reply.ids.into_iter().map(entry_of).collect())
}

/// Up to `count` entries `group` has pending on `stream` idle at least `min_idle_ms`,
/// read back from the stream (an entry deleted since is left out).
pub(crate) async fn idle_pending(
    conn: &mut impl ConnectionLike,
    (stream, group): (&str, &str),
    min_idle_ms: u64,
    count: usize,
) -> anyhow::Result<Vec<StreamEntry>> {
    // Extended form: [id, consumer, idle ms, deliveries] per entry.
    let idle: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg("IDLE")
        .arg(min_idle_ms)
        .arg("-")
        .arg("+")
        .arg(count)
        .query_async(conn)
        .await?;
    if idle.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for (id, ..) in &idle {
        pipe.cmd("XRANGE").arg(stream).arg(id).arg(id);
    }
    let entries: Vec<redis::streams::StreamRangeReply> = pipe.query_async(conn).await?;
    Ok(entries.into_iter().filter_map(|e| e.ids.into_iter().next().map(entry_of)).collect())
}
