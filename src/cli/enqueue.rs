//! `mailstream enqueue`: transactional items from flags or NDJSON, each at most once per idempotency key.

use crate::audience::ingest::{ItemResult, MAX_ITEMS, UnknownSubscriber, enqueue_with};
use crate::config::Config;
use crate::store::Store;

/// `mailstream enqueue`: one transactional item from flags, or NDJSON items.
#[derive(clap::Args)]
pub struct Args {
    /// The caller's idempotency key: the same key enqueues once within the retention.
    #[arg(long = "key", required_unless_present = "ndjson")]
    key: Option<String>,
    /// The recipient's address (kept in the delivery's record only)...
    #[arg(long)]
    to: Option<String>,
    /// ...or a subscriber id of the registry.
    #[arg(long)]
    subscriber: Option<String>,
    /// A template of the config...
    #[arg(long)]
    template: Option<String>,
    /// ...or ready content: a subject and html and/or text.
    #[arg(long)]
    subject: Option<String>,
    /// The HTML part of ready content.
    #[arg(long)]
    html: Option<String>,
    /// The plain-text part of ready content.
    #[arg(long)]
    text: Option<String>,
    /// Template data, a JSON object.
    #[arg(long)]
    data: Option<String>,
    /// A file sent with the email, read here (the daemon never opens a path), as
    /// `FILE` or `FILE;type=application/pdf` (the type is guessed from the extension
    /// otherwise). Repeatable; sent through Resend's `POST /emails`, one email a request.
    #[arg(long, value_name = "FILE[;type=…]")]
    attach: Vec<String>,
    /// Read NDJSON items (the ingest API's item shape) from this file, or `-` for stdin.
    #[arg(long, conflicts_with_all = ["key", "to", "subscriber", "template", "subject", "html", "text", "data", "attach"])]
    ndjson: Option<String>,
    /// Enqueue an item whose `--subscriber` is not in the registry (it is skipped at
    /// send as unknown_subscriber unless added before); without it such an item is refused.
    #[arg(long)]
    allow_unknown: bool,
    /// One JSON object on the last line.
    #[arg(long)]
    json: bool,
}

/// Enqueues the items `args` name, in chunks of `MAX_ITEMS`; exit 1 if any was refused.
pub async fn command(config: &Config, args: Args) -> anyhow::Result<std::process::ExitCode> {
    let Args { key, to, subscriber, template, subject, html, text, data, attach, ndjson, allow_unknown, json } = args;
    let from_flags = ndjson.is_none();
    let items: Vec<serde_json::Value> = match ndjson {
        Some(source) => crate::cli::read_source(&source)?
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(n, l)| {
                serde_json::from_str(l).map_err(|e| crate::model::BadData(format!("line {}: not JSON: {e}", n + 1)))
            })
            .collect::<Result<_, _>>()?,
        None => {
            let data: Option<serde_json::Value> = data
                .map(|d| serde_json::from_str(&d).map_err(|e| crate::cli::BadValue(format!("--data: not JSON: {e}"))))
                .transpose()?;
            let attachments: Vec<serde_json::Value> = attach.iter().map(|a| attachment(a)).collect::<Result<_, _>>()?;
            let attachments = (!attachments.is_empty()).then_some(attachments);
            let mut item = serde_json::json!({ "idempotency_key": key, "to": to, "subscriber": subscriber,
                "template": template, "subject": subject, "html": html, "text": text, "data": data,
                "attachments": attachments });
            item.as_object_mut().expect("an object").retain(|_, v| !v.is_null());
            vec![item]
        }
    };
    if items.len() > MAX_ITEMS * 100 {
        return Err(
            crate::model::BadData(format!("{} items: at most {} per call", items.len(), MAX_ITEMS * 100)).into()
        );
    }
    let store = Store::open(config).await?;
    let mut results = Vec::with_capacity(items.len());
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let chunk: Vec<_> = items.by_ref().take(MAX_ITEMS).collect();
        let offset = results.len();
        let unknown = if allow_unknown { UnknownSubscriber::Allow } else { UnknownSubscriber::Refuse };
        for mut r in enqueue_with(&store, config, chunk, unknown).await? {
            r.shift(offset);
            results.push(r);
        }
    }
    // The one item of the flags, refused: a bad value (64), or a subscriber that is not
    // there (65); nothing was written.
    if from_flags {
        match results.first() {
            Some(ItemResult::Invalid { field, error, .. }) => {
                return Err(crate::cli::BadValue(format!("--{}: {error}", field.replace('_', "-"))).into());
            }
            Some(ItemResult::Refused { field, error, .. }) => {
                let why = format!("--{field}: {error} (add it with `mailstream subscribe`, or pass --allow-unknown)");
                return Err(crate::model::BadData(why).into());
            }
            _ => {}
        }
    }
    let refused = results.iter().filter(|r| r.is_refused()).count();
    // Refusals on stderr; with --json the results are in the object, else a line each.
    for r in &results {
        match r {
            ItemResult::Accepted { index, delivery } if !json => {
                let _ = crate::cli::outln!("item {}: accepted, delivery {delivery}", index + 1);
            }
            ItemResult::Duplicate { index, delivery } if !json => {
                let _ = crate::cli::outln!("item {}: duplicate of delivery {delivery}, nothing new", index + 1);
            }
            ItemResult::Conflict { index, delivery, error } => {
                eprintln!("item {}: refused: {error} (delivery {delivery})", index + 1);
            }
            ItemResult::Invalid { index, field, error }
            | ItemResult::Refused { index, field, error }
            | ItemResult::RetryLater { index, field, error } => {
                eprintln!("item {}: refused: {field}: {error}", index + 1)
            }
            ItemResult::Accepted { .. } | ItemResult::Duplicate { .. } => {}
        }
    }
    let accepted = results.iter().filter(|r| matches!(r, ItemResult::Accepted { .. })).count();
    let duplicates = results.iter().filter(|r| matches!(r, ItemResult::Duplicate { .. })).count();
    if json {
        let _ = crate::cli::outln!(
            "{}",
            serde_json::json!({ "accepted": accepted, "duplicates": duplicates, "refused": refused, "results": results })
        );
    } else {
        let _ = crate::cli::outln!("{accepted} accepted, {duplicates} duplicates, {refused} refused");
    }
    Ok(if refused == 0 { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::from(1) })
}

