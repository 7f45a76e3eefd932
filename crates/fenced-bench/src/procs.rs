//! Starting and stopping the systems under test (fenced through
//! fenced-testkit; etcd and PostgreSQL here), and reading their CPU time and
//! memory from /proc.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use fenced_testkit::{free_port, Cluster, ClusterSpec, Within};

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

/// One process's line of /proc/<pid>/stat, as far as CPU time goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Times {
    pid: u32,
    ppid: u32,
    /// utime + stime: its own CPU time, in ticks.
    own: u64,
    /// cutime + cstime: the CPU time of its children that ended and that it
    /// waited for (a PostgreSQL server's backends of closed sessions).
    reaped: u64,
}

fn stat_of(pid: u32) -> Option<Times> {
    let fields = fenced_testkit::stat_fields(pid)?;
    // From field 3 (state) on: ppid is field 4, utime 14, stime 15, cutime
    // 16, cstime 17.
    let field = |i: usize| -> Option<u64> { fields.get(i)?.parse().ok() };
    Some(Times {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        own: field(11)?.saturating_add(field(12)?),
        reaped: field(13)?.saturating_add(field(14)?),
    })
}

/// The CPU ticks of `roots` and every descendant: each live process's own
/// time plus what it reaped of children that ended. A child counts once:
/// live, its own line has its time; ended and waited for, its parent's
/// `reaped` has it (a zombie not yet waited for is in neither).
fn tree_ticks(all: &[Times], roots: &[u32]) -> u64 {
    let mut included: Vec<u32> = roots.to_vec();
    // Walk down the tree: a process is included once its parent is.
    loop {
        let before = included.len();
        for t in all {
            if included.contains(&t.ppid) && !included.contains(&t.pid) {
                included.push(t.pid);
            }
        }
        if included.len() == before {
            break;
        }
    }
    all.iter()
        .filter(|t| included.contains(&t.pid))
        .fold(0u64, |sum, t| {
            sum.saturating_add(t.own).saturating_add(t.reaped)
        })
}

/// CPU time (user + system) of `pids` and of all their descendants, live or
/// ended (a PostgreSQL server's backends, started under `runuser`: S2's
/// sessions close before the run's last sample), in microseconds.
pub fn cpu_micros(pids: &[u32], ticks_per_second: u64) -> u64 {
    let mut all: Vec<Times> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(t) = stat_of(pid) {
                all.push(t);
            }
        }
    }
    tree_ticks(&all, pids).saturating_mul(1_000_000) / ticks_per_second.max(1)
}

/// Resident memory of a process in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    fenced_testkit::status_kib(pid, "VmRSS").map(|kib| kib * 1024)
}

/// Peak resident memory of a process in bytes (VmHWM).
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    fenced_testkit::status_kib(pid, "VmHWM").map(|kib| kib * 1024)
}

/// A three-node fenced cluster of the binary `bin` (a release build) in
/// `dir/fenced`; with `tls`, certificates made by `fenced certs` there and
/// every client of the run over TLS.
pub fn fenced_cluster(bin: &Path, dir: &Path, tls: bool) -> Result<Cluster> {
    let dir = dir.join("fenced");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut spec = ClusterSpec::loopback(bin, &dir, 3)?;
    spec.set_env("FENCED_LOG", "warn");
    // S4 holds 100,000 leases while S2 takes more: the table-wide bound
    // (default 100,000) is not what is measured.
    spec.settings.max_live_leases = Some(Within::new(1_000_000)?);
    if tls {
        spec = spec.with_tls(&dir.join("pki"), "bench")?;
        if let Some(t) = &spec.tls {
            crate::systems::use_fenced_tls(t.pki.client_options(Some("bench"))?);
        }
    }
    Ok(Cluster::new(spec))
}

/// One etcd member's addresses and process.
struct Member {
    id: u64,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    proc: Option<Proc>,
}

impl Member {
    fn client_addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
}

