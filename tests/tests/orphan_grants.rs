//! No orphan grants: an acquire held up on a paused follower, whose caller
//! meanwhile acquired with the same owner id on the leader and released,
//! must not grant a lease to nobody when the follower resumes; and a `lock`
//! whose caller stops waiting (a timeout around it, a `select!`, a
//! shutdown) leaves nothing held once its request reaches the server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_client::{AcquireOutcome, ReleaseOutcome};
use fenced_core::OwnerId;
use fenced_proto::v1::{self, acquire_response};
use fenced_tests::Cluster;
use nix::sys::signal::Signal;

/// Long enough that an orphan grant would still block the resource when the
/// test looks.
const TTL: Duration = Duration::from_secs(60);

/// The reason of an `Ended` answer; `None` for any other answer.
fn ended_reason(resp: &v1::AcquireResponse) -> Option<v1::LostReason> {
    match &resp.outcome {
        Some(acquire_response::Outcome::Ended(e)) => v1::LostReason::try_from(e.reason).ok(),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_held_by_a_paused_follower_grants_nothing_when_it_resumes() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let res = "statement:account-1842:2026-07";
    let owner = OwnerId::random();
    let request = move || v1::AcquireRequest {
        label: String::new(),
        resource: res.as_bytes().to_vec(),
        owner_id: owner.as_bytes().to_vec(),
        ttl_ms: TTL.as_millis() as u64,
        wait_ms: 0,
    };

    // Connect to the follower first, so the acquire below goes out on an
    // open connection and waits, unread, in the paused follower's socket.
    let mut via_follower = cluster.lock_client(follower);
    via_follower
        .describe(v1::DescribeRequest {
            resource: res.as_bytes().to_vec(),
            allow_stale: true,
        })
        .await
        .expect("the follower answers before it is paused");

    cluster.signal(follower, Signal::SIGSTOP);
    let send = |deadline: Duration| {
        let mut client = via_follower.clone();
        let mut req = tonic::Request::new(request());
        req.set_timeout(deadline);
        tokio::spawn(async move { client.acquire(req).await })
    };
    // A caller with a short deadline gives up while the follower is paused
    // (its client resets the call). A caller with a longer deadline is still
    // waiting: its request reaches the leader when the follower resumes,
    // after the same owner id was granted elsewhere and released.
    let short = send(Duration::from_millis(300));
    let long = send(Duration::from_secs(10));
    let answer = short.await.unwrap();
    assert!(
        answer.is_err(),
        "a paused follower cannot have answered: {answer:?}"
    );

    // The caller retries on the leader with the same owner id, works, releases.
    let client = cluster.client_of(leader);
    let AcquireOutcome::Granted { token, .. } = client
        .acquire_once(res, owner, TTL, Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("the retry on the leader was not granted");
    };
    assert_eq!(
        client.release(res, owner, token).await.unwrap(),
        ReleaseOutcome::Released
    );

    // The follower resumes and handles the acquires it held.
    cluster.signal(follower, Signal::SIGCONT);
    let late = tokio::time::timeout(Duration::from_secs(10), long)
        .await
        .expect("the resumed follower answers")
        .unwrap()
        .expect("an ended attempt is a typed answer")
        .into_inner();

    let d = client.describe(res).await.unwrap();
    assert!(
        !d.held && d.last_token == token.get(),
        "the held-up acquire granted a lease to nobody: {d:?}\n{}",
        cluster.logs()
    );
    assert_eq!(
        ended_reason(&late),
        Some(v1::LostReason::Released),
        "the held-up acquire was not told its attempt ended: {late:?}"
    );
    let next = client
        .acquire_once(res, OwnerId::random(), TTL, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        matches!(next, AcquireOutcome::Granted { token: t, .. } if t > token),
        "another owner must be granted at once: {next:?}"
    );

    // Later still, the spent owner id learns that a newer owner holds it.
    let late = cluster
        .lock_client(follower)
        .acquire(request())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ended_reason(&late),
        Some(v1::LostReason::Superseded),
        "{late:?}"
    );
}

/// Whether another owner gets the resource within `wait`: a lease left to
/// nobody would hold it for the whole `TTL`.
async fn free_within(client: &fenced_client::Client, res: &str, wait: Duration) -> bool {
    match client.lock(res, Duration::from_secs(5), wait).await {
        Ok(lease) => {
            lease.release().await.unwrap();
            true
        }
        Err(fenced_client::ClientError::NotGranted { .. }) => false,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_dropped_while_it_waits_leaves_no_lease_behind() {
    let cluster = Cluster::start(3).await;
    cluster.wait_for_leader(Duration::from_secs(10)).await;
    let res = "import:customers";
    let client = cluster.client();
    let holder = client.lock(res, TTL, Duration::ZERO).await.unwrap();

    // The caller's own timeout ends the wait; the request stays queued on
    // the server and is granted when the holder lets go.
    let waiter = cluster.client();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(500),
        waiter.lock(res, TTL, Duration::from_secs(10)),
    )
    .await;
    assert!(gave_up.is_err(), "granted while the holder still held it");
    holder.release().await.unwrap();

    assert!(
        free_within(&client, res, Duration::from_secs(5)).await,
        "the dropped wait was granted to nobody and kept: {:?}",
        client.describe(res).await.unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_dropped_before_its_answer_leaves_no_lease_in_the_session() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let res = "reconcile:2026-12";
    // A client of the follower alone, its session already open: a lease
    // it is granted lives as long as this client keeps its session.
    let via_follower = cluster.client_of(follower);
    let warm = via_follower
        .lock("warm-up", TTL, Duration::ZERO)
        .await
        .unwrap();
    warm.release().await.unwrap();

    // The answer cannot come while the follower is paused: the caller's
    // timeout drops the call with its request already sent, and the reset
    // reaches the follower behind it. (A grant whose answer is lost after
    // the server acted is given back by the client:
    // crates/fenced-client/tests/dropped_lock.rs.)
    cluster.signal(follower, Signal::SIGSTOP);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        via_follower.lock(res, TTL, Duration::ZERO),
    )
    .await;
    assert!(gave_up.is_err(), "a paused follower answered");
    cluster.signal(follower, Signal::SIGCONT);

    let client = cluster.client_of(leader);
    assert!(
        free_within(&client, res, Duration::from_secs(5)).await,
        "the dropped acquire was granted in the session and kept: {:?}",
        client.describe(res).await.unwrap()
    );
}
