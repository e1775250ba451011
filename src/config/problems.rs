//! A config's problems one by one, each with the key it is about and the line of the
//! file that holds it where there is one: what `check-config --json` prints as `errors`.

use std::path::Path;

use serde::Serialize;

use super::ConfigError;

/// One problem with a config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The key (`redis.partitions`, `campaign[0]`), or null for the file as a whole.
    pub key: Option<String>,
    /// The line of the file the key (or the syntax error) is on, from 1; null when the
    /// key is not written in the file (a default) or the problem has no place in it.
    pub line: Option<usize>,
    pub message: String,
}

impl ConfigError {
    /// The problems this error says, with their lines in `text` (the config file's).
    pub fn problems(&self, text: &str) -> Vec<Problem> {
        match self {
            ConfigError::Read { key, path, cause } => {
                let key = (key != "the config file").then(|| key.clone());
                let line = key.as_deref().and_then(|k| line_of(text, k));
                vec![Problem { key, line, message: format!("cannot read {}: {cause}", path.display()) }]
            }
            ConfigError::Syntax { line, key, message, .. } => {
                vec![Problem { key: key.clone(), line: *line, message: message.clone() }]
            }
            ConfigError::Parse(message) => vec![Problem { key: None, line: None, message: message.clone() }],
            ConfigError::Invalid(messages) => messages
                .iter()
                .map(|m| {
                    let key = key_of(m);
                    let line = key.as_deref().and_then(|k| line_of(text, k));
                    let message = match &key {
                        Some(_) => m.split_once(": ").map_or(m.as_str(), |(_, rest)| rest).to_string(),
                        None => m.clone(),
                    };
                    Problem { key, line, message }
                })
                .collect(),
        }
    }
}

/// A TOML syntax or type error of the file at `path`, at its line, with the key it is on.
pub(super) fn syntax(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let line = e.span().map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
    let key = line.and_then(|l| key_at(text, l));
    ConfigError::Syntax { path: path.to_owned(), line, key, message: e.message().trim_end().to_string() }
}

/// The key a validation message is about: what comes before its first `": "` when
/// that reads as a key (`redis.partitions`, `campaign[0] (weekly)`, `templates.x`).
fn key_of(message: &str) -> Option<String> {
    let (head, _) = message.split_once(": ")?;
    let head = head.split(" (").next().unwrap_or(head);
    let keyish = !head.is_empty()
        && head.bytes().all(|b| b.is_ascii_alphanumeric() || b"._[]-".contains(&b))
        && head.bytes().next().is_some_and(|b| b.is_ascii_lowercase());
    keyish.then(|| head.to_string())
}

/// The table a line's header opens (`[a.b]` or `[[a]]`), without brackets.
fn header(line: &str) -> Option<&str> {
    let t = line.trim();
    let inner = t
        .strip_prefix("[[")
        .and_then(|r| r.split("]]").next())
        .or_else(|| t.strip_prefix('[').and_then(|r| r.split(']').next()))?;
    Some(inner.trim())
}

/// The key a line assigns (`name = …`), if it does.
fn assigned(line: &str) -> Option<&str> {
    let t = line.trim_start();
    if t.starts_with('#') || t.starts_with('[') {
        return None;
    }
    let (name, _) = t.split_once('=')?;
    let name = name.trim().trim_matches('"');
    (!name.is_empty()).then_some(name)
}

/// The full key at line `at` (from 1): the key it assigns under its table, or the table
/// its header opens.
fn key_at(text: &str, at: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let line = lines.get(at.checked_sub(1)?)?;
    if let Some(h) = header(line) {
        return Some(h.to_string());
    }
    let table = lines[..at - 1].iter().rev().find_map(|l| header(l));
    let name = assigned(line)?;
    Some(match table {
        Some(t) => format!("{t}.{name}"),
        None => name.to_string(),
    })
}

/// The line (from 1) that writes `key` in `text`: `a.b` is `b = …` under `[a]`, `a` a
/// header `[a]` or a top-level `a = …`, `campaign[i]` the i-th `[[campaign]]` (and
/// `campaign[i].x` its `x = …`).
fn line_of(text: &str, key: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    // `name[i]`: the i-th array-of-tables header of that name.
    let (table, index, rest) = match key.split_once('[') {
        Some((name, tail)) => {
            let (i, rest) = tail.split_once(']')?;
            (name.to_string(), Some(i.parse::<usize>().ok()?), rest.strip_prefix('.').map(str::to_string))
        }
        None => match key.rsplit_once('.') {
            Some((t, name)) => (t.to_string(), None, Some(name.to_string())),
            None => (String::new(), None, Some(key.to_string())),
        },
    };
    let mut seen = 0;
    let mut start = None;
    for (n, line) in lines.iter().enumerate() {
        if header(line) == Some(table.as_str()) {
            if index.is_none_or(|i| i == seen) {
                start = Some(n);
                break;
            }
            seen += 1;
        }
    }
    let from = match (table.is_empty(), start) {
        (true, _) => 0,
        (false, Some(n)) => n + 1,
        // `a.b` may also be a table `[a.b]` of its own.
        (false, None) => return lines.iter().position(|l| header(l) == Some(key)).map(|n| n + 1),
    };
    let Some(name) = rest else { return start.map(|n| n + 1) };
    for (n, line) in lines.iter().enumerate().skip(from) {
        if header(line).is_some() {
            break;
        }
        if assigned(line) == Some(name.as_str()) {
            return Some(n + 1);
        }
    }
    // Not written: the header of its table, when there is one.
    start.map(|n| n + 1).or_else(|| lines.iter().position(|l| header(l) == Some(key)).map(|n| n + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "top = 1\n[redis]\n# partitions = 2\npartitions = 4\n\n[[campaign]]\nname = \"a\"\n\n[[campaign]]\nname = \"b\"\nfrom = \"x\"\n[templates.digest]\nsubject = \"s\"\n";

    #[test]
    fn a_key_is_found_on_its_line() {
        assert_eq!(line_of(TEXT, "top"), Some(1));
        assert_eq!(line_of(TEXT, "redis.partitions"), Some(4));
        assert_eq!(line_of(TEXT, "redis.url"), Some(2), "not written: its table's header");
        assert_eq!(line_of(TEXT, "campaign[1]"), Some(9));
        assert_eq!(line_of(TEXT, "campaign[1].from"), Some(11));
        assert_eq!(line_of(TEXT, "templates.digest"), Some(12));
        assert_eq!(line_of(TEXT, "http.metrics_listen"), None);
    }

    #[test]
    fn a_message_names_its_key() {
        assert_eq!(key_of("redis.partitions: must be 1..=1024 (got 0)").as_deref(), Some("redis.partitions"));
        assert_eq!(key_of("campaign[0] (weekly): its emails would carry …").as_deref(), Some("campaign[0]"));
        assert_eq!(key_of("/etc/x.toml: template \"a\" has no html"), None);
    }

    #[test]
    fn a_syntax_error_names_its_line_and_key() {
        let text = "[redis]\npartitions = \"x\"\n";
        let e = toml::from_str::<super::super::Config>(text).unwrap_err();
        let got = syntax(Path::new("c.toml"), text, &e).problems(text);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].key.as_deref(), got[0].line), (Some("redis.partitions"), Some(2)));
        assert!(got[0].message.contains("expected u16"), "{}", got[0].message);
    }
}
