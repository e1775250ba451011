//! Who an admin request comes from: an admin token (`Authorization: Bearer`, for scripts)
//! or a session. Signing in with a token opens a session in Redis
//! (`store::sessions`, `http.admin_session_hours`) under the SHA-256 of a random
//! 128-bit id; the cookie holds the id, nothing derived from the token. `POST
//! /admin/logout` ends the session (the cookie alone is enough), and so does rotating
//! its token out. A form sent with the cookie carries the page's form token, an HMAC
//! of the session id keyed by the admin token: another site can make a browser send
//! the cookie, not read that. Every admin answer forbids framing and referrers.

use hmac::{Hmac, Mac};
use hyper::StatusCode;
use sha2::{Digest, Sha256};

use crate::config::Secret;
use crate::http::server::{self, HttpRequest, HttpResponse};
use crate::store::Store;
use crate::store::sessions::{self, AdminSession};

pub(super) const COOKIE: &str = "mailstream_admin";

/// One admin token and the name the log of admin actions gives it.
pub(crate) struct Credential {
    pub(super) name: String,
    token: Secret,
}

/// How a request proved itself.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Via {
    /// An admin token in the request itself: no cookie, so no form token is needed.
    Bearer,
    /// A session's cookie: its id (a form must carry the form token made from it).
    Session(String),
}

/// The tokens that open the admin pages.
pub(crate) struct Credentials(Vec<Credential>);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac(key: &[u8], purpose: &[u8], message: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(purpose);
    mac.update(message);
    hex(&mac.finalize().into_bytes())
}

/// Where a session is kept: the SHA-256 of its id (Redis never holds the id).
fn id_hash(id: &str) -> String {
    hex(&Sha256::digest(id.as_bytes()))
}

/// The session id a request's cookie holds ("" for none). Only the shape of an id is
/// taken: 32 hex digits.
fn cookie(req: &HttpRequest) -> &str {
    let header = req.headers().get(hyper::header::COOKIE).and_then(|v| v.to_str().ok()).unwrap_or("");
    header
        .split(';')
        .filter_map(|c| c.trim().strip_prefix(COOKIE).and_then(|c| c.strip_prefix('=')))
        .find(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or("")
}

impl Credentials {
    /// `NAME:TOKEN` names a token; a bare token is named by its position (`#1`, …).
    pub(super) fn new(tokens: &[Secret]) -> Credentials {
        let credentials = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| match t.expose().split_once(':') {
                Some((name, token)) => Credential { name: name.to_string(), token: Secret::new(token) },
                None => Credential { name: format!("#{}", i + 1), token: t.clone() },
            })
            .collect();
        Credentials(credentials)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[cfg(test)]
    pub(super) fn names(&self) -> Vec<&str> {
        self.0.iter().map(|c| c.name.as_str()).collect()
    }

    /// A session's mark of the token it was opened with.
    fn owner(c: &Credential) -> String {
        mac(c.token.expose().as_bytes(), b"mailstream admin session owner", b"")
    }

    /// The form token of a request: an HMAC of its session id keyed by the admin token
    /// (for a bearer request, of nothing: it needs none).
    pub(super) fn form_token(c: &Credential, via: &Via) -> String {
        let id = match via {
            Via::Session(id) => id.as_str(),
            Via::Bearer => "",
        };
        mac(c.token.expose().as_bytes(), b"mailstream admin form ", id.as_bytes())
    }

    /// The credential a token presented at sign-in (or as a bearer) names.
    fn of_token(&self, token: &str) -> Option<&Credential> {
        self.0.iter().find(|c| server::same_secret(token, c.token.expose()))
    }

    /// Who the request comes from: a valid bearer token, or a cookie naming a session that
    /// has not ended and whose token is still configured. Tokens and marks are compared
    /// in constant time.
    pub(super) async fn who(&self, store: &Store, req: &HttpRequest) -> anyhow::Result<Option<(&Credential, Via)>> {
        if let Some(c) = self.of_token(server::bearer(req)) {
            return Ok(Some((c, Via::Bearer)));
        }
        let id = cookie(req);
        if id.is_empty() {
            return Ok(None);
        }
        let Some(session) = sessions::find(store, &id_hash(id)).await? else { return Ok(None) };
        let c = self.0.iter().find(|c| c.name == session.name && server::same_secret(&session.owner, &Self::owner(c)));
        Ok(c.map(|c| (c, Via::Session(id.to_string()))))
    }

    /// Signs in with the token a login form sent: a new session and its cookie, or `None`
    /// for a token that is not valid.
    pub(super) async fn sign_in(
        &self,
        store: &Store,
        token: &str,
        lasts: std::time::Duration,
    ) -> anyhow::Result<Option<(String, String)>> {
        let Some(c) = self.of_token(token) else { return Ok(None) };
        let id = hex(&rand::random::<[u8; 16]>());
        let session = AdminSession { name: c.name.clone(), owner: Self::owner(c) };
        sessions::open(store, &id_hash(&id), &session, lasts.as_secs()).await?;
        let cookie = format!("{COOKIE}={id}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={}", lasts.as_secs());
        Ok(Some((c.name.clone(), cookie)))
    }
}

/// Ends the session a request's cookie names (if any); the cookie that clears it.
pub(super) async fn sign_out(store: &Store, req: &HttpRequest) -> anyhow::Result<String> {
    let id = cookie(req);
    if !id.is_empty() {
        sessions::end(store, &id_hash(id)).await?;
    }
    Ok(format!("{COOKIE}=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0"))
}

/// The headers every admin answer carries: no framing (clickjacking), no referrer (ids in
/// the address bar stay here), nothing loaded from elsewhere, forms posted only here.
pub(super) fn guard(mut response: HttpResponse) -> HttpResponse {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("x-content-type-options", "nosniff"),
        ("cache-control", "no-store"),
    ] {
        headers.insert(name, hyper::header::HeaderValue::from_static(value));
    }
    response
}

