//! `mailstream run`: the daemon, with its listeners bound, until SIGTERM or SIGINT.

use anyhow::Context;

use crate::config::Config;
use crate::daemon::{Listeners, RunOptions, check, serve};
use crate::shutdown;

/// `mailstream run`: checks what it would refuse (writing nothing), binds the listeners,
/// then claims the deployment and runs until SIGTERM or SIGINT.
pub async fn command(config: Config) -> anyhow::Result<std::process::ExitCode> {
    for warning in config.check_run()? {
        tracing::warn!("{warning}");
    }
    let checked = check(&config, None).await?;
    let listeners = Listeners::bind(&config).await?;
    let shutdown = shutdown::on_signals().context("installing the signal handlers")?;
    serve(config, checked, listeners, shutdown, RunOptions::default()).await?;
    Ok(std::process::ExitCode::SUCCESS)
}
