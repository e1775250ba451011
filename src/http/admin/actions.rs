//! What an operator can do from the admin pages: retry a failed delivery, retry
//! every failed delivery of a campaign period, or of one error name (in a period or
//! in all), lift a suppression. Each is a link to a confirmation page (GET, changes
//! nothing; a bulk retry says how many it takes and what they failed with), whose form
//! POSTs to `/admin/act` with the session's form token, which answers with a redirect
//! back to what it touched (the delivery, the period); each is logged (operation, what it touched, the
//! admin token's name, never the token) and counted
//! (`mailstream_admin_actions_total`). Deliveries whose outcome is unknown are
//! retried from the command line only, after a look in Resend (`dead-letters
//! retry --allow-unknown`).

use hyper::StatusCode;
use minijinja::context;

use super::pages::{page, value};
use super::session::redirect;
use crate::audience::suppression::{self, Act};
use crate::http::server::HttpResponse;
use crate::model::outcome::{DeliveryState, Requeue};
use crate::ops::dead_letters::{self, Failing};
use crate::send::ctx::Ctx;
use crate::store::Store;
use crate::store::scripts::Suppressed;

/// An error a retry never helps: the application said 410, its event is not asked again.
const NOT_RETRIED: &str = "app_gone";

/// One operation, as its link and form name it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    Retry {
        id: String,
    },
    RetryPeriod {
        campaign: String,
        period: String,
    },
    /// Every failed delivery of one error name: of one campaign period, or of all.
    RetryReason {
        error: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        campaign: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        period: Option<String>,
    },
    Lift {
        hash: String,
    },
}

