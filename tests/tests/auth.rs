//! Authentication, permissions and per-identity limits against three real
//! nodes started with a tokens file and a policy file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use fenced_client::{AcquireOutcome, Client, ClientError};
use fenced_core::OwnerId;
use fenced_proto::v1::{self, cluster_client::ClusterClient};
use fenced_tests::{
    bin, free_port, http_get, write_auth_files, write_tokens, Cluster, RunSettings, Within,
    ORDERS_AND_OPS_POLICY,
};
use nix::sys::signal::Signal;
use tonic::{metadata::MetadataValue, Code};

const TTL: Duration = Duration::from_secs(30);

struct Files {
    _dir: tempfile::TempDir,
    tokens: PathBuf,
    policy: PathBuf,
}

const EVERYONE: &[(&str, &str, &str)] = &[
    ("alice", "alice-token", "orders"),
    ("bob", "bob-token", "orders"),
    ("root", "root-token", "ops"),
];

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth_files(dir.path(), EVERYONE, ORDERS_AND_OPS_POLICY);
    Files {
        _dir: dir,
        tokens: tokens.into(),
        policy: policy.into(),
    }
}

async fn secured(files: &Files, extra: impl FnOnce(&mut RunSettings)) -> Cluster {
    Cluster::start_with(3, |s| {
        s.auth_tokens = Some(files.tokens.clone());
        s.auth_policy = Some(files.policy.clone());
        extra(s);
    })
    .await
}

fn as_user(client: Client, token: &str) -> Client {
    client.with_token(token).unwrap()
}

async fn acquire(client: &Client, resource: &str) -> Result<AcquireOutcome, ClientError> {
    client
        .acquire_once(resource, OwnerId::random(), TTL, Duration::ZERO)
        .await
}

fn expect_granted(r: Result<AcquireOutcome, ClientError>) {
    assert!(
        matches!(r, Ok(AcquireOutcome::Granted { .. })),
        "expected a grant, got {r:?}"
    );
}

/// A raw Cluster call to node `id` with `token` as bearer.
fn with_bearer<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    req.set_timeout(Duration::from_secs(5));
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_a_known_token_are_unauthenticated() {
    let files = files();
    let cluster = secured(&files, |_| {}).await;
    expect_granted(acquire(&as_user(cluster.client(), "alice-token"), "orders/1").await);
    for client in [cluster.client(), as_user(cluster.client(), "mallory-token")] {
        match acquire(&client, "orders/2").await {
            Err(ClientError::Unauthenticated(msg)) => {
                assert!(
                    msg.contains("token") || msg.contains("credentials"),
                    "{msg}"
                )
            }
            other => panic!("expected an authentication failure, got {other:?}"),
        }
    }
    // A client cannot claim an identity on the client port: the forwarded
    // identity header counts only on the peer port.
    let mut forged = tonic::Request::new(v1::DescribeRequest {
        resource: b"orders/1".to_vec(),
        allow_stale: true,
    });
    forged
        .metadata_mut()
        .insert("x-fenced-forwarded", MetadataValue::from_static("1"));
    forged
        .metadata_mut()
        .insert("x-fenced-identity", MetadataValue::from_static("root"));
    let err = cluster
        .lock_client(1)
        .describe(forged.clone_for_peer())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    // Nor on the peer port without TLS: only a member node's certificate
    // makes a forwarded identity believable.
    let peer = tonic::transport::Channel::from_shared(format!(
        "http://127.0.0.1:{}",
        cluster.nodes()[0].peer_port
    ))
    .unwrap()
    .connect_lazy();
    let err = v1::lock_client::LockClient::new(peer)
        .describe(forged)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
}

/// The same request again (metadata included), for a second target.
trait CloneForPeer {
    fn clone_for_peer(&self) -> Self;
}

