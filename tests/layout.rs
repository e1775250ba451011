//! The shape of the code, checked. `src/` holds one folder per concept and a few files;
//! every one of them is named here, in the order of the rooms' floors, bottom first, and
//! a room imports only rooms below its own (every `crate::` path in every file, test
//! modules included, is an edge), never in a circle, nor do its files among themselves.
//! A few rules say more than the order does (the send core reaches for no listener,
//! report or command; the readers neither send nor answer HTTP). `docs/architecture.md`
//! lists the same rooms in the same order, and no file or function grows past what one
//! reading holds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The rooms of `src/`, bottom first: a folder (`x/`) or a file at the top (`x.rs`).
/// Each may import only those before it.
const FLOORS: [&str; 14] = [
    "model/",
    "config/",
    "store/",
    "resend/",
    "metrics/",
    "shutdown.rs",
    "audience/",
    "send/",
    "channels/",
    "ops/",
    "http/",
    "daemon.rs",
    "tools/",
    "cli/",
];

/// The files at the top of `src/` that are no room: the crate's roots.
const ROOTS: [&str; 2] = ["lib.rs", "main.rs"];

/// What `ls src` may show at most besides the folders.
const MOST_TOP_FILES: usize = 6;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// A room's name as `crate::` paths spell it.
fn room_name(entry: &str) -> &str {
    entry.trim_end_matches('/').trim_end_matches(".rs")
}

/// The module path of a source file (`src/send/gate.rs` is `send::gate`, a `mod.rs` its
/// folder's).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).expect("under src").with_extension("");
    let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().to_string()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// Every module path named by a `crate::` path in `text`, as far as its lower-case
/// segments go, groups expanded (`crate::{a::X, b::{c, d::Y}}` names `a`, `b::c`, `b::d`).
fn paths_named(text: &str) -> BTreeSet<String> {
    /// The paths of one use-tree at the start of `s`, each after `prefix`.
    fn tree(s: &str, prefix: &str, out: &mut BTreeSet<String>) {
        let mut path = prefix.to_string();
        let mut rest = s.trim_start();
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 0;
                let mut start = 0;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            tree(&group[start..i], &path, out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            tree(&group[start..i], &path, out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            let seg: String =
                rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
            if seg.is_empty() || seg == "self" {
                break;
            }
            if !path.is_empty() {
                path.push_str("::");
            }
            path.push_str(&seg);
            rest = &rest[seg.len()..];
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        if !path.is_empty() {
            out.insert(path);
        }
    }
    let mut out = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        tree(&text[at + "crate::".len()..], "", &mut out);
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every source file with its module path and the module paths it names.
fn files() -> Vec<(PathBuf, String, BTreeSet<String>)> {
    let mut found = Vec::new();
    sources(&src(), &mut found);
    assert!(found.len() > 60, "found the sources: {found:?}");
    found
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).expect("readable");
            let module = module_of(&file);
            (file, module, paths_named(&text))
        })
        .collect()
}

/// The import graph between rooms (the roots left out).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, module, named) in files() {
        let room = module.split("::").next().unwrap_or_default().to_string();
        if ROOTS.iter().any(|r| room_name(r) == room) {
            continue;
        }
        let edges = graph.entry(room.clone()).or_default();
        edges.extend(named.iter().map(|p| p.split("::").next().unwrap_or_default().to_string()).filter(|r| *r != room));
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn src_holds_the_known_folders_and_few_files() {
    let mut folders = BTreeSet::new();
    let mut top_files = BTreeSet::new();
    for entry in std::fs::read_dir(src()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().to_string();
        if entry.path().is_dir() {
            folders.insert(format!("{name}/"));
        } else {
            top_files.insert(name);
        }
    }
    let known: BTreeSet<String> = FLOORS.iter().chain(&ROOTS).map(|s| s.to_string()).collect();
    let unknown: Vec<&String> = folders.iter().chain(&top_files).filter(|e| !known.contains(*e)).collect();
    assert!(unknown.is_empty(), "src/ holds what tests/layout.rs does not know (name it in FLOORS): {unknown:?}");
    let missing: Vec<&String> = known.iter().filter(|k| !folders.contains(*k) && !top_files.contains(*k)).collect();
    assert!(missing.is_empty(), "rooms named in FLOORS that src/ does not hold: {missing:?}");
    assert!(top_files.len() <= MOST_TOP_FILES, "{} files at src/'s top: {top_files:?}", top_files.len());
}

