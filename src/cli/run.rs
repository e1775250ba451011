//! `mailstream run`: the daemon, with its listeners bound, until SIGTERM or SIGINT.

use anyhow::Context;

use crate::config::Config;
use crate::daemon::{Listeners, run};
use crate::shutdown;

/// `mailstream run`: binds the listeners, runs until SIGTERM or SIGINT.
pub async fn command(config: Config) -> anyhow::Result<std::process::ExitCode> {
    for warning in config.check_sending()? {
        tracing::warn!("{warning}");
    }
    let listeners = Listeners::bind(&config).await?;
    let shutdown = shutdown::on_signals().context("installing the signal handlers")?;
    run(config, listeners, shutdown).await?;
    Ok(std::process::ExitCode::SUCCESS)
}
