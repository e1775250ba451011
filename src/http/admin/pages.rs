//! The admin pages: minijinja templates (`pages/*.html`, compiled into the binary),
//! auto-escaped as HTML, so no value reaches a page unescaped. Times are shown as
//! people read them (`when`: `2026-12-06 18:20:05 UTC (3 min ago)`), never as raw
//! milliseconds.

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
        ("period.html", include_str!("pages/period.html")),
        ("failures.html", include_str!("pages/failures.html")),
        ("search.html", include_str!("pages/search.html")),
        ("events.html", include_str!("pages/events.html")),
    ] {
        env.add_template(name, source).expect("the admin pages compile (a unit test renders each)");
    }
    env.add_filter("when", |v: Value| when(&v, chrono::Utc::now()));
    env.add_filter("field", |v: Value, name: String| field(&name, &v, chrono::Utc::now()));
    env.add_filter("total", |v: Value| -> u64 {
        let Ok(keys) = v.try_iter() else { return 0 };
        keys.filter_map(|k| v.get_item(&k).ok().and_then(|n| u64::try_from(n).ok())).sum()
    });
    env.add_filter("words", |v: String| v.replace('_', " "));
    env
});

/// A time as people read it: milliseconds since the epoch (a number or its digits) or
/// RFC 3339, as UTC to the second and how long ago (as it was; anything else).
fn when(v: &Value, now: chrono::DateTime<chrono::Utc>) -> String {
    let text = v.to_string();
    let at = i64::try_from(v.clone())
        .ok()
        .or_else(|| text.parse::<i64>().ok())
        .and_then(chrono::DateTime::from_timestamp_millis)
        .or_else(|| chrono::DateTime::parse_from_rfc3339(&text).ok().map(|t| t.to_utc()));
    let Some(at) = at else { return text };
    let secs = (now - at).num_seconds();
    let ago = match secs.unsigned_abs() {
        0..60 => format!("{} s", secs.abs()),
        60..7200 => format!("{} min", secs.abs() / 60),
        7200..172_800 => format!("{} h", secs.abs() / 3600),
        _ => format!("{} days", secs.abs() / 86_400),
    };
    let ago = if secs >= 0 { format!("{ago} ago") } else { format!("in {ago}") };
    format!("{} ({ago})", at.format("%Y-%m-%d %H:%M:%S UTC"))
}

/// A record's field as the delivery page shows it: a time field (`…_ms`, `ev_…`) as a
/// time, with its raw value; anything else as it is.
fn field(name: &str, v: &Value, now: chrono::DateTime<chrono::Utc>) -> String {
    let raw = v.to_string();
    let time = name.ends_with("_ms") || name.starts_with("ev_");
    match raw.parse::<i64>() {
        Ok(ms) if time && ms > 1_000_000_000_000 => format!("{} · {raw}", when(v, now)),
        _ => raw,
    }
}

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

    #[test]
    fn times_read_as_times() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-06T18:20:05Z").unwrap().to_utc();
        let ms = now.timestamp_millis() - 180_000;
        assert_eq!(when(&Value::from(ms), now), "2026-12-06 18:17:05 UTC (3 min ago)");
        assert_eq!(when(&Value::from(ms.to_string()), now), "2026-12-06 18:17:05 UTC (3 min ago)");
        assert_eq!(when(&Value::from("2026-12-06T18:20:00+00:00"), now), "2026-12-06 18:20:00 UTC (5 s ago)");
        assert_eq!(when(&Value::from("2026-12-08T18:20:05Z"), now), "2026-12-08 18:20:05 UTC (in 2 days)");
        assert_eq!(when(&Value::from("soon"), now), "soon");
        let settled = field("settled_ms", &Value::from(ms.to_string()), now);
        assert_eq!(settled, format!("2026-12-06 18:17:05 UTC (3 min ago) · {ms}"));
        assert_eq!(field("sends", &Value::from("3"), now), "3");
        assert_eq!(field("provider_id", &Value::from("1796315123813"), now), "1796315123813");
    }
}
