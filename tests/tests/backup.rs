//! Backups and new clusters from them (`fencectl snapshot save`, `fenced
//! restore`), and a one-node cluster from a survivor (`fenced recover
//! --force-new-cluster`), against real processes. The rule under test: a
//! new cluster never grants a token at or below one the old cluster issued,
//! and a lease live in the backup stays held for the time it had left.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    process::Output,
    time::{Duration, Instant},
};

use fenced_client::{AcquireOutcome, Client};
use fenced_core::{OwnerId, Token};
use fenced_tests::{bin, write_auth_files, Cluster, ORDERS_AND_OPS_POLICY};
use serde_json::Value;

fn fenced(args: &[&str]) -> Output {
    std::process::Command::new(bin("fenced"))
        .args(args)
        .output()
        .unwrap()
}

fn restore(from: &Path, data_dir: &Path, id: u64, initial: &str, extra: &[&str]) -> Output {
    let id = id.to_string();
    let mut args = vec![
        "restore",
        "--from",
        from.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--node-id",
        &id,
        "--initial-cluster",
        initial,
    ];
    args.extend_from_slice(extra);
    fenced(&args)
}

fn save(cluster: &Cluster, file: &Path) -> Value {
    let out = cluster.fencectl(&["--json", "snapshot", "save", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "snapshot save failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Acquires `resource` for a new owner; returns the token and expiry.
async fn grant(client: &Client, resource: &str, ttl: Duration) -> (Token, u64) {
    match client
        .acquire_once(resource, OwnerId::random(), ttl, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Granted {
            token,
            expires_at_ms,
            ..
        } => (token, expires_at_ms),
        other => panic!("{resource}: not granted: {other:?}"),
    }
}

/// A lease live before the restore or recovery is still held, by `token`.
async fn assert_held(client: &Client, resource: &str, token: Token) {
    match client
        .acquire_once(
            resource,
            OwnerId::random(),
            Duration::from_secs(5),
            Duration::ZERO,
        )
        .await
        .unwrap()
    {
        AcquireOutcome::Held { current_token, .. } => assert_eq!(current_token, token),
        other => panic!("{resource}: the live lease was lost: {other:?}"),
    }
}

/// `n` grants, each released at once, spread over `resources`, four at a
/// time; returns the highest token.
async fn grants(client: &Client, resources: &[String], n: usize) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..4 {
        let (client, resources) = (client.clone(), resources.to_vec());
        tasks.spawn(async move {
            let mut highest = 0;
            for i in (worker..n).step_by(4) {
                let resource = &resources[i % resources.len()];
                let owner = OwnerId::random();
                let token = loop {
                    match client
                        .acquire_once(
                            resource,
                            owner,
                            Duration::from_secs(5),
                            Duration::from_secs(5),
                        )
                        .await
                        .unwrap()
                    {
                        AcquireOutcome::Granted { token, .. } => break token,
                        AcquireOutcome::Held { .. } => continue,
                        other => panic!("{resource}: {other:?}"),
                    }
                };
                client.release(resource, owner, token).await.unwrap();
                highest = highest.max(token.get());
            }
            highest
        });
    }
    let mut highest = 0;
    while let Some(h) = tasks.join_next().await {
        highest = highest.max(h.unwrap());
    }
    highest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_cluster_grants_above_every_old_token_and_keeps_live_leases() {
    let old = Cluster::start(3).await;
    let client = old.client();
    let resources: Vec<String> = (0..20).map(|i| format!("orders/{i}")).collect();
    grants(&client, &resources, 100).await;
    // Live in the backup; its holder may still be working after the restore.
    let held_ttl = Duration::from_secs(12);
    let (held_token, held_expires) = grant(&client, "held/report", held_ttl).await;

    let backups = tempfile::tempdir().unwrap();
    let file = backups.path().join("backup.fncd");
    let saved = save(&old, &file);
    assert!(saved["live_leases"].as_u64().unwrap() >= 1, "{saved}");
    let backup_time = saved["cluster_time_ms"].as_u64().unwrap();
    let left_at_backup = held_expires.saturating_sub(backup_time);
    assert!(
        left_at_backup > 5_000,
        "{left_at_backup} ms left at the backup"
    );

    // The old cluster goes on granting after the backup.
    let highest_old = grants(&client, &resources, 1_000).await;
    assert!(highest_old > held_token.get());
    drop(old);

    // A damaged or truncated file is refused by name and writes nothing.
    let fresh = Cluster::stopped(3, |_| {});
    let bytes = std::fs::read(&file).unwrap();
    let damaged = fresh.dir.path().join("damaged.fncd");
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x40;
    std::fs::write(&damaged, &flipped).unwrap();
    let target = &fresh.nodes()[0].data_dir;
    let out = restore(&damaged, target, 1, fresh.initial_cluster(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("checksum"), "{err}");
    assert!(err.contains("damaged.fncd"), "{err}");
    std::fs::write(&damaged, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let out = restore(&damaged, target, 1, fresh.initial_cluster(), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("corrupt or truncated"),
        "{err}"
    );
    // A floor below the backup's own tokens is refused.
    let low = (held_token.get() - 1).to_string();
    let out = restore(
        &file,
        target,
        1,
        fresh.initial_cluster(),
        &["--token-floor", &low],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--token-floor"),
        "{err}"
    );
    assert!(
        !target.exists(),
        "a refused restore wrote {}",
        target.display()
    );
    let leftovers: Vec<_> = std::fs::read_dir(fresh.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "damaged.fncd")
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");

    // The old file into a fresh three-node cluster.
    let mut fresh = fresh;
    for node in fresh.nodes() {
        let out = restore(&file, &node.data_dir, node.id, fresh.initial_cluster(), &[]);
        assert!(
            out.status.success(),
            "restore of node {}: {}",
            node.id,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A second restore into a data dir that now holds a node is refused.
    let out = restore(
        &file,
        &fresh.nodes()[0].data_dir,
        1,
        fresh.initial_cluster(),
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not empty"), "{err}");

    let started = Instant::now();
    fresh.start_all().await;
    let client = fresh.client();

    // The lease live in the backup is held, by its old token, until the
    // time it had left has passed since the restore.
    match client
        .acquire_once("held/report", OwnerId::random(), held_ttl, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Held { current_token, .. } => assert_eq!(current_token, held_token),
        other => panic!("the backed-up lease is not held after the restore: {other:?}"),
    }
    let freed = loop {
        let d = client.describe("held/report").await.unwrap();
        if !d.held {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_millis(left_at_backup) + Duration::from_secs(20),
            "the backed-up lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        freed >= Duration::from_millis(left_at_backup),
        "freed {freed:?} after the restore began, before the {left_at_backup} ms it had left"
    );

    // Every touched resource, the held one and a new one: above every
    // token the old cluster issued, before and after the backup.
    let mut names = resources.clone();
    names.push("held/report".into());
    names.push("first/after-restore".into());
    for name in &names {
        let (token, _) = grant(&client, name, Duration::from_secs(5)).await;
        assert!(
            token.get() > highest_old,
            "{name}: token {token} is not above {highest_old}, issued by the old cluster"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_recovers_as_a_one_node_cluster_above_every_old_token() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let resources: Vec<String> = (0..10).map(|i| format!("jobs/{i}")).collect();
    let highest = grants(&client, &resources, 200).await;
    let (held_token, _) = grant(&client, "jobs/held", Duration::from_secs(30)).await;
    let highest = highest.max(held_token.get());

    // Two nodes die with their data; the third is stopped for the recovery.
    let survivor = 3;
    for id in [1, 2] {
        cluster.kill(id);
        std::fs::remove_dir_all(&cluster.nodes()[id as usize - 1].data_dir).unwrap();
    }
    cluster.terminate(survivor, Duration::from_secs(10));
    let node = &cluster.nodes()[survivor as usize - 1];
    let me = format!(
        "{survivor}=127.0.0.1:{}/127.0.0.1:{}",
        node.peer_port, node.client_port
    );
    let data = node.data_dir.to_str().unwrap().to_string();
    // A directory without a node's data is refused, and left alone.
    let empty = cluster.dir.path().join("not-a-node");
    let out = fenced(&[
        "recover",
        "--force-new-cluster",
        "--data-dir",
        empty.to_str().unwrap(),
        "--node-id",
        "3",
        "--initial-cluster",
        &me,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no fenced node's data"),
        "{err}"
    );
    assert!(!empty.exists());
    // Without --force-new-cluster nothing happens.
    let out = fenced(&[
        "recover",
        "--data-dir",
        &data,
        "--node-id",
        "3",
        "--initial-cluster",
        &me,
    ]);
    assert!(!out.status.success());
    let out = fenced(&[
        "recover",
        "--force-new-cluster",
        "--data-dir",
        &data,
        "--node-id",
        "3",
        "--initial-cluster",
        &me,
    ]);
    assert!(
        out.status.success(),
        "recover: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    cluster.spawn(survivor);
    let client = cluster.client_of(survivor);
    let status = {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match client.status().await {
                Ok(s) if s.role == "leader" => break s,
                _ => assert!(Instant::now() < deadline, "the survivor never led alone"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(status.members.len(), 1, "{:?}", status.members);
    assert_held(&client, "jobs/held", held_token).await;
    for name in resources.iter().map(String::as_str).chain(["jobs/new"]) {
        let (token, _) = grant(&client, name, Duration::from_secs(5)).await;
        assert!(
            token.get() > highest,
            "{name}: token {token} is not above {highest}"
        );
    }
}

/// The attack on the counter: a floor at the end of a u64 made the next
/// grant's token 0, then 1, below tokens already issued. Such a floor is
/// refused by name and bound, writing nothing; a restore at the bound
/// (2^62) grants above every token in the backup, and never goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_floor_past_its_bound_is_refused_and_one_at_it_never_goes_backwards() {
    const BOUND: u64 = 1 << 62;
    let old = Cluster::start(1).await;
    let client = old.client();
    let resources: Vec<String> = (0..5).map(|i| format!("ledger/{i}")).collect();
    let highest_old = grants(&client, &resources, 20).await;
    let (held_token, _) = grant(&client, "ledger/held", Duration::from_secs(60)).await;
    let backups = tempfile::tempdir().unwrap();
    let file = backups.path().join("backup.fncd");
    let saved = save(&old, &file);
    let in_backup = saved["last_token"].as_u64().unwrap();
    assert!(in_backup >= highest_old.max(held_token.get()), "{saved}");
    drop(old);

    let mut fresh = Cluster::stopped(3, |_| {});
    let target = fresh.nodes()[0].data_dir.clone();
    for floor in [
        "18446744073709551614",
        "18446744073709551615",
        "4611686018427387905",
    ] {
        let out = restore(
            &file,
            &target,
            1,
            fresh.initial_cluster(),
            &["--token-floor", floor],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--token-floor {floor} was accepted");
        assert!(
            err.contains("--token-floor") && err.contains("4611686018427387904 (2^62)"),
            "{floor}: {err}"
        );
        assert!(
            !target.exists(),
            "a refused restore wrote {}",
            target.display()
        );
    }
    let bound = BOUND.to_string();
    for node in fresh.nodes() {
        let out = restore(
            &file,
            &node.data_dir,
            node.id,
            fresh.initial_cluster(),
            &["--token-floor", &bound],
        );
        assert!(
            out.status.success(),
            "restore at the bound, node {}: {}",
            node.id,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    fresh.start_all().await;
    let client = fresh.client();
    assert_held(&client, "ledger/held", held_token).await;
    // Known resources and new ones, in turn, each released after: every
    // token above the one before and above the floor (so above every token
    // in the backup), never 0.
    let mut last = BOUND;
    for round in 0..3 {
        for name in resources.iter().cloned().chain([format!("new/{round}")]) {
            let owner = OwnerId::random();
            let token = match client
                .acquire_once(&name, owner, Duration::from_secs(5), Duration::ZERO)
                .await
                .unwrap()
            {
                AcquireOutcome::Granted { token, .. } => token,
                other => panic!("{name}: not granted: {other:?}"),
            };
            assert!(
                token.get() > last && token.get() > in_backup,
                "{name}: token {token} after {last} (floor {BOUND}, backup's last {in_backup})"
            );
            last = token.get();
            let d = client.describe(&name).await.unwrap();
            assert!(d.held && d.last_token == token.get(), "{name}: {d:?}");
            client.release(&name, owner, token).await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_save_needs_the_admin_role_and_a_refusal_writes_nothing() {
    let files = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth_files(
        files.path(),
        &[
            ("worker", "worker-token", "orders"),
            ("root", "root-token", "ops"),
        ],
        ORDERS_AND_OPS_POLICY,
    );
    let cluster = Cluster::start_with(3, |s| {
        s.auth_tokens = Some(tokens.clone().into());
        s.auth_policy = Some(policy.clone().into());
    })
    .await;
    let file = files.path().join("backup.fncd");
    let path = file.to_str().unwrap();
    for (token, code) in [(None, 5), (Some("worker-token"), 5)] {
        let mut args = Vec::new();
        if let Some(t) = token {
            args.extend(["--auth-token", t]);
        }
        args.extend(["snapshot", "save", path]);
        let out = cluster.fencectl(&args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{token:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!file.exists(), "{token:?}: a refused save wrote the file");
    }
    let out = cluster.fencectl(&["--auth-token", "root-token", "snapshot", "save", path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::metadata(&file).unwrap().len() > 0);
}
