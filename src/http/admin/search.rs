//! `/admin/search` (and `/admin/api/search`): a subscriber id or an address finds its
//! deliveries and its suppression (`ops::deliveries::search`). An address typed into the
//! page is sent on at once to the page of its hash (303), so no address stays in a URL the
//! browser keeps (history, bookmarks) or a page links to.

use hyper::StatusCode;
use minijinja::context;

use super::pages::{self, value};
use super::session::redirect;
use crate::http::server::HttpResponse;
use crate::ops::deliveries::search::{self, Found, Query};
use crate::store::Store;

/// Deliveries read per subscriber and per partition's address index.
const LIMIT: usize = 50;

/// The query's `q` (anything typed) or `address` (an address hash), if either is given.
fn asked(store: &Store, query: &str) -> anyhow::Result<Option<(String, Query)>> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let get = |name: &str| pairs.iter().find(|(k, v)| k == name && !v.trim().is_empty()).map(|(_, v)| v.trim());
    match (get("address"), get("q")) {
        (Some(hash), _) => match store.keys.address_of_hash(hash) {
            Some(a) => Ok(Some((hash.to_string(), Query::Address(a)))),
            None => Err(crate::model::BadValue(format!("{hash:?} is not an address hash")).into()),
        },
        (None, Some(q)) => Ok(Some((q.to_string(), Query::parse(store, q)?))),
        (None, None) => Ok(None),
    }
}

/// What the search API answers: what was found, or an error for a query it cannot read.
pub(super) async fn read(store: &Store, query: &str) -> anyhow::Result<Found> {
    let Some((_, q)) = asked(store, query)? else {
        return Err(
            crate::model::BadValue("give q (a subscriber id or an address) or address (its hash)".into()).into()
        );
    };
    search::search(store, &q, LIMIT).await
}

/// The search page: the form, and what it found.
pub(super) async fn page(store: &Store, query: &str) -> anyhow::Result<HttpResponse> {
    let asked = asked(store, query)?;
    let (shown, found) = match &asked {
        // Typed in the clear: on to its hash's page.
        Some((typed, Query::Address(a))) if typed.contains('@') => {
            return Ok(redirect(&format!("/admin/search?address={}", a.hash), None));
        }
        Some((typed, q)) => (typed.clone(), Some(search::search(store, q, LIMIT).await?)),
        None => (String::new(), None),
    };
    let by_address = matches!(asked, Some((_, Query::Address(_))));
    let context =
        context! { title => "Search", signed_in => true, shown, by_address, found => value(&found), limit => LIMIT };
    Ok(pages::page(StatusCode::OK, "search.html", context))
}
