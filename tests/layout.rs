//! The shape of the code, checked: the rooms of `src/` import each other in the
//! order the README's rooms table lists them, top to bottom, never up and never in a
//! circle (every `crate::room` path in every file, test modules included, is an
//! edge), and `lib.rs` stays a wiring file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The room a source file belongs to: `src/x.rs` and `src/x/...` are room `x`.
fn room_of(path: &Path, src: &Path) -> String {
    let rel = path.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// Every room named by a `crate::` path in `text` (grouped imports included).
fn rooms_named(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::X, b::{Y, Z}}`: the first name of each top-level part.
            let mut depth = 0;
            let mut part_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => part_start = true,
                    c if part_start && !c.is_whitespace() => {
                        out.insert(ident(&group[i..]));
                        part_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|r| !r.is_empty());
    out
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The import graph between rooms (lib.rs and main.rs, the roots, left out).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 20, "found the sources: {files:?}");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let room = room_of(&file, &src);
        if room == "lib" || room == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable");
        let named = rooms_named(&text);
        let edges = graph.entry(room.clone()).or_default();
        edges.extend(named.into_iter().filter(|r| *r != room));
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

/// The rooms of the README's rooms table, top to bottom: a row's rooms (`x.rs`, `x/`,
/// each in backquotes in its first column) share its place.
fn readme_order() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let table = readme.split("The rooms of `src/`").nth(1).expect("the README has a rooms table");
    let mut rows = Vec::new();
    for line in table.lines().skip_while(|l| !l.starts_with("| room")).skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let first = line.split('|').nth(1).unwrap_or_default();
        let rooms: Vec<String> = first
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|name| name.strip_suffix(".rs").or_else(|| name.strip_suffix('/')))
            .filter(|room| !room.contains('/') && *room != "lua")
            .map(str::to_string)
            .collect();
        rows.push(rooms);
    }
    rows
}

#[test]
fn rooms_import_only_rooms_below_them_in_the_readme() {
    let graph = graph();
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import circle: {}\n{graph:#?}", cycle.join(" → "));
    }
    let rows = readme_order();
    let rank: BTreeMap<&str, usize> =
        rows.iter().enumerate().flat_map(|(i, row)| row.iter().map(move |r| (r.as_str(), i))).collect();
    let unlisted: Vec<&String> = graph.keys().filter(|room| !rank.contains_key(room.as_str())).collect();
    assert!(unlisted.is_empty(), "rooms missing from the README's rooms table: {unlisted:?}");
    let mut upward = Vec::new();
    for (room, imports) in &graph {
        for imported in imports.iter().filter(|i| graph.contains_key(*i)) {
            if rank[imported.as_str()] <= rank[room.as_str()] {
                upward.push(format!("{room} imports {imported}"));
            }
        }
    }
    // The consumer renders and hands over: it neither sends nor answers HTTP.
    for (room, not) in
        [("consumer", "attempt"), ("consumer", "batch"), ("consumer", "public"), ("consumer", "dispatch")]
    {
        assert!(!graph[room].contains(not), "{room} imports {not}");
    }
    assert!(
        upward.is_empty(),
        "imports that do not point down the README's rooms table: {upward:?}\n(an order that holds: {:?})",
        topological(&graph)
    );
}

/// The rooms, each above every room it imports (for the message of a failure).
fn topological(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut left: BTreeSet<&String> = graph.keys().collect();
    while !left.is_empty() {
        let next = left
            .iter()
            .find(|room| !left.iter().any(|other| graph[other.as_str()].contains(room.as_str())))
            .copied()
            .expect("no circle");
        out.push(next.clone());
        left.remove(next);
    }
    out
}

#[test]
fn the_checker_sees_a_circle_when_there_is_one() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(find_cycle(&graph).unwrap(), vec!["a", "b", "c", "a"]);
    assert_eq!(
        rooms_named("use crate::{config::Config, metrics::{A, B}};\nlet x = crate::db::keys::Keys::new();"),
        BTreeSet::from(["config".to_string(), "metrics".to_string(), "db".to_string()])
    );
}

#[test]
fn lib_rs_stays_a_wiring_file() {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    assert!(lib.lines().count() < 120, "lib.rs has {} lines", lib.lines().count());
}
