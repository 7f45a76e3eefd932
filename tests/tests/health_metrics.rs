//! The gRPC health service (through `fenced healthcheck`) and the Prometheus
//! `/metrics` endpoint, against real nodes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    process::Command,
    time::{Duration, Instant},
};

use fenced_core::OwnerId;
use fenced_proto::v1::{self, acquire_response, release_response, renew_response};
use fenced_tests::{bin, free_port, http_get, Cluster, Within};

/// Runs `fenced healthcheck`; returns its exit code and stdout.
fn healthcheck(endpoint: &str, service: &str) -> (i32, String) {
    let out = Command::new(bin("fenced"))
        .args([
            "healthcheck",
            "--endpoint",
            endpoint,
            "--service",
            service,
            "--timeout-ms",
            "2000",
        ])
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// Polls `fenced healthcheck` until it exits with `code`.
async fn wait_for_health(endpoint: &str, code: i32, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (got, out) = healthcheck(endpoint, "");
        if got == code {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "{endpoint}: healthcheck still exits {got} ({out}) after {within:?}, expected {code}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_serving_only_while_the_node_knows_a_leader() {
    let mut cluster = Cluster::start(3).await;
    for n in cluster.nodes() {
        let out = wait_for_health(&n.client_addr(), 0, Duration::from_secs(5)).await;
        assert!(out.ends_with("SERVING"), "{out}");
        let peer = format!("127.0.0.1:{}", n.peer_port);
        assert_eq!(healthcheck(&peer, ""), (0, format!("{peer}: SERVING")));
        let (code, out) = healthcheck(&n.client_addr(), "fenced.v1.Lock");
        assert_eq!((code, out.ends_with(": SERVING")), (0, true), "{out}");
    }

    // A leader left alone has no quorum: openraft keeps it leader, but it
    // can commit nothing, so it says NOT_SERVING, and stays alive.
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    for id in &others {
        cluster.kill(*id);
    }
    let lone = cluster.nodes()[(leader - 1) as usize].client_addr();
    let out = wait_for_health(&lone, 1, Duration::from_secs(10)).await;
    assert_eq!(out, format!("{lone}: NOT_SERVING"));
    assert_eq!(
        healthcheck(&lone, "liveness"),
        (0, format!("{lone}: SERVING"))
    );

    // A majority again: a leader is elected and the node serves again.
    cluster.spawn(others[0]);
    let out = wait_for_health(&lone, 0, Duration::from_secs(20)).await;
    assert_eq!(out, format!("{lone}: SERVING"));

    // Nothing listening: not healthy, exit 1, reason on stderr.
    let nobody = format!("127.0.0.1:{}", free_port());
    assert_eq!(healthcheck(&nobody, ""), (1, String::new()));
    assert_eq!(
        healthcheck(&lone, "no.such.Service").0,
        1,
        "an unknown service is not healthy"
    );
}

/// Parses a text exposition, checking that every sample's family has HELP
/// and TYPE and that every value is a number.
fn parse_exposition(body: &str) -> BTreeMap<String, f64> {
    let mut typed = Vec::new();
    let mut samples = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let family = parts.next().unwrap().to_string();
            let kind = parts.next().unwrap();
            assert!(
                ["counter", "gauge", "histogram", "summary"].contains(&kind),
                "{line}"
            );
            assert!(
                body.contains(&format!("# HELP {family} ")),
                "{family} has no HELP"
            );
            typed.push(family);
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {line}"));
        let family = name.split('{').next().unwrap();
        assert!(
            typed.iter().any(|f| family == f
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| family.strip_suffix(s) == Some(f.as_str()))),
            "{name} has no TYPE before it"
        );
        assert!(
            samples.insert(name.to_string(), value).is_none(),
            "{name} twice"
        );
    }
    samples
}

/// Every `fenced_...` metric name in a rules or dashboard file.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("fenced_") {
        let preceded = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