#[test]
fn rooms_import_only_rooms_below_them() {
    let graph = graph();
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import circle: {}\n{graph:#?}", cycle.join(" → "));
    }
    let rank: BTreeMap<&str, usize> = FLOORS.iter().enumerate().map(|(i, r)| (room_name(r), i)).collect();
    let mut upward = Vec::new();
    for (room, imports) in &graph {
        let here = *rank.get(room.as_str()).unwrap_or_else(|| panic!("room {room} is not in FLOORS"));
        for imported in imports {
            // A path to something not a room (a re-export at the crate's root) is the root's.
            let target = match rank.get(imported.as_str()) {
                Some(&r) => r,
                None if ["run", "run_with", "Listeners", "RunOptions", "Failpoints", "Hold"]
                    .contains(&imported.as_str()) =>
                {
                    rank["daemon"]
                }
                None => panic!("{room} names crate::{imported}, which is no room"),
            };
            if target >= here {
                upward.push(format!("{room} imports {imported}"));
            }
        }
    }
    assert!(upward.is_empty(), "imports that do not point down FLOORS: {upward:?}");
}

#[test]
fn the_rules_the_order_does_not_say() {
    let graph = graph();
    assert!(graph["model"].is_empty(), "model/ imports nothing else of the crate: {:?}", graph["model"]);
    for not in ["http", "ops", "cli", "tools"] {
        assert!(!graph["send"].contains(not), "send/ imports {not}/");
    }
    let importers: Vec<&String> = graph.iter().filter(|(_, i)| i.contains("cli")).map(|(r, _)| r).collect();
    assert!(importers.is_empty(), "only main.rs calls into cli/: {importers:?}");
    // The readers resolve, render and hand over: they neither send nor answer HTTP.
    for (file, module, named) in files() {
        if module == "send::read" || module == "send::resolve" {
            for not in ["send::dispatch", "send::seal", "send::gate", "send::request", "send::fallback", "send::settle"]
            {
                assert!(!named.iter().any(|p| p.starts_with(not)), "{} imports {not}", file.display());
            }
            assert!(!named.iter().any(|p| p.starts_with("http")), "{} imports http/", file.display());
        }
    }
}

#[test]
fn files_import_each_other_in_no_circle() {
    let files = files();
    let modules: BTreeSet<&str> = files.iter().map(|(_, m, _)| m.as_str()).collect();
    // A path names the longest module it reaches (`send::gate::Gated` is `send::gate`).
    let module_of_path = |p: &str| {
        let parts: Vec<&str> = p.split("::").collect();
        (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find(|m| modules.contains(m.as_str()))
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, module, named) in &files {
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(named.iter().filter_map(|p| module_of_path(p)).filter(|m| m != module && !module.starts_with(m)));
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!("files importing each other in a circle: {}", cycle.join(" → "));
    }
}

#[test]
fn the_architecture_page_lists_the_rooms_in_this_order() {
    let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md")).unwrap();
    let table = page.split("The rooms of `src/`").nth(1).expect("docs/architecture.md has the rooms table");
    let listed: Vec<String> = table
        .lines()
        .skip_while(|l| !l.starts_with("| room"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect();
    let top_down: Vec<String> = FLOORS.iter().rev().map(|s| s.to_string()).collect();
    assert_eq!(listed, top_down, "docs/architecture.md's rooms table, top to bottom");
}

#[test]
fn no_file_over_600_lines_and_no_function_over_120() {
    let mut long = Vec::new();
    for (file, _, _) in files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() > 600 {
            long.push(format!("{}: {} lines", file.display(), lines.len()));
        }
        for (i, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            let indent = &line[..line.len() - code.len()];
            let words: Vec<&str> = code.split_whitespace().collect();
            let fn_at = words.iter().position(|w| *w == "fn");
            let is_fn = fn_at.is_some_and(|at| {
                words[..at]
                    .iter()
                    .all(|w| ["pub", "async", "const", "unsafe", "extern"].contains(w) || w.starts_with("pub("))
            });
            if !is_fn || code.ends_with(';') || code.ends_with('}') {
                continue;
            }
            // rustfmt closes a function's body at the indentation it opened at.
            let close = format!("{indent}}}");
            let end = lines[i + 1..].iter().position(|l| *l == close).map_or(0, |n| n + 1);
            if end + 1 > 120 {
                long.push(format!("{}:{}: a function of {} lines", file.display(), i + 1, end + 1));
            }
        }
    }
    assert!(long.is_empty(), "{long:#?}");
}

#[test]
fn the_checker_sees_a_circle_when_there_is_one() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(find_cycle(&graph).unwrap(), vec!["a", "b", "c", "a"]);
    assert_eq!(
        paths_named("use crate::{config::Config, metrics::{A, B}};\nlet x = crate::store::keys::Keys::new();"),
        BTreeSet::from(["config".to_string(), "metrics".to_string(), "store::keys".to_string()])
    );
    assert_eq!(
        paths_named("use crate::send::{self, seal, settle::{self, QUOTA}};"),
        BTreeSet::from(["send".to_string(), "send::seal".to_string(), "send::settle".to_string()])
    );
}

#[test]
fn lib_rs_stays_a_wiring_file() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    assert!(lib.lines().count() < 120, "lib.rs has {} lines", lib.lines().count());
}

