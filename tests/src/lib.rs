//! A harness that runs real `fenced` processes on loopback.
//!
//! The binaries come from the workspace's target directory: build them first
//! (`cargo build --workspace --bins`, which `.ci/run` does).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs::File,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use fenced_client::{Acquired, Client, Lease, TlsOptions};
use fenced_proto::v1::{cluster_client::ClusterClient, lock_client::LockClient, StatusResponse};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// The directory holding the workspace's built binaries.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The path of a workspace binary, e.g. `fenced` or `fencectl`.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` before the tests",
        path.display()
    );
    path
}

/// Whether process `pid` exists and has not exited (a zombie has).
pub fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// A free loopback port, below the kernel's ephemeral range (32768 and up
/// on Linux): a port from `bind(0)` could be handed to another socket
/// (an outgoing connection, another test's `bind(0)`) between this check and
/// the node binding it, and the node would fail with "address in use". Each
/// call in a process moves on to the next port, from a start that differs
/// per process.
pub fn free_port() -> u16 {
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::process::id().wrapping_mul(7_919).wrapping_add(nanos) % SPAN
    });
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {LOW} and {}", LOW + SPAN)
}

pub struct NodeProc {
    pub id: u64,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    child: Option<Child>,
    /// The node's stderr: its log.
    pub log: PathBuf,
    /// Started with `--join` (the endpoints of the other nodes) instead of
    /// `--initial-cluster`.
    pub join: bool,
}

impl NodeProc {
    pub fn client_addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// The value of one sample in node `addr`'s `/metrics` (0 when absent).
pub async fn metric(addr: &str, sample: &str) -> u64 {
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// `fenced_rpc_requests_total` of one Lock method answered OK, over every
/// node's client port (`metrics`: each node's metrics address).
pub async fn lock_rpcs_ok(metrics: &[String], method: &str) -> u64 {
    let sample = format!(
        "fenced_rpc_requests_total{{port=\"client\",method=\"fenced.v1.Lock/{method}\",code=\"OK\"}}"
    );
    let mut sum = 0;
    for addr in metrics {
        sum += metric(addr, &sample).await;
    }
    sum
}

/// Leases `<prefix>00000`, `<prefix>00001`, ... (`n` of them) acquired
/// through `client`, 32 acquires in flight; panics if one is held.
pub async fn acquire_all(client: &Client, prefix: &str, n: usize, ttl: Duration) -> Vec<Lease> {
    let mut taking = tokio::task::JoinSet::new();
    let mut leases = Vec::with_capacity(n);
    for i in 0..n {
        let (client, resource) = (client.clone(), format!("{prefix}{i:05}"));
        taking.spawn(async move {
            match client.acquire(&resource, ttl).await.unwrap() {
                Acquired::Granted(lease) => lease,
                Acquired::Held { .. } => panic!("{resource} is held"),
            }
        });
        while taking.len() >= 32 {
            leases.push(taking.join_next().await.unwrap().unwrap());
        }
    }
    while let Some(lease) = taking.join_next().await {
        leases.push(lease.unwrap());
    }
    leases
}

/// One HTTP/1.1 request; returns the status code and body.
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let (status, _, body) = http_get_with(addr, path, &[]).await;
    (status, body)
}

/// One HTTP/1.1 GET with extra header lines (`"Name: value"`); returns the
/// status code, the head in lower case, and the body.
pub async fn http_get_with(addr: &str, path: &str, headers: &[&str]) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut stream, req.as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut raw),
    )
    .await
    .expect("a reply within 10 s")
    .unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("headers end");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// The SHA-256 of `token`, as `fenced auth hash-token` prints it.
