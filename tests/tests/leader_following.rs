//! The client follows the leader: listed with a follower first, it sends
//! its calls to the leader once an answer named it, so the followers stop
//! forwarding, and it finds the new leader after the old one is killed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use fenced_client::{AcquireOutcome, Acquired, Client, ReleaseOutcome, RenewOutcome};
use fenced_core::OwnerId;
use fenced_tests::{http_get, Cluster};

/// `fenced_forwarded_requests_total` of the node whose `/metrics` is `addr`.
async fn forwarded(addr: &str) -> u64 {
    let (code, body) = http_get(addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix("fenced_forwarded_requests_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no forward counter in /metrics:\n{body}"))
}

/// The forward counters of nodes `ids`, by id.
async fn forwards_of(metrics: &[String], ids: &[u64]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for id in ids {
        out.push((*id, forwarded(&metrics[(*id - 1) as usize]).await));
    }
    out
}

/// Acquire, renew, release and describe on fresh resources, `rounds` times,
/// plus a self-renewing lease held meanwhile.
async fn work(client: &Client, tag: &str, rounds: usize) {
    let ttl = Duration::from_secs(5);
    let held = match client
        .acquire(&format!("follow:{tag}:kept"), Duration::from_secs(2))
        .await
        .unwrap()
    {
        Acquired::Granted(lease) => lease,
        Acquired::Held { .. } => panic!("a fresh resource is free"),
    };
    for i in 0..rounds {
        let resource = format!("follow:{tag}:{i}");
        let owner = OwnerId::random();
        let token = match client
            .acquire_once(&resource, owner, ttl, Duration::ZERO)
            .await
            .unwrap()
        {
            AcquireOutcome::Granted { token, .. } => token,
            other => panic!("{resource}: {other:?}"),
        };
        assert!(matches!(
            client.renew(&resource, owner, token, ttl).await.unwrap(),
            RenewOutcome::Renewed { .. }
        ));
        assert!(client.describe(&resource).await.unwrap().held);
        assert_eq!(
            client.release(&resource, owner, token).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
    // Long enough for the keeper to renew at least once (a third of 2 s).
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(held.check(), Ok(()), "the kept lease was renewed");
    held.release().await.unwrap();
}

fn client_addr(cluster: &Cluster, id: u64) -> String {
    cluster
        .nodes()
        .iter()
        .find(|n| n.id == id)
        .map(|n| n.client_addr())
        .expect("a node of the cluster")
}

/// Calls until one succeeds: the first calls after a leader dies may find
/// no leader yet.
async fn until_answered(client: &Client, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let r = client
            .acquire_once(
                "follow:probe",
                OwnerId::random(),
                Duration::from_secs(1),
                Duration::ZERO,
            )
            .await;
        if r.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no answer within {within:?}: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_follows_the_leader_and_followers_stop_forwarding() {
    let (mut cluster, metrics) = Cluster::start_with_metrics(3, |_| {}).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    // Followers first: a client that stayed on the first endpoint would
    // have every call forwarded.
    let mut endpoints: Vec<String> = followers
        .iter()
        .map(|id| client_addr(&cluster, *id))
        .collect();
    endpoints.push(client_addr(&cluster, leader));
    let client = Client::new(&endpoints).unwrap();

    let before = forwards_of(&metrics, &followers).await;
    let owner = OwnerId::random();
    let first = client
        .acquire_once(
            "follow:first",
            owner,
            Duration::from_secs(5),
            Duration::ZERO,
        )
        .await
        .unwrap();
    assert!(matches!(first, AcquireOutcome::Granted { .. }), "{first:?}");
    let after_first = forwards_of(&metrics, &followers).await;
    assert_eq!(
        after_first[0].1,
        before[0].1 + 1,
        "the first call went to the first follower, which forwarded it \
         (the counter sees forwarding): {before:?} -> {after_first:?}"
    );

    work(&client, "a", 20).await;
    let after_work = forwards_of(&metrics, &followers).await;
    assert_eq!(
        after_work, after_first,
        "no call was forwarded once the leader was known"
    );

    // The leader dies; the client finds the new one among its endpoints.
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    until_answered(&client, Duration::from_secs(20)).await;
    // One more call: the answer to the last one named the new leader.
    until_answered(&client, Duration::from_secs(5)).await;
    let survivor = followers
        .iter()
        .copied()
        .filter(|id| *id != new_leader)
        .collect::<Vec<_>>();
    let settled = forwards_of(&metrics, &survivor).await;
    work(&client, "b", 20).await;
    let after_failover = forwards_of(&metrics, &survivor).await;
    assert_eq!(
        after_failover, settled,
        "after the failover the client sends its calls to the new leader {new_leader}"
    );
    let new_leader_forwards = forwards_of(&metrics, &[new_leader]).await;
    let after_more = {
        work(&client, "c", 5).await;
        forwards_of(&metrics, &[new_leader]).await
    };
    assert_eq!(
        new_leader_forwards, after_more,
        "the leader forwards nothing"
    );
}

/// A follower reads a request only as far as the caller's permission needs
/// and forwards it whole: the leader makes the command, and its refusal of
/// a bad field comes back naming that field. A request whose resource name
/// is itself bad is refused on the follower, with nothing forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_unconverted_and_the_leader_names_the_bad_field() {
    let (cluster, metrics) = Cluster::start_with_metrics(3, |_| {}).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let mut lock = cluster.lock_client(follower);
    let good = fenced_proto::v1::AcquireRequest {
        label: String::new(),
        resource: b"forwarded-once".to_vec(),
        owner_id: OwnerId::random().as_bytes().to_vec(),
        ttl_ms: 5_000,
        wait_ms: 0,
    };

    let before = forwarded(&metrics[(follower - 1) as usize]).await;
    let bad_ttl = fenced_proto::v1::AcquireRequest {
        ttl_ms: 0,
        ..good.clone()
    };
    let err = lock
        .acquire(bad_ttl)
        .await
        .expect_err("a TTL of 0 is refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("ttl_ms"), "{err:?}");
    assert_eq!(
        forwarded(&metrics[(follower - 1) as usize]).await,
        before + 1,
        "the follower forwarded the request, and the leader refused it"
    );

    // A wait past every bound goes to the leader too, which refuses it at
    // once: the follower's budget for the call is its own bound, not this.
    let bad_wait = fenced_proto::v1::AcquireRequest {
        wait_ms: u64::MAX,
        ..good.clone()
    };
    let asked = Instant::now();
    let err = lock
        .acquire(bad_wait)
        .await
        .expect_err("a wait past the bound");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("wait_ms"), "{err:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        forwarded(&metrics[(follower - 1) as usize]).await,
        before + 2,
        "the follower forwarded it"
    );

    let bad_name = fenced_proto::v1::AcquireRequest {
        resource: vec![],
        ..good.clone()
    };
    let err = lock.acquire(bad_name).await.expect_err("an empty name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("resource"), "{err:?}");
    assert_eq!(
        forwarded(&metrics[(follower - 1) as usize]).await,
        before + 2,
        "a name the permission cannot be checked on goes nowhere"
    );

    let granted = lock.acquire(good).await.expect("granted").into_inner();
    assert!(
        matches!(
            granted.outcome,
            Some(fenced_proto::v1::acquire_response::Outcome::Granted(_))
        ),
        "{granted:?}"
    );
    assert_eq!(
        forwarded(&metrics[(follower - 1) as usize]).await,
        before + 3
    );
}
