//! `mailstream preview`: the email a delivery would be sealed as now, without enqueuing anything.

use crate::audience::subscribers;
use crate::config::Config;
use crate::model::work::DeliveryRef;
use crate::send::resolve::preview;
use crate::store::Store;

/// `mailstream preview`.
#[derive(clap::Args)]
pub struct Args {
    /// The campaign (as named in the config).
    #[arg(long)]
    campaign: String,
    /// The subscriber's id.
    #[arg(long)]
    subscriber: String,
    /// The subscriber's target (default: their first).
    #[arg(long)]
    target: Option<String>,
    /// Period such as 2026-W48, or previous, current or next (in the campaign's time
    /// zone); default: the current one.
    #[arg(long)]
    period: Option<String>,
    /// What to print: the text part with the subject and headers, the HTML part, or the
    /// email object as sealed.
    #[arg(long, value_enum, default_value = "text")]
    format: PreviewFormat,
    /// One JSON object on stdout: the email object as it would be sealed, or
    /// `{"delivery", "sent": false, "reason"}`; the same as `--format json`.
    #[arg(long, conflicts_with = "format")]
    json: bool,
}

/// What `mailstream preview` prints.
#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum PreviewFormat {
    /// Subject, headers and the text part.
    Text,
    /// The HTML part.
    Html,
    /// The email object exactly as it would be sealed.
    Json,
}

/// Prints the email a delivery would be sealed as now; exit 1 (and why) if it would not be sent.
pub async fn command(config: &Config, args: Args) -> anyhow::Result<std::process::ExitCode> {
    let Args { campaign, subscriber, target, period, format, json } = args;
    let format = if json { PreviewFormat::Json } else { format };
    let c = config
        .campaign(&campaign)
        .ok_or_else(|| crate::cli::BadValue(format!("no campaign {campaign:?} in the config")))?;
    let store = Store::open_deployed(config).await?;
    let rule = crate::audience::kick::PeriodRule::AnyWithinRetention;
    let period = crate::audience::kick::period_for(&store, c, period.as_deref(), rule).await?;
    let target = match target {
        Some(t) => t,
        None => subscribers::first_target(&store, &subscriber).await?,
    };
    let delivery = DeliveryRef::new(&campaign, &period, &subscriber, &target);
    let out = crate::cli::Report { json: format == PreviewFormat::Json };
    let email = match preview(&store, config, &delivery).await? {
        Ok(json) => json,
        Err(reason) => {
            // A refusal: on stderr, whatever the format.
            eprintln!("{} would not be sent: {}", delivery.id(), reason.as_str());
            let id = delivery.id();
            out.object(&serde_json::json!({ "delivery": id, "sent": false, "reason": reason.as_str() }))?;
            return Ok(std::process::ExitCode::FAILURE);
        }
    };
    let value: serde_json::Value = serde_json::from_str(&email)?;
    match format {
        PreviewFormat::Json => crate::cli::outln!("{email}")?,
        PreviewFormat::Html => crate::cli::outln!("{}", value["html"].as_str().unwrap_or(""))?,
        PreviewFormat::Text => {
            crate::cli::outln!("delivery: {}", delivery.id())?;
            for field in ["from", "subject"] {
                crate::cli::outln!("{field}: {}", value[field].as_str().unwrap_or(""))?;
            }
            crate::cli::outln!("to: {}", value["to"])?;
            if let Some(headers) = value["headers"].as_object() {
                for (k, v) in headers {
                    crate::cli::outln!("{k}: {}", v.as_str().unwrap_or(""))?;
                }
            }
            crate::cli::outln!("\n{}", value["text"].as_str().unwrap_or(""))?;
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}
