//! The `mailstream` command line: the arguments (clap), one file per command (its
//! `Args` and the function that runs it and prints for people or as JSON), what the
//! commands share (a file or stdin, the report on stdout or stderr), and the one
//! mapping from an error to an exit code. The work is done by the library's rooms.

mod check_config;
mod dead_letters;
mod deliveries;
mod demo;
mod emulator;
mod enqueue;
pub mod exit;
mod generate;
mod kick;
mod ndjson;
mod preview;
mod resume;
mod run;
mod schedule;
mod slo;
mod subscribe;
mod suppressions;
mod upgrade;
mod vapid_keys;

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand};

use crate::config::{Config, LogConfig, LogFormat};

pub use crate::model::BadValue;

/// Reads a file, or stdin for `-`: [`NoInput`] when it cannot be read, [`BadData`]
/// when it is not UTF-8.
pub(crate) fn read_source(source: &str) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    let read = if source == "-" {
        std::io::stdin().read_to_end(&mut bytes).map(|_| ())
    } else {
        std::fs::File::open(Path::new(source)).and_then(|mut f| f.read_to_end(&mut bytes)).map(|_| ())
    };
    let name = if source == "-" { "stdin" } else { source };
    read.map_err(|e| NoInput(format!("cannot read {name}: {e}")))?;
    String::from_utf8(bytes).map_err(|e| {
        crate::model::BadData(format!("{name}: not UTF-8 (byte {} is not)", e.utf8_error().valid_up_to())).into()
    })
}

/// An input file that cannot be read (it does not exist, or may not be read): the CLI
/// exits 66, as sysexits.h's EX_NOINPUT.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NoInput(pub String);

/// An output file that cannot be created (it exists, or its folder does not): the CLI
/// exits 73, as sysexits.h's EX_CANTCREAT.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CannotCreate(pub String);

/// Set once stdout's reader has gone (`| head -1`) or stdout cannot be written.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
/// Set when a write to stdout failed otherwise (not a reader gone): the output is lost,
/// so the command does not exit 0.
static STDOUT_FAILED: AtomicBool = AtomicBool::new(false);

/// Stdout's reader has gone: what a read-only command had left to print has nobody to
/// read it, so it stops there and exits 0, quietly. A command that writes to Redis
/// ignores it and finishes its writes (see [`main`]).
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
pub(crate) struct StdoutClosed;

/// One line on stdout, never a panic: once the reader has gone (EPIPE) this and every
/// later line is dropped and [`StdoutClosed`] returned. Another write error (a full disk
/// under a redirect) is said once on stderr and ends the output the same way.
pub(crate) fn out(text: impl std::fmt::Display) -> Result<(), StdoutClosed> {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return Err(StdoutClosed);
    }
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) => {
            if !STDOUT_CLOSED.swap(true, Ordering::Relaxed) && e.kind() != std::io::ErrorKind::BrokenPipe {
                STDOUT_FAILED.store(true, Ordering::Relaxed);
                eprintln!("error: writing to stdout: {e}");
            }
            Err(StdoutClosed)
        }
    }
}

/// `println!` that never panics: [`out`] with format arguments.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::out(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Where a command's report goes. With `--json`: the object (or one per line, where a
/// command documents that) on stdout, and the lines for people on stderr, so stdout
/// pipes into `jq`. Without: the lines on stdout and no JSON.
#[derive(Clone, Copy)]
pub(crate) struct Report {
    pub json: bool,
}

impl Report {
    /// A line for people.
    /// A line for people. (A closed stdout is not an error here: the commands that
    /// report this way go on to the end of their work.)
    pub fn line(&self, text: impl std::fmt::Display) {
        if self.json {
            eprintln!("{text}");
        } else {
            let _ = out(text);
        }
    }

    /// The machine's copy: printed with `--json` only, as one line.
    pub fn object(&self, value: &impl serde::Serialize) -> anyhow::Result<()> {
        if self.json {
            let _ = out(serde_json::to_string(value)?);
        }
        Ok(())
    }
}

