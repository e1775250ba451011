//! `mailstream check-config`: is the config valid and fit to send, and what it turns on.

use std::path::Path;

use crate::config::{Config, ConfigError};

/// `mailstream check-config`: `config` (read from `path`) is valid and fit to send
/// campaigns; says what it holds and which features it turns on. With `--json` the
/// object is printed also when `run` would refuse the config (`ok` false, `errors`),
/// and the error follows on stderr.
pub fn command(path: &Path, config: &Config, json: bool) -> Result<std::process::ExitCode, ConfigError> {
    let (warnings, errors) = match config.check_sending() {
        Ok(warnings) => (warnings, Vec::new()),
        Err(ConfigError::Invalid(errors)) if json => (Vec::new(), errors),
        Err(e) => return Err(e),
    };
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let out = crate::cli::Report { json };
    let features = config.features();
    out.line(format_args!(
        "{}: {} ({} campaigns, {} partitions, {} requests/s, Resend API key {})",
        path.display(),
        if errors.is_empty() { "ok" } else { "refused" },
        config.campaigns.len(),
        config.redis.partitions,
        config.resend.requests_per_second,
        if config.resend.api_key.is_some() { "set" } else { "NOT set (RESEND_API_KEY)" }
    ));
    out.line(format_args!("features: {features}"));
    let report = serde_json::json!({
        "ok": errors.is_empty(),
        "errors": errors,
        "path": path,
        "campaigns": config.campaigns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        "partitions": config.redis.partitions,
        "requests_per_second": config.resend.requests_per_second,
        "features": features,
        "warnings": warnings,
    });
    out.object(&report).map_err(|e| ConfigError::Parse(e.to_string()))?;
    if errors.is_empty() { Ok(std::process::ExitCode::SUCCESS) } else { Err(ConfigError::Invalid(errors)) }
}
