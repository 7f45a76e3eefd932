//! The client library's leases against a real cluster: renewal, loss by
//! every route, blocking acquire, leader failover, and `fencectl run`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use fenced_client::{Acquired, ClientError, LeaseLoss, LostReason};
use fenced_core::OwnerId;
use fenced_tests::{bin, Cluster};
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_renews_past_many_ttls_and_the_token_stays() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let lease = client
        .lock("kept-alive", Duration::from_secs(1), Duration::ZERO)
        .await
        .unwrap();
    let token = lease.token();
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(lease.check(), Ok(()));
    assert!(!lease.cancellation().is_cancelled());
    assert_eq!(lease.token(), token);
    let d = client.describe("kept-alive").await.unwrap();
    assert!(d.held && d.last_token == token.get(), "{d:?}");
    lease.release().await.unwrap();
    assert!(!client.describe("kept-alive").await.unwrap().held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_cancels_the_lease_before_the_cluster_could_expire_it() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let ttl = Duration::from_secs(2);
    let lease = client
        .lock("unreachable", ttl, Duration::ZERO)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.signal_all(Signal::SIGSTOP);
    // The local deadline is the last successful renewal's send time + TTL −
    // margin: strictly before the cluster's expiry of that renewal.
    let deadline = Instant::now() + lease.remaining();
    let cancel = lease.cancellation();
    tokio::time::timeout(ttl * 2, cancel.cancelled())
        .await
        .expect("never cancelled");
    let fired = Instant::now();
    cluster.signal_all(Signal::SIGCONT);
    let margin = fenced_client::LeaseOptions::default().safety_margin(ttl);
    assert!(
        fired <= deadline + margin / 2,
        "cancelled {:?} after the deadline",
        fired - deadline
    );
    assert_eq!(lease.check(), Err(LeaseLoss::DeadlinePassed));
    assert_eq!(lease.lost().await, LeaseLoss::DeadlinePassed);
    // The cluster lets the lease go too, and the next owner gets a higher token.
    let next = client
        .lock("unreachable", ttl, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(next.token() > lease.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_renewal_cancels_the_lease_and_names_the_reason() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let lease = client
        .lock("refused", Duration::from_millis(1_500), Duration::ZERO)
        .await
        .unwrap();
    // Someone holding the capability (owner id AND token) ends the lease
    // behind the keeper's back, and a new owner takes it.
    let raw = cluster.client();
    raw.release("refused", lease.owner_id(), lease.token())
        .await
        .unwrap();
    let Acquired::Granted(newer) = raw
        .acquire("refused", Duration::from_secs(10))
        .await
        .unwrap()
    else {
        panic!("the resource should be free");
    };
    // The lease lives in the client's session: the next keep-alive counts
    // one lease fewer than the client keeps, and a read of the token says
    // what became of it (superseded by the newer grant).
    let reason = tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .unwrap();
    assert_eq!(
        reason,
        LeaseLoss::Refused(LostReason::Superseded {
            current_token: newer.token()
        })
    );
    assert!(lease.cancellation().is_cancelled());
    assert!(newer.token() > lease.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_its_own_refused_at_renewal_names_the_reason() {
    let cluster = Cluster::start(3).await;
    let client = cluster
        .client()
        .with_lease_options(fenced_client::LeaseOptions {
            no_sessions: true,
            ..Default::default()
        });
    let lease = client
        .lock("refused-own", Duration::from_millis(1_500), Duration::ZERO)
        .await
        .unwrap();
    let raw = cluster.client();
    raw.release("refused-own", lease.owner_id(), lease.token())
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .unwrap();
    assert_eq!(reason, LeaseLoss::Refused(LostReason::Released));
    assert!(lease.cancellation().is_cancelled());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_sees_its_loss_as_soon_as_it_resumes() {
    let cluster = Cluster::start(3).await;
    let mut worker = Command::new(bin("lease-worker"))
        .args([&cluster.endpoints().join(","), "frozen", "2000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(worker.id() as i32);
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let granted = lines.next().unwrap().unwrap();
    let old_token: u64 = granted.strip_prefix("granted ").unwrap().parse().unwrap();
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "ok",
        "useful work began under the lease"
    );

    nix::sys::signal::kill(pid, Signal::SIGSTOP).unwrap();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    // Past the TTL the cluster hands the resource to a new owner.
    let newer = cluster
        .client()
        .lock("frozen", Duration::from_secs(10), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(newer.token().get() > old_token);
    // With the whole cluster frozen too, no round trip can tell the worker
    // anything: it must see the loss from its own deadline.
    cluster.signal_all(Signal::SIGSTOP);
    nix::sys::signal::kill(pid, Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    // Lines buffered before the pause may come first; the first line written
    // after it must already say lost.
    let mut saw_lost = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.starts_with("lost") {
            saw_lost = Some(line);
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_millis(150),
            "still 'ok' after resuming: {line}"
        );
    }
    let lost = saw_lost.unwrap();
    assert!(resumed.elapsed() < Duration::from_secs(1));
    assert!(lost.contains("local deadline"), "{lost}");
    cluster.signal_all(Signal::SIGCONT);
    let _ = worker.kill();
    let _ = worker.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_waiters_are_granted_in_arrival_order() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let holder = client
        .lock("fifo", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..5 {
        let client = cluster.client();
        let tx = tx.clone();
        tokio::spawn(async move {
            let lease = client
                .lock("fifo", Duration::from_secs(30), Duration::from_secs(60))
                .await
                .unwrap();
            tx.send((i, lease)).unwrap();
        });
        // Arrival order is the order the server queues them in.
        let deadline = Instant::now() + Duration::from_secs(5);
        while client_waiters(&cluster, "fifo").await < i + 1 {
            assert!(Instant::now() < deadline, "waiter {i} never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut last_token = holder.token();
    holder.release().await.unwrap();
    for expected in 0..5 {
        let (i, lease) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(i, expected, "waiter {i} was granted out of order");
        assert!(lease.token() > last_token);
        last_token = lease.token();
        lease.release().await.unwrap();
    }
}

async fn client_waiters(cluster: &Cluster, resource: &str) -> u32 {
    cluster.client().describe(resource).await.unwrap().waiters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_elapses_is_not_granted_and_leaves_no_trace() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let holder = client
        .lock("elapses", Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap();
    let started = Instant::now();
    let err = client
        .lock(
            "elapses",
            Duration::from_secs(30),
            Duration::from_millis(1_200),
        )
        .await
        .err()
        .unwrap();
    let waited = started.elapsed();
    match err {
        ClientError::NotGranted { current_token, .. } => assert_eq!(current_token, holder.token()),
        other => panic!("expected not granted, got {other}"),
    }
    assert!(
        waited >= Duration::from_millis(1_100),
        "gave up after {waited:?}"
    );
    let d = client.describe("elapses").await.unwrap();
    assert_eq!(d.waiters, 0);
    assert_eq!(
        d.last_token,
        holder.token().get(),
        "no token was issued to the waiter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_continue_across_a_leader_kill_and_no_held_lease_is_reported_lost() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let mut leases = Vec::new();
    for i in 0..5 {
        leases.push(
            client
                .lock(
                    &format!("failover-{i}"),
                    Duration::from_secs(5),
                    Duration::ZERO,
                )
                .await
                .unwrap(),
        );
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(5)).await;
    cluster.kill(leader);
    tokio::time::sleep(Duration::from_secs(8)).await;
    for lease in &leases {
        assert_eq!(
            lease.check(),
            Ok(()),
            "{} was reported lost",
            lease.resource()
        );
        let d = client.describe(lease.resource()).await.unwrap();
        assert!(
            d.held && d.last_token == lease.token().get(),
            "{}: {d:?}",
            lease.resource()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_run_kills_its_child_before_anyone_else_can_hold_the_lease() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child1.pid");
    let tokenfile = dir.path().join("child1.token");
    let bearerfile = dir.path().join("child1.bearer");
    let script = format!(
        "echo $$ > {}; echo \"$FENCED_TOKEN\" > {}; echo $FENCED_FENCING_TOKEN > {}; exec sleep 600",
        pidfile.display(),
        bearerfile.display(),
        tokenfile.display()
    );
    let ttl_ms = 3_000u64;
    let mut run1 = Command::new(bin("fencectl"))
        .args([
            "--endpoints",
            &cluster.endpoints().join(","),
            "run",
            "fenced-run",
            "--ttl",
            "3s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        // A bearer token in the environment reaches the command unchanged:
        // the fencing token has a variable of its own.
        .env("FENCED_TOKEN", "bearer-of-the-caller")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tokenfile.exists()
        || std::fs::read_to_string(&tokenfile)
            .unwrap()
            .trim()
            .is_empty()
    {
        assert!(Instant::now() < deadline, "child never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let child_pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&bearerfile).unwrap().trim(),
        "bearer-of-the-caller",
        "FENCED_TOKEN is the caller's bearer token, not the fencing token"
    );
    let token1: u64 = std::fs::read_to_string(&tokenfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    cluster.signal_all(Signal::SIGSTOP);
    let cut_off = Instant::now();
    // The child must be gone within the TTL of the cut-off.
    while fenced_tests::pid_alive(child_pid) {
        assert!(
            cut_off.elapsed() < Duration::from_millis(ttl_ms),
            "child still running after the TTL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone_after = cut_off.elapsed();
    let status = run1.wait().unwrap();
    assert_eq!(status.code(), Some(4), "exit code says the lease was lost");
    cluster.signal_all(Signal::SIGCONT);

    // A second run gets the lease only after that, with a higher token.
    let tokenfile2 = dir.path().join("child2.token");
    let script2 = format!("echo $FENCED_FENCING_TOKEN > {}", tokenfile2.display());
    let status2 = Command::new(bin("fencectl"))
        .args([
            "--endpoints",
            &cluster.endpoints().join(","),
            "run",
            "fenced-run",
            "--ttl",
            "3s",
            "--wait",
            "20s",
            "--",
            "sh",
            "-c",
            &script2,
        ])
        .status()
        .unwrap();
    assert_eq!(status2.code(), Some(0), "the command's own exit code");
    let token2: u64 = std::fs::read_to_string(&tokenfile2)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(token2 > token1, "{token2} is not above {token1}");
    assert!(gone_after < Duration::from_millis(ttl_ms));
    let _ = OwnerId::random();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_refused_after_expiry_and_a_new_grant_cancels_the_lease() {
    // The leader's clock runs 10% fast and this client keeps no margin, so
    // its renewal arrives after the cluster already ended the lease: the
    // refusal path, and the reason a margin exists.
    let cluster = Cluster::start_with(3, |s| s.test_clock_skew_ppm = Some(100_000)).await;
    let careless = cluster
        .client()
        .with_lease_options(fenced_client::LeaseOptions {
            // The cluster ends a 2 s lease after about 1.82 s; the renewal goes
            // out at 1.85 s, and the local deadline would only pass at 2 s.
            renew_every: Some(Duration::from_millis(1_850)),
            margin: Some(Duration::ZERO),
            no_jitter: true,
            ..Default::default()
        });
    let lease = careless
        .lock("skewed", Duration::from_secs(2), Duration::ZERO)
        .await
        .unwrap();
    let other = cluster.client();
    let deadline = Instant::now() + Duration::from_secs(3);
    let newer = loop {
        if let Acquired::Granted(l) = other
            .acquire("skewed", Duration::from_secs(10))
            .await
            .unwrap()
        {
            break l;
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(newer.token() > lease.token());
    let reason = tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .unwrap();
    assert_eq!(reason, LeaseLoss::Refused(LostReason::Expired));
    assert!(lease.cancellation().is_cancelled());
    assert!(lease.check().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lease_runs_the_work_then_releases_and_drops_it_when_the_lease_is_lost() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let token = client
        .with_lease(
            "with-lease",
            Duration::from_secs(5),
            Duration::ZERO,
            |lease| async move {
                assert!(lease.check().is_ok());
                lease.token()
            },
        )
        .await
        .unwrap();
    assert!(token.get() >= 1);
    assert!(
        !client.describe("with-lease").await.unwrap().held,
        "released after the work"
    );

    // Work that outlives its lease is dropped and the loss is returned.
    let started = Instant::now();
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = finished.clone();
    let frozen = &cluster;
    let err = client
        .with_lease(
            "with-lease",
            Duration::from_secs(1),
            Duration::ZERO,
            |_lease| async move {
                frozen.signal_all(Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_secs(10)).await;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::LeaseLost { .. }), "{err}");
    assert!(!finished.load(std::sync::atomic::Ordering::SeqCst));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "work ran for {:?}",
        started.elapsed()
    );
    cluster.signal_all(Signal::SIGCONT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_lock_holds_until_sigterm_then_releases() {
    let cluster = Cluster::start(3).await;
    let mut lock = Command::new(bin("fencectl"))
        .args([
            "--endpoints",
            &cluster.endpoints().join(","),
            "--json",
            "lock",
            "held-by-cli",
            "--ttl",
            "2s",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(lock.stdout.take().unwrap()).lines();
    let granted: serde_json::Value = serde_json::from_str(&out.next().unwrap().unwrap()).unwrap();
    assert_eq!(granted["status"], "granted");
    // Held across several TTLs by the keeper.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let d = cluster.client().describe("held-by-cli").await.unwrap();
    assert!(d.held && d.last_token == granted["token"].as_u64().unwrap());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(lock.id() as i32),
        Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(lock.wait().unwrap().code(), Some(0));
    let released: serde_json::Value = serde_json::from_str(&out.next().unwrap().unwrap()).unwrap();
    assert_eq!(released["status"], "released");
    assert!(!cluster.client().describe("held-by-cli").await.unwrap().held);
}
