//! `mailstream vapid-keys`: a VAPID key pair for the Web Push channel.

use anyhow::Context;

use crate::model::webpush::VapidKey;

/// `mailstream vapid-keys --out FILE`: a new key pair, the private key written into a new
/// file only its owner may read, the public key printed.
pub fn command(out: &std::path::Path) -> anyhow::Result<std::process::ExitCode> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (private, key) = VapidKey::generate();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("creating {} (an existing file is never overwritten)", out.display()))?;
    writeln!(file, "{private}")?;
    let _ = crate::cli::outln!("{}", key.public);
    eprintln!("the private key is in {}; the public key above is the applicationServerKey", out.display());
    Ok(std::process::ExitCode::SUCCESS)
}