impl CloneForPeer for tonic::Request<v1::DescribeRequest> {
    fn clone_for_peer(&self) -> Self {
        let mut again = tonic::Request::new(self.get_ref().clone());
        *again.metadata_mut() = self.metadata().clone();
        again
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refused_after_sighup_and_a_bad_file_keeps_the_old_one() {
    let files = files();
    let cluster = secured(&files, |_| {}).await;
    let alice = as_user(cluster.client(), "alice-token");
    let bob = as_user(cluster.client(), "bob-token");
    expect_granted(acquire(&alice, "orders/a").await);

    // A broken file on reload: the node logs it and keeps the tokens in force.
    std::fs::write(
        &files.tokens,
        "[[token]]\nname = \"alice\"\nsha256 = \"nothex\"\n",
    )
    .unwrap();
    cluster.signal_all(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(1..=3).all(|id| cluster.log_of(id).contains("auth files not reloaded")) {
        assert!(
            Instant::now() < deadline,
            "no reload error logged\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        cluster.log_of(1).contains("token[0].sha256"),
        "{}",
        cluster.log_of(1)
    );
    expect_granted(acquire(&alice, "orders/b").await);
    // A watch alice opens before her token is revoked (no deadline: it
    // would run until the client ends it).
    let mut watch = tonic::Request::new(v1::WatchRequest {
        prefix: b"orders/".to_vec(),
        from_revision: 0,
    });
    watch.metadata_mut().insert(
        "authorization",
        MetadataValue::from_static("Bearer alice-token"),
    );
    let mut watching = cluster
        .lock_client(1)
        .watch(watch)
        .await
        .expect("alice's watch")
        .into_inner();
    assert!(watching
        .message()
        .await
        .expect("the watch starts")
        .is_some());

    // Alice's token revoked; Bob's stays.
    write_tokens(&files.tokens, &EVERYONE[1..]);
    cluster.signal_all(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match acquire(&alice, "orders/c").await {
            Err(ClientError::Unauthenticated(msg)) => {
                assert!(msg.contains("unknown or revoked token"), "{msg}");
                break;
            }
            other => assert!(
                Instant::now() < deadline,
                "alice still served after the reload: {other:?}\n{}",
                cluster.logs()
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every node reloaded: each one refuses alice on its own.
    for id in 1..=3 {
        let r = acquire(&as_user(cluster.client_of(id), "alice-token"), "orders/d").await;
        assert!(
            matches!(r, Err(ClientError::Unauthenticated(_))),
            "node {id}: {r:?}"
        );
    }
    expect_granted(acquire(&bob, "orders/e").await);
    // The watch she opened before ends too, within seconds.
    let ended = fenced_tests::watch_refusal(&mut watching, Duration::from_secs(5)).await;
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
}

/// The refusal of an admin call on node `id`: PERMISSION_DENIED.
fn denied<T: std::fmt::Debug>(r: Result<T, tonic::Status>, id: u64) -> tonic::Status {
    let err = r.expect_err("an admin call without admin is refused");
    assert_eq!(err.code(), Code::PermissionDenied, "node {id}: {err:?}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_are_checked_by_prefix_on_every_node_and_admin_calls_need_admin() {
    let files = files();
    let cluster = secured(&files, |_| {}).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    // Through a follower (forwarded) and the leader alike.
    for id in [follower, leader] {
        let alice = as_user(cluster.client_of(id), "alice-token");
        expect_granted(acquire(&alice, &format!("orders/{id}")).await);
        match acquire(&alice, &format!("jobs/{id}")).await {
            Err(ClientError::PermissionDenied(msg)) => assert!(
                msg.contains(&format!("\"jobs/{id}\""))
                    && msg.contains("[\"orders/\"]")
                    && msg.contains("alice"),
                "node {id}: {msg}"
            ),
            other => panic!("node {id}: expected permission denied, got {other:?}"),
        }
        // Read is a grant of its own: root reads everything, locks nothing.
        let root = as_user(cluster.client_of(id), "root-token");
        assert!(root.describe(&format!("orders/{id}")).await.unwrap().held);
        assert!(matches!(
            acquire(&root, "orders/root").await,
            Err(ClientError::PermissionDenied(_))
        ));
    }

    // Admin calls without admin: refused on every node, membership unchanged.
    let before = cluster.status(leader).await.unwrap().members;
    for id in [follower, leader] {
        let mut c = ClusterClient::new(cluster.channel(id));
        let alice = |msg| with_bearer(msg, "alice-token");
        let err = denied(
            c.change_membership(alice(v1::ChangeMembershipRequest {
                voter_ids: vec![id],
            }))
            .await,
            id,
        );
        assert!(err.message().contains("ChangeMembership"), "{err:?}");
        let learner = v1::AddLearnerRequest {
            node_id: 9,
            peer_addr: format!("127.0.0.1:{}", free_port()),
            client_addr: String::new(),
        };
        denied(c.add_learner(with_bearer(learner, "alice-token")).await, id);
        let remove = v1::RemoveNodeRequest { node_id: leader };
        denied(c.remove_node(with_bearer(remove, "alice-token")).await, id);
        let digest = v1::StatusRequest { with_digest: true };
        denied(c.status(with_bearer(digest, "alice-token")).await, id);
        // An admin gets the digest; anyone gets the status without it.
        let s = c
            .status(with_bearer(
                v1::StatusRequest { with_digest: true },
                "root-token",
            ))
            .await
            .unwrap()
            .into_inner();
        assert_ne!(s.state_digest, 0);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in 1..=3 {
        let s = cluster.status(id).await.unwrap();
        assert_eq!(s.members, before, "node {id}: membership changed");
        assert!(s.members.iter().all(|m| m.voter) && s.members.len() == 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_at_its_lease_limit_is_refused_while_others_acquire() {
    let files = files();
    let tokens = files.tokens.to_str().unwrap().to_string();
    let policy = files.policy.to_str().unwrap().to_string();
    let mut cluster = Cluster::stopped(3, |s| {
        s.auth_tokens = Some(tokens.clone().into());
        s.auth_policy = Some(policy.clone().into());
        s.max_leases_per_identity = Some(Within::new(3).unwrap());
        s.max_waiters_per_identity = Some(Within::new(1).unwrap());
    });
    let metrics: Vec<String> = (1..=3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    for id in 1..=3u64 {
        cluster.spawn_with(id, |s| {
            s.metrics_listen = Some(metrics[id as usize - 1].clone())
        });
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    // Through a follower: the leader counts forwarded acquires too.
    let alice = as_user(cluster.client_of(follower), "alice-token");
    let owner = OwnerId::random();
    let first = alice
        .acquire_once("orders/0", owner, TTL, Duration::ZERO)
        .await
        .unwrap();
    for i in 1..3 {
        expect_granted(acquire(&alice, &format!("orders/{i}")).await);
    }
    match acquire(&alice, "orders/3").await {
        Err(ClientError::ResourceExhausted(msg)) => {
            assert!(msg.contains("max_leases_per_identity (3)"), "{msg}")
        }
        other => panic!("expected the limit, got {other:?}"),
    }
    // A retry of a lease already held takes nothing new: still answered.
    let again = alice
        .acquire_once("orders/0", owner, TTL, Duration::ZERO)
        .await
        .unwrap();
    let token_of = |o: AcquireOutcome| match o {
        AcquireOutcome::Granted { token, .. } => token,
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_eq!(token_of(again), token_of(first));
    // Nothing held was lost, and another identity still acquires.
    let root = as_user(cluster.client(), "root-token");
    for i in 0..3 {
        assert!(root.describe(&format!("orders/{i}")).await.unwrap().held);
    }
    let bob = as_user(cluster.client(), "bob-token");
    expect_granted(acquire(&bob, "orders/bob").await);
    // A release makes room again.
    alice
        .release("orders/0", owner, token_of(first))
        .await
        .unwrap();
    expect_granted(acquire(&alice, "orders/3").await);

    // One blocking acquire waits; a second one of the same identity is refused.
    let waiting = {
        let bob = bob.clone();
        tokio::spawn(async move {
            bob.acquire_once("orders/3", OwnerId::random(), TTL, Duration::from_secs(5))
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while root.describe("orders/3").await.unwrap().waiters == 0 {
        assert!(Instant::now() < deadline, "bob's acquire never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = bob
        .acquire_once("orders/2", OwnerId::random(), TTL, Duration::from_secs(5))
        .await;
    match second {
        Err(ClientError::ResourceExhausted(msg)) => {
            assert!(msg.contains("max_waiters_per_identity (1)"), "{msg}")
        }
        other => panic!("expected the waiter limit, got {other:?}"),
    }
    // The waiting one is still served: its wait ends, held.
    assert!(matches!(
        waiting.await.unwrap(),
        Ok(AcquireOutcome::Held { .. })
    ));

    let (code, body) = http_get(&metrics[leader as usize - 1], "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        body.contains(
            "fenced_identity_limit_refusals_total{setting=\"max_leases_per_identity\"} 1"
        ),
        "{body}"
    );
    assert!(
        body.contains(
            "fenced_identity_limit_refusals_total{setting=\"max_waiters_per_identity\"} 1"
        ),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_sends_its_token_and_says_which_check_failed() {
    let files = files();
    let cluster = secured(&files, |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("alice.token");
    std::fs::write(&token_file, "alice-token\n").unwrap();

    let ok = cluster.fencectl(&[
        "--auth-token",
        "alice-token",
        "acquire",
        "orders/ctl",
        "--ttl",
        "30s",
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let out = cluster.fencectl(&[
        "--auth-token-file",
        token_file.to_str().unwrap(),
        "acquire",
        "jobs/ctl",
        "--ttl",
        "30s",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.contains("permission denied")
            && stderr.contains("jobs/ctl")
            && stderr.contains("orders/"),
        "{stderr}"
    );

    // The old spelling before the subcommand still authenticates, with a
    // warning naming the new one; --auth-token may also follow the
    // subcommand, where --token is the fencing token.
    let old = cluster.fencectl(&["--token", "alice-token", "describe", "orders/ctl"]);
    let stderr = String::from_utf8_lossy(&old.stderr);
    assert!(old.status.success(), "{stderr}");
    assert!(stderr.contains("--auth-token"), "{stderr}");
    let after = cluster.fencectl(&["describe", "orders/ctl", "--auth-token", "alice-token"]);
    let stderr = String::from_utf8_lossy(&after.stderr);
    assert!(after.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");

    let out = cluster.fencectl(&["--auth-token", "wrong", "describe", "orders/ctl"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("authentication failed"), "{stderr}");

    // From the environment, like a deployment would pass it.
    let out = std::process::Command::new(bin("fencectl"))
        .arg("--endpoints")
        .arg(cluster.endpoints().join(","))
        .args(["describe", "orders/ctl"])
        .env("FENCED_TOKEN", "alice-token")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_bad_tokens_file_stops_the_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, "[[token]]\nname = \"alice\"\nsha256 = \"abc\"\n").unwrap();
    let out = std::process::Command::new(bin("fenced"))
        .args(["run", "--id", "1", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--peer-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--initial-cluster", "1=127.0.0.1:1"])
        .arg("--auth-tokens")
        .arg(&tokens)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tokens.toml") && stderr.contains("token[0].sha256"),
        "{stderr}"
    );
}