/// One `--attach FILE[;type=…]`, read here: `{filename, content (base64), content_type}`.
fn attachment(arg: &str) -> anyhow::Result<serde_json::Value> {
    use base64::Engine;
    let (path, content_type) = match arg.rsplit_once(";type=") {
        Some((path, t)) if !t.is_empty() => (path, Some(t.to_string())),
        Some(_) => return Err(crate::cli::BadValue(format!("--attach {arg}: an empty type")).into()),
        None => (arg, None),
    };
    let bytes = std::fs::read(path).map_err(|e| crate::cli::NoInput(format!("--attach: cannot read {path}: {e}")))?;
    let filename = std::path::Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .ok_or_else(|| crate::cli::BadValue(format!("--attach {path}: not a file")))?;
    let content_type = content_type.unwrap_or_else(|| guess_type(&filename).to_string());
    let content = base64::engine::general_purpose::STANDARD.encode(bytes);
    Ok(serde_json::json!({ "filename": filename, "content": content, "content_type": content_type }))
}

/// A media type from a file name's extension (the common ones of receipts and invoices).
fn guess_type(filename: &str) -> &'static str {
    let ext = filename.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "pdf" => "application/pdf",
        "csv" => "text/csv",
        "txt" => "text/plain",
        "html" | "htm" => "text/html",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "zip" => "application/zip",
        "ics" => "text/calendar",
        "json" => "application/json",
        "xml" => "application/xml",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attached_file_is_read_here_and_typed() {
        let dir = std::env::temp_dir().join(format!("mailstream-attach-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pdf = dir.join("invoice-42.pdf");
        std::fs::write(&pdf, b"%PDF-1.7 tiny").unwrap();
        let a = attachment(pdf.to_str().unwrap()).unwrap();
        assert_eq!(
            (a["filename"].as_str(), a["content_type"].as_str()),
            (Some("invoice-42.pdf"), Some("application/pdf"))
        );
        assert_eq!(a["content"], "JVBERi0xLjcgdGlueQ==");
        let typed = attachment(&format!("{};type=application/x-thing", pdf.display())).unwrap();
        assert_eq!(typed["content_type"], "application/x-thing");
        let missing = attachment("/nonexistent/file.pdf").unwrap_err();
        assert!(missing.downcast_ref::<crate::cli::NoInput>().is_some(), "{missing}");
        assert_eq!(guess_type("notes"), "application/octet-stream");
    }
}