#[derive(Parser)]
#[command(
    name = "mailstream",
    version,
    about = "Delivers scheduled and transactional email through Resend, exactly once in effect, on Redis Streams.",
    after_help = exit::TABLE
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The config file, for every command that reads one.
#[derive(clap::Args)]
struct At {
    /// Config file (see the shipped config.toml).
    #[arg(long, short, env = "MAILSTREAM_CONFIG", default_value = "/etc/mailstream/config.toml")]
    config: PathBuf,
}

/// The config file of a command with subcommands, accepted after either.
#[derive(clap::Args)]
struct AtAny {
    /// Config file (see the shipped config.toml).
    #[arg(long, short, global = true, env = "MAILSTREAM_CONFIG", default_value = "/etc/mailstream/config.toml")]
    config: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: read, batch, send, settle, recover; stop on SIGTERM or SIGINT.
    Run(At),
    /// Validate a config file and the secrets `run` needs, say which features it turns
    /// on, and exit.
    CheckConfig {
        #[command(flatten)]
        at: At,
        /// One JSON object on stdout: `ok`, `errors` (each `key`, `line`, `message`), the
        /// counts, `features` and `warnings`; printed on a refusal too.
        #[arg(long)]
        json: bool,
        /// Skip the secrets only `run` needs (the Resend API key): for a host that only
        /// kicks, subscribes or enqueues.
        #[arg(long)]
        offline: bool,
    },
    /// Add subscribers to the registry, or change the fields given of one.
    Subscribe {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        args: subscribe::Args,
    },
    /// Enqueue a transactional send (a receipt, a reset) in the lane that overtakes
    /// campaigns; at most once per idempotency key. One from flags, or NDJSON items.
    Enqueue {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        args: enqueue::Args,
    },
    /// Enqueue a campaign period for every eligible subscriber (at most once each).
    Kick {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        args: kick::Args,
    },
    /// The next fires of every scheduled campaign, in its zone and in UTC, with the period each kicks.
    Schedule {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        args: schedule::Args,
    },
    /// Render the exact email a delivery would be sealed as now, without enqueuing anything.
    Preview {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        args: preview::Args,
    },
    /// Look at and requeue deliveries that failed (or whose outcome is unknown).
    DeadLetters {
        #[command(flatten)]
        at: AtAny,
        #[command(subcommand)]
        action: dead_letters::DeadLettersCommand,
    },
    /// The delivery log: who got what, and why not (addresses masked).
    Deliveries {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        args: deliveries::Args,
    },
    /// End a quota pause now, on every instance (it also ends when the quota renews).
    Resume {
        #[command(flatten)]
        at: At,
        /// One JSON object on stdout: `{"resumed": bool}`.
        #[arg(long)]
        json: bool,
    },
    /// Moves a deployment of an earlier key layout (2 to 6) to this version's: from 2 it
    /// builds the kick's audience index from the subscriber records; settled records of an
    /// earlier layout stay as they are and expire with the retention. Stop every instance
    /// first.
    Upgrade {
        #[command(flatten)]
        at: At,
        /// One JSON object on stdout: `upgraded_from` (the layout before, or null when
        /// there was nothing to upgrade), `layout`, `audience_subscribers` (when the
        /// kick's audience was built, else null).
        #[arg(long)]
        json: bool,
    },
    /// Look at, add and lift address suppressions (bounces, complaints, by hand).
    Suppressions {
        #[command(flatten)]
        at: AtAny,
        #[command(subcommand)]
        action: suppressions::SuppressionsCommand,
    },
    /// Report the delivery SLO per campaign period (failure rate against slo.failure_rate,
    /// outcome unknown, stuck). Exit 0: within; 3: objective breached (a warning; stuck
    /// alone counts); 4: could not evaluate (Redis unreachable, no such campaign, no campaign
    /// period under this prefix: a mistyped prefix or Redis). --mail also enqueues it by
    /// email to [operators] to.
    Slo {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        args: slo::Args,
    },
    /// Make a VAPID key pair for the Web Push channel: the private key into a new file
    /// (mode 0600; point channels.push.vapid_private_key_file or the credential
    /// vapid_private_key at it), the public key on stdout (the application's
    /// applicationServerKey, for `pushManager.subscribe`).
    VapidKeys {
        /// Where the private key goes (refused if it exists).
        #[arg(long)]
        out: PathBuf,
        /// One JSON object on stdout: `public_key` and `private_key_file` (without it,
        /// only the public key is printed).
        #[arg(long)]
        json: bool,
    },
    /// Print the shell completion script (`mailstream completions bash >
    /// /etc/bash_completion.d/mailstream`).
    Completions {
        /// The shell: bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// Print the manual page, roff (`mailstream man | man -l -`), of mailstream or of one
    /// of its commands.
    Man {
        /// A command (`kick`) for its own page, `mailstream-kick(1)`.
        command: Option<String>,
    },
    /// Run the Resend emulator.
    Emulator(emulator::Args),
    /// A full weekly run on the embedded default: private Redis, emulator, N subscribers.
    Demo(demo::Args),
}

impl Command {
    /// The config file the command reads; `None` for those that read none.
    fn config_path(&self) -> Option<&PathBuf> {
        use Command::*;
        match self {
            Run(at) => Some(&at.config),
            Resume { at, .. } | Upgrade { at, .. } => Some(&at.config),
            Subscribe { at, .. }
            | Enqueue { at, .. }
            | Kick { at, .. }
            | Schedule { at, .. }
            | Preview { at, .. }
            | Deliveries { at, .. }
            | Slo { at, .. } => Some(&at.config),
            DeadLetters { at, .. } | Suppressions { at, .. } => Some(&at.config),
            // check-config loads its config itself: it reports a refusal its own way.
            CheckConfig { .. } | Emulator(_) | Demo(_) | VapidKeys { .. } | Completions { .. } | Man { .. } => None,
        }
    }
}

impl Command {
    /// Whether the command makes email (enqueues it, or shows it as it would be sealed):
    /// it refuses what `run` refuses of the config beyond the file itself
    /// ([`Config::check_sending`]). The rest skip that check: they read or change the
    /// registry and the log, and an operator may need them while the config is being fixed.
    fn makes_email(&self) -> bool {
        matches!(self, Command::Kick { .. } | Command::Preview { .. } | Command::Enqueue { .. })
    }

