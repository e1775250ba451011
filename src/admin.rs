//! The delivery log on the private listener, for operators: `/admin/api/deliveries`
//! (JSON, the same filters as `mailstream deliveries`) and `/admin/deliveries`
//! (server-rendered HTML: filters, pages, one delivery's history). Every route
//! needs an admin token (`http.admin_token_file`, `MAILSTREAM_ADMIN_TOKEN` or the
//! credential `admin_token`): `Authorization: Bearer <token>`, or the session cookie
//! that signing in at `/admin/login` sets (an HMAC of the token, never the token).
//! Without a token configured the log is off (404).

use std::fmt::Write;

use hmac::{Hmac, Mac};
use hyper::{Method, StatusCode};
use sha2::Sha256;

use crate::config::Secret;
use crate::db::Store;
use crate::deliveries::{self, Filter, STATUSES};
use crate::http::{self, HttpRequest, HttpResponse, escape};

const COOKIE: &str = "mailstream_admin";
const PAGE_SIZE: usize = 50;

/// The tokens that open the log.
pub(crate) struct Admin {
    tokens: Vec<Secret>,
}

impl Admin {
    pub fn new(tokens: &[Secret]) -> Admin {
        Admin { tokens: tokens.to_vec() }
    }

    fn mac(token: &[u8], purpose: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes any key length");
        mac.update(purpose);
        mac
    }

