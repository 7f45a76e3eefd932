//! The cluster spec and the launcher.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use fenced_proto::v1::{cluster_client::ClusterClient, StatusRequest, StatusResponse};
use fenced_server::node::config::{RunSettings, Within};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use tonic::transport::Channel;

use crate::{free_port, log_tail, Pki};

/// The log filter nodes start with unless the spec's environment says
/// otherwise.
const DEFAULT_LOG: &str = "info,openraft=warn";

/// One node: where it listens, keeps its data and logs, and what it runs
/// under.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub id: u64,
    /// The address it listens on and is reached at (an IP, for its
    /// certificate).
    pub host: String,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    /// Its stderr, appended to across restarts.
    pub log: PathBuf,
    /// Started with `--join` (the running nodes' client addresses) instead
    /// of `--initial-cluster`; not one of the initial members.
    pub join: bool,
    /// A program and its arguments the node runs under, e.g. `ip netns exec
    /// NS` (each must exec the next, so the process is `fenced` itself);
    /// empty: none.
    pub wrapper: Vec<OsString>,
    /// Settings of this node alone, over the cluster's.
    pub settings: RunSettings,
}

impl NodeSpec {
    /// Node `id` on 127.0.0.1 on two free ports, its data in `dir/node<id>`
    /// and its log in `dir/node<id>.log`.
    pub fn loopback(id: u64, dir: &Path) -> Result<NodeSpec> {
        Ok(NodeSpec {
            id,
            host: "127.0.0.1".into(),
            client_port: free_port()?,
            peer_port: free_port()?,
            data_dir: dir.join(format!("node{id}")),
            log: dir.join(format!("node{id}.log")),
            join: false,
            wrapper: Vec::new(),
            settings: RunSettings::default(),
        })
    }

    pub fn client_addr(&self) -> String {
        format!("{}:{}", self.host, self.client_port)
    }

    pub fn peer_addr(&self) -> String {
        format!("{}:{}", self.host, self.peer_port)
    }
}

/// TLS on both ports of every node, from certificates of one CA.
#[derive(Debug, Clone)]
pub struct Tls {
    pub pki: Pki,
    /// The client certificate the launcher's own calls show.
    pub client: String,
}

/// What a [`Cluster`] starts.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// The `fenced` binary.
    pub bin: PathBuf,
    pub nodes: Vec<NodeSpec>,
    /// Settings every node starts with (as flags of `fenced run`).
    pub settings: RunSettings,
    /// Environment every node starts with: `FENCED_LOG`, the global flags'
    /// variables, settings given the way an operator's environment would.
    /// No other `FENCED_*` variable reaches a node: the launcher's own
    /// environment does not leak into the cluster.
    pub env: Vec<(String, String)>,
    /// TLS on, with node certificates for each node's host made on first
    /// start.
    pub tls: Option<Tls>,
}

impl ClusterSpec {
    /// `n` nodes on loopback (see [`NodeSpec::loopback`]), plaintext.
    pub fn loopback(bin: &Path, dir: &Path, n: u64) -> Result<ClusterSpec> {
        Ok(ClusterSpec {
            bin: bin.to_path_buf(),
            nodes: (1..=n)
                .map(|id| NodeSpec::loopback(id, dir))
                .collect::<Result<_>>()?,
            settings: RunSettings::default(),
            env: Vec::new(),
            tls: None,
        })
    }

    /// TLS on, from a CA made in `dir` (kept if there is one); the
    /// launcher's calls show client `client`'s certificate.
    pub fn with_tls(mut self, dir: &Path, client: &str) -> Result<ClusterSpec> {
        let pki = Pki::new(&self.bin, dir)?;
        pki.client(client)?;
        self.tls = Some(Tls {
            pki,
            client: client.into(),
        });
        Ok(self)
    }

    /// Sets `key` in the environment of every node started from now on.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.push((key.into(), value.into()));
    }
}

/// Nodes started from a [`ClusterSpec`]; every node still running is
/// killed when it is dropped.
pub struct Cluster {
    spec: ClusterSpec,
    running: BTreeMap<u64, Child>,
}

impl Cluster {
    pub fn new(spec: ClusterSpec) -> Cluster {
        Cluster {
            spec,
            running: BTreeMap::new(),
        }
    }

    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The spec, to change what the next start of a node gets.
    pub fn spec_mut(&mut self) -> &mut ClusterSpec {
        &mut self.spec
    }

    pub fn nodes(&self) -> &[NodeSpec] {
        &self.spec.nodes
    }

    pub fn node(&self, id: u64) -> Result<&NodeSpec> {
        self.spec
            .nodes
            .iter()
            .find(|n| n.id == id)
            .with_context(|| format!("no node {id} in this cluster"))
    }

