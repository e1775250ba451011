//! The admin pages: minijinja templates (`pages/*.html`, compiled into the binary),
//! auto-escaped as HTML, so no value reaches a page unescaped.

use std::sync::LazyLock;

use hyper::StatusCode;
use minijinja::{Environment, Value};

use crate::http::server::{self, HttpResponse};

static PAGES: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    for (name, source) in [
        ("base.html", include_str!("pages/base.html")),
        ("login.html", include_str!("pages/login.html")),
        ("error.html", include_str!("pages/error.html")),
        ("overview.html", include_str!("pages/overview.html")),
        ("deliveries.html", include_str!("pages/deliveries.html")),
        ("delivery.html", include_str!("pages/delivery.html")),
        ("suppressions.html", include_str!("pages/suppressions.html")),
        ("confirm.html", include_str!("pages/confirm.html")),
        ("done.html", include_str!("pages/done.html")),
    ] {
        env.add_template(name, source).expect("the admin pages compile (a unit test renders each)");
    }
    env
});

/// A serializable value as templates see it.
pub(super) fn value(v: &impl serde::Serialize) -> Value {
    Value::from(minijinja::value::Serde(v))
}

/// `name` rendered with `context` as an HTML answer with `status`.
pub(super) fn page(status: StatusCode, name: &str, context: Value) -> HttpResponse {
    match PAGES.get_template(name).and_then(|t| t.render(context)) {
        Ok(html) => server::html(status, html),
        Err(e) => {
            tracing::error!(page = name, error = %e, "an admin page failed to render");
            server::text(StatusCode::INTERNAL_SERVER_ERROR, "the page failed to render (logged)\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_compiles_and_escapes() {
        for name in PAGES.templates().map(|(name, _)| name) {
            PAGES.get_template(name).unwrap();
        }
        let html = PAGES
            .get_template("error.html")
            .unwrap()
            .render(minijinja::context! { title => "t", message => "<script>x</script>" })
            .unwrap();
        assert!(html.contains("&lt;script&gt;") && !html.contains("<script>x"), "{html}");
    }
}
