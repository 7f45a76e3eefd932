//! A new user's first minutes: `fenced dev` says where everything is and when
//! the cluster is ready, logs nothing alarming on a clean start, and every
//! error of fencectl says what was tried and what to do next.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use fenced_tests::{bin, free_port, port_range, Cluster};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

/// How long a dev cluster may take to say it is ready, on a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A base port whose dev ports (base+i, base+100+i, base+2000+i for i in
/// 1..=5) are all free, within this test's port range.
fn free_base_port() -> u16 {
    let (low, span) = port_range();
    for _ in 0..200 {
        // free_port hands out a different port of the range each call:
        // folded into its first `span - 2005`, every candidate's dev ports
        // stay inside it (a base near the top would reach past it, into
        // another test's ports or the ephemeral range).
        let folded =
            (u32::from(free_port()).saturating_sub(low)) % span.saturating_sub(2_005).max(1);
        let base = u16::try_from(low + folded).unwrap_or(u16::MAX);
        let all_free = (1..=5u16).all(|i| {
            [base + i, base + 100 + i, base + 2000 + i]
                .iter()
                .all(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        });
        if all_free {
            return base;
        }
    }
    panic!("no free base port for a dev cluster");
}

/// A running `fenced dev` and the lines it printed so far.
struct Dev {
    child: Child,
    lines: mpsc::Receiver<String>,
    out: Vec<String>,
}

impl Dev {
    fn start(dir: &Path, base: u16, extra: &[&str]) -> Dev {
        let mut child = Command::new(bin("fenced"))
            .args(["dev", "--data-dir"])
            .arg(dir)
            .args(["--base-port", &base.to_string()])
            .args(extra)
            .env_remove("FENCED_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fenced dev starts");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Dev {
            child,
            lines,
            out: Vec::new(),
        }
    }

    /// Reads lines until one contains `needle`; returns it.
    fn wait_for(&mut self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.out.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {needle:?} within {within:?}; printed:\n{}",
                    self.out.join("\n")
                ),
            }
        }
    }

    /// Ctrl-C; returns the exit code and the rest of stdout.
    fn interrupt(mut self) -> (Option<i32>, String) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT).expect("SIGINT");
        let deadline = Instant::now() + Duration::from_secs(15);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "fenced dev did not stop on Ctrl-C"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let rest: Vec<String> = self.lines.try_iter().collect();
        self.out.extend(rest);
        (status.code(), self.out.join("\n"))
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every line at WARN or ERROR in `text`.
fn alarms(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.contains(" WARN ") || l.contains("ERROR"))
        .collect()
}

