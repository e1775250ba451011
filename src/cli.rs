//! What the commands share: `main.rs` parses the arguments, and each command's own
//! room (`kick::command`, `ingest::command`, …) does the work and prints for people.

use std::io::Read;
use std::path::Path;

use anyhow::Context;

/// A value given on the command line that is refused (a usage error: the CLI exits 64).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadValue(pub String);

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

/// Where a command's report goes. With `--json`: the object (or one per line, where a
/// command documents that) on stdout, and the lines for people on stderr, so stdout
/// pipes into `jq`. Without: the lines on stdout and no JSON.
#[derive(Clone, Copy)]
pub(crate) struct Report {
    pub json: bool,
}

impl Report {
    /// A line for people.
    pub fn line(&self, text: impl std::fmt::Display) {
        if self.json {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }

    /// The machine's copy: printed with `--json` only, as one line.
    pub fn object(&self, value: &impl serde::Serialize) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(value)?);
        }
        Ok(())
    }
}
