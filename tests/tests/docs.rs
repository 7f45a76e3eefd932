//! Docs that stay true: docs/DECISIONS.md is an index of every entry in
//! docs/decisions/, by area and dated (an entry added without its index
//! line, listed twice or under another area's file, or a line whose entry
//! was renamed or removed, fails here), and the README's Rust program is the
//! example the build compiles.

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

/// The `## ` entries of one file with their anchors, in order. A heading
/// (of any level) whose anchor an earlier one in the file already took
/// gets `-1`, `-2`, ... after it, as the renderer does. Code blocks hold no
/// headings.
fn entries_with_anchors(text: &str) -> Vec<(String, String)> {
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    let mut entries = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if in_code {
            continue;
        }
        let level = line.bytes().take_while(|b| *b == b'#').count();
        let Some(heading) = line.get(level..).and_then(|r| r.strip_prefix(' ')) else {
            continue;
        };
        if level == 0 || level > 6 {
            continue;
        }
        let base = anchor(heading);
        let seen = taken.entry(base.clone()).or_default();
        let unique = if *seen == 0 {
            base
        } else {
            format!("{base}-{seen}")
        };
        *seen += 1;
        if level == 2 {
            entries.push((heading.to_string(), unique));
        }
    }
    entries
}

/// "2026-12-06": four digits, a month 01-12, a day 01-31.
fn is_date(date: &str) -> bool {
    let parts: Vec<&str> = date.split('-').collect();
    let number = |s: &str, len: usize| {
        (s.len() == len && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u32>().unwrap())
    };
    parts.len() == 3
        && number(parts[0], 4).is_some()
        && number(parts[1], 2).is_some_and(|m| (1..=12).contains(&m))
        && number(parts[2], 2).is_some_and(|d| (1..=31).contains(&d))
}

#[test]
fn the_decisions_index_lists_every_entry_once_with_its_date() {
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs");
    let index = std::fs::read_to_string(format!("{docs}/DECISIONS.md")).unwrap();
    for line in index.lines().filter(|l| l.starts_with("## ")) {
        assert_eq!(
            line, "## Index",
            "DECISIONS.md holds an entry; entries go in docs/decisions/"
        );
    }

    // Every index line, by the file its area links to: (title, anchor, date).
    let mut listed: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    let mut area: Option<String> = None;
    for line in index.lines().skip_while(|l| *l != "## Index").skip(1) {
        if let Some(heading) = line.strip_prefix("### ") {
            // "### [Area](decisions/area.md)"
            let file = heading
                .strip_prefix('[')
                .and_then(|r| r.split_once("](decisions/"))
                .and_then(|(_, f)| f.strip_suffix(')'))
                .filter(|f| f.ends_with(".md") && !f.contains('/') && !f.contains('#'))
                .unwrap_or_else(|| panic!("an area that does not link to its file: {line}"));
            assert!(
                !listed.contains_key(file),
                "two areas link to decisions/{file}"
            );
            listed.insert(file.to_string(), Vec::new());
            area = Some(file.to_string());
            continue;
        }
        let Some(rest) = line.strip_prefix("- ") else {
            continue;
        };
        let file = area
            .as_ref()
            .unwrap_or_else(|| panic!("an index line before any area: {line}"));
        // "- 2026-12-06 [Heading](decisions/area.md#anchor)"
        let (date, rest) = rest.split_once(' ').unwrap();
        assert!(is_date(date), "an index line without its date: {line}");
        let (title, link) = rest
            .strip_prefix('[')
            .and_then(|r| r.rsplit_once("](decisions/"))
            .and_then(|(t, l)| Some((t, l.strip_suffix(')')?.split_once(".md#")?)))
            .unwrap_or_else(|| panic!("not a link to decisions/<file>.md#<anchor>: {line}"));
        assert_eq!(
            format!("{}.md", link.0),
            *file,
            "{line}: the link is not to its area's file"
        );
        let entries = listed.get_mut(file).unwrap();
        if let Some((_, _, previous)) = entries.last() {
            assert!(
                previous.as_str() <= date,
                "{line}: listed after an entry dated later"
            );
        }
        entries.push((title.to_string(), link.1.to_string(), date.to_string()));
    }

    // Every entry of every area file, with the anchor its heading gets.
    let mut files: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for dir_entry in std::fs::read_dir(format!("{docs}/decisions")).unwrap() {
        let path = dir_entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# "),
            "decisions/{name} does not start with its area's title"
        );
        files.insert(name, entries_with_anchors(&text));
    }

    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (file, entries) in &files {
        for (title, _) in entries {
            if let Some(other) = seen.insert(title, file) {
                panic!("the entry {title:?} is in decisions/{other} and decisions/{file}");
            }
        }
    }
    for (title, file) in &seen {
        let lines: Vec<&String> = listed
            .iter()
            .flat_map(|(f, entries)| entries.iter().map(move |e| (f, e)))
            .filter(|(_, (t, _, _))| t == title)
            .map(|(f, _)| f)
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "the entry {title:?} (decisions/{file}) is not in the index exactly once"
        );
        assert_eq!(
            lines[0], file,
            "the entry {title:?} is in decisions/{file} but listed under decisions/{}",
            lines[0]
        );
    }
    for (file, lines) in &listed {
        let entries = files
            .get(file)
            .unwrap_or_else(|| panic!("the index links to decisions/{file}, which does not exist"));
        for (title, link, _) in lines {
            let (_, anchor) = entries
                .iter()
                .find(|(t, _)| t == title)
                .unwrap_or_else(|| panic!("the index lists {title:?}, not in decisions/{file}"));
            assert_eq!(
                link, anchor,
                "{title:?}: the link is not the heading's anchor in decisions/{file}"
            );
        }
        let in_index: Vec<&String> = lines.iter().map(|(t, _, _)| t).collect();
        let in_file: Vec<&String> = entries.iter().map(|(t, _)| t).collect();
        assert_eq!(
            in_index, in_file,
            "decisions/{file} holds its entries in another order than the index"
        );
    }
    for file in files.keys() {
        assert!(
            listed.contains_key(file),
            "decisions/{file} has no area in the index"
        );
    }
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