fn owner() -> Vec<u8> {
    OwnerId::random().as_bytes().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_the_cluster_did() {
    let mut cluster = Cluster::start(3).await;
    // Restart every node with a metrics listener of its own.
    let mut metrics = BTreeMap::new();
    for id in 1..=3 {
        let addr = format!("127.0.0.1:{}", free_port());
        cluster.kill(id);
        // Snapshots every 10 entries, so the snapshot metrics move.
        cluster.spawn_with(id, |s| {
            s.metrics_listen = Some(addr.clone());
            s.snapshot_logs = Some(Within::new(10).unwrap());
        });
        metrics.insert(id, addr);
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let mut lock = cluster.lock_client(leader);
    let acquire = |resource: &str, owner: &[u8], ttl_ms: u64| v1::AcquireRequest {
        label: String::new(),
        resource: resource.as_bytes().to_vec(),
        owner_id: owner.to_vec(),
        ttl_ms,
        wait_ms: 0,
    };

    // 20 grants at once, so some share a log entry.
    let mut calls = Vec::new();
    for i in 0..20 {
        let mut lock = lock.clone();
        let req = acquire(&format!("metrics-{i}"), &owner(), 60_000);
        calls.push(tokio::spawn(async move { lock.acquire(req).await }));
    }
    let mut last_token = 0;
    for call in calls {
        let reply = call.await.unwrap().unwrap().into_inner();
        let Some(acquire_response::Outcome::Granted(g)) = reply.outcome else {
            panic!("expected a grant: {reply:?}");
        };
        last_token = last_token.max(g.token);
    }
    // One refusal (held), one renewal, one lost renewal, one release, one
    // release by a non-holder (a refusal), one expiry and the grant after it.
    let (a, b) = (owner(), owner());
    let reply = lock
        .acquire(acquire("metrics-0", &b, 60_000))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        reply.outcome,
        Some(acquire_response::Outcome::Held(_))
    ));
    let reply = lock
        .acquire(acquire("metrics-life", &a, 1_000))
        .await
        .unwrap()
        .into_inner();
    let Some(acquire_response::Outcome::Granted(g)) = reply.outcome else {
        panic!("expected a grant: {reply:?}");
    };
    let renew = |owner: &[u8], token| v1::RenewRequest {
        resource: b"metrics-life".to_vec(),
        owner_id: owner.to_vec(),
        token,
        ttl_ms: 1_000,
    };
    let reply = lock.renew(renew(&a, g.token)).await.unwrap().into_inner();
    assert!(matches!(
        reply.outcome,
        Some(renew_response::Outcome::Renewed(_))
    ));
    let reply = lock.renew(renew(&b, g.token)).await.unwrap().into_inner();
    assert!(matches!(
        reply.outcome,
        Some(renew_response::Outcome::Lost(_))
    ));
    let release = |resource: &str, owner: &[u8], token| v1::ReleaseRequest {
        resource: resource.as_bytes().to_vec(),
        owner_id: owner.to_vec(),
        token,
    };
    let reply = lock
        .release(release("metrics-life", &b, g.token))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        reply.outcome,
        Some(release_response::Outcome::NotHolder(_))
    ));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let reply = lock
        .acquire(acquire("metrics-life", &b, 60_000))
        .await
        .unwrap()
        .into_inner();
    let Some(acquire_response::Outcome::Granted(g2)) = reply.outcome else {
        panic!("expected a grant after the expiry: {reply:?}");
    };
    assert!(g2.token > g.token);
    let reply = lock
        .release(release("metrics-life", &b, g2.token))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        reply.outcome,
        Some(release_response::Outcome::Released(_))
    ));
    last_token = last_token.max(g2.token);
    cluster.wait_for_convergence(Duration::from_secs(10)).await;

    let mut scraped = BTreeMap::new();
    for (id, addr) in &metrics {
        let (status, body) = http_get(addr, "/metrics").await;
        assert_eq!(status, 200, "node {id}: {body}");
        scraped.insert(*id, parse_exposition(&body));
    }
    let expected = [
        ("fenced_grants_total", 22.0),
        ("fenced_refusals_total", 2.0),
        ("fenced_renewals_total", 1.0),
        ("fenced_lost_renewals_total", 1.0),
        ("fenced_releases_total", 1.0),
        ("fenced_expiries_total", 1.0),
        ("fenced_applied_commands_total", 27.0),
        ("fenced_live_leases", 20.0),
        ("fenced_last_token", last_token as f64),
    ];
    for (id, m) in &scraped {
        for (name, value) in expected {
            assert_eq!(m.get(name), Some(&value), "node {id}: {name}");
        }
        assert_eq!(
            m["fenced_current_term"], scraped[&leader]["fenced_current_term"],
            "node {id}: every node is in the leader's term"
        );
        assert!(m["fenced_current_term"] >= 1.0);
        assert!(m["fenced_leader_changes_total"] >= 1.0, "node {id}");
        assert_eq!(m["fenced_leader_id"], leader as f64, "node {id}");
        assert_eq!(m["fenced_is_leader"], f64::from(u8::from(*id == leader)));
        // Every applied entry of commands was timed.
        assert_eq!(
            m["fenced_apply_seconds_count"], m["fenced_applied_entries_total"],
            "node {id}"
        );
        assert!(m["fenced_applied_entries_total"] >= 1.0);
        assert_eq!(
            m["fenced_apply_seconds_bucket{le=\"+Inf\"}"],
            m["fenced_apply_seconds_count"]
        );
        assert!(m["fenced_apply_seconds_sum"] > 0.0, "node {id}");
        // Every node fdatasyncs its log: the entries it appended.
        assert!(m["fenced_log_fsync_seconds_count"] >= 1.0, "node {id}");
        assert!(m["fenced_log_fsync_seconds_sum"] > 0.0, "node {id}");
        assert!(m["fenced_log_fsync_max_seconds"] > 0.0, "node {id}");
    }
    // The leader proposed every command this test sent, in some batches.
    let l = &scraped[&leader];
    assert_eq!(l["fenced_proposal_batch_commands_sum"], 27.0);
    let batches = l["fenced_proposal_batch_commands_count"];
    assert!((1.0..=27.0).contains(&batches), "{batches} batches");
    assert_eq!(
        l["fenced_proposal_batch_commands_bucket{le=\"+Inf\"}"],
        batches
    );
    for (id, m) in &scraped {
        if *id != leader {
            assert_eq!(m["fenced_proposal_batch_commands_count"], 0.0, "node {id}");
        }
    }
    // The leader's appends went to its followers while it synced its own.
    assert!(l["fenced_raft_early_appends_total"] >= 1.0, "{l:?}");
    // And the followers' answers to those copies stood in for openraft's own
    // AppendEntries round trips; never more of them than copies sent.
    let answered = l["fenced_raft_appends_answered_early_total"];
    assert!(
        answered >= 1.0 && answered <= l["fenced_raft_early_appends_total"],
        "{l:?}"
    );

    // Every call this test made to the leader, by method and code; the
    // followers answered none of them.
    for (method, calls) in [("Acquire", 23.0), ("Renew", 2.0), ("Release", 2.0)] {
        let ok = format!(
            "fenced_rpc_requests_total{{port=\"client\",method=\"fenced.v1.Lock/{method}\",code=\"OK\"}}"
        );
        let timed = format!(
            "fenced_rpc_duration_seconds_count{{port=\"client\",method=\"fenced.v1.Lock/{method}\"}}"
        );
        assert_eq!(l.get(&ok), Some(&calls), "{ok}");
        assert_eq!(l.get(&timed), Some(&calls), "{timed}");
        for (id, m) in &scraped {
            if *id != leader {
                assert_eq!(m.get(&ok), None, "node {id}: {ok}");
            }
        }
    }
    // The leader reports each follower's lag; a follower reports none.
    for (id, m) in &scraped {
        for follower in (1..=3).filter(|f| *f != leader) {
            let lag = m.get(&format!(
                "fenced_follower_lag_entries{{follower=\"{follower}\"}}"
            ));
            if *id == leader {
                assert!(lag.is_some_and(|l| *l < 10.0), "lag of {follower}: {lag:?}");
            } else {
                assert_eq!(lag, None, "node {id} is not the leader");
            }
        }
        // 27 commands in 10-entry snapshots: every node built at least one.
        assert!(m["fenced_snapshots_built_total"] >= 1.0, "node {id}");
        assert!(m["fenced_snapshot_bytes"] > 0.0, "node {id}");
        assert_eq!(
            m["fenced_snapshot_build_seconds_count"], m["fenced_snapshots_built_total"],
            "node {id}"
        );
        assert!(m["fenced_start_time_seconds"] > 1.7e9, "node {id}");
        assert_eq!(m["fenced_waiters"], 0.0, "node {id}");
        assert_eq!(m["fenced_parked_requests"], 0.0, "node {id}");
        assert_eq!(m["fenced_proposal_queue_depth"], 0.0, "node {id}");
    }
    // The alert rules and the dashboard use only metrics a node exports.
    let families: std::collections::BTreeSet<&str> =
        l.keys().map(|k| k.split('{').next().unwrap()).collect();
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    for file in ["prometheus/alerts.yml", "grafana/fenced.json"] {
        let text = std::fs::read_to_string(deploy.join(file)).unwrap();
        let used = metric_names(&text);
        assert!(used.len() >= 8, "{file} names only {used:?}");
        for name in used {
            assert!(
                families.contains(name.as_str()),
                "{file} uses {name}, which no node exports"
            );
        }
    }

    // A caller waiting for a held resource: one waiter in every replica's
    // table, one parked call on the leader (where it was sent).
    let waiting = {
        let mut lock = lock.clone();
        let mut req = acquire("metrics-0", &owner(), 60_000);
        req.wait_ms = 30_000;
        tokio::spawn(async move { lock.acquire(req).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut seen = BTreeMap::new();
        for (id, addr) in &metrics {
            let (_, body) = http_get(addr, "/metrics").await;
            let m = parse_exposition(&body);
            seen.insert(*id, (m["fenced_waiters"], m["fenced_parked_requests"]));
        }
        let want: BTreeMap<u64, (f64, f64)> = (1..=3)
            .map(|id| (id, (1.0, if id == leader { 1.0 } else { 0.0 })))
            .collect();
        if seen == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "waiters and parked calls: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    waiting.abort();

    let (status, _) = http_get(&metrics[&leader], "/nothing-here").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_digest_is_computed_only_when_asked_and_agrees_across_replicas() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let mut digests = Vec::new();
    // Held until the end: a dropped lease is released.
    let mut leases = Vec::new();
    for round in 0..2 {
        for i in 0..5 {
            let acquired = client
                .acquire(&format!("digest-{round}-{i}"), Duration::from_secs(60))
                .await
                .unwrap();
            let fenced_client::Acquired::Granted(lease) = acquired else {
                panic!("a fresh resource is free");
            };
            leases.push(lease);
        }
        let statuses = cluster.wait_for_convergence(Duration::from_secs(20)).await;
        assert_eq!(statuses.len(), 3);
        let digest = statuses[0].state_digest;
        assert_ne!(digest, 0, "asked for, the digest is computed: {statuses:?}");
        assert!(
            statuses.iter().all(|s| s.state_digest == digest),
            "replicas that applied the same index differ: {statuses:?}"
        );
        digests.push(digest);
        // Not asked for: the node skips the pass over its whole table.
        for id in 1..=3 {
            let plain = cluster.status(id).await.unwrap();
            assert_eq!(plain.state_digest, 0, "node {id}: {plain:?}");
            assert_eq!(plain.live_leases, 5 * (round + 1));
        }
    }
    assert_ne!(digests[0], digests[1], "five more leases, the same digest");
}

/// `promtool` on PATH, or none when it is not installed and this is not CI;
/// under CI a missing promtool fails (.ci/run installs it).
fn promtool() -> Option<std::path::PathBuf> {
    fenced_tests::tool_on_path(
        &["promtool"],
        "`promtool check metrics` of the exposition needs promtool (Prometheus; .ci/run \
         installs it); the strict parser still ran",
    )
}

/// Calls `path` on `addr` as a unary gRPC call; the answer does not matter.
async fn call_path(addr: &str, path: &str) {
    use tonic::codegen::http::uri::PathAndQuery;
    let Ok(path) = PathAndQuery::try_from(path) else {
        return;
    };
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<v1::DescribeRequest, v1::DescribeResponse>::default();
    let _ = grpc
        .unary(
            tonic::Request::new(v1::DescribeRequest::default()),
            path,
            codec,
        )
        .await;
}

/// The attack on `/metrics`: one unauthenticated call to
/// `/fenced.v1.x",port="peer` used to become a label with its quotes
/// unescaped, and Prometheus refused every scrape of the node after it;
/// invented method names pushed the real ones into `other`. Now only
/// routed methods are labels, the rest count as `unknown`, and the
/// exposition stays well formed (by the strict parser, and promtool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_paths_cannot_write_into_metrics() {
    let addr = format!("127.0.0.1:{}", free_port());
    let cluster = Cluster::start_with(1, |s| s.metrics_listen = Some(addr.clone())).await;
    let node = &cluster.nodes()[0];
    let (client, peer) = (node.client_addr(), format!("127.0.0.1:{}", node.peer_port));
    let mut hostile: Vec<String> = [
        "/fenced.v1.x\",port=\"peer",
        "/fenced.v1.Lock/Acquire\"} 1",
        "/fenced.v1.Lock/Acquire\\",
        "/fenced.v1.Lock/{Acquire}",
        "/fenced.v1.Lock/Acquire%0A",
        "/grpc.health.v1.Health/Check\\n",
    ]
    .map(String::from)
    .to_vec();
    hostile.push(format!("/fenced.v1.Lock/{}", "A".repeat(4096)));
    for i in 0..100 {
        hostile.push(format!("/fenced.v1.Lock/Invented{i}"));
    }
    // The attack's own path is one the client library sends as is.
    assert!(tonic::codegen::http::uri::PathAndQuery::try_from(hostile[0].as_str()).is_ok());
    for path in &hostile {
        call_path(&client, path).await;
        call_path(&peer, path).await;
    }
    // A real method after the flood still gets its own series.
    let mut lock = cluster.lock_client(1);
    lock.describe(v1::DescribeRequest {
        resource: b"metrics/after-the-flood".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();

    let (status, body) = http_get(&addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    fenced_server::observe::exposition::check(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    assert!(!body.contains("fenced.v1.x"), "{body}");
    assert!(!body.contains("Invented"), "{body}");
    assert!(!body.contains("method=\"other\""), "{body}");
    assert!(
        body.contains("fenced_rpc_requests_total{port=\"client\",method=\"unknown\","),
        "{body}"
    );
    assert!(
        body.contains(
            "fenced_rpc_requests_total{port=\"client\",method=\"fenced.v1.Lock/Describe\",code=\"OK\"} 1\n"
        ),
        "{body}"
    );
    for line in body.lines().filter(|l| l.contains("method=\"")) {
        let method = line
            .split("method=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(
            method == "unknown"
                || fenced_proto::METHODS.contains(&method)
                || method.starts_with("grpc.health.v1.Health/"),
            "{method:?} became a label: {line}"
        );
    }
    if let Some(promtool) = promtool() {
        use std::io::Write;
        let mut child = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Lint findings (naming advice) exit 3; a parse error exits 1.
        assert!(
            !said.contains("error while linting") && !said.contains("text format parsing error"),
            "promtool refused the exposition: {said}\n{body}"
        );
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "promtool: {:?} {said}",
            out.status
        );
    }
}
