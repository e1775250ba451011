//! The admin pages on the private listener, for operators in an incident: the
//! overview first (`/admin/overview`, `/admin/api/overview`: each campaign period
//! against the SLO, the pause, the backlog, recent suppressions; `overview.rs`),
//! then the delivery log: `/admin/api/deliveries` (JSON, the same filters as
//! `mailstream deliveries`) and `/admin/deliveries` (filters, pages, one delivery's
//! history). Pages are minijinja templates, auto-escaped (`pages.rs`). Every route
//! needs an admin token (`http.admin_token_file`, `MAILSTREAM_ADMIN_TOKEN` or the
//! credential `admin_token`): `Authorization: Bearer <token>`, or the session cookie
//! that signing in at `/admin/login` sets (an HMAC of the token, never the token).
//! Without a token configured the log is off (404).

mod actions;
mod overview;
mod pages;

use hmac::{Hmac, Mac};
use hyper::{Method, StatusCode};
use minijinja::context;
use sha2::Sha256;

use self::pages::{page, value};
use crate::config::Secret;
use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::ops::deliveries::{self, Filter, STATUSES};
use crate::send::ctx::Ctx;
use crate::store::Store;

const COOKIE: &str = "mailstream_admin";

/// How a request proved itself: a form sent with a cookie must also carry the page's token.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Bearer,
    Cookie,
}
const PAGE_SIZE: usize = 50;

/// One admin token and the name the log of admin actions gives it.
pub(crate) struct Credential {
    name: String,
    token: Secret,
}

/// The tokens that open the admin pages.
pub(crate) struct Admin {
    credentials: Vec<Credential>,
}

