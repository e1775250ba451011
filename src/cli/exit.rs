//! The one mapping from an error to an exit code, after sysexits.h, for every command:
//! each error class is a type a room returns (or wraps in context), and [`code`] reads
//! the class off the chain. `slo` adds its own 3 and 4 (`cli/slo.rs`).

use crate::audience::kick::PeriodClosed;
use crate::config::ConfigError;
use crate::http::server::AddressInUse;
use crate::model::{BadData, BadValue};
use crate::ops::suppression_sync::ProviderUnreachable;
use crate::store::{NoDeployment, Unfit};

use super::{CannotCreate, NoInput};

/// Done.
pub const OK: u8 = 0;
/// Refused in part (some items of many), or failed otherwise.
pub const FAILED: u8 = 1;
/// Usage: an unknown command or flag, a bad value (whoever parses it).
pub const USAGE: u8 = 64;
/// Bad input data: an NDJSON line, a file's content.
pub const DATA: u8 = 65;
/// An input file that does not exist or cannot be read.
pub const NO_INPUT: u8 = 66;
/// Redis or the provider unreachable or not answering; a listen address still in use
/// after `http.bind_retry_seconds`.
pub const UNAVAILABLE: u8 = 69;
/// An output file that cannot be created.
pub const CANNOT_CREATE: u8 = 73;
/// Configuration: the file, a secret, or what the deployment under the prefix refuses
/// (durability, key layout, partition count, no deployment).
pub const CONFIG: u8 = 78;

/// Whether `e` is of class `T`: its outermost error, a context it carries, or a cause.
fn is<T: std::error::Error + Send + Sync + 'static>(e: &anyhow::Error) -> bool {
    e.downcast_ref::<T>().is_some() || e.chain().any(|c| c.is::<T>())
}

/// The exit code of a command that failed with `e`.
pub fn code(e: &anyhow::Error) -> u8 {
    if is::<ConfigError>(e) || is::<NoDeployment>(e) || is::<Unfit>(e) {
        CONFIG
    } else if is::<BadValue>(e) || is::<PeriodClosed>(e) {
        USAGE
    } else if is::<BadData>(e) {
        DATA
    } else if is::<NoInput>(e) {
        NO_INPUT
    } else if is::<CannotCreate>(e) {
        CANNOT_CREATE
    } else if is::<AddressInUse>(e) || is::<ProviderUnreachable>(e) || crate::store::unavailable(e) {
        UNAVAILABLE
    } else {
        FAILED
    }
}

/// The table people read (`--help`, docs/operations.md): the codes above, in words.
pub const TABLE: &str = "Exit codes: 0 done; 1 failed, or refused in part (see the message); \
64 usage (an unknown command or flag, a bad value); 65 bad input data (an NDJSON line, a file's content); \
66 an input file cannot be read; \
69 Redis or the provider unreachable or not answering, or a listen address still in use after \
http.bind_retry_seconds; 73 an output file cannot be created; \
78 configuration (an unreadable or invalid config, a secret run needs, a secret file that cannot be read, \
what the deployment under the prefix refuses: durability, key layout, partition count, no deployment). \
`mailstream slo` exits 3 when an objective is breached and 4 when it cannot be evaluated.";

#[cfg(test)]
mod tests {
    use super::*;

    /// Each class maps to its code wherever it sits in the chain (a room adds context).
    #[test]
    fn each_class_has_its_code_under_context() {
        use anyhow::Context;
        let cases: Vec<(anyhow::Error, u8)> = vec![
            (BadValue("x".into()).into(), USAGE),
            (BadData("x".into()).into(), DATA),
            (NoInput("x".into()).into(), NO_INPUT),
            (CannotCreate("x".into()).into(), CANNOT_CREATE),
            (AddressInUse("x".into()).into(), UNAVAILABLE),
            (ProviderUnreachable("x".into()).into(), UNAVAILABLE),
            (crate::store::Unreachable("x".into()).into(), UNAVAILABLE),
            (ConfigError::Parse("x".into()).into(), CONFIG),
            (Unfit("x".into()).into(), CONFIG),
            (NoDeployment { prefix: "p".into() }.into(), CONFIG),
            (anyhow::anyhow!("anything else"), FAILED),
        ];
        for (e, want) in cases {
            let shown = format!("{e}");
            assert_eq!(code(&e), want, "{shown}");
            let wrapped = Err::<(), _>(e).context("while doing something").unwrap_err();
            assert_eq!(code(&wrapped), want, "{shown} under context");
        }
    }

    /// The table says every code the mapping returns.
    #[test]
    fn the_table_names_every_code() {
        for c in [FAILED, USAGE, DATA, NO_INPUT, UNAVAILABLE, CANNOT_CREATE, CONFIG] {
            assert!(TABLE.contains(&format!(" {c} ")), "{c}");
        }
    }
}
