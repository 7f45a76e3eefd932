//! The leader's proposer drops a command whose caller's deadline passed
//! before it was proposed: nothing is written and the caller hears
//! DEADLINE_EXCEEDED, counted in `fenced_deadline_dropped_total`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::cluster;
use fenced_core::{AcquireOutcome, ClusterTime, Command, OwnerId, ResourceName};
use fenced_proto::v1::{self, lock_server::Lock};
use fenced_server::{observe::metrics, proposer::ProposeError, rpc::LockService};

fn acquire(resource: &ResourceName, owner: OwnerId) -> Command {
    Command::Acquire {
        resource: resource.clone(),
        owner_id: owner,
        ttl_ms: 30_000,
        wait_ms: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_deadline_passed_is_dropped_unwritten() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let node = cluster(dir.path(), 1, |_| {}).await.remove(0);
    let ctx = node.ctx.clone();
    let res = ResourceName::new("statement:account-1842:2026-07").unwrap();
    let entries_before = ctx.replica.raft.metrics().borrow().last_log_index;

    let past = Instant::now()
        .checked_sub(Duration::from_millis(1))
        .expect("a monotonic clock past its start");
    let dropped = ctx
        .replica
        .proposer
        .propose::<AcquireOutcome>(acquire(&res, OwnerId::random()), Some(past))
        .await;
    assert!(
        matches!(dropped, Err(ProposeError::DeadlineExceeded)),
        "{dropped:?}"
    );
    assert_eq!(ctx.replica.proposer.deadline_drops(), 1);
    let d = ctx.replica.shared.describe(res.as_str(), ClusterTime::ZERO);
    assert!(
        !d.held && d.last_token.is_none(),
        "nothing was granted: {d:?}"
    );
    assert_eq!(
        ctx.replica.raft.metrics().borrow().last_log_index,
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
        .replica
        .proposer
        .propose::<AcquireOutcome>(acquire(&res, OwnerId::random()), Some(future))
        .await
        .expect("a command within its deadline is proposed");
    assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
    assert_eq!(ctx.replica.proposer.deadline_drops(), 1);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_does_not_forward_a_request_whose_deadline_passed() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let nodes = cluster(dir.path(), 2, |_| {}).await;
    let leader_id = nodes[0]
        .wait_for_leader(Duration::from_secs(10))
        .await
        .expect("a leader");
    let (leader, follower): (Vec<_>, Vec<_>) = nodes
        .into_iter()
        .partition(|n| n.ctx.replica.id == leader_id);
    let (leader, follower) = (
        leader.into_iter().next().unwrap(),
        follower.into_iter().next().unwrap(),
    );
    let res = "statement:account-1842:2026-07";
    let acquire = || v1::AcquireRequest {
        label: String::new(),
        resource: res.as_bytes().to_vec(),
        owner_id: OwnerId::random().as_bytes().to_vec(),
        ttl_ms: 30_000,
        wait_ms: 0,
    };
    let service = LockService::new(follower.ctx.clone(), false);

    // A deadline that has passed by the time the follower would forward.
    let mut req = tonic::Request::new(acquire());
    req.set_timeout(Duration::from_nanos(1));
    let status = service
        .acquire(req)
        .await
        .expect_err("an expired request is not forwarded");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert_eq!(follower.ctx.replica.proposer.deadline_drops(), 1);
    assert_eq!(
        leader.ctx.replica.proposer.deadline_drops(),
        0,
        "it never reached the leader"
    );
    assert_eq!(
        leader.ctx.replica.shared.last_token(),
        None,
        "nothing was granted"
    );

    // With time left it is forwarded and granted.
    let mut req = tonic::Request::new(acquire());
    req.set_timeout(Duration::from_secs(5));
    let reply = service.acquire(req).await.expect("forwarded").into_inner();
    assert!(
        matches!(
            reply.outcome,
            Some(v1::acquire_response::Outcome::Granted(_))
        ),
        "{reply:?}"
    );
    assert_eq!(follower.ctx.replica.proposer.deadline_drops(), 1);
    follower.shutdown().await;
    leader.shutdown().await;
}
