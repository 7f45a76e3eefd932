//! Cluster time across leader changes and restarts, with real processes:
//! an idle cluster's time does not run back at a leader change (an expired
//! lease stays expired, describe's time never decreases), and a leader
//! change lengthens a lease by at most a heartbeat and the election.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use fenced_client::{AcquireOutcome, Client, RenewOutcome};
use fenced_core::{OwnerId, Token};
use fenced_proto::v1::DescribeResponse;
use fenced_tests::Cluster;

/// The nodes' defaults (crates/fenced-server/src/node/mod.rs).
const HEARTBEAT: Duration = Duration::from_millis(100);

async fn grant(client: &Client, resource: &str, owner: OwnerId, ttl: Duration) -> Token {
    match client
        .acquire_once(resource, owner, ttl, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Granted { token, .. } => token,
        other => panic!("{resource}: expected a grant, got {other:?}"),
    }
}

/// Describes `resource` until it answers (a leader change may be under way).
async fn describe(client: &Client, resource: &str) -> DescribeResponse {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match client.describe(resource).await {
            Ok(d) => return d,
            Err(e) if Instant::now() < deadline => {
                eprintln!("describe {resource}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("describe {resource}: {e}"),
        }
    }
}

/// A 2 s lease on "r" left to run out in a quiet period longer than it;
/// describe says free. Returns the owner, its token and that describe.
async fn an_expired_lease(client: &Client) -> (OwnerId, Token, DescribeResponse) {
    let owner = OwnerId::random();
    let token = grant(client, "r", owner, Duration::from_secs(2)).await;
    // Nothing is written while the lease runs out.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = describe(client, "r").await;
    assert!(!before.held, "the 2 s lease is still held after 5 s");
    assert_eq!(before.last_token, token.get());
    (owner, token, before)
}

/// After `what`, the lease is still over: describe free at a time not
/// lower, and a renewal lost.
async fn assert_still_over(
    client: &Client,
    (owner, token, before): (OwnerId, Token, DescribeResponse),
    what: &str,
) {
    let after = describe(client, "r").await;
    assert!(
        after.cluster_time_ms >= before.cluster_time_ms,
        "cluster time ran back from {} to {} ms {what}",
        before.cluster_time_ms,
        after.cluster_time_ms
    );
    assert!(!after.held, "the ended lease came back {what}: {after:?}");
    let renewed = client
        .renew("r", owner, token, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        matches!(renewed, RenewOutcome::Lost(_)),
        "a renewal revived the expired lease {what}: {renewed:?}"
    );
}

/// The sequence that showed cluster time running back: a short lease, a
/// quiet period longer than it, describe says free, the leader dies. After
/// the change the lease must still be over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_stays_expired_after_the_leader_dies() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let expired = an_expired_lease(&client).await;

    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(15)).await;
    assert_ne!(new_leader, leader);
    assert_still_over(&client, expired, "at the leader change").await;
}

/// The same after a restart of every node: the time a describe revealed
/// was made durable, so it is where the cluster starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_stays_expired_after_the_whole_cluster_restarts() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let expired = an_expired_lease(&client).await;

    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert_still_over(&client, expired, "across the restart").await;
}

/// How long a lease still has, as of a moment on this process's clock.
struct Remaining {
    ms: u64,
    at: Instant,
}

async fn remaining(client: &Client, resource: &str) -> Remaining {
    let d = describe(client, resource).await;
    assert!(d.held, "{resource} is not held: {d:?}");
    Remaining {
        ms: d.remaining_ms,
        at: Instant::now(),
    }
}

