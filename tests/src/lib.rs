//! A harness that runs real `fenced` processes on loopback, through
//! fenced-testkit's launcher; failures here are panics, as tests want them.
//!
//! The binaries come from the workspace's target directory: build them first
//! (`cargo build --workspace --bins`, which `.ci/run` does).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Output, Stdio},
    time::Duration,
};

use fenced_client::{Acquired, Client, Lease, TlsOptions};
use fenced_proto::v1::{lock_client::LockClient, StatusResponse};
use fenced_testkit::ClusterSpec;
pub use fenced_testkit::{NodeSpec, RunSettings, Within};
use nix::sys::signal::Signal;
use rustls::pki_types::pem::PemObject;
use tonic::transport::Channel;

/// The first of `names` on PATH, or `None` (a loud skip, saying what the
/// test needs: `needs`) when none is installed and this is not CI; under
/// CI (`CI` set, not "false") a missing tool fails the test instead.
pub fn tool_on_path(names: &[&str], needs: &str) -> Option<PathBuf> {
    let found = names.iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
    });
    if found.is_none() {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
        assert!(!ci, "CI is set but {} is not installed: {needs}", names[0]);
        eprintln!("\n!!!!!!!! SKIPPED: {needs}; it is not on PATH !!!!!!!!\n");
    }
    found
}

/// The directory holding the workspace's built binaries.
pub fn bin_dir() -> PathBuf {
    fenced_testkit::bin_dir().expect("target dir")
}

