//! `fenced repair --data-dir DIR --node-id N`: readies a stopped node's
//! data directory to be rebuilt from its peers. What the directory held is
//! moved into `DIR/damaged-<unix time>/`, never deleted (it is the
//! evidence, and the only copy if every node turns out damaged): inside the
//! directory, because it is often a mount point of its own (a volume, a
//! disk) that cannot be renamed and whose siblings are on another file
//! system. The marker is written first, so a crash midway leaves a marked
//! directory and the command is run again; the format file last. The node
//! then starts as usual and repairs itself ([`super::run`]).

use std::{
    io,
    path::{Path, PathBuf},
};

use super::marker::{self, Marker, Step};
use crate::{
    storage::data_format::{self, LOG_DIR, STATE_DIR},
    storage::log_store::LockedLog,
    types::NodeId,
};

/// The entries of a data directory by which it is known for one.
const DATA_ENTRIES: [&str; 5] = [
    data_format::FILE_NAME,
    LOG_DIR,
    STATE_DIR,
    marker::FILE_NAME,
    "cluster-time",
];
/// Where the entries of an earlier repair went: left where they are.
const ASIDE_PREFIX: &str = "damaged-";

/// What `prepare` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Where the old contents went, if there were any.
    pub moved_to: Option<PathBuf>,
}

/// Moves what `dir` holds into `dir/damaged-<unix_seconds>/` and marks it
/// for the repair of node `node`. Refuses a directory a running node
/// holds, and a non-empty one that holds no fenced data (a typo in
/// `--data-dir` must not move someone else's files).
pub fn prepare(dir: &Path, node: NodeId, unix_seconds: u64) -> io::Result<Prepared> {
    if node == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "node-id: must be at least 1",
        ));
    }
    let entries: Vec<std::ffi::OsString> = match std::fs::read_dir(dir) {
        Ok(read) => read
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    };
    let to_move: Vec<&std::ffi::OsString> = entries
        .iter()
        .filter(|n| {
            let name = n.to_string_lossy();
            name != marker::FILE_NAME && !name.starts_with(ASIDE_PREFIX)
        })
        .collect();
    if !to_move.is_empty()
        && !entries
            .iter()
            .any(|n| DATA_ENTRIES.iter().any(|d| n.to_string_lossy() == *d))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "data-dir: {} holds files but no fenced data (no format file, raft-log/ or \
                 state/): nothing was moved; check the path",
                dir.display()
            ),
        ));
    }
    // Held until the move is done, so a node started meanwhile waits. A
    // log too damaged to open still moves: only a live node's lock stops
    // the repair.
    let log_dir = dir.join(LOG_DIR);
    let _lock = if log_dir.is_dir() {
        match LockedLog::lock(&log_dir) {
            Ok(lock) => Some(lock),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{e}; stop the node first: fenced repair works on a stopped node"),
                ))
            }
            Err(_) => None,
        }
    } else {
        None
    };
    data_format::private_dir(dir)?;
    marker::write(
        dir,
        &Marker {
            node,
            step: Step::Fence,
        },
    )?;
    let mut moved_to = None;
    if !to_move.is_empty() {
        let aside = dir.join(format!("{ASIDE_PREFIX}{unix_seconds}"));
        if aside.exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: already exists; try again in a second", aside.display()),
            ));
        }
        data_format::private_dir(&aside)?;
        for name in to_move {
            std::fs::rename(dir.join(name), aside.join(name)).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("moving {} aside: {e}", dir.join(name).display()),
                )
            })?;
        }
        std::fs::File::open(&aside)?.sync_all()?;
        moved_to = Some(aside);
    }
    data_format::write(dir)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(Prepared { moved_to })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn what_a_damaged_directory_held_is_kept_inside_it_and_the_directory_is_marked() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir_all(dir.join("state")).unwrap();
        std::fs::write(dir.join("state/snapshot.bin"), b"damaged").unwrap();
        let done = prepare(&dir, 3, 1_700_000_000).unwrap();
        let aside = dir.join("damaged-1700000000");
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
        // Run again (a crash midway, or twice by hand): the first copy
        // stays, and what the first run made moves beside it.
        let again = prepare(&dir, 3, 1_700_000_009).unwrap();
        assert!(aside.join("state/snapshot.bin").exists());
        let second = again.moved_to.unwrap();
        assert!(second.join(data_format::FILE_NAME).exists());
        assert!(!second.join("damaged-1700000000").exists());
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
    fn a_directory_without_fenced_data_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("notes.txt"), b"someone else's").unwrap();
        let err = prepare(root.path(), 1, 9).unwrap_err();
        assert!(err.to_string().starts_with("data-dir:"), "{err}");
        assert!(root.path().join("notes.txt").exists());
        assert_eq!(marker::read(root.path()).unwrap(), None);
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
        assert_eq!(marker::read(&dir).unwrap(), None);
        drop(held);
    }
}
