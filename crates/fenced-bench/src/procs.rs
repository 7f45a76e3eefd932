//! Starting and stopping the clusters under test, and reading their CPU time
//! and memory from /proc.

use std::{
    fs::File,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

/// A free loopback port (bound, then released).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .context("binding a loopback port")?
        .local_addr()?
        .port())
}

/// A process this benchmark started; killed when dropped.
pub struct Proc {
    child: Option<Child>,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Result<Proc> {
        let log_file =
            File::create(log).with_context(|| format!("creating log {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Proc { child: Some(child) })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM, then wait up to `grace` for the process to exit (SIGKILL
    /// after that). Returns how it ended and how long it took.
    pub fn terminate(&mut self, grace: Duration) -> Result<(std::process::ExitStatus, Duration)> {
        let mut child = self.child.take().context("the process is not running")?;
        let started = Instant::now();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).context("pid")?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).context("SIGTERM")?;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok((status, started.elapsed()));
            }
            if started.elapsed() > grace {
                child.kill()?;
                let status = child.wait()?;
                bail!("did not exit within {grace:?} of SIGTERM ({status}); killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Clock ticks per second for /proc/<pid>/stat times.
pub fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// (ppid, utime + stime in ticks) of a process.
fn stat_of(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields resume after the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): ppid is field 4, utime 14, stime 15.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// CPU time (user + system) of `pids` and of all their descendants (a
/// PostgreSQL server's backends, started under `runuser`), in microseconds.
pub fn cpu_micros(pids: &[u32], ticks_per_second: u64) -> u64 {
    let mut all: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((ppid, t)) = stat_of(pid) {
                all.push((pid, ppid, t));
            }
        }
    }
    let mut included: Vec<u32> = pids.to_vec();
    // Walk down the tree: a process is included once its parent is.
    loop {
        let before = included.len();
        for (pid, ppid, _) in &all {
            if included.contains(ppid) && !included.contains(pid) {
                included.push(*pid);
            }
        }
        if included.len() == before {
            break;
        }
    }
    let ticks: u64 = all
        .iter()
        .filter(|(pid, _, _)| included.contains(pid))
        .map(|(_, _, t)| t)
        .sum();
    ticks * 1_000_000 / ticks_per_second.max(1)
}

/// Resident memory of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Peak resident memory of a process in bytes (VmHWM).
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One node's addresses and process.
pub struct Member {
    pub id: u64,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
    pub proc: Option<Proc>,
}

impl Member {
    pub fn client_addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
}

/// Three members of fenced or etcd on loopback, started by the benchmark.
pub struct LocalCluster {
    pub kind: &'static str,
    pub members: Vec<Member>,
    pub dir: PathBuf,
    bin: PathBuf,
    initial: String,
    /// With TLS: the directory of `fenced certs` output.
    pki: Option<PathBuf>,
    /// Environment every node starts with, after the defaults.
    env: Vec<(String, String)>,
}

impl LocalCluster {
    fn new(kind: &'static str, bin: PathBuf, dir: &Path, n: u64) -> Result<LocalCluster> {
        let dir = dir.join(kind);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut members = Vec::new();
        for id in 1..=n {
            members.push(Member {
                id,
                client_port: free_port()?,
                peer_port: free_port()?,
                data_dir: dir.join(format!("node{id}")),
                proc: None,
            });
        }
        Ok(LocalCluster {
            kind,
            members,
            dir,
            bin,
            initial: String::new(),
            pki: None,
            env: Vec::new(),
        })
    }

    /// A three-node fenced cluster of the binary `bin` (a release build).
    pub fn fenced(bin: PathBuf, dir: &Path) -> Result<LocalCluster> {
        let mut c = Self::new("fenced", bin, dir, 3)?;
        c.initial = c
            .members
            .iter()
            .map(|m| {
                format!(
                    "{}=127.0.0.1:{}/127.0.0.1:{}",
                    m.id, m.peer_port, m.client_port
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        Ok(c)
    }

    /// A three-member etcd cluster (etcd fsyncs its WAL by default).
    pub fn etcd(bin: PathBuf, dir: &Path) -> Result<LocalCluster> {
        let mut c = Self::new("etcd", bin, dir, 3)?;
        c.initial = c
            .members
            .iter()
            .map(|m| format!("e{}=http://127.0.0.1:{}", m.id, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        Ok(c)
    }

    /// Makes a CA, a certificate per node and one for the benchmark's
    /// clients with `fenced certs`; the nodes start with TLS on both ports.
    /// Returns the clients' options.
    pub fn use_tls(&mut self) -> Result<fenced_client::TlsOptions> {
        let pki = self.dir.join("pki");
        let certs = |args: &[&str]| -> Result<()> {
            let out = Command::new(&self.bin)
                .arg("certs")
                .args(args)
                .arg("--dir")
                .arg(&pki)
                .output()
                .context("running fenced certs")?;
            if !out.status.success() {
                bail!(
                    "fenced certs {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(())
        };
        if !pki.join("ca.pem").exists() {
            certs(&["ca"])?;
            for m in &self.members {
                certs(&["node", "--id", &m.id.to_string(), "--host", "127.0.0.1"])?;
            }
            certs(&["client", "--name", "bench"])?;
        }
        self.pki = Some(pki.clone());
        Ok(fenced_client::TlsOptions {
            ca: Some(pki.join("ca.pem")),
            cert: Some(pki.join("client-bench.pem")),
            key: Some(pki.join("client-bench-key.pem")),
        })
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_addr).collect()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.proc.as_ref().and_then(Proc::pid))
            .collect()
    }

    /// Starts member `id` (again, with the same arguments).
    pub fn spawn(&mut self, id: u64) -> Result<()> {
        let kind = self.kind;
        let bin = self.bin.clone();
        let initial = self.initial.clone();
        let dir = self.dir.clone();
        let pki = self.pki.clone();
        let m = self
            .members
            .iter_mut()
            .find(|m| m.id == id)
            .with_context(|| format!("no member {id}"))?;
        let log = dir.join(format!("node{id}.log"));
        let mut cmd = Command::new(&bin);
        match kind {
            "fenced" => {
                cmd.args([
                    "run",
                    "--id",
                    &id.to_string(),
                    "--data-dir",
                    &m.data_dir.display().to_string(),
                    "--listen",
                    &format!("127.0.0.1:{}", m.client_port),
                    "--peer-listen",
                    &format!("127.0.0.1:{}", m.peer_port),
                    "--initial-cluster",
                    &initial,
                ])
                .env("FENCED_LOG", "warn")
                // S4 holds 100,000 leases while S2 takes more: the table-wide
                // bound (default 100,000) is not what is measured.
                .env("FENCED_MAX_LIVE_LEASES", "1000000");
                if let Some(pki) = &pki {
                    cmd.env("FENCED_TLS_CERT", pki.join(format!("node-{id}.pem")))
                        .env("FENCED_TLS_KEY", pki.join(format!("node-{id}-key.pem")))
                        .env("FENCED_TLS_CA", pki.join("ca.pem"));
                }
            }
            _ => {
                let client = format!("http://127.0.0.1:{}", m.client_port);
                let peer = format!("http://127.0.0.1:{}", m.peer_port);
                // A restarted member finds its data dir and ignores the
                // initial-cluster flags.
                cmd.args([
                    "--name",
                    &format!("e{id}"),
                    "--data-dir",
                    &m.data_dir.display().to_string(),
                    "--listen-client-urls",
                    &client,
                    "--advertise-client-urls",
                    &client,
                    "--listen-peer-urls",
                    &peer,
                    "--initial-advertise-peer-urls",
                    &peer,
                    "--initial-cluster",
                    &initial,
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    "fenced-bench",
                    "--log-level",
                    "warn",
                ]);
            }
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        m.proc = Some(Proc::spawn(&format!("{kind} {id}"), &mut cmd, &log)?);
        Ok(())
    }

    /// Sets `key` in the environment of every node started from now on.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.push((key.to_string(), value.to_string()));
    }

    pub fn start_all(&mut self) -> Result<()> {
        let ids: Vec<u64> = self.members.iter().map(|m| m.id).collect();
        for id in ids {
            self.spawn(id)?;
        }
        Ok(())
    }

    pub fn kill(&mut self, id: u64) {
        if let Some(m) = self.members.iter_mut().find(|m| m.id == id) {
            if let Some(mut p) = m.proc.take() {
                p.kill();
            }
        }
    }

    /// SIGTERM to member `id`; see [`Proc::terminate`].
    pub fn terminate(
        &mut self,
        id: u64,
        grace: Duration,
    ) -> Result<(std::process::ExitStatus, Duration)> {
        let m = self
            .members
            .iter_mut()
            .find(|m| m.id == id)
            .with_context(|| format!("no member {id}"))?;
        m.proc
            .as_mut()
            .with_context(|| format!("member {id} is not running"))?
            .terminate(grace)
    }

    pub fn kill_all(&mut self) {
        for m in &mut self.members {
            if let Some(mut p) = m.proc.take() {
                p.kill();
            }
        }
    }

    pub fn log_tail(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let text = std::fs::read_to_string(self.dir.join(format!("node{}.log", m.id)))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().rev().take(8).collect();
            out.push_str(&format!("--- {} {} ---\n", self.kind, m.id));
            for l in lines.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

/// A single PostgreSQL server on loopback with a temporary data directory,
/// run as an unprivileged user; durability on (fsync, synchronous_commit).
pub struct LocalPostgres {
    pub port: u16,
    pub proc: Proc,
    pub user: String,
}

fn pg_bin(name: &str) -> PathBuf {
    for dir in ["/usr/lib/postgresql/15/bin", "/usr/local/bin", "/usr/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    PathBuf::from(name)
}

fn as_user(user: Option<&str>, program: PathBuf) -> Command {
    match user {
        Some(u) => {
            let mut c = Command::new("runuser");
            c.arg("-u").arg(u).arg("--").arg(program);
            c
        }
        None => Command::new(program),
    }
}

impl LocalPostgres {
    /// `os_user`: the user to run as when the benchmark runs as root
    /// (PostgreSQL refuses to run as root).
    pub fn start(dir: &Path, os_user: &str) -> Result<LocalPostgres> {
        let is_root = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        let user = is_root.then_some(os_user);
        let data = dir.join("postgres");
        std::fs::create_dir_all(&data)?;
        if let Some(u) = user {
            let ok = Command::new("chown")
                .arg("-R")
                .arg(u)
                .arg(dir)
                .status()
                .context("chown of the PostgreSQL directory")?
                .success();
            if !ok {
                bail!("chown -R {u} {} failed", dir.display());
            }
        }
        let out = as_user(user, pg_bin("initdb"))
            .args([
                "-D",
                &data.display().to_string(),
                "-U",
                "bench",
                "--auth=trust",
                "-E",
                "UTF8",
            ])
            .output()
            .context("running initdb")?;
        if !out.status.success() {
            bail!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let port = free_port()?;
        let mut cmd = as_user(user, pg_bin("postgres"));
        cmd.args([
            "-D",
            &data.display().to_string(),
            "-p",
            &port.to_string(),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            &format!("unix_socket_directories={}", dir.display()),
            "-c",
            "fsync=on",
            "-c",
            "synchronous_commit=on",
            "-c",
            "full_page_writes=on",
            "-c",
            "max_connections=400",
            "-c",
            "shared_buffers=256MB",
        ]);
        let proc = Proc::spawn("postgres", &mut cmd, &dir.join("postgres.log"))?;
        Ok(LocalPostgres {
            port,
            proc,
            user: "bench".into(),
        })
    }

    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname=postgres",
            self.port, self.user
        )
    }
}
