//! `fenced dev`: a local cluster of 1, 3 or 5 nodes in one process, for a
//! developer's first minutes: a banner with every address, one line once a
//! leader serves, node logs in files, one line at Ctrl-C.
//!
//! Each node runs on a thread and a runtime of its own, so its log lines go
//! to its own file (`<data-dir>/logs/node<ID>.log`) and a busy node does not
//! hold up the others. Every node's listeners are bound before any node
//! starts: a node's first messages never find a peer port that is not
//! listening yet.

use std::{
    cell::Cell,
    collections::BTreeMap,
    fs::{File, OpenOptions},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use tracing_subscriber::fmt::MakeWriter;

use crate::{
    node::config::{RunSettings, Within},
    node::{failed_path, Listeners, NodeConfig, RunningNode},
    types::{NodeId, Raft},
};

/// The node counts `fenced dev` runs: odd, so that every majority is clear.
pub const NODE_COUNTS: [u8; 3] = [1, 3, 5];
/// The file that marks a directory as made by `fenced dev`; `--fresh`
/// removes no directory without it.
pub const MARKER: &str = ".fenced-dev";
/// The default base port: clients at 7101.., peers at 7201.., metrics at
/// 9101.. (`DEV_ENDPOINTS` of fenced-client).
pub const DEFAULT_BASE_PORT: u16 = 7100;
/// The highest base port: metrics ports reach base + 2005.
pub const MAX_BASE_PORT: u16 = 63_000;
/// How long `fenced dev` waits for a leader before it says so.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Checks `--nodes`.
pub fn parse_node_count(text: &str) -> Result<u8, String> {
    match text.trim().parse::<u8>() {
        Ok(n) if NODE_COUNTS.contains(&n) => Ok(n),
        _ => Err(format!("--nodes must be 1, 3 or 5 (got {text:?})")),
    }
}

/// The addresses and data directory of one dev node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevNode {
    pub id: NodeId,
    pub client: String,
    pub peer: String,
    pub metrics: String,
    pub data_dir: PathBuf,
}

/// The layout of a dev cluster of `nodes` nodes from `base_port`: node i's
/// client port is base + i, its peer port base + 100 + i, its metrics port
/// base + 2000 + i, its data `dir/node<i>`.
pub fn layout(dir: &Path, nodes: u8, base_port: u16) -> Vec<DevNode> {
    (1..=u16::from(nodes))
        .map(|i| DevNode {
            id: u64::from(i),
            client: format!("127.0.0.1:{}", base_port + i),
            peer: format!("127.0.0.1:{}", base_port + 100 + i),
            metrics: format!("127.0.0.1:{}", base_port + 2000 + i),
            data_dir: dir.join(format!("node{i}")),
        })
        .collect()
}

/// The node configurations of `layout`: each node's settings as `fenced
/// run` would take them, checked the same way.
pub fn configs(layout: &[DevNode]) -> Result<Vec<NodeConfig>, String> {
    let initial_cluster = layout
        .iter()
        .map(|n| format!("{}={}/{}", n.id, n.peer, n.client))
        .collect::<Vec<_>>()
        .join(",");
    layout
        .iter()
        .map(|n| {
            let id = Within::new(n.id).map_err(|e| format!("node {}: id: {e}", n.id))?;
            RunSettings {
                id: Some(id),
                data_dir: Some(n.data_dir.clone()),
                listen: Some(n.client.clone()),
                peer_listen: Some(n.peer.clone()),
                initial_cluster: Some(initial_cluster.clone()),
                metrics_listen: Some(n.metrics.clone()),
                ..RunSettings::default()
            }
            .into_node_config()
            .map_err(|e| format!("node {}: {e}", n.id))
        })
        .collect()
}

