//! `bench/chaos [--deliveries N] [--kills K] [--redis-restarts R] [--rps R] [--seed S]
//! [--outage-seconds S] [--pause-with-unsubscribes P] [--json]`:
//! the chaos run (see chaos_run.rs). Exits non-zero when a delivery was sent
//! twice, never settled, or recorded as sent without a real send.
//!
//! `bench/chaos --push-outage-seconds S [--deliveries N] [--rps R] [--json]`: the push
//! services down instead (channels_run.rs): the weekly digest on email alone, then on
//! email and Web Push with the push service answering 503 for the first S seconds; exits
//! non-zero when the email throughput ratio moved by more than 0.02, anything was sent
//! twice, or a delivery of either channel was left unsettled.

#[path = "channels_run.rs"]
mod channels_run;
#[path = "chaos_run.rs"]
mod chaos_run;

use std::process::ExitCode;

use chaos_run::{ChaosOptions, chaos};

fn main() -> ExitCode {
    let mut opts = ChaosOptions {
        deliveries: 20_000,
        kills: 10,
        redis_restarts: 1,
        rps: 10,
        seed: 42,
        outage_seconds: 0,
        pause_with_unsubscribes: 0.0,
        binary: env!("CARGO_BIN_EXE_mailstream").into(),
        verbose: true,
    };
    let mut json = false;
    let mut push_outage: Option<u64> = None;
    let mut deliveries_given = false;
    let mut chaos_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--deliveries" => {
                opts.deliveries = value("--deliveries");
                deliveries_given = true;
            }
            "--push-outage-seconds" => push_outage = Some(value("--push-outage-seconds")),
            "--kills" => {
                opts.kills = value("--kills") as u32;
                chaos_only = true;
            }
            "--redis-restarts" => {
                opts.redis_restarts = value("--redis-restarts") as u32;
                chaos_only = true;
            }
            "--rps" => opts.rps = value("--rps") as u32,
            "--seed" => opts.seed = value("--seed"),
            "--outage-seconds" => opts.outage_seconds = value("--outage-seconds"),
            "--pause-with-unsubscribes" => {
                opts.pause_with_unsubscribes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|p: &f64| (0.0..=1.0).contains(p))
                    .unwrap_or_else(|| panic!("--pause-with-unsubscribes needs a fraction in 0..=1"))
            }
            "--json" => json = true,
            "--bench" => {} // added by `cargo bench`
            other => {
                eprintln!("unknown argument {other}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(outage_seconds) = push_outage {
        if chaos_only {
            eprintln!("--push-outage-seconds runs the push outage alone: leave out --kills and --redis-restarts");
            return ExitCode::from(2);
        }
        // A minute of email at the default 10 requests/s, all of it inside the outage.
        let subscribers = if deliveries_given { opts.deliveries } else { 60_000 };
        let channels = channels_run::Options {
            subscribers,
            outage_seconds,
            rps: opts.rps,
            channel: mailstream::model::work::Channel::Push,
            slow_ms: 0,
            pool_size: None,
        };
        return channels_run::main_with(&channels, json);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let report = match runtime.block_on(chaos(&opts)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "deliveries {}: sent {}, failed {} {:?}, outcome_unknown {} {:?}, never settled {}",
        report.deliveries,
        report.sent,
        report.failed,
        report.failed_reasons,
        report.outcome_unknown,
        report.unknown_reasons,
        report.never_settled
    );
    println!(
        "emulator: {} real sends, {} duplicate real sends, {} requests ({} injected 5xx, {} hangs, {} rate-limited, {} replays, {} concurrent 409s)",
        report.real_sends,
        report.duplicate_real_sends,
        report.provider_requests,
        report.injected_server_errors,
        report.injected_hangs,
        report.rate_limited,
        report.replays,
        report.concurrent_conflicts
    );
    println!(
        "chaos: {} kill -9, {} redis restarts, {} s outage ({:.1} s from Resend's return to the last settlement; retry_max_ms {}), {} unsubscribed during a quota pause ({} sent after), {:.1} s in all, {:.1} s from the last kill to the last settlement",
        report.kills,
        report.redis_restarts,
        report.outage_seconds,
        report.recovery_seconds,
        report.retry_max_ms,
        report.unsubscribed_during_pause,
        report.sent_after_unsubscribe,
        report.elapsed_seconds,
        report.seconds_from_last_kill_to_settled
    );
    let problems = report.problems();
    for p in &problems {
        println!("PROBLEM: {p}");
    }
    if json {
        println!("{}", serde_json::to_string(&report).expect("report serializes"));
    }
    if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
