//! Docs that stay true: docs/DECISIONS.md opens with an index of every
//! entry, by area and dated (an entry added without its index line, or a
//! line whose entry was renamed or removed, fails here), and the README's
//! Rust program is the example the build compiles.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

/// The anchor a Markdown renderer gives a heading: lower case, punctuation
/// dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn the_decisions_index_lists_every_entry_once_with_its_date() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/DECISIONS.md");
    let text = std::fs::read_to_string(path).unwrap();
    let entries: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .filter(|h| *h != "Index")
        .collect();
    let mut listed: BTreeMap<String, usize> = BTreeMap::new();
    for line in text
        .lines()
        .skip_while(|l| *l != "## Index")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("- "))
    {
        // "- 2026-12-06 [Heading](#anchor)"
        let (date, rest) = line[2..].split_once(' ').unwrap();
        assert!(
            date.len() == 10 && date.as_bytes()[4] == b'-' && date.as_bytes()[7] == b'-',
            "an index line without its date: {line}"
        );
        let (title, link) = rest
            .strip_prefix('[')
            .and_then(|r| r.split_once("](#"))
            .unwrap_or_else(|| panic!("not a link: {line}"));
        let link = link.strip_suffix(')').unwrap();
        assert_eq!(
            link,
            anchor(title),
            "{line}: the link is not the heading's anchor"
        );
        *listed.entry(title.to_string()).or_default() += 1;
    }
    for entry in &entries {
        assert_eq!(
            listed.get(*entry),
            Some(&1),
            "DECISIONS.md entry {entry:?} is not in the index exactly once"
        );
    }
    assert_eq!(
        listed.len(),
        entries.len(),
        "the index lists entries that do not exist"
    );
}

/// The README's Rust block is `crates/fenced-client/examples/readme.rs`
/// word for word, which `cargo build --examples` compiles (and clippy
/// checks): the README cannot show code that no longer builds.
#[test]
fn the_readmes_rust_program_is_the_compiled_example() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example =
        std::fs::read_to_string(format!("{root}/crates/fenced-client/examples/readme.rs")).unwrap();
    let block = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a ```rust block in README.md");
    assert_eq!(
        block, example,
        "README.md's Rust block and examples/readme.rs differ"
    );
}
