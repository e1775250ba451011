//! The Rust↔Lua boundary, named at both ends. Every script of `lua/` but the prelude is
//! in the one list (`store::scripts::NAMES`), checks the shape of its call first
//! (`arity`, prelude) and reads records by field name (`hmget`), never by position; the
//! typed call that runs it restates its KEYS and ARGV as the script's header says them;
//! and, against a real Redis, a call with one key or one argument too many or too few is
//! an error that writes nothing, for every script.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use mailstream::store::redis_server::{RedisOptions, RedisServer};
use mailstream::store::scripts::{NAMES, PRELUDE};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script_text(name: &str) -> String {
    std::fs::read_to_string(root().join("lua").join(format!("{name}.lua"))).expect("a script of lua/")
}

/// One line of words: how a block reads, whatever its comment markers and wrapping.
fn words(lines: &[&str]) -> String {
    lines.iter().flat_map(|l| l.split_whitespace()).collect::<Vec<_>>().join(" ")
}

/// The KEYS and ARGV a script's header states: from its first line that begins with
/// `KEYS` to the line before the next that begins with `Returns` (or the header's end).
fn lua_shape(name: &str) -> String {
    let text = script_text(name);
    let header: Vec<&str> = text.lines().map_while(|l| l.strip_prefix("--")).map(str::trim).collect();
    let start = header.iter().position(|l| l.starts_with("KEYS")).unwrap_or_else(|| panic!("{name}.lua: no KEYS"));
    let block: Vec<&str> = header[start..].iter().take_while(|l| !l.starts_with("Returns")).copied().collect();
    words(&block)
}

/// Every function of `src/store/scripts/` that runs a script (`SCRIPTS.<name>`), with the
/// script's name and the ```` ```text ```` block of its doc comment (`None`: it has none).
fn typed_calls() -> Vec<(String, String, Option<String>)> {
    let mut calls = Vec::new();
    let dir = root().join("src/store/scripts");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut at = 0;
        while let Some(found) = text[at..].find("SCRIPTS") {
            let start = at + found;
            at = start + "SCRIPTS".len();
            let rest = text[at..].trim_start();
            let Some(rest) = rest.strip_prefix('.') else { continue };
            let name: String = rest.trim_start().chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            // The function around it: the nearest line above that declares one, at the margin.
            let line = text[..start].matches('\n').count();
            let Some(decl) = (0..=line).rev().find(|&i| {
                let l = lines[i];
                !l.starts_with(' ') && (l.contains("fn ")) && !l.starts_with("//")
            }) else {
                continue;
            };
            let mut i = decl;
            while i > 0 && lines[i - 1].starts_with("#[") {
                i -= 1;
            }
            let doc: Vec<&str> = lines[..i].iter().rev().map_while(|l| l.strip_prefix("///")).collect();
            let doc: Vec<&str> = doc.into_iter().rev().map(str::trim).collect();
            let block = doc.iter().position(|l| *l == "```text").map(|open| {
                let body: Vec<&str> = doc[open + 1..].iter().take_while(|l| **l != "```").copied().collect();
                words(&body)
            });
            let function = format!("{}: {}", path.file_name().unwrap().to_string_lossy(), lines[decl].trim());
            calls.push((name, function, block));
        }
    }
    calls
}

#[test]
fn every_script_of_lua_is_in_the_one_list() {
    let files: BTreeSet<String> = std::fs::read_dir(root().join("lua"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "lua"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().to_string())
        .filter(|n| n != "prelude")
        .collect();
    let listed: BTreeSet<String> = NAMES.iter().map(|n| n.to_string()).collect();
    assert_eq!(files, listed, "lua/ and store::scripts' list differ");
}

#[test]
fn every_script_checks_its_shape_first_and_reads_records_by_name() {
    for name in NAMES {
        let text = script_text(name);
        let code: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("--")).collect();
        let arity = code.iter().position(|l| l.contains("arity(")).unwrap_or_else(|| panic!("{name}.lua: no arity"));
        let first_read = code.iter().position(|l| l.contains("redis.call(") || l.contains("hmget("));
        assert!(first_read.is_none_or(|r| r > arity), "{name}.lua reads Redis before it checks its call's shape");
        assert!(
            !text.contains("'HMGET'") && !text.contains("\"HMGET\""),
            "{name}.lua reads an HMGET by position: use hmget (prelude), which names each field"
        );
    }
    // The prelude itself: hmget is the one HMGET.
    assert_eq!(PRELUDE.matches("'HMGET'").count(), 1);
}

