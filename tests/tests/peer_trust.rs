//! The peer trust boundary under attack, with real certificates: a node
//! certificate speaks only as its own node, only voters send votes and
//! appends or forward a caller's identity, and no node certificate adds a
//! node (docs/SECURITY.md, "The peer port").

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_proto::v1::{self, cluster_client::ClusterClient, lock_client::LockClient};
use fenced_server::{
    clock::floor::LeaderTime,
    peer::network::{request_frame, MessageTime, RaftCall, PREFACE},
    types::{NodeId, TypeConfig},
};
use fenced_tests::{tls_connect, Cluster, RunSettings, Within};
use openraft::{raft::AppendEntriesRequest, raft::VoteRequest, Vote};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::{metadata::MetadataValue, Code};

const POLICY: &str = r#"
[roles.ops]
admin = true
read = [""]
lock = [""]

[identities]
harness = ["ops"]
"#;

/// What a node that is not the leader would answer, and whether it did:
/// sends `frame` on a Raft connection to `peer_addr` as node `as_node` and
/// reads. `Ok(n)`: the node answered `n` bytes; `Err`: it closed the
/// connection (or the handshake failed) without answering.
async fn send_raft(
    cluster: &Cluster,
    peer_addr: &str,
    as_node: NodeId,
    frame: &[u8],
) -> Result<usize, String> {
    let pki = cluster.pki.as_ref().unwrap();
    let (cert, key) = pki.node(as_node);
    let mut conn = tls_connect(peer_addr, &pki.ca(), &cert, &key)
        .await
        .map_err(|e| e.to_string())?;
    let mut bytes = PREFACE.to_vec();
    bytes.extend_from_slice(frame);
    conn.write_all(&bytes).await.map_err(|e| e.to_string())?;
    conn.flush().await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4096];
    match tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await {
        Ok(Ok(0)) => Err("closed".into()),
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 5 s".into()),
    }
}

/// An empty AppendEntries from a leader `leader` in `term`.
fn append_from(leader: NodeId, term: u64) -> Vec<u8> {
    let req: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let time = MessageTime {
        at: LeaderTime::ZERO,
        durable: false,
    };
    request_frame(RaftCall::AppendEntries, time, &req).unwrap()
}

/// A vote request from candidate `candidate` in `term`.
fn vote_from(candidate: NodeId, term: u64) -> Vec<u8> {
    let req: VoteRequest<NodeId> = VoteRequest::new(Vote::new(term, candidate), None);
    request_frame(RaftCall::Vote, MessageTime::NONE, &req).unwrap()
}

/// `body` as forwarded by a node for the harness's (admin) identity.
fn as_harness<T>(body: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(body);
    req.metadata_mut()
        .insert("x-fenced-identity", MetadataValue::from_static("harness"));
    req
}

/// The term every node is in, and who leads.
async fn terms(cluster: &Cluster, ids: &[u64]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for id in ids {
        let s = cluster.status(*id).await.expect("status");
        out.push((s.term, s.leader_id));
    }
    out
}

