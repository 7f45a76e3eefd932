//! `fenced repair --data-dir DIR --node-id N`: readies a stopped node's
//! data directory to be rebuilt from its peers. The damaged directory is
//! moved aside, never deleted (it is the evidence, and the only copy if
//! every node turns out damaged); a new one holds only the format file and
//! the repair marker. The node then starts as usual and repairs itself
//! ([`super::run`]).

use std::{
    io,
    path::{Path, PathBuf},
};

use super::marker::{self, Marker, Step};
use crate::{
    data_format::{self, LOG_DIR},
    log_store::LockedLog,
    types::NodeId,
};

/// What `prepare` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Where the old directory went, if there was one.
    pub moved_to: Option<PathBuf>,
}

/// The name the damaged directory is moved to: beside it, with the time.
pub fn aside_name(dir: &Path, unix_seconds: u64) -> PathBuf {
    let mut name = dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".damaged-{unix_seconds}"));
    dir.with_file_name(name)
}

/// Moves `dir` aside (when it holds anything) and makes a new one marked
/// for the repair of node `node`. Refuses a directory a running node holds.
pub fn prepare(dir: &Path, node: NodeId, unix_seconds: u64) -> io::Result<Prepared> {
    if node == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "node-id: must be at least 1",
        ));
    }
    let holds_something = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    };
    let mut moved_to = None;
    if holds_something {
        let log_dir = dir.join(LOG_DIR);
        // Held until the move is done, so a node started meanwhile waits.
        // A log too damaged to open still moves aside: only a live node's
        // lock stops the repair.
        let _lock = match LockedLog::lock(&log_dir) {
            Ok(lock) => Some(lock),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{e}; stop the node first: fenced repair works on a stopped node"),
                ))
            }
            Err(_) => None,
        };
        let aside = aside_name(dir, unix_seconds);
        if aside.exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: already exists; try again in a second", aside.display()),
            ));
        }
        std::fs::rename(dir, &aside).map_err(|e| {
            io::Error::new(e.kind(), format!("moving {} aside: {e}", dir.display()))
        })?;
        moved_to = Some(aside);
    }
    create_private(dir)?;
    data_format::write(dir)?;
    marker::write(
        dir,
        &Marker {
            node,
            step: Step::Fence,
        },
    )?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(Prepared { moved_to })
}

fn create_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_damaged_directory_is_moved_aside_whole_and_a_marked_one_replaces_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir_all(dir.join("state")).unwrap();
        std::fs::write(dir.join("state/snapshot.bin"), b"damaged").unwrap();
        let done = prepare(&dir, 3, 1_700_000_000).unwrap();
        let aside = root.path().join("data.damaged-1700000000");
        assert_eq!(done.moved_to.as_deref(), Some(aside.as_path()));
        assert_eq!(
            std::fs::read(aside.join("state/snapshot.bin")).unwrap(),
            b"damaged"
        );
        assert_eq!(
            marker::read(&dir).unwrap(),
            Some(Marker {
                node: 3,
                step: Step::Fence
            })
        );
        assert_eq!(
            data_format::check(&dir).unwrap(),
            Some(data_format::VERSION)
        );
        assert!(!dir.join("state").exists());
        // The same second again: the first copy is not overwritten.
        std::fs::write(dir.join("x"), b"").unwrap();
        let again = prepare(&dir, 3, 1_700_000_000).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn a_lost_directory_is_made_anew_and_node_zero_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("gone");
        assert_eq!(prepare(&dir, 2, 5).unwrap().moved_to, None);
        assert_eq!(marker::read(&dir).unwrap().map(|m| m.node), Some(2));
        let zero = prepare(&root.path().join("z"), 0, 5).unwrap_err();
        assert!(zero.to_string().starts_with("node-id:"), "{zero}");
    }

    #[test]
    fn a_running_nodes_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("live");
        std::fs::create_dir_all(dir.join(LOG_DIR)).unwrap();
        let held = LockedLog::lock(&dir.join(LOG_DIR)).unwrap();
        let err = prepare(&dir, 1, 9).unwrap_err();
        assert!(err.to_string().contains("stop the node first"), "{err}");
        assert!(dir.join(LOG_DIR).is_dir());
        drop(held);
    }
}
