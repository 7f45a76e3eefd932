//! A node whose disk fills up stops with a clear line and exit code 74, and
//! after a restart on the same data directory nothing acknowledged is lost.
//!
//! Needs root to mount a small tmpfs; skipped with a message otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use fenced_client::{AcquireOutcome, Client};
use fenced_core::OwnerId;
use fenced_proto::v1::DescribeRequest;
use fenced_tests::Cluster;

const TTL: Duration = Duration::from_secs(30);

/// The exit code `fenced` documents for a failed storage.
const EXIT_STORAGE_FAILED: i32 = 74;

/// A tmpfs mounted on a directory, unmounted (lazily, so a node still
/// holding a file open does not keep it) when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "mount -t tmpfs on {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap_or(false)
}

/// Writes `path` until the file system is full; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let mut written = 0;
    for block in [1 << 20, 4096, 512] {
        let buf = vec![0xa5u8; block];
        while file.write_all(&buf).is_ok() {
            written += block as u64;
        }
    }
    let _ = file.sync_all();
    written
}

/// One grant on "disk", released again so that the next one is new; its
/// token if it was acknowledged.
async fn grant(client: &Client) -> Option<u64> {
    let owner = OwnerId::random();
    match client
        .acquire_once("disk", owner, TTL, Duration::ZERO)
        .await
    {
        Ok(AcquireOutcome::Granted { token, .. }) => {
            let _ = client.release("disk", owner, token).await;
            Some(token.get())
        }
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_exits_74_and_keeps_every_acknowledged_grant() {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs for the full disk needs root");
        return;
    }
    let mut cluster = Cluster::stopped(3, |_| {});
    let data = cluster.nodes()[0].data_dir.clone();
    let _tmpfs = Tmpfs::mount(&data, "16m");
    cluster.start_all().await;

    let client = cluster.client().with_call_timeout(Duration::from_secs(2));
    let mut acknowledged = Vec::new();
    for _ in 0..5 {
        acknowledged.extend(grant(&client).await);
    }
    assert!(!acknowledged.is_empty(), "no grant before the disk filled");

    let filler = data.join("filler");
    fill(&filler);
    let filled = Instant::now();
    let bound = Duration::from_secs(30);
    let status = loop {
        if let Some(status) = cluster.exited(1) {
            break status;
        }
        assert!(
            filled.elapsed() < bound,
            "node 1 still running {bound:?} after its disk filled\n{}",
            cluster.logs()
        );
        acknowledged.extend(grant(&client).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        status.code(),
        Some(EXIT_STORAGE_FAILED),
        "{status:?}\n{}",
        cluster.logs()
    );
    let log = cluster.log_of(1);
    let line = log
        .lines()
        .find(|l| l.contains("stopping so a supervisor restarts the node"))
        .unwrap_or_else(|| panic!("no stopping line in node 1's log:\n{}", cluster.logs()));
    eprintln!("node 1 stopped with: {line}");
    assert!(
        line.contains("No space left on device")
            && ["raft-log", "state"]
                .iter()
                .any(|d| line.contains(&*data.join(d).to_string_lossy())),
        "the line names the error and the store it was in: {line}"
    );
    assert_eq!(
        log.matches("stopping so a supervisor restarts the node")
            .count(),
        1,
        "one line"
    );

    // Free the space and start node 1 again on the same data directory.
    std::fs::remove_file(&filler).unwrap();
    cluster.spawn(1);
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    let statuses = cluster.wait_for_convergence(Duration::from_secs(20)).await;
    assert!(
        statuses
            .windows(2)
            .all(|w| w[0].state_digest == w[1].state_digest),
        "the restarted node's table differs: {statuses:?}"
    );
    let newest = *acknowledged.iter().max().unwrap();
    let d = cluster.client().describe("disk").await.unwrap();
    assert!(
        d.last_token >= newest,
        "{d:?}: an acknowledged grant {newest} is missing"
    );
    // Node 1's own table, not the leader's.
    let local = cluster
        .lock_client(1)
        .describe(DescribeRequest {
            resource: b"disk".to_vec(),
            allow_stale: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(local.last_token >= newest, "{local:?} below {newest}");
    let next = loop {
        if let Some(token) = grant(&client).await {
            break token;
        }
        assert!(filled.elapsed() < bound * 3, "no grant after the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(next > newest, "token {next} after {newest}");
}