impl Op {
    fn parse(pairs: &[(String, String)]) -> anyhow::Result<Op> {
        let maybe = |k: &str| {
            pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.trim().to_string()).filter(|v| !v.is_empty())
        };
        let get = |k: &str| maybe(k).ok_or_else(|| anyhow::anyhow!("{k}: missing"));
        Ok(match get("op")?.as_str() {
            "retry" => Op::Retry { id: get("id")? },
            "retry_period" => Op::RetryPeriod { campaign: get("campaign")?, period: get("period")? },
            "retry_reason" => {
                let (campaign, period) = (maybe("campaign"), maybe("period"));
                anyhow::ensure!(campaign.is_some() == period.is_some(), "a campaign and a period, or neither");
                Op::RetryReason { error: get("error")?, campaign, period }
            }
            "lift" => Op::Lift { hash: get("hash")? },
            other => anyhow::bail!("no operation {other:?}"),
        })
    }

    /// The `operation` label.
    fn name(&self) -> &'static str {
        match self {
            Op::Retry { .. } => "retry",
            Op::RetryPeriod { .. } => "retry_period",
            Op::RetryReason { .. } => "retry_reason",
            Op::Lift { .. } => "lift",
        }
    }

    /// The campaign period it is limited to, if any.
    fn period(&self) -> Option<(&str, &str)> {
        match self {
            Op::RetryPeriod { campaign, period } => Some((campaign, period)),
            Op::RetryReason { campaign: Some(c), period: Some(p), .. } => Some((c, p)),
            _ => None,
        }
    }

    /// What it touches, for the log and the pages (ids and hashes, never an address).
    fn target(&self) -> String {
        match self {
            Op::Retry { id } => id.clone(),
            Op::RetryPeriod { campaign, period } => format!("{campaign} {period}"),
            Op::RetryReason { error, .. } => match self.period() {
                Some((c, p)) => format!("{error} in {c} {p}"),
                None => error.clone(),
            },
            Op::Lift { hash } => hash.clone(),
        }
    }

    /// The failed deliveries a bulk retry takes (none for another operation).
    async fn failed(&self, store: &Store) -> anyhow::Result<Vec<Failing>> {
        let reason = match self {
            Op::RetryPeriod { .. } => None,
            Op::RetryReason { error, .. } => Some(error),
            Op::Retry { .. } | Op::Lift { .. } => return Ok(Vec::new()),
        };
        let mut failing = dead_letters::failing(store, self.period()).await?;
        failing.retain(|f| f.status == "failed" && f.error != NOT_RETRIED && reason.is_none_or(|r| *r == f.error));
        Ok(failing)
    }

    /// What confirming it does; `failed`: what a bulk retry would take now.
    fn describe(&self, failed: &[Failing]) -> String {
        let of = self.period().map(|(c, p)| format!(" of {c} {p}")).unwrap_or_default();
        match self {
            Op::Retry { id } => format!(
                "Retry delivery {id}: if it failed, it becomes pending again with its attempts reset, and is sent \
                 once more with a new request."
            ),
            Op::RetryPeriod { .. } | Op::RetryReason { .. } if failed.is_empty() => {
                format!("No failed delivery{of} to retry (outcome-unknown ones are retried from the command line).")
            }
            Op::RetryPeriod { .. } | Op::RetryReason { .. } => {
                let groups = dead_letters::by_reason(failed);
                let why: Vec<String> = groups
                    .iter()
                    .map(|g| match &g.said {
                        Some(said) => format!("{} {} (Resend said: {said})", g.count, g.error),
                        None => format!("{} {}", g.count, g.error),
                    })
                    .collect();
                format!(
                    "Retry {n} failed deliver{ies}{of}: {why}. Each becomes pending again and is sent once more. \
                     Fix what made them fail first (an address, the sender's domain), or they fail again.",
                    n = failed.len(),
                    ies = if failed.len() == 1 { "y" } else { "ies" },
                    why = why.join("; "),
                )
            }
            Op::Lift { hash } => format!(
                "Lift the suppression of address {hash}: mail may reach it again. Its subscribers stay \
                 unsubscribed until they subscribe again."
            ),
        }
    }

    /// Where the operator lands after it: the delivery, the period, or the list it came from.
    fn back(&self) -> String {
        let query = |pairs: &[(&str, &str)]| {
            form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs.iter().copied()).finish()
        };
        match (self, self.period()) {
            (Op::Retry { id }, _) => {
                format!("/admin/deliveries/{}", form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>())
            }
            (_, Some((campaign, period))) => {
                format!("/admin/period?{}", query(&[("campaign", campaign), ("period", period)]))
            }
            (Op::Lift { .. }, _) => "/admin/suppressions".into(),
            _ => "/admin/overview".into(),
        }
    }
}

/// What the page an action led back to says of it (`acted`, `done`, `refused` and, for
/// one delivery refused, `state`, in its query); numbers and fixed words only, so a
/// link cannot make a page say something else.
#[derive(Debug, Default, serde::Serialize)]
pub(super) struct Acted {
    what: &'static str,
    done: u64,
    refused: u64,
    why: Option<String>,
}

/// The action a query reports, if it reports one.
pub(super) fn acted(query: &str) -> Option<Acted> {
    let mut a = Acted::default();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "acted" => {
                a.what = match v.as_ref() {
                    "retry" => "Retry",
                    "retry_period" => "Retry of the period's failed deliveries",
                    "retry_reason" => "Retry by reason",
                    "lift" => "Lift",
                    _ => return None,
                }
            }
            "done" => a.done = v.parse().ok()?,
            "refused" => a.refused = v.parse().ok()?,
            "why" if v == "missing" => a.why = Some("no such delivery".into()),
            "why" if v == "files_gone" => a.why = Some(Requeue::FilesGone.to_string()),
            "why" => a.why = Some(Requeue::Refused(DeliveryState::parse(&v)).to_string()),
            _ => {}
        }
    }
    (!a.what.is_empty()).then_some(a)
}