    pub fn ids(&self) -> Vec<u64> {
        self.spec.nodes.iter().map(|n| n.id).collect()
    }

    /// Every node's client address.
    pub fn endpoints(&self) -> Vec<String> {
        self.spec.nodes.iter().map(NodeSpec::client_addr).collect()
    }

    /// The node whose client address is `addr`.
    pub fn id_at(&self, addr: &str) -> Option<u64> {
        self.spec
            .nodes
            .iter()
            .find(|n| n.client_addr() == addr)
            .map(|n| n.id)
    }

    /// The `--initial-cluster` of the nodes that do not join.
    pub fn initial_cluster(&self) -> String {
        self.spec
            .nodes
            .iter()
            .filter(|n| !n.join)
            .map(|n| format!("{}={}/{}", n.id, n.peer_addr(), n.client_addr()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `id`'s `fenced run` settings: its own, its place in the cluster
    /// and its certificate, over the cluster's.
    pub fn settings_of(&self, id: u64) -> Result<RunSettings> {
        let node = self.node(id)?;
        let mut own = RunSettings {
            id: Some(Within::new(id).with_context(|| format!("node id {id}"))?),
            data_dir: Some(node.data_dir.clone()),
            listen: Some(node.client_addr()),
            peer_listen: Some(node.peer_addr()),
            ..node.settings.clone()
        };
        if node.join {
            own.join = Some(
                self.spec
                    .nodes
                    .iter()
                    .filter(|n| n.id != id && self.is_running(n.id))
                    .map(NodeSpec::client_addr)
                    .collect::<Vec<_>>()
                    .join(","),
            );
        } else {
            own.initial_cluster = Some(self.initial_cluster());
        }
        if let Some(tls) = &self.spec.tls {
            let (cert, key) = tls.pki.node(id, &node.host)?;
            own.tls_cert = Some(cert);
            own.tls_key = Some(key);
            own.tls_ca = Some(tls.pki.ca());
        }
        own.or_file(self.spec.settings.clone())
            .map_err(anyhow::Error::msg)
    }

    /// The command that starts node `id`, with `env` over the cluster's
    /// environment.
    pub fn command(&self, id: u64, env: &[(&str, &str)]) -> Result<Command> {
        let node = self.node(id)?;
        let args = self
            .settings_of(id)?
            .to_args()
            .map_err(anyhow::Error::msg)?;
        let mut cmd = match node.wrapper.split_first() {
            Some((program, wrapper_args)) => {
                let mut cmd = Command::new(program);
                cmd.args(wrapper_args).arg(&self.spec.bin);
                cmd
            }
            None => Command::new(&self.spec.bin),
        };
        cmd.arg("run").args(args);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("FENCED_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("FENCED_LOG", DEFAULT_LOG);
        for (k, v) in &self.spec.env {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        Ok(cmd)
    }

    /// Starts node `id` on its data (again); an error if it runs.
    pub fn start(&mut self, id: u64) -> Result<()> {
        self.start_with_env(id, &[])
    }

    /// Starts node `id` with `env` over the cluster's environment, for this
    /// start only.
    pub fn start_with_env(&mut self, id: u64, env: &[(&str, &str)]) -> Result<()> {
        if self.is_running(id) {
            bail!("node {id} is already running");
        }
        let mut cmd = self.command(id, env)?;
        let node = self.node(id)?;
        if let Some(dir) = node.log.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(&node.log)
            .with_context(|| format!("opening {}", node.log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting node {id}: {cmd:?}"))?;
        self.running.insert(id, child);
        Ok(())
    }

    /// Starts every node that is not running.
    pub fn start_all(&mut self) -> Result<()> {
        for id in self.ids() {
            if !self.is_running(id) {
                self.start(id)?;
            }
        }
        Ok(())
    }

    /// Adds a node (not started).
    pub fn add(&mut self, node: NodeSpec) -> Result<()> {
        if self.node(node.id).is_ok() {
            bail!("node {} exists already", node.id);
        }
        self.spec.nodes.push(node);
        Ok(())
    }

    /// Kills node `id` (if it runs) and removes it: it is no longer one of
    /// the cluster's nodes. Its data stays.
    pub fn forget(&mut self, id: u64) -> Result<NodeSpec> {
        self.kill(id)?;
        let i = self
            .spec
            .nodes
            .iter()
            .position(|n| n.id == id)
            .with_context(|| format!("no node {id} in this cluster"))?;
        Ok(self.spec.nodes.remove(i))
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.running.contains_key(&id)
    }

    /// Node `id`'s process id while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.running.get(&id).map(Child::id)
    }

    /// The running nodes' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.running.values().map(Child::id).collect()
    }

    /// `kill -9` node `id` and reap it; whether it was running.
    pub fn kill(&mut self, id: u64) -> Result<bool> {
        let Some(mut child) = self.running.remove(&id) else {
            return Ok(false);
        };
        // A paused process dies of SIGKILL too; SIGCONT first lets it go
        // without a stopped zombie in a debugger's way.
        let _ = signal_pid(child.id(), Signal::SIGCONT);
        child.kill().with_context(|| format!("killing node {id}"))?;
        child
            .wait()
            .with_context(|| format!("waiting for node {id}"))?;
        Ok(true)
    }

    /// `kill -9` every running node.
    pub fn kill_all(&mut self) {
        for id in self.running.keys().copied().collect::<Vec<_>>() {
            let _ = self.kill(id);
        }
    }

    /// Sends `signal` to node `id`; an error if it does not run.
    pub fn signal(&self, id: u64, signal: Signal) -> Result<()> {
        let pid = self
            .pid(id)
            .with_context(|| format!("node {id} is not running"))?;
        signal_pid(pid, signal).with_context(|| format!("sending {signal} to node {id}"))
    }

    /// SIGSTOP: node `id` freezes (its connections stay open).
    pub fn pause(&self, id: u64) -> Result<()> {
        self.signal(id, Signal::SIGSTOP)
    }

    /// SIGCONT after [`Cluster::pause`].
    pub fn resume(&self, id: u64) -> Result<()> {
        self.signal(id, Signal::SIGCONT)
    }

    /// Whether node `id` is stopped by a signal, as the kernel reports it.
    pub fn is_paused(&self, id: u64) -> bool {
        self.pid(id).is_some_and(crate::is_stopped)
    }

    /// SIGTERM to node `id`, then up to `grace` for it to exit: how it
    /// ended and how long it took. After `grace` it is killed and this is
    /// an error.
    pub fn terminate(&mut self, id: u64, grace: Duration) -> Result<(ExitStatus, Duration)> {
        self.signal(id, Signal::SIGTERM)?;
        let started = Instant::now();
        let mut child = self
            .running
            .remove(&id)
            .with_context(|| format!("node {id} is not running"))?;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok((status, started.elapsed()));
            }
            if started.elapsed() > grace {
                child.kill()?;
                let status = child.wait()?;
                bail!("node {id} did not exit within {grace:?} of SIGTERM ({status}); killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Node `id`'s exit status if it has exited by itself (it then counts
    /// as stopped and can be started again).
    pub fn exited(&mut self, id: u64) -> Result<Option<ExitStatus>> {
        let Some(child) = self.running.get_mut(&id) else {
            return Ok(None);
        };
        let status = child.try_wait()?;
        if status.is_some() {
            self.running.remove(&id);
        }
        Ok(status)
    }

    /// Everything node `id` has logged.
    pub fn log_of(&self, id: u64) -> String {
        self.node(id)
            .ok()
            .and_then(|n| std::fs::read_to_string(&n.log).ok())
            .unwrap_or_default()
    }

    /// The last `lines` lines of every node's log, for an error message.
    pub fn log_tails(&self, lines: usize) -> String {
        self.spec
            .nodes
            .iter()
            .map(|n| format!("--- node {} ---\n{}", n.id, log_tail(&n.log, lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A lazily connecting channel to node `id`'s client port (over TLS
    /// with the launcher's certificate on a TLS cluster).
    pub fn channel(&self, id: u64) -> Result<Channel> {
        let addr = self.node(id)?.client_addr();
        match &self.spec.tls {
            None => Ok(Channel::from_shared(format!("http://{addr}"))
                .context("endpoint")?
                .connect_lazy()),
            Some(tls) => tls.pki.channel(&addr, Some(&tls.client)),
        }
    }

    /// Node `id`'s status (with its state digest if `with_digest`), if it
    /// answers within a second.
    pub async fn status(&self, id: u64, with_digest: bool) -> Option<StatusResponse> {
        let mut client = ClusterClient::new(self.channel(id).ok()?);
        let mut req = tonic::Request::new(StatusRequest { with_digest });
        req.set_timeout(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(2), client.status(req))
            .await
            .ok()?
            .ok()
            .map(tonic::Response::into_inner)
    }

    /// The leader every running node names, if they agree on a running one;
    /// otherwise what each said (None: no answer).
    pub async fn leader(&self) -> Result<u64, Vec<Option<u64>>> {
        let mut said = Vec::new();
        for id in self.running.keys() {
            said.push(self.status(*id, false).await.map(|s| s.leader_id));
        }
        match said.first() {
            Some(Some(first))
                if *first != 0
                    && said.iter().all(|l| *l == Some(*first))
                    && self.is_running(*first) =>
            {
                Ok(*first)
            }
            _ => Err(said),
        }
    }

    /// Waits until every running node names the same running leader;
    /// returns it. The error carries what they said and their logs' tails.
    pub async fn wait_for_leader(&self, within: Duration) -> Result<u64> {
        let deadline = Instant::now() + within;
        loop {
            match self.leader().await {
                Ok(leader) => return Ok(leader),
                Err(said) if Instant::now() >= deadline => bail!(
                    "no agreed leader within {within:?}: {said:?}\n{}",
                    self.log_tails(15)
                ),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Waits until every running node has applied the same index; returns
    /// their statuses, each with its state digest.
    pub async fn wait_for_convergence(&self, within: Duration) -> Result<Vec<StatusResponse>> {
        let deadline = Instant::now() + within;
        loop {
            let mut all = Vec::new();
            for id in self.running.keys() {
                if let Some(s) = self.status(*id, true).await {
                    all.push(s);
                }
            }
            if all.len() == self.running.len()
                && all
                    .windows(2)
                    .all(|w| w[0].last_applied == w[1].last_applied)
            {
                return Ok(all);
            }
            if Instant::now() >= deadline {
                bail!("nodes did not converge within {within:?}: {all:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn signal_pid(pid: u32, signal: Signal) -> Result<()> {
    let pid = Pid::from_raw(i32::try_from(pid).context("process id")?);
    kill(pid, signal)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(dir: &Path) -> ClusterSpec {
        let mut spec = ClusterSpec::loopback(Path::new("/bin/fenced"), dir, 3).unwrap();
        spec.settings.max_batch = Some(Within::new(8).unwrap());
        spec.nodes[1].settings.max_batch = Some(Within::new(2).unwrap());
        spec
    }

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_node_starts_with_its_place_and_the_clusters_settings_below_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = Cluster::new(spec(dir.path()));
        let n1 = &cluster.nodes()[0];
        let initial = cluster.initial_cluster();
        assert_eq!(initial.split(',').count(), 3);
        assert!(initial.starts_with(&format!("1={}/{}", n1.peer_addr(), n1.client_addr())));
        let one = args(&cluster.command(1, &[]).unwrap());
        assert_eq!(one[0], "run");
        let flag = |args: &[String], f: &str| {
            let prefix = format!("{f}=");
            args.iter()
                .find_map(|a| a.strip_prefix(&prefix))
                .unwrap()
                .to_string()
        };
        assert_eq!(flag(&one, "--id"), "1");
        assert_eq!(flag(&one, "--listen"), n1.client_addr());
        assert_eq!(flag(&one, "--initial-cluster"), initial);
        assert_eq!(flag(&one, "--max-batch"), "8");
        let two = args(&cluster.command(2, &[]).unwrap());
        assert_eq!(flag(&two, "--max-batch"), "2");
        assert!(!one
            .iter()
            .any(|a| a.starts_with("--join") || a.starts_with("--tls-cert")));
    }

    #[test]
    fn a_joining_node_names_the_running_nodes_and_a_wrapper_comes_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = Cluster::new(spec(dir.path()));
        let mut four = NodeSpec::loopback(4, dir.path()).unwrap();
        four.join = true;
        four.wrapper = vec!["ip".into(), "netns".into(), "exec".into(), "ns4".into()];
        cluster.add(four.clone()).unwrap();
        assert!(cluster.add(four).is_err());
        // Nothing runs: the join list is empty, the initial cluster keeps three.
        let cmd = cluster.command(4, &[("FENCED_LOG", "debug")]).unwrap();
        assert_eq!(cmd.get_program(), "ip");
        let a = args(&cmd);
        assert_eq!(&a[..4], ["netns", "exec", "ns4", "/bin/fenced"]);
        assert_eq!(a[4], "run");
        // Nothing runs: an empty join list.
        assert!(a.iter().any(|x| x == "--join="));
        assert!(!a.iter().any(|x| x.starts_with("--initial-cluster")));
        assert_eq!(cluster.initial_cluster().split(',').count(), 3);
        let log = cmd
            .get_envs()
            .filter(|(k, _)| *k == "FENCED_LOG")
            .last()
            .and_then(|(_, v)| v);
        assert_eq!(log, Some(std::ffi::OsStr::new("debug")));
        cluster.forget(4).unwrap();
        assert_eq!(cluster.ids(), [1, 2, 3]);
    }

    #[test]
    fn a_missing_binary_is_an_error_naming_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = Cluster::new(spec(dir.path()));
        let err = cluster.start(1).unwrap_err().to_string();
        assert!(err.contains("starting node 1"), "{err}");
        assert!(!cluster.is_running(1));
        assert!(cluster.signal(1, Signal::SIGSTOP).is_err());
        assert!(!cluster.kill(1).unwrap());
    }
}
