//! Job labels: set at acquire (fencectl --label, the client's
//! with_job_label, the JSON field), carried by the lease through a wait and
//! a leader's death, shown by Describe; a bad label is refused naming the
//! field and its bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_client::{AcquireOutcome, ClientError, OwnerId};
use fenced_tests::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_set_at_acquire_is_shown_while_the_lease_lives_on_every_node() {
    let mut cluster = Cluster::start(3).await;
    let out = cluster.fencectl(&[
        "--label",
        "statements 2026-07 #3",
        "--json",
        "acquire",
        "jobs/statements",
        "--ttl",
        "30s",
    ]);
    assert!(out.status.success(), "{out:?}");
    let described = |cluster: &Cluster| {
        let out = cluster.fencectl(&["--json", "describe", "jobs/statements"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert_eq!(described(&cluster)["label"], "statements 2026-07 #3");
    let text = cluster.fencectl(&["describe", "jobs/statements"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("job \"statements 2026-07 #3\""),
        "{text:?}"
    );
    // Replicated: the next leader knows it.
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.kill(leader);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = cluster.fencectl(&["--json", "describe", "jobs/statements"]);
        if out.status.success() {
            let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(d["label"], "statements 2026-07 #3", "{d}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{out:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_label_is_its_lease_once_granted_and_goes_with_it() {
    let cluster = Cluster::start(3).await;
    let plain = cluster.client();
    let labelled = cluster.client().with_job_label("worker 2").unwrap();
    let first = OwnerId::random();
    let AcquireOutcome::Granted { token, .. } = plain
        .acquire_once("jobs/queue", first, Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    assert_eq!(plain.describe("jobs/queue").await.unwrap().label, "");
    let waiter = tokio::spawn({
        let labelled = labelled.clone();
        async move {
            labelled
                .acquire_once(
                    "jobs/queue",
                    OwnerId::random(),
                    Duration::from_secs(30),
                    Duration::from_secs(20),
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    plain.release("jobs/queue", first, token).await.unwrap();
    let AcquireOutcome::Granted { token: second, .. } = waiter.await.unwrap().unwrap() else {
        panic!("the waiter was not granted")
    };
    let d = plain.describe("jobs/queue").await.unwrap();
    assert_eq!((d.last_token, d.label.as_str()), (second.get(), "worker 2"));
    let owner = OwnerId::random();
    // A release takes the label with the lease.
    let AcquireOutcome::Granted { .. } = plain
        .acquire_once("jobs/other", owner, Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    assert_eq!(plain.describe("jobs/other").await.unwrap().label, "");
}

/// A label is text for people, bounded: a control character (a terminal
/// escape on an operator's screen) or more than 64 bytes is refused by the
/// client, and by the server from a caller that skips the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_label_is_refused_naming_the_field_and_bound() {
    let cluster = Cluster::start(1).await;
    for bad in ["\u{1b}[2Jowned".to_string(), "x".repeat(65), String::new()] {
        match cluster.client().with_job_label(&bad) {
            Err(ClientError::InvalidArgument(why)) => {
                assert!(why.contains("label"), "{why}")
            }
            other => panic!("{bad:?}: {:?}", other.err()),
        }
    }
    let mut lock = fenced_proto::v1::lock_client::LockClient::new(cluster.channel(1));
    let refused = lock
        .acquire(fenced_proto::v1::AcquireRequest {
            resource: b"jobs/x".to_vec(),
            owner_id: OwnerId::random().as_bytes().to_vec(),
            ttl_ms: 10_000,
            wait_ms: 0,
            label: "x".repeat(65),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("label") && refused.message().contains("64"),
        "{refused:?}"
    );
}