pub fn hash_token(token: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(bin("fenced"))
        .args(["auth", "hash-token"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{token}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Writes `tokens.toml` (each `(name, token, role)`, stored hashed as a
/// node reads it) and `policy.toml` into `dir`; returns their paths, for
/// `FENCED_AUTH_TOKENS` and `FENCED_AUTH_POLICY`.
pub fn write_auth_files(
    dir: &Path,
    tokens: &[(&str, &str, &str)],
    policy: &str,
) -> (String, String) {
    let text: String = tokens
        .iter()
        .map(|(name, token, role)| {
            format!(
                "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nroles = [\"{role}\"]\n\n",
                hash_token(token)
            )
        })
        .collect();
    let (t, p) = (dir.join("tokens.toml"), dir.join("policy.toml"));
    std::fs::write(&t, text).unwrap();
    std::fs::write(&p, policy).unwrap();
    (t.to_str().unwrap().into(), p.to_str().unwrap().into())
}

/// Certificates made by `fenced certs` in one directory: a CA, nodes by
/// id and clients by name.
#[derive(Debug, Clone)]
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    /// A new CA in `dir`.
    pub fn new(dir: &Path) -> Pki {
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        pki.certs(&["ca"]);
        pki
    }

    /// Runs `fenced certs ARGS --dir DIR`; panics when it fails.
    pub fn certs(&self, args: &[&str]) {
        let out = Command::new(bin("fenced"))
            .arg("certs")
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fenced certs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Node `id`'s certificate and key (made on first use, for 127.0.0.1).
    pub fn node(&self, id: u64) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            self.dir.join(format!("node-{id}.pem")),
            self.dir.join(format!("node-{id}-key.pem")),
        );
        if !cert.exists() {
            self.certs(&["node", "--id", &id.to_string(), "--host", "127.0.0.1"]);
        }
        (cert, key)
    }

    /// Service `name`'s server certificate and key for 127.0.0.1 (made on
    /// first use).
    pub fn server(&self, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            self.dir.join(format!("server-{name}.pem")),
            self.dir.join(format!("server-{name}-key.pem")),
        );
        if !cert.exists() {
            self.certs(&["server", "--name", name, "--host", "127.0.0.1"]);
        }
        (cert, key)
    }

    /// A gRPC channel to `addr` trusting this CA, showing client `name`'s
    /// certificate when given.
    pub fn channel(&self, addr: &str, name: Option<&str>) -> Channel {
        let read = |p: &Path| std::fs::read(p).unwrap();
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&self.ca())));
        if let Some(name) = name {
            let (cert, key) = self.client(name);
            tls = tls.identity(Identity::from_pem(read(&cert), read(&key)));
        }
        Channel::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .timeout(Duration::from_secs(5))
            .connect_lazy()
    }

    /// Client `name`'s certificate and key (made on first use).
    pub fn client(&self, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            self.dir.join(format!("client-{name}.pem")),
            self.dir.join(format!("client-{name}-key.pem")),
        );
        if !cert.exists() {
            self.certs(&["client", "--name", name]);
        }
        (cert, key)
    }

    /// Client options trusting this CA, with client `name`'s certificate.
    pub fn client_options(&self, name: Option<&str>) -> TlsOptions {
        let options = TlsOptions::new().ca(self.ca());
        match name {
            Some(n) => {
                let (cert, key) = self.client(n);
                options.identity(cert, key)
            }
            None => options,
        }
    }
}

/// The client name the harness's own calls use on a TLS cluster.
pub const HARNESS_CLIENT: &str = "harness";

/// A cluster of `fenced run` processes on loopback.
pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    pub dir: tempfile::TempDir,
    initial_cluster: String,
    extra_env: Vec<(String, String)>,
    /// Set: the nodes run with TLS from these certificates.
    pub pki: Option<Pki>,
}

impl Cluster {
    /// Starts `n` nodes and waits until they agree on a leader.
    pub async fn start(n: u64) -> Cluster {
        Self::start_with(n, &[]).await
    }

    /// Like [`Cluster::start`], with extra `FENCED_*` settings for every node.
    pub async fn start_with(n: u64, env: &[(&str, &str)]) -> Cluster {
        let mut cluster = Self::stopped(n, env);
        cluster.start_all().await;
        cluster
    }

    /// Like [`Cluster::start_with`], with TLS on both ports from
    /// certificates made by `fenced certs`.
    pub async fn start_tls(n: u64, env: &[(&str, &str)]) -> Cluster {
        let mut cluster = Self::stopped(n, env);
        let pki = Pki::new(&cluster.dir.path().join("pki"));
        for id in 1..=n {
            pki.node(id);
        }
        pki.client(HARNESS_CLIENT);
        cluster.pki = Some(pki);
        cluster.start_all().await;
        cluster
    }

    /// Starts every node and waits until they agree on a leader.
    pub async fn start_all(&mut self) {
        for id in 1..=self.nodes.len() as u64 {
            self.spawn(id);
        }
        self.wait_for_leader(Duration::from_secs(20)).await;
    }

