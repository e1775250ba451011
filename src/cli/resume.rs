//! `mailstream resume`: end a quota pause now, on every instance.

use crate::send::pause::Pause;
use crate::store::Store;

/// `mailstream resume`: ends a quota pause now, on every instance.
pub async fn command(config: &crate::config::Config, json: bool) -> anyhow::Result<std::process::ExitCode> {
    let store = Store::open_deployed(config).await?;
    let was = Pause::resume(&store).await?;
    let out = crate::cli::Report { json };
    out.line(if was { "sending resumed" } else { "sending was not paused" });
    out.object(&serde_json::json!({ "resumed": was }))?;
    Ok(std::process::ExitCode::SUCCESS)
}
