//! `mailstream subscribe`: from flags, only the fields given change (the rest of a
//! record is kept; `--replace` writes a whole one); NDJSON lines are whole records.

use std::process::ExitCode;

use crate::audience::subscribers::{self, Subscriber, upsert};
use crate::config::Config;
use crate::store::Store;

/// Add or update subscribers in the registry.
#[derive(clap::Args)]
pub struct Args {
    /// Subscriber id (an id, not an address).
    #[arg(long, required_unless_present = "ndjson")]
    id: Option<String>,
    /// The subscriber's address (needed to add one; kept in the record only).
    #[arg(long)]
    email: Option<String>,
    /// Target ids (repeat); one delivery per target and period.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Whether their plan includes the mail (true or false).
    #[arg(long, action = clap::ArgAction::Set)]
    entitled: Option<bool>,
    /// Whether they are subscribed (true or false).
    #[arg(long, action = clap::ArgAction::Set)]
    subscribed: Option<bool>,
    /// The subscriber's IANA time zone (for campaigns delivered at a local hour).
    #[arg(long)]
    time_zone: Option<String>,
    /// Write the whole record from these flags (others back to their defaults: entitled,
    /// subscribed, the default target, no data, no zone) instead of changing only the
    /// fields given.
    #[arg(long, conflicts_with = "ndjson")]
    replace: bool,
    /// Read NDJSON subscriber records (whole records) from this file, or `-` for stdin.
    #[arg(long, conflicts_with_all = ["id", "email"])]
    ndjson: Option<String>,
    /// Turn a campaign off for this subscriber on one channel (repeat):
    /// `CAMPAIGN` (its email, as the one-click unsubscribe does) or `CAMPAIGN:CHANNEL`
    /// (`weekly_digest:app`: its application events, email left on).
    #[arg(long = "off", conflicts_with = "ndjson", value_name = "CAMPAIGN[:CHANNEL]")]
    off: Vec<String>,
    /// Register a browser's Web Push subscription for this subscriber (repeat): its
    /// `PushSubscription.toJSON()` (`{"endpoint", "keys": {"p256dh", "auth"}}`), or `-` to
    /// read it from stdin. The endpoint is kept in the registry only; what is printed names
    /// it by its id.
    #[arg(long = "push-subscription", conflicts_with = "ndjson", value_name = "JSON")]
    push_subscriptions: Vec<String>,
    /// One JSON object on stdout: `{"written": n}`.
    #[arg(long)]
    json: bool,
}

/// Adds or updates the subscribers `args` name.
pub async fn command(config: &Config, args: Args) -> anyhow::Result<ExitCode> {
    check_flags(&args)?;
    // A browser subscription is checked before anything is written.
    let mut push = Vec::new();
    let allowed = config.push_allowed_hosts();
    for (i, given) in args.push_subscriptions.iter().enumerate() {
        let text = if given == "-" { crate::cli::read_source("-")? } else { given.clone() };
        let s = crate::audience::subscribers::push::Subscription::register(&text, &allowed)
            .map_err(|e| crate::cli::BadValue(format!("--push-subscription #{}: {e}", i + 1)))?;
        push.push(s);
    }
    // Every line of a file is checked before anything is written.
    let max_data_bytes = config.subscribers.max_data_bytes;
    let records = match &args.ndjson {
        Some(source) => {
            let input = crate::cli::ndjson::Input::open(source)?;
            let count = input.check_records(max_data_bytes)?;
            Some((input, count))
        }
        None => None,
    };
    // Every --off is read before anything is written.
    let mut off = Vec::new();
    for item in &args.off {
        let (campaign, channel) = match item.split_once(':') {
            Some((campaign, channel)) => {
                (campaign, channel.parse().map_err(|e| crate::cli::BadValue(format!("--off {item}: {e}")))?)
            }
            None => (item.as_str(), crate::model::work::Channel::Email),
        };
        if config.campaign(campaign).is_none() {
            return Err(crate::cli::BadValue(format!("--off {item}: no campaign {campaign:?} in the config")).into());
        }
        off.push((campaign, channel));
    }
    let store = Store::open(config).await?;
    let out = crate::cli::Report { json: args.json };
    if let Some((input, count)) = records {
        input.in_batches(max_data_bytes, count, "subscribe", async |batch| upsert(&store, batch).await).await?;
        out.line(format_args!("{count} subscribers written"));
        out.object(&serde_json::json!({ "written": count, "turned_off": [], "push_subscriptions": [] }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let list = vec![from_flags(&store, &args).await?];
    // Flags alone that only add a subscription to a stored subscriber leave its record as is.
    let record_untouched = !push.is_empty()
        && args.email.is_none()
        && args.targets.is_empty()
        && args.entitled.is_none()
        && args.subscribed.is_none()
        && args.time_zone.is_none()
        && !args.replace;
    let list = if record_untouched { Vec::new() } else { list };
    upsert(&store, &list).await?;
    out.line(format_args!("{} subscribers written", list.len()));
    let id = args.id.as_deref().unwrap_or_default();
    let mut conn = store.conn().await?;
    for (campaign, channel) in &off {
        crate::store::scripts::opt_out(&mut conn, &store.keys, id, campaign, *channel).await?;
        store.durable(&mut conn, &store.keys.subscriber(store.keys.partition_of(id), id)).await?;
        out.line(format_args!("{campaign} turned off on {channel} for {id}"));
    }
    let mut registered = Vec::new();
    for s in &push {
        let sid = crate::audience::subscribers::push::add(&store, id, s).await?;
        // `masked` names the subscription's id: printed once.
        out.line(format_args!("push subscription {} registered for {id}", s.masked()));
        registered.push(sid);
    }
    out.object(
        &serde_json::json!({ "written": list.len(), "turned_off": args.off, "push_subscriptions": registered }),
    )?;
    Ok(ExitCode::SUCCESS)
}

/// The values of the flags, checked before anything is read or written: each refusal
/// names its flag (and never echoes an address).
fn check_flags(args: &Args) -> Result<(), crate::cli::BadValue> {
    let (id, email, zone) = (args.id.as_deref(), args.email.as_deref(), args.time_zone.as_deref());
    crate::audience::subscribers::check_fields(id, email, &args.targets, zone).map_err(|(field, why)| {
        let flag = match field {
            "targets" => "target",
            "time_zone" => "time-zone",
            other => other,
        };
        crate::cli::BadValue(format!("--{flag}: {why}"))
    })
}

/// The record the flags describe: over the stored one, unless `--replace`.
async fn from_flags(store: &Store, args: &Args) -> anyhow::Result<Subscriber> {
    let id = args.id.clone().unwrap_or_default();
    let stored = if args.replace { None } else { subscribers::stored(store, &id).await? };
    let Some(stored) = stored else {
        let Some(email) = args.email.clone() else {
            return Err(crate::cli::BadValue(format!(
                "subscriber {id} is not in the registry: --email is needed to add it"
            ))
            .into());
        };
        return Ok(Subscriber {
            id,
            email,
            targets: args.targets.clone(),
            entitled: args.entitled.unwrap_or(true),
            subscribed: args.subscribed.unwrap_or(true),
            data: None,
            time_zone: args.time_zone.clone(),
        });
    };
    Ok(Subscriber {
        id,
        email: args.email.clone().unwrap_or(stored.email),
        targets: if args.targets.is_empty() { stored.targets } else { args.targets.clone() },
        entitled: args.entitled.unwrap_or(stored.entitled),
        subscribed: args.subscribed.unwrap_or(stored.subscribed),
        data: stored.data,
        time_zone: args.time_zone.clone().or(stored.time_zone),
    })
}
