//! SIGTERM: a leader hands its leadership to a caught-up follower before it
//! exits, so a new leader is elected well within one election timeout
//! (after a crash, followers wait twice that before they even stand); a
//! follower just exits. Real processes under a steady acquire load.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use fenced_client::{AcquireOutcome, Client};
use fenced_core::{OwnerId, Token};
use fenced_tests::{Cluster, Within};
use nix::sys::signal::Signal;

const ELECTION_TIMEOUT_MS: u64 = 1_000;

/// Acquire-release cycles on `resource` until `stop`; returns the tokens
/// granted, in order, and every error the client gave up with.
async fn load(
    client: Client,
    resource: String,
    stop: Arc<AtomicBool>,
) -> (Vec<Token>, Vec<String>) {
    let (mut tokens, mut errors) = (Vec::new(), Vec::new());
    while !stop.load(Ordering::Relaxed) {
        let owner = OwnerId::random();
        match client
            .acquire_once(&resource, owner, Duration::from_secs(10), Duration::ZERO)
            .await
        {
            Ok(AcquireOutcome::Granted { token, .. }) => {
                tokens.push(token);
                if let Err(e) = client.release(&resource, owner, token).await {
                    errors.push(format!("release: {e}"));
                }
            }
            Ok(other) => errors.push(format!("acquire: {other:?}")),
            Err(e) => errors.push(format!("acquire: {e}")),
        }
    }
    (tokens, errors)
}

async fn leader_among(cluster: &Cluster, ids: &[u64]) -> Option<u64> {
    for &id in ids {
        if let Ok(s) = cluster.client_of(id).status().await {
            if s.role == "leader" && s.node_id == id {
                return Some(id);
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_leader_hands_over_within_a_fraction_of_an_election_timeout() {
    let mut cluster = Cluster::start_with(3, |s| {
        s.election_timeout_ms = Some(Within::new(ELECTION_TIMEOUT_MS).unwrap())
    })
    .await;
    let leader = leader_among(&cluster, &[1, 2, 3]).await.expect("a leader");
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();

    // A follower given SIGTERM just exits, cleanly; the leader stays.
    let follower = others[1];
    let status = cluster
        .terminate(follower, Duration::from_secs(10))
        .expect("the follower exits");
    assert!(status.success(), "follower exit: {status:?}");
    assert_eq!(leader_among(&cluster, &[leader]).await, Some(leader));
    cluster.spawn(follower);

    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for i in 0..4 {
        workers.push(tokio::spawn(load(
            cluster.client(),
            format!("handover/{i}"),
            Arc::clone(&stop),
        )));
    }
    // A leader grants a vote only once a leader lease (twice the election
    // timeout) has passed since its own election; the load runs meanwhile.
    tokio::time::sleep(Duration::from_millis(ELECTION_TIMEOUT_MS * 3)).await;

    let sent = Instant::now();
    cluster.signal(leader, Signal::SIGTERM);
    let new_leader = loop {
        if let Some(id) = leader_among(&cluster, &others).await {
            break id;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(10),
            "no new leader\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = sent.elapsed();
    // Let the load run on under the new leader, then stop it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut per_resource: HashMap<usize, Vec<Token>> = HashMap::new();
    for (i, w) in workers.into_iter().enumerate() {
        let (tokens, errors) = w.await.unwrap();
        assert!(errors.is_empty(), "clients saw errors: {errors:?}");
        per_resource.insert(i, tokens);
    }
    let status = cluster
        .terminate(leader, Duration::from_secs(10))
        .expect("the old leader exits");
    assert!(status.success(), "old leader exit: {status:?}");
    assert!(
        cluster.log_of(leader).contains("leadership handed over"),
        "{}",
        cluster.log_of(leader)
    );
    assert!(
        took < Duration::from_millis(ELECTION_TIMEOUT_MS),
        "node {new_leader} led {took:?} after SIGTERM; a crash would take at least {} ms",
        2 * ELECTION_TIMEOUT_MS
    );
    for (i, tokens) in &per_resource {
        assert!(
            tokens.len() > 5,
            "resource {i}: only {} grants",
            tokens.len()
        );
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "resource {i}: tokens not increasing: {tokens:?}"
        );
    }
    println!("new leader {new_leader} after {took:?}");
}