/// The types a source text defines (structs, enums, traits, type aliases, those a macro
/// like `names!` wraps included), by name, with their line; a trait's associated type
/// (`type Error = …;` in an impl) is the trait's name, not one of ours.
fn types_defined(text: &str) -> Vec<(String, usize)> {
    const ASSOCIATED: [&str; 5] = ["Error", "Err", "Output", "Target", "Item"];
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(at) = words.iter().position(|w| matches!(*w, "struct" | "enum" | "trait" | "type")) else { continue };
        // Only a definition: nothing but visibility before the keyword.
        if !words[..at].iter().all(|w| w.starts_with("pub")) {
            continue;
        }
        let Some(name) = words.get(at + 1) else { continue };
        let name: String = name.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.chars().next().is_some_and(char::is_uppercase)
            && !(words[at] == "type" && ASSOCIATED.contains(&name.as_str()))
        {
            out.push((name, i + 1));
        }
    }
    out
}

#[test]
fn no_two_types_of_the_crate_share_a_name() {
    let mut found = Vec::new();
    sources(&src(), &mut found);
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in &found {
        let text = std::fs::read_to_string(file).unwrap();
        let in_cli = file.strip_prefix(src()).unwrap().starts_with("cli");
        for (name, line) in types_defined(&text) {
            // Each command's clap arguments are its `Args`, as clap's own examples have them.
            if in_cli && name == "Args" {
                continue;
            }
            by_name.entry(name).or_default().push(format!("{}:{line}", file.display()));
        }
    }
    let shared: BTreeMap<&String, &Vec<String>> = by_name.iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(shared.is_empty(), "types sharing a name: {shared:#?}");
}

#[test]
fn the_type_finder_sees_what_it_should() {
    let text =
        "pub struct A {\n    pub(crate) enum B,\n    type Error = X;\n  type Local = (u8, u8);\nlet struct_ = 1;\n";
    let names: Vec<String> = types_defined(text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["A", "B", "Local"]);
}

/// The ways a file sends Redis a command of its own.
const RAW_REDIS: [&str; 4] = ["redis::cmd(", "redis::pipe(", ".cmd(\"", "AsyncCommands"];

#[test]
fn raw_redis_commands_live_in_the_store_or_say_why_not() {
    let mut found = Vec::new();
    sources(&src(), &mut found);
    let mut unexplained = Vec::new();
    for file in &found {
        if file.strip_prefix(src()).unwrap().starts_with("store") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        if !RAW_REDIS.iter().any(|raw| text.contains(raw)) {
            continue;
        }
        // The file's opening comment says why these commands are its own.
        let header: String = text.lines().take_while(|l| l.starts_with("//!")).collect::<Vec<_>>().join("\n");
        if !header.contains("Raw Redis here:") {
            unexplained.push(file.display().to_string());
        }
    }
    assert!(
        unexplained.is_empty(),
        "raw Redis commands outside store/ with no `Raw Redis here:` reason: {unexplained:#?}"
    );
    // The send core and the channels read and write only through store/.
    for file in &found {
        let rel = file.strip_prefix(src()).unwrap();
        if rel.starts_with("send") || rel.starts_with("channels") {
            let text = std::fs::read_to_string(file).unwrap();
            assert!(
                !RAW_REDIS.iter().any(|raw| text.contains(raw)),
                "{} sends Redis a command of its own",
                rel.display()
            );
        }
    }
}

/// The mutants of the code (`bench/model --code-mutants`) are patches of this tree: each
/// still applies (a change to the code it mutates must carry the patch along) and names
/// checks that exist (`walks`, or a file of tests/).
#[test]
fn the_code_mutants_still_apply_and_name_real_checks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("tests/model/code_mutants");
    let mut patches: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    patches.sort();
    assert!(patches.len() >= 11, "the eleven code mutants of #59 at least: {patches:?}");
    for patch in &patches {
        let text = std::fs::read_to_string(patch).unwrap();
        let name = patch.file_stem().unwrap().to_string_lossy().to_string();
        assert!(text.starts_with(&format!("# mutant: {name}\n")), "{} names itself", patch.display());
        let checks = text.lines().find_map(|l| l.strip_prefix("# checks: ")).expect("a checks line");
        for check in checks.split_whitespace() {
            assert!(
                check == "walks" || root.join("tests").join(format!("{check}.rs")).exists(),
                "{name}: no check {check}"
            );
        }
        let applies = std::process::Command::new("git")
            .args(["apply", "--check"])
            .arg(patch)
            .current_dir(root)
            .output()
            .expect("git runs");
        assert!(applies.status.success(), "{name} no longer applies: {}", String::from_utf8_lossy(&applies.stderr));
    }
}
