//! Every console example in README.md and docs/GUIDE.md runs as written
//! against a fresh `fenced dev` cluster, and says what the document says.
//!
//! A block is a ```console fence: `$ ` lines are commands (a line ending in
//! `\` continues), the lines after one are its output. Outputs are compared
//! with their varying parts made alike (dates, UUIDs, base64 ids, numbers);
//! each line the document shows must appear, in order (`...` stands for
//! anything within a line). An owner id or a token a document shows and a
//! later command reuses is replaced by the one the cluster really gave.
//! A block a cluster cannot run says why in a comment just above it:
//! `<!-- console: not run: REASON -->`; `<!-- console: without a cluster -->`
//! runs it before the cluster starts. `cargo build` lines are skipped (the
//! binaries are built). Each document runs its blocks in order on one
//! cluster, so a later block sees what an earlier one did.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use regex::Regex;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Run,
    WithoutCluster,
    NotRun(String),
}

#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
}

#[derive(Debug)]
struct Block {
    at: String,
    kind: Kind,
    steps: Vec<Step>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The console blocks of a Markdown file, with the marker above each.
fn blocks(file: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if fence != "```console" {
            i += 1;
            continue;
        }
        let indent = lines[i].len() - fence.len();
        let marker = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim())
            .unwrap_or("");
        let kind = if let Some(why) = marker
            .strip_prefix("<!-- console: not run: ")
            .and_then(|m| m.strip_suffix(" -->"))
        {
            Kind::NotRun(why.to_string())
        } else if marker == "<!-- console: without a cluster -->" {
            Kind::WithoutCluster
        } else {
            Kind::Run
        };
        let at = format!("{file}:{}", i + 1);
        let mut steps: Vec<Step> = Vec::new();
        i += 1;
        let mut continuing = false;
        while i < lines.len() && lines[i].trim() != "```" {
            let line = lines[i].get(indent..).unwrap_or(lines[i].trim_start());
            if continuing {
                let step = steps.last_mut().unwrap();
                step.command.push('\n');
                step.command.push_str(line);
                continuing = line.ends_with('\\');
            } else if let Some(command) = line.strip_prefix("$ ") {
                steps.push(Step {
                    command: command.to_string(),
                    expected: Vec::new(),
                });
                continuing = command.ends_with('\\');
            } else if let Some(step) = steps.last_mut() {
                step.expected.push(line.to_string());
            }
            i += 1;
        }
        out.push(Block { at, kind, steps });
        i += 1;
    }
    out
}

struct Alike {
    time: Regex,
    uuid: Regex,
    b64: Regex,
    duration: Regex,
    number: Regex,
    token: Regex,
    token_flag: Regex,
}