/// The path of a workspace binary, e.g. `fenced` or `fencectl`.
pub fn bin(name: &str) -> PathBuf {
    fenced_testkit::workspace_bin(name).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Whether process `pid` exists and has not exited (a zombie has).
pub fn pid_alive(pid: i32) -> bool {
    u32::try_from(pid).is_ok_and(fenced_testkit::pid_alive)
}

pub use fenced_testkit::port_range;

/// A free loopback port (see [`fenced_testkit::free_port`]).
pub fn free_port() -> u16 {
    fenced_testkit::free_port().unwrap()
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

/// Writes a tokens file at `path` (each `(name, token, role)`, stored
/// hashed as a node reads it); at a given path, so a test can rewrite it
/// and send SIGHUP.
pub fn write_tokens(path: &Path, entries: &[(&str, &str, &str)]) {
    let text: String = entries
        .iter()
        .map(|(name, token, role)| {
            format!(
                "[[token]]\nname = \"{name}\"\nsha256 = \"{}\"\nroles = [\"{role}\"]\n\n",
                hash_token(token)
            )
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// Writes `tokens.toml` (see [`write_tokens`]) and `policy.toml` into
/// `dir`; returns their paths, for `FENCED_AUTH_TOKENS` and
/// `FENCED_AUTH_POLICY`.
pub fn write_auth_files(
    dir: &Path,
    tokens: &[(&str, &str, &str)],
    policy: &str,
) -> (String, String) {
    let (t, p) = (dir.join("tokens.toml"), dir.join("policy.toml"));
    write_tokens(&t, tokens);
    std::fs::write(&p, policy).unwrap();
    (t.to_str().unwrap().into(), p.to_str().unwrap().into())
}

/// The policy most auth tests share: role `orders` may lock and read
/// `orders/`, role `ops` is admin and may read everything.
pub const ORDERS_AND_OPS_POLICY: &str = r#"
[roles.orders]
lock = ["orders/"]
read = ["orders/"]

[roles.ops]
admin = true
read = [""]
"#;

/// A policy in `dir` for a TLS cluster: the client certificate named
/// `alice` may lock and read `orders/`, the harness's may do anything.
/// Returns its path, for `FENCED_AUTH_POLICY`.
pub fn alice_orders_policy(dir: &Path) -> String {
    let path = dir.join("policy.toml");
    std::fs::write(
        &path,
        format!(
            "[roles.orders]\nlock = [\"orders/\"]\nread = [\"orders/\"]\n\
             [roles.harness]\nlock = [\"\"]\nread = [\"\"]\nadmin = true\n\
             [identities]\nalice = [\"orders\"]\n{HARNESS_CLIENT} = [\"harness\"]\n"
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

/// Certificates made by `fenced certs` in one directory: a CA, nodes by
/// id (for 127.0.0.1) and clients by name, each made on first use.
#[derive(Debug, Clone)]
pub struct Pki {
    pub kit: fenced_testkit::Pki,
}

impl Pki {
    /// A new CA in `dir`.
    pub fn new(dir: &Path) -> Pki {
        Pki {
            kit: fenced_testkit::Pki::new(&bin("fenced"), dir).unwrap(),
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.kit.ca()
    }

    /// Node `id`'s certificate and key, for 127.0.0.1.
    pub fn node(&self, id: u64) -> (PathBuf, PathBuf) {
        self.kit.node(id, "127.0.0.1").unwrap()
    }

    /// Service `name`'s server certificate and key for 127.0.0.1.
    pub fn server(&self, name: &str) -> (PathBuf, PathBuf) {
        self.kit.server(name, "127.0.0.1").unwrap()
    }

    /// A gRPC channel to `addr` trusting this CA, showing client `name`'s
    /// certificate when given.
    pub fn channel(&self, addr: &str, name: Option<&str>) -> Channel {
        self.kit.channel(addr, name).unwrap()
    }

    /// Client `name`'s certificate and key.
    pub fn client(&self, name: &str) -> (PathBuf, PathBuf) {
        self.kit.client(name).unwrap()
    }

    /// A lazily connecting gRPC channel to `addr` showing node `id`'s
    /// certificate, as a node (or a holder of its certificate) opens one.
    pub fn node_channel(&self, addr: &str, id: u64) -> Channel {
        let (cert, key) = self.node(id);
        let read = |p: &Path| std::fs::read(p).unwrap();
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&self.ca())))
            .identity(tonic::transport::Identity::from_pem(
                read(&cert),
                read(&key),
            ));
        Channel::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .timeout(Duration::from_secs(10))
            .connect_lazy()
    }

    /// Client options trusting this CA, with client `name`'s certificate.
    pub fn client_options(&self, name: Option<&str>) -> TlsOptions {
        self.kit.client_options(name).unwrap()
    }
}

/// The client name the harness's own calls use on a TLS cluster.
pub const HARNESS_CLIENT: &str = "harness";

/// A cluster of `fenced run` processes on loopback.
pub struct Cluster {
    /// Declared first: dropped (its nodes killed) before their directory.
    kit: fenced_testkit::Cluster,
    /// The `--initial-cluster` of the nodes started without `--join`.
    initial_cluster: String,
    pub dir: tempfile::TempDir,
    /// Set: the nodes run with TLS from these certificates.
    pub pki: Option<Pki>,
}

impl Cluster {
    /// Starts `n` nodes and waits until they agree on a leader.
    pub async fn start(n: u64) -> Cluster {
        Self::start_with(n, |_| {}).await
    }

    /// Like [`Cluster::start`], with `settings` set for every node: typed
    /// fields of `fenced run`'s own [`RunSettings`], so a setting renamed
    /// there breaks a test at build time, not at run time.
    pub async fn start_with(n: u64, settings: impl FnOnce(&mut RunSettings)) -> Cluster {
        let mut cluster = Self::stopped(n, settings);
        cluster.start_all().await;
        cluster
    }

    /// Like [`Cluster::start_with`], with TLS on both ports from
    /// certificates made by `fenced certs`.
    pub async fn start_tls(n: u64, settings: impl FnOnce(&mut RunSettings)) -> Cluster {
        let mut cluster = Self::stopped(n, settings);
        let spec = cluster.kit.spec().clone();
        let spec = spec
            .with_tls(&cluster.dir.path().join("pki"), HARNESS_CLIENT)
            .unwrap();
        cluster.pki = spec.tls.as_ref().map(|t| Pki { kit: t.pki.clone() });
        cluster.kit = fenced_testkit::Cluster::new(spec);
        cluster.start_all().await;
        cluster
    }

    /// Starts every node and waits until they agree on a leader.
    pub async fn start_all(&mut self) {
        self.kit.start_all().unwrap();
        self.wait_for_leader(Duration::from_secs(20)).await;
    }

    /// A cluster of `n` nodes, none started yet: for a test that prepares
    /// their data directories first.
    pub fn stopped(n: u64, settings: impl FnOnce(&mut RunSettings)) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = ClusterSpec::loopback(&bin("fenced"), dir.path(), n).unwrap();
        settings(&mut spec.settings);
        let kit = fenced_testkit::Cluster::new(spec);
        Cluster {
            initial_cluster: kit.initial_cluster(),
            kit,
            dir,
            pki: None,
        }
    }

    /// The nodes, started or not.
    pub fn nodes(&self) -> &[NodeSpec] {
        self.kit.nodes()
    }

    /// The `--initial-cluster` every node is started with.
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    fn node(&self, id: u64) -> &NodeSpec {
        self.kit.node(id).unwrap()
    }

    /// Starts node `id` (again), with the same arguments as before.
    pub fn spawn(&mut self, id: u64) {
        self.kit.start(id).unwrap();
    }

    /// Sets `key` in the environment every node starts with: for the
    /// global flags of `fenced` (`FENCED_LOG`, `FENCED_WORKER_THREADS`),
    /// which are not `fenced run` settings.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.kit.spec_mut().set_env(key, value);
    }

    /// Starts node `id` with `settings` over its own, for this start only.
    pub fn spawn_with(&mut self, id: u64, settings: impl FnOnce(&mut RunSettings)) {
        let before = self.node(id).settings.clone();
        self.set_node(id, settings);
        self.spawn(id);
        self.set_node(id, |s| *s = before);
    }

    /// Sets `settings` of node `id` alone, over the cluster's, from its
    /// next start on.
    pub fn set_node(&mut self, id: u64, settings: impl FnOnce(&mut RunSettings)) {
        let node = self
            .kit
            .spec_mut()
            .nodes
            .iter_mut()
            .find(|n| n.id == id)
            .expect("a node of the cluster");
        settings(&mut node.settings);
    }

    /// `kill -9` node `id`.
    pub fn kill(&mut self, id: u64) {
        self.kit.kill(id).unwrap();
    }

    /// Sends `signal` to node `id` without forgetting the process.
    pub fn signal(&self, id: u64, signal: Signal) {
        if self.kit.is_running(id) {
            self.kit.signal(id, signal).unwrap();
        }
    }

    /// Sends `signal` to every running node (SIGSTOP freezes the cluster).
    pub fn signal_all(&self, signal: Signal) {
        for id in self.kit.ids() {
            self.signal(id, signal);
        }
    }

    /// Node `id`'s exit status if it has exited by itself (it then counts
    /// as stopped and can be spawned again).
    pub fn exited(&mut self, id: u64) -> Option<ExitStatus> {
        self.kit.exited(id).unwrap()
    }

    /// Everything node `id` has logged.
    pub fn log_of(&self, id: u64) -> String {
        self.kit.log_of(id)
    }

    /// SIGTERM node `id` and wait for it to exit; returns its exit status
    /// (None: it was not running, or was killed after `within`).
    pub fn terminate(&mut self, id: u64, within: Duration) -> Option<ExitStatus> {
        self.kit
            .terminate(id, within)
            .ok()
            .map(|(status, _)| status)
    }

    /// Client endpoints of the nodes.
    pub fn endpoints(&self) -> Vec<String> {
        self.kit.endpoints()
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
        self.kit.channel(id).unwrap()
    }

    pub fn lock_client(&self, id: u64) -> LockClient<Channel> {
        LockClient::new(self.channel(id))
    }

    /// The status of node `id`, if it answers within a second.
    pub async fn status(&self, id: u64) -> Option<StatusResponse> {
        self.kit.status(id, false).await
    }

    /// The status of node `id` with the digest of its lease table.
    pub async fn status_with_digest(&self, id: u64) -> Option<StatusResponse> {
        self.kit.status(id, true).await
    }

    /// Waits until every running node names the same leader; returns it.
    pub async fn wait_for_leader(&self, within: Duration) -> u64 {
        self.kit
            .wait_for_leader(within)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Waits until every running node has applied the same index; returns
    /// their statuses, each with its node's state digest.
    pub async fn wait_for_convergence(&self, within: Duration) -> Vec<StatusResponse> {
        self.kit
            .wait_for_convergence(within)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
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
        self.kit.log_tails(15)
    }

    /// Starts every node, each with a `/metrics` listener of its own;
    /// returns their addresses by node id (index 0 is node 1).
    pub async fn start_with_metrics(
        n: u64,
        settings: impl FnOnce(&mut RunSettings),
    ) -> (Cluster, Vec<String>) {
        let mut cluster = Self::stopped(n, settings);
        let mut addrs = Vec::new();
        for id in 1..=n {
            let addr = format!("127.0.0.1:{}", free_port());
            cluster.set_node(id, |s| s.metrics_listen = Some(addr.clone()));
            cluster.spawn(id);
            addrs.push(addr);
        }
        cluster.wait_for_leader(Duration::from_secs(20)).await;
        (cluster, addrs)
    }

    /// The resident memory of node `id`, in KiB.
    pub fn rss_kib(&self, id: u64) -> u64 {
        let pid = self.kit.pid(id).expect("node is running");
        fenced_testkit::status_kib(pid, "VmRSS").expect("VmRSS in /proc/<pid>/status")
    }

    /// The peer port's address of node `id`.
    pub fn peer_addr(&self, id: u64) -> String {
        self.node(id).peer_addr()
    }

    /// A new node `id` with an empty data dir, started with `--join` (the
    /// running nodes' client addresses); on fresh ports unless `ports`
    /// (client, peer) are given (a replacement at a dead node's address).
    pub fn join_node(&mut self, id: u64, ports: Option<(u16, u16)>) {
        let mut node = NodeSpec::loopback(id, self.dir.path()).unwrap();
        if let Some((client, peer)) = ports {
            node.client_port = client;
            node.peer_port = peer;
        }
        node.join = true;
        self.kit.add(node).unwrap();
        self.spawn(id);
    }

    /// Forgets node `id` (killed first if running): it is no longer one of
    /// the cluster's endpoints.
    pub fn forget(&mut self, id: u64) {
        self.kit.forget(id).unwrap();
    }

    /// The (client, peer) ports of node `id`.
    pub fn ports(&self, id: u64) -> (u16, u16) {
        let n = self.node(id);
        (n.client_port, n.peer_port)
    }
}

/// A TLS connection to `addr` as the holder of `cert`/`key` (a node's or a
/// client's), trusting `ca`: what an attacker with that certificate opens.
pub async fn tls_connect(
    addr: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    tls_connect_offering(addr, ca, cert, key, &[]).await
}

/// [`tls_connect`] offering `alpn` (e.g. only `http/1.1`, as .NET's
/// HttpClient does by default).
pub async fn tls_connect_offering(
    addr: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(
        chain,
        rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap(),
    )
    .unwrap();
    let mut config = config;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
            tcp,
        )
        .await
}

/// The resident memory of process `pid`, in KiB (VmRSS in /proc).
pub fn rss_kib(pid: i32) -> u64 {
    u32::try_from(pid)
        .ok()
        .and_then(|pid| fenced_testkit::status_kib(pid, "VmRSS"))
        .expect("VmRSS in /proc/<pid>/status")
}

/// The PostgreSQL server `.ci/run` starts. In CI a missing server is a
/// failure; elsewhere the PostgreSQL tests say so and skip.
pub fn postgres_url() -> Option<String> {
    fenced_testkit::postgres_url()
}

/// The status a Watch stream ends with, reading past its events; panics
/// when it streams on for `within` or ends without an error.
pub async fn watch_refusal(
    stream: &mut tonic::Streaming<fenced_proto::v1::WatchResponse>,
    within: Duration,
) -> tonic::Status {
    let ended = tokio::time::timeout(within, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => break other,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the watch still streams after {within:?}"));
    match ended {
        Err(status) => status,
        Ok(_) => panic!("the watch ended without a refusal"),
    }
}
