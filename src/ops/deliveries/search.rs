//! Search: a subscriber id or an address finds the deliveries addressed to it and its
//! suppression. An address is looked up by its salted hash, as suppressions are, never in
//! the clear: its subscribers come from the address index of its home partition
//! (`addr:<hash>`, kept by `subscribe`), the transactional deliveries sent to it inline from
//! each partition's `by_address` index (ingest.lua). A subscriber's deliveries are listed as
//! the delivery log lists them (`Filter::subscriber`): the first `limit`, and whether there
//! are more.
//!
//! Raw Redis here: the two indexes' read-only lookups and a subscriber's address, for an
//! operator's page, never the send path.

use serde::Serialize;

use super::{DeliveryRow, Filter, Span, read_rows};
use crate::audience::suppression::{self, SuppressionEntry};
use crate::model::BadValue;
use crate::model::work::DeliveryRef;
use crate::store::Store;
use crate::store::keys::Address;

/// What a search is for: an address (as its hash) or a subscriber id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    Address(Address),
    Subscriber(String),
}

impl Query {
    /// `text` as typed: an address (it has an `@`), an address hash (32 hex digits, as
    /// pages and logs show it), or a subscriber id.
    pub fn parse(store: &Store, text: &str) -> anyhow::Result<Query> {
        let text = text.trim();
        if text.is_empty() {
            return Err(BadValue("a subscriber id or an address".into()).into());
        }
        Ok(if text.contains('@') {
            Query::Address(store.keys.address(text))
        } else if let Some(a) = store.keys.address_of_hash(text) {
            Query::Address(a)
        } else {
            Query::Subscriber(text.to_string())
        })
    }
}

/// What a search found.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    /// The address's hash (for a subscriber, its address's now; none without one).
    pub address_hash: Option<String>,
    /// The subscribers of that address, or the one asked for.
    pub subscribers: Vec<String>,
    /// The address's suppression (a subscriber's: of its address now).
    pub suppression: Option<SuppressionEntry>,
    /// Their deliveries that keep a record or a compact entry, newest first where the log
    /// knows when they settled.
    pub deliveries: Vec<DeliveryRow>,
    /// More deliveries matched than were read: the delivery log, filtered by subscriber,
    /// lists them all.
    pub more: bool,
}

/// Finds `query`'s deliveries (at most `limit` per subscriber and per partition's index)
/// and its suppression.
pub async fn search(store: &Store, query: &Query, limit: usize) -> anyhow::Result<Found> {
    let keys = &store.keys;
    let mut conn = store.conn().await?;
    let (address, subscribers) = match query {
        Query::Address(a) => {
            let mut ids: Vec<String> = redis::cmd("SMEMBERS").arg(keys.address_index(a)).query_async(&mut conn).await?;
            ids.sort();
            (Some(a.clone()), ids)
        }
        Query::Subscriber(id) => {
            let p = keys.partition_of(id);
            let email: Option<String> =
                redis::cmd("HGET").arg(keys.subscriber(p, id)).arg("email").query_async(&mut conn).await?;
            (email.map(|e| keys.address(&e)), vec![id.clone()])
        }
    };
    let suppression = match &address {
        Some(a) => suppression::of_address(store, a).await?,
        None => None,
    };
    let (mut deliveries, mut more) = (Vec::new(), false);
    for s in &subscribers {
        let filter = Filter { subscriber: Some(s.clone()), limit, ..Filter::default() };
        let page = super::page(store, &filter, None).await?;
        more |= page.next.is_some();
        deliveries.extend(page.rows);
    }
    if let Query::Address(a) = query {
        // Every member `<hash>:<id>` of each partition's index, in one round trip: from
        // `<hash>:` up to `<hash>;` (';' follows ':').
        let (from, to) = (format!("[{}:", a.hash), format!("({};", a.hash));
        let cmds: Vec<redis::Cmd> = (0..keys.partitions())
            .map(|p| {
                let mut cmd = redis::cmd("ZRANGEBYLEX");
                cmd.arg(keys.by_address(p)).arg(&from).arg(&to).arg("LIMIT").arg(0).arg(limit + 1);
                cmd
            })
            .collect();
        let found: Vec<Vec<String>> = conn.each(&cmds).await?;
        for (p, members) in (0..keys.partitions()).zip(found) {
            more |= members.len() > limit;
            let refs: Vec<DeliveryRef> =
                members.iter().take(limit).filter_map(|m| DeliveryRef::parse(m.split_once(':')?.1)).collect();
            let rows = read_rows(&mut conn, store, p, refs, &Filter::default(), Span::NONE).await?;
            for row in rows.into_iter().flatten() {
                // A transactional delivery to a subscriber may be listed already.
                if !deliveries.iter().any(|r: &DeliveryRow| r.id == row.id) {
                    deliveries.push(row);
                }
            }
        }
    }
    Ok(Found { address_hash: address.map(|a| a.hash), subscribers, suppression, deliveries, more })
}
