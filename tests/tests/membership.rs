//! Growing, shrinking and replacing nodes with real processes: `fenced run
//! --join`, `fencectl member list|add|promote|remove`, under load, with
//! every grant's token checked.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use fenced_client::{AcquireOutcome, Client, LostReason, ReleaseOutcome};
use fenced_core::OwnerId;
use fenced_proto::v1::{self, cluster_client::ClusterClient};
use fenced_tests::{bin, write_auth_files, Cluster};
use nix::sys::signal::Signal;
use tonic::{transport::Channel, Code};

/// Tokens seen per resource, in the order their grants were recorded; a
/// holder records before it releases, so grants of one resource are
/// recorded in the order they were committed.
#[derive(Default)]
struct Ledger {
    last: Mutex<HashMap<String, u64>>,
    /// When each (resource, token) grant reached its worker.
    seen: Mutex<HashMap<(String, u64), Instant>>,
    grants: AtomicU64,
}

impl Ledger {
    fn record(&self, resource: &str, token: u64) {
        let mut last = self.last.lock().unwrap();
        let prev = last.insert(resource.to_string(), token).unwrap_or(0);
        assert!(
            token > prev,
            "{resource}: token {token} granted after token {prev}: not strictly increasing"
        );
        self.seen
            .lock()
            .unwrap()
            .insert((resource.to_string(), token), Instant::now());
        self.grants.fetch_add(1, Ordering::Relaxed);
    }

    /// When the grant of `token` on `resource` reached its worker, if yet.
    fn seen_at(&self, resource: &str, token: u64) -> Option<Instant> {
        self.seen
            .lock()
            .unwrap()
            .get(&(resource.to_string(), token))
            .copied()
    }
}

