//! `mailstream emulator`: the emulator as a process of its own, on a port, until a signal.

use crate::tools::emulator::{Emulator, EmulatorConfig};

/// `mailstream emulator`.
#[derive(clap::Args)]
pub struct Args {
    /// Where to listen (point resend.base_url at it).
    #[arg(long, default_value = "127.0.0.1:3030")]
    listen: std::net::SocketAddr,
    /// Team rate limit (requests per sliding second), 0 for none; overrides the
    /// settings file (default 10).
    #[arg(long)]
    rps: Option<u32>,
    /// TOML file with emulator settings and faults (see EmulatorConfig).
    #[arg(long)]
    settings: Option<std::path::PathBuf>,
    /// Read nothing from a new connection for this many ms (a slow TLS handshake).
    #[arg(long)]
    connect_delay_ms: Option<u64>,
    /// Close keep-alive connections this many ms after they were opened.
    #[arg(long)]
    close_idle_after_ms: Option<u64>,
    /// Refuse mail from this `from` domain as Resend does an unverified one (403
    /// `validation_error`); repeat for more.
    #[arg(long, value_name = "DOMAIN")]
    reject_from_domain: Vec<String>,
}

/// Serves the emulator until SIGTERM or SIGINT.
pub async fn command(args: Args) -> anyhow::Result<std::process::ExitCode> {
    use anyhow::Context;
    let Args { listen, rps, settings, connect_delay_ms, close_idle_after_ms, reject_from_domain } = args;
    let mut config = match settings {
        Some(path) => {
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            toml::from_str::<EmulatorConfig>(&text).with_context(|| format!("{}", path.display()))?
        }
        None => EmulatorConfig::default(),
    };
    if let Some(rps) = rps {
        config.requests_per_second = (rps > 0).then_some(rps);
    }
    config.connect_delay_ms = connect_delay_ms.unwrap_or(config.connect_delay_ms);
    config.close_idle_after_ms = close_idle_after_ms.or(config.close_idle_after_ms);
    config.faults.rejected_sender_domains.extend(reject_from_domain);
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let listen = listener.local_addr().context("the bound address")?;
    // A number, or no field when there is no limit.
    tracing::info!(%listen, rps = config.requests_per_second, "Resend emulator listening");
    let shutdown = crate::shutdown::on_signals().context("installing the signal handlers")?;
    Emulator::new(config).serve(listener, shutdown).await;
    Ok(std::process::ExitCode::SUCCESS)
}
