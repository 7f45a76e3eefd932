//! The crate's layers import one another in one direction only
//! (docs/ARCHITECTURE.md, "fenced-server"): each folder imports only the
//! leaves at the crate's root and the folders below it in [`LAYERS`], no
//! leaf imports anything of the crate, and inside a folder no module
//! imports itself back through others. An edge is a `use crate::…` tree or
//! a `crate::…` path outside comments and test modules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, path::Path};

use fenced_imports::{children, code_of, crate_paths, find_cycle, imports, modules, Graph};

fn graph() -> Graph {
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

/// The crate's folders from the bottom up, each with the folders it may
/// import (every one of them below it); any of them may import the leaves.
const LAYERS: [(&str, &[&str]); 14] = [
    ("security", &[]),
    ("clock", &[]),
    ("storage", &[]),
    ("counters", &["security"]),
    ("peer", &["clock", "security"]),
    ("state_machine", &["clock", "counters", "peer", "storage"]),
    (
        "repair",
        &["clock", "peer", "security", "state_machine", "storage"],
    ),
    (
        "replication",
        &["clock", "peer", "repair", "security", "storage"],
    ),
    ("proposer", &["clock", "counters", "state_machine"]),
    (
        "tools",
        &["clock", "repair", "security", "state_machine", "storage"],
    ),
    (
        "rpc",
        &[
            "clock",
            "counters",
            "peer",
            "proposer",
            "repair",
            "replication",
            "security",
            "state_machine",
            "storage",
            "tools",
        ],
    ),
    (
        "observe",
        &[
            "clock",
            "counters",
            "peer",
            "rpc",
            "security",
            "state_machine",
        ],
    ),
    (
        "node",
        &[
            "clock",
            "counters",
            "observe",
            "peer",
            "proposer",
            "repair",
            "replication",
            "rpc",
            "security",
            "state_machine",
            "storage",
            "tools",
        ],
    ),
    (
        "testing",
        &[
            "clock",
            "counters",
            "node",
            "observe",
            "peer",
            "proposer",
            "repair",
            "replication",
            "rpc",
            "security",
            "state_machine",
            "storage",
            "tools",
        ],
    ),
];

#[test]
fn no_module_imports_itself_back_through_others() {
    let graph = graph();
    assert!(graph.len() > 20, "found only {:?}", graph.keys());
    assert_eq!(find_cycle(&graph), None, "an import cycle");
}

#[test]
fn each_folder_imports_only_the_leaves_and_the_layers_below_it() {
    let graph = graph();
    let folders: BTreeSet<&str> = LAYERS.iter().map(|(f, _)| *f).collect();
    for (i, (folder, may)) in LAYERS.iter().enumerate() {
        let below: BTreeSet<&str> = LAYERS[..i].iter().map(|(f, _)| *f).collect();
        for m in *may {
            assert!(below.contains(m), "{folder} may import {m}, not below it");
        }
        let deps = graph
            .get(*folder)
            .unwrap_or_else(|| panic!("no folder {folder}: {:?}", graph.keys()));
        for dep in deps {
            assert!(
                !folders.contains(dep.as_str()) || may.contains(&dep.as_str()),
                "{folder} imports {dep}, which it must not (it may: {may:?})"
            );
        }
    }
    for (name, deps) in &graph {
        if !folders.contains(name.as_str()) {
            assert!(
                deps.is_empty(),
                "{name} sits at the root as a leaf but imports {deps:?}"
            );
        }
    }
}

#[test]
fn no_module_in_a_folder_imports_itself_back_through_others() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for (folder, _) in LAYERS {
        let modules = children(&src, folder);
        let graph: Graph = modules
            .iter()
            .map(|(name, text)| {
                let deps = crate_paths(text)
                    .into_iter()
                    .filter(|p| p.first().is_some_and(|f| f == folder))
                    .filter_map(|p| p.get(1).cloned())
                    .filter(|d| d != name && modules.contains_key(d))
                    .collect();
                (name.clone(), deps)
            })
            .collect();
        assert_eq!(find_cycle(&graph), None, "an import cycle in {folder}/");
        checked += graph.len();
    }
    assert!(checked > 50, "read only {checked} modules in the folders");
}

/// The pure cores decide without a runtime, a clock or I/O: their shells
/// (the proposer's loop, `replication`'s adapters) do those.
#[test]
fn the_pure_cores_use_no_runtime_clock_or_io() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for core in [
        "proposer/batcher.rs",
        "replication/stream.rs",
        "replication/pre_vote.rs",
    ] {
        let code = code_of(&src.join(core));
        assert!(code.len() > 500, "{core} read as {} bytes", code.len());
        for shell in [
            "tokio",
            "Instant::now",
            "SystemTime",
            "std::fs",
            "std::net",
            "async ",
            ".await",
        ] {
            assert!(!code.contains(shell), "{core} uses {shell}");
        }
    }
}
