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
pub(crate) type Entry = (String, Option<String>);

/// The delivery id of a stream entry (`delivery <id>`).
pub(crate) fn entry_of(s: redis::streams::StreamId) -> Entry {
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
) -> anyhow::Result<Vec<Entry>> {
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