    /// Whether the command only reads (Redis, files): one whose stdout is closed ends
    /// quietly; one that writes says on stderr that its report was cut, not its writes.
    fn reads_only(&self) -> bool {
        use Command::*;
        match self {
            CheckConfig { .. } | Schedule { .. } | Preview { .. } | Deliveries { .. } => true,
            Completions { .. } | Man { .. } => true,
            Kick { args, .. } => args.dry_run,
            DeadLetters { action, .. } => matches!(action, dead_letters::DeadLettersCommand::List { .. }),
            Suppressions { action, .. } => match action {
                suppressions::SuppressionsCommand::List { .. } => true,
                suppressions::SuppressionsCommand::Sync { dry_run, .. } => *dry_run,
                _ => false,
            },
            Slo { args, .. } => !args.mail,
            Run(_) | Subscribe { .. } | Enqueue { .. } | Resume { .. } | Upgrade { .. } | VapidKeys { .. } => false,
            Emulator(_) | Demo(_) => false,
        }
    }
}

/// The command line's definition (every command and flag), for the tests that walk it.
pub fn definition() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The `mailstream` command: parses the arguments, sets up logging and runs the command.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(exit::USAGE) } else { ExitCode::SUCCESS };
        }
    };
    // The daemon logs as its config says (its refusals too, as log lines: JSON under
    // systemd); the other commands print for people and log only warnings.
    // `run` reads its config once, here, and keeps it.
    let daemon = matches!(cli.command, Command::Run(_));
    let (log, preloaded, unloadable) = match &cli.command {
        Command::Run(at) => match Config::load(&at.config) {
            Ok(config) => (config.log.clone(), Some(config), None),
            Err(e) => (LogConfig::default(), None, Some(e)),
        },
        Command::Emulator { .. } => (LogConfig::default(), None, None),
        _ => (LogConfig { level: "warn".into(), format: LogFormat::Text }, None, None),
    };
    if let Err(e) = crate::ops::logging::init(&log, std::io::stderr, std::io::stderr().is_terminal()) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    if let Some(e) = unloadable {
        return fatal(daemon, &e.into());
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let reads_only = cli.command.reads_only();
    let result = runtime.block_on(execute(cli.command, preloaded));
    if STDOUT_CLOSED.load(Ordering::Relaxed) && !reads_only {
        eprintln!("note: stdout was closed before the whole report was printed; the writes went on to the end");
    }
    let failed = STDOUT_FAILED.load(Ordering::Relaxed);
    match result {
        Ok(_) if failed => ExitCode::FAILURE,
        Ok(code) => code,
        Err(e) if e.downcast_ref::<StdoutClosed>().is_some() => {
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fatal(daemon, &e),
    }
}

/// Says why a command failed, and its exit code: on stderr for people, or, for the
/// daemon, as its last log line (JSON where its log is JSON).
fn fatal(daemon: bool, e: &anyhow::Error) -> ExitCode {
    let code = exit::code(e);
    // (A log filtered to nothing still gets its refusal said.)
    if daemon && tracing::enabled!(tracing::Level::ERROR) {
        tracing::error!(exit_code = code, "{e:#}");
    } else {
        eprintln!("error: {e:#}");
    }
    ExitCode::from(code)
}

/// Loads the config (but for the emulator and the demo) and runs the command in its room.
async fn execute(command: Command, preloaded: Option<Config>) -> anyhow::Result<ExitCode> {
    let config = match (command.config_path(), preloaded) {
        (None, _) => None,
        (Some(_), Some(config)) => Some(config),
        (Some(path), None) => Some(Config::load(path)?),
    };
    // Its refusals only: its warnings are check-config's and run's to say.
    if let Some(config) = &config
        && command.makes_email()
    {
        config.check_sending()?;
    }
    let config = || config.expect("loaded for every command that reads it");
    match command {
        Command::Run(_) => run::command(config()).await,
        Command::CheckConfig { at, json, offline } => check_config::command(&at.config, json, offline),
        Command::Subscribe { args, .. } => subscribe::command(&config(), args).await,
        Command::Enqueue { args, .. } => enqueue::command(&config(), args).await,
        Command::Kick { args, .. } => kick::command(&config(), args).await,
        Command::Schedule { args, .. } => schedule::command(&config(), args),
        Command::Preview { args, .. } => preview::command(&config(), args).await,
        Command::DeadLetters { action, .. } => dead_letters::command(&config(), action).await,
        Command::Deliveries { args, .. } => deliveries::command(&config(), args).await,
        Command::Resume { json, .. } => resume::command(&config(), json).await,
        Command::Upgrade { json, .. } => upgrade::command(&config(), json).await,
        Command::Suppressions { action, .. } => suppressions::command(&config(), action).await,
        Command::Slo { args, .. } if args.mail => slo::mail(&config(), args.json).await,
        Command::Slo { args, .. } => slo::command(&config(), args).await,
        Command::VapidKeys { out, json } => vapid_keys::command(&out, json),
        Command::Completions { shell } => generate::completions(shell),
        Command::Man { command } => generate::man(command.as_deref()),
        Command::Emulator(args) => emulator::command(args).await,
        Command::Demo(args) => demo::command(args).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every argument of every command says what it is for in `--help`.
    #[test]
    fn every_flag_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = ["help", "version"].contains(&arg.get_id().as_str());
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} --{}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "mailstream", &mut missing);
        assert!(missing.is_empty(), "arguments without help text:\n{}", missing.join("\n"));
    }

    /// The emulator, the demo, vapid-keys, completions and man read no config file, so
    /// they do not offer `--config`.
    #[test]
    fn only_commands_that_read_a_config_offer_it() {
        let cli = Cli::command();
        for sub in cli.get_subcommands() {
            let offers = sub.get_arguments().any(|a| a.get_id() == "config");
            let reads = !["emulator", "demo", "vapid-keys", "completions", "man"].contains(&sub.get_name());
            assert_eq!(offers, reads, "{}", sub.get_name());
        }
    }

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
