//! `mailstream upgrade`: an earlier key layout moved to this version's, every instance stopped.

use crate::config::Config;
use crate::store;

/// `mailstream upgrade`: moves an earlier key layout to this version's (every
/// instance stopped), building the kick's audience index where the layout lacks it.
pub async fn command(config: &Config) -> anyhow::Result<std::process::ExitCode> {
    let store = store::Store::connect_deployed(config).await?;
    store.check_version().await?;
    let upgraded = store
        .upgrade_layout(config, async |store: &store::Store| {
            let n = crate::audience::subscribers::build_audience(store).await?;
            let _ = crate::cli::outln!(
                "built the kick's audience: {n} subscribers entitled, subscribed and not suppressed"
            );
            Ok(())
        })
        .await?;
    let _ = match upgraded {
        Some(from) => crate::cli::outln!(
            "upgraded from key layout {from} to {}; every campaign period's dedup is kept until its kick window ends",
            store::keys::LAYOUT
        ),
        None => crate::cli::outln!("nothing to upgrade: key layout {}", store::keys::LAYOUT),
    };
    Ok(std::process::ExitCode::SUCCESS)
}
