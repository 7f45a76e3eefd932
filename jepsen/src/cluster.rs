//! Three (or more) `fenced run` processes, each in its own network namespace,
//! started, killed, paused and resumed by the harness.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result};
use fenced_proto::v1::{
    cluster_client::ClusterClient, lock_client::LockClient, DescribeRequest, StatusRequest,
    StatusResponse,
};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
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
    pub pki: crate::tls::Pki,
    /// `FENCED_*` settings for every node.
    pub env: Vec<(String, String)>,
    /// Per node (index 0 = node 1): monotonic clock-rate skew in ppm.
    pub skew_ppm: Vec<i64>,
    /// Run every node under libfaketime, its wall-clock offset read from a
    /// file the harness rewrites.
    pub faketime: bool,
}

pub struct Node {
    pub id: u64,
    child: Option<Child>,
    pub log: PathBuf,
    data: PathBuf,
    /// The libfaketime offset file of this node, if under libfaketime.
    pub faketime_file: Option<PathBuf>,
    /// Started with `--join` (the other nodes' client addresses) instead
    /// of the initial cluster.
    join: bool,
}

pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    pub nodes: Vec<Node>,
    initial: String,
    settings: NodeSettings,
}

/// A lazily connecting TLS channel to `addr`, with the harness's
/// certificate.
pub fn channel(addr: &str) -> Result<Channel> {
    crate::tls::channel(addr, true)
}

pub fn client_addr(id: u64) -> String {
    format!("{}:{CLIENT_PORT}", node_addr(id))
}

impl Cluster {
    pub fn new(bin: &Path, dir: &Path, n: u64, settings: NodeSettings) -> Result<Cluster> {
        let initial = (1..=n)
            .map(|id| format!("{id}={}:{PEER_PORT}/{}", node_addr(id), client_addr(id)))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for id in 1..=n {
            let faketime_file = if settings.faketime {
                let f = dir.join(format!("n{id}.faketime"));
                std::fs::write(&f, "+0\n").with_context(|| format!("writing {}", f.display()))?;
                Some(f)
            } else {
                None
            };
            nodes.push(Node {
                id,
                child: None,
                log: dir.join(format!("n{id}.log")),
                data: dir.join(format!("n{id}-data")),
                faketime_file,
                join: false,
            });
        }
        Ok(Cluster {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            nodes,
            initial,
            settings,
        })
    }