/// Makes `dir` ready for a dev cluster: with `fresh`, removes it first, only
/// if `fenced dev` made it; creates it with its marker. Refuses a directory
/// that holds anything but is not a dev directory, so neither `--fresh` nor
/// a dev cluster touches a real node's data.
pub fn prepare_dir(dir: &Path, fresh: bool) -> Result<(), String> {
    let shown = dir.display();
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(format!(
                "--data-dir {shown}: a symbolic link; give the directory itself"
            ))
        }
        Ok(meta) if !meta.is_dir() => {
            return Err(format!("--data-dir {shown}: not a directory"));
        }
        Ok(_) => {
            let is_dev = dir.join(MARKER).is_file();
            let empty = std::fs::read_dir(dir)
                .map_err(|e| format!("--data-dir {shown}: {e}"))?
                .next()
                .is_none();
            if !is_dev && !empty {
                return Err(format!(
                    "--data-dir {shown}: not a fenced dev data directory (it has no {MARKER} \
                     file){}; give an empty or new directory",
                    if fresh {
                        ", so --fresh will not remove it"
                    } else {
                        ""
                    }
                ));
            }
            if fresh && is_dev {
                std::fs::remove_dir_all(dir)
                    .map_err(|e| format!("--fresh: removing {shown}: {e}"))?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("--data-dir {shown}: {e}")),
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("--data-dir {shown}: {e}"))?;
    let marker = dir.join(MARKER);
    if !marker.is_file() {
        std::fs::write(
            &marker,
            "made by `fenced dev`; `fenced dev --fresh` may remove this directory\n",
        )
        .map_err(|e| format!("{}: {e}", marker.display()))?;
    }
    Ok(())
}

/// Where dev logs go: `<dir>/logs`.
pub fn log_dir(dir: &Path) -> PathBuf {
    dir.join("logs")
}

thread_local! {
    /// The dev node whose thread this is; its log lines go to its file.
    static CURRENT_NODE: Cell<Option<NodeId>> = const { Cell::new(None) };
}

/// A `tracing` writer that sends each line to the file of the node whose
/// thread wrote it, and the process's own lines to `dev.log`.
pub struct NodeLogFiles {
    nodes: BTreeMap<NodeId, File>,
    own: File,
}

impl NodeLogFiles {
    /// Opens (appends to) `<dir>/logs/node<ID>.log` for every node and
    /// `<dir>/logs/dev.log`.
    pub fn open(dir: &Path, layout: &[DevNode]) -> Result<Self, String> {
        let logs = log_dir(dir);
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        let open = |name: String| {
            let path = logs.join(name);
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        Ok(Self {
            nodes: layout
                .iter()
                .map(|n| Ok((n.id, open(format!("node{}.log", n.id))?)))
                .collect::<Result<_, String>>()?,
            own: open("dev.log".into())?,
        })
    }
}

impl<'a> MakeWriter<'a> for NodeLogFiles {
    type Writer = &'a File;

