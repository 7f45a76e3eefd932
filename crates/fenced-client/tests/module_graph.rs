//! fenced-client's modules import one another in one direction only, in
//! the layers docs/ARCHITECTURE.md names ("crates/fenced-client"): `calls`
//! at the bottom, the lease keeper (`lease`) and `session` on it, `Client`
//! on top. An edge is a `crate::…` path, a `super::…` path that climbs to
//! the crate root, or a name lib.rs re-exports from a module (`crate::Client`
//! is `client`'s), outside comments and test modules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use fenced_imports::{code_of, find_cycle, ident, imports, modules, reach, Graph};

/// What lib.rs re-exports: each name with the module it comes from, or
/// `None` for another crate's (`fenced_core`'s types).
fn root_names(lib: &str, modules: &BTreeMap<String, String>) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    let mut rest = lib;
    while let Some(i) = rest.find("pub use ") {
        rest = &rest[i + "pub use ".len()..];
        let end = rest.find(';').expect("a `pub use` ends");
        let (from, names) = rest[..end].split_once("::").expect("a path");
        rest = &rest[end..];
        let from = from.trim();
        let home = modules.contains_key(from).then(|| from.to_string());
        let names: Vec<String> = if names.trim() == "*" {
            public_items(modules.get(from).expect("a glob of a module"))
        } else {
            // `a`, `b::C`, `D as E`, `{F, g::H}`: the last name of each.
            names
                .split(',')
                .map(|n| n.trim_matches(|c: char| c == '{' || c == '}' || c.is_whitespace()))
                .filter(|n| !n.is_empty())
                .filter_map(|n| n.split_whitespace().last())
                .map(|n| n.rsplit("::").next().unwrap_or(n).to_string())
                .collect()
        };
        for name in names {
            out.insert(name, home.clone());
        }
    }
    out
}

/// The names of a module's public top-level items (what `pub use m::*`
/// re-exports).
fn public_items(code: &str) -> Vec<String> {
    const KINDS: [&str; 8] = [
        "struct ",
        "enum ",
        "fn ",
        "async fn ",
        "const ",
        "static ",
        "type ",
        "trait ",
    ];
    code.lines()
        .filter_map(|l| l.strip_prefix("pub "))
        .filter_map(|l| KINDS.iter().find_map(|k| l.strip_prefix(k)))
        .map(|l| ident(l).to_string())
        .collect()
}

/// Each module's imports of other modules of the crate.
fn graph_of(modules: &BTreeMap<String, String>, lib: &str) -> Graph {
    let roots = root_names(lib, modules);
    modules
        .iter()
        .map(|(name, code)| {
            let deps = imports(code)
                .into_iter()
                .filter_map(|d| {
                    if modules.contains_key(&d) {
                        return Some(d);
                    }
                    match roots.get(&d) {
                        Some(home) => home.clone(),
                        None => panic!("{name}: crate::{d} is neither a module nor re-exported"),
                    }
                })
                .filter(|d| d != name)
                .collect();
            (name.clone(), deps)
        })
        .collect()
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    graph_of(&modules(&src), &code_of(&src.join("lib.rs")))
}

#[test]
fn no_module_imports_itself_back_through_others() {
    let graph = graph();
    assert!(graph.len() >= 10, "found only {:?}", graph.keys());
    assert_eq!(find_cycle(&graph), None, "an import cycle");
}

#[test]
fn calls_is_the_bottom_and_client_the_top() {
    let graph = graph();
    let deps = |m: &str| graph.get(m).cloned().unwrap_or_default();
    // The layers exist and are seen: a renamed module fails here rather
    // than passing the rules below unchecked.
    for (from, to) in [
        ("client", "calls"),
        ("client", "lease"),
        ("client", "session"),
        ("lease", "calls"),
        ("lease", "session"),
        ("session", "calls"),
    ] {
        assert!(deps(from).contains(to), "{from} imports {:?}", deps(from));
    }
    let below_calls = reach(&graph, "calls");
    for above in ["client", "lease", "session"] {
        assert!(
            !below_calls.contains(above),
            "calls reaches {above}: {:?}",
            deps("calls")
        );
    }
    for keeper in ["lease", "session"] {
        assert!(
            !reach(&graph, keeper).contains("client"),
            "{keeper} reaches client: {:?}",
            deps(keeper)
        );
    }
}

/// The scan itself is tested in fenced-imports; here, what is this
/// crate's own: a name the root re-exports leads to its module.
#[test]
fn a_re_exported_name_leads_to_its_module() {
    let names = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    let modules: BTreeMap<String, String> = [
        ("client", "pub struct Client;\npub(crate) fn hidden() {}"),
        ("lease", "use crate::Client;"),
        ("loss", "use crate::{LostReason, Held};"),
        ("held", "pub enum Held {}"),
    ]
    .map(|(m, code)| (m.to_string(), code.to_string()))
    .into();
    let lib = "pub use client::*;\npub use fenced_core::{LostReason, Token};\n\
               pub use held::{\n    Held,\n};";
    let g = graph_of(&modules, lib);
    assert_eq!(g["lease"], names(&["client"]));
    assert_eq!(g["loss"], names(&["held"]));
}
