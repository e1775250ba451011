//! Past the newest-first part, a partition at a time in Redis's order: the deliveries that
//! keep a record (SCAN over their natural ids), then those settled compactly (the buckets
//! of each period's settled history: `campaign:period` in order, then channel, then bucket).
//!
//! Raw Redis here: the listing's read-only SCAN of records and of each period's settled history.

use super::{DeliveryRow, Filter, ListCursor, Page, read_rows, rows_of};
use crate::model::work::{Channel, DeliveryRef, TRANSACTIONAL};
use crate::store::{Conn, Store, history};

/// Keys SCAN looks at per step.
const SCAN_COUNT: usize = 500;

/// SCAN MATCH treats `*?[]\` specially; a filter value is matched literally.
pub(super) fn glob_literal(s: &str) -> String {
    s.chars().flat_map(|c| if "*?[]\\".contains(c) { vec!['\\', c] } else { vec![c] }).collect()
}

/// Fills `rows` up to the filter's limit from `at` (a `Scan` or `History` cursor, or the
/// start of the first partition's scan).
pub(super) async fn page(
    conn: &mut Conn,
    store: &Store,
    partitions: &[u16],
    filter: &Filter,
    at: ListCursor,
    mut rows: Vec<DeliveryRow>,
) -> anyhow::Result<Page> {
    let (span, first) = match &at {
        ListCursor::Scan { span, partition, .. } | ListCursor::History { span, partition, .. } => (*span, *partition),
        ListCursor::Newest { span, .. } => (*span, partitions[0]),
    };
    for &p in partitions.iter().filter(|&&p| p >= first) {
        let from = if p == first { at.clone() } else { ListCursor::Scan { span, partition: p, scan: 0, skip: 0 } };
        let history_from = match from {
            ListCursor::History { period, channel, bucket, skip, .. } => (period, channel, bucket, skip),
            ListCursor::Scan { scan, skip, .. } => {
                if let Some(next) = records(conn, store, p, filter, span, scan, skip, &mut rows).await? {
                    return Ok(Page { rows, next: Some(next.render()) });
                }
                (String::new(), Channel::Email, 0, 0)
            }
            ListCursor::Newest { .. } => unreachable!("a partition's part starts with a scan"),
        };
        if let Some(next) = settled(conn, store, p, filter, span, history_from, &mut rows).await? {
            return Ok(Page { rows, next: Some(next.render()) });
        }
    }
    Ok(Page { rows, next: None })
}

/// The deliveries of partition `p` that keep a record, by SCAN from `scan` (skipping the
/// first `skip` matches of that step). Returns where the page filled, if it did.
#[allow(clippy::too_many_arguments)] // one partition's scan position, as the cursor holds it
async fn records(
    conn: &mut Conn,
    store: &Store,
    p: u16,
    filter: &Filter,
    span: super::Span,
    mut scan: u64,
    mut skip: usize,
    rows: &mut Vec<DeliveryRow>,
) -> anyhow::Result<Option<ListCursor>> {
    let keys = &store.keys;
    let part = |f: &Option<String>| f.as_deref().map_or("*".to_string(), glob_literal);
    let id_pattern = format!("{}:{}:{}:*", part(&filter.campaign), part(&filter.period), part(&filter.subscriber));
    let pattern = keys.delivery(p, &id_pattern);
    loop {
        let cmd = redis::cmd("SCAN").arg(scan).arg("MATCH").arg(&pattern).arg("COUNT").arg(SCAN_COUNT).clone();
        let (next, found): (u64, Vec<String>) = conn.on_node_of(&keys.stream(p), &cmd).await?;
        let refs: Vec<DeliveryRef> =
            found.iter().filter_map(|k| k.split_once(":d:").and_then(|(_, id)| DeliveryRef::parse(id))).collect();
        let matched = read_rows(conn, store, p, refs, filter, span).await?;
        for (i, r) in matched.into_iter().flatten().enumerate().skip(skip) {
            if rows.len() == filter.limit {
                return Ok(Some(ListCursor::Scan { span, partition: p, scan, skip: i }));
            }
            rows.push(r);
        }
        skip = 0;
        if next == 0 {
            return Ok(None);
        }
        scan = next;
    }
}

/// The deliveries of partition `p` settled compactly, from `(period, channel, bucket,
/// skip)` on. Returns where the page filled, if it did.
async fn settled(
    conn: &mut Conn,
    store: &Store,
    p: u16,
    filter: &Filter,
    span: super::Span,
    from: (String, Channel, u32, usize),
    rows: &mut Vec<DeliveryRow>,
) -> anyhow::Result<Option<ListCursor>> {
    // Only sent and skipped deliveries are kept compactly.
    if !filter.statuses.is_empty() && !filter.statuses.iter().any(|s| s == "sent" || s == "skipped") {
        return Ok(None);
    }
    let keys = &store.keys;
    let listed: Vec<String> = redis::cmd("ZRANGE").arg(keys.periods(p)).arg(0).arg(-1).query_async(conn).await?;
    let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    let mut periods: Vec<(String, String)> = listed
        .iter()
        .filter_map(|m| m.split_once(':'))
        .filter(|(c, period)| same(&filter.campaign, c) && same(&filter.period, period))
        .map(|(c, period)| (c.to_string(), period.to_string()))
        .collect();
    periods.sort();
    let (from_period, from_channel, from_bucket, mut skip) = from;
    for (campaign, period) in periods {
        let name = format!("{campaign}:{period}");
        if name < from_period {
            continue;
        }
        for channel in Channel::ALL {
            let here = (name.as_str(), channel as usize);
            if here < (from_period.as_str(), from_channel as usize) {
                continue;
            }
            let Some(n) = history::buckets(conn, keys, p, &campaign, &period, channel).await? else { continue };
            let start = if here == (from_period.as_str(), from_channel as usize) { from_bucket } else { 0 };
            // A subscriber's deliveries of a period share a bucket (a receipt's, its key's).
            let only = filter.subscriber.as_deref().filter(|_| campaign != TRANSACTIONAL);
            let buckets: Vec<u32> = match only {
                Some(sub) => vec![(history::home_hash(sub) % u64::from(n)) as u32],
                None => (0..n).collect(),
            };
            for bucket in buckets.into_iter().filter(|&b| b >= start) {
                let found = history::bucket(conn, keys, p, &campaign, &period, channel, bucket).await?;
                let items: Vec<_> = found
                    .into_iter()
                    .filter(|(d, _)| same(&filter.subscriber, &d.subscriber))
                    .map(|(d, e)| (d, e.fields()))
                    .collect();
                let matched = rows_of(conn, store, p, items, filter, span).await?;
                for (i, r) in matched.into_iter().flatten().enumerate().skip(skip) {
                    if rows.len() == filter.limit {
                        let period = name.clone();
                        return Ok(Some(ListCursor::History { span, partition: p, period, channel, bucket, skip: i }));
                    }
                    rows.push(r);
                }
                skip = 0;
            }
        }
    }
    Ok(None)
}
