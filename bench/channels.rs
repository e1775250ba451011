//! `bench/channels [--subscribers N] [--app-outage-seconds S] [--push-outage-seconds S]
//! [--push-slow-ms MS] [--pool-size N] [--rps R] [--json]`: a channel that is down, or
//! slow, delays no email (see channels_run.rs); the application channel unless a push
//! flag is given.

#[path = "channels_run.rs"]
mod channels_run;

use std::process::ExitCode;

use channels_run::{Options, main_with};
use mailstream::model::work::Channel;

fn main() -> ExitCode {
    let mut opts = Options {
        subscribers: 60_000,
        outage_seconds: 60,
        rps: 10,
        channel: Channel::App,
        slow_ms: 0,
        pool_size: None,
    };
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--subscribers" => opts.subscribers = value("--subscribers"),
            "--app-outage-seconds" => opts.outage_seconds = value("--app-outage-seconds"),
            "--push-outage-seconds" => {
                opts.outage_seconds = value("--push-outage-seconds");
                opts.channel = Channel::Push;
            }
            "--push-slow-ms" => {
                opts.slow_ms = value("--push-slow-ms");
                opts.channel = Channel::Push;
            }
            "--pool-size" => opts.pool_size = Some(value("--pool-size") as usize),
            "--rps" => opts.rps = value("--rps") as u32,
            "--json" => json = true,
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    main_with(&opts, json)
}