/// A three-member etcd cluster on loopback, started by the benchmark (etcd
/// fsyncs its WAL by default).
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
    bin: PathBuf,
    initial: String,
}

impl EtcdCluster {
    pub fn new(bin: PathBuf, dir: &Path) -> Result<EtcdCluster> {
        let dir = dir.join("etcd");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut members = Vec::new();
        for id in 1..=3 {
            members.push(Member {
                id,
                client_port: free_port()?,
                peer_port: free_port()?,
                data_dir: dir.join(format!("node{id}")),
                proc: None,
            });
        }
        let initial = members
            .iter()
            .map(|m| format!("e{}=http://127.0.0.1:{}", m.id, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        Ok(EtcdCluster {
            members,
            dir,
            bin,
            initial,
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

    /// The member whose client address is `addr`.
    pub fn id_at(&self, addr: &str) -> Option<u64> {
        self.members
            .iter()
            .find(|m| m.client_addr() == addr)
            .map(|m| m.id)
    }

    /// Starts member `id` (again, with the same arguments).
    pub fn spawn(&mut self, id: u64) -> Result<()> {
        let log = self.dir.join(format!("node{id}.log"));
        let (bin, initial) = (self.bin.clone(), self.initial.clone());
        let m = self
            .members
            .iter_mut()
            .find(|m| m.id == id)
            .with_context(|| format!("no member {id}"))?;
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        // A restarted member finds its data dir and ignores the
        // initial-cluster flags.
        let mut cmd = Command::new(&bin);
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
        m.proc = Some(Proc::spawn(&format!("etcd {id}"), &mut cmd, &log)?);
        Ok(())
    }

    pub fn start_all(&mut self) -> Result<()> {
        for id in 1..=3 {
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

    pub fn log_tail(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = self.dir.join(format!("node{}.log", m.id));
                format!(
                    "--- etcd {} ---\n{}",
                    m.id,
                    fenced_testkit::log_tail(&log, 8)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A cluster the benchmark started for a system.
pub enum Started {
    /// Boxed: a spec carries every node's settings.
    Fenced(Box<Cluster>),
    Etcd(EtcdCluster),
}

impl Started {
    pub fn pids(&self) -> Vec<u32> {
        match self {
            Started::Fenced(c) => c.pids(),
            Started::Etcd(c) => c.pids(),
        }
    }

    pub fn id_at(&self, addr: &str) -> Option<u64> {
        match self {
            Started::Fenced(c) => c.id_at(addr),
            Started::Etcd(c) => c.id_at(addr),
        }
    }

    /// `kill -9` member `id`.
    pub fn kill(&mut self, id: u64) -> Result<()> {
        match self {
            Started::Fenced(c) => {
                c.kill(id)?;
            }
            Started::Etcd(c) => c.kill(id),
        }
        Ok(())
    }

    /// Starts member `id` again.
    pub fn spawn(&mut self, id: u64) -> Result<()> {
        match self {
            Started::Fenced(c) => c.start(id),
            Started::Etcd(c) => c.spawn(id),
        }
    }

    pub fn kill_all(&mut self) {
        match self {
            Started::Fenced(c) => c.kill_all(),
            Started::Etcd(c) => {
                for id in 1..=3 {
                    c.kill(id);
                }
            }
        }
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

/// Whether this process runs as root (PostgreSQL then runs as another user).
fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The name the primary knows its synchronous standby by.
const STANDBY_NAME: &str = "standby1";

impl LocalPostgres {
    /// `os_user`: the user to run as when the benchmark runs as root
    /// (PostgreSQL refuses to run as root).
    pub fn start(dir: &Path, os_user: &str) -> Result<LocalPostgres> {
        let user = running_as_root().then_some(os_user);
        let data = init(dir, user)?;
        spawn_postgres(dir, user, &data, "postgres", &[])
    }

    /// A primary whose every commit waits until one synchronous standby
    /// has it on its disk too (`synchronous_commit = on` with
    /// `synchronous_standby_names`), and that standby, made by
    /// `pg_basebackup` and streaming from it: the highly available
    /// equivalent of one Raft group. Returns (primary, standby).
    pub fn start_with_sync_standby(
        dir: &Path,
        os_user: &str,
    ) -> Result<(LocalPostgres, LocalPostgres)> {
        let user = running_as_root().then_some(os_user);
        let data = init(dir, user)?;
        let names = format!("synchronous_standby_names={STANDBY_NAME}");
        let primary = spawn_postgres(dir, user, &data, "postgres", &[&names])?;
        let standby_data = dir.join("standby");
        // The primary takes a moment to accept connections.
        let started = std::time::Instant::now();
        loop {
            let out = as_user(user, pg_bin("pg_basebackup"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &primary.port.to_string(),
                    "-U",
                    "bench",
                ])
                .args(["-D", &standby_data.display().to_string()])
                .args(["-X", "stream", "-R", "-c", "fast"])
                .output()
                .context("running pg_basebackup")?;
            if out.status.success() {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!(
                    "pg_basebackup failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            // A failed attempt may leave a partial directory behind.
            let _ = std::fs::remove_dir_all(&standby_data);
            std::thread::sleep(Duration::from_millis(200));
        }
        let conninfo = format!(
            "primary_conninfo=host=127.0.0.1 port={} user=bench application_name={STANDBY_NAME}",
            primary.port
        );
        let standby = spawn_postgres(dir, user, &standby_data, "standby", &[&conninfo])?;
        Ok((primary, standby))
    }

    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={} dbname=postgres",
            self.port, self.user
        )
    }
}

/// A new data directory under `dir`, made by initdb (as `user` when given).
fn init(dir: &Path, user: Option<&str>) -> Result<PathBuf> {
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
    Ok(data)
}

/// Starts a server on `data` at a free loopback port, durable (fsync,
/// synchronous_commit, full pages), with `extra` settings (`name=value`).
fn spawn_postgres(
    dir: &Path,
    user: Option<&str>,
    data: &Path,
    name: &str,
    extra: &[&str],
) -> Result<LocalPostgres> {
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
    for setting in extra {
        cmd.args(["-c", setting]);
    }
    let proc = Proc::spawn(name, &mut cmd, &dir.join(format!("{name}.log")))?;
    Ok(LocalPostgres {
        port,
        proc,
        user: "bench".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(pid: u32, ppid: u32, own: u64, reaped: u64) -> Times {
        Times {
            pid,
            ppid,
            own,
            reaped,
        }
    }

    #[test]
    fn a_tree_counts_live_descendants_and_the_children_they_reaped() {
        // runuser (10) -> postmaster (11) -> a live backend (12); the
        // postmaster reaped 500 ticks of closed sessions' backends. 99 is
        // another process; 13 is its child.
        let all = [
            t(10, 1, 1, 0),
            t(11, 10, 20, 500),
            t(12, 11, 30, 0),
            t(99, 1, 1000, 7),
            t(13, 99, 4000, 0),
        ];
        assert_eq!(tree_ticks(&all, &[10]), 1 + 20 + 500 + 30);
        assert_eq!(tree_ticks(&all, &[11]), 20 + 500 + 30);
        assert_eq!(tree_ticks(&all, &[10, 99]), 551 + 1000 + 7 + 4000);
        assert_eq!(tree_ticks(&all, &[]), 0);
        assert_eq!(tree_ticks(&all, &[12345]), 0);
    }

    #[test]
    fn this_process_reads_its_own_stat_line() {
        let me = std::process::id();
        let times = stat_of(me);
        assert_eq!(times.map(|t| t.pid), Some(me));
        assert_eq!(
            times.map(|t| t.ppid),
            Some(std::os::unix::process::parent_id())
        );
    }
}
