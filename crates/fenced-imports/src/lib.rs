//! A crate's module import graph, read from its sources as text, for the
//! tests that keep fenced's crates layered (fenced-server's
//! `testing/module_graph.rs`, fenced-client's `tests/module_graph.rs`).
//!
//! An edge is a `crate::…` path or `use crate::{…}` tree, or a `super::…`
//! chain that climbs to the crate root, outside comments and a file's
//! `#[cfg(test)] mod tests`. Test code only: a file that cannot be read is
//! a panic naming it.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// Each module, and the modules it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// A file's code: comment lines and its test module left out.
pub fn code_of(path: &Path) -> String {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The code of every top-level module of the crate whose sources are in
/// `src` (`src/x.rs`, or all of `src/x/`, and both when there are both),
/// with each `super::` chain that climbs to the crate root written
/// `crate::`. `lib.rs` and `main.rs` are left out.
pub fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for path in entries(src) {
        let name = stem(&path);
        let text = if path.is_dir() {
            let mut text = String::new();
            collect(&path, 1, &mut text);
            text
        } else if is_rust(&path) && name != "lib" && name != "main" {
            rooted(&code_of(&path), 1)
        } else {
            continue;
        };
        out.entry(name).or_default().push_str(&text);
    }
    out
}

/// The modules inside the folder `src/<folder>/`, each with its code
/// (paths as written, nothing rooted): a file or a folder of its own each,
/// the folder's own `src/<folder>.rs` or `mod.rs` as `mod`.
pub fn children(src: &Path, folder: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let own = src.join(format!("{folder}.rs"));
    if own.exists() {
        out.insert("mod".to_string(), code_of(&own));
    }
    for path in entries(&src.join(folder)) {
        let text = if path.is_dir() {
            let mut text = String::new();
            collect(&path, 0, &mut text);
            text
        } else if is_rust(&path) {
            code_of(&path)
        } else {
            continue;
        };
        out.entry(stem(&path)).or_default().push_str(&text);
    }
    out
}

/// `code` of a module `levels` below the crate root, with each `super::`
/// chain that climbs to the root written `crate::`. A shorter chain stays
/// inside the top-level module and is no edge.
pub fn rooted(code: &str, levels: usize) -> String {
    const SUPER: &str = "super::";
    let mut out = String::new();
    let mut rest = code;
    while let Some(i) = rest.find(SUPER) {
        let starts_a_path = rest[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if !starts_a_path {
            out.push_str(SUPER);
            rest = &rest[SUPER.len()..];
            continue;
        }
        let mut climbs = 0;
        while let Some(after) = rest.strip_prefix(SUPER) {
            climbs += 1;
            rest = after;
        }
        if levels > 0 && climbs >= levels {
            out.push_str("crate::");
        } else {
            out.push_str(&SUPER.repeat(climbs));
        }
    }
    out.push_str(rest);
    out
}

/// The first name of every `crate::` path in `code`: a module, or a name
/// the crate root re-exports.
pub fn imports(code: &str) -> BTreeSet<String> {
    crate_paths(code)
        .into_iter()
        .filter_map(|p| p.into_iter().next())
        .collect()
}

/// Every path of the crate that `code` names, through `use crate::…`
/// trees (groups expanded) and `crate::…` paths, as its names in order.
pub fn crate_paths(code: &str) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        use_tree(rest, Vec::new(), &mut out);
    }
    out
}

/// A cycle in `graph`, as the modules along it, if there is one.
pub fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
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
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// Every module `from` imports, directly or through others.
pub fn reach(graph: &Graph, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut next = vec![from.to_string()];
    while let Some(m) = next.pop() {
        for d in graph.get(&m).into_iter().flatten() {
            if seen.insert(d.clone()) {
                next.push(d.clone());
            }
        }
    }
    seen
}