impl Admin {
    /// `NAME:TOKEN` names a token; a bare token is named by its position (`#1`, …).
    pub fn new(tokens: &[Secret]) -> Admin {
        let credentials = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| match t.expose().split_once(':') {
                Some((name, token)) => Credential { name: name.to_string(), token: Secret::new(token) },
                None => Credential { name: format!("#{}", i + 1), token: t.clone() },
            })
            .collect();
        Admin { credentials }
    }

    fn mac(token: &[u8], purpose: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes any key length");
        mac.update(purpose);
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The session cookie's value for a token.
    fn session(c: &Credential) -> String {
        Self::mac(c.token.expose().as_bytes(), b"mailstream admin session")
    }

    /// The token a signed-in page's forms carry, bound to the session: another site can
    /// make the browser send the cookie, not read this.
    fn csrf(c: &Credential) -> String {
        Self::mac(c.token.expose().as_bytes(), b"mailstream admin form")
    }

    /// Who the request comes from: a valid token (`Bearer`, no cookie involved) or a
    /// session cookie, compared in constant time.
    fn who(&self, req: &HttpRequest) -> Option<(&Credential, Via)> {
        let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        let bearer = server::bearer(req);
        let cookie = header(hyper::header::COOKIE)
            .split(';')
            .filter_map(|c| c.trim().strip_prefix(COOKIE).and_then(|c| c.strip_prefix('=')))
            .next()
            .unwrap_or("");
        self.credentials.iter().find_map(|c| {
            if server::same_secret(bearer, c.token.expose()) {
                Some((c, Via::Bearer))
            } else {
                server::same_secret(cookie, &Self::session(c)).then_some((c, Via::Cookie))
            }
        })
    }

    /// Answers a request under `/admin`.
    pub(crate) async fn route(&self, ctx: &Ctx, req: HttpRequest) -> HttpResponse {
        let (store, config) = (&ctx.store, &ctx.config);
        if self.credentials.is_empty() {
            return server::text(
                StatusCode::NOT_FOUND,
                "the delivery log is off: set MAILSTREAM_ADMIN_TOKEN, http.admin_token_file or the admin_token credential\n",
            );
        }
        let path = req.uri().path().to_string();
        if path == "/admin/login" {
            return self.login(&req);
        }
        let Some((who, via)) = self.who(&req) else {
            return if path.starts_with("/admin/api/") {
                server::json(StatusCode::UNAUTHORIZED, &serde_json::json!({"error": "a valid admin token is needed"}))
            } else {
                login_page(StatusCode::UNAUTHORIZED, "Sign in with an admin token.")
            };
        };
        let csrf = Self::csrf(who);
        let query = req.uri().query().unwrap_or("").to_string();
        let result = match path.as_str() {
            "/admin" | "/admin/" => return redirect("/admin/overview"),
            "/admin/api/overview" => overview::read(store, config).await.map(|o| json(&o)),
            "/admin/overview" => overview::read(store, config).await.map(|o| {
                page(
                    StatusCode::OK,
                    "overview.html",
                    context! { title => "Overview", signed_in => true, o => value(&o) },
                )
            }),
            "/admin/suppressions" => actions::suppressions_page(store).await,
            "/admin/confirm" => actions::confirm_page(&query, &csrf),
            "/admin/act" if req.method() == Method::POST => {
                let form: Vec<(String, String)> = form_urlencoded::parse(req.body()).into_owned().collect();
                let sent = form.iter().find(|(k, _)| k == "csrf").map(|(_, v)| v.as_str()).unwrap_or("");
                if via == Via::Cookie && !server::same_secret(sent, &csrf) {
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
                (Some(id), _) => one(store, id).await.map(|d| d.map_or_else(not_found, |d| json(&d))),
                (_, Some(id)) => one(store, id).await.map(|d| d.map_or_else(not_found, |d| detail_page(&d))),
                _ => Ok(not_found()),
            },
        };
        result.unwrap_or_else(|e| {
            let message = format!("{e:#}");
            if path.starts_with("/admin/api/") {
                server::json(StatusCode::BAD_REQUEST, &serde_json::json!({"error": message}))
            } else {
                page(StatusCode::BAD_REQUEST, "error.html", context! { title => "Error", signed_in => true, message })
            }
        })
    }

    fn login(&self, req: &HttpRequest) -> HttpResponse {
        if req.method() != Method::POST {
            return login_page(StatusCode::OK, "Sign in with an admin token.");
        }
        let token = form_urlencoded::parse(req.body()).find(|(k, _)| k == "token").map(|(_, v)| v.to_string());
        let known = token.and_then(|p| self.credentials.iter().find(|c| server::same_secret(&p, c.token.expose())));
        match known {
            Some(c) => {
                let mut response = redirect("/admin/overview");
                let cookie = format!("{COOKIE}={}; Path=/admin; HttpOnly; SameSite=Strict", Self::session(c));
                response.headers_mut().insert(hyper::header::SET_COOKIE, cookie.parse().expect("a cookie header"));
                response
            }
            None => login_page(StatusCode::UNAUTHORIZED, "That token is not valid."),
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> HttpResponse {
    server::json(StatusCode::OK, &serde_json::to_value(value).expect("serializable"))
}

fn not_found() -> HttpResponse {
    server::text(StatusCode::NOT_FOUND, "no such delivery (never enqueued, or expired after the retention)\n")
}

fn redirect(to: &str) -> HttpResponse {
    let mut response = server::text(StatusCode::SEE_OTHER, "");
    response.headers_mut().insert(hyper::header::LOCATION, to.parse().expect("a location"));
    response
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

async fn one(store: &Store, id: &str) -> anyhow::Result<Option<deliveries::Detail>> {
    let id = percent_decode(id);
    deliveries::get(store, &id).await
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

fn detail_page(d: &deliveries::Detail) -> HttpResponse {
    let transactional = d.row.campaign == crate::model::work::TRANSACTIONAL;
    let (title, r) = (d.row.id.clone(), value(&d.row));
    let context = context! { title, signed_in => true, d => value(d), r, transactional };
    page(StatusCode::OK, "delivery.html", context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_named_in_the_log_by_its_prefix_or_its_position() {
        let admin = Admin::new(&[Secret::new("0123456789abcdef0123"), Secret::new("ops-ann:fedcba9876543210fedc")]);
        let names: Vec<&str> = admin.credentials.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["#1", "ops-ann"]);
        assert_eq!(admin.credentials[1].token.expose(), "fedcba9876543210fedc", "the name is not part of the token");
        assert_ne!(Admin::csrf(&admin.credentials[0]), Admin::csrf(&admin.credentials[1]));
        assert_ne!(Admin::csrf(&admin.credentials[0]), Admin::session(&admin.credentials[0]));
    }
}
