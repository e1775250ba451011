//! `mailstream upgrade`: an earlier key layout moved to this version's, every instance stopped.

use crate::config::Config;
use crate::store;

/// `mailstream upgrade`: moves an earlier key layout to this version's (every
/// instance stopped), building the kick's audience index where the layout lacks it.
pub async fn command(config: &Config, json: bool) -> anyhow::Result<std::process::ExitCode> {
    let store = store::Store::connect_deployed(config).await?;
    store.check_version().await?;
    let out = crate::cli::Report { json };
    let mut audience = None;
    let upgraded = store
        .upgrade_layout(config, async |store: &store::Store| {
            let n = crate::audience::subscribers::build_audience(store).await?;
            out.line(format_args!(
                "built the kick's audience: {n} subscribers entitled, subscribed and not suppressed"
            ));
            audience = Some(n);
            Ok(())
        })
        .await?;
    match upgraded {
        Some(from) => out.line(format_args!(
            "upgraded from key layout {from} to {}; every campaign period's dedup is kept until its kick window ends",
            store::keys::LAYOUT
        )),
        None => out.line(format_args!("nothing to upgrade: key layout {}", store::keys::LAYOUT)),
    }
    out.object(&serde_json::json!({
        "upgraded_from": upgraded,
        "layout": store::keys::LAYOUT,
        "audience_subscribers": audience,
    }))?;
    Ok(std::process::ExitCode::SUCCESS)
}