/// The leading identifier of `s`.
pub fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Reads the use tree at the start of `s`, below `prefix`, into `out`;
/// the number of bytes read.
fn use_tree(s: &str, prefix: Vec<String>, out: &mut BTreeSet<Vec<String>>) -> usize {
    let trimmed = s.trim_start();
    let skipped = s.len() - trimmed.len();
    if trimmed.starts_with('{') {
        let mut at = 1;
        loop {
            at += use_tree(&trimmed[at..], prefix.clone(), out);
            // Past an `as name`, to the item's end.
            let Some(end) = trimmed[at..].find([',', '}']) else {
                return skipped + trimmed.len();
            };
            at += end + 1;
            if trimmed[at - 1..].starts_with('}') {
                return skipped + at;
            }
            if trimmed[at..].trim_start().starts_with('}') {
                let close = trimmed[at..].find('}').unwrap_or(0);
                return skipped + at + close + 1;
            }
        }
    }
    let name = ident(trimmed);
    if name.is_empty() {
        if !prefix.is_empty() {
            out.insert(prefix);
        }
        return skipped;
    }
    let mut path = prefix;
    path.push(name.to_string());
    match trimmed[name.len()..].strip_prefix("::") {
        Some(next) => skipped + name.len() + 2 + use_tree(next, path, out),
        None => {
            out.insert(path);
            skipped + name.len()
        }
    }
}

/// The files of a module folder, `depth` modules below the crate root
/// (its `mod.rs` is at `depth`, its other files one deeper); with `depth`
/// 0, nothing is rooted.
fn collect(dir: &Path, depth: usize, text: &mut String) {
    for path in entries(dir) {
        if path.is_dir() {
            collect(&path, if depth == 0 { 0 } else { depth + 1 }, text);
        } else if is_rust(&path) {
            let levels = match depth {
                0 => 0,
                d if path.file_stem().is_some_and(|s| s == "mod") => d,
                d => d + 1,
            };
            text.push_str(&rooted(&code_of(&path), levels));
            text.push('\n');
        }
    }
}

fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    let read = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    let mut paths: Vec<_> = read
        .map(|e| {
            e.unwrap_or_else(|e| panic!("an entry of {}: {e}", dir.display()))
                .path()
        })
        .collect();
    paths.sort();
    paths
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or_else(|| panic!("a module name: {}", path.display()))
        .to_string()
}

fn is_rust(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "rs")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn names(s: &[&str]) -> BTreeSet<String> {
        s.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_cycle_is_found_and_named_and_reach_follows_edges() {
        let mut g = Graph::new();
        for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
            g.entry(from.into()).or_default().insert(to.into());
        }
        assert_eq!(
            find_cycle(&g),
            Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
        );
        g.get_mut("c").unwrap().remove("a");
        assert_eq!(find_cycle(&g), None);
        assert_eq!(reach(&g, "a"), names(&["b", "c", "d"]));
    }

    #[test]
    fn use_trees_and_paths_are_read_whole() {
        assert_eq!(
            imports(
                "use crate::{\n    a::X,\n    b,\n    c::{self, D},\n};\nlet x = crate::e::f();"
            ),
            names(&["a", "b", "c", "e"])
        );
        let paths = crate_paths(
            "use crate::{\n    a::{b::X as Y, c},\n    d::*,\n    e,\n};\nlet x = crate::f::g::h();",
        );
        let expected: BTreeSet<Vec<String>> = [
            vec!["a", "b", "X"],
            vec!["a", "c"],
            vec!["d"],
            vec!["e"],
            vec!["f", "g", "h"],
        ]
        .into_iter()
        .map(|p| p.into_iter().map(String::from).collect())
        .collect();
        assert_eq!(paths, expected);
    }

    #[test]
    fn super_chains_that_reach_the_root_are_crate_paths() {
        // From a top-level module, `super::` is the crate root; from a file
        // of a module folder, one `super::` stays in the folder.
        assert_eq!(
            imports(&rooted("use super::client::X;", 1)),
            names(&["client"])
        );
        assert_eq!(
            imports(&rooted("use super::{rpc::Y, Calls};", 2)),
            names(&[])
        );
        assert_eq!(
            rooted("use super::{rpc::Y, Calls};", 2),
            "use super::{rpc::Y, Calls};"
        );
        assert_eq!(
            imports(&rooted("use super::super::lease;", 2)),
            names(&["lease"])
        );
        assert_eq!(imports(&rooted("a_super::x", 1)), names(&[]));
        assert_eq!(rooted("use super::x;", 0), "use super::x;");
    }

    #[test]
    fn comments_and_the_test_module_are_not_code() {
        let dir = std::env::temp_dir().join(format!("fenced-imports-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("m.rs");
        std::fs::write(
            &file,
            "// use crate::a;\nuse crate::b;\n#[cfg(test)]\nmod tests {\n    use crate::c;\n}\n",
        )
        .unwrap();
        assert_eq!(imports(&code_of(&file)), names(&["b"]));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
