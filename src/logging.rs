//! Logs: one JSON object per line (`log.format = "json"`, or `auto` when stderr is
//! not a terminal: journald, containers) or lines for people. Field names are
//! stable (`timestamp`, `level`, `message`, then the event's own: `delivery`,
//! `batch`, `campaign`, `partition`, `error`, ...); no field ever holds an address
//! (invariant 5). `MAILSTREAM_LOG` overrides `log.level`.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::{LogConfig, LogFormat};

/// The environment variable that overrides `log.level`.
pub const ENV_LOG: &str = "MAILSTREAM_LOG";

/// Installs the process's logger, writing to `writer`; `terminal` tells whether it
/// is one (for `auto`). Fails if a logger is already installed.
pub fn init<W>(log: &LogConfig, writer: W, terminal: bool) -> anyhow::Result<()>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_env(ENV_LOG).or_else(|_| EnvFilter::try_new(&log.level))?;
    let json = match log.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !terminal,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_target(false);
    let installed = if json {
        builder.json().flatten_event(true).with_current_span(false).with_span_list(false).try_init()
    } else {
        builder.with_ansi(terminal).try_init()
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
