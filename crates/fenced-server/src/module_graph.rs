//! The crate's modules import one another in one direction only: no module
//! imports itself back through others (docs/ARCHITECTURE.md, "fenced-server's
//! modules and their dependency direction"). An edge is a `use crate::…` or
//! a `crate::…` path outside comments and test modules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// The text of every file of each top-level module, comments and test
/// modules left out.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src") {
        let path = entry.expect("a src entry").path();
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .expect("a module name")
            .to_string();
        let mut text = String::new();
        if path.is_dir() {
            collect(&path, &mut text);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            text = code_of(&path);
        } else {
            continue;
        }
        out.entry(name).or_insert_with(String::new).push_str(&text);
    }
    out
}

fn collect(dir: &Path, text: &mut String) {
    for entry in std::fs::read_dir(dir).expect("read a module dir") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            collect(&path, text);
        } else if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&code_of(&path));
        }
    }
}

fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read a source file");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The crate modules `text` names.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b, c::{..}}`: the first name of each item.
            let (mut depth, mut start) = (0usize, true);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        out.insert(ident(&group[j..]).to_string());
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest).to_string());
        }
    }
    out
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
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

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    modules
        .iter()
        .map(|(name, text)| {
            let deps = imports(text)
                .into_iter()
                .filter(|d| d != name && modules.contains_key(d))
                .collect();
            (name.clone(), deps)
        })
        .collect()
}

#[test]
fn no_module_imports_itself_back_through_others() {
    let graph = graph();
    assert!(graph.len() > 20, "found only {:?}", graph.keys());
    assert_eq!(find_cycle(&graph), None, "an import cycle");
}

#[test]
fn the_layers_the_architecture_names_hold() {
    let graph = graph();
    let deps = |m: &str| graph.get(m).cloned().unwrap_or_default();
    assert!(
        !deps("log_store").contains("replication"),
        "storage drives the network"
    );
    assert!(!deps("network").contains("replication"));
    assert!(
        deps("replication").contains("network"),
        "{:?}",
        deps("replication")
    );
    for m in ["state_machine", "rpc_metrics", "rpc", "proposer"] {
        assert!(!deps(m).contains("metrics"), "{m} imports metrics");
    }
    // The clock imports nothing but `blocking`, itself a leaf (how a
    // file write leaves the async threads).
    assert!(
        deps("clock").iter().all(|m| m == "blocking"),
        "clock imports only blocking: {:?}",
        deps("clock")
    );
    assert!(deps("blocking").is_empty(), "{:?}", deps("blocking"));
}

#[test]
fn a_cycle_is_found_and_named() {
    let edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")];
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in edges {
        g.entry(from.into()).or_default().insert(to.into());
    }
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    g.get_mut("c").unwrap().remove("a");
    assert_eq!(find_cycle(&g), None);
    assert_eq!(
        imports("use crate::{\n    a::X,\n    b,\n    c::{self, D},\n};\nlet x = crate::e::f();"),
        ["a", "b", "c", "e"].into_iter().map(String::from).collect()
    );
}
