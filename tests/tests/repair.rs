//! A node whose data is damaged or lost is rebuilt from its peers under the
//! same id, in the same membership, with one command (`fenced repair`) and
//! a start: no grant is lost, no token repeats, and the node takes no part
//! in a majority until it knows every promise that could matter
//! (docs/OPERATIONS.md, "A damaged node").

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

use fenced_client::{Acquired, Lease};
use fenced_tests::{acquire_all, bin, Cluster, RunSettings, Within};

const TTL: Duration = Duration::from_secs(120);
/// Snapshots every 20 entries: the repaired node gets a snapshot, then the
/// log after it.
fn settings(s: &mut RunSettings) {
    s.snapshot_logs = Some(Within::new(20).unwrap());
}

fn fenced(args: &[&str], dir: &Path) -> Output {
    Command::new(bin("fenced"))
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .output()
        .unwrap()
}

fn repair(dir: &Path, id: u64) -> Output {
    fenced(&["repair", "--node-id", &id.to_string()], dir)
}

/// Flips one byte in the middle of the largest file of the Raft log.
fn damage_log(dir: &Path) {
    let largest = std::fs::read_dir(dir.join("raft-log"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .max_by_key(|e| e.metadata().map_or(0, |m| m.len()))
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&largest).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&largest, bytes).unwrap();
}

