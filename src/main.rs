//! The `mailstream` command: argument parsing and logging only; each command is
//! one function in its own room of the library.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use mailstream::config::{Config, LogConfig, LogFormat};
use mailstream::{
    consumer, daemon, dead_letters, deliveries, demo, emulator, ingest, kick, pause, schedule, slo, subscribers,
    suppression,
};

#[derive(Parser)]
#[command(
    name = "mailstream",
    version,
    about = "Delivers scheduled and transactional email through Resend, exactly once in effect, on Redis Streams."
)]
struct Cli {
    /// Config file (see the shipped config.toml); accepted before or after the command.
    #[arg(long, short, global = true, env = "MAILSTREAM_CONFIG", default_value = "/etc/mailstream/config.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: read, batch, send, settle, recover; stop on SIGTERM or SIGINT.
    Run,
    /// Validate a config file and exit.
    CheckConfig,
    /// Add or update subscribers in the registry.
    Subscribe(subscribers::Args),
    /// Enqueue a transactional send (a receipt, a reset) in the lane that overtakes
    /// campaigns; at most once per idempotency key. One from flags, or NDJSON items.
    Enqueue(ingest::Args),
    /// Enqueue a campaign period for every eligible subscriber (at most once each).
    Kick(kick::Args),
    /// The next fires of every scheduled campaign, in its zone and in UTC, with the period each kicks.
    Schedule(schedule::Args),
    /// Render the exact email a delivery would be sealed as now, without enqueuing anything.
    Preview(consumer::PreviewArgs),
    /// Look at and requeue deliveries that failed (or whose outcome is unknown).
    DeadLetters {
        #[command(subcommand)]
        action: dead_letters::Command,
    },
    /// The delivery log: who got what, and why not (addresses masked).
    Deliveries(deliveries::Args),
    /// End a quota pause now, on every instance (it also ends when the quota renews).
    Resume,
    /// Moves a deployment of an earlier key layout (2 or 3) to this version's: from 2 it
    /// builds the kick's audience index from the subscriber records. Stop every instance
    /// first.
    Upgrade,
    /// Look at, add and lift address suppressions (bounces, complaints, by hand).
    Suppressions {
        #[command(subcommand)]
        action: suppression::Command,
    },
    /// Report the delivery SLO per campaign period (failure rate against slo.failure_rate,
    /// outcome unknown, stuck). Exit 0: within; 3: objective breached (a warning; stuck
    /// alone counts); 4: could not evaluate (Redis unreachable, no such campaign).
    Slo(slo::Args),
    /// Run the Resend emulator.
    Emulator(emulator::Args),
    /// A full weekly run on the embedded default: private Redis, emulator, N subscribers.
    Demo(demo::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon logs as its config says; the other commands print for people and
    // log only warnings.
    // `run` reads its config once, here, and keeps it.
    let (log, preloaded) = match cli.command {
        Command::Run => match Config::load(&cli.config) {
            Ok(config) => (config.log.clone(), Some(config)),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(2);
            }
        },
        Command::Emulator { .. } => (LogConfig::default(), None),
        _ => (LogConfig { level: "warn".into(), format: LogFormat::Text }, None),
    };
    if let Err(e) = mailstream::logging::init(&log, std::io::stderr, std::io::stderr().is_terminal()) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(cli.config, cli.command, preloaded)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<mailstream::config::ConfigError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Loads the config (but for the emulator and the demo) and runs the command in its room.
async fn execute(path: PathBuf, command: Command, preloaded: Option<Config>) -> anyhow::Result<ExitCode> {
    let config = match (&command, preloaded) {
        (Command::Emulator(_) | Command::Demo(_), _) => None,
        (_, Some(config)) => Some(config),
        (_, None) => Some(Config::load(&path)?),
    };
    let config = || config.expect("loaded for every command that reads it");
    match command {
        Command::Run => daemon::command(config()).await,
        Command::CheckConfig => Ok(mailstream::config::check(&path, &config())),
        Command::Subscribe(args) => subscribers::command(&config(), args).await,
        Command::Enqueue(args) => ingest::command(&config(), args).await,
        Command::Kick(args) => kick::command(&config(), args).await,
        Command::Schedule(args) => schedule::command(&config(), args),
        Command::Preview(args) => consumer::preview_command(&config(), args).await,
        Command::DeadLetters { action } => dead_letters::command(&config(), action).await,
        Command::Deliveries(args) => deliveries::command(&config(), args).await,
        Command::Resume => pause::command(&config()).await,
        Command::Upgrade => daemon::upgrade(&config()).await,
        Command::Suppressions { action } => suppression::command(&config(), action).await,
        Command::Slo(args) => slo::command(&config(), args).await,
        Command::Emulator(args) => emulator::command(args).await,
        Command::Demo(args) => demo::command(args).await,
    }
}
