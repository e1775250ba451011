//! The admin pages on the private listener, for operators in an incident: the
//! overview first (`/admin/overview`, `/admin/api/overview`: each campaign period
//! against the SLO, failures by reason, the pause, the backlog, recent suppressions;
//! `overview.rs`), one campaign period (`/admin/period`: its progress, its failures by
//! reason, the instances reading; `period.rs`), then the delivery log:
//! `/admin/api/deliveries` (JSON, the same filters as `mailstream deliveries`) and
//! `/admin/deliveries` (filters, pages, one delivery's history), and `/admin/search` (a
//! subscriber's or an address's deliveries and suppression; `search.rs`). What an operator can
//! do is in `actions.rs`. Pages are minijinja templates, auto-escaped (`pages.rs`).
//! Every route needs an admin token (`http.admin_token_file`, `MAILSTREAM_ADMIN_TOKEN`
//! or the credential `admin_token`): `Authorization: Bearer <token>`, or a session
//! opened by signing in at `/admin/login` (`session.rs`). Without a token configured
//! the log is off (404).

mod actions;
mod chart;
mod overview;
mod pages;
mod period;
mod search;
mod session;

use hyper::{Method, StatusCode};
use minijinja::context;

use self::pages::{page, value};
use self::session::{Credentials, Via, guard, redirect};
use crate::config::Secret;
use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::ops::deliveries::{self, Filter, STATUSES};
use crate::send::ctx::Ctx;
use crate::store::Store;

const PAGE_SIZE: usize = 50;

/// The tokens that open the admin pages, and the routes behind them.
pub(crate) struct Admin {
    credentials: Credentials,
}

impl Admin {
    /// `NAME:TOKEN` names a token; a bare token is named by its position (`#1`, …).
    pub fn new(tokens: &[Secret]) -> Admin {
        Admin { credentials: Credentials::new(tokens) }
    }

    /// Answers a request under `/admin`, with the headers every admin answer carries.
    pub(crate) async fn route(&self, ctx: &Ctx, req: HttpRequest) -> HttpResponse {
        guard(self.answer(ctx, req).await)
    }

    async fn answer(&self, ctx: &Ctx, req: HttpRequest) -> HttpResponse {
        let (store, config) = (&ctx.store, &ctx.config);
        if self.credentials.is_empty() {
            return server::text(
                StatusCode::NOT_FOUND,
                "the delivery log is off: set MAILSTREAM_ADMIN_TOKEN, http.admin_token_file or the admin_token credential\n",
            );
        }
        let path = req.uri().path().to_string();
        let api = path.starts_with("/admin/api/");
        let failed = |e: anyhow::Error| error(api, StatusCode::SERVICE_UNAVAILABLE, &format!("{e:#}"));
        match path.as_str() {
            "/admin/login" => return self.login(ctx, &req).await.unwrap_or_else(failed),
            "/admin/logout" if req.method() == Method::POST => {
                return session::sign_out(store, &req)
                    .await
                    .map(|cookie| redirect("/admin/login", Some(&cookie)))
                    .unwrap_or_else(failed);
            }
            _ => {}
        }
        let (who, via) = match self.credentials.who(store, &req).await {
            Ok(Some(found)) => found,
            Ok(None) if api => {
                return server::json(
                    StatusCode::UNAUTHORIZED,
                    &serde_json::json!({"error": "a valid admin token is needed"}),
                );
            }
            Ok(None) => return login_page(StatusCode::UNAUTHORIZED, "Sign in with an admin token."),
            Err(e) => return failed(e),
        };
        let csrf = Credentials::form_token(who, &via);
        let query = req.uri().query().unwrap_or("").to_string();
        let result = match path.as_str() {
            "/admin" | "/admin/" => return redirect("/admin/overview", None),
            "/admin/api/overview" => overview::read(store, config).await.map(|o| json(&o)),
            "/admin/overview" => overview::page(store, config, &query).await,
            "/admin/api/period" => period::read(ctx, &query).await.map(|p| json(&p)),
            "/admin/period" => period::page(ctx, &query).await,
            "/admin/suppressions" => actions::suppressions_page(store, &query).await,
            "/admin/api/search" => search::read(store, &query).await.map(|f| json(&f)),
            "/admin/search" => search::page(store, &query).await,
            "/admin/confirm" => actions::confirm_page(store, &query, &csrf).await,
            "/admin/act" if req.method() == Method::POST => {
                let form: Vec<(String, String)> = form_urlencoded::parse(req.body()).into_owned().collect();
                let sent = form.iter().find(|(k, _)| k == "csrf").map(|(_, v)| v.as_str()).unwrap_or("");
                if via != Via::Bearer && !server::same_secret(sent, &csrf) {
                    tracing::warn!(admin = %who.name, "an admin form without its token was refused (forged, or from an old page)");
                    let message =
                        "This form is not from a page of this session (forged, or an old page): nothing was done.";
                    return page(
                        StatusCode::FORBIDDEN,
                        "error.html",
                        context! { title => "Refused", signed_in => true, message },
                    );
                }
                actions::act(ctx, &who.name, &form).await
            }
            "/admin/api/deliveries" => list(store, &query).await.map(|(page, _)| json(&page)),
            "/admin/deliveries" => list(store, &query).await.map(|(page, form)| list_page(&page, &form, &query)),
            p => match (p.strip_prefix("/admin/api/deliveries/"), p.strip_prefix("/admin/deliveries/")) {
                (Some(id), _) => one(ctx, id).await.map(|d| d.map_or_else(not_found, |d| json(&d))),
                (_, Some(id)) => one(ctx, id).await.map(|d| d.map_or_else(not_found, |d| detail_page(&d, &query))),
                _ => Ok(not_found()),
            },
        };
        result.unwrap_or_else(|e| error(api, StatusCode::BAD_REQUEST, &format!("{e:#}")))
    }

