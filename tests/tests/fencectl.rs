//! fencectl against a real cluster: every outcome, its JSON and its exit code.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_tests::Cluster;
use serde_json::Value;

fn run(cluster: &Cluster, args: &[&str]) -> (i32, Value) {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = cluster.fencectl(&full);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let value: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not one JSON object ({e}): {stdout:?} {:?}",
            out.stderr
        )
    });
    (out.status.code().unwrap(), value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_through_fencectl_json_with_exit_codes() {
    let cluster = Cluster::start(3).await;

    let (code, granted) = run(&cluster, &["acquire", "cli-res", "--ttl", "30s"]);
    assert_eq!(code, 0);
    assert_eq!(granted["status"], "granted");
    assert_eq!(granted["ttl_ms"], 30_000);
    assert!(granted["expires_at_ms"].as_u64().unwrap() > 0);
    let token = granted["token"].as_u64().unwrap();
    let owner = granted["owner_id"].as_str().unwrap().to_string();
    let token_s = token.to_string();

    let (code, held) = run(&cluster, &["acquire", "cli-res", "--ttl", "30s"]);
    assert_eq!((code, held["status"].as_str()), (3, Some("held")));
    assert_eq!(held["current_token"].as_u64(), Some(token));
    assert!(held["remaining_ms"].as_u64().unwrap() > 0);

    // The same owner again: the same grant (a retry after a lost reply).
    let (code, again) = run(
        &cluster,
        &["acquire", "cli-res", "--ttl", "30s", "--owner-id", &owner],
    );
    assert_eq!((code, again["token"].as_u64()), (0, Some(token)));

    let renew = [
        "renew",
        "cli-res",
        "--owner-id",
        &owner,
        "--token",
        &token_s,
        "--ttl",
        "20s",
    ];
    let (code, renewed) = run(&cluster, &renew);
    assert_eq!((code, renewed["status"].as_str()), (0, Some("renewed")));
    assert_eq!(renewed["ttl_ms"], 20_000);

    let (code, d) = run(&cluster, &["describe", "cli-res"]);
    assert_eq!(code, 0);
    assert_eq!(
        (d["held"].as_bool(), d["last_token"].as_u64()),
        (Some(true), Some(token))
    );
    assert!(d["remaining_ms"].as_u64().unwrap() > 0);

    let stranger = "6f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b";
    let (code, not_holder) = run(
        &cluster,
        &[
            "release",
            "cli-res",
            "--owner-id",
            stranger,
            "--token",
            &token_s,
        ],
    );
    assert_eq!(
        (code, not_holder["status"].as_str()),
        (3, Some("not_holder"))
    );
    assert_eq!(not_holder["reason"], "unknown");

    let (code, released) = run(
        &cluster,
        &[
            "release",
            "cli-res",
            "--owner-id",
            &owner,
            "--token",
            &token_s,
        ],
    );
    assert_eq!((code, released["status"].as_str()), (0, Some("released")));

    let (code, lost) = run(&cluster, &renew);
    assert_eq!(
        (code, lost["status"].as_str(), lost["reason"].as_str()),
        (3, Some("lost"), Some("released"))
    );

    // The owner id is spent: acquiring with it again grants nothing.
    let (code, ended) = run(
        &cluster,
        &["acquire", "cli-res", "--ttl", "30s", "--owner-id", &owner],
    );
    assert_eq!(
        (code, ended["status"].as_str(), ended["reason"].as_str()),
        (3, Some("ended"), Some("released"))
    );
    // `--owner`, the flag's name before `--owner-id`, still works (hidden).
    let out = cluster.fencectl(&["acquire", "cli-res", "--ttl", "30s", "--owner", &owner]);
    assert_eq!(out.status.code(), Some(3));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("ended cli-res: ") && text.contains("released"),
        "{text}"
    );

    let (code, next) = run(&cluster, &["acquire", "cli-res", "--ttl", "30s"]);
    assert_eq!(code, 0);
    let next_token = next["token"].as_u64().unwrap();
    assert!(next_token > token, "the next acquire has a higher token");

    let (code, superseded) = run(
        &cluster,
        &["acquire", "cli-res", "--ttl", "30s", "--owner-id", &owner],
    );
    assert_eq!(
        (code, superseded["reason"].as_str()),
        (3, Some("superseded"))
    );
    assert_eq!(superseded["current_token"].as_u64(), Some(next_token));

    let (code, status) = run(&cluster, &["status"]);
    assert_eq!(code, 0);
    assert!(status["leader_id"].as_u64().unwrap() >= 1);
    assert!(status["term"].as_u64().unwrap() >= 1);
    assert_eq!(status["members"].as_array().unwrap().len(), 3);
    assert!(status["last_applied"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_usage_and_bad_input_exit_with_2_and_unreachable_with_6() {
    let cluster = Cluster::start(3).await;
    let out = cluster.fencectl(&["acquire", "x"]); // --ttl missing
    assert_eq!(out.status.code(), Some(2));
    let out = cluster.fencectl(&["acquire", "x", "--ttl", "10ms"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ttl_ms: must be between 1000 and 3600000")
    );
    let out = std::process::Command::new(fenced_tests::bin("fencectl"))
        .args([
            "--endpoints",
            &format!("127.0.0.1:{}", fenced_tests::free_port()),
        ])
        .args(["--timeout", "1s", "describe", "x"])
        .output()
        .unwrap();
    // 6: no node answered within --timeout, worth retrying later.
    assert_eq!(out.status.code(), Some(6));
}

/// A bearer token is never sent in plaintext to a remote address: fencectl
/// refuses before connecting, naming the endpoint and saying to use TLS;
/// on loopback it goes (and the call proceeds: here, to a closed port).
#[test]
fn fencectl_refuses_a_token_over_plaintext_to_a_remote_endpoint() {
    let fencectl = |endpoint: &str, how: &[&str], env: Option<&str>| {
        let mut cmd = std::process::Command::new(fenced_tests::bin("fencectl"));
        cmd.env_remove("FENCED_TOKEN")
            .env_remove("FENCED_TOKEN_FILE")
            .args(["--endpoints", endpoint, "--timeout", "1s"])
            .args(how)
            .args(["describe", "x"]);
        if let Some(token) = env {
            cmd.env("FENCED_TOKEN", token);
        }
        cmd.output().unwrap()
    };
    for (how, env) in [
        (&["--token", "secret"][..], None),
        (&[][..], Some("secret")),
    ] {
        let out = fencectl("192.0.2.7:7101", how, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("192.0.2.7:7101")
                && stderr.contains("plaintext")
                && stderr.contains("https://"),
            "{stderr}"
        );
        assert!(!stderr.contains("secret"), "{stderr}");
    }
    let closed = format!("127.0.0.1:{}", fenced_tests::free_port());
    let out = fencectl(&closed, &["--token", "secret"], None);
    assert_eq!(out.status.code(), Some(6), "{:?}", out.stderr);
}

/// With nothing listening at any endpoint, a command fails within a second
/// (exit 6, naming the endpoints), not after the 10 s --timeout.
#[test]
fn every_endpoint_refusing_fails_within_a_second_with_6() {
    let ports: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", fenced_tests::free_port()))
        .collect();
    for command in [
        &["acquire", "x", "--ttl", "30s"][..],
        &["describe", "x"],
        &["kv", "get", "k"],
        &["lock", "x", "--ttl", "30s", "--wait", "1m"],
    ] {
        let started = std::time::Instant::now();
        let out = std::process::Command::new(fenced_tests::bin("fencectl"))
            .args(["--endpoints", &ports.join(",")])
            .args(command)
            .output()
            .unwrap();
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(6), "{command:?}: {stderr}");
        assert!(
            took < std::time::Duration::from_secs(1),
            "{command:?} took {took:?}"
        );
        assert!(
            stderr.contains("connection refused") && stderr.contains(&ports[2]),
            "{command:?}: {stderr}"
        );
    }
}

/// While an acquire waits for a held resource, stderr says who holds it and
/// for how long; --json and --quiet keep stderr quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_says_who_holds_and_for_how_long() {
    let cluster = Cluster::start(3).await;
    for (flags, talks) in [(&[][..], true), (&["--quiet"], false), (&["--json"], false)] {
        let resource = format!(
            "held-{}",
            flags.len() + usize::from(flags.contains(&"--json"))
        );
        let (code, first) = run(&cluster, &["acquire", &resource, "--ttl", "3s"]);
        assert_eq!(code, 0, "{first}");
        let mut args = flags.to_vec();
        args.extend(["acquire", &resource, "--ttl", "5s", "--wait", "20s"]);
        let out = cluster.fencectl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {stderr}");
        let said = format!("waiting for {resource}: held by token {}", first["token"]);
        assert_eq!(stderr.contains(&said), talks, "{flags:?}: {stderr}");
        if talks {
            assert!(stderr.contains("s left"), "{stderr}");
            // At most a line a second over a wait of about 3 s.
            assert!(stderr.lines().count() <= 4, "{stderr}");
        } else {
            assert!(stderr.is_empty(), "{flags:?}: {stderr}");
        }
    }
}

/// Every flag of the commands that take a lease is explained, with the
/// bounds the cluster applies.
#[test]
fn help_explains_ttl_wait_and_their_bounds() {
    for command in ["acquire", "lock", "run"] {
        let out = std::process::Command::new(fenced_tests::bin("fencectl"))
            .args([command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{help}");
        for needed in ["--ttl <TTL>", "--wait <WAIT>", "1s", "1h", "1 to 200 bytes"] {
            assert!(
                help.contains(needed),
                "{command} --help lacks {needed:?}: {help}"
            );
        }
        // Each flag is explained on its line (clap puts the text beside it).
        for flag in ["--ttl <TTL>", "--wait <WAIT>"] {
            let line = help
                .lines()
                .find(|l| l.trim_start().starts_with(flag))
                .unwrap();
            let text = line
                .split_once(flag)
                .map(|(_, t)| t.trim())
                .unwrap_or_default();
            assert!(text.len() > 20, "{command}: {flag} unexplained: {line:?}");
        }
    }
}

/// Every argument and flag of every fencectl command has an explanation in
/// its `--help` (clap puts it on the same line).
#[test]
fn every_flag_of_every_command_is_explained() {
    let help = |args: &[&str]| {
        let out = std::process::Command::new(fenced_tests::bin("fencectl"))
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let commands = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .filter(|c| c != "help")
            .collect()
    };
    let mut todo: Vec<Vec<String>> = commands(&help(&[])).into_iter().map(|c| vec![c]).collect();
    let mut checked = 0;
    let mut unexplained = Vec::new();
    while let Some(path) = todo.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        for sub in commands(&text) {
            let mut deeper = path.clone();
            deeper.push(sub);
            todo.push(deeper);
        }
        // An item starts with `-`, `<` or `[`; its text follows on its line
        // or, when clap lays the list out long, on the next one.
        let lines: Vec<&str> = text.lines().collect();
        let mut in_list = false;
        for (i, line) in lines.iter().enumerate() {
            if *line == "Arguments:" || *line == "Options:" {
                in_list = true;
                continue;
            }
            if line.is_empty() || !line.starts_with(' ') {
                in_list = false;
                continue;
            }
            let item = line.trim_start();
            if !in_list || !item.starts_with(['-', '<', '[']) {
                continue;
            }
            let same_line = item.find("  ").map(|at| item[at..].trim()).unwrap_or("");
            let next_line = lines
                .get(i + 1)
                .map(|l| l.trim_start())
                .filter(|l| !l.starts_with(['-', '<', '[']))
                .unwrap_or("");
            let explained = if same_line.is_empty() {
                next_line
            } else {
                same_line
            };
            if explained.len() < 10 {
                unexplained.push(format!("fencectl {}: {}", path.join(" "), item));
            }
            checked += 1;
        }
    }
    assert!(
        checked > 100,
        "only {checked} flags found: the parsing broke"
    );
    assert!(unexplained.is_empty(), "{unexplained:#?}");
}
