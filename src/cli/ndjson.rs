//! An NDJSON input read in two passes and never held whole: a file is read twice; stdin
//! is copied to a private scratch file as it is read the first time (removed after).
//! The first pass checks every line, so a bad line writes nothing; the second writes a
//! batch at a time.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;

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

impl Drop for Input {
    fn drop(&mut self) {
        if self.scratch {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