/// Waits until node `id` answers and is no longer repairing, its applied
/// index at least `applied`.
async fn wait_repaired(cluster: &Cluster, id: u64, applied: u64, within: Duration) {
    let started = Instant::now();
    loop {
        if let Some(s) = cluster.status(id).await {
            if !s.repairing && s.last_applied >= applied {
                return;
            }
        }
        assert!(
            started.elapsed() < within,
            "node {id} not repaired within {within:?}:\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` leases, kept (a lease dropped is released), and their resources
/// and tokens.
async fn take_leases(
    cluster: &Cluster,
    prefix: &str,
    n: usize,
) -> (Vec<Lease>, Vec<(String, u64)>) {
    let held = acquire_all(&cluster.client(), prefix, n, TTL).await;
    let leases = held
        .iter()
        .map(|l| (l.resource().to_string(), l.token().get()))
        .collect();
    (held, leases)
}

/// Every lease in `leases` is still held under its token, and a new grant
/// is above them all.
async fn nothing_lost(cluster: &Cluster, leases: &[(String, u64)]) {
    let client = cluster.client();
    for (resource, token) in leases {
        let d = client.describe(resource).await.unwrap();
        assert!(d.held, "{resource}: lease lost");
        assert_eq!(d.last_token, *token, "{resource}: token changed");
    }
    let highest = leases.iter().map(|(_, t)| *t).max().unwrap();
    let Acquired::Granted(next) = client.acquire("after-repair", TTL).await.unwrap() else {
        panic!("after-repair is held");
    };
    assert!(
        next.token().get() > highest,
        "token {} after the repair is not above {highest}",
        next.token().get()
    );
}

/// The leader's disk is damaged: it stops, the others go on, `fenced
/// repair` and a start bring it back under its id; it then votes in the
/// election that follows the loss of another node, and nothing committed
/// is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_leader_is_rebuilt_from_its_peers_and_votes_again() {
    let mut cluster = Cluster::start_tls(3, settings).await;
    let (held, leases) = take_leases(&cluster, "repair-", 60).await;
    let damaged = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let dir = cluster.nodes()[(damaged - 1) as usize].data_dir.clone();
    assert!(cluster
        .terminate(damaged, Duration::from_secs(10))
        .is_some());
    damage_log(&dir);
    let checked = fenced(&["check"], &dir);
    assert_eq!(checked.status.code(), Some(1));

    // A repair marker of another node's id is refused at the start.
    let other = if damaged == 1 { 2 } else { 1 };
    let wrong = dir.with_file_name("marked-for-another-node");
    assert!(repair(&wrong, other).status.success());
    let started = Command::new(bin("fenced"))
        .args(["run", "--id", &damaged.to_string(), "--data-dir"])
        .arg(&wrong)
        .args(["--initial-cluster", cluster.initial_cluster()])
        .args(["--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&started.stderr);
    assert!(!started.status.success(), "{stderr}");
    assert!(stderr.contains("another node's"), "{stderr}");

    let out = repair(&dir, damaged);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("moved what the data directory held"),
        "{stdout}"
    );
    let aside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "the damaged files are kept");
    assert!(aside[0].path().join("raft-log").is_dir());

    cluster.spawn(damaged);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let applied = cluster.status(leader).await.unwrap().last_applied;
    wait_repaired(&cluster, damaged, applied, Duration::from_secs(30)).await;
    let members = cluster.status(damaged).await.unwrap().members;
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(members.iter().all(|m| m.voter), "{members:?}");

    // The repaired node must vote now: with the leader gone, it and the
    // third node are the majority that elects the next one.
    assert!(cluster.terminate(leader, Duration::from_secs(10)).is_some());
    let next = cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert_ne!(next, leader);
    nothing_lost(&cluster, &leases).await;
    drop(held);
    cluster.spawn(leader);
    cluster.wait_for_convergence(Duration::from_secs(30)).await;
    // Whole again: the marker is gone and every file checks.
    assert!(cluster
        .terminate(damaged, Duration::from_secs(10))
        .is_some());
    let checked = fenced(&["check"], &dir);
    assert_eq!(
        checked.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );
}

/// The attack: a wiped node answering at term 0 could form a majority with
/// a leader that the other voter already left behind, or vote twice in a
/// term. While one of the other voters is down, a node being repaired
/// answers no Raft call, so the leader and it commit nothing; once the
/// other voter is back, the repair ends and writes go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_being_repaired_forms_no_majority_until_every_other_voter_answered() {
    let mut cluster = Cluster::start_with(3, settings).await;
    let (held, leases) = take_leases(&cluster, "attack-", 30).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let mut followers = cluster
        .nodes()
        .iter()
        .map(|n| n.id)
        .filter(|id| *id != leader);
    let (wiped, away) = (followers.next().unwrap(), followers.next().unwrap());
    let dir = cluster.nodes()[(wiped - 1) as usize].data_dir.clone();
    assert!(cluster.terminate(wiped, Duration::from_secs(10)).is_some());
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(repair(&dir, wiped).status.success());
    assert!(cluster.terminate(away, Duration::from_secs(10)).is_some());
    cluster.spawn(wiped);

    // The leader and the wiped node alone: no grant may commit.
    let attempt = tokio::time::timeout(
        Duration::from_secs(4),
        cluster.client_of(leader).acquire("needs-a-majority", TTL),
    )
    .await;
    assert!(
        !matches!(attempt, Ok(Ok(Acquired::Granted(_)))),
        "a grant committed with a node being repaired as the majority:\n{}",
        cluster.logs()
    );
    let status = cluster.status(wiped).await;
    assert!(status.is_none() || status.unwrap().repairing);
    let log = cluster.log_of(wiped);
    assert!(log.contains("repair: waiting"), "{log}");
    assert!(
        !log.contains("repair: fenced"),
        "fenced without every other voter:\n{log}"
    );

    cluster.spawn(away);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let applied = cluster.status(leader).await.unwrap().last_applied;
    wait_repaired(&cluster, wiped, applied, Duration::from_secs(30)).await;
    nothing_lost(&cluster, &leases).await;
    drop(held);
}

/// The typo, or a replaced disk: the node starts on an empty directory
/// without `fenced repair`. It finds its cluster formed, repairs itself
/// instead of seeding a first membership at term 0, and votes again only
/// once caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_on_an_empty_directory_of_a_formed_cluster_repairs_itself() {
    let mut cluster = Cluster::start_with(3, settings).await;
    let (held, leases) = take_leases(&cluster, "emptied-", 20).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let emptied = cluster
        .nodes()
        .iter()
        .map(|n| n.id)
        .find(|id| *id != leader)
        .unwrap();
    let dir = cluster.nodes()[(emptied - 1) as usize].data_dir.clone();
    assert!(cluster
        .terminate(emptied, Duration::from_secs(10))
        .is_some());
    std::fs::remove_dir_all(&dir).unwrap();
    cluster.spawn(emptied);
    let applied = cluster.status(leader).await.unwrap().last_applied;
    wait_repaired(&cluster, emptied, applied, Duration::from_secs(30)).await;
    let log = cluster.log_of(emptied);
    assert!(log.contains("its data was lost"), "{log}");
    assert!(log.contains("repaired: voting again"), "{log}");
    assert!(cluster.terminate(leader, Duration::from_secs(10)).is_some());
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    nothing_lost(&cluster, &leases).await;
    drop(held);
}
