//! The team-wide quota pause (one key per partition) and idle consumers.

use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::{SCRIPTS, flag};
use crate::db::keys::Keys;
use crate::work::Lane;

/// Pauses sending in one partition for `ms` (only ever lengthening a pause); true if set or lengthened.
pub async fn pause(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    reason: &str,
    ms: u64,
) -> RedisResult<bool> {
    let set: i64 = SCRIPTS.pause.key(keys.paused(partition)).arg(reason).arg(ms).invoke_async(conn).await?;
    flag("pause.lua", set)
}

/// Removes `consumer` from the group of partition `p` if it has nothing pending and has
/// been idle longer than `idle_ms`; true if it was removed.
pub async fn forget_consumer(
    conn: &mut impl ConnectionLike,
    keys: &Keys,
    partition: u16,
    lane: Lane,
    group: &str,
    consumer: &str,
    idle_ms: u64,
) -> RedisResult<bool> {
    let stream = keys.lane_stream(partition, lane);
    let removed: i64 = SCRIPTS.forget.key(stream).arg(group).arg(consumer).arg(idle_ms).invoke_async(conn).await?;
    flag("forget.lua", removed)
}