/// A leader change lengthens a lease by at most the time from the dead
/// leader's last heartbeat to the new leader's election, and never shortens
/// it (the new leader's clock never runs ahead of the old one's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_lengthens_a_lease_by_at_most_a_heartbeat_and_the_election() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    grant(&client, "long", OwnerId::random(), Duration::from_secs(30)).await;
    // A quiet period: only heartbeats carry the leader's time.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first = remaining(&client, "long").await;

    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    cluster.kill(leader);
    let killed = Instant::now();
    cluster.wait_for_leader(Duration::from_secs(15)).await;
    let election = killed.elapsed();
    let second = remaining(&client, "long").await;

    // Had the cluster's clock run on unchanged, this much would be left.
    let elapsed = second.at.duration_since(first.at).as_millis() as i64;
    let unchanged = first.ms as i64 - elapsed;
    let lengthened = second.ms as i64 - unchanged;
    // What a describe's round trip can add or take on a loaded machine.
    let slack = 250;
    let bound = (HEARTBEAT + election).as_millis() as i64 + slack;
    eprintln!("lengthened by {lengthened} ms; election took {election:?}; bound {bound} ms");
    assert!(
        lengthened <= bound,
        "the leader change lengthened the lease by {lengthened} ms, more than a heartbeat and the election ({bound} ms)"
    );
    assert!(
        lengthened >= -slack,
        "the leader change shortened the lease by {} ms: the new clock ran ahead",
        -lengthened
    );
}

/// The leader that the nodes `among` agree on in a term after `after`, and
/// that term.
async fn leader_after(cluster: &Cluster, among: &[u64], after: u64) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut seen = Vec::new();
        for id in among {
            seen.push(cluster.status(*id).await.map(|s| (s.leader_id, s.term)));
        }
        if let Some(Some((leader, term))) = seen.first().copied() {
            if leader != 0 && term > after && seen.iter().all(|s| *s == Some((leader, term))) {
                return (leader, term);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader after term {after} among {among:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A leader paused past elections wakes with its clock run on: ahead of
/// its successors' by the time each election took. Its times, issued in a
/// term already over, must not carry a later leader's clock ahead of the
/// leader that granted a lease, or the lease ends early by that gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_that_wakes_does_not_move_a_later_leaders_clock_ahead() {
    let mut cluster = Cluster::start(3).await;
    let paused = cluster.wait_for_leader(Duration::from_secs(5)).await;
    let first_term = cluster.status(paused).await.map_or(0, |s| s.term);
    let others: Vec<u64> = (1..=3).filter(|id| *id != paused).collect();

    // Two elections while it is stopped: each puts the new leader's clock
    // further behind the stopped one's.
    cluster.signal(paused, nix::sys::signal::Signal::SIGSTOP);
    let (second, second_term) = leader_after(&cluster, &others, first_term).await;
    cluster.kill(second);
    cluster.spawn(second);
    let (third, third_term) = leader_after(&cluster, &others, second_term).await;
    let at_third = cluster.client_of(third);
    grant(
        &at_third,
        "long",
        OwnerId::random(),
        Duration::from_secs(60),
    )
    .await;
    // A quiet period after the grant: only heartbeats carry time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = remaining(&at_third, "long").await;

    // The stopped leader wakes and sends with its own clock; the leader
    // that granted the lease dies, and the two left elect with the woken
    // node's vote (or its candidacy).
    cluster.signal(paused, nix::sys::signal::Signal::SIGCONT);
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.kill(third);
    let left: Vec<u64> = (1..=3).filter(|id| *id != third).collect();
    let (last, _) = leader_after(&cluster, &left, third_term).await;
    let after = remaining(&cluster.client_of(last), "long").await;

    let elapsed = after.at.duration_since(before.at).as_millis() as i64;
    let unchanged = before.ms as i64 - elapsed;
    let shortened = unchanged - after.ms as i64;
    let slack = 250;
    eprintln!(
        "leaders {paused} -> {second} -> {third} -> {last}; the lease was shortened by {shortened} ms"
    );
    assert!(
        shortened <= slack,
        "the lease granted by node {third} lost {shortened} ms at the change to node {last}: \
         a clock ran ahead of the leader that granted it"
    );
}