async fn auth_cluster(files: &tempfile::TempDir) -> Cluster {
    let policy = files.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    Cluster::start_tls(3, |s| s.auth_policy = Some(policy.clone())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_certificate_cannot_speak_as_another_node() {
    let cluster = Cluster::start_tls(3, |_| {}).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.wait_for_convergence(Duration::from_secs(10)).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (target, attacker) = (followers[0], followers[1]);
    let before = terms(&cluster, &[1, 2, 3]).await;
    let term = before[0].0;
    let addr = cluster.peer_addr(target);

    // The other follower's certificate, claiming the leader's id in the
    // next term: an empty append that would move the target's term.
    let answered = send_raft(&cluster, &addr, attacker, &append_from(leader, term + 1)).await;
    assert!(
        answered.is_err(),
        "a forged append was answered: {answered:?}"
    );
    // And claiming to be the leader as candidate.
    let answered = send_raft(&cluster, &addr, attacker, &vote_from(leader, term + 5)).await;
    assert!(
        answered.is_err(),
        "a forged vote was answered: {answered:?}"
    );
    let log = cluster.log_of(target);
    assert!(
        log.contains("raft frame refused") && log.contains(&format!("claims node {leader}")),
        "{log}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        terms(&cluster, &[1, 2, 3]).await,
        before,
        "a forged frame moved the cluster"
    );

    // Control: the same certificate speaking as itself is answered (its
    // stale vote is simply not granted).
    let answered = send_raft(&cluster, &addr, attacker, &vote_from(attacker, term)).await;
    assert!(
        answered.is_ok(),
        "a voter's own vote was not answered: {answered:?}"
    );
    assert_eq!(
        cluster.wait_for_leader(Duration::from_secs(5)).await,
        leader
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_sends_no_vote_and_forwards_no_identity() {
    let files = tempfile::tempdir().unwrap();
    let cluster = auth_cluster(&files).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.wait_for_convergence(Duration::from_secs(10)).await;
    // An admin adds node 4 as a learner (it need not run).
    let out = cluster.fencectl(&[
        "member",
        "add",
        "4",
        "--peer",
        "127.0.0.1:9",
        "--client",
        "127.0.0.1:10",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cluster.status(follower).await.unwrap().members.len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "node {follower} never saw node 4"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = terms(&cluster, &[1, 2, 3]).await;
    let term = before[0].0;

    // Node 4's own certificate, as itself: a vote in a later term.
    let answered = send_raft(
        &cluster,
        &cluster.peer_addr(follower),
        4,
        &vote_from(4, term + 3),
    )
    .await;
    assert!(
        answered.is_err(),
        "a learner's vote was answered: {answered:?}"
    );
    assert!(cluster.log_of(follower).contains("node 4 is not a voter"));
    assert_eq!(terms(&cluster, &[1, 2, 3]).await, before);

    // Node 4's certificate on the leader's peer port, forwarding the
    // harness's admin identity: refused. A voter's certificate: believed.
    let pki = cluster.pki.as_ref().unwrap();
    let channel = |as_node: u64| pki.node_channel(&cluster.peer_addr(leader), as_node);
    let refused = ClusterClient::new(channel(4))
        .list_members(as_harness(v1::ListMembersRequest {}))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let refused = LockClient::new(channel(4))
        .history(as_harness(v1::HistoryRequest {
            resource: "any".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let voter = follower;
    let listed = ClusterClient::new(channel(voter))
        .list_members(as_harness(v1::ListMembersRequest {}))
        .await;
    assert!(listed.is_ok(), "a voter's forwarded identity: {listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_node_certificate_does_not_add_its_node() {
    let files = tempfile::tempdir().unwrap();
    let cluster = auth_cluster(&files).await;
    let pki = cluster.pki.clone().unwrap();
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let (cert, key) = pki.node(9);
    let out = std::process::Command::new(fenced_tests::bin("fencectl"))
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .arg("--cacert")
        .arg(pki.ca())
        .arg("--cert")
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .args([
            "member",
            "add",
            "9",
            "--peer",
            "127.0.0.1:9",
            "--client",
            "127.0.0.1:10",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("needs admin"), "{err}");
    // Straight to the leader's client port as well.
    let leader_addr = cluster.status(leader).await.unwrap().leader_addr;
    let channel = pki.node_channel(&leader_addr, 9);
    let refused = ClusterClient::new(channel)
        .add_learner(v1::AddLearnerRequest {
            node_id: 9,
            peer_addr: "127.0.0.1:9".into(),
            client_addr: "127.0.0.1:10".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let members = cluster.status(leader).await.unwrap().members;
    assert!(members.iter().all(|m| m.id != 9), "{members:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_is_refused_after_a_reload() {
    let files = tempfile::tempdir().unwrap();
    let deny = files.path().join("deny.toml");
    std::fs::write(&deny, "").unwrap();
    let cluster = Cluster::start_tls(3, |s| s.tls_deny = Some(deny.clone())).await;
    let pki = cluster.pki.clone().unwrap();
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let mallory = fenced_client::Client::with_tls(
        cluster.endpoints(),
        Some(&pki.client_options(Some("mallory"))),
    )
    .unwrap();
    mallory
        .describe("revoked-a")
        .await
        .expect("before the revocation");
    // An open gRPC connection made with mallory's certificate.
    let open = pki.channel(
        &cluster.status(leader).await.unwrap().leader_addr,
        Some("mallory"),
    );
    let mut watching = LockClient::new(open.clone())
        .watch(v1::WatchRequest {
            prefix: b"revoked".to_vec(),
            from_revision: 0,
        })
        .await
        .expect("a watch before the revocation")
        .into_inner();
    let started = watching.message().await.expect("the watch starts");
    assert!(started.is_some());
    let mut open = ClusterClient::new(open);
    open.list_members(v1::ListMembersRequest {})
        .await
        .expect("before");

    // Revoke mallory and node 3 (the node itself is then cut off), then
    // SIGHUP every node.
    let victim = (1..=3).find(|id| *id != leader).unwrap();
    std::fs::write(
        &deny,
        format!("clients = [\"mallory\"]\nnodes = [{victim}]\n"),
    )
    .unwrap();
    for id in 1..=3 {
        cluster.signal(id, nix::sys::signal::Signal::SIGHUP);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cluster.log_of(leader).contains("deny list reloaded") {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            cluster.log_of(leader)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The open connection is refused at its next call; a new one at the
    // handshake.
    let refused = open
        .list_members(v1::ListMembersRequest {})
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("revoked"), "{refused:?}");
    // The watch opened before the revocation ends with it, within seconds.
    let ended = fenced_tests::watch_refusal(&mut watching, Duration::from_secs(5)).await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(ended.message().contains("revoked"), "{ended:?}");
    let fresh = fenced_client::Client::with_tls(
        cluster.endpoints(),
        Some(&pki.client_options(Some("mallory"))),
    )
    .unwrap();
    assert!(fresh.describe("revoked-a").await.is_err());
    // The revoked node's Raft connections are refused on the other nodes'
    // peer ports; the other two serve on.
    let others: Vec<u64> = (1..=3).filter(|id| *id != victim).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !others
        .iter()
        .any(|id| cluster.log_of(*id).contains("revoked"))
    {
        assert!(std::time::Instant::now() < deadline, "{}", cluster.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = cluster.status(leader).await.unwrap().last_token;
    // (Through the leader: the revoked node's forwarded calls are refused.)
    let token = cluster
        .client_of(leader)
        .acquire_once(
            "revoked-b",
            fenced_core::OwnerId::random(),
            Duration::from_secs(5),
            Duration::ZERO,
        )
        .await;
    assert!(
        matches!(token, Ok(fenced_client::AcquireOutcome::Granted { .. })),
        "{token:?}"
    );
    assert!(cluster.status(leader).await.unwrap().last_token > before);
}

/// What a removed node's id can still do: `member add` of it by an admin,
/// and its own certificate on the remaining nodes' peer ports.
async fn assert_retired(cluster: &Cluster, removed: u64, remaining: &[u64], when: &str) {
    let out = cluster.fencectl(&[
        "member",
        "add",
        &removed.to_string(),
        "--peer",
        "127.0.0.1:9",
        "--client",
        "127.0.0.1:10",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{when}: node {removed} was added back"
    );
    assert!(
        err.contains(&format!("node {removed} was removed")) && err.contains("new id"),
        "{when}: {err}"
    );
    let listed = cluster.fencectl(&["--json", "member", "list"]);
    let listed: serde_json::Value =
        serde_json::from_slice(&listed.stdout).expect("member list --json");
    assert_eq!(
        listed["retired_ids"],
        serde_json::json!([removed]),
        "{when}: {listed}"
    );
    let term = cluster.status(remaining[0]).await.unwrap().term;
    for id in remaining {
        // Only what the node logs from now on (its log spans restarts).
        let logged = cluster.log_of(*id).len();
        let answered = send_raft(
            cluster,
            &cluster.peer_addr(*id),
            removed,
            &vote_from(removed, term + 3),
        )
        .await;
        assert!(
            answered.is_err(),
            "{when}: node {id} answered the removed node: {answered:?}"
        );
        let log = cluster.log_of(*id).split_off(logged);
        assert!(
            log.contains(&format!("node {removed} is retired")),
            "{when}: node {id} did not refuse node {removed} as retired:\n{log}"
        );
    }
    let members = cluster.status(remaining[0]).await.unwrap().members;
    assert!(
        members.iter().all(|m| m.id != removed),
        "{when}: {members:?}"
    );
}

/// Kills `ids` and starts them again on their data (with `env`), waiting
/// for a leader.
async fn restart(cluster: &mut Cluster, ids: &[u64], settings: fn(&mut RunSettings)) {
    for id in ids {
        cluster.kill(*id);
    }
    for id in ids {
        cluster.spawn_with(*id, settings);
    }
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    cluster.wait_for_convergence(Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_id_never_returns_across_restarts_and_snapshots() {
    let files = tempfile::tempdir().unwrap();
    let mut cluster = auth_cluster(&files).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.wait_for_convergence(Duration::from_secs(10)).await;
    let removed = (1..=3).find(|id| *id != leader).unwrap();
    let remaining: Vec<u64> = (1..=3).filter(|id| *id != removed).collect();
    let out = cluster.fencectl(&["member", "remove", &removed.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cluster.forget(removed);
    let removal = cluster.status(leader).await.unwrap().membership_index;
    cluster.wait_for_convergence(Duration::from_secs(10)).await;
    assert_retired(&cluster, removed, &remaining, "after the removal").await;

    // A restart replays the log: no snapshot covers the removal yet.
    restart(&mut cluster, &remaining, |_| {}).await;
    for id in &remaining {
        let s = cluster.status(*id).await.unwrap();
        assert!(s.snapshot_index < removal, "{s:?}");
    }
    assert_retired(&cluster, removed, &remaining, "after a restart").await;

    // Snapshots past the removal, then a restart that loads them: the
    // retired id comes from the snapshot alone.
    restart(&mut cluster, &remaining, |s| {
        s.snapshot_logs = Some(Within::new(10).unwrap())
    })
    .await;
    let client = cluster.client();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for i in 0.. {
        let _ = client
            .acquire_once(
                &format!("retired-{i}"),
                fenced_core::OwnerId::random(),
                Duration::from_secs(5),
                Duration::ZERO,
            )
            .await;
        let mut covered = true;
        for id in &remaining {
            covered &= cluster.status(*id).await.unwrap().snapshot_index > removal;
        }
        if covered {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot past the removal: {}",
            cluster.logs()
        );
    }
    let logged: Vec<usize> = remaining
        .iter()
        .map(|id| cluster.log_of(*id).len())
        .collect();
    restart(&mut cluster, &remaining, |_| {}).await;
    for (id, logged) in remaining.iter().zip(logged) {
        assert!(
            cluster.log_of(*id)[logged..].contains("loaded snapshot"),
            "node {id} loaded no snapshot"
        );
    }
    assert_retired(
        &cluster,
        removed,
        &remaining,
        "after a snapshot and a restart",
    )
    .await;
}
