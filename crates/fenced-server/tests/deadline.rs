//! The leader's proposer drops a command whose caller's deadline passed
//! before it was proposed: nothing is written and the caller hears
//! DEADLINE_EXCEEDED, counted in `fenced_deadline_dropped_total`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    net::{SocketAddr, TcpListener},
    time::{Duration, Instant},
};

use fenced_core::{ClusterTime, Command, Outcome, OwnerId, ResourceName};
use fenced_server::{
    metrics,
    node::{NodeConfig, RunningNode},
    proposer::ProposeError,
    types::Node,
};

fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("its address")
}

async fn single_node(dir: &std::path::Path) -> RunningNode {
    let (listen, peer) = (free_addr(), free_addr());
    let cluster = BTreeMap::from([(
        1,
        Node {
            peer_addr: peer.to_string(),
            client_addr: listen.to_string(),
        },
    )]);
    let node = RunningNode::start(NodeConfig::new(1, dir.to_path_buf(), listen, peer, cluster))
        .await
        .expect("the node starts");
    assert_eq!(
        node.wait_for_leader(Duration::from_secs(10)).await,
        Some(1),
        "a single node elects itself"
    );
    node
}

fn acquire(resource: &ResourceName, owner: OwnerId) -> Command {
    Command::Acquire {
        resource: resource.clone(),
        owner,
        ttl_ms: 30_000,
        wait_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_deadline_passed_is_dropped_unwritten() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let node = single_node(dir.path()).await;
    let ctx = node.ctx.clone();
    let res = ResourceName::new("statement:account-1842:2026-07").unwrap();
    let entries_before = ctx.raft.metrics().borrow().last_log_index;

    let past = Instant::now()
        .checked_sub(Duration::from_millis(1))
        .expect("a monotonic clock past its start");
    let dropped = ctx
        .proposer
        .propose(acquire(&res, OwnerId::random()), Some(past))
        .await;
    assert!(
        matches!(dropped, Err(ProposeError::DeadlineExceeded)),
        "{dropped:?}"
    );
    assert_eq!(ctx.proposer.deadline_drops(), 1);
    let d = ctx.shared.describe(res.as_str(), ClusterTime::ZERO);
    assert!(!d.held && d.last_token == 0, "nothing was granted: {d:?}");
    assert_eq!(
        ctx.raft.metrics().borrow().last_log_index,
        entries_before,
        "no log entry was written for the dropped command"
    );
    assert!(
        metrics::render(&ctx).contains("\nfenced_deadline_dropped_total 1\n"),
        "the drop is exported"
    );

    // A caller with time left is served as always.
    let future = Instant::now() + Duration::from_secs(10);
    let (outcome, _) = ctx
        .proposer
        .propose(acquire(&res, OwnerId::random()), Some(future))
        .await
        .expect("a command within its deadline is proposed");
    assert!(matches!(outcome, Outcome::Granted(_)), "{outcome:?}");
    assert_eq!(ctx.proposer.deadline_drops(), 1);
    node.shutdown().await;
}
