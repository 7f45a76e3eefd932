//! Owner ids are capabilities (with the token they renew and release a
//! lease), so a node logs them at debug level only: a node's log at its
//! default level never holds one, whatever the calls did.

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
