//! What a node keeps to itself: owner ids are capabilities (with the token
//! they renew and release a lease), so a node logs them at debug level only;
//! and its data dir is readable by its owner alone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_client::{AcquireOutcome, RenewOutcome};
use fenced_core::OwnerId;
use fenced_tests::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_ids_never_reach_a_nodes_log_above_debug() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let ttl = Duration::from_secs(2);
    let mut owners = Vec::new();
    for i in 0..5 {
        let resource = format!("secret-{i}");
        let owner = OwnerId::random();
        owners.push(owner);
        let AcquireOutcome::Granted { token, .. } = client
            .acquire_once(&resource, owner, ttl, Duration::ZERO)
            .await
            .unwrap()
        else {
            panic!("{resource} was not granted");
        };
        // A held resource, a wrong token, a renewal, a release and a spent
        // owner id: every kind of answer.
        let other = OwnerId::random();
        owners.push(other);
        client
            .acquire_once(&resource, other, ttl, Duration::ZERO)
            .await
            .unwrap();
        client.renew(&resource, other, token, ttl).await.unwrap();
        let renewed = client.renew(&resource, owner, token, ttl).await.unwrap();
        assert!(matches!(renewed, RenewOutcome::Renewed { .. }));
        client.release(&resource, owner, token).await.unwrap();
        client
            .acquire_once(&resource, owner, ttl, Duration::ZERO)
            .await
            .unwrap();
    }
    // A leader change, with its log lines, while leases run out.
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    cluster.kill(leader);
    cluster.wait_for_leader(Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let logs = cluster.logs();
    assert!(
        logs.contains("INFO"),
        "the nodes logged nothing at info level"
    );
    for owner in owners {
        let id = owner.to_string();
        assert!(
            !logs.contains(&id),
            "owner id {id} is in a node's log:\n{logs}"
        );
    }
}

/// Every file and directory under a node's data dir is its owner's alone
/// (files 0600, directories 0700), the Raft log's own chunk files included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_data_dir_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    for i in 0..20 {
        client
            .acquire_once(
                &format!("private-{i}"),
                OwnerId::random(),
                Duration::from_secs(30),
                Duration::ZERO,
            )
            .await
            .unwrap();
    }
    // A read makes the cluster-time file.
    client.describe("private-0").await.unwrap();
    let mut checked = 0;
    let mut stack: Vec<std::path::PathBuf> =
        cluster.nodes().iter().map(|n| n.data_dir.clone()).collect();
    while let Some(path) = stack.pop() {
        let meta = std::fs::metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        assert_eq!(
            mode & 0o077,
            0,
            "{} is open to others: mode {mode:o}",
            path.display()
        );
        checked += 1;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        }
    }
    assert!(checked > 9, "only {checked} paths under the data dirs");
}