    fn node(&self, id: u64) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    fn node_mut(&mut self, id: u64) -> Result<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id}"))
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// Starts node `id` in its namespace (again, with the same data).
    pub fn start(&mut self, id: u64) -> Result<()> {
        let bin = self.bin.clone();
        let initial = self.initial.clone();
        let settings = self.settings.clone();
        let others = self
            .nodes
            .iter()
            .filter(|n| n.id != id && n.child.is_some())
            .map(|n| client_addr(n.id))
            .collect::<Vec<_>>()
            .join(",");
        let node = self.node_mut(id)?;
        let (membership_flag, membership) = if node.join {
            ("--join", others)
        } else {
            ("--initial-cluster", initial)
        };
        if node.child.is_some() {
            return Ok(());
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("opening {}", node.log.display()))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &node_ns(id)]);
        if let Some(f) = &node.faketime_file {
            cmd.args([
                "env",
                &format!("LD_PRELOAD={LIBFAKETIME}"),
                "FAKETIME_DONT_FAKE_MONOTONIC=1",
                "FAKETIME_NO_CACHE=1",
                &format!("FAKETIME_TIMESTAMP_FILE={}", f.display()),
            ]);
        }
        cmd.arg(&bin)
            .args(["run", "--id", &id.to_string(), "--data-dir"])
            .arg(&node.data)
            .args([
                "--listen",
                &client_addr(id),
                "--peer-listen",
                &format!("{}:{PEER_PORT}", node_addr(id)),
                membership_flag,
                &membership,
            ])
            .envs(settings.pki.node_env(id))
            // TLS only: never plaintext, whatever the harness inherited.
            .env_remove("FENCED_INSECURE")
            .env("FENCED_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &settings.env {
            cmd.env(k, v);
        }
        let idx = usize::try_from(id.saturating_sub(1)).unwrap_or(usize::MAX);
        if let Some(ppm) = settings.skew_ppm.get(idx).filter(|p| **p != 0) {
            cmd.env("FENCED_TEST_CLOCK_SKEW_PPM", ppm.to_string());
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting node {id} ({})", bin.display()))?;
        node.child = Some(child);
        tracing::info!(node = id, "started");
        Ok(())
    }

    /// A new node `id` with an empty data dir, started with `--join`.
    pub fn add_joining(&mut self, id: u64) -> Result<()> {
        if self.nodes.iter().any(|n| n.id == id) {
            anyhow::bail!("node {id} exists already");
        }
        self.nodes.push(Node {
            id,
            child: None,
            log: self.dir.join(format!("n{id}.log")),
            data: self.dir.join(format!("n{id}-data")),
            faketime_file: None,
            join: true,
        });
        self.start(id)
    }

    /// Kills node `id` (removed from the cluster) and deletes its data:
    /// it never comes back.
    pub fn forget(&mut self, id: u64) -> Result<()> {
        self.kill9(id)?;
        if let Some(n) = self.nodes.iter().find(|n| n.id == id) {
            let _ = std::fs::remove_dir_all(&n.data);
        }
        self.nodes.retain(|n| n.id != id);
        Ok(())
    }

    pub fn start_all(&mut self) -> Result<()> {
        for id in self.ids() {
            self.start(id)?;
        }
        Ok(())
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).is_ok_and(|n| n.child.is_some())
    }

    /// The process id of node `id`, if it runs. `ip netns exec` and `env`
    /// exec the next program, so this is `fenced` itself.
    pub fn pid(&self, id: u64) -> Option<Pid> {
        let child = self.node(id).ok()?.child.as_ref()?;
        Some(Pid::from_raw(i32::try_from(child.id()).ok()?))
    }

    /// How many times node `id` has said in its log that it started from a
    /// snapshot (a restart that did not replay the whole log).
    pub fn snapshot_loads(&self, id: u64) -> usize {
        self.node(id)
            .ok()
            .and_then(|n| std::fs::read_to_string(&n.log).ok())
            .map_or(0, |text| text.matches("loaded snapshot").count())
    }

    /// `kill -9` node `id`; returns whether it was running.
    pub fn kill9(&mut self, id: u64) -> Result<bool> {
        let node = self.node_mut(id)?;
        let Some(mut child) = node.child.take() else {
            return Ok(false);
        };
        child.kill().with_context(|| format!("killing node {id}"))?;
        child
            .wait()
            .with_context(|| format!("waiting for node {id}"))?;
        tracing::info!(node = id, "killed");
        Ok(true)
    }

    pub fn signal(&self, id: u64, signal: Signal) -> Result<()> {
        let pid = self
            .pid(id)
            .with_context(|| format!("node {id} is not running"))?;
        kill(pid, signal).with_context(|| format!("sending {signal} to node {id}"))
    }

    /// Whether node `id` is stopped by a signal, as the kernel reports it.
    pub fn is_stopped(&self, id: u64) -> bool {
        let Some(pid) = self.pid(id) else {
            return false;
        };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st == "T"))
            })
            .unwrap_or(false)
    }

    /// Sets node `id`'s wall-clock offset (libfaketime), e.g. "+3600" or "-600".
    pub fn set_wall_offset(&self, id: u64, offset: &str) -> Result<()> {
        let node = self.node(id)?;
        let f = node
            .faketime_file
            .as_ref()
            .with_context(|| format!("node {id} does not run under libfaketime"))?;
        std::fs::write(f, format!("{offset}\n")).with_context(|| format!("writing {}", f.display()))
    }

    /// Every node's log, for the record.
    pub fn stop_all(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut child) = n.child.take() {
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    pub fn data_dirs(&self) -> Vec<PathBuf> {
        self.nodes.iter().map(|n| n.data.clone()).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
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
