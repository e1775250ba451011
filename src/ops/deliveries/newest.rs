//! Newest first: a k-way merge of the partitions' recent settlements (`recent`: sorted
//! sets of delivery ids scored by settlement time, read from the top, ties by id), a
//! chunk at a time. Campaign, period and subscriber filters are checked on the ids;
//! statuses and `since` on the records, as the scan does.
//!
//! Raw Redis here: the listing's read-only walk of the settled-history index, newest first.

use std::collections::VecDeque;

use super::{DeliveryRow, Filter, Span, read_rows};
use crate::model::work::DeliveryRef;
use crate::store::keys::RECENT_KEEP;
use crate::store::{Conn, Store};

/// Ids read from one partition's index per step, and most records read per step.
const CHUNK: usize = 200;

/// The statuses a settled delivery can have: a filter on others only skips the index.
const SETTLED: [&str; 5] = ["sent", "skipped", "failed", "outcome_unknown", "unknown"];

/// The oldest settlement time every partition's index still covers: the newest of the
/// oldest entries of the indexes that were trimmed to [`RECENT_KEEP`] (one that never
/// was holds every settlement of its partition within the retention). At and above it
/// the indexes hold every settlement, so the newest-first part is complete there.
/// `i64::MAX` when the filter wants no settled delivery.
pub(super) async fn floor(conn: &mut Conn, store: &Store, partitions: &[u16], filter: &Filter) -> anyhow::Result<i64> {
    if !filter.statuses.is_empty() && !filter.statuses.iter().any(|s| SETTLED.contains(&s.as_str())) {
        return Ok(i64::MAX);
    }
    let mut cmds = Vec::new();
    for &p in partitions {
        cmds.push(redis::cmd("ZCARD").arg(store.keys.recent(p)).clone());
        cmds.push(redis::cmd("ZRANGE").arg(store.keys.recent(p)).arg(0).arg(0).arg("WITHSCORES").clone());
    }
    let replies: Vec<redis::Value> = conn.each(&cmds).await?;
    let mut floor = 0;
    for pair in replies.chunks(2) {
        let held: usize = redis::from_redis_value_ref(&pair[0])?;
        let oldest: Vec<(String, f64)> = redis::from_redis_value_ref(&pair[1])?;
        if let (true, Some((_, ms))) = (held >= RECENT_KEEP, oldest.first()) {
            floor = floor.max(*ms as i64);
        }
    }
    Ok(floor)
}

/// One partition's index, read from the newest down.
struct Feed {
    partition: u16,
    ahead: VecDeque<(i64, String)>,
    offset: usize,
    done: bool,
}

/// Fills `rows` (up to the filter's limit) with settled deliveries before `after`
/// (time, id) and within `span`, newest first. Returns where the page stopped if it
/// filled, `None` once every index is read down to the span's floor.
pub(super) async fn page(
    conn: &mut Conn,
    store: &Store,
    partitions: &[u16],
    filter: &Filter,
    span: Span,
    after: (i64, &str),
    rows: &mut Vec<DeliveryRow>,
) -> anyhow::Result<Option<(i64, String)>> {
    if span == Span::NONE {
        return Ok(None);
    }
    let low = filter.since.map_or(span.floor, |s| s.timestamp_millis().max(span.floor));
    let after = (after.0.min(span.until), after.1);
    let mut feeds: Vec<Feed> =
        partitions.iter().map(|&p| Feed { partition: p, ahead: VecDeque::new(), offset: 0, done: false }).collect();
    loop {
        for f in feeds.iter_mut() {
            while f.ahead.is_empty() && !f.done {
                refill(conn, store, f, filter, low, after).await?;
            }
        }
        // The next chunk in merged order; stop where a feed runs dry, to refill it first.
        let mut chunk: Vec<(u16, i64, DeliveryRef)> = Vec::new();
        while chunk.len() < CHUNK {
            let Some(f) = feeds.iter_mut().filter(|f| !f.ahead.is_empty()).max_by(|a, b| a.ahead[0].cmp(&b.ahead[0]))
            else {
                break;
            };
            let (ms, id) = f.ahead.pop_front().expect("a feed with entries");
            chunk.push((f.partition, ms, DeliveryRef::parse(&id).expect("refill keeps delivery ids")));
            if f.ahead.is_empty() && !f.done {
                break;
            }
        }
        if chunk.is_empty() {
            return Ok(None);
        }
        // Records a partition at a time (a pipeline stays in one slot), then in order.
        let mut read: Vec<Option<DeliveryRow>> = vec![None; chunk.len()];
        for &p in partitions {
            let at: Vec<usize> = (0..chunk.len()).filter(|&i| chunk[i].0 == p).collect();
            if at.is_empty() {
                continue;
            }
            let refs = at.iter().map(|&i| chunk[i].2.clone()).collect();
            // This part shows what the index holds: nothing counts as shown yet.
            for (i, r) in at.into_iter().zip(read_rows(conn, store, p, refs, filter, Span::NONE).await?) {
                read[i] = r;
            }
        }
        for ((_, ms, d), r) in chunk.into_iter().zip(read) {
            if let Some(r) = r {
                rows.push(r);
                if rows.len() == filter.limit {
                    return Ok(Some((ms, d.id())));
                }
            }
        }
    }
}

/// Reads the next ids of `f`'s index between `low` and `after`, keeping those the
/// filter's campaign, period and subscriber allow.
async fn refill(
    conn: &mut Conn,
    store: &Store,
    f: &mut Feed,
    filter: &Filter,
    low: i64,
    after: (i64, &str),
) -> anyhow::Result<()> {
    // `after` is never above the span's `until` (page() caps it there).
    let got: Vec<(String, f64)> = redis::cmd("ZREVRANGEBYSCORE")
        .arg(store.keys.recent(f.partition))
        .arg(after.0)
        .arg(low)
        .arg("WITHSCORES")
        .arg("LIMIT")
        .arg(f.offset)
        .arg(CHUNK)
        .query_async(conn)
        .await?;
    f.offset += got.len();
    f.done = got.len() < CHUNK;
    let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    f.ahead.extend(got.into_iter().map(|(id, ms)| (ms as i64, id)).filter(|(ms, id)| {
        (*ms, id.as_str()) < after
            && DeliveryRef::parse(id).is_some_and(|d| {
                same(&filter.campaign, &d.campaign)
                    && same(&filter.period, &d.period)
                    && same(&filter.subscriber, &d.subscriber)
            })
    }));
    Ok(())
}
