//! Crashes, restarts, snapshots, durability and hostile bytes, with real
//! processes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    io::Write,
    time::{Duration, Instant},
};

use fenced_client::{AcquireOutcome, Client, Token};
use fenced_core::OwnerId;
use fenced_tests::{Cluster, Within};

const TTL: Duration = Duration::from_secs(60);

async fn grant(client: &Client, resource: &str) -> Token {
    match client
        .acquire_once(resource, OwnerId::random(), TTL, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Granted { token, .. } => token,
        other => panic!("{resource}: expected a grant, got {other:?}"),
    }
}

/// Takes and releases `resource` `n` times; returns every token granted.
async fn cycle(client: &Client, resource: &str, n: usize) -> Vec<Token> {
    let mut tokens = Vec::new();
    for _ in 0..n {
        let owner = OwnerId::random();
        let AcquireOutcome::Granted { token, .. } = client
            .acquire_once(resource, owner, TTL, Duration::ZERO)
            .await
            .unwrap()
        else {
            panic!("{resource} was held");
        };
        client.release(resource, owner, token).await.unwrap();
        tokens.push(token);
    }
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_loses_no_grant_and_tokens_keep_rising() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let mut acknowledged = BTreeMap::new();
    for i in 0..20 {
        let res = format!("held-{i}");
        acknowledged.insert(res.clone(), grant(&client, &res).await);
    }
    let before = cycle(&client, "churn", 10).await;
    let max_before = *acknowledged.values().chain(&before).max().unwrap();

    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    cluster.kill(leader);
    let killed_at = Instant::now();
    let new_leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    assert_ne!(new_leader, leader);

    let after = cycle(&client, "churn", 1).await[0];
    let failover = killed_at.elapsed();
    assert!(
        after > max_before,
        "token {after} after the failover is not above {max_before}"
    );
    // Every acknowledged grant survived: still held, same token.
    for (res, token) in &acknowledged {
        let d = client.describe(res).await.unwrap();
        assert!(d.held, "{res} lost its lease");
        assert_eq!(d.last_token, token.get(), "{res}");
    }
    // Failover budget: 3 × the election timeout (500–1000 ms) plus the time
    // it takes to notice; generous on a loaded 2-core machine.
    assert!(
        failover < Duration::from_secs(6),
        "failover took {failover:?}"
    );

    // The old leader rejoins and catches up to the same state.
    cluster.spawn(leader);
    cycle(&client, "churn", 3).await;
    let statuses = cluster.wait_for_convergence(Duration::from_secs(20)).await;
    assert!(statuses
        .windows(2)
        .all(|w| w[0].state_digest == w[1].state_digest));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_killing_all_three_and_restarting_tokens_continue_upward() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let held = grant(&client, "kept").await;
    let tokens = cycle(&client, "restart", 15).await;
    let max_before = *tokens.iter().chain([&held]).max().unwrap();
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let client = cluster.client();
    let d = client.describe("kept").await.unwrap();
    assert!(
        d.held && d.last_token == held.get(),
        "the held lease survived: {d:?}"
    );
    let next = cycle(&client, "restart", 1).await[0];
    assert!(next > max_before, "{next} is not above {max_before}");
    let fresh = grant(&client, "fresh-after-restart").await;
    assert!(fresh > next);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_grant_was_fsynced_on_a_majority_first() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let mut before = BTreeMap::new();
    for id in 1..=3 {
        before.insert(id, cluster.status(id).await.unwrap().log_syncs);
    }
    // Sequential grants: each is its own log entry, and each is acknowledged
    // only after the leader and at least one follower fdatasync'ed it.
    let n = 25;
    for i in 0..n {
        grant(&client, &format!("durable-{i}")).await;
    }
    let mut synced = Vec::new();
    for id in 1..=3 {
        let s = cluster.status(id).await.unwrap();
        synced.push((s.log_syncs - before[&id], s.role));
    }
    let leader_syncs = synced.iter().find(|(_, r)| r == "leader").unwrap().0;
    assert!(
        leader_syncs >= n,
        "leader fdatasync'ed {leader_syncs} times for {n} grants"
    );
    let followers_with_all = synced
        .iter()
        .filter(|(count, role)| role == "follower" && *count >= n)
        .count();
    assert!(
        followers_with_all >= 1,
        "no follower fdatasync'ed once per grant: {synced:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_client_and_peer_ports_does_not_crash_a_node() {
    let cluster = Cluster::start(3).await;
    let node = &cluster.nodes()[0];
    let junk: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff".to_vec(),
        (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect(),
        vec![0; 10_000],
    ];
    for port in [node.client_port, node.peer_port] {
        for bytes in &junk {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.write_all(bytes);
            }
        }
    }
    // Well-framed Raft messages with garbage inside: the node closes that
    // connection and goes on serving.
    let frames: Vec<Vec<u8>> = vec![
        // AppendEntries too short for its time header.
        vec![0, 0, 0, 6, 1, 1, 0xff, 0xff, 0xff, 0x00],
        // AppendEntries with a time header and an undecodable payload.
        vec![
            0, 0, 0, 14, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 1, 0xff, 0xff, 0xff,
        ],
        // An unknown call.
        vec![0, 0, 0, 2, 9, 1],
        // A length beyond the largest message.
        vec![0xff, 0xff, 0xff, 0xff, 1],
    ];
    for frame in frames {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", node.peer_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The peer protocol's preface (version 2).
        s.write_all(b"fncdrft2").unwrap();
        s.write_all(&frame).unwrap();
        let mut buf = [0u8; 64];
        let n = std::io::Read::read(&mut s, &mut buf).expect("the node closes the connection");
        assert_eq!(n, 0, "the node answered a malformed raft frame");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        cluster.status(1).await.is_some(),
        "node 1 stopped answering"
    );
    grant(&cluster.client_of(1), "still-serving").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_recovers_from_snapshot_plus_log_with_identical_state() {
    let mut cluster =
        Cluster::start_with(3, |s| s.snapshot_logs = Some(Within::new(50).unwrap())).await;
    let client = cluster.client();
    for i in 0..10 {
        grant(&client, &format!("snap-held-{i}")).await;
    }
    cycle(&client, "snap-churn", 150).await;
    let statuses = cluster.wait_for_convergence(Duration::from_secs(20)).await;
    for s in &statuses {
        assert!(s.snapshot_index > 0, "node {} built no snapshot", s.node_id);
        assert!(s.purged_index > 0, "node {} purged no log", s.node_id);
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(follower);
    cycle(&client, "snap-churn", 20).await;
    cluster.spawn(follower);
    let statuses = cluster.wait_for_convergence(Duration::from_secs(30)).await;
    let digests: Vec<u64> = statuses.iter().map(|s| s.state_digest).collect();
    assert!(
        digests.windows(2).all(|w| w[0] == w[1]),
        "digests differ: {statuses:?}"
    );
    // And the whole cluster restarts from its snapshots too.
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let client = cluster.client();
    cycle(&client, "snap-churn", 1).await;
    let after = cluster.wait_for_convergence(Duration::from_secs(20)).await;
    assert!(after
        .windows(2)
        .all(|w| w[0].state_digest == w[1].state_digest));
    for i in 0..10 {
        assert!(
            client
                .describe(&format!("snap-held-{i}"))
                .await
                .unwrap()
                .held
        );
    }
}

/// A follower that missed more of the log than the leader keeps catches up
/// by installing the leader's snapshot (its log is purged only once that
/// snapshot is on disk, and its next appends wait for that), then survives a
/// kill -9 and a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_catches_up_by_snapshot_restarts_with_identical_state() {
    let mut cluster =
        Cluster::start_with(3, |s| s.snapshot_logs = Some(Within::new(50).unwrap())).await;
    let client = cluster.client();
    cycle(&client, "install-churn", 60).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(follower);
    // Far more entries than the 25 kept behind a snapshot of every 50.
    cycle(&client, "install-churn", 200).await;
    let behind = cluster.status(leader).await.unwrap().purged_index;
    cluster.spawn(follower);
    let same = |statuses: &[fenced_proto::v1::StatusResponse]| {
        statuses
            .windows(2)
            .all(|w| w[0].state_digest == w[1].state_digest)
    };
    let statuses = cluster.wait_for_convergence(Duration::from_secs(30)).await;
    assert!(same(&statuses), "digests differ: {statuses:?}");
    let caught_up = cluster.status(follower).await.unwrap();
    assert!(
        caught_up.snapshot_index >= behind,
        "the follower holds no snapshot past the leader's purged log: {caught_up:?}"
    );
    cluster.kill(follower);
    cluster.spawn(follower);
    cycle(&client, "install-churn", 1).await;
    let statuses = cluster.wait_for_convergence(Duration::from_secs(30)).await;
    assert!(
        same(&statuses),
        "digests differ after the restart: {statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_node_cleanly_and_it_rejoins() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let t = grant(&client, "before-sigterm").await;
    let status = cluster
        .terminate(2, Duration::from_secs(10))
        .expect("node 2 did not exit on SIGTERM");
    assert!(status.success(), "exit status {status:?}");
    cluster.spawn(2);
    cluster.wait_for_leader(Duration::from_secs(10)).await;
    let after = grant(&client, "after-sigterm").await;
    assert!(after > t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_never_shortens_a_lease_and_lengthens_it_by_at_most_the_election_time() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let ttl = Duration::from_secs(3);
    let sent = Instant::now();
    match client
        .acquire_once("election-lease", OwnerId::random(), ttl, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Granted { .. } => {}
        other => panic!("{other:?}"),
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    cluster.kill(leader);
    let elected_within = {
        let t = Instant::now();
        cluster.wait_for_leader(Duration::from_secs(10)).await;
        t.elapsed()
    };
    // Poll until the cluster says the lease is gone.
    let freed = loop {
        let d = client.describe("election-lease").await.unwrap();
        if !d.held {
            break sent.elapsed();
        }
        assert!(
            sent.elapsed() < Duration::from_secs(15),
            "the lease never ended"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert!(
        freed >= ttl,
        "the lease ended after {freed:?}, before its TTL"
    );
    // Lengthened at most by the time without a leader (plus polling slack).
    assert!(
        freed <= ttl + elected_within + Duration::from_secs(2),
        "the lease ended after {freed:?}; election took {elected_within:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_frozen_past_the_election_timeout_does_not_depose_the_leader() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    let term = cluster.status(leader).await.unwrap().term;
    let follower = (1..=3).find(|id| *id != leader).unwrap();

    // Frozen, it hears nothing; the other two commit without it, so its log
    // falls behind.
    cluster.signal(follower, nix::sys::signal::Signal::SIGSTOP);
    for i in 0..5 {
        grant(&client, &format!("while-frozen-{i}")).await;
    }
    // Several election timeouts (0.5-1 s here) and leader leases go by.
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.signal(follower, nix::sys::signal::Signal::SIGCONT);
    // Its election checks run as soon as it wakes, before or after the
    // leader's next message reaches it; a few more run afterwards.
    tokio::time::sleep(Duration::from_secs(2)).await;
    grant(&client, "after-the-thaw").await;
    for id in 1..=3 {
        let s = cluster.status(id).await.unwrap();
        assert_eq!(
            (s.term, s.leader_id),
            (term, leader),
            "node {id}: the frozen follower raised the term or moved the leadership: {s:?}\n{}",
            cluster.logs()
        );
    }
}
