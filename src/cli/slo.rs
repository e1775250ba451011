//! `mailstream slo`: the delivery SLO per campaign period, and with `--mail` the report by email.

use crate::config::Config;
use serde_json::json;

use crate::ops::slo::{self, EXIT_UNEVALUATED, evaluate, render};
use crate::ops::slo_mail::enqueue;
use crate::store::Store;

/// `mailstream slo`.
#[derive(clap::Args)]
pub struct Args {
    /// Only this campaign's periods.
    #[arg(long)]
    campaign: Option<String>,
    /// Only this period (such as 2026-W48); with --campaign, reported even if nothing was enqueued.
    #[arg(long)]
    period: Option<String>,
    /// One JSON object on stdout, also when the SLO cannot be evaluated (`status`
    /// "unevaluated" and `error`); the lines for people go to stderr.
    #[arg(long)]
    pub json: bool,
    /// Also enqueue the report by email now, to `[operators] to` with the
    /// `[slo.report]` template (this writes; without it `slo` only reads).
    #[arg(long, conflicts_with_all = ["campaign", "period"])]
    pub mail: bool,
}

/// Prints the report; the exit code says within (0), breached (3) or not evaluated (4):
/// Redis unreachable, no such campaign, or nothing to evaluate (no deployment under
/// this prefix, or no campaign period in it), so a check pointed at the wrong Redis or
/// prefix does not stay green.
pub async fn command(config: &Config, args: Args) -> anyhow::Result<std::process::ExitCode> {
    let out = crate::cli::Report { json: args.json };
    let report = async {
        let store = Store::open_read(config).await?;
        anyhow::ensure!(
            store.deployed().await?,
            "no mailstream deployment under prefix {:?} at this Redis (is redis.prefix or redis.url mistyped?)",
            config.redis.prefix
        );
        let report = evaluate(&store, config, args.campaign.as_deref(), args.period.as_deref()).await?;
        anyhow::ensure!(!report.periods.is_empty(), "nothing to evaluate: no campaign period within the retention");
        Ok(report)
    };
    match report.await {
        Ok(report) => {
            out.line(render(&report).trim_end());
            out.object(&report)?;
            Ok(std::process::ExitCode::from(report.exit_code()))
        }
        Err(e) => {
            eprintln!("error: the SLO could not be evaluated: {e:#}");
            out.object(&serde_json::json!({ "status": "unevaluated", "error": format!("{e:#}") }))?;
            Ok(std::process::ExitCode::from(EXIT_UNEVALUATED))
        }
    }
}
/// `mailstream slo --mail`: evaluates the SLO, prints it as `mailstream slo` does, and
/// enqueues the report by email now; exits as `slo` does (4 also when it could not be
/// enqueued).
pub async fn mail(config: &Config, json: bool) -> anyhow::Result<std::process::ExitCode> {
    let out = crate::cli::Report { json };
    let name = format!("now-{}", crate::model::id::new_id());
    let enqueued = async {
        let store = Store::connect(config).await?;
        enqueue(&store, config, &name).await
    };
    match enqueued.await {
        Ok(done) => {
            out.line(slo::render(&done.report).trim_end());
            out.line(format_args!("SLO report {name} enqueued to {} operators", done.accepted()));
            let mut object = serde_json::to_value(&done.report)?;
            object["mailed"] = json!({"report": name, "operators": done.accepted()});
            out.object(&object)?;
            Ok(std::process::ExitCode::from(done.report.exit_code()))
        }
        Err(e) => {
            eprintln!("error: the SLO report could not be enqueued: {e:#}");
            out.object(&json!({ "status": "unevaluated", "error": format!("{e:#}") }))?;
            Ok(std::process::ExitCode::from(slo::EXIT_UNEVALUATED))
        }
    }
}
