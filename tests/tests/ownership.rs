//! A lease belongs to the identity that acquired it, against three real
//! nodes with a tokens file and a policy: a reader sees no owner id in
//! watch or history, another identity with the owner id and token can
//! neither renew nor release the lease, and the per-identity lease limit
//! still holds once the leader is killed and another takes over.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_client::{AcquireOutcome, Client, ClientError, ReleaseOutcome, RenewOutcome};
use fenced_core::{OwnerId, Token};
use fenced_proto::v1::{self, watch_response::Body};
use fenced_tests::{write_auth_files, Cluster, RunSettings, Within};

const TTL: Duration = Duration::from_secs(30);

const POLICY: &str = r#"
[roles.billing]
lock = ["billing/"]
read = ["billing/"]

[roles.reader]
read = ["billing/"]

[roles.ops]
admin = true
read = [""]
"#;

const EVERYONE: &[(&str, &str, &str)] = &[
    ("alice", "alice-token", "billing"),
    ("bob", "bob-token", "billing"),
    ("rita", "rita-token", "reader"),
    ("root", "root-token", "ops"),
];

/// Three nodes under the policy above, with `extra` settings; the
/// directory holds the auth files while the cluster runs.
async fn secured(extra: impl FnOnce(&mut RunSettings)) -> (tempfile::TempDir, Cluster) {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth_files(dir.path(), EVERYONE, POLICY);
    let cluster = Cluster::start_with(3, |s| {
        s.auth_tokens = Some(tokens.into());
        s.auth_policy = Some(policy.into());
        extra(s);
    })
    .await;
    (dir, cluster)
}

fn as_user(client: Client, token: &str) -> Client {
    client.with_token(token).unwrap()
}

async fn grant(client: &Client, resource: &str) -> (OwnerId, Token) {
    let owner = OwnerId::random();
    match client
        .acquire_once(resource, owner, TTL, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Granted { token, .. } => (owner, token),
        other => panic!("expected a grant on {resource}, got {other:?}"),
    }
}

/// The next event of a watch stream (skipping its start).
async fn next_event(stream: &mut tonic::Streaming<v1::WatchResponse>) -> v1::WatchEvent {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("no watch message in time")
            .unwrap()
            .expect("the stream ended");
        match msg.body {
            Some(Body::Event(e)) => return e,
            Some(Body::Started(_)) => continue,
            other => panic!("unexpected watch message {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_sees_no_owner_id_in_watch_or_history() {
    let (_files, cluster) = secured(|_| {}).await;
    let alice = as_user(cluster.client(), "alice-token");
    let rita = as_user(cluster.client(), "rita-token");
    let root = as_user(cluster.client(), "root-token");
    let mut reader_watch = rita.watch("billing/", 0).await.unwrap();
    let mut admin_watch = root.watch("billing/", 0).await.unwrap();
    // Both streams are started before the grant: each sends its start.
    for s in [&mut reader_watch, &mut admin_watch] {
        let first = tokio::time::timeout(Duration::from_secs(10), s.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(matches!(first.body, Some(Body::Started(_))), "{first:?}");
    }
    let (owner, token) = grant(&alice, "billing/run-7").await;

    let seen = next_event(&mut reader_watch).await;
    assert_eq!(seen.token, token.get());
    assert_eq!(seen.resource, b"billing/run-7");
    assert!(
        seen.owner_id.is_empty(),
        "the reader saw {:?}",
        seen.owner_id
    );
    let admin_seen = next_event(&mut admin_watch).await;
    assert_eq!(admin_seen.owner_id, owner.as_bytes().to_vec());

    let history = rita.history("billing/run-7", 0).await.unwrap();
    assert_eq!(history.entries.len(), 1);
    assert_eq!(history.entries[0].token, token.get());
    assert!(history.entries[0].owner_id.is_empty(), "{history:?}");
    let history = root.history("billing/run-7", 0).await.unwrap();
    assert_eq!(history.entries[0].owner_id, owner.as_bytes().to_vec());
    // Nor does the lock role alone show another's owner id.
    let bob = as_user(cluster.client(), "bob-token");
    let history = bob.history("billing/run-7", 0).await.unwrap();
    assert!(history.entries[0].owner_id.is_empty(), "{history:?}");
    // The log at info and above never names the owner id.
    let logs = cluster.logs();
    assert!(!logs.contains(&owner.to_string()), "an owner id was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_identity_cannot_renew_or_release_a_lease_it_did_not_take() {
    let (_files, cluster) = secured(|_| {}).await;
    let alice = as_user(cluster.client(), "alice-token");
    let bob = as_user(cluster.client(), "bob-token");
    let (owner, token) = grant(&alice, "billing/run-8").await;

    // Bob has alice's owner id and token (say from a leak): refused as a
    // wrong owner id is.
    let stranger = OwnerId::random();
    let wrong = bob
        .renew("billing/run-8", stranger, token, TTL)
        .await
        .unwrap();
    let renewed = bob.renew("billing/run-8", owner, token, TTL).await.unwrap();
    assert!(matches!(renewed, RenewOutcome::Lost(_)), "{renewed:?}");
    assert_eq!(renewed, wrong);
    let released = bob.release("billing/run-8", owner, token).await.unwrap();
    assert!(
        matches!(released, ReleaseOutcome::NotHolder(_)),
        "{released:?}"
    );
    assert_eq!(
        released,
        bob.release("billing/run-8", stranger, token).await.unwrap()
    );
    // Alice still holds, with her token, and renews and releases herself.
    let d = alice.describe("billing/run-8").await.unwrap();
    assert!(d.held);
    assert_eq!(d.last_token, token.get());
    assert!(matches!(
        alice
            .renew("billing/run-8", owner, token, TTL)
            .await
            .unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(
        alice.release("billing/run-8", owner, token).await.unwrap(),
        ReleaseOutcome::Released
    );
    let logs = cluster.logs();
    assert!(
        logs.contains("refused: the lease is another identity's"),
        "the refusal was not logged"
    );
    assert!(!logs.contains(&owner.to_string()), "an owner id was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_identity_lease_limit_holds_after_the_leader_is_killed() {
    let (_files, mut cluster) =
        secured(|s| s.max_leases_per_identity = Some(Within::new(2).unwrap())).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let alice = as_user(cluster.client(), "alice-token");
    grant(&alice, "billing/a").await;
    grant(&alice, "billing/b").await;
    let refused = |r: Result<AcquireOutcome, ClientError>, when: &str| match r {
        Err(ClientError::ResourceExhausted(msg)) => {
            assert!(msg.contains("max_leases_per_identity (2)"), "{msg}")
        }
        other => panic!("{when}: expected the limit, got {other:?}"),
    };
    refused(
        alice
            .acquire_once("billing/c", OwnerId::random(), TTL, Duration::ZERO)
            .await,
        "before the leader change",
    );
    cluster.kill(leader);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let next = loop {
        let next = cluster.wait_for_leader(Duration::from_secs(20)).await;
        if next != leader {
            break next;
        }
        assert!(std::time::Instant::now() < deadline, "no new leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let alice = as_user(cluster.client_of(next), "alice-token");
    refused(
        alice
            .acquire_once("billing/c", OwnerId::random(), TTL, Duration::ZERO)
            .await,
        "under the new leader",
    );
    // Another identity is not affected.
    let bob = as_user(cluster.client_of(next), "bob-token");
    grant(&bob, "billing/c").await;
}
