//! One way to run a local cluster of real `fenced` processes, for the
//! integration tests (`tests/`), `fenced-bench` and `fenced-jepsen`.
//!
//! A [`ClusterSpec`] says what to start: the binary, each node's addresses,
//! data directory, log file and the program it runs under (a network
//! namespace, libfaketime), the settings every node gets and whether TLS is
//! on. A [`Cluster`] starts, stops, kills, pauses and restarts its nodes,
//! finds the leader, and kills whatever still runs when it is dropped. Node
//! command lines come from `fenced run`'s own settings
//! ([`fenced_server::node::config::RunSettings`]), so a flag renamed there is
//! renamed here.

mod cluster;
mod pki;
mod ports;
mod procfs;

pub use cluster::{Cluster, ClusterSpec, NodeSpec, Tls};
pub use fenced_server::node::config::{RunSettings, Within};
pub use pki::Pki;
pub use ports::{free_port, port_range};
pub use procfs::{is_stopped, pid_alive, stat_fields, status_kib};

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The directory of the running executable's workspace binaries: the
/// executable's own (a binary such as `fenced-bench`), or its parent when
/// it is a test under `target/<profile>/deps`.
pub fn bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().context("the executable's directory")?;
    Ok(if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir).to_path_buf()
    } else {
        dir.to_path_buf()
    })
}

/// Workspace binary `name` (e.g. `fenced`) next to this executable; an
/// error that says how to build it when it is missing.
pub fn workspace_bin(name: &str) -> Result<PathBuf> {
    let path = bin_dir()?.join(name);
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it first (`cargo build --workspace --bins`)",
        path.display()
    );
    Ok(path)
}

/// The last `lines` lines of a log file ("" when it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(lines).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// The PostgreSQL server of `FENCED_TEST_POSTGRES_URL` (`.ci/run` starts
/// one with `.ci/postgres.sh`). Under CI (`CI=true`) a missing server
/// panics; elsewhere the test says it skips, and `None` is returned.
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

/// `prefix` made unique to this process, this moment and this call: a name
/// no other test (or earlier run against the same database) uses.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