/// Every suppression, newest first, each with a link to lift it.
pub(super) async fn suppressions_page(store: &Store, query: &str) -> anyhow::Result<HttpResponse> {
    let mut entries = suppression::list(store, None).await?;
    entries.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
    let rows: Vec<_> = entries
        .iter()
        .map(
            |e| serde_json::json!({ "hash": e.address_hash, "reason": e.reason, "source": e.source, "at_ms": e.at_ms }),
        )
        .collect();
    let acted = acted(query);
    let context = context! { title => "Suppressions", signed_in => true, rows => value(&rows), acted => value(&acted) };
    Ok(page(StatusCode::OK, "suppressions.html", context))
}

/// The confirmation step: what the operation will do (for a bulk retry: how many, and
/// what they failed with), and a form that does it.
pub(super) async fn confirm_page(store: &Store, query: &str, csrf: &str) -> anyhow::Result<HttpResponse> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let op = Op::parse(&pairs)?;
    let failed = op.failed(store).await?;
    let context = context! {
        title => "Confirm", signed_in => true, op => value(&op), what => op.describe(&failed), csrf, back => op.back()
    };
    Ok(page(StatusCode::OK, "confirm.html", context))
}

/// Does a confirmed operation; logs and counts it; sends the operator back to what it
/// touched (Post/Redirect/Get: a reload does not post again).
pub(super) async fn act(ctx: &Ctx, admin: &str, form: &[(String, String)]) -> anyhow::Result<HttpResponse> {
    let op = Op::parse(form)?;
    let store = &ctx.store;
    // What became of each id or hash, and how many were done.
    let (results, done): (Vec<(String, String)>, u64) = match &op {
        Op::Retry { id } => requeue(store, std::slice::from_ref(id), admin).await?,
        Op::RetryPeriod { .. } | Op::RetryReason { .. } => {
            let ids: Vec<String> = op.failed(store).await?.into_iter().map(|f| f.delivery).collect();
            requeue(store, &ids, admin).await?
        }
        Op::Lift { hash } => {
            let address = store.keys.address_of_hash(hash).ok_or_else(|| anyhow::anyhow!("not an address hash"))?;
            let state = suppression::apply_to(store, &ctx.config, address, Act::Lift, None).await?;
            let removed = state == Suppressed::Removed;
            let said = if removed { "removed" } else { "not_suppressed" };
            (vec![(hash.clone(), said.to_string())], u64::from(removed))
        }
    };
    let refused = results.len() as u64 - done;
    ctx.metrics.admin_action(op.name(), "done", done);
    ctx.metrics.admin_action(op.name(), "refused", refused);
    tracing::info!(operation = op.name(), target = %op.target(), admin, done, refused, "admin action");
    let mut flash = form_urlencoded::Serializer::new(String::new());
    flash.append_pair("acted", op.name()).append_pair("done", &done.to_string());
    flash.append_pair("refused", &refused.to_string());
    if let (Op::Retry { .. }, [(_, said)]) = (&op, results.as_slice())
        && said != "requeued"
    {
        flash.append_pair("why", said);
    }
    let back = op.back();
    let join = if back.contains('?') { '&' } else { '?' };
    Ok(redirect(&format!("{back}{join}{}", flash.finish()), None))
}

/// Requeues failed deliveries (never outcome-unknown ones): each id's result (a word:
/// `requeued`, `missing`, `files_gone` or the state that refused it), and how many were
/// requeued; `admin` (the token's name) is kept in each one's history.
async fn requeue(store: &Store, ids: &[String], admin: &str) -> anyhow::Result<(Vec<(String, String)>, u64)> {
    let results = crate::ops::dead_letters::retry_by(store, ids, false, &format!("admin {admin}")).await?;
    let done = results.iter().filter(|(_, r)| *r == Requeue::Requeued).count() as u64;
    let word = |r: Requeue| match r {
        Requeue::Requeued => "requeued".to_string(),
        Requeue::Missing => "missing".into(),
        Requeue::FilesGone => "files_gone".into(),
        Requeue::Refused(state) => state.as_str().to_string(),
    };
    Ok((results.into_iter().map(|(id, r)| (id, word(r))).collect(), done))
}
