//! What the commands share: `main.rs` parses the arguments, and each command's own
//! room (`kick::command`, `ingest::command`, …) does the work and prints for people.

use std::io::Read;
use std::path::Path;

use anyhow::Context;

/// Reads a file, or stdin for `-`.
pub(crate) fn read_source(source: &str) -> anyhow::Result<String> {
    if source == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading stdin")?;
        Ok(text)
    } else {
        std::fs::read_to_string(Path::new(source)).with_context(|| format!("reading {source}"))
    }
}
