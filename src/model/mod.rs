//! The vocabulary every floor shares: values and the pure rules over them, with no I/O
//! and nothing else of the crate imported, so any room may use them.

pub mod address;
pub mod error_name;
pub mod id;
pub mod names;
pub mod outcome;
pub mod period;
pub mod push_endpoint;
pub mod svix;
pub mod webpush;
pub mod work;

/// A value given by whoever runs a command (a flag, a period, a campaign's name) that
/// is refused: a usage error, on which the CLI exits 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadValue(pub String);

/// Input data that is refused (an NDJSON line, a file's content): the CLI exits 65, and
/// nothing of that input was written.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadData(pub String);

/// A duration in whole milliseconds, as Redis's arguments and the scripts take them
/// (saturating: no duration of a config comes near `u64::MAX` ms).
pub fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// This host's clock in milliseconds since the Unix epoch (0 before it): for ids and
/// what only this process compares; leases, pauses and periods use Redis's clock
/// (`store::records::now_ms`).
pub fn local_now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(ms).unwrap_or(0)
}
