//! `[log]`: how much the daemon logs, and in what format.

use serde::Deserialize;

/// How the daemon logs (to stderr; journald keeps it under systemd).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `error`, `warn`, `info`, `debug` or `trace`, or a tracing filter such as
    /// `info,mailstream::dispatch=debug`; `MAILSTREAM_LOG` overrides it.
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into(), format: LogFormat::Auto }
    }
}

/// One JSON object per line, or lines for people.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Text on a terminal, JSON otherwise (under systemd, in a container).
    #[default]
    Auto,
    Json,
    Text,
}

impl LogConfig {
    /// Adds a message if `log.level` is neither a level nor a tracing filter.
    pub(super) fn validate(&self, errors: &mut Vec<String>) {
        if tracing_subscriber::EnvFilter::try_new(&self.level).is_err() {
            errors.push(format!("log.level: not a level or filter (got {:?})", self.level));
        }
    }
}