#[test]
fn dev_prints_its_addresses_then_a_ready_line_and_logs_nothing_alarming() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("dev");
    let base = free_base_port();
    let mut dev = Dev::start(&dir, base, &["--fresh"]);
    let started = Instant::now();
    let ready = dev.wait_for("ready in", READY_WITHIN);
    let took = started.elapsed();
    let banner = dev.out.join("\n");
    for i in 1..=3u16 {
        for addr in [base + i, base + 100 + i, base + 2000 + i] {
            assert!(
                banner.contains(&format!("127.0.0.1:{addr}")),
                "the banner names 127.0.0.1:{addr}:\n{banner}"
            );
        }
        let data = dir.join(format!("node{i}"));
        assert!(banner.contains(&data.display().to_string()), "{banner}");
    }
    assert!(ready.contains("leads 3 members"), "{ready}");
    let leader = ready
        .split("node ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|id| id.parse::<u64>().ok());
    assert!(
        leader.is_some_and(|id| (1..=3).contains(&id)),
        "the ready line names the leader: {ready}"
    );
    dev.wait_for("status", Duration::from_secs(5));
    let printed = dev.out.join("\n");
    assert!(
        printed.contains("acquire demo --ttl 30s"),
        "the next step is printed:\n{printed}"
    );
    eprintln!("fenced dev ready after {took:?} (bound {READY_WITHIN:?})");

    // The cluster serves, and the next step works as printed.
    let endpoints: Vec<String> = (1..=3).map(|i| format!("127.0.0.1:{}", base + i)).collect();
    let out = Command::new(bin("fencectl"))
        .args([
            "--endpoints",
            &endpoints.join(","),
            "acquire",
            "demo",
            "--ttl",
            "30s",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let (code, printed) = dev.interrupt();
    assert_eq!(code, Some(0), "{printed}");
    let stopped: Vec<&str> = printed.lines().filter(|l| l.contains("stopped")).collect();
    assert_eq!(stopped.len(), 1, "one line at Ctrl-C:\n{printed}");

    for i in 1..=3 {
        let log = dir.join("logs").join(format!("node{i}.log"));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains(&format!("node started node={i}")),
            "node {i}'s lines are in its own file:\n{text}"
        );
        assert!(
            alarms(&text).is_empty(),
            "node {i} logged warnings or errors on a clean start:\n{}",
            alarms(&text).join("\n")
        );
    }
}

#[test]
fn dev_runs_five_nodes_that_all_know_five_members() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("dev5");
    let base = free_base_port();
    let mut dev = Dev::start(&dir, base, &["--fresh", "--nodes", "5"]);
    let ready = dev.wait_for("ready in", READY_WITHIN);
    assert!(ready.contains("leads 5 members"), "{ready}");
    let next = dev.wait_for("acquire demo", Duration::from_secs(5));
    assert!(
        next.contains("--endpoints 127.0.0.1:"),
        "off the default ports the next step names the endpoints: {next}"
    );
    let endpoints: Vec<String> = (1..=5).map(|i| format!("127.0.0.1:{}", base + i)).collect();
    let out = Command::new(bin("fencectl"))
        .args(["--endpoints", &endpoints.join(","), "--json", "status"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(5),
        "{status}"
    );
    let nodes = status["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 5, "{status}");
    assert!(nodes.iter().all(|n| n["error"].is_null()), "{status}");
    let (code, printed) = dev.interrupt();
    assert_eq!(code, Some(0), "{printed}");
    for i in 1..=5 {
        let text = std::fs::read_to_string(dir.join("logs").join(format!("node{i}.log"))).unwrap();
        assert!(
            alarms(&text).is_empty(),
            "node {i}:\n{}",
            alarms(&text).join("\n")
        );
    }
}

#[test]
fn dev_refuses_a_node_count_it_does_not_run() {
    let out = Command::new(bin("fenced"))
        .args(["dev", "--nodes", "4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--nodes") && err.contains("1, 3 or 5"),
        "{err}"
    );
}

/// The planted bugs of the checkers' canary runs exist only in a build
/// with the `canaries` feature: a real node asked for one refuses to start
/// rather than run as if it were planted, or silently ignore the ask.
#[test]
fn a_real_build_refuses_to_plant_a_canary() {
    for name in ["skip-checksum", "no-such-canary"] {
        let out = Command::new(bin("fenced"))
            .args(["dev", "--nodes", "1"])
            .env("FENCED_CANARY", name)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(name), "{name}: {err}");
        let why = if name == "no-such-canary" {
            "is not one of"
        } else {
            "this build has no canaries"
        };
        assert!(err.contains(why), "{name}: {err}");
    }
}

#[test]
fn fresh_refuses_a_directory_fenced_dev_did_not_make() {
    let root = tempfile::tempdir().unwrap();
    let precious = root.path().join("data");
    std::fs::create_dir_all(precious.join("raft-log")).unwrap();
    std::fs::write(precious.join("keep.txt"), "mine").unwrap();
    let out = Command::new(bin("fenced"))
        .args(["dev", "--fresh", "--data-dir"])
        .arg(&precious)
        .args(["--base-port", &free_base_port().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a fenced dev data directory"), "{err}");
    assert_eq!(
        std::fs::read_to_string(precious.join("keep.txt")).unwrap(),
        "mine"
    );
    assert!(precious.join("raft-log").is_dir());
}

#[test]
fn fencectl_against_nothing_names_the_endpoints_and_what_to_do() {
    let endpoints = [
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    ];
    for args in [
        vec!["--timeout", "1s", "acquire", "x", "--ttl", "5s"],
        vec!["status"],
    ] {
        let out = Command::new(bin("fencectl"))
            .args(["--endpoints", &endpoints.join(",")])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(6), "exit 6 for {args:?}: {err}");
        assert!(
            err.contains(&format!(
                "no node answered at {}, {}",
                endpoints[0], endpoints[1]
            )),
            "{err}"
        );
        assert!(err.contains("connection refused"), "{err}");
        assert!(err.contains("start one with `fenced dev`"), "{err}");
    }
}

#[tokio::test]
async fn a_node_without_a_leader_says_who_it_is_and_what_it_reaches() {
    let mut cluster = Cluster::stopped(3, |_| {});
    cluster.spawn(1);
    // Until the node listens (a loaded machine starts it slowly); its
    // pre-votes meanwhile find nodes 2 and 3 down.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (out, err) = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let out = Command::new(bin("fencectl"))
            .args(["--endpoints", &cluster.nodes()[0].client_addr()])
            .args(["--timeout", "2s", "describe", "x"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if !err.contains("no node answered") || Instant::now() > deadline {
            break (out, err);
        }
    };
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(
        err.contains("node 1 has no leader: 1 of 3 members reachable"),
        "{err}\n{}",
        cluster.logs()
    );
}

#[tokio::test]
async fn a_clean_start_of_fenced_run_logs_nothing_alarming() {
    let cluster = Cluster::start(3).await;
    cluster.wait_for_convergence(Duration::from_secs(20)).await;
    // A while of heartbeats after the election.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for node in cluster.nodes() {
        let text = std::fs::read_to_string(&node.log).unwrap();
        assert!(
            alarms(&text).is_empty(),
            "node {} logged warnings or errors on a clean start:\n{}",
            node.id,
            alarms(&text).join("\n")
        );
    }
}

#[test]
fn completions_are_scripts_bash_accepts() {
    let root = tempfile::tempdir().unwrap();
    for program in ["fencectl", "fenced"] {
        for shell in ["bash", "zsh", "fish"] {
            let out = Command::new(bin(program))
                .args(["completions", shell])
                .output()
                .unwrap();
            assert!(out.status.success(), "{program} {shell}: {out:?}");
            let script = String::from_utf8_lossy(&out.stdout);
            assert!(
                script.contains(program) && script.lines().count() > 10,
                "{program} {shell}: {script}"
            );
            if shell == "bash" {
                let path = root.path().join(format!("{program}.bash"));
                std::fs::write(&path, &out.stdout).unwrap();
                let check = Command::new("bash").arg("-n").arg(&path).output().unwrap();
                assert!(check.status.success(), "bash -n {program}: {check:?}");
            }
        }
    }
}

/// The subcommands listed under "Commands:" in a help text, `help` aside.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Checks that `program path.. --help` and every subcommand's help below it
/// carry examples; returns how many helps were read.
fn every_help_has_examples(program: &str, path: &[String]) -> usize {
    let out = Command::new(bin(program))
        .args(path)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{program} {path:?} --help: {out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Examples:"),
        "{program} {} --help has no examples:\n{help}",
        path.join(" ")
    );
    let mut read = 1;
    for sub in subcommands(&help) {
        let mut deeper = path.to_vec();
        deeper.push(sub);
        read += every_help_has_examples(program, &deeper);
    }
    read
}

#[test]
fn every_command_and_subcommand_help_has_examples() {
    // fencectl: itself, 10 commands, 2 under `resource`, 3 under `kv`.
    assert!(every_help_has_examples("fencectl", &[]) >= 16);
    // fenced: itself, 6 commands, 4 under `certs`, 2 under `auth`.
    assert!(every_help_has_examples("fenced", &[]) >= 13);
}

/// A node whose stderr goes to a file (a service manager, `2> node.log`)
/// writes plain text: no terminal colour codes for grep and log shippers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_logging_to_a_file_writes_no_colour_codes() {
    let cluster = Cluster::start(3).await;
    cluster.client().describe("colour").await.unwrap();
    let log = cluster.log_of(1);
    assert!(log.contains("INFO"), "node 1 logged nothing: {log:?}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file: {log:?}"
    );
}
