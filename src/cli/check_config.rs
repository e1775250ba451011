//! `mailstream check-config`: is the config valid and fit to send, and what it turns on.

use std::path::Path;

use crate::config::{Config, ConfigError, Problem};

/// `mailstream check-config`: the config at `path` is valid and holds what `run` needs
/// (without `offline`, the secrets it starts with: the Resend API key); says what it
/// holds and which features it turns on. With `--json` the object is printed for every
/// refusal too (`ok` false, `errors`: `key`, `line`, `message` each), the file unreadable
/// or not TOML included, and the error follows on stderr.
pub fn command(path: &Path, json: bool, offline: bool) -> anyhow::Result<std::process::ExitCode> {
    let out = crate::cli::Report { json };
    let config = match Config::load(path) {
        Ok(config) => config,
        Err(e) => return refuse(path, e, None, json),
    };
    let warnings = match if offline { config.check_sending() } else { config.check_run() } {
        Ok(warnings) => warnings,
        Err(e) => return refuse(path, e, Some(&config), json),
    };
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let features = config.features();
    out.line(format_args!(
        "{}: ok ({} campaigns, {} partitions, {} requests/s, Resend API key {})",
        path.display(),
        config.campaigns.len(),
        config.redis.partitions,
        config.resend.requests_per_second,
        if config.resend.api_key.is_some() { "set" } else { "NOT set (RESEND_API_KEY)" }
    ));
    out.line(format_args!("features: {features}"));
    let mut report = summary(path, &config);
    report["ok"] = true.into();
    report["errors"] = serde_json::json!([]);
    report["warnings"] = serde_json::json!(warnings);
    out.object(&report)?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// What the config holds, for the JSON object.
fn summary(path: &Path, config: &Config) -> serde_json::Value {
    serde_json::json!({
        "path": path,
        "campaigns": config.campaigns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        "partitions": config.redis.partitions,
        "requests_per_second": config.resend.requests_per_second,
        "features": config.features(),
    })
}

/// A refused config: with `--json` the object with `ok` false and the problems one by
/// one (with what the config holds, when it could be read); then the error, which
/// exits 78.
fn refuse(path: &Path, e: ConfigError, config: Option<&Config>, json: bool) -> anyhow::Result<std::process::ExitCode> {
    if json {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let errors: Vec<Problem> = e.problems(&text);
        let mut report = match config {
            Some(config) => summary(path, config),
            None => serde_json::json!({ "path": path }),
        };
        report["ok"] = false.into();
        report["errors"] = serde_json::json!(errors);
        report["warnings"] = serde_json::json!([]);
        crate::cli::Report { json }.object(&report)?;
    }
    Err(e.into())
}
