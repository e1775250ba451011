//! An NDJSON input read in two passes and never held whole: a file is read twice; stdin
//! is copied to a private scratch file as it is read the first time (removed after).
//! The first pass checks every line, so a bad line writes nothing; the second writes a
//! batch at a time.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;

use crate::audience::subscribers::{Subscriber, record};
use crate::model::BadData;

use super::NoInput;

/// A readable NDJSON source.
pub struct Input {
    path: PathBuf,
    /// The name errors give it (`stdin`, or the path as given).
    name: String,
    /// A scratch copy of stdin, removed when the input is dropped.
    scratch: bool,
}

impl Input {
    /// `source` (a path, or `-` for stdin, copied to a scratch file).
    pub fn open(source: &str) -> anyhow::Result<Input> {
        if source != "-" {
            File::open(source).map_err(|e| NoInput(format!("cannot read {source}: {e}")))?;
            return Ok(Input { path: PathBuf::from(source), name: source.to_string(), scratch: false });
        }
        let path =
            std::env::temp_dir().join(format!("mailstream-stdin-{}-{}", std::process::id(), rand::random::<u64>()));
        let input = Input { path, name: "stdin".into(), scratch: true };
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut copy = options.open(&input.path)?;
        let mut stdin = std::io::stdin().lock();
        let mut buffer = vec![0u8; 1 << 16];
        loop {
            let n = stdin.read(&mut buffer).map_err(|e| NoInput(format!("cannot read stdin: {e}")))?;
            if n == 0 {
                break;
            }
            copy.write_all(&buffer[..n])?;
        }
        copy.flush()?;
        Ok(input)
    }

    /// Every non-blank line with its number (from 1); a line that is not UTF-8 is
    /// [`BadData`] naming it.
    pub fn lines(&self) -> anyhow::Result<impl Iterator<Item = Result<(usize, String), BadData>> + '_> {
        let file = File::open(&self.path).map_err(|e| NoInput(format!("cannot read {}: {e}", self.name)))?;
        let mut reader = BufReader::with_capacity(1 << 16, file);
        let mut n = 0;
        let mut done = false;
        Ok(std::iter::from_fn(move || {
            loop {
                if done {
                    return None;
                }
                let mut bytes = Vec::new();
                n += 1;
                match reader.read_until(b'\n', &mut bytes) {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(e) => {
                        done = true;
                        return Some(Err(BadData(format!("{}: line {n}: cannot be read: {e}", self.name))));
                    }
                }
                let Ok(line) = String::from_utf8(bytes) else {
                    done = true;
                    return Some(Err(BadData(format!("{}: line {n}: not UTF-8", self.name))));
                };
                if !line.trim().is_empty() {
                    return Some(Ok((n, line)));
                }
            }
        }))
    }
}

/// Subscriber records handed on per batch by [`Input::in_batches`]: what an import holds
/// in memory at once.
const BATCH: usize = 1000;

impl Input {
    /// Checks every subscriber record (the first pass: nothing is kept); their count.
    pub fn check_records(&self, max_data_bytes: usize) -> anyhow::Result<u64> {
        let mut count = 0;
        for line in self.lines()? {
            let (n, line) = line?;
            record(&line, max_data_bytes).map_err(|why| BadData(format!("line {n}: {why}")))?;
            count += 1;
        }
        Ok(count)
    }

    /// Hands the records (checked by [`Input::check_records`], `count` of them) to
    /// `write` a batch at a time, with a progress bar named `what` when stderr is a
    /// terminal (nothing otherwise).
    pub async fn in_batches(
        &self,
        max_data_bytes: usize,
        count: u64,
        what: &str,
        mut write: impl AsyncFnMut(&[Subscriber]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        use std::io::IsTerminal;
        let bar = (std::io::stderr().is_terminal() && count >= BATCH as u64).then(|| {
            let bar = indicatif::ProgressBar::new(count);
            let template = format!("{what} [{{bar:40}}] {{pos}}/{{len}} records, {{per_sec}}, ETA {{eta}}");
            let style = indicatif::ProgressStyle::with_template(&template);
            bar.set_style(style.unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()).progress_chars("=> "));
            bar
        });
        let mut batch = Vec::with_capacity(BATCH);
        let mut lines = self.lines()?.peekable();
        while lines.peek().is_some() {
            batch.clear();
            for line in lines.by_ref().take(BATCH) {
                let (n, line) = line?;
                // Checked in the first pass; a file changed since is refused here, mid-way.
                batch.push(record(&line, max_data_bytes).map_err(|why| BadData(format!("line {n}: {why}")))?);
            }
            write(&batch).await?;
            if let Some(bar) = &bar {
                bar.inc(batch.len() as u64);
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        Ok(())
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        if self.scratch {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
