//! RFC 8058 one-click unsubscribe, the listener's side: the mailbox provider POSTs
//! `List-Unsubscribe=One-Click` to an email's unsubscribe URL (`tokens.rs` makes
//! it) and that campaign is turned off for the subscriber; a GET (a link scanner,
//! or a person) only shows a page with a button.

use hyper::{Method, StatusCode};

use crate::audience::tokens::{PATH, TokenError, Tokens};
use crate::http::server::{self, HttpRequest, HttpResponse};

/// What a request to an unsubscribe URL asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Show the confirmation page (GET): changes nothing.
    Confirm { subscriber: String, campaign: String },
    /// Turn the campaign off (POST `List-Unsubscribe=One-Click`).
    Unsubscribe { subscriber: String, campaign: String },
    /// Refuse, with this answer.
    Refuse(StatusCode),
}

/// Reads an unsubscribe request (a pure function: tested alone).
pub(crate) fn ask(tokens: &Tokens, req: &HttpRequest) -> Ask {
    let Some(token) = req.uri().path().strip_prefix(PATH) else { return Ask::Refuse(StatusCode::NOT_FOUND) };
    let (subscriber, campaign) = match tokens.read(token) {
        Ok(pair) => pair,
        Err(TokenError::Malformed) => return Ask::Refuse(StatusCode::BAD_REQUEST),
        Err(TokenError::Forged) => return Ask::Refuse(StatusCode::NOT_FOUND),
    };
    match *req.method() {
        Method::GET | Method::HEAD => Ask::Confirm { subscriber, campaign },
        // RFC 8058: the body is the form field List-Unsubscribe=One-Click.
        Method::POST if form_has_one_click(req.body()) => Ask::Unsubscribe { subscriber, campaign },
        Method::POST => Ask::Refuse(StatusCode::BAD_REQUEST),
        _ => Ask::Refuse(StatusCode::METHOD_NOT_ALLOWED),
    }
}

fn form_has_one_click(body: &[u8]) -> bool {
    std::str::from_utf8(body)
        .map(|b| b.split('&').any(|pair| pair.trim() == "List-Unsubscribe=One-Click"))
        .unwrap_or(false)
}

/// The confirmation page a GET shows: a button that POSTs the one-click form.
pub(crate) fn confirm_page(campaign: &str) -> HttpResponse {
    server::html(
        StatusCode::OK,
        format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
             <title>Unsubscribe</title></head><body><h1>Unsubscribe</h1>\
             <p>Stop receiving <b>{}</b>?</p>\
             <form method=\"post\"><input type=\"hidden\" name=\"List-Unsubscribe\" value=\"One-Click\">\
             <button type=\"submit\">Unsubscribe</button></form></body></html>",
            server::escape(&campaign.replace('_', " "))
        ),
    )
}

/// The answer after unsubscribing (also for a repeated one).
pub(crate) fn done_page() -> HttpResponse {
    server::html(
        StatusCode::OK,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Unsubscribed</title></head>\
         <body><h1>You are unsubscribed</h1><p>You will not receive these emails any more.</p></body></html>",
    )
}

/// A short page for a refusal.
pub fn refusal(status: StatusCode) -> HttpResponse {
    let message = if status == StatusCode::BAD_REQUEST {
        "This unsubscribe link is not valid."
    } else {
        "This unsubscribe link is unknown or no longer valid."
    };
    server::html(status, format!("<!doctype html><html><body><p>{message}</p></body></html>"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;
    use bytes::Bytes;

    fn tokens(secrets: &[&str]) -> Tokens {
        Tokens::new(&secrets.iter().map(|s| Secret::new(*s)).collect::<Vec<_>>())
    }

    fn request(method: Method, path: &str, body: &'static str) -> HttpRequest {
        hyper::Request::builder().method(method).uri(path).body(Bytes::from_static(body.as_bytes())).unwrap()
    }

    #[test]
    fn get_confirms_post_unsubscribes_and_nothing_else_does() {
        let t = tokens(&["a-long-enough-secret-1"]);
        let path = format!("{PATH}{}", t.make("u42", "weekly_digest").unwrap());
        let who = ("u42".to_string(), "weekly_digest".to_string());
        let get = ask(&t, &request(Method::GET, &path, ""));
        assert_eq!(get, Ask::Confirm { subscriber: who.0.clone(), campaign: who.1.clone() });
        let post = ask(&t, &request(Method::POST, &path, "List-Unsubscribe=One-Click"));
        assert_eq!(post, Ask::Unsubscribe { subscriber: who.0, campaign: who.1 });
        assert_eq!(ask(&t, &request(Method::POST, &path, "something=else")), Ask::Refuse(StatusCode::BAD_REQUEST));
        assert_eq!(ask(&t, &request(Method::DELETE, &path, "")), Ask::Refuse(StatusCode::METHOD_NOT_ALLOWED));
        assert_eq!(
            ask(&t, &request(Method::POST, "/u/zzz.yyy", "List-Unsubscribe=One-Click")),
            Ask::Refuse(StatusCode::BAD_REQUEST)
        );
    }
}