/// A 303 to `to`, setting `cookie` if given.
pub(super) fn redirect(to: &str, cookie: Option<&str>) -> HttpResponse {
    let mut response = server::text(StatusCode::SEE_OTHER, "");
    response.headers_mut().insert(hyper::header::LOCATION, to.parse().expect("a location"));
    if let Some(cookie) = cookie {
        response.headers_mut().insert(hyper::header::SET_COOKIE, cookie.parse().expect("a cookie header"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_named_in_the_log_by_its_prefix_or_its_position() {
        let admin =
            Credentials::new(&[Secret::new("0123456789abcdef0123"), Secret::new("ops-ann:fedcba9876543210fedc")]);
        assert_eq!(admin.names(), ["#1", "ops-ann"]);
        assert_eq!(admin.0[1].token.expose(), "fedcba9876543210fedc", "the name is not part of the token");
        let (a, b) = (&admin.0[0], &admin.0[1]);
        let s1 = Via::Session("0".repeat(32));
        let s2 = Via::Session("1".repeat(32));
        assert_ne!(Credentials::form_token(a, &s1), Credentials::form_token(b, &s1), "bound to the token");
        assert_ne!(Credentials::form_token(a, &s1), Credentials::form_token(a, &s2), "bound to the session");
        assert_ne!(Credentials::owner(a), Credentials::owner(b));
    }

    #[test]
    fn only_the_shape_of_a_session_id_is_read_from_a_cookie() {
        let req = |cookie: &str| {
            hyper::Request::builder().header("cookie", cookie).body(bytes::Bytes::new()).expect("a request")
        };
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(cookie(&req(&format!("a=b; {COOKIE}={id}"))), id);
        assert_eq!(cookie(&req(&format!("{COOKIE}={id}x"))), "");
        assert_eq!(cookie(&req(&format!("{COOKIE}=../{}", &id[3..]))), "");
        assert_eq!(cookie(&req("other=1")), "");
        assert_ne!(id_hash(id), id);
    }
}