impl Alike {
    fn new() -> Self {
        Alike {
            time: Regex::new(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z").unwrap(),
            uuid: Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
                .unwrap(),
            b64: Regex::new(r"[A-Za-z0-9+/]{22}==").unwrap(),
            duration: Regex::new(r"\b\d+(h|m|s|ms|us|ns)( \d+(h|m|s|ms|us|ns))*\b").unwrap(),
            number: Regex::new(r"\d+").unwrap(),
            token: Regex::new(r#"token\W{1,3}(\d+)"#).unwrap(),
            // `--token 1`, and `\"token\":\"1\"` in a JSON body in a shell string.
            token_flag: Regex::new(r#"(--token |\\"token\\":\\")(\d+)"#).unwrap(),
        }
    }

    /// A line with its varying parts made alike.
    fn norm(&self, line: &str) -> String {
        let line = self.time.replace_all(line, "<time>");
        let line = self.uuid.replace_all(&line, "<uuid>");
        let line = self.b64.replace_all(&line, "<id>");
        let line = self.duration.replace_all(&line, "<duration>");
        self.number.replace_all(&line, "<n>").trim_end().to_string()
    }

    /// Whether `actual` shows `expected` (`...` matching anything).
    fn shows(&self, expected: &str, actual: &str) -> bool {
        let mut rest = actual;
        for part in expected.split("...") {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// Runs one command in bash with the block's variables (kept in `state`)
/// and the previous command's exit code as `$?`; its stdout and stderr.
async fn run(
    command: &str,
    state: &Path,
    dir: &Path,
    background: &mut Vec<tokio::process::Child>,
) -> String {
    // bash with the binaries first on PATH, in the repository, and the
    // cluster at its default endpoints.
    let bash = |script: String| {
        let bin = root().join("target/debug");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg("-c")
            .arg(script)
            .current_dir(root())
            .env("PATH", path)
            .env("NO_COLOR", "1")
            .env("TMPDIR", dir)
            .env_remove("FENCED_ENDPOINTS")
            .kill_on_drop(true);
        cmd
    };
    if let Some(server) = command.trim_end().strip_suffix('&') {
        // A server the block starts: bash becomes it (so that it is killed
        // with the test), and it runs until the test ends.
        let child = bash(format!(
            "set -a; [ -f {state} ] && . {state}\nexec {server}",
            state = state.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        background.push(child);
        tokio::time::sleep(Duration::from_secs(2)).await;
        return String::new();
    }
    let mut cmd = bash(format!(
        "set -a; [ -f {state} ] && . {state}; (exit ${{__rc:-0}})\n{command}\n__rc=$?; export -p > {state}.new; mv {state}.new {state}",
        state = state.display()
    ));
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("`{command}` ran for more than 2 minutes"))
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

/// Runs a document's blocks of `kind`; each failure as a message.
async fn check(file: &str, kind: &Kind, dir: &Path, alike: &Alike, failures: &mut Vec<String>) {
    let mut uuids: HashMap<String, String> = HashMap::new();
    let mut tokens: HashMap<String, String> = HashMap::new();
    let mut background = Vec::new();
    for block in blocks(file).into_iter().filter(|b| &b.kind == kind) {
        let state = dir.join(format!("state-{}", block.at.replace(['/', ':'], "-")));
        for step in &block.steps {
            if step.command.starts_with("cargo build") {
                continue;
            }
            let mut command = step
                .command
                .replace("/tmp/", &format!("{}/", dir.display()));
            for (doc, real) in &uuids {
                command = command.replace(doc, real);
            }
            command = alike
                .token_flag
                .replace_all(&command, |c: &regex::Captures| {
                    format!(
                        "{}{}",
                        &c[1],
                        tokens.get(&c[2]).map_or(&c[2], |t| t.as_str())
                    )
                })
                .into_owned();
            let actual = run(&command, &state, dir, &mut background).await;
            let lines: Vec<&str> = actual.lines().collect();
            let mut from = 0;
            for expected in step.expected.iter().filter(|l| !l.trim().is_empty()) {
                let want = alike.norm(expected);
                match lines[from..]
                    .iter()
                    .position(|l| alike.shows(&want, &alike.norm(l)))
                {
                    Some(at) => {
                        let got = lines[from + at];
                        for (d, r) in alike
                            .uuid
                            .find_iter(expected)
                            .zip(alike.uuid.find_iter(got))
                        {
                            uuids.insert(d.as_str().into(), r.as_str().into());
                        }
                        for (d, r) in alike
                            .token
                            .captures_iter(expected)
                            .zip(alike.token.captures_iter(got))
                        {
                            tokens.insert(d[1].to_string(), r[1].to_string());
                        }
                        from += at + 1;
                    }
                    None => {
                        failures.push(format!(
                            "{}: `{}` did not show\n    {expected}\n  it printed:\n{actual}",
                            block.at, step.command
                        ));
                        break;
                    }
                }
            }
        }
    }
}

/// `fenced dev` on its default ports, fresh, in `dir`.
async fn dev_cluster(dir: &Path) -> tokio::process::Child {
    let mut child = tokio::process::Command::new(root().join("target/debug/fenced"))
        .args(["dev", "--fresh", "--data-dir"])
        .arg(dir.join("dev"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let ready = async {
        let mut line = String::new();
        loop {
            line.clear();
            let n = tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
                .await
                .unwrap();
            assert!(n > 0, "fenced dev ended before it was ready");
            if line.starts_with("ready") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), ready)
        .await
        .expect("fenced dev ready within 30 s");
    // Keep reading its output so it never blocks on a full pipe.
    tokio::spawn(async move {
        let mut sink = tokio::io::sink();
        let _ = tokio::io::copy(&mut out, &mut sink).await;
    });
    child
}

#[test]
fn every_console_block_runs_or_says_why_not() {
    for file in ["README.md", "docs/GUIDE.md"] {
        let all = blocks(file);
        assert!(!all.is_empty(), "{file}: no console block found");
        for block in all {
            if let Kind::NotRun(why) = &block.kind {
                assert!(why.len() > 10, "{}: say why it is not run", block.at);
            }
            assert!(
                !block.steps.is_empty(),
                "{}: a console block with no command",
                block.at
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_examples_run_as_written() {
    let alike = Alike::new();
    let mut failures = Vec::new();
    for file in ["README.md", "docs/GUIDE.md"] {
        let dir = tempfile::tempdir().unwrap();
        check(
            file,
            &Kind::WithoutCluster,
            dir.path(),
            &alike,
            &mut failures,
        )
        .await;
        let mut cluster = dev_cluster(dir.path()).await;
        check(file, &Kind::Run, dir.path(), &alike, &mut failures).await;
        let _ = cluster.kill().await;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The ```rust blocks of docs/GUIDE.md are compiled: each stands line for
/// line (indentation aside) in examples/src/guide.rs, inside a function that
/// gives it the context the page leaves out, and the build compiles that.
#[test]
fn every_rust_block_of_the_guide_is_compiled() {
    let guide = std::fs::read_to_string(root().join("docs/GUIDE.md")).unwrap();
    let compiled = std::fs::read_to_string(root().join("examples/src/guide.rs")).unwrap();
    let compiled: Vec<&str> = compiled.lines().map(str::trim).collect();
    let mut found = 0;
    let mut rest = guide.as_str();
    while let Some(start) = rest.find("```rust\n") {
        let body = &rest[start + "```rust\n".len()..];
        let end = body.find("\n```").expect("a closed rust block");
        let block: Vec<&str> = body[..end].lines().map(str::trim).collect();
        assert!(
            compiled.windows(block.len()).any(|w| w == block.as_slice()),
            "this block of docs/GUIDE.md is not in examples/src/guide.rs as written:\n{}",
            &body[..end]
        );
        found += 1;
        rest = &body[end..];
    }
    assert!(
        found >= 6,
        "only {found} rust blocks found in docs/GUIDE.md"
    );
}