    /// The session cookie's value for a token.
    fn session(token: &Secret) -> String {
        Self::mac(token.expose().as_bytes(), b"mailstream admin session")
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Whether the request carries a valid token or session (compared in constant time).
    fn allowed(&self, req: &HttpRequest) -> bool {
        let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        let bearer = http::bearer(req);
        let cookie = header(hyper::header::COOKIE)
            .split(';')
            .filter_map(|c| c.trim().strip_prefix(COOKIE).and_then(|c| c.strip_prefix('=')))
            .next()
            .unwrap_or("");
        self.tokens
            .iter()
            .any(|t| http::same_secret(bearer, t.expose()) || http::same_secret(cookie, &Self::session(t)))
    }

    /// Answers a request under `/admin`.
    pub(crate) async fn route(&self, store: &Store, req: HttpRequest) -> HttpResponse {
        if self.tokens.is_empty() {
            return http::text(
                StatusCode::NOT_FOUND,
                "the delivery log is off: set MAILSTREAM_ADMIN_TOKEN, http.admin_token_file or the admin_token credential\n",
            );
        }
        let path = req.uri().path().to_string();
        if path == "/admin/login" {
            return self.login(&req);
        }
        if !self.allowed(&req) {
            return if path.starts_with("/admin/api/") {
                http::json(StatusCode::UNAUTHORIZED, &serde_json::json!({"error": "a valid admin token is needed"}))
            } else {
                login_page(StatusCode::UNAUTHORIZED, "Sign in with an admin token.")
            };
        }
        let query = req.uri().query().unwrap_or("").to_string();
        let result = match path.as_str() {
            "/admin" | "/admin/" => return redirect("/admin/deliveries"),
            "/admin/api/deliveries" => list(store, &query).await.map(|(page, _)| json(&page)),
            "/admin/deliveries" => list(store, &query).await.map(|(page, filter)| list_page(&page, &filter, &query)),
            p => match (p.strip_prefix("/admin/api/deliveries/"), p.strip_prefix("/admin/deliveries/")) {
                (Some(id), _) => one(store, id).await.map(|d| d.map_or_else(not_found, |d| json(&d))),
                (_, Some(id)) => one(store, id).await.map(|d| d.map_or_else(not_found, |d| detail_page(&d))),
                _ => Ok(not_found()),
            },
        };
        result.unwrap_or_else(|e| {
            let message = format!("{e:#}");
            if path.starts_with("/admin/api/") {
                http::json(StatusCode::BAD_REQUEST, &serde_json::json!({"error": message}))
            } else {
                http::html(
                    StatusCode::BAD_REQUEST,
                    shell("Error", &format!("<p class=\"error\">{}</p>", escape(&message))),
                )
            }
        })
    }

    fn login(&self, req: &HttpRequest) -> HttpResponse {
        if req.method() != Method::POST {
            return login_page(StatusCode::OK, "Sign in with an admin token.");
        }
        let token = form_urlencoded::parse(req.body()).find(|(k, _)| k == "token").map(|(_, v)| v.to_string());
        let known = token.and_then(|p| self.tokens.iter().find(|t| http::same_secret(&p, t.expose())));
        match known {
            Some(t) => {
                let mut response = redirect("/admin/deliveries");
                let cookie = format!("{COOKIE}={}; Path=/admin; HttpOnly; SameSite=Strict", Self::session(t));
                response.headers_mut().insert(hyper::header::SET_COOKIE, cookie.parse().expect("a cookie header"));
                response
            }
            None => login_page(StatusCode::UNAUTHORIZED, "That token is not valid."),
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> HttpResponse {
    http::json(StatusCode::OK, &serde_json::to_value(value).expect("serializable"))
}

fn not_found() -> HttpResponse {
    http::text(StatusCode::NOT_FOUND, "no such delivery (never enqueued, or expired after the retention)\n")
}

fn redirect(to: &str) -> HttpResponse {
    let mut response = http::text(StatusCode::SEE_OTHER, "");
    response.headers_mut().insert(hyper::header::LOCATION, to.parse().expect("a location"));
    response
}

/// The filter a query string asks for (the same names as the CLI's flags).
fn filter(query: &str) -> anyhow::Result<(Filter, Option<String>)> {
    let mut f = Filter { limit: PAGE_SIZE, ..Default::default() };
    let mut cursor = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let v = v.trim().to_string();
        if v.is_empty() {
            continue;
        }
        match k.as_ref() {
            "campaign" => f.campaign = Some(v),
            "period" => f.period = Some(v),
            "subscriber" => f.subscriber = Some(v),
            "status" => f.statuses.push(v),
            "since" => f.since = Some(deliveries::parse_since(&v, chrono::Utc::now())?),
            "limit" => f.limit = v.parse::<usize>().map_err(|_| anyhow::anyhow!("limit: a number"))?.clamp(1, 1000),
            "cursor" => cursor = Some(v),
            other => anyhow::bail!("unknown filter {other:?}"),
        }
    }
    Ok((f, cursor))
}

async fn list(store: &Store, query: &str) -> anyhow::Result<(deliveries::Page, Filter)> {
    let (f, cursor) = filter(query)?;
    Ok((deliveries::page(store, &f, cursor.as_deref()).await?, f))
}

async fn one(store: &Store, id: &str) -> anyhow::Result<Option<deliveries::Detail>> {
    let id = percent_decode(id);
    deliveries::get(store, &id).await
}

fn percent_decode(s: &str) -> String {
    form_urlencoded::parse(format!("x={s}").as_bytes()).next().map(|(_, v)| v.to_string()).unwrap_or_default()
}

fn percent_encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2433}\
h1{font-size:20px}table{border-collapse:collapse;width:100%}\
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #e3e6ea;font-size:13px}\
th{background:#f4f6f8}form.filters{display:flex;flex-wrap:wrap;gap:8px 16px;align-items:end;margin-bottom:16px}\
label{display:flex;flex-direction:column;font-size:12px;color:#5a6473}fieldset{border:1px solid #e3e6ea}\
fieldset label{display:inline-flex;flex-direction:row;gap:4px;margin-right:8px;color:#1d2433}\
.status{padding:1px 6px;border-radius:8px;background:#eef1f4}.s-sent{background:#d8f3dc}\
.s-failed{background:#ffd6d6}.s-outcome_unknown{background:#fff1c2}.s-skipped{background:#e7e7ff}\
.error{color:#a00}nav{margin-top:12px}";

fn shell(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t} · mailstream</title>\
         <style>{STYLE}</style></head><body>{body}</body></html>",
        t = escape(title)
    )
}

fn login_page(status: StatusCode, message: &str) -> HttpResponse {
    let body = format!(
        "<h1>mailstream delivery log</h1><p>{}</p>\
         <form id=\"login\" method=\"post\" action=\"/admin/login\">\
         <label>Admin token <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\"></label>\
         <button id=\"sign-in\" type=\"submit\">Sign in</button></form>",
        escape(message)
    );
    http::html(status, shell("Sign in", &body))
}

fn list_page(page: &deliveries::Page, f: &Filter, query: &str) -> HttpResponse {
    let value = |v: &Option<String>| escape(v.as_deref().unwrap_or(""));
    let mut body = String::from("<h1>Deliveries</h1>");
    let _ = write!(
        body,
        "<form id=\"filters\" class=\"filters\" method=\"get\" action=\"/admin/deliveries\">\
         <label>Campaign <input name=\"campaign\" value=\"{}\"></label>\
         <label>Period <input name=\"period\" value=\"{}\"></label>\
         <label>Subscriber <input name=\"subscriber\" value=\"{}\"></label>\
         <label>Settled since <input name=\"since\" placeholder=\"2h, 7d or RFC 3339\"></label><fieldset><legend>Status</legend>",
        value(&f.campaign),
        value(&f.period),
        value(&f.subscriber)
    );
    for s in STATUSES {
        let checked = if f.statuses.iter().any(|x| x == s) { " checked" } else { "" };
        let _ = write!(
            body,
            "<label><input type=\"checkbox\" id=\"status-{s}\" name=\"status\" value=\"{s}\"{checked}>{s}</label>"
        );
    }
    body.push_str("</fieldset><input type=\"hidden\" name=\"limit\" value=\"");
    let _ = write!(body, "{}\"><button id=\"apply\" type=\"submit\">Apply</button></form>", f.limit);
    body.push_str(
        "<table id=\"deliveries\"><thead><tr><th>Delivery</th><th>Status</th><th>Why</th><th>Address</th>\
         <th>Settled</th><th>Requests</th><th>Events</th></tr></thead><tbody>",
    );
    for r in &page.rows {
        let events: Vec<&str> = r.events.keys().map(String::as_str).collect();
        let _ = write!(
            body,
            "<tr class=\"delivery\"><td><a class=\"open\" href=\"/admin/deliveries/{href}\">{id}</a></td>\
             <td><span class=\"status s-{st}\">{st}</span></td><td>{why}</td><td>{addr}</td><td>{settled}</td>\
             <td>{sends}</td><td>{events}</td></tr>",
            href = percent_encode(&r.id),
            id = escape(&r.id),
            st = escape(&r.status),
            why = escape(r.why.as_deref().unwrap_or("")),
            addr = escape(r.address.as_deref().unwrap_or("")),
            settled = escape(r.settled_at.as_deref().unwrap_or("")),
            sends = r.sends,
            events = escape(&events.join(", ")),
        );
    }
    body.push_str("</tbody></table>");
    if page.rows.is_empty() {
        body.push_str("<p id=\"empty\">No delivery matches.</p>");
    }
    body.push_str("<nav>");
    if let Some(next) = &page.next {
        // The same filters, from where this page ended.
        let kept: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form_urlencoded::parse(query.as_bytes()).filter(|(k, _)| k != "cursor"))
            .append_pair("cursor", next)
            .finish();
        let _ = write!(body, "<a id=\"next\" href=\"/admin/deliveries?{}\">Next page</a>", escape(&kept));
    }
    body.push_str("</nav>");
    http::html(StatusCode::OK, shell("Deliveries", &body))
}

fn detail_page(d: &deliveries::Detail) -> HttpResponse {
    let r = &d.row;
    let mut body = format!(
        "<p><a href=\"/admin/deliveries\">All deliveries</a></p><h1 id=\"delivery\">{}</h1>\
         <table id=\"summary\"><tbody>",
        escape(&r.id)
    );
    for (k, v) in [
        ("Status", r.status.clone()),
        ("Why", r.why.clone().unwrap_or_default()),
        ("Campaign", r.campaign.clone()),
        ("Period", r.period.clone()),
        ("Subscriber", r.subscriber.clone()),
        ("Target", r.target.clone()),
        ("Address", r.address.clone().unwrap_or_default()),
        ("Provider id", r.provider_id.clone().unwrap_or_default()),
        ("Requests made", r.sends.to_string()),
        ("Claims", r.claims.to_string()),
        ("Settled", r.settled_at.clone().unwrap_or_default()),
    ] {
        let _ = write!(body, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(&v));
    }
    body.push_str("</tbody></table><h2>History</h2><table id=\"history\"><tbody>");
    for (at, what) in &d.history {
        let _ = write!(body, "<tr><td>{}</td><td>{}</td></tr>", escape(at), escape(what));
    }
    body.push_str("</tbody></table><h2>Record</h2><table id=\"record\"><tbody>");
    for (k, v) in &d.fields {
        let _ = write!(body, "<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
    }
    body.push_str("</tbody></table>");
    http::html(StatusCode::OK, shell(&r.id, &body))
}
