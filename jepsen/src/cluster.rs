//! Three (or more) `fenced run` processes, each in its own network namespace,
//! started, killed, paused and resumed by the harness.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result};
use fenced_proto::v1::{
    cluster_client::ClusterClient, lock_client::LockClient, DescribeRequest, StatusRequest,
    StatusResponse,
};
use fenced_testkit::{ClusterSpec, NodeSpec, Pki, RunSettings, Tls};
use nix::sys::signal::Signal;
use tonic::transport::Channel;

use crate::net::{node_addr, node_ns};

pub const CLIENT_PORT: u16 = 7101;
pub const PEER_PORT: u16 = 7201;

/// Where libfaketime is installed by Debian's `libfaketime` package.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How every node is started.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// The run's certificates: every node serves TLS with its own.
    pub pki: Pki,
    /// `fenced run` settings of every node.
    pub settings: RunSettings,
    /// Per node (index 0 = node 1): monotonic clock-rate skew in ppm.
    pub skew_ppm: Vec<i64>,
    /// Run every node under libfaketime, its wall-clock offset read from a
    /// file the harness rewrites.
    pub faketime: bool,
    /// Mount a small tmpfs on every node's data directory, so that one
    /// node's disk can fill up alone.
    pub disk_of_its_own: bool,
    /// The bug every node (and `fenced repair`) plants, for a canary run.
    pub canary: Option<fenced_core::canary::Canary>,
}

/// The size of a node's own file system: a 40 s run under the campaign's
/// load writes a few MB.
const DISK_SIZE: &str = "size=256m";

/// The nodes of a run, each in its namespace, launched by fenced-testkit.
pub struct Cluster {
    kit: fenced_testkit::Cluster,
    dir: PathBuf,
    /// The libfaketime offset file of each node under libfaketime.
    faketime: BTreeMap<u64, PathBuf>,
    /// Data directories with a tmpfs of their own, unmounted on drop.
    mounts: Vec<PathBuf>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kit.kill_all();
        for dir in &self.mounts {
            // Lazily: a process still holding a file does not keep it.
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(dir)
                .status();
        }
    }
}

/// Whether `mount_point` is a node's own disk of a disk run
/// (`OUT/disk-SEED/nID-data`).
fn is_run_disk(mount_point: &str) -> bool {
    let mut parts = mount_point.rsplit('/');
    let node = parts.next().unwrap_or_default();
    let run = parts.next().unwrap_or_default();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    node.strip_prefix('n')
        .and_then(|n| n.strip_suffix("-data"))
        .is_some_and(digits)
        && run.strip_prefix("disk-").is_some_and(digits)
}

/// Unmounts the nodes' own disks an interrupted disk run left mounted.
pub fn unmount_leftover_disks() {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some("tmpfs"), Some(point)) = (fields.next(), fields.next()) else {
            continue;
        };
        if is_run_disk(point) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(point)
                .status();
        }
    }
}

