//! `mailstream vapid-keys`: a VAPID key pair for the Web Push channel.

use anyhow::Context;

use crate::model::webpush::VapidKey;

/// `mailstream vapid-keys --out FILE`: a new key pair, the private key written into a new
/// file only its owner may read, the public key printed.
pub fn command(out: &std::path::Path, json: bool) -> anyhow::Result<std::process::ExitCode> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (private, key) = VapidKey::generate();
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(out).map_err(|e| {
        crate::cli::CannotCreate(format!("creating {}: {e} (an existing file is never overwritten)", out.display()))
    })?;
    writeln!(file, "{private}").with_context(|| format!("writing {}", out.display()))?;
    if json {
        let _ = crate::cli::outln!("{}", serde_json::json!({ "public_key": key.public, "private_key_file": out }));
    } else {
        let _ = crate::cli::outln!("{}", key.public);
    }
    eprintln!("the private key is in {}; the public key is the applicationServerKey", out.display());
    Ok(std::process::ExitCode::SUCCESS)
}
