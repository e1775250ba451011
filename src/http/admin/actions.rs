//! What an operator can do from the admin pages: retry a failed delivery, retry
//! every failed delivery of a campaign period, lift a suppression. Each is a link
//! to a confirmation page (GET, changes nothing), whose form POSTs to `/admin/act`
//! with the session's form token; each is logged (operation, what it touched, the
//! admin token's name, never the token) and counted
//! (`mailstream_admin_actions_total`). Deliveries whose outcome is unknown are
//! retried from the command line only, after a look in Resend (`dead-letters
//! retry --allow-unknown`).

use hyper::StatusCode;
use minijinja::context;

use super::pages::{page, value};
use crate::audience::suppression::{self, Act};
use crate::http::server::HttpResponse;
use crate::model::outcome::Requeue;
use crate::ops::deliveries::{self, Filter};
use crate::send::ctx::Ctx;
use crate::store::Store;
use crate::store::scripts::Suppressed;

/// Failed deliveries a period retry reads per page of the delivery log.
const PAGE: usize = 1000;

/// One operation, as its link and form name it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    Retry { id: String },
    RetryPeriod { campaign: String, period: String },
    Lift { hash: String },
}

impl Op {
    fn parse(pairs: &[(String, String)]) -> anyhow::Result<Op> {
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| anyhow::anyhow!("{k}: missing"))
        };
        Ok(match get("op")?.as_str() {
            "retry" => Op::Retry { id: get("id")? },
            "retry_period" => Op::RetryPeriod { campaign: get("campaign")?, period: get("period")? },
            "lift" => Op::Lift { hash: get("hash")? },
            other => anyhow::bail!("no operation {other:?}"),
        })
    }

    /// The `operation` label.
    fn name(&self) -> &'static str {
        match self {
            Op::Retry { .. } => "retry",
            Op::RetryPeriod { .. } => "retry_period",
            Op::Lift { .. } => "lift",
        }
    }

    /// What it touches, for the log and the pages (ids and hashes, never an address).
    fn target(&self) -> String {
        match self {
            Op::Retry { id } => id.clone(),
            Op::RetryPeriod { campaign, period } => format!("{campaign} {period}"),
            Op::Lift { hash } => hash.clone(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Op::Retry { id } => format!(
                "Retry delivery {id}: if it failed, it becomes pending again with its attempts reset, and is sent \
                 once more with a new request."
            ),
            Op::RetryPeriod { campaign, period } => format!(
                "Retry every failed delivery of {campaign} {period}: each becomes pending again and is sent once \
                 more. Fix what made them fail first (an address, the sender's domain), or they fail again."
            ),
            Op::Lift { hash } => format!(
                "Lift the suppression of address {hash}: mail may reach it again. Its subscribers stay \
                 unsubscribed until they subscribe again."
            ),
        }
    }
}

/// Every suppression, newest first, each with a link to lift it.
pub(super) async fn suppressions_page(store: &Store) -> anyhow::Result<HttpResponse> {
    let mut entries = suppression::list(store, None).await?;
    entries.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
    let rows: Vec<_> = entries
        .iter()
        .map(|e| {
            let at = chrono::DateTime::from_timestamp_millis(e.at_ms as i64).unwrap_or_default();
            serde_json::json!({ "hash": e.address_hash, "reason": e.reason, "source": e.source,
                "at": at.format("%Y-%m-%dT%H:%M:%SZ").to_string() })
        })
        .collect();
    let context = context! { title => "Suppressions", signed_in => true, rows => value(&rows) };
    Ok(page(StatusCode::OK, "suppressions.html", context))
}

/// The confirmation step: what the operation will do, and a form that does it.
pub(super) fn confirm_page(query: &str, csrf: &str) -> anyhow::Result<HttpResponse> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let op = Op::parse(&pairs)?;
    let context = context! { title => "Confirm", signed_in => true, op => value(&op), what => op.describe(), csrf };
    Ok(page(StatusCode::OK, "confirm.html", context))
}

/// Does a confirmed operation; logs and counts it.
pub(super) async fn act(ctx: &Ctx, admin: &str, form: &[(String, String)]) -> anyhow::Result<HttpResponse> {
    let op = Op::parse(form)?;
    let store = &ctx.store;
    // Each id or hash with what became of it, and how many were done.
    let (results, done): (Vec<(String, String)>, u64) = match &op {
        Op::Retry { id } => requeue(store, std::slice::from_ref(id)).await?,
        Op::RetryPeriod { campaign, period } => {
            let mut ids = Vec::new();
            let mut cursor = None;
            let filter = Filter {
                campaign: Some(campaign.clone()),
                period: Some(period.clone()),
                statuses: vec!["failed".into()],
                limit: PAGE,
                ..Default::default()
            };
            loop {
                let page = deliveries::page(store, &filter, cursor.as_deref()).await?;
                // An event the application answered 410 for is not asked again.
                ids.extend(page.rows.into_iter().filter(|r| r.why.as_deref() != Some("app_gone")).map(|r| r.id));
                cursor = page.next;
                if cursor.is_none() {
                    break;
                }
            }
            requeue(store, &ids).await?
        }
        Op::Lift { hash } => {
            let address = store.keys.address_of_hash(hash).ok_or_else(|| anyhow::anyhow!("not an address hash"))?;
            let state = suppression::apply_to(store, &ctx.config, address, Act::Lift, None).await?;
            let removed = state == Suppressed::Removed;
            let said = if removed { "removed" } else { "was not suppressed" };
            (vec![(hash.clone(), said.to_string())], u64::from(removed))
        }
    };
    let refused = results.len() as u64 - done;
    ctx.metrics.admin_action(op.name(), "done", done);
    ctx.metrics.admin_action(op.name(), "refused", refused);
    tracing::info!(operation = op.name(), target = %op.target(), admin, done, refused, "admin action");
    let context = context! {
        title => "Done", signed_in => true, what => op.describe(), done, refused, results => value(&results)
    };
    Ok(page(StatusCode::OK, "done.html", context))
}

/// Requeues failed deliveries (never outcome-unknown ones): each id's result, and
/// how many were requeued.
async fn requeue(store: &Store, ids: &[String]) -> anyhow::Result<(Vec<(String, String)>, u64)> {
    let results = crate::ops::dead_letters::retry(store, ids, false).await?;
    let done = results.iter().filter(|(_, r)| *r == Requeue::Requeued).count() as u64;
    Ok((results.into_iter().map(|(id, r)| (id, r.to_string())).collect(), done))
}