/// Workers that take and release leases on a few shared resources until
/// `stop`, recording every grant.
fn start_load(
    client: Client,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4)
        .map(|w| {
            let (client, ledger, stop) = (client.clone(), Arc::clone(&ledger), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let resource = format!("members/r{}", (w + i) % 3);
                    let owner = OwnerId::random();
                    let ttl = Duration::from_secs(20);
                    match client
                        .acquire_once(&resource, owner, ttl, Duration::from_millis(500))
                        .await
                    {
                        Ok(AcquireOutcome::Granted { token, .. }) => {
                            ledger.record(&resource, token.get());
                            // A lost release only leaves the lease to expire.
                            let sent = Instant::now();
                            match client.release(&resource, owner, token).await {
                                Ok(ReleaseOutcome::NotHolder(LostReason::Superseded {
                                    current_token,
                                })) => {
                                    // A retry whose first attempt released
                                    // (its answer lost in a leader change)
                                    // finds the next owner. That owner's
                                    // grant must not have reached it before
                                    // this release was even sent.
                                    let other = ledger.seen_at(&resource, current_token.get());
                                    assert!(
                                        other.is_none_or(|at| at > sent),
                                        "{resource}: token {current_token} was granted while \
                                         token {token} was held and not yet released"
                                    );
                                }
                                r @ Ok(ReleaseOutcome::NotHolder(_)) => panic!(
                                    "{resource}: the holder of token {token} could not release: {r:?}"
                                ),
                                _ => {}
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            assert!(e.is_transient(), "acquire on {resource}: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            })
        })
        .collect()
}

/// `fencectl ARGS` against the cluster; the output when it succeeded.
fn ctl(cluster: &Cluster, args: &[&str]) -> String {
    let out = cluster.fencectl(args);
    assert!(
        out.status.success(),
        "fencectl {args:?} failed ({:?}): {}{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cluster.logs()
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `fencectl ARGS` that must fail; its exit code and stderr.
fn ctl_refused(cluster: &Cluster, args: &[&str]) -> (Option<i32>, String) {
    let out = cluster.fencectl(args);
    assert!(
        !out.status.success(),
        "fencectl {args:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The members as `fencectl member list --json` shows them: id -> role.
fn roles(cluster: &Cluster, extra: &[&str]) -> HashMap<u64, String> {
    let mut args = extra.to_vec();
    args.extend(["--json", "member", "list"]);
    let out: serde_json::Value = serde_json::from_str(ctl(cluster, &args).trim()).unwrap();
    out["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_u64().unwrap(),
                m["role"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Waits until node `id` is a member in `role`.
async fn wait_for_role(cluster: &Cluster, extra: &[&str], id: u64, role: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = roles(cluster, extra);
        if now.get(&id).map(String::as_str) == Some(role) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {id} is not a {role} within {within:?}: {now:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The current leader's id, asked of node `via`.
async fn leader_via(cluster: &Cluster, via: u64) -> u64 {
    cluster.status(via).await.map_or(0, |s| s.leader_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grow_replace_and_shrink_under_load() {
    let mut cluster = Cluster::start(3).await;
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    // The load's client knows every address any node will have.
    let load = start_load(cluster.client(), Arc::clone(&ledger), Arc::clone(&stop));
    let mut last_token = 0;
    let mut check_token = |s: Option<v1::StatusResponse>| {
        if let Some(s) = s {
            assert!(
                s.last_token >= last_token,
                "last token went back from {last_token} to {}",
                s.last_token
            );
            last_token = s.last_token;
        }
    };

    // Grow 3 -> 5: two new nodes join as learners, then are promoted.
    for id in [4, 5] {
        cluster.join_node(id, None);
        wait_for_role(&cluster, &[], id, "learner", Duration::from_secs(30)).await;
        let out = ctl(
            &cluster,
            &["member", "promote", &id.to_string(), "--wait", "30s"],
        );
        assert!(out.contains(&format!("promoted node {id}")), "{out}");
        check_token(cluster.status(1).await);
    }
    let now = roles(&cluster, &[]);
    assert_eq!(
        now.values().filter(|r| *r == "voter").count(),
        5,
        "five voters: {now:?}"
    );
    let list = ctl(&cluster, &["member", "list"]);
    assert!(list.contains("learner is promoted within"), "{list}");

    // Replace a dead follower: remove its id, a new id at the same address.
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let dead = [2, 3].into_iter().find(|id| *id != leader).unwrap();
    let ports = cluster.ports(dead);
    cluster.forget(dead);
    let out = ctl(&cluster, &["member", "remove", &dead.to_string()]);
    assert!(out.contains(&format!("removed node {dead}")), "{out}");
    cluster.join_node(6, Some(ports));
    wait_for_role(&cluster, &[], 6, "learner", Duration::from_secs(30)).await;
    ctl(&cluster, &["member", "promote", "6", "--wait", "30s"]);
    let now = roles(&cluster, &[]);
    assert!(
        !now.contains_key(&dead),
        "node {dead} still listed: {now:?}"
    );
    assert_eq!(now.values().filter(|r| *r == "voter").count(), 5, "{now:?}");

    // Shrink 5 -> 3, removing the leader first: leadership moves.
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let out = ctl(&cluster, &["member", "remove", &leader.to_string()]);
    assert!(out.contains(&format!("removed node {leader}")), "{out}");
    cluster.forget(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    let other = cluster
        .nodes()
        .iter()
        .map(|n| n.id)
        .find(|id| *id != new_leader)
        .unwrap();
    ctl(&cluster, &["member", "remove", &other.to_string()]);
    cluster.forget(other);
    let now = roles(&cluster, &[]);
    assert_eq!(now.len(), 3, "three members left: {now:?}");
    assert!(now.values().all(|r| r == "voter"), "{now:?}");

    // Grants went on through all of it, and keep going.
    let before = ledger.grants.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(20);
    while ledger.grants.load(Ordering::Relaxed) < before + 20 {
        assert!(
            Instant::now() < deadline,
            "no grants after shrinking\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    check_token(cluster.status(leader).await);
    // No grant lost: every recorded token is still known to the cluster.
    let client = cluster.client();
    let granted = ledger.last.lock().unwrap().clone();
    for (resource, token) in granted {
        let d = client.describe(&resource).await.unwrap();
        assert!(
            d.last_token >= token,
            "{resource}: the cluster's last token {} is below granted token {token}",
            d.last_token
        );
    }
    let statuses = cluster.wait_for_convergence(Duration::from_secs(20)).await;
    assert!(
        statuses
            .windows(2)
            .all(|w| w[0].state_digest == w[1].state_digest),
        "replicas differ: {statuses:?}"
    );
    println!(
        "{} grants while growing, replacing and shrinking",
        ledger.grants.load(Ordering::Relaxed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_voters_refuse_a_removal_that_could_not_commit() {
    let mut cluster = Cluster::start(5).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let others: Vec<u64> = (1..=5).filter(|id| *id != leader).collect();
    // Two voters down: three of five answer.
    let (dead_a, dead_b, live) = (others[0], others[1], others[2]);
    cluster.kill(dead_a);
    cluster.kill(dead_b);
    let (_, err) = ctl_refused(&cluster, &["member", "remove", &live.to_string()]);
    assert!(
        err.contains("majority of 4 needs 3"),
        "removing a live voter with two down: {err}"
    );
    assert!(err.contains("in contact"), "{err}");
    // Removing a dead one leaves four, three of them in contact.
    ctl(&cluster, &["member", "remove", &dead_a.to_string()]);
    cluster.forget(dead_a);
    let (_, err) = ctl_refused(&cluster, &["member", "remove", "42"]);
    assert!(err.contains("node 42 is not a member"), "{err}");
    // Adding with a taken id or address is refused by name.
    let (c, p) = cluster.ports(live);
    let (_, err) = ctl_refused(
        &cluster,
        &["member", "add", &live.to_string(), "--peer", "127.0.0.1:1"],
    );
    assert!(err.contains("already a voter"), "{err}");
    let (_, err) = ctl_refused(
        &cluster,
        &[
            "member",
            "add",
            "9",
            "--peer",
            &format!("127.0.0.1:{p}"),
            "--client",
            &format!("127.0.0.1:{c}"),
        ],
    );
    assert!(
        err.contains("peer_addr") && err.contains(&format!("node {live}")),
        "{err}"
    );
    let (_, err) = ctl_refused(&cluster, &["member", "add", "9", "--peer", "nohost"]);
    assert!(
        err.contains("peer_addr") && err.contains("host:port"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_voter_is_not_removed() {
    let cluster = Cluster::start(1).await;
    let (_, err) = ctl_refused(&cluster, &["member", "remove", "1"]);
    assert!(err.contains("last voter"), "{err}");
    assert_eq!(
        roles(&cluster, &[]).get(&1).map(String::as_str),
        Some("voter")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_learner_is_not_promoted_and_a_joined_node_rejoins_as_itself() {
    let mut cluster = Cluster::start(3).await;
    cluster.join_node(4, None);
    wait_for_role(&cluster, &[], 4, "learner", Duration::from_secs(30)).await;
    // Freeze the learner and write past the promotion bound.
    cluster.signal(4, Signal::SIGSTOP);
    let client = cluster.client();
    let bound: u64 = serde_json::from_str::<serde_json::Value>(
        ctl(&cluster, &["--json", "member", "list"]).trim(),
    )
    .unwrap()["promote_max_lag"]
        .as_u64()
        .unwrap();
    // Each acquire and each release is an entry of its own.
    for i in 0..(bound / 2 + 50) {
        let owner = OwnerId::random();
        let resource = format!("lag/{}", i % 8);
        if let AcquireOutcome::Granted { token, .. } = client
            .acquire_once(&resource, owner, Duration::from_secs(5), Duration::ZERO)
            .await
            .unwrap()
        {
            client.release(&resource, owner, token).await.unwrap();
        }
    }
    let (_, err) = ctl_refused(&cluster, &["member", "promote", "4"]);
    assert!(
        err.contains("learner 4 lags the leader by") && err.contains(&format!("within {bound}")),
        "{err}"
    );
    assert_eq!(
        roles(&cluster, &[]).get(&4).map(String::as_str),
        Some("learner")
    );
    cluster.signal(4, Signal::SIGCONT);
    ctl(&cluster, &["member", "promote", "4", "--wait", "30s"]);
    assert_eq!(
        roles(&cluster, &[]).get(&4).map(String::as_str),
        Some("voter")
    );

    // Restarted with its data, the node ignores --join and is still node 4.
    cluster.kill(4);
    cluster.spawn(4);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.log_of(4).contains("--join is ignored") {
        assert!(Instant::now() < deadline, "{}", cluster.log_of(4));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert_eq!(
        roles(&cluster, &[]).get(&4).map(String::as_str),
        Some("voter")
    );

    // A new empty node that takes a voter's id is refused and stops: it
    // could otherwise vote twice in one term.
    let dir = tempfile::tempdir().unwrap();
    let out = join_command(&cluster, 2, dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("already a voter") && err.contains("vote twice"),
        "{err}"
    );
    assert!(leader_via(&cluster, 1).await != 0);
}

/// `fenced run` of a new node `id` with an empty data directory in `dir`
/// that joins `cluster`, on fresh loopback ports.
fn join_command(cluster: &Cluster, id: u64, dir: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin("fenced"));
    cmd.args([
        "run",
        "--id",
        &id.to_string(),
        "--data-dir",
        dir.join("d").to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{}", fenced_tests::free_port()),
        "--peer-listen",
        &format!("127.0.0.1:{}", fenced_tests::free_port()),
        "--join",
        &cluster.endpoints().join(","),
    ]);
    cmd
}

/// A removed node, wiped and started again under its old id with `--join`
/// (on a cluster with auth off, where a node adds itself): the cluster
/// refuses the id and the node stops with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_wiped_and_joined_under_its_old_id_stops() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.wait_for_convergence(Duration::from_secs(10)).await;
    let removed = (1..=3).find(|id| *id != leader).unwrap();
    ctl(&cluster, &["member", "remove", &removed.to_string()]);
    cluster.forget(removed);
    let dir = tempfile::tempdir().unwrap();
    let mut node = join_command(&cluster, removed, dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = node.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            node.kill().unwrap();
            let out = node.wait_with_output().unwrap();
            panic!(
                "node {removed} joined under its old id: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = node.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("node {removed} was removed")) && err.contains("new id"),
        "{err}"
    );
    assert!(!roles(&cluster, &[]).contains_key(&removed));
}

const POLICY: &str = r#"
[roles.orders]
lock = ["orders/"]
read = ["orders/"]

[roles.ops]
admin = true
read = [""]
lock = [""]

[identities]
harness = ["ops"]
alice = ["orders"]
"#;

/// A channel to `addr` showing node `id`'s certificate.
fn as_node(cluster: &Cluster, addr: &str, id: u64) -> ClusterClient<Channel> {
    ClusterClient::new(cluster.pki.as_ref().unwrap().node_channel(addr, id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_admins_change_members_even_a_node_s_own_addition() {
    let files = tempfile::tempdir().unwrap();
    let (tokens, policy) =
        write_auth_files(files.path(), &[("bob", "bob-token", "orders")], POLICY);
    let mut cluster = Cluster::start_tls(3, |s| {
        s.auth_policy = Some(policy.clone().into());
        s.auth_tokens = Some(tokens.clone().into());
    })
    .await;
    let pki = cluster.pki.clone().unwrap();
    let (alice_cert, alice_key) = pki.client("alice");
    let (alice_cert, alice_key) = (
        alice_cert.to_str().unwrap().to_string(),
        alice_key.to_str().unwrap().to_string(),
    );
    // Every member command, as a non-admin token and as a non-admin
    // certificate (later flags win over the harness's).
    let commands: [&[&str]; 4] = [
        &["member", "list"],
        &[
            "member",
            "add",
            "7",
            "--peer",
            "127.0.0.1:7",
            "--client",
            "127.0.0.1:8",
        ],
        &["member", "promote", "2"],
        &["member", "remove", "2"],
    ];
    for command in commands {
        let mut as_bob = vec!["--auth-token", "bob-token"];
        as_bob.extend_from_slice(command);
        let (code, err) = ctl_refused(&cluster, &as_bob);
        assert_eq!(code, Some(5), "{command:?} as bob: {err}");
        assert!(
            err.contains("\"bob\"") && err.contains("needs admin"),
            "{err}"
        );
        let out = std::process::Command::new(bin("fencectl"))
            .arg("--endpoints")
            .arg(cluster.endpoints().join(","))
            .arg("--cacert")
            .arg(pki.ca())
            .args(["--cert", &alice_cert, "--key", &alice_key])
            .args(command)
            .output()
            .unwrap();
        let (code, err) = (out.status.code(), String::from_utf8_lossy(&out.stderr));
        assert_eq!(code, Some(5), "{command:?} as alice: {err}");
        assert!(
            err.contains("\"alice\"") && err.contains("needs admin"),
            "{err}"
        );
    }
    assert_eq!(roles(&cluster, &[]).len(), 3);

    // A node certificate adds only its own id; a client's adds nothing.
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let leader_addr = cluster.status(leader).await.unwrap().leader_addr;
    let ask = |id: u64| v1::AddLearnerRequest {
        node_id: id,
        peer_addr: format!("127.0.0.1:{}", 40_000 + id),
        client_addr: format!("127.0.0.1:{}", 41_000 + id),
    };
    let refused = as_node(&cluster, &leader_addr, 7)
        .add_learner(ask(8))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("needs admin"), "{refused:?}");
    // Nor its own id: a spare or a removed node's certificate would
    // otherwise take the cluster's log.
    let refused = as_node(&cluster, &leader_addr, 7)
        .add_learner(ask(7))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("needs admin"), "{refused:?}");
    let mut alice = ClusterClient::new(pki.channel(&leader_addr, Some("alice")));
    let refused = alice.add_learner(ask(8)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(!roles(&cluster, &[]).contains_key(&8));
    assert!(!roles(&cluster, &[]).contains_key(&7));

    // Node 4 starts with --join: its own request is refused and it waits;
    // an admin adds it, then promotes it.
    cluster.join_node(4, None);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster.log_of(4).contains("waiting for an operator") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!roles(&cluster, &[]).contains_key(&4));
    let (client4, peer4) = cluster.ports(4);
    ctl(
        &cluster,
        &[
            "member",
            "add",
            "4",
            "--peer",
            &format!("127.0.0.1:{peer4}"),
            "--client",
            &format!("127.0.0.1:{client4}"),
        ],
    );
    wait_for_role(&cluster, &[], 4, "learner", Duration::from_secs(30)).await;
    // The membership shows the learner once the leader commits it; node 4
    // logs it once the membership reaches its own log, a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.log_of(4).contains("a member now") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        cluster.log_of(4).contains("a member now"),
        "{}",
        cluster.log_of(4)
    );
    ctl(&cluster, &["member", "promote", "4", "--wait", "30s"]);
    wait_for_role(&cluster, &[], 4, "voter", Duration::from_secs(10)).await;
    let lease = cluster
        .client()
        .acquire_once(
            "orders/after-join",
            OwnerId::random(),
            Duration::from_secs(5),
            Duration::ZERO,
        )
        .await;
    assert!(
        matches!(lease, Ok(AcquireOutcome::Granted { .. })),
        "{lease:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_knows_no_leader_answers_no_membership_call_from_its_own_view() {
    let mut cluster = Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    for id in 1..=3 {
        cluster.kill(id);
    }
    // Alone, the old leader restarts with its own membership, gives up
    // its own vote at start-up, and never learns of a leader.
    cluster.spawn(leader);
    let deadline = Instant::now() + Duration::from_secs(20);
    while cluster.status(leader).await.is_none() {
        assert!(Instant::now() < deadline, "node {leader} does not answer");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        cluster.status(leader).await.map(|s| s.leader_id),
        Some(0),
        "node {leader} knows a leader"
    );
    let other = if leader == 2 { 3 } else { 2 };
    let mut c = ClusterClient::new(cluster.channel(leader));
    let refusals = [
        (
            "remove 42",
            c.remove_node(v1::RemoveNodeRequest { node_id: 42 })
                .await
                .err(),
        ),
        (
            "promote 42",
            c.promote_learner(v1::PromoteLearnerRequest { node_id: 42 })
                .await
                .err(),
        ),
        (
            "remove a voter",
            c.remove_node(v1::RemoveNodeRequest { node_id: other })
                .await
                .err(),
        ),
    ];
    for (what, refusal) in refusals {
        // Not "node 42 is not a member", which a retried removal takes for
        // done: only the leader's membership says who is a member.
        let s = refusal.unwrap_or_else(|| panic!("{what} answered without a leader"));
        assert_eq!(s.code(), Code::Unavailable, "{what}: {s:?}");
        assert!(s.message().contains("no leader"), "{what}: {s:?}");
    }
    assert_eq!(
        cluster.status(leader).await.map(|s| s.members.len()),
        Some(3),
        "nothing changed"
    );
}