    async fn login(&self, ctx: &Ctx, req: &HttpRequest) -> anyhow::Result<HttpResponse> {
        if req.method() != Method::POST {
            return Ok(login_page(StatusCode::OK, "Sign in with an admin token."));
        }
        let token = form_urlencoded::parse(req.body()).find(|(k, _)| k == "token").map(|(_, v)| v.to_string());
        let lasts = ctx.config.http.admin_session();
        match self.credentials.sign_in(&ctx.store, &token.unwrap_or_default(), lasts).await? {
            Some((name, cookie)) => {
                tracing::info!(admin = %name, hours = lasts.as_secs() / 3600, "admin signed in");
                Ok(redirect("/admin/overview", Some(&cookie)))
            }
            None => Ok(login_page(StatusCode::UNAUTHORIZED, "That token is not valid.")),
        }
    }
}

/// An error as an API answer (JSON) or a page.
fn error(api: bool, status: StatusCode, message: &str) -> HttpResponse {
    if api {
        server::json(status, &serde_json::json!({"error": message}))
    } else {
        page(status, "error.html", context! { title => "Error", signed_in => true, message })
    }
}

fn json<T: serde::Serialize>(value: &T) -> HttpResponse {
    server::json(StatusCode::OK, &serde_json::to_value(value).expect("serializable"))
}

fn not_found() -> HttpResponse {
    server::text(StatusCode::NOT_FOUND, "no such delivery (never enqueued, or expired after the retention)\n")
}

/// The filter form as the operator filled it in, shown back on the page.
#[derive(Debug, Default, serde::Serialize)]
struct Form {
    campaign: String,
    period: String,
    subscriber: String,
    since: String,
    statuses: Vec<String>,
    limit: usize,
}

/// The filter a query string asks for (the same names as the CLI's flags).
fn filter(query: &str) -> anyhow::Result<(Filter, Form, Option<String>)> {
    let mut f = Filter { limit: PAGE_SIZE, ..Default::default() };
    let mut form = Form::default();
    let mut cursor = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let v = v.trim().to_string();
        if v.is_empty() {
            continue;
        }
        match k.as_ref() {
            "campaign" => (f.campaign, form.campaign) = (Some(v.clone()), v),
            "period" => (f.period, form.period) = (Some(v.clone()), v),
            "subscriber" => (f.subscriber, form.subscriber) = (Some(v.clone()), v),
            "status" => f.statuses.push(v),
            "since" => (f.since, form.since) = (Some(deliveries::parse_since(&v, chrono::Utc::now())?), v),
            "limit" => f.limit = v.parse::<usize>().map_err(|_| anyhow::anyhow!("limit: a number"))?.clamp(1, 1000),
            "cursor" => cursor = Some(v),
            other => anyhow::bail!("unknown filter {other:?}"),
        }
    }
    form.statuses = f.statuses.clone();
    form.limit = f.limit;
    Ok((f, form, cursor))
}

async fn list(store: &Store, query: &str) -> anyhow::Result<(deliveries::Page, Form)> {
    let (f, form, cursor) = filter(query)?;
    Ok((deliveries::page(store, &f, cursor.as_deref()).await?, form))
}

/// One delivery, with what it waits for if it is not settled.
async fn one(ctx: &Ctx, id: &str) -> anyhow::Result<Option<deliveries::Detail>> {
    let id = percent_decode(id);
    let Some(mut d) = deliveries::get(&ctx.store, &id).await? else { return Ok(None) };
    d.waiting = deliveries::waiting::of(&ctx.store, &ctx.config.delivery, &d).await?;
    Ok(Some(d))
}

fn percent_decode(s: &str) -> String {
    form_urlencoded::parse(format!("x={s}").as_bytes()).next().map(|(_, v)| v.to_string()).unwrap_or_default()
}

fn login_page(status: StatusCode, message: &str) -> HttpResponse {
    page(status, "login.html", context! { title => "Sign in", signed_in => false, message })
}

fn list_page(p: &deliveries::Page, form: &Form, query: &str) -> HttpResponse {
    // The same filters, from where this page ended.
    let next = p.next.as_ref().map(|next| {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form_urlencoded::parse(query.as_bytes()).filter(|(k, _)| k != "cursor"))
            .append_pair("cursor", next)
            .finish()
    });
    let (p, form) = (value(p), value(form));
    let context = context! { title => "Deliveries", signed_in => true, page => p, form, statuses => STATUSES, next };
    page(StatusCode::OK, "deliveries.html", context)
}

fn detail_page(d: &deliveries::Detail, query: &str) -> HttpResponse {
    let transactional = d.row.campaign == crate::model::work::TRANSACTIONAL;
    let (title, r) = (d.row.id.clone(), value(&d.row));
    let acted = actions::acted(query);
    let context = context! { title, signed_in => true, d => value(d), r, transactional, acted => value(&acted) };
    page(StatusCode::OK, "delivery.html", context)
}