/// Mounts a tmpfs of [`DISK_SIZE`] on `dir`.
fn mount_tmpfs(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", DISK_SIZE, "tmpfs"])
        .arg(dir)
        .output()
        .context("running mount")?;
    anyhow::ensure!(
        out.status.success(),
        "mount -t tmpfs on {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A lazily connecting TLS channel to `addr`, with the harness's
/// certificate.
pub fn channel(addr: &str) -> Result<Channel> {
    crate::tls::channel(addr, true)
}

pub fn client_addr(id: u64) -> String {
    format!("{}:{CLIENT_PORT}", node_addr(id))
}

/// Node `id` at its namespace's address, its data and log in `dir`, run
/// under `ip netns exec` (and `env` with libfaketime when `faketime` names
/// its offset file).
fn node_spec(id: u64, dir: &Path, faketime: Option<&Path>) -> NodeSpec {
    let mut wrapper: Vec<OsString> = ["ip", "netns", "exec"].map(OsString::from).into();
    wrapper.push(node_ns(id).into());
    if let Some(f) = faketime {
        wrapper.extend(
            [
                "env".to_string(),
                format!("LD_PRELOAD={LIBFAKETIME}"),
                "FAKETIME_DONT_FAKE_MONOTONIC=1".into(),
                "FAKETIME_NO_CACHE=1".into(),
                format!("FAKETIME_TIMESTAMP_FILE={}", f.display()),
            ]
            .map(OsString::from),
        );
    }
    NodeSpec {
        id,
        host: node_addr(id),
        client_port: CLIENT_PORT,
        peer_port: PEER_PORT,
        data_dir: dir.join(format!("n{id}-data")),
        log: dir.join(format!("n{id}.log")),
        join: false,
        wrapper,
        settings: RunSettings::default(),
    }
}

impl Cluster {
    pub fn new(bin: &Path, dir: &Path, n: u64, settings: NodeSettings) -> Result<Cluster> {
        let mut nodes = Vec::new();
        let mut faketime = BTreeMap::new();
        let mut mounts = Vec::new();
        for id in 1..=n {
            let file = if settings.faketime {
                let f = dir.join(format!("n{id}.faketime"));
                std::fs::write(&f, "+0\n").with_context(|| format!("writing {}", f.display()))?;
                faketime.insert(id, f.clone());
                Some(f)
            } else {
                None
            };
            let mut node = node_spec(id, dir, file.as_deref());
            if settings.disk_of_its_own {
                mount_tmpfs(&node.data_dir)?;
                mounts.push(node.data_dir.clone());
            }
            let idx = usize::try_from(id.saturating_sub(1)).unwrap_or(usize::MAX);
            node.settings.test_clock_skew_ppm =
                settings.skew_ppm.get(idx).copied().filter(|p| *p != 0);
            nodes.push(node);
        }
        let spec = ClusterSpec {
            bin: bin.to_path_buf(),
            nodes,
            settings: settings.settings,
            env: settings
                .canary
                .map(|c| ("FENCED_CANARY".to_string(), c.to_string()))
                .into_iter()
                .collect(),
            tls: Some(Tls {
                pki: settings.pki,
                client: crate::tls::CLIENT_NAME.into(),
            }),
        };
        Ok(Cluster {
            kit: fenced_testkit::Cluster::new(spec),
            dir: dir.to_path_buf(),
            faketime,
            mounts,
        })
    }

    pub fn ids(&self) -> Vec<u64> {
        self.kit.ids()
    }

    /// Starts node `id` in its namespace (again, with the same data); one
    /// that runs is left alone.
    pub fn start(&mut self, id: u64) -> Result<()> {
        if self.kit.is_running(id) {
            return Ok(());
        }
        self.kit.start(id)?;
        tracing::info!(node = id, "started");
        Ok(())
    }

    /// A new node `id` with an empty data dir, started with `--join`.
    pub fn add_joining(&mut self, id: u64) -> Result<()> {
        let mut node = node_spec(id, &self.dir, None);
        node.join = true;
        self.kit.add(node)?;
        self.start(id)
    }

    /// Kills node `id` (removed from the cluster) and deletes its data:
    /// it never comes back.
    pub fn forget(&mut self, id: u64) -> Result<()> {
        if self.kill9(id)? {
            tracing::info!(node = id, "forgotten");
        }
        if let Ok(node) = self.kit.forget(id) {
            let _ = std::fs::remove_dir_all(&node.data_dir);
        }
        Ok(())
    }

    pub fn start_all(&mut self) -> Result<()> {
        for id in self.ids() {
            self.start(id)?;
        }
        Ok(())
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.kit.is_running(id)
    }

    /// Everything node `id` has logged.
    pub fn log_of(&self, id: u64) -> String {
        self.kit.log_of(id)
    }

    /// How many times node `id` has said in its log that it started from a
    /// snapshot (a restart that did not replay the whole log).
    pub fn snapshot_loads(&self, id: u64) -> usize {
        self.kit.log_of(id).matches("loaded snapshot").count()
    }

    /// `kill -9` node `id`; returns whether it was running.
    pub fn kill9(&mut self, id: u64) -> Result<bool> {
        let killed = self.kit.kill(id)?;
        if killed {
            tracing::info!(node = id, "killed");
        }
        Ok(killed)
    }

    pub fn signal(&self, id: u64, signal: Signal) -> Result<()> {
        self.kit.signal(id, signal)
    }

    /// Whether node `id` is stopped by a signal, as the kernel reports it.
    /// `ip netns exec` and `env` exec the next program, so the process is
    /// `fenced` itself.
    pub fn is_stopped(&self, id: u64) -> bool {
        self.kit.is_paused(id)
    }

    /// The libfaketime offset file of node `id`, if under libfaketime.
    pub fn faketime_file(&self, id: u64) -> Option<PathBuf> {
        self.faketime.get(&id).cloned()
    }

    /// Sets node `id`'s wall-clock offset (libfaketime), e.g. "+3600" or "-600".
    pub fn set_wall_offset(&self, id: u64, offset: &str) -> Result<()> {
        let f = self
            .faketime
            .get(&id)
            .with_context(|| format!("node {id} does not run under libfaketime"))?;
        std::fs::write(f, format!("{offset}\n")).with_context(|| format!("writing {}", f.display()))
    }

    /// Kills every node (a paused one too).
    pub fn stop_all(&mut self) {
        self.kit.kill_all();
    }

    /// Node `id`'s exit status if it stopped by itself since it started.
    pub fn exited(&mut self, id: u64) -> Result<Option<std::process::ExitStatus>> {
        self.kit.exited(id)
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> Result<PathBuf> {
        Ok(self.kit.node(id)?.data_dir.clone())
    }

    /// `fenced repair` on stopped node `id`'s data directory.
    pub fn repair(&self, id: u64) -> Result<()> {
        let out = std::process::Command::new(&self.kit.spec().bin)
            .args(["repair", "--node-id", &id.to_string(), "--data-dir"])
            .arg(self.data_dir(id)?)
            .envs(self.kit.spec().env.iter().map(|(k, v)| (k, v)))
            .output()
            .context("running fenced repair")?;
        anyhow::ensure!(
            out.status.success(),
            "fenced repair of node {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    pub fn data_dirs(&self) -> Vec<PathBuf> {
        self.kit
            .nodes()
            .iter()
            .map(|n| n.data_dir.clone())
            .collect()
    }
}

/// Status of node `id`, if it answers within `timeout`.
pub async fn status(id: u64, timeout: Duration) -> Option<StatusResponse> {
    status_of(id, timeout, false).await
}

/// Status of node `id` with the digest of its lease table.
pub async fn status_with_digest(id: u64, timeout: Duration) -> Option<StatusResponse> {
    status_of(id, timeout, true).await
}

async fn status_of(id: u64, timeout: Duration, with_digest: bool) -> Option<StatusResponse> {
    let ch = channel(&client_addr(id)).ok()?;
    let mut req = tonic::Request::new(StatusRequest { with_digest });
    crate::auth::authorize(&mut req);
    req.set_timeout(timeout);
    tokio::time::timeout(timeout, ClusterClient::new(ch).status(req))
        .await
        .ok()?
        .ok()
        .map(tonic::Response::into_inner)
}

/// Node `id`'s own view of `resource`'s newest token (a local read).
pub async fn local_last_token(id: u64, resource: &str) -> Result<u64> {
    let ch = channel(&client_addr(id))?;
    let mut req = tonic::Request::new(DescribeRequest {
        resource: resource.as_bytes().to_vec(),
        allow_stale: true,
    });
    req.set_timeout(Duration::from_secs(2));
    crate::auth::authorize(&mut req);
    let resp = LockClient::new(ch)
        .describe(req)
        .await
        .with_context(|| format!("describe {resource} on node {id}"))?;
    Ok(resp.into_inner().last_token)
}

#[cfg(test)]
mod disk_tests {
    use super::is_run_disk;

    #[test]
    fn only_a_disk_runs_node_directories_are_unmounted() {
        assert!(is_run_disk("/work/target/jepsen/disk-1/n2-data"));
        assert!(is_run_disk("/tmp/jd/disk-17/n10-data"));
        assert!(!is_run_disk("/tmp/jd/kill-1/n2-data"));
        assert!(!is_run_disk("/tmp/jd/disk-1/n2"));
        assert!(!is_run_disk("/dev/shm"));
        assert!(!is_run_disk("/tmp/disk-x/n1-data"));
    }
}