    /// A cluster of `n` nodes, none started yet: for a test that prepares
    /// their data directories first.
    pub fn stopped(n: u64, env: &[(&str, &str)]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<NodeProc> = (1..=n)
            .map(|id| NodeProc {
                id,
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.path().join(format!("node{id}")),
                child: None,
                log: dir.path().join(format!("node{id}.log")),
                join: false,
            })
            .collect();
        let initial_cluster = nodes
            .iter()
            .map(|n| {
                format!(
                    "{}=127.0.0.1:{}/127.0.0.1:{}",
                    n.id, n.peer_port, n.client_port
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        Cluster {
            nodes,
            dir,
            initial_cluster,
            extra_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            pki: None,
        }
    }

    /// The `--initial-cluster` every node is started with.
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    fn node(&self, id: u64) -> &NodeProc {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    fn node_mut(&mut self, id: u64) -> &mut NodeProc {
        self.nodes
            .iter_mut()
            .find(|n| n.id == id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    /// Starts node `id` (again), with the same arguments as before.
    pub fn spawn(&mut self, id: u64) {
        let initial = self.initial_cluster.clone();
        let mut env = self.extra_env.clone();
        if let Some(pki) = &self.pki {
            let (cert, key) = pki.node(id);
            for (k, v) in [
                ("FENCED_TLS_CERT", cert),
                ("FENCED_TLS_KEY", key),
                ("FENCED_TLS_CA", pki.ca()),
            ] {
                env.insert(0, (k.to_string(), v.to_str().unwrap().to_string()));
            }
        }
        let join = self
            .nodes
            .iter()
            .filter(|n| n.id != id && n.is_running())
            .map(NodeProc::client_addr)
            .collect::<Vec<_>>()
            .join(",");
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is already running");
        let (membership_flag, membership) = if node.join {
            ("--join", join)
        } else {
            ("--initial-cluster", initial)
        };
        let log = File::options()
            .create(true)
            .append(true)
            .open(&node.log)
            .unwrap();
        let mut cmd = Command::new(bin("fenced"));
        cmd.args([
            "run",
            "--id",
            &id.to_string(),
            "--data-dir",
            node.data_dir.to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{}", node.client_port),
            "--peer-listen",
            &format!("127.0.0.1:{}", node.peer_port),
            membership_flag,
            &membership,
        ])
        .env("FENCED_LOG", "info,openraft=warn")
        .stdout(Stdio::null())
        .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        node.child = Some(cmd.spawn().unwrap());
    }

    /// `kill -9` node `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.node_mut(id).child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` to node `id` without forgetting the process.
    pub fn signal(&self, id: u64, signal: Signal) {
        if let Some(pid) = self.node(id).pid() {
            kill(pid, signal).unwrap();
        }
    }

    /// Sends `signal` to every running node (SIGSTOP freezes the cluster).
    pub fn signal_all(&self, signal: Signal) {
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            self.signal(n.id, signal);
        }
    }

    /// Node `id`'s exit status if it has exited by itself (it then counts
    /// as stopped and can be spawned again).
    pub fn exited(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let node = self.node_mut(id);
        let status = node.child.as_mut()?.try_wait().unwrap()?;
        node.child = None;
        Some(status)
    }

    /// Everything node `id` has logged.
    pub fn log_of(&self, id: u64) -> String {
        std::fs::read_to_string(&self.node(id).log).unwrap_or_default()
    }

    /// SIGTERM node `id` and wait for it to exit; returns its exit status.
    pub fn terminate(&mut self, id: u64, within: Duration) -> Option<std::process::ExitStatus> {
        self.signal(id, Signal::SIGTERM);
        let mut child = self.node_mut(id).child.take()?;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Client endpoints of the running nodes.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(NodeProc::client_addr).collect()
    }

    pub fn client(&self) -> Client {
        Client::with_tls(self.endpoints(), self.harness_tls().as_ref()).unwrap()
    }

    /// A client that only knows node `id`.
    pub fn client_of(&self, id: u64) -> Client {
        Client::with_tls([self.node(id).client_addr()], self.harness_tls().as_ref()).unwrap()
    }

    /// On a TLS cluster: the harness's own client options.
    pub fn harness_tls(&self) -> Option<TlsOptions> {
        self.pki
            .as_ref()
            .map(|p| p.client_options(Some(HARNESS_CLIENT)))
    }

    pub fn channel(&self, id: u64) -> Channel {
        let addr = self.node(id).client_addr();
        match &self.pki {
            None => Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_lazy(),
            Some(pki) => pki.channel(&addr, Some(HARNESS_CLIENT)),
        }
    }

    pub fn lock_client(&self, id: u64) -> LockClient<Channel> {
        LockClient::new(self.channel(id))
    }

    /// The status of node `id`, if it answers within a second.
    pub async fn status(&self, id: u64) -> Option<StatusResponse> {
        self.status_of(id, false).await
    }

    /// The status of node `id` with the digest of its lease table.
    pub async fn status_with_digest(&self, id: u64) -> Option<StatusResponse> {
        self.status_of(id, true).await
    }

    async fn status_of(&self, id: u64, with_digest: bool) -> Option<StatusResponse> {
        let mut client = ClusterClient::new(self.channel(id));
        let mut req = tonic::Request::new(fenced_proto::v1::StatusRequest { with_digest });
        req.set_timeout(Duration::from_secs(1));
        tokio::time::timeout(Duration::from_secs(2), client.status(req))
            .await
            .ok()?
            .ok()
            .map(|r| r.into_inner())
    }

    /// Waits until every running node names the same leader; returns it.
    pub async fn wait_for_leader(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            let mut leaders = Vec::new();
            for n in self.nodes.iter().filter(|n| n.is_running()) {
                leaders.push(self.status(n.id).await.map(|s| s.leader_id));
            }
            if let Some(Some(first)) = leaders.first() {
                let agreed = leaders.iter().all(|l| *l == Some(*first));
                let alive = self.nodes.iter().any(|n| n.id == *first && n.is_running());
                if *first != 0 && agreed && alive {
                    return *first;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {within:?}: {leaders:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every running node has applied the same index; returns
    /// their statuses, each with its node's state digest.
    pub async fn wait_for_convergence(&self, within: Duration) -> Vec<StatusResponse> {
        let deadline = Instant::now() + within;
        loop {
            let mut all = Vec::new();
            for n in self.nodes.iter().filter(|n| n.is_running()) {
                if let Some(s) = self.status_with_digest(n.id).await {
                    all.push(s);
                }
            }
            let running = self.nodes.iter().filter(|n| n.is_running()).count();
            if all.len() == running
                && all
                    .windows(2)
                    .all(|w| w[0].last_applied == w[1].last_applied)
            {
                return all;
            }
            assert!(Instant::now() < deadline, "nodes did not converge: {all:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs fencectl against this cluster.
    pub fn fencectl(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin("fencectl"));
        cmd.arg("--endpoints").arg(self.endpoints().join(","));
        if let Some(pki) = &self.pki {
            let (cert, key) = pki.client(HARNESS_CLIENT);
            cmd.arg("--cacert")
                .arg(pki.ca())
                .arg("--cert")
                .arg(cert)
                .arg("--key")
                .arg(key);
        }
        cmd.args(args).output().unwrap()
    }

    /// Every node's log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(&n.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                format!(
                    "--- node {} ---\n{}",
                    n.id,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut child) = n.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The resident memory of process `pid`, in KiB (VmRSS in /proc).
pub fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

impl Cluster {
    /// Starts every node, each with a `/metrics` listener of its own;
    /// returns their addresses by node id (index 0 is node 1).
    pub async fn start_with_metrics(n: u64, env: &[(&str, &str)]) -> (Cluster, Vec<String>) {
        let mut cluster = Self::stopped(n, env);
        let mut addrs = Vec::new();
        for id in 1..=n {
            let addr = format!("127.0.0.1:{}", free_port());
            cluster.spawn_with_env(id, &[("FENCED_METRICS_LISTEN", &addr)]);
            addrs.push(addr);
        }
        cluster.wait_for_leader(Duration::from_secs(20)).await;
        (cluster, addrs)
    }

    /// The resident memory of node `id`, in KiB.
    pub fn rss_kib(&self, id: u64) -> u64 {
        let pid = self.node(id).pid().expect("node is running");
        rss_kib(pid.as_raw())
    }

    /// The peer port's address of node `id`.
    pub fn peer_addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.node(id).peer_port)
    }

    /// A new node `id` with an empty data dir, started with `--join` (the
    /// running nodes' client addresses); on fresh ports unless `ports`
    /// (client, peer) are given (a replacement at a dead node's address).
    pub fn join_node(&mut self, id: u64, ports: Option<(u16, u16)>) {
        assert!(
            self.nodes.iter().all(|n| n.id != id),
            "node {id} exists already"
        );
        let (client_port, peer_port) = ports.unwrap_or_else(|| (free_port(), free_port()));
        let dir = self.dir.path();
        self.nodes.push(NodeProc {
            id,
            client_port,
            peer_port,
            data_dir: dir.join(format!("node{id}")),
            child: None,
            log: dir.join(format!("node{id}.log")),
            join: true,
        });
        self.spawn(id);
    }

    /// Forgets node `id` (killed first if running): it is no longer one of
    /// the cluster's endpoints.
    pub fn forget(&mut self, id: u64) {
        self.kill(id);
        self.nodes.retain(|n| n.id != id);
    }

    /// The (client, peer) ports of node `id`.
    pub fn ports(&self, id: u64) -> (u16, u16) {
        let n = self.node(id);
        (n.client_port, n.peer_port)
    }

    /// Starts node `id` (again) like [`Cluster::spawn`], with `env` added to
    /// the cluster's settings for this start only.
    pub fn spawn_with_env(&mut self, id: u64, env: &[(&str, &str)]) {
        let saved = self.extra_env.clone();
        self.extra_env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self.spawn(id);
        self.extra_env = saved;
    }
}

/// The PostgreSQL server `.ci/run` starts. In CI a missing server is a
/// failure; elsewhere the PostgreSQL tests say so and skip.
pub fn postgres_url() -> Option<String> {
    match std::env::var("FENCED_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "FENCED_TEST_POSTGRES_URL is not set: .ci/run starts PostgreSQL with .ci/postgres.sh"
            );
            eprintln!(
                "NOTICE: skipping a PostgreSQL test: set FENCED_TEST_POSTGRES_URL (source .ci/postgres.sh)"
            );
            None
        }
    }
}