#[test]
fn each_typed_call_restates_its_scripts_keys_and_argv() {
    let calls = typed_calls();
    for name in NAMES {
        let theirs: Vec<&(String, String, Option<String>)> = calls.iter().filter(|(n, _, _)| n == name).collect();
        assert!(!theirs.is_empty(), "no typed call runs {name}.lua");
        let lua = lua_shape(name);
        for (_, function, block) in theirs {
            let block = block.as_ref().unwrap_or_else(|| panic!("{function}: its doc does not restate KEYS and ARGV"));
            assert_eq!(block, &lua, "{function}: its doc and {name}.lua's header say different KEYS or ARGV");
        }
    }
}

/// The shape a script's `arity` checks: fixed keys, keys per item, fixed arguments,
/// arguments per item; and the arguments a valid call must carry at given places (what
/// says how long the head is, a mode), the rest being `0`.
struct Shape {
    keys: (usize, usize),
    args: (usize, usize),
    set: &'static [(usize, &'static str)],
}

const fn shape(fixed_keys: usize, per_key: usize, fixed_args: usize, per_arg: usize) -> Shape {
    Shape { keys: (fixed_keys, per_key), args: (fixed_args, per_arg), set: &[] }
}

/// A call of `source` with `keys` keys and `args` arguments; the reply, or Redis's error.
async fn eval(server: &RedisServer, source: &str, keys: usize, args: &[String]) -> Result<redis::Value, String> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(source).arg(keys);
    for k in 0..keys {
        cmd.arg(format!("t:{{0}}:k{k}"));
    }
    cmd.arg(args);
    server.command::<redis::Value>(&cmd).await.map_err(|e| format!("{e:#}"))
}

/// Every call one key or one argument off `s` that `arity` must refuse is refused, and
/// writes nothing; a call of the right shape passes it.
async fn check_arity(name: &str, s: Shape) {
    let server = RedisServer::start(RedisOptions::default()).await.expect("redis-server");
    let source = format!("{PRELUDE}{}", script_text(name));
    let items = 2;
    let keys = s.keys.0 + items * s.keys.1;
    let nargs = s.args.0 + items * s.args.1;
    let args_of = |n: usize| -> Vec<String> {
        (1..=n).map(|i| s.set.iter().find(|(at, _)| *at == i).map_or("0".to_string(), |(_, v)| v.to_string())).collect()
    };
    // One side changed by one is refused when that side carries nothing per item, when the
    // other side carries something per item (the counts of items differ), or when an item
    // is more than one on that side.
    let refused = |per: usize, other: usize| per == 0 || other > 0 || per > 1;
    let mut wrong: Vec<(usize, usize)> = Vec::new();
    if refused(s.keys.1, s.args.1) {
        wrong.push((keys + 1, nargs));
        wrong.extend(keys.checked_sub(1).map(|k| (k, nargs)));
    }
    if refused(s.args.1, s.keys.1) {
        wrong.push((keys, nargs + 1));
        wrong.extend(nargs.checked_sub(1).map(|a| (keys, a)));
    }
    assert!(!wrong.is_empty(), "{name}: no wrong count to try");
    for (k, a) in wrong {
        let got = eval(&server, &source, k, &args_of(a)).await;
        match got {
            Err(e) => assert!(e.contains("arity"), "{name}.lua with {k} keys and {a} arguments: {e}"),
            Ok(v) => panic!("{name}.lua with {k} keys and {a} arguments answered {v:?}, not an error"),
        }
    }
    let size: i64 = server.command(&redis::cmd("DBSIZE")).await.unwrap();
    assert_eq!(size, 0, "{name}.lua wrote before it refused a call of the wrong shape");
    if let Err(e) = eval(&server, &source, keys, &args_of(nargs)).await {
        assert!(
            !e.contains("arity"),
            "{name}.lua refused a call of its own shape ({keys} keys, {nargs} arguments): {e}"
        );
    }
}

/// One test per script: a wrong count of keys or of arguments is an error.
macro_rules! a_wrong_count_is_an_error {
    ($($name:ident: $shape:expr;)*) => {
        mod a_wrong_count_is_an_error {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    check_arity(stringify!($name), $shape).await;
                }
            )*

            #[test]
            fn every_script_has_its_test() {
                let tested: BTreeSet<&str> = [$(stringify!($name)),*].into_iter().collect();
                assert_eq!(tested, NAMES.iter().copied().collect::<BTreeSet<_>>());
            }
        }
    };
}

