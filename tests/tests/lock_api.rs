//! The lock API end to end through gRPC against three real nodes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_client::{AcquireOutcome, LostReason, ReleaseOutcome, RenewOutcome};
use fenced_core::{OwnerId, Token};
use fenced_proto::v1;
use fenced_tests::Cluster;

const TTL: Duration = Duration::from_secs(30);

fn token_of(outcome: AcquireOutcome) -> Token {
    match outcome {
        AcquireOutcome::Granted { token, .. } => token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_end_to_end_through_grpc() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let res = "statement:account-1842:2026-07";

    // granted, then held for another owner
    let ta = token_of(
        client
            .acquire_once(res, a, TTL, Duration::ZERO)
            .await
            .unwrap(),
    );
    assert!(ta.get() >= 1);
    match client
        .acquire_once(res, b, TTL, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Held {
            current_token,
            remaining_ms,
        } => {
            assert_eq!(current_token, ta);
            assert!(remaining_ms > 0 && remaining_ms <= 30_000);
        }
        other => panic!("expected held, got {other:?}"),
    }
    // renewed keeps the token
    assert!(matches!(
        client.renew(res, a, ta, TTL).await.unwrap(),
        RenewOutcome::Renewed { ttl_ms: 30_000, .. }
    ));
    let d = client.describe(res).await.unwrap();
    assert!(d.held);
    assert_eq!(d.last_token, ta.get());
    // a stranger cannot renew or release
    assert_eq!(
        client.renew(res, b, ta, TTL).await.unwrap(),
        RenewOutcome::Lost(LostReason::Unknown)
    );
    assert_eq!(
        client.release(res, b, ta).await.unwrap(),
        ReleaseOutcome::NotHolder(LostReason::Unknown)
    );
    // released, and lost after release
    assert_eq!(
        client.release(res, a, ta).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        client.renew(res, a, ta, TTL).await.unwrap(),
        RenewOutcome::Lost(LostReason::Released)
    );
    // the next owner gets a higher token; the old one is superseded
    let tb = token_of(
        client
            .acquire_once(res, b, TTL, Duration::ZERO)
            .await
            .unwrap(),
    );
    assert!(tb > ta);
    assert_eq!(
        client.release(res, a, ta).await.unwrap(),
        ReleaseOutcome::Released,
        "a retried release of an ended lease still says released"
    );
    let c = OwnerId::random();
    assert_eq!(
        client.renew(res, c, ta, TTL).await.unwrap(),
        RenewOutcome::Lost(LostReason::Superseded { current_token: tb })
    );
    // expiry: a 1 s lease is lost after it runs out
    let short = "short-lease";
    let ts = token_of(
        client
            .acquire_once(short, a, Duration::from_secs(1), Duration::ZERO)
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(
        client.renew(short, a, ts, TTL).await.unwrap(),
        RenewOutcome::Lost(LostReason::Expired)
    );
    assert!(!client.describe(short).await.unwrap().held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_answers_by_forwarding_to_the_leader() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let client = cluster.client_of(follower);
    let owner = OwnerId::random();
    let t = token_of(
        client
            .acquire_once("via-follower", owner, TTL, Duration::ZERO)
            .await
            .unwrap(),
    );
    assert_eq!(
        token_of(
            client
                .acquire_once("via-follower", owner, TTL, Duration::ZERO)
                .await
                .unwrap()
        ),
        t
    );
    let d = client.describe("via-follower").await.unwrap();
    assert!(d.held && d.last_token == t.get());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clients_racing_for_a_new_resource_grant_exactly_one() {
    let cluster = Cluster::start(3).await;
    let endpoints = cluster.endpoints();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let eps = endpoints.clone();
        tasks.push(tokio::spawn(async move {
            // Each client enters through a different node.
            let client = fenced_client::Client::new([eps[i % eps.len()].clone()]).unwrap();
            client
                .acquire_once("never-seen-before", OwnerId::random(), TTL, Duration::ZERO)
                .await
                .unwrap()
        }));
    }
    let mut granted = Vec::new();
    let mut held = 0;
    for t in tasks {
        match t.await.unwrap() {
            AcquireOutcome::Granted { token, .. } => granted.push(token),
            AcquireOutcome::Held { .. } => held += 1,
            other => panic!("a fresh owner id was refused as spent: {other:?}"),
        }
    }
    assert_eq!(granted.len(), 1, "granted: {granted:?}");
    assert_eq!(held, 49);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_retried_after_a_lost_reply_returns_the_same_token() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let owner = OwnerId::random();
    // The first reply is "lost": the caller never looks at it.
    let first = token_of(
        client
            .acquire_once("lost-reply", owner, TTL, Duration::ZERO)
            .await
            .unwrap(),
    );
    for _ in 0..3 {
        let retry = token_of(
            client
                .acquire_once("lost-reply", owner, TTL, Duration::ZERO)
                .await
                .unwrap(),
        );
        assert_eq!(retry, first);
    }
    assert_eq!(
        client.describe("lost-reply").await.unwrap().last_token,
        first.get()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_argument_naming_the_field_and_changes_nothing() {
    let cluster = Cluster::start(3).await;
    let mut lock = cluster.lock_client(1);
    let before = cluster.status(1).await.unwrap();
    let good = v1::AcquireRequest {
        label: String::new(),
        resource: b"bad-input".to_vec(),
        owner_id: OwnerId::random().as_bytes().to_vec(),
        ttl_ms: 5_000,
        wait_ms: 0,
    };
    let cases: Vec<(v1::AcquireRequest, &str, &str)> = vec![
        (
            v1::AcquireRequest {
                resource: vec![],
                ..good.clone()
            },
            "resource",
            "1 to 200 bytes",
        ),
        (
            v1::AcquireRequest {
                resource: vec![b'x'; 201],
                ..good.clone()
            },
            "resource",
            "1 to 200 bytes",
        ),
        (
            v1::AcquireRequest {
                resource: b"a\x07b".to_vec(),
                ..good.clone()
            },
            "resource",
            "control",
        ),
        (
            v1::AcquireRequest {
                resource: vec![0xff, 0xfe],
                ..good.clone()
            },
            "resource",
            "UTF-8",
        ),
        (
            v1::AcquireRequest {
                owner_id: vec![0; 16],
                ..good.clone()
            },
            "owner_id",
            "non-nil",
        ),
        (
            v1::AcquireRequest {
                owner_id: vec![1; 3],
                ..good.clone()
            },
            "owner_id",
            "16 bytes",
        ),
        (
            v1::AcquireRequest {
                ttl_ms: 999,
                ..good.clone()
            },
            "ttl_ms",
            "1000 and 3600000",
        ),
        (
            v1::AcquireRequest {
                ttl_ms: 3_600_001,
                ..good.clone()
            },
            "ttl_ms",
            "1000 and 3600000",
        ),
        (
            v1::AcquireRequest {
                wait_ms: 3_600_001,
                ..good.clone()
            },
            "wait_ms",
            "3600000",
        ),
    ];
    for (req, field, bound) in cases {
        let status = lock.acquire(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "{}",
            status.message()
        );
        assert!(status.message().contains(bound), "{}", status.message());
    }
    let renew = v1::RenewRequest {
        resource: b"bad-input".to_vec(),
        owner_id: OwnerId::random().as_bytes().to_vec(),
        token: 0,
        ttl_ms: 5_000,
    };
    let status = lock.renew(renew).await.unwrap_err();
    assert!(
        status.message().starts_with("token: "),
        "{}",
        status.message()
    );
    let after = cluster.status(1).await.unwrap();
    assert_eq!(after.last_token, before.last_token, "no token was issued");
    assert_eq!(
        after.applied_commands, before.applied_commands,
        "nothing reached the log"
    );
    assert!(!cluster.client().describe("bad-input").await.unwrap().held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_is_granted_when_the_holder_releases() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let holder = OwnerId::random();
    let t1 = token_of(
        client
            .acquire_once("queue", holder, TTL, Duration::ZERO)
            .await
            .unwrap(),
    );
    let waiter = tokio::spawn({
        let client = cluster.client();
        async move {
            client
                .acquire_once("queue", OwnerId::random(), TTL, Duration::from_secs(20))
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(client.describe("queue").await.unwrap().waiters, 1);
    client.release("queue", holder, t1).await.unwrap();
    let t2 = token_of(
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap(),
    );
    assert!(t2 > t1);
}