    fn make_writer(&'a self) -> &'a File {
        CURRENT_NODE
            .with(Cell::get)
            .and_then(|id| self.nodes.get(&id))
            .unwrap_or(&self.own)
    }
}

/// The banner: every node's addresses and data, where the logs are.
pub fn banner(dir: &Path, layout: &[DevNode], verbose: bool) -> String {
    let mut out = format!(
        "fenced dev: a local {}-node cluster (plaintext, 127.0.0.1 only; for development)\n\n",
        layout.len()
    );
    out.push_str(&format!(
        "  {:<5} {:<16} {:<16} {:<33} {}\n",
        "node", "client", "peer", "metrics", "data"
    ));
    for n in layout {
        out.push_str(&format!(
            "  {:<5} {:<16} {:<16} {:<33} {}\n",
            n.id,
            n.client,
            n.peer,
            format!("http://{}/metrics", n.metrics),
            n.data_dir.display()
        ));
    }
    let logs = if verbose {
        "this terminal (--verbose)".to_string()
    } else {
        format!(
            "{}/node<ID>.log (--verbose prints them here)",
            log_dir(dir).display()
        )
    };
    out.push_str(&format!("\n  logs:      {logs}\n"));
    out.push_str(&format!("  endpoints: {}\n", endpoints(layout)));
    out
}

fn endpoints(layout: &[DevNode]) -> String {
    layout
        .iter()
        .map(|n| n.client.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The line printed once the cluster has a leader, and what to type next.
pub fn ready_lines(
    layout: &[DevNode],
    leader: NodeId,
    term: u64,
    took: Duration,
    default_ports: bool,
) -> String {
    let leading = layout.iter().find(|n| n.id == leader);
    let address = leading.map_or("?", |n| n.client.as_str());
    // The leader's page: it alone shows every member's lag.
    let status_page = leading.map_or_else(String::new, |n| {
        format!("       status page: http://{}/\n", n.metrics)
    });
    // fencectl talks to 7101-7103 by default; elsewhere it needs the list.
    let fencectl = if default_ports && layout.len() == 3 {
        "fencectl".to_string()
    } else {
        format!("fencectl --endpoints {}", endpoints(layout))
    };
    format!(
        "ready in {:.1} s: node {leader} ({address}) leads {} member{} in term {term}\n\
         next:  {fencectl} acquire demo --ttl 30s\n       {fencectl} status\n\
         {status_page}Ctrl-C stops the cluster.",
        took.as_secs_f64(),
        layout.len(),
        if layout.len() == 1 { "" } else { "s" },
    )
}

/// A node's thread: runs the node until `stop`, then shuts it down.
struct NodeThread {
    id: NodeId,
    stop: tokio::sync::oneshot::Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

/// What a node thread reports.
enum NodeEvent {
    Started(NodeId, Raft),
    StartFailed(NodeId, String),
    /// The error as text: it only gets printed.
    StorageFailed(NodeId, PathBuf, String),
}

/// How `fenced dev` ended.
pub enum DevEnd {
    /// Ctrl-C or SIGTERM.
    Stopped,
    /// A node's storage failed (the path and error).
    StorageFailed(NodeId, PathBuf, String),
}

/// Runs the cluster of `layout` until `shutdown` resolves or a node's
/// storage fails. Prints the ready line (stdout) once every node knows the
/// same leader.
pub async fn run(
    layout: &[DevNode],
    default_ports: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<DevEnd, String> {
    let started = Instant::now();
    let configs = configs(layout)?;
    // Every node's ports first, then the nodes.
    let mut bound = Vec::new();
    for cfg in configs {
        let listeners =
            Listeners::bind(&cfg).map_err(|e| format!("node {}: {e}{}", cfg.id, port_hint(&e)))?;
        bound.push((cfg, listeners));
    }
    // Unbounded: each node sends at most two events.
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut threads = Vec::new();
    for (cfg, listeners) in bound {
        match spawn_node(cfg, listeners, events_tx.clone()) {
            Ok(t) => threads.push(t),
            Err(e) => {
                stop_all(threads).await;
                return Err(e);
            }
        }
    }
    drop(events_tx);
    let mut rafts = BTreeMap::new();
    while rafts.len() < threads.len() {
        match events.recv().await {
            Some(NodeEvent::Started(id, raft)) => {
                rafts.insert(id, raft);
            }
            Some(NodeEvent::StartFailed(id, e)) => {
                stop_all(threads).await;
                return Err(format!("node {id}: {e}"));
            }
            Some(NodeEvent::StorageFailed(id, path, e)) => {
                stop_all(threads).await;
                return Ok(DevEnd::StorageFailed(id, path, e));
            }
            None => {
                stop_all(threads).await;
                return Err("a node thread ended before its node started".into());
            }
        }
    }
    tokio::pin!(shutdown);
    tokio::select! {
        agreed = agreed_leader(&rafts, READY_TIMEOUT) => match agreed {
            Some((leader, term)) => println!(
                "\n{}",
                ready_lines(layout, leader, term, started.elapsed(), default_ports)
            ),
            None => println!(
                "\nno leader after {} s; the node logs say why ({})",
                READY_TIMEOUT.as_secs(),
                layout
                    .first()
                    .and_then(|n| n.data_dir.parent())
                    .map_or_else(|| "--verbose".into(), |d| log_dir(d).display().to_string())
            ),
        },
        _ = &mut shutdown => {
            stop_all(threads).await;
            return Ok(DevEnd::Stopped);
        }
    }
    let end = loop {
        tokio::select! {
            _ = &mut shutdown => break DevEnd::Stopped,
            event = events.recv() => match event {
                Some(NodeEvent::StorageFailed(id, path, e)) => {
                    break DevEnd::StorageFailed(id, path, e)
                }
                Some(_) => {}
                // Every node thread ended: nothing is left to serve.
                None => return Err("every node stopped".into()),
            },
        }
    };
    stop_all(threads).await;
    Ok(end)
}

fn port_hint(e: &crate::node::NodeError) -> &'static str {
    match e {
        crate::node::NodeError::Listen { source, .. }
            if source.kind() == io::ErrorKind::AddrInUse =>
        {
            " (is another `fenced dev` running? stop it, or pick other ports with --base-port)"
        }
        _ => "",
    }
}

/// The leader every node names, and its term, once they agree.
async fn agreed_leader(rafts: &BTreeMap<NodeId, Raft>, timeout: Duration) -> Option<(NodeId, u64)> {
    let deadline = Instant::now() + timeout;
    loop {
        let seen: Vec<(Option<NodeId>, u64)> = rafts
            .values()
            .map(|r| {
                let m = r.metrics();
                let m = m.borrow();
                (m.current_leader, m.current_term)
            })
            .collect();
        if let Some((Some(leader), term)) = seen.first().copied() {
            if seen.iter().all(|s| *s == (Some(leader), term)) {
                return Some((leader, term));
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn spawn_node(
    cfg: NodeConfig,
    listeners: Listeners,
    events: mpsc::UnboundedSender<NodeEvent>,
) -> Result<NodeThread, String> {
    let id = cfg.id;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = std::thread::Builder::new()
        .name(format!("node{id}"))
        .spawn(move || {
            CURRENT_NODE.with(|c| c.set(Some(id)));
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_start(move || CURRENT_NODE.with(|c| c.set(Some(id))))
                .thread_name(format!("node{id}-io"))
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = events.send(NodeEvent::StartFailed(id, e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let dir = cfg.data_dir.clone();
                let node = match RunningNode::start_on(cfg, listeners).await {
                    Ok(node) => node,
                    Err(e) => {
                        let _ = events.send(NodeEvent::StartFailed(id, e.to_string()));
                        return;
                    }
                };
                let _ = events.send(NodeEvent::Started(id, node.ctx.replica.raft.clone()));
                tokio::select! {
                    _ = stopped => {}
                    error = node.failure() => {
                        tracing::error!(
                            node = id,
                            path = %failed_path(&dir, &error).display(),
                            "storage failed: {error}; stopping"
                        );
                        let path = failed_path(&dir, &error);
                        let _ = events.send(NodeEvent::StorageFailed(id, path, error.to_string()));
                    }
                }
                node.shutdown().await;
            });
            // Bounded: after a storage failure a task may still wait on the disk.
            runtime.shutdown_timeout(Duration::from_secs(2));
        })
        .map_err(|e| format!("node {id}: cannot start its thread: {e}"))?;
    Ok(NodeThread { id, stop, handle })
}

/// Stops every node and waits for its thread.
async fn stop_all(threads: Vec<NodeThread>) {
    for t in threads {
        let _ = t.stop.send(());
        let id = t.id;
        if tokio::task::spawn_blocking(move || t.handle.join())
            .await
            .map_or(true, |joined| joined.is_err())
        {
            tracing::error!(node = id, "the node's thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn node_counts_are_one_three_or_five() {
        assert_eq!(parse_node_count("3"), Ok(3));
        assert_eq!(parse_node_count("5"), Ok(5));
        assert_eq!(parse_node_count("1"), Ok(1));
        for bad in ["0", "2", "4", "7", "x", "-1"] {
            let e = parse_node_count(bad).unwrap_err();
            assert!(e.contains("--nodes") && e.contains("1, 3 or 5"), "{e}");
        }
    }

    #[test]
    fn the_layout_spreads_ports_from_the_base() {
        let l = layout(Path::new("/d"), 5, 7100);
        assert_eq!(l.len(), 5);
        assert_eq!(l[0].client, "127.0.0.1:7101");
        assert_eq!(l[0].peer, "127.0.0.1:7201");
        assert_eq!(l[4].metrics, "127.0.0.1:9105");
        assert_eq!(l[2].data_dir, Path::new("/d/node3"));
        let top = layout(Path::new("/d"), 5, MAX_BASE_PORT);
        assert_eq!(
            top[4].metrics,
            format!("127.0.0.1:{}", MAX_BASE_PORT + 2005)
        );
        assert_eq!(configs(&top).unwrap().len(), 5);
    }

    #[test]
    fn fresh_removes_only_a_dev_directory() {
        let root = tempfile::tempdir().unwrap();
        // A directory with someone's data in it is refused, and kept.
        let other = root.path().join("other");
        std::fs::create_dir_all(other.join("raft-log")).unwrap();
        let e = prepare_dir(&other, true).unwrap_err();
        assert!(e.contains("not a fenced dev data directory"), "{e}");
        assert!(other.join("raft-log").is_dir());
        assert!(prepare_dir(&other, false).is_err());
        // A new directory becomes a dev directory; --fresh empties it.
        let dev = root.path().join("dev");
        prepare_dir(&dev, false).unwrap();
        std::fs::create_dir_all(dev.join("node1")).unwrap();
        prepare_dir(&dev, false).unwrap();
        assert!(dev.join("node1").is_dir(), "kept without --fresh");
        prepare_dir(&dev, true).unwrap();
        assert!(!dev.join("node1").exists(), "--fresh starts empty");
        assert!(dev.join(MARKER).is_file());
        // A file, or a link to a dev directory, is refused.
        let file = root.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(prepare_dir(&file, true).is_err());
        let link = root.path().join("link");
        std::os::unix::fs::symlink(&dev, &link).unwrap();
        assert!(prepare_dir(&link, true)
            .unwrap_err()
            .contains("symbolic link"));
        assert!(dev.join(MARKER).is_file());
    }

    #[test]
    fn the_banner_and_ready_lines_name_what_a_user_needs() {
        let l = layout(Path::new("/tmp/fd"), 3, 7100);
        let b = banner(Path::new("/tmp/fd"), &l, false);
        for n in &l {
            assert!(b.contains(&n.client) && b.contains(&n.peer) && b.contains(&n.metrics));
            assert!(b.contains(&n.data_dir.display().to_string()));
        }
        assert!(b.contains("/tmp/fd/logs"), "{b}");
        let r = ready_lines(&l, 2, 1, Duration::from_millis(700), true);
        assert!(r.contains("node 2 (127.0.0.1:7102) leads 3 members"), "{r}");
        assert!(r.contains("fencectl acquire demo --ttl 30s"), "{r}");
        assert!(r.contains("fencectl status"), "{r}");
        assert!(r.contains("status page: http://127.0.0.1:9102/\n"), "{r}");
        let other = layout(Path::new("/tmp/fd"), 5, 8100);
        let r = ready_lines(&other, 1, 1, Duration::from_millis(700), false);
        assert!(
            r.contains("fencectl --endpoints 127.0.0.1:8101,127.0.0.1:8102,127.0.0.1:8103,127.0.0.1:8104,127.0.0.1:8105 acquire"),
            "{r}"
        );
    }
}
