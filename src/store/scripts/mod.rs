//! The Lua scripts (embedded with `include_str!`, each behind `lua/prelude.lua`) as
//! typed calls, one file per aggregate: `deliveries` (enqueue, claim, decide, hand
//! back, renew), `batches` (seal, last gate, take, reschedule, fallback, settle), `fanout`,
//! `suppression` (and webhook events, one-click opt-out), `ops` (the quota pause, the
//! provider's health, the request limiter, idle consumers). Each call touches the keys of
//! one partition only; `EVALSHA` falls back to loading the script after `NOSCRIPT` (a
//! restarted Redis), which the redis crate handles. A reply a call does not expect is an
//! error, never a guessed state.
//!
//! The boundary is named at both ends. Each script's header says its KEYS and ARGV (the
//! source of truth), and the one typed call that runs it restates them in its doc comment
//! (a test holds the two together); the script's first step is `arity` (prelude), which
//! errors unless the call brings the head of keys and arguments and a whole number of items
//! (the same number on both sides), and it reads records by field name (`hmget`).

mod batches;
mod deliveries;
mod fanout;
mod ops;
mod suppression;

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{RedisResult, Script};

pub use self::batches::*;
pub use self::deliveries::*;
pub use self::fanout::*;
pub use self::ops::*;
pub use self::suppression::*;
use crate::store::keys::Keys;

/// Declares every script once: its field, its file `lua/<name>.lua` (behind the prelude),
/// and its place in [`load_all`].
macro_rules! scripts {
    ($($name:ident),* $(,)?) => {
        struct Scripts {
            $($name: Script,)*
        }

        static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
            $($name: Script::new(concat!(
                include_str!("../../../lua/prelude.lua"),
                include_str!(concat!("../../../lua/", stringify!($name), ".lua"))
            )),)*
        });

        /// Every script of this file.
        fn every() -> Vec<&'static Script> {
            let s = &*SCRIPTS;
            vec![$(&s.$name,)*]
        }

        /// Every script's name: its file is `lua/<name>.lua`.
        pub const NAMES: &[&str] = &[$(stringify!($name),)*];
    };
}

scripts!(
    enqueue, ingest, defer, claim, seal, gate, take, reschedule, settle, decide, requeue, release, renew, pause,
    forget, suppress, cascade, event, optout, due, fanout, health, wake, fallback, note, window, limiter,
);

/// The prelude every script of `lua/` is joined to (for a script run by another tool,
/// such as redis-benchmark in the benches).
pub const PRELUDE: &str = include_str!("../../../lua/prelude.lua");

/// Loads every script (on every primary of a cluster: SCRIPT LOAD goes to all), so
/// one that does not compile stops the start, and the first calls need no NOSCRIPT
/// round trip. Returns how many.
pub(crate) async fn load_all(conn: &mut impl ConnectionLike) -> RedisResult<usize> {
    let ours = every();
    for script in &ours {
        script.load_async(conn).await?;
    }
    Ok(ours.len())
}

/// A reply a script's caller does not know: an error, never a guessed state.
fn unexpected(script: &str, reply: &str) -> redis::RedisError {
    let detail = format!("{script} answered {reply:?}");
    redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "unexpected script reply", detail))
}

/// A 0/1 answer (`name` for the error).
fn flag(name: &str, n: i64) -> RedisResult<bool> {
    match n {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(unexpected(name, &n.to_string())),
    }
}

/// Distinct counts keys for `members`, and each member's 1-based index into them.
fn counts_index<'a>(
    keys: &Keys,
    partition: u16,
    members: impl Iterator<Item = &'a crate::model::work::DeliveryRef>,
) -> (Vec<String>, Vec<usize>) {
    let mut distinct: HashMap<(&str, &str, crate::model::work::Channel), usize> = HashMap::new();
    let mut names = Vec::new();
    let index = members
        .map(|d| {
            *distinct.entry((&d.campaign, &d.period, d.channel)).or_insert_with(|| {
                names.push(keys.channel_counts(partition, &d.campaign, &d.period, d.channel));
                names.len()
            })
        })
        .collect();
    (names, index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each typed call's reading of its script's reply, fed a reply it does not expect:
    /// an error every time, never a state.
    #[test]
    fn the_prelude_keeps_as_many_recent_settlements_as_the_log_expects() {
        let line = format!("local RECENT_KEEP = {}\n", crate::store::keys::RECENT_KEEP);
        assert!(PRELUDE.contains(&line), "lua/prelude.lua and keys::RECENT_KEEP differ");
    }

    #[test]
    fn every_typed_call_refuses_a_reply_it_does_not_expect() {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        assert!(flag("x.lua", 2).is_err());
        assert!(deliveries::read_added("ok", 9, vec![1, 0, 7], 3).is_err(), "enqueue");
        assert!(deliveries::read_added("ok", 9, vec![1], 2).is_err(), "enqueue");
        assert!(deliveries::read_added("closed", 9, vec![1], 1).is_err(), "enqueue");
        assert!(deliveries::read_added("shut", 9, vec![], 1).is_err(), "enqueue");
        assert!(deliveries::read_window("ajar", 9).is_err(), "window");
        assert!(deliveries::read_ingested(vec![("maybe".into(), "id".into())]).is_err(), "ingest");
        assert!(deliveries::read_deferred(vec![-3]).is_err(), "defer");
        assert!(deliveries::read_claim(Vec::new()).is_err(), "claim");
        assert!(deliveries::read_claim(strings(&["claimed", "many"])).is_err(), "claim");
        assert!(deliveries::read_decided(vec![1, 5]).is_err(), "decide");
        assert!(deliveries::read_requeue("").is_err(), "requeue");
        assert!(fanout::read_acquire(strings(&["taken"])).is_err(), "fanout");
        assert!(fanout::read_acquire(strings(&["acquired", "1", "x"])).is_err(), "fanout");
        assert!(batches::read_seal(vec![0]).is_err(), "seal");
        assert!(batches::read_gate(strings(&["go", "x"])).is_err(), "gate");
        assert!(batches::read_gate(strings(&["sideways"])).is_err(), "gate");
        assert!(batches::read_take(strings(&["take", "k", "body"])).is_err(), "take");
        assert!(batches::read_reschedule(-2).is_err(), "reschedule");
        assert!(batches::read_fallback("sideways", String::new()).is_err(), "fallback");
        assert!(batches::read_settle("partly".into(), Vec::new()).is_err(), "settle");
        assert!(batches::read_settle("ok".into(), strings(&["delivered"])).is_err(), "settle");
        assert!(suppression::read_suppress(strings(&["maybe"])).is_err(), "suppress");
        assert!(suppression::read_suppress(Vec::new()).is_err(), "suppress");
        assert!(suppression::read_cascade(-2).is_err(), "cascade");
        assert!(suppression::read_event(7).is_err(), "event");
        assert!(suppression::read_opt_out(3).is_err(), "optout");
        // And what they do expect still reads.
        assert_eq!(deliveries::read_added("ok", 9, vec![1, 0], 2).unwrap(), Enqueued::Added(vec![true, false]));
        assert_eq!(deliveries::read_added("closed", 9, vec![], 2).unwrap(), Enqueued::Closed { kick_until_ms: 9 });
        assert_eq!(deliveries::read_window("closed", 9).unwrap(), Err(9));
        assert_eq!(batches::read_gate(strings(&["not_held"])).unwrap(), Gate::NotHeld);
    }
}