a_wrong_count_is_an_error! {
    // KEYS: periods index, audience, one channel's three; ARGV[4] '0' (no release times), ARGV[5] one channel.
    enqueue: Shape { set: &[(4, "0"), (5, "1")], ..shape(5, 1, 7, 1) };
    ingest: shape(8, 3, 3, 7);
    defer: shape(2, 1, 6, 2);
    claim: shape(0, 1, 2, 0);
    seal: shape(4, 1, 5, 5);
    // ARGV[9] one counts hash.
    gate: Shape { set: &[(9, "1")], ..shape(7, 2, 10, 3) };
    take: shape(2, 0, 4, 0);
    reschedule: shape(2, 0, 7, 0);
    // ARGV[2] one counts hash; the mode.
    settle: Shape { set: &[(2, "1"), (4, "answer")], ..shape(7, 1, 5, 5) };
    // ARGV[3] one counts hash.
    decide: Shape { set: &[(3, "1")], ..shape(5, 1, 4, 6) };
    requeue: shape(4, 0, 3, 0);
    release: shape(1, 1, 2, 2);
    // ARGV[3] one delivery key before the batch keys.
    renew: Shape { set: &[(3, "1")], ..shape(2, 1, 3, 1) };
    pause: shape(1, 0, 2, 0);
    forget: shape(1, 0, 3, 0);
    suppress: shape(4, 0, 7, 0);
    cascade: shape(3, 1, 5, 1);
    event: shape(4, 0, 4, 0);
    optout: shape(2, 0, 2, 0);
    due: shape(2, 0, 2, 0);
    fanout: Shape { set: &[(1, "finish")], ..shape(1, 0, 3, 0) };
    health: Shape { set: &[(1, "probe")], ..shape(1, 0, 6, 0) };
    wake: shape(1, 1, 0, 1);
    fallback: shape(3, 1, 11, 0);
    note: shape(0, 1, 1, 1);
    window: shape(0, 0, 2, 0);
    limiter: Shape { set: &[(1, "peek"), (5, ""), (6, ""), (7, ""), (8, ""), (9, "")], ..shape(2, 0, 9, 0) };
}

#[tokio::test]
async fn settle_refuses_a_mode_it_does_not_know() {
    let server = RedisServer::start(RedisOptions::default()).await.expect("redis-server");
    let source = format!("{PRELUDE}{}", script_text("settle"));
    // A batch and one member of one counts hash: the shape is right, the mode is not.
    let args: Vec<String> = ["b1", "1", "60", "*lost*", "", "d1", "sent", "re_1", "1", ""].map(String::from).to_vec();
    let err = eval(&server, &source, 8, &args).await.expect_err("an unknown mode is an error");
    assert!(err.contains("no mode"), "{err}");
    let size: i64 = server.command(&redis::cmd("DBSIZE")).await.unwrap();
    assert_eq!(size, 0);
}

#[tokio::test]
async fn the_settlements_per_minute_keep_the_last_hour_and_no_more() {
    let server = RedisServer::start(RedisOptions::default()).await.expect("redis-server");
    // The prelude's tally at a given minute (its `now` is an argument), then the hash.
    let source = format!(
        "{PRELUDE}tally_minute(KEYS[1], tonumber(ARGV[1]) * 60000, \
         {{sent = tonumber(ARGV[2]), failed = tonumber(ARGV[3])}}) return redis.call('HGETALL', KEYS[1])"
    );
    let m0 = 29_000_000_u64;
    let tally = async |minute: u64, sent: u64, failed: u64| -> BTreeMap<String, u64> {
        let args = [minute, sent, failed].map(|n| n.to_string()).to_vec();
        let reply = eval(&server, &source, 1, &args).await.unwrap();
        redis::from_redis_value::<BTreeMap<String, u64>>(reply).unwrap()
    };
    assert!(tally(m0, 0, 0).await.is_empty(), "nothing settled: nothing written");
    tally(m0, 3, 0).await;
    let h = tally(m0, 2, 1).await;
    let at = |m: u64, state: &str| format!("{m}:{state}");
    assert_eq!(h, BTreeMap::from([(at(m0, "sent"), 5), (at(m0, "failed"), 1), ("oldest".into(), m0)]));
    // An hour on, the first minute is still kept (the chart shows 60 up to now's); a minute
    // later it is gone.
    assert!(tally(m0 + 60, 1, 0).await.contains_key(&at(m0, "sent")));
    let h = tally(m0 + 61, 1, 0).await;
    assert!(!h.contains_key(&at(m0, "sent")) && !h.contains_key(&at(m0, "failed")), "{h:?}");
    assert_eq!(h["oldest"], m0 + 1);
    // A gap: every minute older than the hour goes at once.
    let h = tally(m0 + 300, 0, 2).await;
    assert_eq!(h, BTreeMap::from([(at(m0 + 300, "failed"), 2), ("oldest".into(), m0 + 240)]));
    // Redis's clock a day ahead: every older minute still goes.
    tally(m0 + 301, 1, 0).await;
    let h = tally(m0 + 1_740, 1, 0).await;
    assert_eq!(h, BTreeMap::from([(at(m0 + 1_740, "sent"), 1), ("oldest".into(), m0 + 1_680)]));
    let ttl: i64 = server.command(redis::cmd("TTL").arg("t:{0}:k0")).await.unwrap();
    assert!(ttl > 3600 && ttl <= 3900, "{ttl}");
}
